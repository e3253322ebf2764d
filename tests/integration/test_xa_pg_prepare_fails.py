"""A PostgreSQL branch whose PREPARE TRANSACTION fails, against a REAL server.

psycopg 3 marks its connection's two-phase transaction as prepared BEFORE it sends ``PREPARE TRANSACTION``. When
the statement fails on a live session, PostgreSQL has turned it into a ROLLBACK, but psycopg's ``tpc_rollback()``
would then send ``ROLLBACK PREPARED`` for a transaction that was never prepared (an error, which the coordinator
reports as a rollback of unknown outcome) and leave the caller's connection unable to commit or roll back again.

Each test makes PREPARE fail one way and checks: the coordinator's rollback of the branch succeeds (no "rollback
also failed" note, the branch's rollback reported ROLLED_BACK, the T2 ends ROLLED_BACK), no prepared transaction
is left behind, and a live session can run the next branch. When the session dies during PREPARE, recovery finds
nothing left to finish.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from xa.coordinator import Coordinator, Transaction
from xa.errors import ResourceError
from xa.observer import NullObserver, Phase
from xa.pg import PgBranch, PgManager
from xa.recovery import RecoveryManager, RecoveryReport
from xa.resource import SystemClock
from xa.states import State
from xa.testing import MemoryLog
from xa.xid import NodeId

pytestmark = pytest.mark.integration
NODE = NodeId("n1")
SCHEMA = """
CREATE TABLE t (v text, CONSTRAINT t_v UNIQUE (v) DEFERRABLE INITIALLY DEFERRED);
CREATE TABLE gate (id int PRIMARY KEY);
INSERT INTO gate VALUES (1);
CREATE TABLE waits (v text);
CREATE FUNCTION wait_gate() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN PERFORM 1 FROM gate WHERE id = 1 FOR SHARE; RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER waits_gate AFTER INSERT ON waits DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION wait_gate();
"""


class Rollbacks(NullObserver):
    """Records the result of every branch rollback the coordinator reports."""

    def __init__(self) -> None:
        self.results: list[tuple[str, str, str]] = []

    def phase_ended(self, gtrid: str, phase: Phase, branch: str, result: str, error: str) -> None:
        if phase is Phase.ROLLBACK:
            self.results.append((branch, result, error))


class Db:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conns: list[psycopg.Connection[Any]] = []
        self.observer = Rollbacks()
        self.coord = Coordinator(NODE, MemoryLog(NODE), SystemClock(), observer=self.observer)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)

    def connect(self, **kw: Any) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.dsn, **kw)
        self.conns.append(conn)
        return conn

    def prepared(self) -> set[str]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()").fetchall()
        return {r[0] for r in rows}

    def rows(self, table: str) -> set[str]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return {r[0] for r in conn.execute(f"SELECT v FROM {table}")}  # test literal

    def hold_gate(self) -> psycopg.Connection[Any]:
        """A session holding the gate row: the deferred trigger of ``waits`` blocks PREPARE until it ends."""
        holder = self.connect()
        holder.execute("SELECT 1 FROM gate WHERE id = 1 FOR UPDATE")
        return holder

    def wait_blocked(self, pid: int, deadline_s: float = 30.0) -> None:
        """Poll until backend ``pid`` waits on a lock (its PREPARE is running the deferred trigger)."""
        end = time.monotonic() + deadline_s
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while time.monotonic() < end:
                row = conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
                if row and row[0] == "Lock":
                    return
                time.sleep(0.02)
        raise AssertionError(f"backend {pid} never blocked on the gate")

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


@pytest.fixture
def db(fresh_db: str) -> Iterator[Db]:
    d = Db(fresh_db)
    try:
        yield d
    finally:
        d.close()
        with psycopg.connect(fresh_db, autocommit=True) as conn:  # never leave a prepared transaction behind
            for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
                                       ).fetchall():
                conn.execute(psycopg.sql.SQL("ROLLBACK PREPARED {}").format(psycopg.sql.Literal(gid)))


def fail_prepare(db: Db, conn: psycopg.Connection[Any], work: Callable[[PgBranch], object],
                 during: Callable[[PgBranch], None] | None = None) -> tuple[Transaction, ResourceError]:
    """Enlist ``conn``, do ``work``, commit (``during`` runs while PREPARE is under way); returns the error."""
    txn = db.coord.begin()
    branch = PgBranch(conn, "pg")
    txn.enlist(branch)
    work(branch)
    raised: list[BaseException] = []

    def commit() -> None:
        try:
            txn.commit()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            raised.append(exc)

    if during is None:
        commit()
    else:
        t = threading.Thread(target=commit, name="t2-commit")
        t.start()
        during(branch)
        t.join()
    assert len(raised) == 1, "the commit must fail"
    assert isinstance(raised[0], ResourceError), repr(raised[0])
    return txn, raised[0]


def assert_rolled_back(db: Db, txn: Transaction, exc: ResourceError) -> None:
    assert txn.state is State.ROLLED_BACK
    assert not getattr(exc, "__notes__", []), exc.__notes__  # no "rollback of branch pg also failed"
    assert db.observer.results == [("pg", "ROLLED_BACK", "")]
    assert db.prepared() == set()


def assert_left_to_recovery(db: Db, txn: Transaction) -> RecoveryReport:
    """The session died during PREPARE: whether it happened is unknown, so the branch's rollback is reported
    UNKNOWN (never ROLLED_BACK), the T2 ends ROLLED_BACK, and recovery leaves no prepared transaction behind."""
    assert txn.state is State.ROLLED_BACK
    [(branch, result, error)] = db.observer.results
    assert (branch, result) == ("pg", "UNKNOWN") and "session closed while preparing" in error
    pg = PgManager(lambda: psycopg.connect(db.dsn))
    try:
        report = RecoveryManager(NODE, db.coord.log, [pg], lambda g, p: None, SystemClock(), in_flight_guard=0,
                                 in_flight=db.coord.in_flight).run()
    finally:
        pg.close()
    assert report.errors == []
    assert db.prepared() == set()
    return report


def assert_usable(db: Db, conn: psycopg.Connection[Any], value: str) -> None:
    """The caller's session can run the next T2 branch (psycopg no longer believes a transaction is prepared)."""
    txn = db.coord.begin()
    branch = PgBranch(conn, "pg")
    txn.enlist(branch)
    conn.execute("INSERT INTO t (v) VALUES (%s)", (value,))
    assert txn.commit().state is State.COMMITTED
    assert value in db.rows("t")


