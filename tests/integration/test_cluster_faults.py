"""Three nodes on one PostgreSQL and one broker under routing-transaction traffic both ways from independent clients:
the owner of the bridges SIGKILLed (its state directory made unreadable at once), then the survivor that took the
work over paused (SIGSTOP) past its lease and woken (SIGCONT) after the third node took it over (issue 25, "Show
it"; docs/cluster.md, "Guarantees").

Node ``na`` creates and owns channel C1 with a channel -> JMS queue bridge in T2 (standard-stub push supplier in,
the Java JMS client's consumer on the queue out) and T2 channel C2 with a JMS -> channel queue bridge in T2 (the
Java JMS client's producer in, a standard-stub structured push consumer of C2 out). Both flows run all along.

a. ``na`` kills itself at the commit of its 60th routing transaction branch after a decision (crash point
   ``t2.after_decision@60``: the decision durable, that branch not committed); its state directory is made
   unreadable at once. A survivor (``nb`` or ``nc``) fences it, finishes its transactions from PostgreSQL, loads
   C1, C2 and the bridges and routes on.
b. Once both flows moved 20 more through that survivor (a counted point), the supplier is held, the survivor is
   SIGSTOPped and the supplier goes on at the third node; the third node fences the paused one after its lease
   expired and routes on; once both flows moved 20 more (or after 90 s when a flow is held by a routing
   transaction's branch the paused node had open: its rows stay locked until its session ends, docs/cluster.md;
   that flow must then resume once it woke), the paused node is woken (SIGCONT): it learns it was
   fenced and stops (exit 1) having committed nothing (its log says so; PostgreSQL has no ledger, inbox or
   decision row of it written after its fence).

Counted at the clients: 0 lost either way; JMS -> channel each message exactly one event in the channel (one inbox
row); channel -> JMS a message twice only when its transaction's decision row was there at the kill or the pause
(its broker commit unknown: the survivor re-sends), with its original's dedupe id; no prepared transaction and no
decision row of either node left. Printed (``-s``): the time from the kill / stop to the first event routed again
by the node that took over, each way, and the events per node (from the dedupe ids the Java consumer got and the
inbox rows).

The supplier is held across the SIGSTOP so that no push of it waits in the paused node's socket: a push the paused
node stores when it wakes, before it learns it was fenced, is the accept path's window that docs/cluster.md names
("Not covered by the check"). Its calls time out after 5 s (a push answered ``COMPLETED_MAYBE`` must arrive at
most once).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bridgekit import JavaTool, inbox_count, node_status, prepared_count, unique_name
from clusterkit import (
    EXPIRY_S,
    RENEW_S,
    Supplier,
    make_routes,
    numbers,
    ownership,
    rows,
    start_nodes,
    stop_nodes,
)
from conftest import ClientOrb, NsjmsServer
from stdclients import wait_until

pytestmark = pytest.mark.integration

PER_T2 = 5
CRASH_AT = "t2.after_decision@60"
PRODUCER_PAUSE_MS = 50           # at most 20 JMS -> channel T2s a second: the crash count leaves channel -> JMS room
CALL_TIMEOUT_MS = 5_000
STEP = 20                          # events each flow moves between two faults (the counted points)
STALL_S = 90                       # how long the paused node's open branch may hold a flow before it is woken


def _paused(node: NsjmsServer) -> bool:
    """The kernel says the process is stopped (``T`` in /proc/PID/stat)."""
    assert node.proc is not None
    stat = Path(f"/proc/{node.proc.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def _gtrid_node(dedupe_id: str) -> str:
    """The node whose routing transaction sent a message (its gtrid ``<node>:...`` starts the dedupe id)."""
    return dedupe_id.split(":", 1)[0]


class _Out:
    """The Java consumer's messages: (event name, dedupe id), in the order received."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer

    def got(self) -> list[tuple[str, str]]:
        with self.consumer._cond:
            items = list(self.consumer.messages)
        return [(m["properties"]["$event_name"]["value"], m["properties"]["nsjms_dedupe_id"]["value"])
                for m in items]

    def names(self) -> set[str]:
        return {n for n, _ in self.got()}

    def by(self, node: str) -> int:
        return sum(1 for _, d in self.got() if _gtrid_node(d) == node)


