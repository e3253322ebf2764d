"""The router writes the delivery ledger in the transactions that move the events (docs/audit.md,
router/routing/ledger.py).

Real node, PostgreSQL, ActiveMQ (STOMP for the node, OpenWire for the Java client) and CORBA over IIOP:

* persistent events pushed into a channel get an ``accepted`` row per consumer when stored and a ``delivered`` row
  when their queue row is removed, with the same ``accepted_at``;
* a channel → JMS bridge's obligations carry the bridge id and destination; a JMS → channel bridge's carry the
  JMS message id too; every row names the node that wrote it (``node_id``); ``nsjms audit`` over that ledger
  reports no loss and no duplicate and exits 0;
* a ledger insert that fails fails the push: neither the event nor any ledger row is left behind.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from omniORB import CORBA

from idl.generated import CosBridgeAdmin as BA

from bridgekit import (
    JavaTool,
    audit_ledger,
    bridge_factory,
    by_dedupe_id,
    channel_ep,
    jms_ep,
    ledger_count,
    ledger_rows,
    persistent_channel,
)
from conftest import NsjmsServer
from stdclients import (
    Form,
    PushSupplierClient,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    make_event,
    obtain_proxy_consumer,
    obtain_proxy_supplier,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

N = 40
FLOW_TIMEOUT_S = 30.0


def _consumer(channel: Any) -> tuple[StructuredPushConsumer, int]:
    proxy, pid = obtain_proxy_supplier(channel.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
    consumer = StructuredPushConsumer()
    connect_push_consumer(proxy, Form.STRUCTURED, consumer)
    return consumer, int(pid)


def _supplier(channel: Any) -> PushSupplierClient:
    proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.SEQUENCE, Style.PUSH)
    client = PushSupplierClient(proxy, Form.SEQUENCE, batch_size=10)
    client.connect()
    return client


def _accepted_then_delivered(obl: list[dict[str, Any]]) -> None:
    assert [r["outcome"] for r in obl] == ["accepted", "delivered"], obl
    assert obl[0]["accepted_at"] == obl[1]["accepted_at"]
    assert obl[1]["acknowledged_at"] is not None and obl[1]["acknowledged_at"] >= obl[1]["accepted_at"]


def test_persistent_channel_traffic_is_in_the_ledger(nsjms_server: NsjmsServer, factory: Any) -> None:
    channel, cid = persistent_channel(factory)
    consumer, pid = _consumer(channel)
    _supplier(channel).push_all([make_event(i) for i in range(N)])
    assert consumer.wait_for(N, FLOW_TIMEOUT_S), f"{consumer.count()} of {N} arrived"
    dsn = nsjms_server.pg_dsn
    assert wait_until(lambda: ledger_count(dsn, "outcome = 'delivered'") == N, FLOW_TIMEOUT_S)
    obligations = by_dedupe_id(ledger_rows(dsn))
    assert len(obligations) == N
    for dedupe, obl in obligations.items():
        _accepted_then_delivered(obl)
        r = obl[0]
        assert (r["channel_id"], r["proxy_id"], r["direction"], r["bridge_id"]) == (cid, pid, "channel_to_consumer",
                                                                                   None)
        assert dedupe == f"e{r['event_id']}/c{cid}/a0/p{pid}"
        assert {x["node_id"] for x in obl} == {"node1"}    # the node that wrote them (the default node.node_id)
    with psycopg.connect(dsn) as conn:    # the partitions of today exist: the node made them at start
        assert conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                            (f"nsjms_ledger_p{datetime.now(UTC):%Y%m%d}",)).fetchone() == (True,)


def test_bridge_traffic_both_ways_is_in_the_ledger_and_the_audit_finds_nothing_wrong(
        nsjms_server: NsjmsServer, factory: Any, client_orb: Any, java_tool: JavaTool, tmp_path: Path) -> None:
    bf = bridge_factory(client_orb, nsjms_server)
    out_queue, in_queue = (f"ledger.{d}.{uuid.uuid4().hex[:8]}" for d in ("out", "in"))
    # channel → JMS
    out_channel, out_cid = persistent_channel(factory)
    out_bridge, out_bid = bf.create_bridge(channel_ep(BA.SOURCE, out_cid), jms_ep(BA.SINK, out_queue))
    out_bridge.start_bridge()
    _supplier(out_channel).push_all([make_event(i) for i in range(N)])
    got = java_tool.consume("queue", out_queue, N, FLOW_TIMEOUT_S)
    assert len(got) == N
    # JMS → channel (and on to a CORBA consumer of that channel)
    in_channel, in_cid = persistent_channel(factory)
    consumer, _ = _consumer(in_channel)
    in_bridge, in_bid = bf.create_bridge(jms_ep(BA.SOURCE, in_queue), channel_ep(BA.SINK, in_cid))
    in_bridge.start_bridge()
    java_tool.produce("queue", in_queue, N, "text")
    assert consumer.wait_for(N, FLOW_TIMEOUT_S), f"{consumer.count()} of {N} arrived"

    dsn = nsjms_server.pg_dsn
    assert wait_until(lambda: ledger_count(dsn, "outcome = 'delivered'") == 3 * N, FLOW_TIMEOUT_S), \
        ledger_count(dsn, "outcome = 'delivered'")
    to_jms = by_dedupe_id(ledger_rows(dsn, "direction = 'channel_to_jms'"))
    assert len(to_jms) == N
    for obl in to_jms.values():
        _accepted_then_delivered(obl)
        assert {(r["channel_id"], r["bridge_id"], r["destination"]) for r in obl} == {
            (out_cid, int(out_bid), f"queue/{out_queue}")}
    from_jms = by_dedupe_id(ledger_rows(dsn, "direction = 'jms_to_channel'"))
    assert len(from_jms) == N
    for dedupe, obl in from_jms.items():
        _accepted_then_delivered(obl)
        r = obl[0]
        assert (r["channel_id"], r["bridge_id"], r["destination"]) == (in_cid, int(in_bid), f"queue/{in_queue}")
        assert r["jms_message_id"].startswith("ID:") and dedupe == f"j{in_bid}/{r['jms_message_id']}"
        assert obl[1]["jms_message_id"] == r["jms_message_id"] and r["event_id"] is not None
    onward = by_dedupe_id(ledger_rows(dsn, "direction = 'channel_to_consumer'"))
    assert len(onward) == N and {o[0]["channel_id"] for o in onward.values()} == {in_cid}
    assert {o[0]["event_id"] for o in onward.values()} == {o[0]["event_id"] for o in from_jms.values()}
    # every row, of both directions and of the event's own obligations, names the node that wrote it
    assert {r["node_id"] for r in ledger_rows(dsn)} == {"node1"}

    summary = audit_ledger(dsn, tmp_path / "audit")
    assert summary["lost"] == 0 and summary["duplicated"] == 0, summary
    assert summary["by_status"] == {"delivered": 3 * N}, summary


def test_a_failing_ledger_insert_fails_the_push_and_leaves_nothing(nsjms_server: NsjmsServer, factory: Any) -> None:
    channel, _ = persistent_channel(factory)
    consumer, _ = _consumer(channel)
    supplier = _supplier(channel)
    dsn = nsjms_server.pg_dsn
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("CREATE FUNCTION ledger_refuses() RETURNS trigger LANGUAGE plpgsql AS "
                      "$$ BEGIN RAISE EXCEPTION 'injected: the ledger refuses'; END $$")
        admin.execute("CREATE TRIGGER ledger_refuses BEFORE INSERT ON nsjms_ledger FOR EACH ROW "
                      "EXECUTE FUNCTION ledger_refuses()")
    with pytest.raises(CORBA.SystemException) as refused:
        supplier.push_one(make_event(1))
    assert refused.value.completed == CORBA.COMPLETED_NO
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM nsjms_event").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM nsjms_ledger").fetchone() == (0,)
    assert consumer.count() == 0
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DROP TRIGGER ledger_refuses ON nsjms_ledger")
    supplier.push_one(make_event(2))                     # the supplier retries: now it is stored and delivered
    assert consumer.wait_for(1, FLOW_TIMEOUT_S)
    assert wait_until(lambda: ledger_count(dsn, "outcome = 'delivered'") == 1, FLOW_TIMEOUT_S)


def test_events_left_by_a_destroyed_proxy_are_discarded_in_the_ledger(nsjms_server: NsjmsServer,
                                                                       factory: Any) -> None:
    channel, _ = persistent_channel(factory)
    proxy, pid = obtain_proxy_supplier(channel.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
    consumer = StructuredPushConsumer()
    connect_push_consumer(proxy, Form.STRUCTURED, consumer)
    proxy.suspend_connection()                           # the events stay queued for it
    _supplier(channel).push_all([make_event(i) for i in range(5)])
    dsn = nsjms_server.pg_dsn
    assert wait_until(lambda: ledger_count(dsn, "outcome = 'accepted'") == 5, FLOW_TIMEOUT_S)
    proxy.disconnect_structured_push_supplier()          # destroys the proxy and its queue
    assert wait_until(lambda: ledger_count(dsn, "outcome = 'discarded'") == 5, FLOW_TIMEOUT_S)
    rows = ledger_rows(dsn, "outcome = 'discarded'")
    assert {(r["proxy_id"], r["failure_reason"]) for r in rows} == {(int(pid), "its proxy supplier was destroyed")}
    for obl in by_dedupe_id(ledger_rows(dsn)).values():        # the same obligation: dedupe id and accepted_at
        assert [r["outcome"] for r in obl] == ["accepted", "discarded"]
        assert obl[0]["accepted_at"] == obl[1]["accepted_at"]
    assert consumer.count() == 0


def test_best_effort_events_are_in_the_ledger_only_when_configured(
        fresh_db: str, broker_url: str, client_orb: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import free_port

    for best_effort in (False, True):
        monkeypatch.setenv("NSJMS_LEDGER_BEST_EFFORT", str(best_effort).lower())
        state = tmp_path / f"state-{best_effort}"
        state.mkdir()
        server = NsjmsServer(state_dir=state, pg_dsn=fresh_db, broker_url=broker_url, port=free_port())
        server.start()
        try:
            channel, cid = client_orb.factory(server.ior()).create_channel([], [])   # BestEffort by default
            consumer, pid = _consumer(channel)
            _supplier(channel).push_all([make_event(i) for i in range(N)])
            assert consumer.wait_for(N, FLOW_TIMEOUT_S)
            if best_effort:
                assert wait_until(lambda: ledger_count(fresh_db, "outcome = 'delivered'") == N, FLOW_TIMEOUT_S)
                obligations = by_dedupe_id(ledger_rows(fresh_db))
                assert len(obligations) == N
                for dedupe, obl in obligations.items():
                    _accepted_then_delivered(obl)
                    assert dedupe.startswith("b") and dedupe.endswith(f"/c{cid}/a0/p{pid}")
                    assert obl[0]["event_id"] is None and obl[0]["direction"] == "channel_to_consumer"
            else:
                assert ledger_count(fresh_db, "true") == 0        # nothing written for BestEffort traffic
        finally:
            server.stop()


def test_events_queued_across_a_restart_keep_their_obligation_and_bridge(
        nsjms_server: NsjmsServer, factory: Any, client_orb: Any, java_tool: JavaTool) -> None:
    from bridgekit import reconnect_client

    bf = bridge_factory(client_orb, nsjms_server)
    queue = f"ledger.restart.{uuid.uuid4().hex[:8]}"
    channel, cid = persistent_channel(factory)
    bridge, bid = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, queue))
    bridge.start_bridge()
    bridge.stop_bridge()                                 # events stay queued for the bridge's proxy
    _supplier(channel).push_all([make_event(i) for i in range(10)])
    dsn = nsjms_server.pg_dsn
    assert wait_until(lambda: ledger_count(dsn, "outcome = 'accepted'") == 10, FLOW_TIMEOUT_S)
    nsjms_server.stop()
    nsjms_server.restart()                               # the bridge registers its proxy before the queues return
    reconnect_client(bridge)
    bridge.start_bridge()
    assert len(java_tool.consume("queue", queue, 10, FLOW_TIMEOUT_S)) == 10
    assert wait_until(lambda: ledger_count(dsn, "outcome = 'delivered'") == 10, FLOW_TIMEOUT_S)
    obligations = by_dedupe_id(ledger_rows(dsn))
    assert len(obligations) == 10
    for obl in obligations.values():
        _accepted_then_delivered(obl)
        assert {(r["direction"], r["bridge_id"], r["destination"]) for r in obl} == {
            ("channel_to_jms", int(bid), f"queue/{queue}")}


def test_journal_replay_records_a_bridge_proxys_deliveries_with_its_route_and_delivery_time(
        nsjms_server: NsjmsServer, factory: Any, client_orb: Any, java_tool: JavaTool) -> None:
    """The delivered-events journal replay at start (router/channel/delivered.py) runs inside the channel restore:
    the bridges (and their ledger routes) must be restored first, so a replayed bridge delivery's ledger row carries
    the bridge and destination, and its acknowledged_at is the journaled delivery time, not the restart's."""
    import zlib

    from bridgekit import reconnect_client

    bf = bridge_factory(client_orb, nsjms_server)
    queue = f"ledger.replay.{uuid.uuid4().hex[:8]}"
    channel, cid = persistent_channel(factory)
    bridge, bid = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, queue))
    bridge.start_bridge()
    bridge.stop_bridge()                                 # events stay queued for the bridge's proxy
    _supplier(channel).push_all([make_event(i) for i in range(10)])
    dsn = nsjms_server.pg_dsn
    assert wait_until(lambda: ledger_count(dsn, "outcome = 'accepted'") == 10, FLOW_TIMEOUT_S)
    nsjms_server.stop()
    with psycopg.connect(dsn) as conn:
        queued = conn.execute("SELECT admin_id, proxy_id, event_id FROM nsjms_queue WHERE channel_id = %s "
                              "ORDER BY event_id", (cid,)).fetchall()
    assert len(queued) == 10
    aid, pid = queued[0][0], queued[0][1]
    delivered_ms = 1_700_000_000_123                     # a delivery time the restart cannot be confused with
    lines = b""
    for _, _, eid in queued[:3]:                         # as if delivered just before a crash
        text = b"%d %d" % (eid, delivered_ms)
        lines += b"%s %08x\n" % (text, zlib.crc32(text))
    journal_dir = nsjms_server.state_dir / "delivered"
    journal_dir.mkdir(mode=0o700, exist_ok=True)
    (journal_dir / f"{cid}-{aid}-{pid}.ids").write_bytes(lines)
    nsjms_server.restart()
    replayed = [r for r in ledger_rows(dsn, "outcome = 'delivered' AND event_id = ANY(%s)",
                                 ([eid for _, _, eid in queued[:3]],))]
    assert len(replayed) == 3
    for r in replayed:
        assert (r["direction"], r["bridge_id"], r["destination"]) == ("channel_to_jms", int(bid), f"queue/{queue}")
        assert r["acknowledged_at"] == datetime.fromtimestamp(delivered_ms / 1000, UTC)
    assert not list(journal_dir.glob("*.ids"))
    reconnect_client(bridge)
    bridge.start_bridge()
    assert len(java_tool.consume("queue", queue, 7, FLOW_TIMEOUT_S)) == 7
    assert wait_until(lambda: ledger_count(dsn, "outcome = 'delivered'") == 10, FLOW_TIMEOUT_S)
