"""A silent network cut between the node and the broker (issue 31): packets dropped, no reset, no FIN.

ActiveMQ runs in a network namespace of its own, reached over two veth pairs: the node's (cut: its host end set
down, so every packet either way is dropped without a word until it is set up again) and the counting clients' (never
cut). Traffic flows both ways through the cut, counted at independent clients:

* channel -> JMS without a routing transaction: a standard-stub CORBA supplier pushes persistent structured events
  into a Persistent channel; its bridge sends them to a queue read by a stomp.py consumer;
* channel -> JMS in T2s (``enable_transaction``): the same, through a second channel and queue;
* JMS -> channel: a stomp.py producer sends persistent messages (each receipted) to a queue; its bridge forwards them
  into a Persistent channel, read by a standard-stub CORBA push consumer;
* JMS -> channel in T2s: the same into a channel with EnableTransaction, whose pull proxy takes them from the bridge
  in routing transactions.

Asserted (docs/bridge.md "A silent network cut to the broker"):

* the node notices the cut within the documented bound (STOMP heart-beats) and ``nsjms status`` says degraded
  (exit 8) naming the broker, while the suppliers' pushes go on being accepted;
* once the link is back, the bridges reconnect by themselves and ``nsjms status`` is clean again (exit 0);
* every accepted event and every receipted message is delivered (0 lost); channel -> JMS duplicates only with their
  original's dedupe id, with and without T2 (without T2 at most the batches in flight at the loss), and no two
  events share a dedupe id (a consumer that drops by id drops only duplicates); JMS -> channel none (the inbox:
  exactly once into a Persistent channel).

Needs root (network namespaces): a machine without them fails the test (never a skip).
"""

from __future__ import annotations

import collections
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import stomp
from netcut import Link, add_link, add_namespace, remove

from omniORB import CORBA

from idl.generated import CosBridgeAdmin as BA
from router.channel.localpush import IN_FLIGHT, STRUCTURED_BATCH
from router.node.services import EmbeddedActiveMQ, wait_for_port

from bridgekit import (
    bridge_factory,
    channel_ep,
    jms_ep,
    node_status,
    persistent_channel,
    structured_consumer,
    structured_supplier,
    t2_bridge,
    t2_channel,
    unique_name,
)
from conftest import NsjmsServer, free_port
from stdclients import make_event, wait_until

pytestmark = pytest.mark.integration

#: docs/bridge.md: a bridge's connection counts as lost within 25 s of a silent cut: 15 s after the first write the
#: broker's TCP does not acknowledge (TCP_USER_TIMEOUT; the node writes a heart-beat at least every 10 s), or 15 s
#: (1.5 x the broker's 10 s heart-beat) after the last frame it received; the 2 s status snapshot and a loaded machine
#: add a few seconds.
NOTICE_BOUND_S = 30.0
#: docs/bridge.md: after the link returns, the bridges reconnect within 15 s (the reconnect policy's longest wait, 5 s,
#: plus one connect attempt, at most 10 s); the 2 s status snapshot and a loaded machine add a few seconds.
RESUME_BOUND_S = 20.0
SETTLE_S = 120.0
T2_EVENTS, T2_TIMEOUT_S = 10, 30
#: Channel -> JMS without T2 re-sends the batches whose receipts a lost connection swallowed: at most
#: router.channel.localpush's IN_FLIGHT (2) batches of STRUCTURED_BATCH (100) events.
PLAIN_DUPLICATES_MAX = IN_FLIGHT * STRUCTURED_BATCH
#: The plain flow's events are this big: its batches in flight then fill the socket's send buffer during the cut
#: (nothing is acknowledged), so a write blocks, as under load.
PAD_BYTES = 32 * 1024


