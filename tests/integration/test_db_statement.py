"""``Database.statement`` against a real PostgreSQL (issue 12, accept side): a unit of work of one statement on an
autocommit connection is one round trip, and it is committed when the call returns (no COMMIT sent)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from router.db import Database, StoreError, StoreTimeout, StoreUnavailable
from router.node.services import EmbeddedPostgres

pytestmark = pytest.mark.integration

DEADLINE_S = 30.0


def _db(dsn: str) -> Database:
    db = Database(dsn, pool_size=2, idle_check=60.0)
    db.open(migrate=False)
    with db.unit_of_work() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS t_stmt (id int PRIMARY KEY)")
    return db


def _committed(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as other:
        return [r[0] for r in other.execute("SELECT id FROM t_stmt ORDER BY id").fetchall()]


def test_a_statement_is_committed_when_it_returns_and_sends_no_begin_or_commit(fresh_db: str) -> None:
    db = _db(fresh_db)
    try:
        with db.statement() as conn:
            assert conn.autocommit
            conn.execute("INSERT INTO t_stmt VALUES (1)")
            # still inside the block: another connection sees the row already, so nothing waits for a COMMIT
            assert _committed(fresh_db) == [1]
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    finally:
        db.close()


def test_the_connection_goes_back_to_the_pool_transactional(fresh_db: str) -> None:
    db = _db(fresh_db)
    try:
        with db.statement() as conn:
            conn.execute("SELECT 1")
        for _ in range(3):          # whichever pooled connection: a rolled back unit of work leaves nothing
            with pytest.raises(RuntimeError), db.unit_of_work() as conn2:
                assert not conn2.autocommit
                conn2.execute("INSERT INTO t_stmt VALUES (2)")
                raise RuntimeError("roll back")
        assert _committed(fresh_db) == []
    finally:
        db.close()


def test_a_failed_statement_commits_nothing_and_raises_store_error(fresh_db: str) -> None:
    db = _db(fresh_db)
    try:
        with pytest.raises(StoreError) as info, db.statement() as conn:
            conn.execute("INSERT INTO t_stmt SELECT x FROM (VALUES (3), (3)) AS v(x)")   # duplicate key
        assert not getattr(info.value, "in_doubt", False)
        assert _committed(fresh_db) == []
        with db.statement() as conn:      # the connection is usable again
            conn.execute("INSERT INTO t_stmt VALUES (4)")
        assert _committed(fresh_db) == [4]
    finally:
        db.close()


def test_a_connection_closed_by_a_restart_is_replaced_and_the_statement_succeeds(own_pg: EmbeddedPostgres) -> None:
    """The server restarted while the connections sat in the pool: the stale one is found before anything is sent
    (the server's goodbye waits on its socket), discarded, and the statement runs on another connection (once:
    nothing was sent, so it is safe). Before: the statement failed (StoreUnavailable, not in doubt)."""
    db = _db(own_pg.dsn)
    try:
        with db.statement() as a, db.statement() as b:     # two connections in the pool, both to go stale
            assert a is not b
        own_pg.stop()
        own_pg.start()
        with db.statement() as conn:
            conn.execute("INSERT INTO t_stmt VALUES (5)")
        with db.statement() as conn:
            conn.execute("INSERT INTO t_stmt VALUES (6)")
        assert _committed(own_pg.dsn) == [5, 6]
    finally:
        db.close()


def test_a_backend_killed_during_the_statement_is_in_doubt(fresh_db: str) -> None:
    """The connection breaks while the statement runs (its backend terminated: the server may or may not have
    committed it): ``StoreUnavailable`` in doubt, which the channel's boundary answers ``TRANSIENT`` with
    ``COMPLETED_MAYBE``; the next statement gets a working connection."""
    from omniORB import CORBA

    from router.channel.boundary import store_faults

    db = _db(fresh_db)
    killed: list[bool] = []

    def kill(pid: int) -> None:
        with psycopg.connect(fresh_db, autocommit=True) as other:
            end = time.monotonic() + DEADLINE_S
            while time.monotonic() < end:                # wait until the statement runs (sleeps) on the server
                row = other.execute("SELECT query FROM pg_stat_activity WHERE pid = %s AND state = 'active'",
                                    (pid,)).fetchone()
                if row is not None and "pg_sleep" in row[0]:
                    done = other.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
                    killed.append(done is not None and bool(done[0]))
                    return
                time.sleep(0.01)

    try:
        with pytest.raises(CORBA.TRANSIENT) as info, store_faults(), db.statement() as conn:
            killer = threading.Thread(target=kill, args=(conn.info.backend_pid,), daemon=True)
            killer.start()
            conn.execute("INSERT INTO t_stmt SELECT 7 FROM pg_sleep(%s)", (DEADLINE_S,))
        killer.join(DEADLINE_S)
        assert killed == [True], "the backend was terminated while the statement ran"
        assert info.value.completed == CORBA.COMPLETED_MAYBE
        cause = info.value.__cause__
        assert isinstance(cause, StoreUnavailable) and cause.in_doubt
        with db.statement() as conn:
            conn.execute("INSERT INTO t_stmt VALUES (8)")
        assert _committed(fresh_db) == [8]
    finally:
        db.close()


def test_a_statement_the_database_cancels_is_a_store_timeout_not_in_doubt(fresh_db: str) -> None:
    """A statement cancelled by the database (here ``lock_timeout``: another transaction holds the table's lock)
    committed nothing (autocommit: it was its own transaction): ``StoreTimeout``, not in doubt, and the connection
    stays usable. Before: ``StoreUnavailable("connection failed")`` (an outage) for a reachable database."""
    from psycopg.conninfo import make_conninfo

    db = _db(make_conninfo(fresh_db, options="-c lock_timeout=100"))
    try:
        with psycopg.connect(fresh_db) as holder:
            holder.execute("LOCK TABLE t_stmt IN ACCESS EXCLUSIVE MODE")      # held until the block ends
            with pytest.raises(StoreError) as info, db.statement() as conn:
                conn.execute("INSERT INTO t_stmt VALUES (9)")
            holder.rollback()
        assert type(info.value) is StoreTimeout
        assert not getattr(info.value, "in_doubt", False)
        assert _committed(fresh_db) == []
        with db.statement() as conn:      # the same pool works: the connection was not discarded as broken
            conn.execute("INSERT INTO t_stmt VALUES (10)")
        assert _committed(fresh_db) == [10]
    finally:
        db.close()