def test_constraint_violated_at_prepare(db: Db) -> None:
    conn = db.connect()
    txn, exc = fail_prepare(db, conn, lambda b: b.conn.execute("INSERT INTO t (v) VALUES ('dup'), ('dup')"))
    assert isinstance(exc.__cause__, psycopg.errors.UniqueViolation)
    assert_rolled_back(db, txn, exc)
    assert db.rows("t") == set()
    assert_usable(db, conn, "after-violation")


def test_max_prepared_transactions_exhausted(db: Db) -> None:
    fillers: list[str] = []
    with psycopg.connect(db.dsn, autocommit=True) as admin:
        row = admin.execute("SELECT current_setting('max_prepared_transactions')::int, "
                            "(SELECT count(*) FROM pg_prepared_xacts)").fetchone()
        assert row is not None
        free = row[0] - row[1]
        try:
            for i in range(free):
                gid = f"filler-{i}"
                admin.execute("BEGIN")
                admin.execute(psycopg.sql.SQL("PREPARE TRANSACTION {}").format(psycopg.sql.Literal(gid)))
                fillers.append(gid)
            conn = db.connect()
            txn, exc = fail_prepare(db, conn, lambda b: b.conn.execute("INSERT INTO t (v) VALUES ('x')"))
            assert "maximum number of prepared transactions" in str(exc)
        finally:
            for gid in fillers:
                admin.execute(psycopg.sql.SQL("ROLLBACK PREPARED {}").format(psycopg.sql.Literal(gid)))
    assert_rolled_back(db, txn, exc)
    assert db.rows("t") == set()
    assert_usable(db, conn, "after-exhaustion")