class NetnsActiveMQ(EmbeddedActiveMQ):
    """The embedded broker started inside network namespace ``ns``, listening on every address there."""

    def __init__(self, base: Path, ns: str, node: Link, clients: Link) -> None:
        super().__init__(base, free_port(), free_port(), die_with_parent=True, reuse=False)
        self.ns, self.node, self.clients = ns, node, clients

    def _command(self, java: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *super()._command(java)]

    def _instance_xml(self) -> str:
        return super()._instance_xml().replace("://127.0.0.1:", "://0.0.0.0:")

    def start(self) -> str:
        java = self._java()
        self._prepare_root()
        self._write_instance(self._instance_xml())
        self._spawn(java)
        try:
            wait_for_port(self.clients.addr, self.stomp_port, self.timeout, abort=self._exited)
        except Exception:
            self.stop()
            raise
        self.url = f"stomp://{self.node.addr}:{self.stomp_port}"
        return self.url

    @property
    def client_url(self) -> tuple[str, int]:
        return self.clients.addr, self.stomp_port


@pytest.fixture(scope="module")
def cut_broker() -> Iterator[NetnsActiveMQ]:
    ns = f"nsjmsmq{secrets.token_hex(3)}"
    add_namespace(ns)
    links: list[Link] = []
    base = Path(tempfile.mkdtemp(prefix="nsjms-test-cutmq-"))
    broker: NetnsActiveMQ | None = None
    try:
        links += [add_link(ns, 232), add_link(ns, 233)]
        broker = NetnsActiveMQ(base, ns, *links)
        broker.start()
        yield broker
    finally:
        for link in links:
            subprocess.run(["ip", "link", "set", link.host_if, "up"], capture_output=True, check=False)
        try:
            if broker is not None:
                broker.stop()
        finally:
            remove(ns, *links)
            shutil.rmtree(base, ignore_errors=True)


class Counter(stomp.ConnectionListener):  # type: ignore[misc]
    """An independent JMS consumer: every message's event number and dedupe id, per destination."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.seen[frame.headers["subscription"]].append(
                (int(frame.headers["$event_name"][1:]), frame.headers.get("nsjms_dedupe_id", "")))

    def counts(self, sub: str) -> collections.Counter[int]:
        with self.lock:
            return collections.Counter(n for n, _ in self.seen[sub])

    def dedupe_ids(self, sub: str) -> dict[int, set[str]]:
        with self.lock:
            out: dict[int, set[str]] = collections.defaultdict(set)
            for n, d in self.seen[sub]:
                out[n].add(d)
            return out


@dataclass
class Pusher:
    """Pushes events ``base``, ``base + 1``, ... into a channel, each once; records the accepted ones."""

    client: Any
    base: int
    pad: int = 0                                    # > 0: the events' body is that many bytes (big events)
    ok: list[int] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        i = self.base
        while not self.stop.is_set():
            try:
                event = make_event(i)
                if self.pad:
                    event.remainder_of_body = CORBA.Any(CORBA.TC_string, "p" * self.pad)
                self.client.push_one(event)
                self.ok.append(i)
            except Exception as exc:  # noqa: BLE001 — recorded: the broker's cut must not fail a push
                self.failed.append(f"event {i}: {exc!r}")
            i += 1
            time.sleep(0.05)


@dataclass
class Producer:
    """A stomp.py producer on the clients' link: persistent messages with header ``n``, each receipted."""

    address: tuple[str, int]
    queue: str
    base: int
    sent: list[int] = field(default_factory=list)
    next: int = 0                                   # the next message's number (those below were sent, or tried)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        conn = stomp.Connection12([self.address], auto_content_length=False)
        conn.connect(wait=True)
        try:
            i = self.next = self.base
            while not self.stop.is_set():
                self.next = i + 1
                receipt = threading.Event()
                listener = _Receipt(f"r{i}", receipt)
                conn.set_listener("receipt", listener)
                conn.send(f"/queue/{self.queue}", f"m{i}", headers={"n": str(i), "persistent": "true",
                                                                     "receipt": f"r{i}"})
                if receipt.wait(30):
                    self.sent.append(i)                     # the broker holds it
                i += 1
                time.sleep(0.05)
        finally:
            conn.disconnect()


class _Receipt(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self, rid: str, event: threading.Event) -> None:
        self.rid, self.event = rid, event

    def on_receipt(self, frame: Any) -> None:
        if frame.headers.get("receipt-id") == self.rid:
            self.event.set()


