"""Drain-and-handoff with real nodes (docs/cluster.md, "Placement and operations"): ``nsjms cluster drain`` of a
node under routing-transaction traffic both ways, then ``nsjms cluster rebalance`` giving a rejoined node its share.

Two ``nsjms serve`` nodes on one PostgreSQL and one broker. Node ``na`` owns channel C1 with a channel -> JMS queue
bridge in T2 (5 events per transaction; a standard-stub push supplier pushes persistent events into C1 all along,
counted at a stomp.py consumer of the queue) and T2 channel C2 with a JMS -> channel queue bridge in T2 (the channel
pulls from the bridge; a stomp.py producer sends all along; a standard-stub push consumer of C2 counts). While both
flows run, ``nsjms cluster drain na`` hands C1 and C2 (with their bridges) to ``nb``: ``na`` finishes the T2s in
flight, stops them, moves their ownership in one fenced transaction, ``nb`` loads and resumes them. The drain
reports ``clean`` (exit 0); the supplier, refused by ``na`` once C1 left, gets its proxy from ``nb`` by the same ids
(where ``na`` forwards requests for objects other nodes run, its ORB follows the forward instead; docs/cluster.md)
and pushes on. Counted at the clients: every event and every message exactly once (channel -> JMS: a duplicate only
with its original's dedupe id); no prepared transaction left.
Then ``na`` restarts (a new incarnation, no longer drained) and ``nsjms cluster rebalance`` moves one channel back to
it; a last round of traffic both ways is counted the same way."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import stomp

from idl.generated import CosBridgeAdmin as BA

from bridgekit import (
    bridge_factory,
    channel_ep,
    jms_ep,
    managed_bridge,
    node_status,
    persistent_channel,
    prepared_count,
    structured_consumer,
    unique_name,
)
from clusterkit import (
    PERSISTENT,
    RENEW_S,
    StompCounter,
    StompProducer,
    Supplier,
    check_once,
    cli,
    numbers,
    ownership,
    start_node,
    t2_persistent_channel,
)
from conftest import ClientOrb
from stdclients import (
    Form,
    PushSupplierClient,
    Style,
    make_event,
    obtain_proxy_consumer,
    wait_until,
)

pytestmark = pytest.mark.integration

PER_T2 = 5


def test_drain_hands_a_nodes_channels_over_under_t2_traffic_and_rebalance_gives_a_rejoined_node_its_share(
        tmp_path: Path, fresh_db: str, broker_url: str, client_orb: ClientOrb,
        monkeypatch: pytest.MonkeyPatch) -> None:
    a = start_node(tmp_path, "na", fresh_db, broker_url, monkeypatch)
    b = start_node(tmp_path, "nb", fresh_db, broker_url, monkeypatch)
    host, port = broker_url.removeprefix("stomp://").split(":")
    counter = StompCounter()
    listen = stomp.Connection([(host, int(port))], auto_content_length=False)
    listen.set_listener("counter", counter)
    listen.connect(wait=True)
    supplier: Supplier | None = None
    producer: StompProducer | None = None
    try:
        q_out, q_in = unique_name("cluster.drain.out"), unique_name("cluster.drain.in")
        listen.subscribe(f"/queue/{q_out}", id="counter", ack="auto")
        factory = client_orb.factory(a.ior())
        bf = bridge_factory(client_orb, a)
        c1, cid1 = persistent_channel(factory)
        out_bridge, bid1 = bf.create_bridge(channel_ep(BA.SOURCE, cid1), jms_ep(BA.SINK, q_out))
        managed_bridge(out_bridge).enable_transaction(PER_T2, 30)
        out_bridge.start_bridge()
        c2, cid2 = t2_persistent_channel(factory, PER_T2)
        consumer = structured_consumer(c2)               # its reference is stored: the new owner calls it back
        in_bridge, bid2 = bf.create_bridge(jms_ep(BA.SOURCE, q_in), channel_ep(BA.SINK, cid2, BA.PULL))
        in_bridge.start_bridge()
        assert set(ownership(fresh_db).values()) == {"na"}

        supplier = Supplier(client_orb, [a, b], c1, cid1)
        producer = StompProducer(broker_url, q_in)
        supplier.thread.start()
        producer.thread.start()
        assert wait_until(lambda: len(counter.names()) >= 40 and consumer.count() >= 40, 60), \
            (len(counter.names()), consumer.count())    # both flows run through na, in T2
        began = time.monotonic()
        out = cli(fresh_db, a.state_dir, "drain", "na")
        took = time.monotonic() - began
        assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout}\n{out.stderr[-3000:]}"
        report = json.loads(out.stdout)
        assert report["result"] == "clean" and report["live"], report
        assert sorted((m["channel"], m["to"], m["state"]) for m in report["moves"]) == \
            [(cid1, "nb", "started"), (cid2, "nb", "started")], report["moves"]
        assert report["in_doubt"] == [] and report["prepared"] == [] and report["decided"] == []
        print(f"\ndrain: {took:.1f} s for the command; hand-offs (request -> running on nb): "
              f"{[m['handoff_s'] for m in report['moves']]} s, stop on na: {[m['stop_s'] for m in report['moves']]}"
              f" s (renewal period {RENEW_S} s)")
        assert ownership(fresh_db) == {("channel", cid1): "nb", ("bridge", bid1): "nb", ("channel", cid2): "nb",
                                     ("bridge", bid2): "nb"}
        status = cli(fresh_db, b.state_dir, "status")
        members = {m["node_id"]: m for m in json.loads(status.stdout)["members"]}
        assert (members["na"]["draining"], members["na"]["state"], members["na"]["owns"]) == \
            (True, "live", {"channels": [], "bridges": []}), "drained: live, owning nothing, safe to remove"
        mark_out, mark_in = supplier.pushed, producer.sent
        assert wait_until(lambda: supplier.pushed >= mark_out + 30 and consumer.count() >= mark_in + 30, 90), \
            "both flows run on through nb"
        supplier.stop.set()
        producer.stop.set()
        supplier.thread.join(90)
        producer.thread.join(30)
        dup, n_in = check_once(counter, supplier.pushed, consumer, producer.sent)
        assert supplier.maybe == [], "a hand-off refuses a push before storing anything (COMPLETED_NO)"
        print(f"channel -> JMS: {supplier.pushed} events pushed, {len(counter.got)} messages ({dup} duplicate(s)); "
              f"JMS -> channel: {producer.sent} messages, {n_in} events; pushes refused while moving: "
              f"{len(supplier.refused)}")
        assert wait_until(lambda: prepared_count(fresh_db) == 0, 30), "no prepared transaction left"
        assert node_status(a).get("channels") == [] or wait_until(lambda: node_status(a).get("channels") == [], 10)

        # na restarts (a new incarnation: no longer drained); rebalance gives it one of the two channels back
        a.stop()
        a = start_node(tmp_path, "na", fresh_db, broker_url, monkeypatch)
        supplier.nodes = [a, b]
        out = cli(fresh_db, b.state_dir, "rebalance")
        assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout}\n{out.stderr[-3000:]}"
        moves = json.loads(out.stdout)["moves"]
        assert [(m["from"], m["to"], m["state"]) for m in moves] == [("nb", "na", "started")], moves
        owners = ownership(fresh_db)
        assert sorted(owners.values()) == ["na", "na", "nb", "nb"], owners
        moved = moves[0]["channel"]
        print(f"rebalance: channel {moved} back to na in {moves[0]['handoff_s']} s")
        again = cli(fresh_db, b.state_dir, "rebalance")
        assert again.returncode == 0 and json.loads(again.stdout)["moves"] == [], "even: sticky, nothing moves"

        supplier.stop.clear()
        producer.stop.clear()
        for i in range(supplier.pushed, supplier.pushed + 20):
            supplier.push(i)
        for i in range(producer.sent, producer.sent + 20):
            producer.send(i)
        check_once(counter, supplier.pushed, consumer, producer.sent)
        assert wait_until(lambda: prepared_count(fresh_db) == 0, 30)
    finally:
        for worker in (supplier, producer):
            if worker is not None:
                worker.stop.set()
        listen.disconnect()
        a.stop()
        b.stop()


def test_least_loaded_placement_hands_a_new_channel_to_the_member_owning_fewer_objects(
        tmp_path: Path, fresh_db: str, broker_url: str, client_orb: ClientOrb,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``cluster.placement = "least-loaded"``: the creating node keeps a channel while it is the least loaded; the
    next goes to the other member right after its creation (a hand-off), which then runs it."""
    monkeypatch.setenv("NSJMS_CLUSTER_PLACEMENT", "least-loaded")
    a = start_node(tmp_path, "na", fresh_db, broker_url, monkeypatch)
    b = start_node(tmp_path, "nb", fresh_db, broker_url, monkeypatch)
    try:
        factory = client_orb.factory(a.ior())
        _, cid1 = persistent_channel(factory)
        _, cid2 = persistent_channel(factory)                       # na owns 1, nb 0: this one goes to nb
        assert wait_until(lambda: cid2 in [c["id"] for c in node_status(b).get("channels", [])], 30), \
            node_status(b).get("channels")
        assert ownership(fresh_db) == {("channel", cid1): "na", ("channel", cid2): "nb"}
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            assert conn.execute("SELECT channel_id, from_node, to_node, reason, state FROM nsjms_handoff").fetchall() \
                == [(cid2, "na", "nb", "placement", "started")]
        channel = client_orb.factory(b.ior()).get_event_channel(cid2)   # nb runs it: routed there
        consumer = structured_consumer(channel)
        proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
        supplier = PushSupplierClient(proxy, Form.STRUCTURED)
        supplier.connect()
        for i in range(5):
            supplier.push_one(make_event(i, reliability=PERSISTENT))
        assert consumer.wait_for(5, 30) and sorted(numbers(consumer.snapshot())) == list(range(5))
        refused = cli(fresh_db, a.state_dir, "drain", "nobody")
        assert refused.returncode == 4 and "not a member" in refused.stderr, (refused.returncode, refused.stderr)
    finally:
        a.stop()
        b.stop()


