"""A rolling restart of three nodes by plain restarts, no drain (docs/cluster.md, "Rolling restart").

Three ``nsjms serve`` nodes on one PostgreSQL and one broker. Node ``na`` creates channel C1 with a channel -> JMS
queue bridge in T2 (a standard-stub push supplier pushes persistent events all along, counted at a stomp.py
consumer) and T2 channel C2 with a JMS -> channel queue bridge in T2 (a stomp.py producer sends all along, counted
at a standard-stub push consumer of C2). Each node in turn is stopped with SIGTERM (a clean stop: the routing
transactions in flight end, the node leaves) and started again at once; the survivors take its channels over
without waiting for a lease (it left), spread over them least loaded first (the restarted node, owning nothing, is
the least loaded when the next one stops). Counted at the clients: every event and every message arrives (0 lost);
channel -> JMS a duplicate only with its original's dedupe id; no prepared transaction left. The test prints how
long each restart took and where the work ran.
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
    numbers,
    ownership,
    rows,
    start_node,
    t2_persistent_channel,
)
from conftest import ClientOrb
from stdclients import wait_until

pytestmark = pytest.mark.integration

PER_T2 = 5
STEP = 15          # both flows move this many more before each restart and at the end


def test_a_rolling_restart_of_three_nodes_by_plain_restarts_loses_nothing(
        tmp_path: Path, fresh_db: str, broker_url: str, client_orb: ClientOrb,
        monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = [start_node(tmp_path, n, fresh_db, broker_url, monkeypatch) for n in ("na", "nb", "nc")]
    host, port = broker_url.removeprefix("stomp://").split(":")
    counter = StompCounter()
    listen = stomp.Connection([(host, int(port))], auto_content_length=False)
    listen.set_listener("counter", counter)
    listen.connect(wait=True)
    supplier: Supplier | None = None
    producer: StompProducer | None = None
    try:
        q_out, q_in = unique_name("cluster.plainroll.out"), unique_name("cluster.plainroll.in")
        listen.subscribe(f"/queue/{q_out}", id="counter", ack="auto")
        factory = client_orb.factory(nodes[0].ior())
        bf = bridge_factory(client_orb, nodes[0])
        c1, cid1 = persistent_channel(factory)
        out_bridge, _ = bf.create_bridge(channel_ep(BA.SOURCE, cid1), jms_ep(BA.SINK, q_out))
        managed_bridge(out_bridge).enable_transaction(PER_T2, 30)
        out_bridge.start_bridge()
        c2, cid2 = t2_persistent_channel(factory, PER_T2)
        consumer = structured_consumer(c2)               # its reference is stored: each new owner calls it back
        in_bridge, bid2 = bf.create_bridge(jms_ep(BA.SOURCE, q_in), channel_ep(BA.SINK, cid2, BA.PULL))
        in_bridge.start_bridge()
        supplier = Supplier(client_orb, nodes, c1, cid1, follow_after_maybe=True)   # the list: restarted nodes
        producer = StompProducer(broker_url, q_in)                                  # replace theirs
        supplier.thread.start()
        producer.thread.start()

        def flowing() -> bool:
            pushed, sent = supplier.pushed, producer.sent
            with counter.lock:
                out_at = len(counter.got)
            in_at = consumer.count()
            return wait_until(lambda: supplier.pushed >= pushed + STEP and producer.sent >= sent + STEP
                              and len(counter.got) >= out_at + STEP and consumer.count() >= in_at + STEP, 90)

        log: list[str] = []
        for k in range(3):
            name = nodes[k].state_dir.name
            assert flowing(), f"both flows move before {name} restarts"
            owned = sorted(str(kind) + str(i) for (kind, i), n in ownership(fresh_db).items() if n == name)
            began = time.monotonic()
            assert nodes[k].stop() == 0, f"{name} stops cleanly on SIGTERM"
            stopped = time.monotonic() - began
            assert wait_until(lambda n=name: n not in ownership(fresh_db).values(), 60), ownership(fresh_db)
            moved = time.monotonic() - began
            nodes[k] = start_node(tmp_path, name, fresh_db, broker_url, monkeypatch)
            log.append(f"{name}: owned {owned}; stopped in {stopped:.1f} s, its work claimed {moved:.1f} s, running "
                       f"again {time.monotonic() - began:.1f} s after the SIGTERM; owners now "
                       f"{sorted(ownership(fresh_db).items())}")
        assert flowing(), "both flows move after the last restart"
        supplier.pause()
        producer.stop.set()
        producer.thread.join(30)
        dup, n_in = check_once(counter, supplier.pushed, consumer, producer.sent, supplier.maybe,
                               consumer_duplicates=True)
        got = numbers(consumer.snapshot())
        twice = sorted({n for n in got if got.count(n) > 1})
        assert wait_until(lambda: prepared_count(fresh_db) == 0, 30), "no prepared transaction left"
        per_in = {str(n): int(c) for n, c in rows(
            fresh_db, "SELECT split_part(gtrid, ':', 1), count(*) FROM nsjms_inbox WHERE bridge_id = %s GROUP BY 1",
            bid2)}
        per_out: dict[str, int] = {}
        with counter.lock:
            for _, d in counter.got:
                per_out[d.split(":", 1)[0]] = per_out.get(d.split(":", 1)[0], 0) + 1
        print("\nrolling restart by plain restarts (SIGTERM, start):\n  " + "\n  ".join(log) +
              f"\nchannel -> JMS: {supplier.pushed} pushed ({len(supplier.maybe)} COMPLETED_MAYBE), {dup} "
              f"duplicate(s); per node (sending transaction) {per_out}"
              f"\nJMS -> channel: {producer.sent} messages, {n_in} events at the consumer, twice {twice}; per node "
              f"(inbox rows) {per_in}; pushes refused while moving: {len(supplier.refused)}")
        assert dup == 0, "a clean stop leaves no decided transaction to send again"
        assert twice == [], "a clean stop leaves no delivered event to deliver again"
        assert node_status(nodes[0]).get("cluster", {}).get("epoch") == 3, "left, fenced by its takeover, rejoined"
    finally:
        for worker in (supplier, producer):
            if worker is not None:
                worker.stop.set()
        listen.disconnect()
        for node in nodes:
            node.stop()
