"""Drain-and-handoff and rolling restarts with real nodes (docs/cluster.md, "Placement and operations", "Rolling
restart"): ``nsjms cluster drain`` of a node under routing-transaction traffic both ways, ``nsjms cluster rebalance``
giving a rejoined node its share, least-loaded placement, and a rolling restart of three nodes by drain and by plain
restarts.

The tests share the module's nodes (clusterkit's ``cluster`` fixture: one database, nodes ``na``, ``nb`` and, for
the rolling restarts, ``nc``, started once and restarted only where a test restarts them; every bridge and channel
destroyed after each test). Each test asks for the nodes it needs (``cluster.up``).

The traffic (clusterkit's :class:`~clusterkit.Flows`): node ``na`` owns channel C1 with a channel -> JMS queue bridge
in T2 (5 events per transaction; a standard-stub push supplier pushes persistent events into C1 all along, counted
at a stomp.py consumer of the queue) and T2 channel C2 with a JMS -> channel queue bridge in T2 (the channel pulls
from the bridge; a stomp.py producer sends all along; a standard-stub push consumer of C2 counts).

1. While both flows run, ``nsjms cluster drain na`` hands C1 and C2 (with their bridges) to ``nb``: ``na`` finishes
   the T2s in flight, stops them, moves their ownership in one fenced transaction, ``nb`` loads and resumes them.
   The drain reports ``clean`` (exit 0); the supplier, refused by ``na`` once C1 left, gets its proxy from ``nb`` by
   the same ids (where ``na`` forwards requests for objects other nodes run, its ORB follows the forward instead;
   docs/cluster.md) and pushes on. Counted at the clients: every event and every message exactly once (channel ->
   JMS: a duplicate only with its original's dedupe id); no prepared transaction left. Then ``na`` restarts (a new
   incarnation, no longer drained) and ``nsjms cluster rebalance`` moves one channel back to it; a last round of
   traffic both ways is counted the same way.
2. Least-loaded placement: a node started with it hands its second new channel to the least loaded member.
3. A rolling restart of three nodes by drain: each node in turn drained (clean), stopped, started again and given
   its share back by ``rebalance``: every event and message exactly once.
4. A rolling restart by plain restarts, no drain: each node in turn is stopped with SIGTERM (a clean stop: the
   routing transactions in flight end, the node leaves) and started again at once; the survivors take its channels
   over without waiting for a lease (it left), spread over them least loaded first (the restarted node, owning
   nothing, is the least loaded when the next one stops). 0 lost, no duplicate either way (a clean stop leaves no
   decided transaction to send again and no delivered event to deliver again); no prepared transaction left. The
   test prints how long each restart took and where the work ran.
"""

from __future__ import annotations

import json
import time

import psycopg
import pytest

from idl.generated import CosBridgeAdmin as BA

from bridgekit import (
    bridge_factory,
    channel_ep,
    jms_ep,
    node_status,
    persistent_channel,
    prepared_count,
    structured_consumer,
    unique_name,
)
from clusterkit import (
    PERSISTENT,
    RENEW_S,
    Cluster,
    Flows,
    cli,
    cluster_fixture,  # noqa: F401 - the fixture "cluster", imported so pytest finds it
    module_cluster_fixture,  # noqa: F401 - the fixture "module_cluster" (the shared nodes)
    numbers,
    ownership,
    rows,
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
STEP = 20          # both flows move this many more before each restart and at the end


def test_drain_hands_a_nodes_channels_over_under_t2_traffic_and_rebalance_gives_a_rejoined_node_its_share(
        cluster: Cluster, client_orb: ClientOrb) -> None:
    a, b = cluster.up("na", "nb")
    dsn = cluster.dsn
    flows = Flows(client_orb, cluster.broker_url, a, [a, b], "cluster.drain", PER_T2)
    supplier, routes = flows.supplier, flows.routes
    cid1, cid2 = routes.cid1, routes.cid2
    try:
        assert ownership(dsn) == routes.owned_by("na")
        flows.run()
        assert flows.moved(40, 60), flows.arrived()      # both flows run through na, in T2
        began = time.monotonic()
        out = cli(dsn, a.state_dir, "drain", "na")
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
        assert ownership(dsn) == routes.owned_by("nb")
        status = cli(dsn, b.state_dir, "status")
        members = {m["node_id"]: m for m in json.loads(status.stdout)["members"]}
        assert (members["na"]["draining"], members["na"]["state"], members["na"]["owns"]) == \
            (True, "live", {"channels": [], "bridges": []}), "drained: live, owning nothing, safe to remove"
        assert flows.moved(30), ("both flows run on through nb", flows.arrived())
        flows.stop()
        dup, n_in = flows.check()
        assert supplier.maybe == [], "a hand-off refuses a push before storing anything (COMPLETED_NO)"
        print(f"channel -> JMS: {supplier.pushed} events pushed, {len(flows.counter.got)} messages ({dup} "
              f"duplicate(s)); JMS -> channel: {n_in} events; pushes refused while moving: {len(supplier.refused)}")
        assert wait_until(lambda: prepared_count(dsn) == 0, 30), "no prepared transaction left"
        assert node_status(a).get("channels") == [] or wait_until(lambda: node_status(a).get("channels") == [], 10)

        # na restarts (a new incarnation: no longer drained); rebalance gives it one of the two channels back
        a.stop()
        a = cluster.restart("na")
        supplier.nodes = [a, b]
        out = cli(dsn, b.state_dir, "rebalance")
        assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout}\n{out.stderr[-3000:]}"
        moves = json.loads(out.stdout)["moves"]
        assert [(m["from"], m["to"], m["state"]) for m in moves] == [("nb", "na", "started")], moves
        owners = ownership(dsn)
        assert sorted(owners.values()) == ["na", "na", "nb", "nb"], owners
        print(f"rebalance: channel {moves[0]['channel']} back to na in {moves[0]['handoff_s']} s")
        again = cli(dsn, b.state_dir, "rebalance")
        assert again.returncode == 0 and json.loads(again.stdout)["moves"] == [], "even: sticky, nothing moves"

        assert flows.producer is not None
        for i in range(supplier.pushed, supplier.pushed + 20):
            supplier.push(i)
        for i in range(flows.producer.sent, flows.producer.sent + 20):
            flows.producer.send(i)
        flows.check()
        assert supplier.maybe == [], "a hand-off refuses a push before storing anything (COMPLETED_NO)"
        assert wait_until(lambda: prepared_count(dsn) == 0, 30)
    finally:
        flows.close()