def _status(state: Path) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "router.cli", "status", "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
    return done.returncode, done.stdout + done.stderr


def _dups(counts: collections.Counter[int], ids: dict[int, set[str]]) -> tuple[int, dict[int, set[str]]]:
    """How many duplicate deliveries, and those whose copies do not all carry one dedupe id."""
    extra = sum(n - 1 for n in counts.values() if n > 1)
    bad = {i: ids[i] for i, n in counts.items() if n > 1 and (len(ids[i]) != 1 or "" in ids[i])}
    return extra, bad


def _shared_ids(ids: dict[int, set[str]]) -> dict[str, set[int]]:
    """The dedupe ids carried by more than one event (a consumer dropping by id would lose one of them)."""
    events: dict[str, set[int]] = collections.defaultdict(set)
    for i, dids in ids.items():
        for d in dids:
            events[d].add(i)
    return {d: ns for d, ns in events.items() if len(ns) > 1}


def test_a_silent_network_cut_to_the_broker_is_noticed_and_loses_nothing_either_way(
        tmp_path: Path, cut_broker: NetnsActiveMQ, fresh_db: str, client_orb: Any) -> None:
    state = tmp_path / "state"
    state.mkdir()
    server = NsjmsServer(state_dir=state, pg_dsn=fresh_db, broker_url=cut_broker.url, port=free_port())
    server.start()
    counter = Counter()
    reader = stomp.Connection12([cut_broker.client_url], auto_content_length=False)
    pushers: list[Pusher] = []
    producers: list[Producer] = []
    threads: list[threading.Thread] = []
    try:
        factory = client_orb.factory(server.corbaloc())
        bf = bridge_factory(client_orb, server)
        q_plain, q_t2, q_in, q_in_t2 = (unique_name(f"nsjms.test.mqcut.{k}") for k in ("plain", "t2", "in", "int2"))
        plain_channel, plain_cid = persistent_channel(factory)
        bf.create_bridge(channel_ep(BA.SOURCE, plain_cid), jms_ep(BA.SINK, q_plain))[0].start_bridge()
        _, _, out_t2_channel = t2_bridge(bf, factory, q_t2, T2_EVENTS, T2_TIMEOUT_S)
        in_channel, in_cid = persistent_channel(factory)                        # JMS -> channel, push style
        in_t2_channel, in_t2_cid = t2_channel(factory, events=T2_EVENTS)       # JMS -> channel in T2s (pulled)
        consumers = [structured_consumer(in_channel), structured_consumer(in_t2_channel)]
        bf.create_bridge(jms_ep(BA.SOURCE, q_in), channel_ep(BA.SINK, in_cid))[0].start_bridge()
        bf.create_bridge(jms_ep(BA.SOURCE, q_in_t2), channel_ep(BA.SINK, in_t2_cid, BA.PULL))[0].start_bridge()
        inbound = ("JMS -> channel", "JMS -> channel in T2")

        reader.set_listener("counter", counter)
        reader.connect(wait=True)
        reader.subscribe(f"/queue/{q_plain}", id="plain", ack="auto")
        reader.subscribe(f"/queue/{q_t2}", id="t2", ack="auto")
        pushers = [Pusher(structured_supplier(plain_channel), 1_000_000, PAD_BYTES),
                   Pusher(structured_supplier(out_t2_channel), 2_000_000)]
        producers = [Producer(cut_broker.client_url, q_in, 3_000_000),
                     Producer(cut_broker.client_url, q_in_t2, 4_000_000)]
        threads = [threading.Thread(target=p.run, daemon=True) for p in (*pushers, *producers)]
        for t in threads:
            t.start()

        def arrived(k: int) -> collections.Counter[int]:
            return collections.Counter(int({p.name: p.value.value() for p in ev.filterable_data}["n"])
                                       for ev in consumers[k].snapshot())

        def totals() -> list[int]:
            return [sum(counter.counts("plain").values()), sum(counter.counts("t2").values()),
                    *(len(arrived(k)) for k in range(len(consumers)))]

        assert wait_until(lambda: min(totals()) >= 10, 60), f"no traffic before the cut: {totals()}"
        assert _status(state)[0] == 0, _status(state)[1]

        at_cut = [len(p.ok) for p in pushers]
        cut_broker.node.cut()
        cut_at = time.monotonic()
        degraded: list[float] = []

        def noticed() -> bool:
            code, text = _status(state)
            if code == 8 and "broker unreachable" in text:
                degraded.append(time.monotonic() - cut_at)
            return bool(degraded)

        assert wait_until(noticed, NOTICE_BOUND_S + 30, interval=1.0), "nsjms status never said degraded"

        down_at: dict[int, float] = {}

        def bridges_down() -> bool:       # each bridge's own connection noticed (heart-beats), not only the probe
            rows = node_status(server).get("bridges", [])
            for b in rows:
                if b.get("reason") == "broker down":
                    down_at.setdefault(b["id"], round(time.monotonic() - cut_at, 1))
            return len(down_at) == 4

        assert wait_until(bridges_down, NOTICE_BOUND_S + 30, interval=0.5), \
            f"the bridges did not notice the cut: {[b.get('reason') for b in node_status(server).get('bridges', [])]}"
        bridges_noticed = time.monotonic() - cut_at
        time.sleep(3.0)                   # the bridges' reconnections fail for a while
        during = [len(p.ok) for p in pushers]
        cut_broker.node.restore()
        back_at = time.monotonic()

        assert wait_until(lambda: _status(state)[0] == 0, RESUME_BOUND_S + 60, interval=1.0), \
            f"still degraded after the link returned: {_status(state)[1]}"
        clean = time.monotonic() - back_at
        before = totals()
        assert wait_until(lambda: all(n > b + 5 for n, b in zip(totals(), before, strict=True)), RESUME_BOUND_S + 60), \
            f"traffic did not resume on every flow: {before} -> {totals()}"
        resumed = time.monotonic() - back_at
        for p in pushers:
            p.stop.set()
        for q in producers:
            q.stop.set()
        for t in threads:
            t.join(40)
            assert not t.is_alive()

        accepted = {"plain": set(pushers[0].ok), "t2": set(pushers[1].ok)}
        sent = [set(q.sent) for q in producers]

        def lost() -> dict[str, int]:
            return {**{s: len(accepted[s] - set(counter.counts(s))) for s in accepted},
                    **{inbound[k]: len(sent[k] - set(arrived(k))) for k in range(len(producers))}}

        assert wait_until(lambda: not any(lost().values()), SETTLE_S), f"lost: {lost()}"
        time.sleep(3.0)                   # anything delivered twice would arrive now
        in_counts = [arrived(k) for k in range(len(consumers))]
        report = {s: _dups(counter.counts(s), counter.dedupe_ids(s)) for s in accepted}
        in_dups = {inbound[k]: {i: n for i, n in c.items() if n > 1} for k, c in enumerate(in_counts)}
        print(f"broker cut {back_at - cut_at:.0f} s: status degraded {degraded[0]:.1f} s after the cut, every bridge "
              f"'broker down' {bridges_noticed:.1f} s after it (by bridge id: {down_at}); clean "
              f"{clean:.1f} s and every flow moving {resumed:.1f} s after the link returned; accepted during the cut "
              f"{[len(p.ok) - d for p, d in zip(pushers, during, strict=True)]} (total plain {len(accepted['plain'])}, "
              f"T2 {len(accepted['t2'])}); JMS -> channel sent {[len(x) for x in sent]}; duplicates plain "
              f"{report['plain'][0]}, T2 {report['t2'][0]}, JMS -> channel {[len(d) for d in in_dups.values()]}")
        assert not [f for p in pushers for f in p.failed], [f for p in pushers for f in p.failed][:5]
        assert all(len(p.ok) > d for p, d in zip(pushers, at_cut, strict=True)), "no push accepted during the cut"
        for s in accepted:
            assert set(counter.counts(s)) <= accepted[s], f"{s}: an event nobody pushed arrived"
        # docs/bridge.md "What is promised": without T2 at-least-once (a batch whose receipt the cut swallowed is sent
        # again, each message with its original's dedupe id), at most the batches in flight when the connection was lost
        assert report["plain"][0] <= PLAIN_DUPLICATES_MAX, f"plain: {report['plain'][0]} duplicates"
        assert not report["plain"][1], f"plain: duplicates without their original's dedupe id: {report['plain'][1]}"
        # in T2s: a duplicate only from a re-sent T2, with its original's dedupe id
        assert not report["t2"][1], f"T2: duplicates without their original's dedupe id: {report['t2'][1]}"
        for s in accepted:                # every message carries one, and no two events share one
            ids = counter.dedupe_ids(s)
            assert not [i for i in ids if "" in ids[i]], f"{s}: messages without a dedupe id"
            assert not _shared_ids(ids), f"{s}: events sharing a dedupe id: {list(_shared_ids(ids).items())[:3]}"
        for k, q in enumerate(producers):
            assert set(in_counts[k]) <= set(range(q.base, q.next)), f"{inbound[k]}: a message nobody sent arrived"
        assert not any(in_dups.values()), f"JMS -> channel duplicates: {in_dups}"
        assert degraded[0] <= NOTICE_BOUND_S, f"status said degraded {degraded[0]:.1f} s after the cut began"
        assert bridges_noticed <= NOTICE_BOUND_S, f"the bridges noticed the cut {bridges_noticed:.1f} s after it"
        assert resumed <= RESUME_BOUND_S, f"every flow moving again only {resumed:.1f} s after the link returned"
    finally:
        for p in pushers:
            p.stop.set()
        for q in producers:
            q.stop.set()
        cut_broker.node.restore()
        for t in threads:
            t.join(40)
        if reader.is_connected():
            reader.disconnect()
        server.stop()


