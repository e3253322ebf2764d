"""Recovery over REAL prepared PostgreSQL transactions and the real file journal.

Each test runs the coordinator until a crash point (a BaseException the coordinator does not catch, as if the
process died there), closes every session the "dead" process held, then runs recovery the way a restarted node
does: a new FileLog read back from disk and fresh connections. ``pg_prepared_xacts`` is checked afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import Xid, sql
from psycopg.conninfo import make_conninfo

from xa.coordinator import Coordinator
from xa.errors import OutcomeUnknown
from xa.log import FileLog
from xa.pg import PgBranch, PgManager
from xa.records import Participant
from xa.recovery import RecoveryManager, SafeAction
from xa.resource import SystemClock
from xa.states import State
from xa.testing import MemoryManager, MemoryResource
from xa.xid import FORMAT_ID, NodeId, branch_xid, new_gtrid

pytestmark = pytest.mark.integration
NODE = NodeId("n1")


class Crash(BaseException):
    """The process dies here."""


class CrashAt:
    """Wraps a resource; raises :class:`Crash` when ``step`` is reached (``before`` or after doing it)."""

    def __init__(self, inner: Any, step: str, *, after: bool = False) -> None:
        self.inner, self.step, self.after = inner, step, after
        self.name, self.kind, self.manager = inner.name, inner.kind, inner.manager
        self.one_phase_only = inner.one_phase_only

    def sort_key(self) -> str:
        return str(self.inner.sort_key())

    def _do(self, step: str, *args: Any) -> None:
        if step == self.step and not self.after:
            raise Crash(step)
        getattr(self.inner, step)(*args)
        if step == self.step:
            raise Crash(step)

    def begin(self, xid: Xid) -> None:
        self._do("begin", xid)

    def prepare(self) -> None:
        self._do("prepare")

    def commit(self) -> None:
        self._do("commit")

    def rollback(self) -> None:
        self._do("rollback")


class Node:
    """One run of a node: its log, PostgreSQL sessions, a twin broker branch; ``restart`` reads it all back."""

    def __init__(self, dsn: str, state_dir: Path, family: list[Node] | None = None) -> None:
        self.dsn, self.state_dir = dsn, state_dir
        self.family = family if family is not None else []  # every incarnation, closed by the fixture
        self.family.append(self)
        self.clock = SystemClock()
        self.log = FileLog(state_dir, NODE)
        self.coord = Coordinator(NODE, self.log, self.clock)
        self.conns: list[psycopg.Connection[Any]] = []
        self.broker = MemoryManager("broker")
        self.resent: list[tuple[str, str]] = []
        self.pg = PgManager(lambda: psycopg.connect(dsn), key="pg")  # recovery's own session

    def branch(self, name: str) -> PgBranch:
        conn = psycopg.connect(self.dsn)
        self.conns.append(conn)
        return PgBranch(conn, name, manager="pg")

    def stomp(self, **kw: Any) -> MemoryResource:
        return self.broker.branch("stomp", one_phase=True, **kw)

    def die(self) -> None:
        if self.log.closed:
            return
        for conn in self.conns:
            conn.close()
        self.pg.close()
        self.log.close()

    def recovery(self, guard: float) -> RecoveryManager:
        def resend(gtrid: str, p: Participant) -> None:
            self.resent.append((gtrid, p.name))

        return RecoveryManager(NODE, self.log, [self.pg], resend,
                               self.clock, in_flight_guard=guard, in_flight=self.coord.in_flight)

    def restart(self) -> Node:
        self.die()
        return Node(self.dsn, self.state_dir, self.family)


@pytest.fixture
def node(fresh_db: str, tmp_path: Path) -> Iterator[Node]:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (v text PRIMARY KEY)")
        conn.execute("CREATE TABLE outbox (dedupe_id text PRIMARY KEY)")
    n = Node(fresh_db, tmp_path)
    yield n
    for incarnation in n.family:
        incarnation.die()


def prepared_gids(dsn: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()").fetchall()
    return {r[0] for r in rows}


def prepare_and_close(dsn: str, xid: Xid, statement: str) -> None:
    """Leave a prepared transaction behind a closed session (``with connect()`` would try to commit it)."""
    conn = psycopg.connect(dsn)
    try:
        conn.tpc_begin(xid)
        conn.execute(sql.SQL(statement))  # test literals only
        conn.tpc_prepare()
    finally:
        conn.close()


def rows(dsn: str, table: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {r[0] for r in conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table)))}


def run_until_crash(n: Node, crash: str, *, after: bool = False, broker_fail: Any = None) -> str:
    t = n.coord.begin(30)
    queue, outbox = n.branch("channel-queue"), n.branch("outbox")
    participants: list[Any] = [queue, outbox, n.stomp(fail=broker_fail or {}, applies=True)]
    target, step = crash.split(":") if ":" in crash else ("", crash)
    participants = [CrashAt(p, step, after=after) if p.name == target else p for p in participants]
    for p in participants:
        t.enlist(p)
    queue.conn.execute("INSERT INTO events (v) VALUES (%s)", (f"{t.gtrid}-event",))
    outbox.conn.execute("INSERT INTO outbox (dedupe_id) VALUES (%s)", (f"{t.gtrid}/0",))
    if target:
        with pytest.raises(Crash):
            t.commit()
    else:
        t.commit()
    return t.gtrid


def test_crash_after_the_decision_is_finished_by_recovery(node: Node) -> None:
    gtrid = run_until_crash(node, "channel-queue:commit")  # decision durable; no branch committed yet
    assert len(prepared_gids(node.dsn)) == 2
    again = node.restart()
    [entry] = again.recovery(guard=3600).view()
    assert entry.gtrid == gtrid and entry.action is SafeAction.COMMIT
    report = again.recovery(guard=3600).run()
    assert len(report.committed) == 2 and report.ended == [gtrid]
    assert again.resent == [(gtrid, "stomp")]  # the broker commit never ran: re-send from the outbox
    assert prepared_gids(node.dsn) == set()
    assert rows(node.dsn, "events") == {f"{gtrid}-event"} and rows(node.dsn, "outbox") == {f"{gtrid}/0"}
    assert again.log.live() == {}


def test_crash_between_branch_commits(node: Node) -> None:
    gtrid = run_until_crash(node, "channel-queue:commit", after=True)  # queue committed, outbox still prepared
    assert len(prepared_gids(node.dsn)) == 1
    again = node.restart()
    report = again.recovery(guard=3600).run()
    assert report.committed == [f"{gtrid}/outbox"] and report.ended == [gtrid]  # the gone branch counts as done
    assert prepared_gids(node.dsn) == set() and again.resent == [(gtrid, "stomp")]


def test_crash_after_the_broker_commit_resends_with_the_same_dedupe_id(node: Node) -> None:
    gtrid = run_until_crash(node, "stomp:commit", after=True)  # the promised duplicate window
    again = node.restart()
    report = again.recovery(guard=3600).run()
    assert report.committed == [] and report.ended == [gtrid]
    assert again.resent == [(gtrid, "stomp")]
    assert rows(node.dsn, "outbox") == {f"{gtrid}/0"}


def test_unknown_broker_outcome_without_a_crash(node: Node) -> None:
    t = node.coord.begin(30)
    queue = node.branch("channel-queue")
    t.enlist(queue)
    queue.conn.execute("INSERT INTO events (v) VALUES ('e')")
    t.enlist(node.stomp(fail={"commit": OutcomeUnknown("no receipt")}))
    outcome = t.commit()
    assert outcome.state is State.COMMIT_PENDING and outcome.resend == ("stomp",)
    assert rows(node.dsn, "events") == {"e"}
    again = node.restart()
    [entry] = again.recovery(guard=3600).view()
    assert entry.action is SafeAction.RESEND
    assert again.recovery(guard=3600).run().ended == [t.gtrid] and again.resent == [(t.gtrid, "stomp")]


@pytest.mark.parametrize("crash", ["outbox:prepare", "stomp:prepare"])
def test_crash_before_the_decision_is_presumed_abort(node: Node, crash: str) -> None:
    gtrid = run_until_crash(node, crash, after=True)
    assert prepared_gids(node.dsn)  # at least one branch left prepared by the dead process
    again = node.restart()
    young = again.recovery(guard=3600).run()
    assert young.rolled_back == [] and young.waiting and prepared_gids(node.dsn)
    [entry] = again.recovery(guard=3600).view()
    assert entry.action is SafeAction.WAIT
    old = again.recovery(guard=0).run()
    assert {r.split("/")[0] for r in old.rolled_back} == {gtrid}
    assert prepared_gids(node.dsn) == set()
    assert rows(node.dsn, "events") == set() and rows(node.dsn, "outbox") == set() and again.resent == []


def test_foreign_xids_in_the_same_database_are_untouched(node: Node) -> None:
    foreign = [
        branch_xid(new_gtrid(NodeId("n2")), "outbox"),  # another node
        Xid.from_parts(12345, new_gtrid(NODE), "outbox"),  # another format id, our gtrid shape
        Xid.from_parts(FORMAT_ID, "somebody-else", "b"),  # our format id, not our gtrid
        Xid.from_string("plain-application-gid"),  # not an XA triple at all
    ]
    for i, xid in enumerate(foreign):
        prepare_and_close(node.dsn, xid, f"INSERT INTO events (v) VALUES ('foreign-{i}')")
    before = prepared_gids(node.dsn)
    assert before == {str(x) for x in foreign}
    report = node.recovery(guard=0).run()
    assert report.foreign == 4 and report.rolled_back == [] and report.committed == []
    assert prepared_gids(node.dsn) == before
    assert node.recovery(guard=0).view() == []


def test_prepared_xacts_of_another_database_are_not_listed(node: Node, pg_dsn: str) -> None:
    other = "nsjms_xa_other_" + new_gtrid(NODE).split(":")[1]
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(other)))
    other_dsn = make_conninfo(pg_dsn, dbname=other)
    xid = branch_xid(new_gtrid(NODE), "outbox")  # even OUR node's xid: it is not this database's to finish
    try:
        prepare_and_close(other_dsn, xid, "SELECT 1")
        assert node.pg.recover() == []
        assert node.recovery(guard=0).run().rolled_back == []
        assert prepared_gids(other_dsn) == {str(xid)}
    finally:
        with psycopg.connect(other_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(str(xid))))
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(other)))


def test_happy_path_leaves_nothing_behind(node: Node) -> None:
    gtrid = run_until_crash(node, "none")
    assert prepared_gids(node.dsn) == set() and node.log.live() == {}
    assert rows(node.dsn, "events") == {f"{gtrid}-event"} and node.broker.committed == []