def test_least_loaded_placement_hands_a_new_channel_to_the_member_owning_fewer_objects(
        cluster: Cluster, client_orb: ClientOrb) -> None:
    """``cluster.placement = "least-loaded"`` (node ``nl``; placement is the creating node's setting): the creating
    node keeps a channel while it is the least loaded; the next goes to the least loaded member (``na``, of the
    members owning nothing the first by name) right after its creation (a hand-off), which then runs it."""
    dsn = cluster.dsn
    nl = cluster.up("na", "nb", "nl", env={"NSJMS_CLUSTER_PLACEMENT": "least-loaded"})[2]
    a = cluster["na"]
    try:
        factory = client_orb.factory(nl.ior())
        _, cid1 = persistent_channel(factory)
        _, cid2 = persistent_channel(factory)                       # nl owns 1, na and nb 0: this one goes to na
        assert wait_until(lambda: cid2 in [c["id"] for c in node_status(a).get("channels", [])], 30), \
            node_status(a).get("channels")
        assert ownership(dsn) == {("channel", cid1): "nl", ("channel", cid2): "na"}
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT channel_id, from_node, to_node, reason, state FROM nsjms_handoff "
                                "WHERE channel_id IN (%s, %s)", (cid1, cid2)).fetchall() \
                == [(cid2, "nl", "na", "placement", "started")]
        channel = client_orb.factory(a.ior()).get_event_channel(cid2)   # na runs it: routed there
        consumer = structured_consumer(channel)
        proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
        supplier = PushSupplierClient(proxy, Form.STRUCTURED)
        supplier.connect()
        for i in range(5):
            supplier.push_one(make_event(i, reliability=PERSISTENT))
        assert consumer.wait_for(5, 30) and sorted(numbers(consumer.snapshot())) == list(range(5))
        refused = cli(dsn, nl.state_dir, "drain", "nobody")
        assert refused.returncode == 4 and "not a member" in refused.stderr, (refused.returncode, refused.stderr)
    finally:
        cluster.up("na", "nb")                                      # nl stops (and leaves)


def test_a_rolling_restart_of_three_nodes_by_drain_and_rebalance_loses_nothing(
        cluster: Cluster, client_orb: ClientOrb) -> None:
    """Under T2 traffic both ways, each of three nodes in turn is drained (clean), stopped, started again and given
    its share back by a rebalance: every event and message arrives exactly once."""
    nodes = cluster.up("na", "nb", "nc")
    dsn = cluster.dsn
    flows = Flows(client_orb, cluster.broker_url, nodes[0], nodes, "cluster.roll", PER_T2)   # the same list:
    try:                                                                                   # restarted nodes
        flows.run()                                                                        # replace theirs
        times = []
        for k, name in enumerate(("na", "nb", "nc")):
            assert flows.moved(STEP), (f"traffic flows before {name} restarts", flows.arrived())
            began = time.monotonic()
            out = cli(dsn, nodes[(k + 1) % 3].state_dir, "drain", name)
            assert out.returncode == 0 and json.loads(out.stdout)["result"] == "clean", out.stdout + out.stderr[-2000:]
            nodes[k].stop()
            nodes[k] = cluster.restart(name)
            out = cli(dsn, nodes[k].state_dir, "rebalance")
            assert out.returncode == 0, out.stdout + out.stderr[-2000:]
            times.append(round(time.monotonic() - began, 1))
        print(f"\nrolling restart: drain + restart + rebalance per node {times} s; owners at the end {ownership(dsn)}")
        assert flows.moved(STEP), flows.arrived()
        flows.stop()
        assert flows.supplier.maybe == []
        dup, n_in = flows.check()
        print(f"channel -> JMS: {flows.supplier.pushed} events, {dup} duplicate(s); JMS -> channel: {n_in} events; "
              f"pushes refused while moving: {len(flows.supplier.refused)}")
        assert wait_until(lambda: prepared_count(dsn) == 0, 30)
    finally:
        flows.close()