#: The largest write a silent cut can leave waiting: a batch of big messages fills the socket's send buffer (nothing
#: is acknowledged), the writer blocks in ``sendall`` holding stomp.py's socket lock, and stomp.py's heart-beat thread,
#: which sends its heart-beat before it checks what it received, blocks behind it.
BLOCKING_WRITE = 16 * (1 << 20)


def test_a_write_blocked_by_a_silent_cut_still_ends_in_a_lost_connection(cut_broker: NetnsActiveMQ) -> None:
    """Before: a SEND written into a cut link whose send buffer was full blocked for as long as TCP retransmits
    (``tcp_retries2``: about 15 minutes), and with it the heart-beat check: the bridge never noticed the cut."""
    from router.jms.transport import Confirm, EncodedMessage, open_transport

    transport = open_transport(cut_broker.url)
    transport.connect()
    queue = "/queue/" + unique_name("nsjms.test.mqcut.blocked")
    body = b"b" * (1 << 20)
    outcome: list[str] = []

    def write() -> None:
        try:
            for _ in range(BLOCKING_WRITE // len(body)):
                transport.send_encoded(queue, EncodedMessage({}, body), persistent=False, confirm=Confirm.PIPELINED)
            outcome.append("all written")
        except Exception as exc:  # noqa: BLE001 — the expected end: the link is lost
            outcome.append(f"{type(exc).__name__}: {exc}")

    writer = threading.Thread(target=write, daemon=True)
    try:
        cut_broker.node.cut()
        cut_at = time.monotonic()
        writer.start()
        assert wait_until(lambda: not transport.is_connected(), NOTICE_BOUND_S + 10, interval=0.2), \
            "the transport never noticed the cut while a write was blocked"
        noticed = time.monotonic() - cut_at
        writer.join(10)
        print(f"blocked write: lost {noticed:.1f} s after the cut; the writer: {outcome}")
        assert not writer.is_alive(), "the blocked writer never returned"
        assert outcome and outcome[0] != "all written", outcome
        assert noticed <= NOTICE_BOUND_S
    finally:
        cut_broker.node.restore()
        transport.close()
        writer.join(30)