def test_lock_timeout_during_prepare(db: Db) -> None:
    # (statement_timeout does not interrupt the deferred triggers PREPARE TRANSACTION runs: lock_timeout does.)
    holder = db.hold_gate()
    conn = db.connect(options="-c lock_timeout=300")  # the work takes no lock on the gate; PREPARE waits on it
    txn, exc = fail_prepare(db, conn, lambda b: b.conn.execute("INSERT INTO waits (v) VALUES ('w')"))
    assert "lock timeout" in str(exc)
    holder.rollback()
    assert_rolled_back(db, txn, exc)
    assert db.rows("waits") == set()
    assert_usable(db, conn, "after-timeout")


def test_cancelled_during_prepare(db: Db) -> None:
    holder = db.hold_gate()
    conn = db.connect()

    def cancel(b: PgBranch) -> None:
        db.wait_blocked(b.conn.info.backend_pid)
        with psycopg.connect(db.dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_cancel_backend(%s)", (b.conn.info.backend_pid,))

    txn, exc = fail_prepare(db, conn, lambda b: b.conn.execute("INSERT INTO waits (v) VALUES ('w')"), cancel)
    assert isinstance(exc.__cause__, psycopg.errors.QueryCanceled)
    holder.rollback()
    assert_rolled_back(db, txn, exc)
    assert_usable(db, conn, "after-cancel")


def test_session_terminated_during_prepare(db: Db) -> None:
    holder = db.hold_gate()
    conn = db.connect()

    def terminate(b: PgBranch) -> None:
        db.wait_blocked(b.conn.info.backend_pid)
        with psycopg.connect(db.dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (b.conn.info.backend_pid,))

    txn, exc = fail_prepare(db, conn, lambda b: b.conn.execute("INSERT INTO waits (v) VALUES ('w')"), terminate)
    assert isinstance(exc.__cause__, psycopg.OperationalError)
    assert conn.closed
    holder.rollback()
    assert db.prepared() == set()  # PostgreSQL aborted it with its session, but the client cannot know that
    report = assert_left_to_recovery(db, txn)
    assert report.rolled_back == []
    assert db.rows("waits") == set()


class ReplyCutter:
    """A TCP proxy to the server that forwards ``PREPARE TRANSACTION`` and then, instead of forwarding the server's
    reply, closes the client's connection: the branch IS prepared, the client only sees a broken session."""

    def __init__(self, dsn: str) -> None:
        info = conninfo_to_dict(dsn)
        self.upstream = (str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.dsn = make_conninfo(dsn, host="127.0.0.1", port=str(self.listener.getsockname()[1]), sslmode="disable")
        self.cut = threading.Event()
        self.socks: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, name="reply-cutter", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.socks += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, to_server: bool) -> None:
        try:
            while data := src.recv(65536):
                if not to_server and self.cut.is_set():
                    dst.shutdown(socket.SHUT_RDWR)  # the reply to PREPARE never reaches the client
                    dst.close()
                    return
                dst.sendall(data)
                if to_server and b"PREPARE TRANSACTION" in data:
                    self.cut.set()
        except OSError:
            return

    def close(self) -> None:
        for s in self.socks:
            s.close()


def test_prepare_done_but_its_reply_lost(db: Db) -> None:
    """The server prepared the branch, the client never heard: the branch outlives the T2's rollback, and
    recovery (presumed abort: no COMMIT logged) rolls it back."""
    cutter = ReplyCutter(db.dsn)
    try:
        conn = psycopg.connect(cutter.dsn)
        db.conns.append(conn)
        txn, exc = fail_prepare(db, conn, lambda b: b.conn.execute("INSERT INTO t (v) VALUES ('x')"))
    finally:
        cutter.close()
    assert isinstance(exc.__cause__, psycopg.OperationalError)
    assert conn.closed
    assert len(db.prepared()) == 1  # the PREPARE happened
    report = assert_left_to_recovery(db, txn)
    assert report.rolled_back == [f"{txn.gtrid}/pg"]
    assert db.rows("t") == set()
