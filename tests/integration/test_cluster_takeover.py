"""Two nodes on one PostgreSQL and one broker (docs/cluster.md): ownership, takeover of a dead node's bridge with
fencing, and a survivor finishing the dead node's in-doubt routing transaction from PostgreSQL alone.

Node ``na`` owns a channel -> JMS bridge running in T2 (10 events per transaction) and dies (SIGKILL by its own
crash point) right after the decision of its 2nd transaction is durable, before any branch committed; its state
directory is made unreadable at once. Node ``nb`` fences it once its lease expires, claims the channel and bridge,
commits the prepared branch of the logged decision, re-sends its outbox rows with their dedupe ids, loads the
channel's queued events and routes them. Counted at an independent stomp.py consumer: every event; a duplicate only
of a transaction whose decision row the dead node left (its broker commit unknown), with its original's dedupe id. A
second channel of ``na``'s has a JMS -> channel queue bridge and a standard-stub push consumer; 20 messages are
produced while ``na`` is dead: the survivor's bridge turns each into exactly one event at that consumer (its
reference is stored with the proxy). Then ``na`` restarts on the shared database as a new member and restores
nothing: the channel and bridge stay with ``nb`` (before, a restarted node restored every node's). Last, ``nb`` is
paused (SIGSTOP) past its lease: ``na`` takes the channel and bridge back and routes 10 new events; ``nb`` woken
(SIGCONT) finds itself fenced and stops (exit 1); each new event arrives exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import stomp

import CosNotification

from idl.generated import CosBridgeAdmin as BA

from bridgekit import (
    bridge_factory,
    channel_ep,
    jms_ep,
    managed_bridge,
    node_status,
    persistent_channel,
    prepared_count,
    stomp_produce,
    structured_consumer,
    structured_supplier,
    unique_name,
)
from clusterkit import EXPIRY_S, RENEW_S, Flows, StompCounter, numbers, ownership, rows, start_nodes, stop_nodes
from conftest import ClientOrb
from stdclients import make_event, wait_until

pytestmark = pytest.mark.integration

EVENTS = 30
INBOUND = 20
PER_T2 = 10


def _audit_counts_the_re_send_apart(dsn: str, decided: set[str]) -> None:
    """The ledger of the takeover (docs/audit.md "Takeovers"): nb recorded its re-send of na's decided transactions,
    one ``delivered`` row per message beside na's, same transaction and nsjms_dedupe_id; the incremental audit counts
    exactly those obligations ``resent``, and nothing lost or duplicated."""
    from datetime import UTC, datetime, timedelta

    from audit.incremental import run_incremental

    resent = rows(dsn, "SELECT dedupe_id, gtrid, jms_message_id FROM nsjms_ledger WHERE node_id = 'nb' "
                        "AND gtrid LIKE %s AND outcome = 'delivered'", "na:%")
    assert resent and {g for _, g, _ in resent} <= decided, resent
    originals = rows(dsn, "SELECT dedupe_id, gtrid, jms_message_id FROM nsjms_ledger WHERE node_id = 'na' "
                           "AND gtrid LIKE %s AND outcome = 'delivered'", "na:%")
    assert set(resent) <= set(originals), "each re-send row beside the dead node's row of the same message"
    result = run_incremental(dsn, as_of=datetime.now(UTC), grace=timedelta(minutes=10))
    counts = {s: result.count(s) for s in ("resent", "duplicated", "lost")}
    assert counts == {"resent": len(resent), "duplicated": 0, "lost": 0}, counts


def test_a_survivor_takes_a_dead_nodes_bridge_over_and_finishes_its_decided_transaction(
        tmp_path: Path, fresh_db: str, broker_url: str, client_orb: ClientOrb) -> None:
    a, b = start_nodes(tmp_path, ["na", "nb"], fresh_db, broker_url, crash_at={"na": "t2.after_decision@2"})
    host, port = broker_url.removeprefix("stomp://").split(":")
    counter = StompCounter()
    conn = stomp.Connection([(host, int(port))], auto_content_length=False)
    conn.set_listener("counter", counter)
    conn.connect(wait=True)
    try:
        queue = unique_name("cluster.takeover")
        conn.subscribe(f"/queue/{queue}", id="counter", ack="auto")
        factory = client_orb.factory(a.ior())
        channel, cid = persistent_channel(factory)
        bridge, bid = bridge_factory(client_orb, a).create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, queue))
        managed_bridge(bridge).enable_transaction(PER_T2, 30)

        bridge.start_bridge()                            # its channel proxy connects ...
        bridge.stop_bridge()                             # ... and queues while the bridge is stopped
        inbound, cin = persistent_channel(factory)      # JMS -> channel: a second channel of na's, its consumer
        consumer = structured_consumer(inbound)          # a standard-stub push consumer in this process
        queue_in = unique_name("cluster.inbound")
        bridge_in, bid_in = bridge_factory(client_orb, a).create_bridge(jms_ep(BA.SOURCE, queue_in),
                                                                         channel_ep(BA.SINK, cin))
        bridge_in.start_bridge()
        assert ownership(fresh_db) == {("channel", cid): "na", ("bridge", bid): "na", ("channel", cin): "na",
                                     ("bridge", bid_in): "na"}, "the creating node owns them"

        supplier = structured_supplier(channel)
        for i in range(EVENTS):
            supplier.push_one(make_event(i, reliability=CosNotification.Persistent))
        assert rows(fresh_db, "SELECT count(*) FROM nsjms_queue WHERE channel_id = %s", cid) == [(EVENTS,)]
        bridge.start_bridge()                            # na dies at its 2nd T2's decision (a counted point)
        assert a.proc is not None and a.proc.wait(timeout=120) != 0
        died = time.monotonic()
        a.state_dir.chmod(0)                             # nb never needs na's disk
        stomp_produce(broker_url, queue_in, range(INBOUND))   # JMS -> channel while its owner is dead
        decided = {str(g) for g, n in rows(fresh_db, "SELECT gtrid, node_id FROM nsjms_decision") if n == "na"}
        in_doubt = {psycopg.Xid.from_string(g).gtrid for (g,) in rows(fresh_db, "SELECT gid FROM pg_prepared_xacts")}
        assert in_doubt and in_doubt <= decided, \
            f"its branch is in doubt and its decision readable in PostgreSQL: {in_doubt} {decided}"

        assert wait_until(lambda: any(t["started"] for t in node_status(b).get("cluster", {}).get("takeovers", [])),
                          60), node_status(b)
        took = time.monotonic() - died
        assert wait_until(lambda: len(counter.names()) >= EVENTS, 90), sorted(counter.names())
        print(f"\ntakeover: nb took na over {took:.1f} s after na died (lease expiry {EXPIRY_S} s, renewal "
              f"{RENEW_S} s); all {EVENTS} events routed {time.monotonic() - died:.1f} s after")
        assert counter.names() == {f"e{i}" for i in range(EVENTS)}, "no event lost"
        assert consumer.wait_for(INBOUND, 60), consumer.count()
        assert sorted(numbers(consumer.snapshot())) == list(range(INBOUND)), \
            "JMS -> channel across the takeover: each message exactly one event, at the consumer na connected"
        by_name: dict[str, set[str]] = {}
        for name, dedupe in counter.got:
            by_name.setdefault(name, set()).add(dedupe)
        assert all(len(d) == 1 for d in by_name.values()), "a duplicate only ever carries its original's dedupe id"
        twice = {name for name, _ in counter.got if [n for n, _ in counter.got].count(name) > 1}
        assert all(next(iter(by_name[n])).rsplit("/", 1)[0] in decided for n in twice), \
            f"duplicates only of transactions whose decision row was left (phase two unknown): {sorted(twice)}"
        print(f"events received {len(counter.got)}, distinct {len(by_name)}, re-sent twice {len(twice)}")

        assert wait_until(lambda: prepared_count(fresh_db) == 0, 30), "no prepared transaction left"
        assert rows(fresh_db, "SELECT count(*) FROM nsjms_decision WHERE node_id = 'na'") == [(0,)]
        assert rows(fresh_db, "SELECT epoch, state, fenced_by FROM nsjms_member WHERE node_id = 'na'") == \
            [(2, "fenced", "nb")]
        _audit_counts_the_re_send_apart(fresh_db, decided)
        assert ownership(fresh_db) == {("channel", cid): "nb", ("bridge", bid): "nb", ("channel", cin): "nb",
                                     ("bridge", bid_in): "nb"}

        a.state_dir.chmod(0o700)                         # na comes back as a new member and restores nothing
        a, = start_nodes(tmp_path, ["na"], fresh_db, broker_url)
        assert wait_until(lambda: node_status(a).get("cluster", {}).get("epoch") == 3, 30), node_status(a)
        status = node_status(a)                          # (the first status.json of the new process)
        assert status["channels"] == [] and status["bridges"] == [], status
        assert status["cluster"]["owned"] == {"channels": [], "bridges": []}
        assert wait_until(lambda: [x["id"] for x in node_status(b).get("bridges", [])] == [bid, bid_in], 10), \
            node_status(b)                                   # (status.json is a snapshot rewritten every 2 s)
        out = subprocess.run([sys.executable, "-m", "router.cli", "cluster", "status", "--json", "--state-dir",
                              str(b.state_dir)], env=dict(os.environ, NSJMS_POSTGRES_DSN=fresh_db),
                             capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert out.returncode == 0, out.stderr[-2000:]
        members = {m["node_id"]: m for m in json.loads(out.stdout)["members"]}
        assert (members["na"]["state"], members["na"]["epoch"], members["na"]["owns"]) == \
            ("live", 3, {"channels": [], "bridges": []})
        assert (members["nb"]["state"], members["nb"]["owns"]) == \
            ("live", {"channels": [cid, cin], "bridges": [bid, bid_in]})
        assert members["na"]["in_doubt"] == {"prepared": 0, "decided": 0} and members["nb"]["lease_left_s"] > 0

        # nb, the owner now, paused past its lease (SIGSTOP): na takes it over; nb woken (SIGCONT) stops
        assert b.proc is not None
        b.proc.send_signal(signal.SIGSTOP)
        try:
            assert wait_until(lambda: any(t["node_id"] == "nb" and t["started"] for t in
                                          node_status(a).get("cluster", {}).get("takeovers", [])), 60), \
                node_status(a).get("cluster")            # claimed AND loaded (before, a claim alone was listed)
            channel = client_orb.factory(a.ior()).get_event_channel(cid)     # its new owner
            supplier = structured_supplier(channel)
            for i in range(EVENTS, EVENTS + 10):
                supplier.push_one(make_event(i, reliability=CosNotification.Persistent))
            assert wait_until(lambda: len(counter.names()) >= EVENTS + 10, 60), sorted(counter.names())
        finally:
            b.proc.send_signal(signal.SIGCONT)
        assert b.proc.wait(timeout=60) == 1, "the woken node learns it was fenced and stops (exit 1)"
        assert rows(fresh_db, "SELECT epoch, state, fenced_by FROM nsjms_member WHERE node_id = 'nb'") == \
            [(2, "fenced", "na")]
        assert ownership(fresh_db) == {("channel", cid): "na", ("bridge", bid): "na", ("channel", cin): "na",
                                     ("bridge", bid_in): "na"}
        assert counter.names() == {f"e{i}" for i in range(EVENTS + 10)}
        later = [name for name, _ in counter.got if int(name[1:]) >= EVENTS]
        assert sorted(later) == sorted(f"e{i}" for i in range(EVENTS, EVENTS + 10)), \
            f"routed by the new owner exactly once; the woken node committed nothing: {later}"
        assert wait_until(lambda: prepared_count(fresh_db) == 0, 30)
    finally:
        conn.disconnect()
        a.state_dir.chmod(0o700)
        stop_nodes([a, b])


def _gtrid_node(dedupe: str) -> str:
    """The node whose routing transaction sent a message (its dedupe id is ``<gtrid>/<n>``, the gtrid ``<node>:…``)."""
    return dedupe.split(":", 1)[0]


def test_a_dead_nodes_channels_are_spread_over_both_survivors_under_t2_traffic(
        tmp_path: Path, fresh_db: str, broker_url: str, client_orb: ClientOrb) -> None:
    """Three nodes; ``na`` owns four channels: C1 with a channel -> JMS bridge in T2 (a standard-stub push supplier,
    counted at a stomp.py consumer), C2 (T2) with a JMS -> channel bridge in T2 (a stomp.py producer, counted at a
    standard-stub push consumer), C3 and C4 without bridges. Under traffic both ways ``na`` is SIGKILLed. The survivor
    that fences it spreads its channels, each with its bridges, least loaded first, in the fence's transaction: C1
    and C3 to ``nb``, C2 and C4 to ``nc`` (before, all four went to the fencer). The other survivor's share waits
    until the fencer finished ``na``'s transactions, then that survivor loads it. Both flows resume, each on its
    own survivor: 0 lost both ways, channel -> JMS duplicates only with their original's dedupe id."""
    a, b, c = start_nodes(tmp_path, ["na", "nb", "nc"], fresh_db, broker_url)
    flows: Flows | None = None
    try:
        flows = Flows(client_orb, broker_url, a, [a, b, c], "cluster.spread", PER_T2, start_bridges=False,
                      follow_after_maybe=True)
        routes, counter, consumer, supplier = flows.routes, flows.counter, flows.consumer, flows.supplier
        cid1, bid1, cid2, bid2 = routes.cid1, routes.bid1, routes.cid2, routes.bid2
        factory = client_orb.factory(a.ior())
        _, cid3 = persistent_channel(factory)
        _, cid4 = persistent_channel(factory)
        assert set(ownership(fresh_db).values()) == {"na"}
        routes.start()
        flows.run()
        assert flows.moved(20), flows.arrived()

        a.kill()                                         # SIGKILL
        died = time.monotonic()
        decided = {str(g) for (g,) in rows(fresh_db, "SELECT gtrid FROM nsjms_decision WHERE node_id = 'na'")}
        supplier.nodes = [b, c]
        mark_in = consumer.count()
        unit = {cid1: [bid1], cid2: [bid2], cid3: [], cid4: []}
        assert wait_until(lambda: "na" not in ownership(fresh_db).values(), 60), ownership(fresh_db)
        claimed = time.monotonic() - died
        owners = ownership(fresh_db)
        for cid, bids in unit.items():
            assert all(owners[("bridge", bid)] == owners[("channel", cid)] for bid in bids), \
                f"a channel's bridges go with it: {owners}"
        assert {owners[("channel", cid1)], owners[("channel", cid2)]} == {"nb", "nc"}, \
            f"spread over both survivors, least loaded first (C1, C2 weigh 2 each): {owners}"
        assert {owners[("channel", cid)] for cid in unit} == {"nb", "nc"}
        assert (owners[("channel", cid3)], owners[("channel", cid4)]) == \
            (owners[("channel", cid1)], owners[("channel", cid2)]), f"then the lighter ones, evened: {owners}"
        node_of = {"nb": b, "nc": c}
        running: dict[str, float] = {}

        def _runs() -> bool:
            for name, node in node_of.items():
                want = {cid for cid in unit if owners[("channel", cid)] == name}
                if name not in running and want <= {x["id"] for x in node_status(node).get("channels", [])}:
                    running[name] = time.monotonic() - died
            return len(running) == 2

        out_owner = owners[("channel", cid1)]
        resumed: dict[str, float] = {}

        def _routed() -> bool:
            with counter.lock:
                sent_by_owner = any(_gtrid_node(d) == out_owner for _, d in counter.got)
            if "channel -> JMS" not in resumed and sent_by_owner:
                resumed["channel -> JMS"] = time.monotonic() - died
            if "JMS -> channel" not in resumed and consumer.count() > mark_in:
                resumed["JMS -> channel"] = time.monotonic() - died
            return len(resumed) == 2 and _runs()

        assert wait_until(_routed, 90), (resumed, running, node_status(b).get("channels"),
                                         node_status(c).get("channels"))
        fencer = rows(fresh_db, "SELECT fenced_by FROM nsjms_member WHERE node_id = 'na'")[0][0]
        other = "nc" if fencer == "nb" else "nb"
        handoffs = rows(fresh_db, "SELECT channel_id, from_node, to_node, reason, state FROM nsjms_handoff "
                                  "ORDER BY channel_id")
        assert handoffs == [(cid, "na", other, "takeover", "started") for cid in sorted(unit)
                            if owners[("channel", cid)] == other], \
            f"the other survivor's share: claimed in the fence, started once released: {handoffs}"

        assert flows.moved(20), flows.arrived()
        flows.stop()
        dup, n_in = flows.check(consumer_duplicates=True)
        names = [n for n, _ in counter.got]
        twice = {n for n in names if names.count(n) > 1}
        assert all(d.rsplit("/", 1)[0] in decided for n, d in counter.got if n in twice), \
            f"duplicates only of transactions whose decision row na left (phase two unknown): {sorted(twice)}"
        assert wait_until(lambda: prepared_count(fresh_db) == 0, 30), "no prepared transaction left"
        assert rows(fresh_db, "SELECT count(*) FROM nsjms_decision WHERE node_id = 'na'") == [(0,)]
        assert rows(fresh_db, "SELECT epoch, state FROM nsjms_member WHERE node_id = 'na'") == [(2, "fenced")]
        per_in = {str(n): int(k) for n, k in rows(
            fresh_db, "SELECT split_part(gtrid, ':', 1), count(*) FROM nsjms_inbox WHERE bridge_id = %s GROUP BY 1",
            bid2)}
        print(f"\nspread takeover (renew {RENEW_S} s, expiry {EXPIRY_S} s): na SIGKILLed, fenced by {fencer}; claimed "
              f"(ownership moved) {claimed:.1f} s after the kill; shares running (s) "
              f"{ {k: round(v, 1) for k, v in sorted(running.items())} }; routed again (s) "
              f"{ {k: round(v, 1) for k, v in resumed.items()} }; owners {sorted(owners.items())}"
              f"\nchannel -> JMS: {supplier.pushed} pushed ({len(supplier.maybe)} COMPLETED_MAYBE), {dup} duplicate(s) "
              f"with their dedupe id; per node (sending transaction) {flows.per_node_out()}"
              f"\nJMS -> channel: {flows.producer.sent if flows.producer else 0} messages, {n_in} events at the "
              f"consumer "
              f"({n_in - len(set(numbers(consumer.snapshot())))} delivered twice); per node (inbox rows) {per_in}")
    finally:
        if flows is not None:
            flows.close()
        stop_nodes([a, b, c])
