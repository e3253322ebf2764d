"""A joining node takes its share with ``cluster.rebalance_on_join`` on, under T2 traffic both ways (docs/cluster.md,
"A joining node gets its share" and "Loading is all or nothing").

Node ``na`` alone creates channel C1 with a channel -> JMS queue bridge in T2 (a standard-stub push supplier pushes
persistent events all along through ``na``'s references, counted at a stomp.py consumer) and T2 channel C2 with a
JMS -> channel queue bridge in T2 (a stomp.py producer sends all along, counted at a standard-stub push consumer
of C2). Then ``nb`` starts with ``rebalance_on_join``: at its first period it asks for its share, and one of the
two units (a channel with its bridge) moves to it by hand-off while the supplier keeps pushing through ``na``'s
references (forwarded to ``nb`` once the channel moved: the requests that met a channel being loaded, the cause of
the partial load this test guards against). Then ``na`` is restarted (SIGTERM: ``nb`` takes its work over; ``na``
joins again and asks for its share back). Counted at the clients: every event and every message exactly once, no
prepared transaction left, every ``join`` hand-off ``started`` (none ``failed``), and the node that joined routed
its share (events sent by its transactions, inbox rows of its transactions).
"""

from __future__ import annotations

import time
from pathlib import Path

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
    StompCounter,
    StompProducer,
    Supplier,
    check_once,
    ownership,
    rows,
    start_node,
    t2_persistent_channel,
)
from conftest import ClientOrb
from stdclients import wait_until

pytestmark = pytest.mark.integration

PER_T2 = 5
STEP = 15          # both flows move this many more at each check


def test_a_joining_node_takes_its_share_under_t2_traffic_and_nothing_is_lost(
        tmp_path: Path, fresh_db: str, broker_url: str, client_orb: ClientOrb,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSJMS_CLUSTER_REBALANCE_ON_JOIN", "true")
    nodes = [start_node(tmp_path, "na", fresh_db, broker_url, monkeypatch)]
    host, port = broker_url.removeprefix("stomp://").split(":")
    counter = StompCounter()
    listen = stomp.Connection([(host, int(port))], auto_content_length=False)
    listen.set_listener("counter", counter)
    listen.connect(wait=True)
    supplier: Supplier | None = None
    producer: StompProducer | None = None
    try:
        q_out, q_in = unique_name("cluster.join.out"), unique_name("cluster.join.in")
        listen.subscribe(f"/queue/{q_out}", id="counter", ack="auto")
        factory = client_orb.factory(nodes[0].ior())
        bf = bridge_factory(client_orb, nodes[0])
        c1, cid1 = persistent_channel(factory)
        out_bridge, bid1 = bf.create_bridge(channel_ep(BA.SOURCE, cid1), jms_ep(BA.SINK, q_out))
        managed_bridge(out_bridge).enable_transaction(PER_T2, 30)
        out_bridge.start_bridge()
        c2, cid2 = t2_persistent_channel(factory, PER_T2)
        consumer = structured_consumer(c2)               # its reference is stored: each new owner calls it back
        in_bridge, bid2 = bf.create_bridge(jms_ep(BA.SOURCE, q_in), channel_ep(BA.SINK, cid2, BA.PULL))
        in_bridge.start_bridge()
        supplier = Supplier(client_orb, nodes, c1, cid1, follow_after_maybe=True)   # through na's references
        producer = StompProducer(broker_url, q_in)
        supplier.thread.start()
        producer.thread.start()

        def flowing() -> bool:
            pushed, sent = supplier.pushed, producer.sent
            with counter.lock:
                out_at = len(counter.got)
            in_at = consumer.count()
            return wait_until(lambda: supplier.pushed >= pushed + STEP and producer.sent >= sent + STEP
                              and len(counter.got) >= out_at + STEP and consumer.count() >= in_at + STEP, 90)

        def channels_of(node: str) -> list[int]:
            return sorted(i for (kind, i), n in ownership(fresh_db).items() if kind == "channel" and n == node)

        assert flowing(), "both flows move on na alone"
        began = time.monotonic()
        nodes.append(start_node(tmp_path, "nb", fresh_db, broker_url, monkeypatch))
        assert wait_until(lambda: len(channels_of("nb")) == 1, 90), ownership(fresh_db)
        share_s = time.monotonic() - began
        moved = channels_of("nb")[0]
        moved_bridge = bid1 if moved == cid1 else bid2
        assert ownership(fresh_db)[("bridge", moved_bridge)] == "nb", "the bridge moved with its channel"
        assert flowing(), "both flows move after nb took its share"

        began = time.monotonic()
        assert nodes[0].stop() == 0, "na stops cleanly on SIGTERM"
        assert wait_until(lambda: channels_of("na") == [], 60), ownership(fresh_db)
        nodes[0] = start_node(tmp_path, "na", fresh_db, broker_url, monkeypatch)
        assert wait_until(lambda: len(channels_of("na")) == 1 and len(channels_of("nb")) == 1, 90), \
            ownership(fresh_db)
        back_s = time.monotonic() - began
        assert flowing(), "both flows move after na, restarted, took its share back"

        supplier.pause()
        producer.stop.set()
        producer.thread.join(30)
        dup, n_in = check_once(counter, supplier.pushed, consumer, producer.sent, supplier.maybe)
        assert dup == 0, "hand-offs and a clean stop leave no decided transaction to send again"
        assert wait_until(lambda: prepared_count(fresh_db) == 0, 30), "no prepared transaction left"
        moves = rows(fresh_db, "SELECT channel_id, from_node, to_node, reason, state, coalesce(error, '') "
                               "FROM nsjms_handoff ORDER BY id")
        joins = [m for m in moves if m[3] == "join"]
        assert len(joins) == 2 and all(m[4] == "started" for m in joins), moves
        per_in = {str(n): int(c) for n, c in rows(
            fresh_db, "SELECT split_part(gtrid, ':', 1), count(*) FROM nsjms_inbox WHERE bridge_id = %s GROUP BY 1",
            bid2)}
        per_out: dict[str, int] = {}
        with counter.lock:
            for _, d in counter.got:
                per_out[d.split(":", 1)[0]] = per_out.get(d.split(":", 1)[0], 0) + 1
        served_by_nb = per_out.get("nb", 0) if moved == cid1 else per_in.get("nb", 0)
        waits = {n.state_dir.name: node_status(n).get("cluster", {}).get("forwarding", {}) for n in nodes}
        load_failures = {n.state_dir.name: n.stderr_path.read_text(errors="replace").count("loading it failed")
                         for n in nodes}
        print(f"\njoin with rebalance_on_join: nb took channel {moved} {share_s:.1f} s after its start; na restarted "
              f"and had its share back {back_s:.1f} s after the SIGTERM; moves {moves}"
              f"\nchannel -> JMS: {supplier.pushed} pushed ({len(supplier.maybe)} COMPLETED_MAYBE), {dup} duplicate(s);"
              f" per node (sending transaction) {per_out}\nJMS -> channel: {producer.sent} messages, {n_in} events "
              f"at the consumer; per node (inbox rows) {per_in}; pushes refused while moving: {len(supplier.refused)}"
              f"\nforwarding {waits}; failed loads {load_failures}")
        assert served_by_nb > 0, "the node that joined routed its share"
    finally:
        for worker in (supplier, producer):
            if worker is not None:
                worker.stop.set()
        listen.disconnect()
        for node in nodes:
            node.stop()