def _flowing(supplier: Supplier, producer: StompProducer, consumer: Any) -> bool:
    """Both flows move 20 more: pushes accepted, events at the consumer."""
    pushed, sent = supplier.pushed, producer.sent
    return wait_until(lambda: supplier.pushed >= pushed + 20 and consumer.count() >= sent + 20, 90)


def test_a_rolling_restart_of_three_nodes_by_drain_and_rebalance_loses_nothing(
        tmp_path: Path, fresh_db: str, broker_url: str, client_orb: ClientOrb,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under T2 traffic both ways, each of three nodes in turn is drained (clean), stopped, started again and given
    its share back by a rebalance: every event and message arrives exactly once."""
    nodes = [start_node(tmp_path, n, fresh_db, broker_url, monkeypatch) for n in ("na", "nb", "nc")]
    host, port = broker_url.removeprefix("stomp://").split(":")
    counter = StompCounter()
    listen = stomp.Connection([(host, int(port))], auto_content_length=False)
    listen.set_listener("counter", counter)
    listen.connect(wait=True)
    supplier: Supplier | None = None
    producer: StompProducer | None = None
    try:
        q_out, q_in = unique_name("cluster.roll.out"), unique_name("cluster.roll.in")
        listen.subscribe(f"/queue/{q_out}", id="counter", ack="auto")
        factory = client_orb.factory(nodes[0].ior())
        bf = bridge_factory(client_orb, nodes[0])
        c1, cid1 = persistent_channel(factory)
        out_bridge, _ = bf.create_bridge(channel_ep(BA.SOURCE, cid1), jms_ep(BA.SINK, q_out))
        managed_bridge(out_bridge).enable_transaction(PER_T2, 30)
        out_bridge.start_bridge()
        c2, cid2 = t2_persistent_channel(factory, PER_T2)
        consumer = structured_consumer(c2)
        in_bridge, _ = bf.create_bridge(jms_ep(BA.SOURCE, q_in), channel_ep(BA.SINK, cid2, BA.PULL))
        in_bridge.start_bridge()
        supplier = Supplier(client_orb, nodes, c1, cid1)          # the same list: restarted nodes replace theirs
        producer = StompProducer(broker_url, q_in)
        supplier.thread.start()
        producer.thread.start()
        times = []
        for k, node in enumerate(list(nodes)):
            name = node.state_dir.name
            assert _flowing(supplier, producer, consumer), f"traffic flows before {name} restarts"
            began = time.monotonic()
            out = cli(fresh_db, nodes[(k + 1) % 3].state_dir, "drain", name)
            assert out.returncode == 0 and json.loads(out.stdout)["result"] == "clean", out.stdout + out.stderr[-2000:]
            node.stop()
            nodes[k] = start_node(tmp_path, name, fresh_db, broker_url, monkeypatch)
            out = cli(fresh_db, nodes[k].state_dir, "rebalance")
            assert out.returncode == 0, out.stdout + out.stderr[-2000:]
            times.append(round(time.monotonic() - began, 1))
        owners = ownership(fresh_db)
        print(f"\nrolling restart: drain + restart + rebalance per node {times} s; owners at the end {owners}")
        assert _flowing(supplier, producer, consumer)
        supplier.stop.set()
        producer.stop.set()
        supplier.thread.join(90)
        producer.thread.join(30)
        assert supplier.maybe == []
        dup, n_in = check_once(counter, supplier.pushed, consumer, producer.sent)
        print(f"channel -> JMS: {supplier.pushed} events, {dup} duplicate(s); JMS -> channel: {producer.sent} "
              f"messages, {n_in} events; pushes refused while moving: {len(supplier.refused)}")
        assert wait_until(lambda: prepared_count(fresh_db) == 0, 30)
    finally:
        for worker in (supplier, producer):
            if worker is not None:
                worker.stop.set()
        listen.disconnect()
        for node in nodes:
            node.stop()
