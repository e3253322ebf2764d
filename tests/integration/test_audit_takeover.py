"""Cluster-aware verdicts on a real PostgreSQL (issue 28, docs/audit.md "Nodes"): a survivor that finishes a fenced
node's decided channel → JMS transaction re-sends its outbox rows (same nsjms_dedupe_id) and records the re-send in
the ledger in the transaction that deletes them (``router.routing.ledger_takeover.record_resends``, through
``router.cluster.decisions.recover_fenced``); the incremental audit counts that pair as ``resent`` (day verdict
``pass``), while a duplicate across nodes in two transactions and a loss are violations attributed to a node. Also
the incremental audit of a synthetic ledger with both kinds injected gives exactly the injected counts."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from audit.incremental import metrics_text, run_incremental
from audit.incremental_report import render
from audit.ledger import TABLE, ensure_partitions, install_schema
from audit.synth import SURVIVOR, SynthSpec, copy_to_postgres, generate
from router.cluster import members as M
from router.cluster.decisions import FencedDecisionLog, recover_fenced
from router.cluster.lease import LeaseSettings, expired
from router.cluster.ownership import claim_all
from router.db import Database
from router.routing.ledger_takeover import record_resends
from xa.pg import PgManager
from xa.records import Commit, LiveTxn, Participant, Record
from xa.xid import NodeId, branch_xid, dedupe_id, new_gtrid

pytestmark = pytest.mark.integration

LONG = LeaseSettings(renew_s=1.0, expiry_s=60.0)
SHORT = LeaseSettings(renew_s=0.05, expiry_s=0.2)
PG = Participant("pg", "postgresql", "postgresql", False)
SEND = Participant("broker", "stomp-send", "stomp-send", True)
GRACE = timedelta(seconds=300)
T0 = datetime(2026, 3, 1, 10, tzinfo=UTC)      # one UTC day


class _FileLog:
    def __init__(self, node: str) -> None:
        self._node = NodeId(node)

    @property
    def node(self) -> NodeId:
        return self._node

    def append(self, record: Record, *, durable: bool) -> None:
        pass

    def live(self) -> dict[str, LiveTxn]:
        return {}


@pytest.fixture
def db(fresh_db: str) -> Iterator[Database]:
    with psycopg.connect(fresh_db) as conn:
        install_schema(conn)
        ensure_partitions(conn, T0.date(), 1)
    database = Database(fresh_db, 4)
    database.open()
    yield database
    database.close()


def _join(db: Database, node: str, settings: LeaseSettings = LONG) -> int:
    with db.unit_of_work() as conn:
        return M.join(conn, node, f"{node}.example:2809", settings)


def _fence(db: Database, dead: str, by: str, by_epoch: int) -> None:
    stop = threading.Event()
    for _ in range(600):
        with db.unit_of_work() as conn:
            if dead in expired(M.members(conn)):
                break
        stop.wait(0.05)
    with db.unit_of_work() as conn:
        claim_all(conn, dead, by, by_epoch)


def _ledger_row(conn: psycopg.Connection[Any], dedupe: str, accepted: datetime, outcome: str, node: str,
                gtrid: str | None = None, message: str | None = None) -> None:
    conn.execute(f"INSERT INTO {TABLE} (dedupe_id, channel_id, bridge_id, destination, direction, gtrid, "
                 "jms_message_id, accepted_at, dispatched_at, prepared_at, outcome, node_id) "
                 "VALUES (%s, 1, 7, 'queue/q', 'channel_to_jms', %s, %s, %s, %s, %s, %s, %s)",
                 (dedupe, gtrid, message, accepted, accepted if gtrid else None, accepted if gtrid else None,
                  outcome, node))


def _prepare_t2(dsn: str, gtrid: str, events: list[tuple[str, datetime]]) -> None:
    """The dead node's channel → JMS T2 as its PostgreSQL branch leaves it prepared: an outbox row per message and
    the obligations' ``delivered`` rows (node ``na``, its message's nsjms_dedupe_id), not committed."""
    conn = psycopg.connect(dsn)
    try:
        conn.tpc_begin(branch_xid(gtrid, "pg"))
        for i, (dedupe, accepted) in enumerate(events):
            conn.execute("INSERT INTO nsjms_outbox (gtrid, idx, dedupe_id, bridge_id, destination, headers, body) "
                         "VALUES (%s, %s, %s, 7, '/queue/q', '{}'::jsonb, 'x')", (gtrid, i, dedupe_id(gtrid, i)))
            _ledger_row(conn, dedupe, accepted, "delivered", "na", gtrid, dedupe_id(gtrid, i))
        conn.tpc_prepare()
    finally:
        conn.close()


def test_a_survivors_re_send_is_recorded_and_audited_as_resent_not_duplicated(db: Database, fresh_db: str) -> None:
    na = _join(db, "na", SHORT)
    nb = _join(db, "nb")
    t0 = T0
    events = [("e1/c1/a1/p1", t0), ("e2/c1/a1/p1", t0 + timedelta(seconds=1))]
    with psycopg.connect(fresh_db) as conn:
        for dedupe, accepted in events:
            _ledger_row(conn, dedupe, accepted, "accepted", "na")
        # not a re-send: na delivered it in its transaction, nb routed it again in one of its own
        _ledger_row(conn, "e3/c1/a1/p1", t0, "accepted", "na")
        _ledger_row(conn, "e3/c1/a1/p1", t0, "delivered", "na", "na:old", "na:old/0")
        _ledger_row(conn, "e3/c1/a1/p1", t0, "delivered", "nb", "nb:new", "nb:new/0")
        _ledger_row(conn, "e4/c1/a1/p1", t0, "accepted", "na")          # never delivered: lost, na's
    decided = new_gtrid(NodeId("na"))
    _prepare_t2(fresh_db, decided, events)
    FencedDecisionLog(_FileLog("na"), db, "na", lambda: na).append(Commit(decided, (PG, SEND), None, 0.0),
                                                                     durable=True)
    sent: list[str] = []
    resent_at = time.time()

    def resend(gtrid: str, p: Participant) -> None:
        sent.append(gtrid)

    def record(conn: Any, gtrids: list[str]) -> None:
        assert conn.execute("SELECT count(*) FROM nsjms_outbox WHERE gtrid = ANY(%s)", (gtrids,)).fetchone() == (2,)
        assert record_resends(conn, "nb", dict.fromkeys(gtrids, resent_at)) == 2

    pg = PgManager(lambda: psycopg.connect(fresh_db, autocommit=True))
    try:
        _fence(db, "na", "nb", nb)
        report = recover_fenced(db, "na", "nb", nb, pg, resend, "stomp-send", record=record)
        again = recover_fenced(db, "na", "nb", nb, pg, resend, "stomp-send", record=record)
    finally:
        pg.close()
    assert report.committed == [decided] and sent == [decided] and report.errors == []
    assert again.committed == again.resent == [], "finished: a second pass records nothing"
    with psycopg.connect(fresh_db) as conn:
        rows = conn.execute(f"SELECT dedupe_id, node_id, gtrid, jms_message_id, broker_committed_at, acknowledged_at "
                            f"FROM {TABLE} WHERE gtrid = %s ORDER BY dedupe_id, entry_id", (decided,)).fetchall()
        assert conn.execute("SELECT count(*) FROM nsjms_outbox").fetchone() == (0,)
    assert [(r[0], r[1], r[3]) for r in rows] == [
        (events[0][0], "na", dedupe_id(decided, 0)), (events[0][0], "nb", dedupe_id(decided, 0)),
        (events[1][0], "na", dedupe_id(decided, 1)), (events[1][0], "nb", dedupe_id(decided, 1))]
    survivor = [r for r in rows if r[1] == "nb"]
    assert all(r[4] == datetime.fromtimestamp(resent_at, UTC) and r[5] is None for r in survivor)

    result = run_incremental(fresh_db, as_of=datetime.now(UTC), grace=GRACE)
    counts = {s: result.count(s) for s in ("delivered", "resent", "duplicated", "lost")}
    assert counts == {"delivered": 0, "resent": 2, "duplicated": 1, "lost": 1}
    groups = {(g.node, g.status): g for d in result.days for g in d.groups}
    assert set(groups[("na", "resent")].ids) == {e for e, _ in events} and groups[("na", "resent")].multi_node == 2
    assert groups[("na", "duplicated")].ids == ("e3/c1/a1/p1",) and groups[("na", "lost")].ids == ("e4/c1/a1/p1",)
    assert "re-sent at a takeover (allowed) 2" in render(result)
    metrics = metrics_text(result)
    assert 'nsjms_audit_resent_obligations{direction="channel_to_jms",bridge="7",node="na"} 2' in metrics
    assert 'nsjms_audit_duplicated_obligations{direction="channel_to_jms",bridge="7",node="na"} 1' in metrics
    assert 'nsjms_audit_delivered_obligations{direction="channel_to_jms",bridge="7",node="na"} 3' in metrics
    assert [d.verdict for d in result.days] == ["fail"], "the duplicate and the loss fail the day, not the re-sends"


def test_only_re_sends_make_a_passing_day(fresh_db: str) -> None:
    with psycopg.connect(fresh_db) as conn:
        install_schema(conn)
        t0 = datetime(2026, 3, 1, 10, tzinfo=UTC)
        ensure_partitions(conn, t0.date(), 1)
        _ledger_row(conn, "e1", t0, "accepted", "na")
        _ledger_row(conn, "e1", t0, "delivered", "na", "na:1", "na:1/0")
        _ledger_row(conn, "e1", t0, "delivered", "nb", "na:1", "na:1/0")
    result = run_incremental(fresh_db, as_of=t0 + timedelta(days=1), grace=GRACE)
    assert [(d.verdict, d.count("resent"), d.count("duplicated")) for d in result.days] == [("pass", 1, 0)]


def test_incremental_audit_of_a_synthetic_takeover_ledger_finds_exactly_what_was_injected(fresh_db: str) -> None:
    spec = SynthSpec(deliveries=2000, seed=7, rate_per_s=0.05, nodes=2, lost=4, duplicates=3, in_doubt=2,
                     dead_letters=2, resent=5, cross_node_duplicates=3)       # about 11 hours of one day
    table, truth = generate(spec)
    with psycopg.connect(fresh_db) as conn:
        install_schema(conn)
        ensure_partitions(conn, spec.start.date(), 2)
        copy_to_postgres(table, conn)
    result = run_incremental(fresh_db, as_of=datetime(2027, 1, 1, tzinfo=UTC), grace=GRACE)
    ids = {s: {i for d in result.days for g in d.groups if g.status == s for i in g.ids}
           for s in ("lost", "duplicated", "resent")}
    assert ids == {"lost": truth.lost, "duplicated": truth.duplicated, "resent": truth.resent}
    assert result.count("in_doubt") == 2 and result.count("dead_letter") == 2
    assert len(ids["duplicated"]) == 3 + 3
    assert SURVIVOR not in {g.node for d in result.days for g in d.groups}, \
        "attributed to the node that accepted them, not to the survivor that wrote the extra delivery"


def test_a_failing_record_is_logged_and_never_blocks_the_clean_up(db: Database, fresh_db: str) -> None:
    """The ledger insert runs in a savepoint: a failure leaves the re-send rows out (logged) but the decision and
    outbox rows are still deleted, so the next pass does not re-send (and duplicate) the messages again."""
    na = _join(db, "na", SHORT)
    nb = _join(db, "nb")
    decided = new_gtrid(NodeId("na"))
    _prepare_t2(fresh_db, decided, [("e1/c1/a1/p1", T0)])
    FencedDecisionLog(_FileLog("na"), db, "na", lambda: na).append(Commit(decided, (PG, SEND), None, 0.0),
                                                                     durable=True)
    sent: list[str] = []

    def record(conn: Any, gtrids: list[str]) -> None:
        conn.execute("SELECT no_such_column FROM nsjms_ledger")

    pg = PgManager(lambda: psycopg.connect(fresh_db, autocommit=True))
    try:
        _fence(db, "na", "nb", nb)
        report = recover_fenced(db, "na", "nb", nb, pg, lambda g, p: sent.append(g), "stomp-send", record=record)
        again = recover_fenced(db, "na", "nb", nb, pg, lambda g, p: sent.append(g), "stomp-send", record=record)
    finally:
        pg.close()
    assert report.errors == [] and sent == [decided] and again.resent == [], "re-sent once, cleaned up"
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT (SELECT count(*) FROM nsjms_outbox), (SELECT count(*) FROM nsjms_decision), "
                            f"(SELECT count(*) FROM {TABLE} WHERE node_id = 'nb')").fetchone() == (0, 0, 0)


def test_the_incremental_rule_is_the_spark_rule_on_every_look_alike(fresh_db: str) -> None:
    """The same hand-built cases as tests/unit/test_audit_takeover.py: only the takeover's re-send is ``resent``."""
    cases: dict[str, tuple[str, list[tuple[str | None, str, str]]]] = {
        "resent": ("channel_to_jms", [("a", "a:1", "a:1/0"), ("b", "a:1", "a:1/0")]),
        "same-node": ("channel_to_jms", [("a", "a:2", "a:2/0"), ("a", "a:2", "a:2/0")]),
        "two-txns": ("channel_to_jms", [("a", "a:3", "a:3/0"), ("b", "b:4", "b:4/0")]),
        "two-msgs": ("channel_to_jms", [("a", "a:5", "a:5/0"), ("b", "a:5", "a:5/1")]),
        "thrice": ("channel_to_jms", [("a", "a:6", "a:6/0"), ("b", "a:6", "a:6/0"), ("c", "a:6", "a:6/0")]),
        "no-node": ("channel_to_jms", [("a", "a:7", "a:7/0"), (None, "a:7", "a:7/0")]),
        "plain-gtrid": ("channel_to_jms", [("a", "g8", "g8/0"), ("b", "g8", "g8/0")]),
        "inbound": ("jms_to_channel", [("a", "a:9", "m9"), ("b", "a:9", "m9")]),
    }
    with psycopg.connect(fresh_db) as conn:
        install_schema(conn)
        ensure_partitions(conn, T0.date(), 1)
        for dedupe, (direction, writers) in cases.items():
            for node, gtrid, message in [("a", None, None), *writers]:
                conn.execute(f"INSERT INTO {TABLE} (dedupe_id, channel_id, bridge_id, direction, gtrid, "
                             "jms_message_id, accepted_at, outcome, node_id) VALUES (%s, 1, 7, %s, %s, %s, %s, %s, %s)",
                             (dedupe, direction, gtrid, message, T0, "accepted" if gtrid is None else "delivered",
                              node))
    result = run_incremental(fresh_db, as_of=T0 + timedelta(days=1), grace=GRACE)
    status = {i: g.status for d in result.days for g in d.groups for i in g.ids}
    assert status == {k: "resent" if k == "resent" else "duplicated" for k in cases}
