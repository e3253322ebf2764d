"""The T2 decision in PostgreSQL, fenced by epoch, and a survivor's recovery of a fenced node's transactions
(router/cluster/decisions.py) on a real PostgreSQL: prepared branches made with ``PREPARE TRANSACTION`` under the
nodes' xids, the coordinator's log seam driven directly (no ORB, no broker: the re-send is a recording callback)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from router.cluster import members as M
from router.cluster.decisions import FencedDecisionLog, recover_fenced
from router.cluster.lease import LeaseSettings, expired
from router.cluster.ownership import claim_all
from router.db import Database
from xa.errors import LogWriteFailed
from xa.pg import PgManager
from xa.records import Commit, End, LiveTxn, Participant, Record
from xa.xid import NodeId, branch_xid, new_gtrid

from clusterkit import db_fixture, join  # noqa: F401 - db_fixture: the fixture "db"

pytestmark = pytest.mark.integration

SHORT = LeaseSettings(renew_s=0.05, expiry_s=0.2)
PG = Participant("pg", "postgresql", "postgresql", False)
SEND = Participant("broker", "stomp-send", "stomp-send", True)


class _FileLog:
    """The node's file log as the coordinator sees it (``xa.log.RecoveryLog``): the records appended."""

    def __init__(self, node: str) -> None:
        self.records: list[Record] = []
        self._node = NodeId(node)

    @property
    def node(self) -> NodeId:
        return self._node

    def append(self, record: Record, *, durable: bool) -> None:
        self.records.append(record)

    def live(self) -> dict[str, LiveTxn]:
        return {}


def _fence(db: Database, dead: str, by: str, by_epoch: int) -> None:
    """Wait (polled condition) until ``dead``'s lease expired, then take it over."""
    stop = threading.Event()
    for _ in range(600):
        with db.unit_of_work() as conn:
            if dead in expired(M.members(conn)):
                break
        stop.wait(0.05)
    with db.unit_of_work() as conn:
        claim_all(conn, dead, by, by_epoch)


def _prepare(dsn: str, gtrid: str, marker: str) -> None:
    """A prepared branch of ``gtrid`` that inserts an outbox row (visible once committed)."""
    conn = psycopg.connect(dsn)
    try:
        conn.tpc_begin(branch_xid(gtrid, "pg"))
        conn.execute("INSERT INTO nsjms_outbox (gtrid, idx, dedupe_id, bridge_id, destination, headers, body) "
                     "VALUES (%s, 0, %s, 1, '/queue/q', '{}'::jsonb, %s)", (gtrid, f"{gtrid}/0", marker.encode()))
        conn.tpc_prepare()
    finally:
        conn.close()