def _decided(dsn: str, node: str) -> set[str]:
    return {str(g) for (g,) in rows(dsn, "SELECT gtrid FROM nsjms_decision WHERE node_id = %s", node)}


def _resumed(since: float, conditions: dict[str, Callable[[], bool]], timeout: float = 180, *,
             required: bool = True) -> dict[str, float]:
    """Polls every condition until each has held once; returns the seconds from ``since`` to each one's first time
    (measured apart: one flow may resume long after the other). ``required=False``: those seen within ``timeout``."""
    first: dict[str, float] = {}

    def each_seen() -> bool:
        for k, cond in conditions.items():
            if k not in first and cond():
                first[k] = time.monotonic() - since
        return len(first) == len(conditions)

    done = wait_until(each_seen, timeout)
    assert done or not required, f"not routed again in {timeout} s: {sorted(set(conditions) - set(first))}"
    return first


def _runs(node: NsjmsServer) -> set[int]:
    return {int(x["id"]) for x in node_status(node).get("channels", [])}


def _took_over(node: NsjmsServer, dead: str) -> bool:
    return any(t["node_id"] == dead and t["started"] for t in node_status(node).get("cluster", {}).get("takeovers", []))


def test_three_nodes_survive_a_killed_owner_and_a_paused_one_under_t2_traffic_both_ways(
        tmp_path: Path, fresh_db: str, broker_url: str, client_orb: ClientOrb, java_tool: JavaTool) -> None:
    dsn = fresh_db
    a, b, c = start_nodes(tmp_path, ["na", "nb", "nc"], dsn, broker_url, crash_at={"na": CRASH_AT})
    nodes = {n.state_dir.name: n for n in (a, b, c)}
    q_out, q_in = unique_name("cluster.faults.out"), unique_name("cluster.faults.in")
    stop_file = tmp_path / "producer.stop"
    java_out = java_tool.consume_async("queue", q_out, 1_000_000, 900)
    out = _Out(java_out)
    producer: Any = None
    supplier: Supplier | None = None
    paused: NsjmsServer | None = None
    try:
        routes = make_routes(client_orb, a, q_out, q_in, PER_T2, start=False)
        cid1, bid1, cid2, bid2, consumer = routes.cid1, routes.bid1, routes.cid2, routes.bid2, routes.consumer
        assert ownership(dsn) == routes.owned_by("na"), "the creating node owns them"
        supplier = Supplier(client_orb, [a, b, c], routes.c1, cid1, call_timeout_ms=CALL_TIMEOUT_MS,
                            follow_after_maybe=True)
        routes.in_bridge.start_bridge()   # JMS -> channel first: the JVM takes a while; at most one message per
        producer = java_tool.produce_until("queue", q_in, stop_file, pause_ms=PRODUCER_PAUSE_MS)   # pause
        assert wait_until(lambda: consumer.count() > 0, 120), "JMS -> channel runs through na"
        routes.out_bridge.start_bridge()
        supplier.thread.start()

        # a. na dies at a counted point (its 60th branch commit after a decision); its disk is gone at once
        assert a.proc is not None and a.proc.wait(timeout=240) != 0, "na reached its crash point"
        died = time.monotonic()
        a.state_dir.chmod(0)
        decided_a = _decided(dsn, "na")
        assert decided_a, "the decision of the transaction na died in is in PostgreSQL"
        before_in = consumer.count()
        assert wait_until(lambda: out.by("na") > 0, 60), "channel -> JMS ran through na before it died"
        supplier.nodes = [b, c]
        assert wait_until(lambda: ownership(dsn).get(("channel", cid1)) in ("nb", "nc"), 120), ownership(dsn)
        claimed_a = time.monotonic() - died
        owner = ownership(dsn)
        s1_name = owner[("channel", cid1)]
        s1, s2 = nodes[s1_name], nodes["nc" if s1_name == "nb" else "nb"]
        assert owner == {("channel", cid1): s1_name, ("bridge", bid1): s1_name,
                         ("channel", cid2): s2.state_dir.name, ("bridge", bid2): s2.state_dir.name}, \
            "the dead node's work spread over both survivors (docs/cluster.md, Takeover), bridges with channels"
        resume_a = _resumed(died, {"channel -> JMS": lambda: out.by(s1_name) > 0,     # sent in the survivor's T2s
                                   "JMS -> channel": lambda: consumer.count() > before_in})
        fencer_a = nodes[str(rows(dsn, "SELECT fenced_by FROM nsjms_member WHERE node_id = 'na'")[0][0])]
        assert wait_until(lambda: _took_over(fencer_a, "na"), 60), node_status(fencer_a).get("cluster")
        assert wait_until(lambda: cid1 in _runs(s1) and cid2 in _runs(s2), 60), "each survivor runs its share"
        mark_out, mark_in = len(out.names()), consumer.count()
        assert wait_until(lambda: len(out.names()) >= mark_out + STEP and consumer.count() >= mark_in + STEP, 120), \
            (len(out.names()) - mark_out, consumer.count() - mark_in)

        # b. the survivor paused past its lease (a counted point: both flows moved STEP more through it)
        supplier.pause()
        paused = s1
        assert s1.proc is not None
        s1.proc.send_signal(signal.SIGSTOP)
        assert wait_until(lambda: _paused(s1), 30), "SIGSTOP took effect"
        stopped = time.monotonic()
        decided_s1 = _decided(dsn, s1_name)              # frozen: the node is stopped
        before_in = consumer.count()
        supplier.nodes = [s2]
        supplier.resume()
        assert wait_until(lambda: ownership(dsn).get(("channel", cid1)) == s2.state_dir.name, 180), ownership(dsn)
        claimed_b = time.monotonic() - stopped
        assert set(ownership(dsn).values()) == {s2.state_dir.name}
        routed_b = {"channel -> JMS": lambda: out.by(s2.state_dir.name) > 0,
                    "JMS -> channel": lambda: consumer.count() > before_in}
        # not required while it is paused: a routing transaction's branch it had open (not prepared) holds the rows
        # it touched until its session ends (docs/cluster.md, "A node paused inside an open PostgreSQL transaction")
        resume_b = _resumed(stopped, routed_b, STALL_S, required=False)
        assert wait_until(lambda: _took_over(s2, s1_name), 60), node_status(s2).get("cluster")
        if len(resume_b) == len(routed_b):
            mark_out, mark_in = len(out.names()), consumer.count()
            assert wait_until(lambda: len(out.names()) >= mark_out + STEP and consumer.count() >= mark_in + STEP,
                              120), (len(out.names()) - mark_out, consumer.count() - mark_in)
        assert s1.proc.poll() is None
        s1.proc.send_signal(signal.SIGCONT)
        woke = time.monotonic() - stopped
        paused = None
        assert s1.proc.wait(timeout=120) == 1, "the woken node learns it was fenced and stops (exit 1)"
        stalled = sorted(set(routed_b) - set(resume_b))
        resume_b.update(_resumed(stopped, {k: routed_b[k] for k in stalled}))     # routed again once it woke
        (fenced_at, epoch, state, fenced_by), = rows(
            dsn, "SELECT fenced_at, epoch, state, fenced_by FROM nsjms_member WHERE node_id = %s", s1_name)
        assert (epoch, state, fenced_by) == (2, "fenced", s2.state_dir.name)
        assert rows(dsn, "SELECT epoch, state FROM nsjms_member WHERE node_id = 'na'") == [(2, "fenced")]
        log_text = s1.stderr_path.read_text(errors="replace")
        assert "this node stops acting" in log_text and "was fenced" in log_text, log_text[-3000:]
        late = rows(dsn, "SELECT outcome, direction, count(*) FROM nsjms_ledger WHERE node_id = %s AND "
                         "recorded_at > %s GROUP BY 1, 2", s1_name, fenced_at)
        assert late == [], f"the woken node committed ledger rows after its fence: {late}"
        assert rows(dsn, "SELECT count(*) FROM nsjms_inbox WHERE gtrid LIKE %s AND received_at > %s",
                    f"{s1_name}:%", fenced_at) == [(0,)], "the woken node stored no JMS message after its fence"

        # the end: stop the clients, count
        supplier.pause()
        stop_file.touch()
        said, errors = producer.communicate(timeout=120)
        assert producer.returncode == 0, errors[-3000:]
        sent = int(json.loads(said.strip().splitlines()[-1])["sent"])
        maybe = set(supplier.maybe)
        want = {f"e{i}" for i in range(supplier.pushed) if i not in maybe}
        assert wait_until(lambda: want <= out.names(), 180), sorted(want - out.names())[:20]
        assert out.names() - {f"e{i}" for i in maybe} == want, "channel -> JMS: no event lost, none made up"
        assert wait_until(lambda: inbox_count(dsn, bid2) == sent, 180), (inbox_count(dsn, bid2), sent)
        assert wait_until(lambda: set(numbers(consumer.snapshot())) >= set(range(sent)), 180), \
            sorted(set(range(sent)) - set(numbers(consumer.snapshot())))[:20]
        got_in = numbers(consumer.snapshot())
        assert set(got_in) == set(range(sent)), "JMS -> channel: no message lost, none made up"
        assert wait_until(lambda: prepared_count(dsn) == 0, 60), "no prepared transaction left"
        assert rows(dsn, "SELECT node_id, count(*) FROM nsjms_decision WHERE node_id IN ('na', %s) GROUP BY 1",
                    s1_name) == [], "no decision row of a fenced node left"

        received = out.got()
        dedupe: dict[str, set[str]] = {}
        for name, d in received:
            dedupe.setdefault(name, set()).add(d)
        assert all(len(d) == 1 for d in dedupe.values()), "a duplicate only with its original's dedupe id"
        twice = sorted(name for name, d in dedupe.items() if [n for n, _ in received].count(name) > 1)
        window = decided_a | decided_s1
        assert all(next(iter(dedupe[n])).rsplit("/", 1)[0] in window for n in twice), \
            f"duplicates only of transactions decided at the kill or the pause: {[(n, dedupe[n]) for n in twice]}"

        per_out = {n: out.by(n) for n in ("na", "nb", "nc")}
        per_in = {str(n): int(k) for n, k in rows(
            dsn, "SELECT split_part(gtrid, ':', 1), count(*) FROM nsjms_inbox WHERE bridge_id = %s GROUP BY 1", bid2)}
        print(f"\nleases: renew {RENEW_S} s, expiry {EXPIRY_S} s"
              f"\nSIGKILL of na: claimed by {s1_name} after {claimed_a:.1f} s; routed again after (s) "
              f"{ {k: round(v, 1) for k, v in resume_a.items()} }"
              f"\nSIGSTOP of {s1_name}: claimed by {s2.state_dir.name} after {claimed_b:.1f} s; routed again after (s) "
              f"{ {k: round(v, 1) for k, v in resume_b.items()} } (woken after {woke:.1f} s; held by the paused "
              f"node until it woke: {stalled or 'nothing'})"
              f"\nchannel -> JMS: {supplier.pushed} pushed ({len(maybe)} answered COMPLETED_MAYBE), "
              f"{len(received)} messages at the Java consumer, {len(twice)} twice "
              f"{[(n, sorted(dedupe[n])[0]) for n in twice]}; per node (sending transaction) {per_out}"
              f"\nJMS -> channel: {sent} messages from the Java producer, {inbox_count(dsn, bid2)} inbox rows, "
              f"{len(got_in)} events at the consumer ({len(got_in) - len(set(got_in))} delivered twice); per node "
              f"{per_in}")
    finally:
        if paused is not None and paused.proc is not None:
            paused.proc.send_signal(signal.SIGCONT)
        if supplier is not None:
            supplier.stop.set()
        stop_file.touch()
        if producer is not None and producer.poll() is None:
            producer.kill()
            producer.communicate()
        java_out.stop()
        a.state_dir.chmod(0o700)
        stop_nodes([a, b, c])
