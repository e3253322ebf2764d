"""Three nodes on one PostgreSQL and one broker; the node owning the work is cut from PostgreSQL (its packets
dropped, no reset) for longer than its lease, under routing-transaction traffic both ways (docs/cluster.md).

PostgreSQL runs in a network namespace of its own with two veth links: nodes ``na`` and ``nb`` (and the test) reach
it over the first, node ``nc`` over the second. ``nc`` owns channel C1, whose channel -> JMS queue bridge runs in T2
(a standard-stub push supplier pushes persistent events, counted at a stomp.py consumer), and T2 channel C2, whose
JMS -> channel queue bridge runs in T2 (a stomp.py producer; a standard-stub push consumer of C2). Then the host end
of ``nc``'s link is set down: ``nc``'s lease runs out, a survivor fences it (PostgreSQL ends ``nc``'s sessions within
seconds: keepalives and tcp_user_timeout), finishes its routing transactions from PostgreSQL, loads C1, C2 and the
bridges and routes on; the supplier, refused by ``nc``, gets the same proxy from the survivor. The link comes back:
``nc`` learns it was fenced and stops (exit 1). Counted at the clients: every event pushed and accepted arrives
(channel -> JMS: duplicates only with their original's dedupe id); every JMS message is one event in C2 (one inbox
row each) and arrives at the consumer; no prepared transaction and no decision row of ``nc`` left. The takeover time
is printed (``-s``). Needs root (network namespaces): a machine without them fails the test, never a skip."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import stomp
from test_cluster_drain import PER_T2

from idl.generated import CosBridgeAdmin as BA

from bridgekit import (
    bridge_factory,
    channel_ep,
    inbox_count,
    jms_ep,
    managed_bridge,
    node_status,
    persistent_channel,
    pg_scalar,
    prepared_count,
    structured_consumer,
    unique_name,
)
from clusterkit import (
    EXPIRY_S,
    Links,
    StompCounter,
    StompProducer,
    Supplier,
    check_once,
    ownership,
    start_node,
    t2_persistent_channel,
    two_links_fixture,  # noqa: F401 - the fixture "two_links", imported so pytest finds it
)
from conftest import ClientOrb
from stdclients import wait_until

pytestmark = pytest.mark.integration



def test_a_node_cut_from_postgres_past_its_lease_is_fenced_and_its_work_resumes_on_a_survivor(
        tmp_path: Path, two_links: Links, broker_url: str, client_orb: ClientOrb,
        monkeypatch: pytest.MonkeyPatch) -> None:
    dsn = two_links.dsn
    a = start_node(tmp_path, "na", dsn, broker_url, monkeypatch)
    b = start_node(tmp_path, "nb", dsn, broker_url, monkeypatch)
    c = start_node(tmp_path, "nc", two_links.dsn2, broker_url, monkeypatch)
    host, port = broker_url.removeprefix("stomp://").split(":")
    counter = StompCounter()
    listen = stomp.Connection([(host, int(port))], auto_content_length=False)
    listen.set_listener("counter", counter)
    listen.connect(wait=True)
    supplier: Supplier | None = None
    producer: StompProducer | None = None
    try:
        q_out, q_in = unique_name("cluster.cut.out"), unique_name("cluster.cut.in")
        listen.subscribe(f"/queue/{q_out}", id="counter", ack="auto")
        factory = client_orb.factory(c.ior())
        bf = bridge_factory(client_orb, c)
        c1, cid1 = persistent_channel(factory)
        out_bridge, bid1 = bf.create_bridge(channel_ep(BA.SOURCE, cid1), jms_ep(BA.SINK, q_out))
        managed_bridge(out_bridge).enable_transaction(PER_T2, 30)
        out_bridge.start_bridge()
        c2, cid2 = t2_persistent_channel(factory, PER_T2)
        consumer = structured_consumer(c2)
        in_bridge, bid2 = bf.create_bridge(jms_ep(BA.SOURCE, q_in), channel_ep(BA.SINK, cid2, BA.PULL))
        in_bridge.start_bridge()
        assert set(ownership(dsn).values()) == {"nc"}

        supplier = Supplier(client_orb, [a, b], c1, cid1)     # refused by nc: the survivors' proxy, same ids
        producer = StompProducer(broker_url, q_in)
        supplier.thread.start()
        producer.thread.start()
        assert wait_until(lambda: len(counter.names()) >= 30 and consumer.count() >= 30, 60), \
            (len(counter.names()), consumer.count())
        two_links.cut()
        cut_at = time.monotonic()
        mark_out, mark_in = len(counter.names()), consumer.count()
        try:
            assert wait_until(lambda: ownership(dsn).get(("channel", cid1)) in ("na", "nb"), 90), ownership(dsn)
            claimed = time.monotonic() - cut_at
            owners = ownership(dsn)
            fencer = a if pg_scalar(dsn, "SELECT fenced_by FROM nsjms_member WHERE node_id = 'nc'") == "na" else b
            assert owners[("bridge", bid1)] == owners[("channel", cid1)] and \
                owners[("bridge", bid2)] == owners[("channel", cid2)], "a channel's bridges move with it"
            assert {owners[("channel", cid1)], owners[("channel", cid2)]} == {"na", "nb"}, \
                f"spread over both survivors (docs/cluster.md, Takeover): {owners}"
            assert wait_until(lambda: any(t["node_id"] == "nc" and t["started"] for t in
                                          node_status(fencer).get("cluster", {}).get("takeovers", [])), 60)
            assert wait_until(lambda: len(counter.names()) >= mark_out + 20 and consumer.count() >= mark_in + 20,
                              90), (len(counter.names()) - mark_out, consumer.count() - mark_in)
            resumed = time.monotonic() - cut_at
            assert c.proc is not None and c.proc.poll() is None, "the cut node does not know yet"
        finally:
            two_links.restore()
        print(f"\ncut: nc's work claimed by a survivor {claimed:.1f} s after the cut (lease expiry {EXPIRY_S} s); "
              f"both flows past +20 at {resumed:.1f} s")
        assert c.proc.wait(timeout=90) == 1, "nc, reconnected, learns it was fenced and stops (exit 1)"
        assert pg_scalar(dsn, "SELECT state || ':' || epoch FROM nsjms_member WHERE node_id = 'nc'") == "fenced:2"

        supplier.stop.set()
        producer.stop.set()
        supplier.thread.join(120)
        producer.thread.join(30)
        assert not supplier.thread.is_alive()
        dup, _ = check_once(counter, supplier.pushed, consumer, producer.sent, maybe=supplier.maybe,
                             consumer_duplicates=True)
        assert wait_until(lambda: inbox_count(dsn, bid2) == producer.sent, 60), \
            "JMS -> channel: each message exactly one event in the channel (one inbox row)"
        assert wait_until(lambda: prepared_count(dsn) == 0, 60), "no prepared transaction left"
        assert pg_scalar(dsn, "SELECT count(*) FROM nsjms_decision WHERE node_id = 'nc'") == 0
        print(f"channel -> JMS: {supplier.pushed} pushed ({len(supplier.maybe)} answered COMPLETED_MAYBE), "
              f"{len(counter.got)} messages, {dup} duplicate(s) (same dedupe id); JMS -> channel: {producer.sent} "
              f"messages, {consumer.count()} events at the consumer, {inbox_count(dsn, bid2)} inbox rows")
    finally:
        for worker in (supplier, producer):
            if worker is not None:
                worker.stop.set()
        listen.disconnect()
        two_links.restore()
        for node in (a, b, c):
            node.stop()
