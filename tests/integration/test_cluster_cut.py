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

from bridgekit import inbox_count, node_status, pg_scalar, prepared_count
from clusterkit import (
    EXPIRY_S,
    Flows,
    Links,
    ownership,
    start_nodes,
    stop_nodes,
    two_links_fixture,  # noqa: F401 - the fixture "two_links", imported so pytest finds it
)
from conftest import ClientOrb
from stdclients import wait_until

pytestmark = pytest.mark.integration

PER_T2 = 5


def test_a_node_cut_from_postgres_past_its_lease_is_fenced_and_its_work_resumes_on_a_survivor(
        tmp_path: Path, two_links: Links, broker_url: str, client_orb: ClientOrb) -> None:
    dsn = two_links.dsn
    a, b, c = start_nodes(tmp_path, ["na", "nb", "nc"], dsn, broker_url, dsns={"nc": two_links.dsn2})
    flows: Flows | None = None
    try:
        flows = Flows(client_orb, broker_url, c, [a, b], "cluster.cut", PER_T2)   # refused by nc: the survivors'
        routes, supplier, consumer = flows.routes, flows.supplier, flows.consumer      # proxy, same ids
        cid1, bid1, cid2, bid2 = routes.cid1, routes.bid1, routes.cid2, routes.bid2
        assert set(ownership(dsn).values()) == {"nc"}
        flows.run()
        assert flows.moved(30, 60), flows.arrived()
        two_links.cut()
        cut_at = time.monotonic()
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
            assert flows.moved(20), flows.arrived()
            resumed = time.monotonic() - cut_at
            assert c.proc is not None and c.proc.poll() is None, "the cut node does not know yet"
        finally:
            two_links.restore()
        print(f"\ncut: nc's work claimed by a survivor {claimed:.1f} s after the cut (lease expiry {EXPIRY_S} s); "
              f"both flows past +20 at {resumed:.1f} s")
        assert c.proc.wait(timeout=90) == 1, "nc, reconnected, learns it was fenced and stops (exit 1)"
        assert pg_scalar(dsn, "SELECT state || ':' || epoch FROM nsjms_member WHERE node_id = 'nc'") == "fenced:2"

        flows.stop()
        dup, _ = flows.check(consumer_duplicates=True)
        assert flows.producer is not None
        sent = flows.producer.sent
        assert wait_until(lambda: inbox_count(dsn, bid2) == sent, 60), \
            "JMS -> channel: each message exactly one event in the channel (one inbox row)"
        assert wait_until(lambda: prepared_count(dsn) == 0, 60), "no prepared transaction left"
        assert pg_scalar(dsn, "SELECT count(*) FROM nsjms_decision WHERE node_id = 'nc'") == 0
        print(f"channel -> JMS: {supplier.pushed} pushed ({len(supplier.maybe)} answered COMPLETED_MAYBE), "
              f"{len(flows.counter.got)} messages, {dup} duplicate(s) (same dedupe id); JMS -> channel: {sent} "
              f"messages, {consumer.count()} events at the consumer, {inbox_count(dsn, bid2)} inbox rows")
    finally:
        if flows is not None:
            flows.close()
        two_links.restore()
        stop_nodes([a, b, c])