def test_a_rolling_restart_of_three_nodes_by_plain_restarts_loses_nothing(
        cluster: Cluster, client_orb: ClientOrb) -> None:
    nodes = cluster.up("na", "nb", "nc")
    dsn = cluster.dsn
    epoch_a = int(rows(dsn, "SELECT epoch FROM nsjms_member WHERE node_id = 'na'")[0][0])
    flows = Flows(client_orb, cluster.broker_url, nodes[0], nodes, "cluster.plainroll", PER_T2,
                  follow_after_maybe=True)                  # the same list: restarted nodes replace theirs
    supplier = flows.supplier
    try:
        flows.run()
        log: list[str] = []
        for k, name in enumerate(("na", "nb", "nc")):
            assert flows.moved(STEP), (f"both flows move before {name} restarts", flows.arrived())
            owned = sorted(str(kind) + str(i) for (kind, i), n in ownership(dsn).items() if n == name)
            began = time.monotonic()
            assert nodes[k].stop() == 0, f"{name} stops cleanly on SIGTERM"
            stopped = time.monotonic() - began
            assert wait_until(lambda n=name: n not in ownership(dsn).values(), 60), ownership(dsn)
            moved = time.monotonic() - began
            nodes[k] = cluster.restart(name)
            log.append(f"{name}: owned {owned}; stopped in {stopped:.1f} s, its work claimed {moved:.1f} s, running "
                       f"again {time.monotonic() - began:.1f} s after the SIGTERM; owners now "
                       f"{sorted(ownership(dsn).items())}")
        assert flows.moved(STEP), ("both flows move after the last restart", flows.arrived())
        flows.stop()
        dup, n_in = flows.check(consumer_duplicates=True)
        got = numbers(flows.consumer.snapshot())
        twice = sorted({n for n in got if got.count(n) > 1})
        assert wait_until(lambda: prepared_count(dsn) == 0, 30), "no prepared transaction left"
        per_in = {str(n): int(c) for n, c in rows(
            dsn, "SELECT split_part(gtrid, ':', 1), count(*) FROM nsjms_inbox WHERE bridge_id = %s GROUP BY 1",
            flows.routes.bid2)}
        assert flows.producer is not None
        print("\nrolling restart by plain restarts (SIGTERM, start):\n  " + "\n  ".join(log) +
              f"\nchannel -> JMS: {supplier.pushed} pushed ({len(supplier.maybe)} COMPLETED_MAYBE), {dup} "
              f"duplicate(s); per node (sending transaction) {flows.per_node_out()}"
              f"\nJMS -> channel: {flows.producer.sent} messages, {n_in} events at the consumer, twice {twice}; per "
              f"node (inbox rows) {per_in}; pushes refused while moving: {len(supplier.refused)}")
        assert dup == 0, "a clean stop leaves no decided transaction to send again"
        assert twice == [], "a clean stop leaves no delivered event to deliver again"
        assert node_status(nodes[0]).get("cluster", {}).get("epoch") == epoch_a + 2, \
            "left, fenced by its takeover, rejoined"
    finally:
        flows.close()


def test_a_destroyed_channel_and_bridge_leave_no_ownership_row(cluster: Cluster, client_orb: ClientOrb) -> None:
    a, _ = cluster.up("na", "nb")
    channel, cid = persistent_channel(client_orb.factory(a.ior()))
    bf = bridge_factory(client_orb, a)
    bridge, bid = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, unique_name("cluster.destroy")))
    assert ownership(cluster.dsn) == {("channel", cid): "na", ("bridge", bid): "na"}
    bridge.destroy()
    channel.destroy()
    assert rows(cluster.dsn, "SELECT count(*) FROM nsjms_channel WHERE id = %s", cid) == [(0,)]
    assert ownership(cluster.dsn) == {}, "a destroyed object is owned by no node (docs/cluster.md, CORBA addressing)"