def _prepared(dsn: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {psycopg.Xid.from_string(g).gtrid for (g,) in conn.execute("SELECT gid FROM pg_prepared_xacts")}


def test_a_fenced_nodes_decision_is_refused_and_its_file_log_never_gets_it(db: Database) -> None:
    na = join(db, "na", SHORT)
    nb = join(db, "nb")
    file_log = _FileLog("na")
    epochs: dict[str, int | None] = {"na": na}
    decisions = FencedDecisionLog(file_log, db, "na", lambda: epochs["na"])
    first = new_gtrid(NodeId("na"))
    decisions.append(Commit(first, (PG, SEND), None, 0.0), durable=True)       # live: decided
    with db.unit_of_work() as conn:
        assert conn.execute("SELECT gtrid, node_id, epoch FROM nsjms_decision").fetchall() == [(first, "na", na)]
    decisions.append(End(first, 0.0), durable=False)
    decisions.flush_ended()                                                    # (the T2 housekeeping, every 0.5 s)
    _fence(db, "na", "nb", nb)                                                 # na paused past its lease
    second = new_gtrid(NodeId("na"))
    with pytest.raises(LogWriteFailed):                                        # it wakes and decides: refused
        decisions.append(Commit(second, (PG, SEND), None, 0.0), durable=True)
    assert [type(r).__name__ for r in file_log.records] == ["Commit", "End"], "the refused COMMIT is in no log"
    with db.unit_of_work() as conn:
        rows = conn.execute("SELECT gtrid FROM nsjms_decision").fetchall()
    assert rows == [], "the ended transaction's row is gone, and the refused decision never had one"


def test_a_survivor_commits_decided_rolls_back_undecided_and_never_touches_a_live_nodes_xids(
        db: Database, fresh_db: str) -> None:
    na = join(db, "na", SHORT)
    nb = join(db, "nb")
    decided, undecided, live = (new_gtrid(NodeId("na")), new_gtrid(NodeId("na")), new_gtrid(NodeId("nb")))
    for gtrid in (decided, undecided, live):
        _prepare(fresh_db, gtrid, gtrid)
    FencedDecisionLog(_FileLog("na"), db, "na", lambda: na).append(Commit(decided, (PG, SEND), None, 0.0),
                                                                     durable=True)
    sent: list[tuple[str, Participant]] = []

    def resend(gtrid: str, p: Participant) -> None:
        sent.append((gtrid, p))

    pg = PgManager(lambda: psycopg.connect(fresh_db, autocommit=True))
    try:
        early = recover_fenced(db, "na", "nb", nb, pg, resend, "stomp-send")     # na not fenced: nothing touched
        assert early.committed == early.rolled_back == [] and _prepared(fresh_db) == {decided, undecided, live}
        _fence(db, "na", "nb", nb)
        report = recover_fenced(db, "na", "nb", nb, pg, resend, "stomp-send")
    finally:
        pg.close()
    assert report.committed == [decided] and report.rolled_back == [undecided] and report.errors == []
    assert sent == [(decided, SEND)], "the decided transaction's outbox rows are re-sent (same dedupe ids)"
    assert _prepared(fresh_db) == {live}, "the live node's prepared branch is untouched"
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        left: Any = conn.execute("SELECT (SELECT count(*) FROM nsjms_decision), "
                                 "(SELECT count(*) FROM nsjms_outbox)").fetchone()
        assert left == (0, 0), "the finished transaction's decision and outbox rows are gone"
        conn.tpc_rollback(branch_xid(live, "pg"))


def test_a_fenced_nodes_transactions_are_finished_by_a_survivor_of_its_dead_fencer(
        db: Database, fresh_db: str) -> None:
    """nb fences na but cannot re-send na's decided outbox (broker down), then nb dies and nc takes nb over: nc's
    takeover pass finishes na's transactions too (before: only the fencer ever retried them)."""
    from router.cluster.takeover import Takeover

    na = join(db, "na", SHORT)
    nb = join(db, "nb", SHORT)
    nc = join(db, "nc")
    decided, undecided = new_gtrid(NodeId("na")), new_gtrid(NodeId("na"))
    for gtrid in (decided, undecided):
        _prepare(fresh_db, gtrid, gtrid)
    FencedDecisionLog(_FileLog("na"), db, "na", lambda: na).append(Commit(decided, (PG, SEND), None, 0.0),
                                                                     durable=True)
    sent: list[tuple[str, Participant]] = []

    def broker_down(gtrid: str, p: Participant) -> None:
        raise ConnectionError("broker down")

    def resend(gtrid: str, p: Participant) -> None:
        sent.append((gtrid, p))

    pg = PgManager(lambda: psycopg.connect(fresh_db, autocommit=True))
    try:
        _fence(db, "na", "nb", nb)
        first = recover_fenced(db, "na", "nb", nb, pg, broker_down, "stomp-send")
        assert first.errors and sent == [], "nb's re-send failed: na's decision row stays"
        _fence(db, "nb", "nc", nc)                                   # nb dies before its next pass
        recovered: list[str] = []

        def recover(dead: str) -> None:
            recovered.append(dead)
            recover_fenced(db, dead, "nc", nc, pg, resend, "stomp-send")

        Takeover(db, "nc", lambda: nc, 1.0, start=lambda owned: None, recover=recover).pass_once()
    finally:
        pg.close()
    assert recovered == ["na", "nb"], "nc finishes the work of the member nb fenced, not only of nb"
    assert sent == [(decided, SEND)], "na's decided outbox is re-sent by nc"
    assert _prepared(fresh_db) == set()
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        left: Any = conn.execute("SELECT (SELECT count(*) FROM nsjms_decision), "
                                 "(SELECT count(*) FROM nsjms_outbox)").fetchone()
        assert left == (0, 0)


def test_one_node_at_a_time_recovers_a_fenced_member(db: Database, fresh_db: str) -> None:
    """recover_fenced holds the fenced member's row FOR UPDATE: a second node meanwhile skips it."""
    na = join(db, "na", SHORT)
    nb = join(db, "nb")
    decided = new_gtrid(NodeId("na"))
    _prepare(fresh_db, decided, decided)
    FencedDecisionLog(_FileLog("na"), db, "na", lambda: na).append(Commit(decided, (PG, SEND), None, 0.0),
                                                                     durable=True)
    _fence(db, "na", "nb", nb)
    pg = PgManager(lambda: psycopg.connect(fresh_db, autocommit=True))
    other = psycopg.connect(fresh_db)
    try:
        other.execute("SELECT 1 FROM nsjms_member WHERE node_id = 'na' FOR UPDATE")   # another node recovers na
        busy = recover_fenced(db, "na", "nb", nb, pg, lambda g, p: None, "stomp-send")
        assert busy.committed == [] and _prepared(fresh_db) == {decided}, "skipped while another node holds it"
        other.rollback()
        done = recover_fenced(db, "na", "nb", nb, pg, lambda g, p: None, "stomp-send")
        assert done.committed == [decided] and _prepared(fresh_db) == set()
    finally:
        other.close()
        pg.close()
