"""The node's T2 machinery (router.routing.t2.transactions) over a real PostgreSQL, a real ActiveMQ and the real file
journal.

A "crash" is a BaseException the coordinator does not catch, raised at a protocol step; the sessions the dead
process held are closed and a new :class:`NodeTransactions` on the same state directory does what a restarted
node does at start.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from router.db import Database
from router.jms.transport import Transport, open_transport
from router.mapping.stomp_codec import StompCodec
from router.routing.t2.transactions import NodeTransactions, OutboxRow, inbox_claim, outbox_insert
from xa.pg import PgBranch
from xa.xid import dedupe_id

from bridgekit import prepared_gids, row_count
from t2kit import Crash, SendBranch

pytestmark = pytest.mark.integration


@pytest.fixture
def db(fresh_db: str) -> Iterator[Database]:
    database = Database(fresh_db, 4)
    database.open()
    yield database
    database.close()


def _transport(broker_url: str) -> Transport:
    return open_transport(broker_url, codec=StompCodec())


def _node(tmp_path: Path, db: Database, dsn: str, broker_url: str) -> NodeTransactions:
    return NodeTransactions("n1", tmp_path, db, dsn, transport=lambda: _transport(broker_url))


def _receive_all(broker_url: str, queue: str, want: int) -> list[Any]:
    t = _transport(broker_url)
    t.connect()
    try:
        sub = t.subscribe(f"/queue/{queue}")
        got: list[Any] = []
        while len(got) < want:
            d = sub.receive(10.0)
            assert d is not None, f"only {len(got)} of {want} messages arrived"
            t.ack(d)
            got.append(d)
        assert sub.receive(0.5) is None, "more messages than sent"
        return got
    finally:
        t.close()


def _crash_after_decision(node: NodeTransactions, db: Database, queue: str, n: int) -> str:
    """A T2 that wrote ``n`` outbox rows, prepared, logged COMMIT and died before any phase-two call."""
    txn = node.coordinator.begin(30)
    with db.branch() as conn:
        branch = PgBranch(conn, "pg")
        txn.enlist(branch)
        rows = [OutboxRow(txn.gtrid, i, dedupe_id(txn.gtrid, i), 7, f"/queue/{queue}",
                          {"nsjms_dedupe_id": dedupe_id(txn.gtrid, i), "persistent": "true"}, f"m{i}".encode())
                for i in range(n)]
        outbox_insert(conn, rows)
        original = branch.commit

        def crash() -> None:
            raise Crash("after the decision, before committing PostgreSQL")
        branch.commit = crash  # type: ignore[method-assign]
        txn.enlist(SendBranch())
        with pytest.raises(Crash):
            txn.commit()
        del original
    return txn.gtrid


def test_start_finishes_a_logged_commit_and_resends_the_outbox(tmp_path: Path, db: Database, fresh_db: str,
                                                                broker_url: str) -> None:
    queue = f"t2.{uuid.uuid4().hex[:8]}"
    node = _node(tmp_path, db, fresh_db, broker_url)
    gtrid = _crash_after_decision(node, db, queue, 3)
    assert len(prepared_gids(fresh_db)) == 1
    node.log.close()

    restarted = _node(tmp_path, db, fresh_db, broker_url)
    try:
        report = restarted.start(background=False)
        assert report.errors == []
        assert [c.split("/")[0] for c in report.committed] == [gtrid]
        assert report.resent == [f"{gtrid}/stomp"]
        assert prepared_gids(fresh_db) == []
        got = _receive_all(broker_url, queue, 3)
        assert [d.headers["nsjms_dedupe_id"] for d in got] == [dedupe_id(gtrid, i) for i in range(3)]
        assert [d.body for d in got] == [b"m0", b"m1", b"m2"]
        assert gtrid not in restarted.log.live()
        restarted.recover_now()
        restarted._purge()
        assert row_count(fresh_db, "nsjms_outbox") == 0
    finally:
        restarted.close()


def test_start_rolls_back_an_undecided_prepared_branch_without_waiting_for_the_guard(
        tmp_path: Path, db: Database, fresh_db: str, broker_url: str) -> None:
    node = _node(tmp_path, db, fresh_db, broker_url)
    txn = node.coordinator.begin(30)
    with db.branch() as conn:
        branch = PgBranch(conn, "pg")
        txn.enlist(branch)
        outbox_insert(conn, [OutboxRow(txn.gtrid, 0, dedupe_id(txn.gtrid, 0), 7, "/queue/x", {}, b"")])
        branch.prepare()                 # the process dies after PREPARE, before the decision
    assert len(prepared_gids(fresh_db)) == 1
    node.log.close()

    restarted = _node(tmp_path, db, fresh_db, broker_url)
    try:
        assert restarted.recovery.guard > 0
        report = restarted.start(background=False)
        assert report.rolled_back == [f"{txn.gtrid}/pg"]
        assert prepared_gids(fresh_db) == []
        assert row_count(fresh_db, "nsjms_outbox") == 0
        assert restarted.recovery.guard > 0, "the guard is back for the periodic passes"
    finally:
        restarted.close()


def test_a_broker_commit_crash_resends_with_the_same_dedupe_ids(tmp_path: Path, db: Database, fresh_db: str,
                                                                 broker_url: str) -> None:
    """PostgreSQL committed, the process died at the broker commit: the outbox rows are re-sent at start."""
    queue = f"t2.{uuid.uuid4().hex[:8]}"
    node = _node(tmp_path, db, fresh_db, broker_url)
    txn = node.coordinator.begin(30)
    with db.branch() as conn:
        txn.enlist(PgBranch(conn, "pg"))
        outbox_insert(conn, [OutboxRow(txn.gtrid, 0, dedupe_id(txn.gtrid, 0), 7, f"/queue/{queue}",
                                       {"nsjms_dedupe_id": dedupe_id(txn.gtrid, 0)}, b"only")])
        txn.enlist(SendBranch(crash="broker commit"))
        with pytest.raises(Crash):
            txn.commit()
    assert prepared_gids(fresh_db) == []
    node.log.close()

    restarted = _node(tmp_path, db, fresh_db, broker_url)
    try:
        report = restarted.start(background=False)
        assert report.resent == [f"{txn.gtrid}/stomp"] and report.errors == []
        got = _receive_all(broker_url, queue, 1)
        assert got[0].headers["nsjms_dedupe_id"] == dedupe_id(txn.gtrid, 0)
    finally:
        restarted.close()


def test_inbox_claim_returns_only_new_ids(db: Database) -> None:
    with db.unit_of_work() as conn:
        assert inbox_claim(conn, 1, ["a", "b"], "g1") == {"a", "b"}
    with db.unit_of_work() as conn:
        assert inbox_claim(conn, 1, ["b", "c"], "g2") == {"c"}
        assert inbox_claim(conn, 2, ["b"], "g2") == {"b"}, "the inbox is per bridge"


def test_pg_manager_finishes_many_branches_over_several_sessions(fresh_db: str) -> None:
    from psycopg import sql

    from xa.errors import BranchNotFound
    from xa.pg import PgManager
    from xa.xid import NodeId, branch_xid, new_gtrid

    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE batch_rows (g text)")
        gtrids = [new_gtrid(NodeId("n1")) for _ in range(30)]
        for g in gtrids:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO batch_rows VALUES (%s)", (g,))
            conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(str(branch_xid(g, "pg")))))
    manager = PgManager(lambda: psycopg.connect(fresh_db, autocommit=True), sessions=4, per_session=4)
    missing = branch_xid(new_gtrid(NodeId("n1")), "pg")
    ops = [("commit" if i % 2 == 0 else "rollback", branch_xid(g, "pg")) for i, g in enumerate(gtrids)]
    try:
        results = manager.finish_branches([*ops, ("commit", missing)])
    finally:
        manager.close()
    assert results[:-1] == [None] * len(ops)
    assert isinstance(results[-1], BranchNotFound)
    assert prepared_gids(fresh_db) == []
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        rows = {r[0] for r in conn.execute("SELECT g FROM batch_rows")}
    assert rows == {g for i, g in enumerate(gtrids) if i % 2 == 0}


def test_start_in_background_resends_after_returning_in_broker_batches(tmp_path: Path, db: Database, fresh_db: str,
                                                                         broker_url: str) -> None:
    """The start pass commits the PostgreSQL branches and returns; the re-sends follow at once in the
    housekeeping thread, several T2s per broker transaction, every dedupe id once."""
    queue = f"t2.{uuid.uuid4().hex[:8]}"
    node = _node(tmp_path, db, fresh_db, broker_url)
    gtrids = [_crash_after_decision(node, db, queue, 2) for _ in range(3)]
    node.log.close()

    restarted = _node(tmp_path, db, fresh_db, broker_url)
    restarted.resender.batch_messages = 4            # 3 T2s of 2 messages: two broker transactions
    try:
        report = restarted.start(background=True)
        assert report.errors == [] and report.resent == []
        assert sorted(report.deferred) == sorted(f"{g}/stomp" for g in gtrids)
        assert sorted(c.split("/")[0] for c in report.committed) == sorted(gtrids)
        assert prepared_gids(fresh_db) == []
        got = _receive_all(broker_url, queue, 6)
        assert sorted(d.headers["nsjms_dedupe_id"] for d in got) == sorted(dedupe_id(g, i) for g in gtrids
                                                                           for i in range(2))
        deadline = time.monotonic() + 30
        while restarted.log.live():
            assert time.monotonic() < deadline, "the deferred re-sends did not end their transactions"
            time.sleep(0.05)
    finally:
        restarted.close()
