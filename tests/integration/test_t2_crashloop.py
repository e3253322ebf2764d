"""T2 under fire (issue 8, "Show it"): a real node SIGKILLed again and again while events flow both ways inside
routing transactions, plus one broker SIGKILL and one PostgreSQL immediate stop; and one SIGKILL at every named
crash point (router.crashpoints.POINTS).

The rig is the node's own: a PostgreSQL cluster (so it can be stopped with ``pg_ctl stop -m immediate``), an
ActiveMQ broker (so it can be SIGKILLed), and ``nsjms serve`` restarted on the same state directory each time.
Routes, all with EnableTransaction:

* channel → JMS: a Persistent channel, a bridge to a queue with ``enable_transaction(TX_EVENTS, ...)``; a
  standard-stub CORBA supplier pushes events ``n`` = 0..N-1; counted at the end by the Java JMS client (OpenWire)
  by ``$event_name`` and ``nsjms_dedupe_id``;
* JMS → channel: messages with header ``n`` = 0..N-1 sent to a queue over STOMP; the channel (EnableTransaction,
  TransactionEvents) pulls from the bridge; counted by a standard-stub CORBA push consumer.

What is asserted (and printed):

* 0 lost, both ways;
* JMS → channel: each message stored once (the inbox holds exactly N ids for the bridge, nothing is still queued)
  and 0 duplicates at the consumer, except a push that was in flight to the consumer when the node was killed
  (the channel's delivery to its consumer is outside T2): such a copy must have first arrived before that kill;
* channel → JMS: a repeated message carries its original's dedupe id (the broker-commit window: the broker
  committed, the END record did not make it, recovery re-sent the outbox rows); a message with two dedupe ids is
  allowed only for an event the supplier pushed again because its push failed with an unknown outcome at a kill
  (a second event in the channel, outside T2), and is counted apart;
* no prepared transaction left (``pg_prepared_xacts``), the outbox empty once every T2 ended.
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
import stomp

from omniORB import CORBA

import CosNotification

from idl.generated import CosBridgeAdmin as BA
from idl.generated import NsjmsAdmin
from router.crashpoints import ENV as CRASH_ENV
from router.crashpoints import POINTS
from router.services import EmbeddedActiveMQ, EmbeddedPostgres

from bridgekit import JavaTool, bridge_factory, channel_ep, jms_ep
from conftest import ENDPOINTS_FILE, START_TIMEOUT_S, ClientOrb, NsjmsServer, free_port
from stdclients import (
    Form,
    PushSupplierClient,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    long_,
    make_event,
    obtain_proxy_consumer,
    obtain_proxy_supplier,
    prop,
    short,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

N_EVENTS = int(os.environ.get("NSJMS_T2_CRASHLOOP_EVENTS", "5000"))
N_KILLS = int(os.environ.get("NSJMS_T2_CRASHLOOP_KILLS", "20"))
SEED = int(os.environ.get("NSJMS_T2_CRASHLOOP_SEED", str(random.randrange(1 << 30))))
TX_EVENTS = 50
TX_TIMEOUT_S = 30
PER_POINT = 60                      # events each way for one crash point
PROGRESS_TIMEOUT_S = 120.0
SETTLE_TIMEOUT_S = 300.0
PERSISTENT = CosNotification.Persistent


# ------------------------------------------------------------------------------------------------------ the node
@dataclass
class CrashServer(NsjmsServer):
    """``nsjms serve`` with an optional crash point armed (``NSJMS_CRASH_AT``) for its next start."""

    crash_at: str = ""

    def launch(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "server already running"
        (self.state_dir / ENDPOINTS_FILE).unlink(missing_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", NSJMS_POSTGRES_DSN=self.pg_dsn)
        env.pop(CRASH_ENV, None)
        if self.crash_at:
            env[CRASH_ENV] = self.crash_at
        with open(self.state_dir / "server.stdout.log", "ab") as out, open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)

    def start(self, timeout: float = START_TIMEOUT_S) -> dict[str, Any]:
        self.launch()
        if not self.start_or_die(timeout, launch=False):
            self._fail(f"nsjms serve exited with code {self.proc.returncode if self.proc else '?'} before it "
                       "was ready")
        assert self.endpoints is not None
        return self.endpoints

    def _fail(self, why: str) -> None:
        """With the Python stacks of a node that hangs (py-spy, when installed), to show where."""
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if self.proc is not None and self.proc.poll() is None and Path(spy).exists():
            dump = subprocess.run([spy, "dump", "--pid", str(self.proc.pid)], capture_output=True, text=True,
                                  timeout=60, check=False)
            why += "\n--- py-spy dump of the node ---\n" + (dump.stdout or dump.stderr)[-12000:]
        super()._fail(why)

    def start_or_die(self, timeout: float = START_TIMEOUT_S, *, launch: bool = True) -> bool:
        """Start; True once ready, False if it died first (a crash point armed inside recovery at start)."""
        if launch:
            self.launch()
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            data = self._read_endpoints()
            if data is not None and data.get("pid") == self.proc.pid:
                self.endpoints = data
                return True
            time.sleep(0.05)
        self._fail(f"nsjms serve neither got ready nor died within {timeout:.0f} s")
        return False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_death(self, timeout: float) -> bool:
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True


# ------------------------------------------------------------------------------------------------- the clients
class Feeder:
    """Pushes events 0..limit-1 in order from a thread. A push that fails with an outcome other than
    COMPLETED_NO may have been stored: the event is pushed again once the node answers, and counted in
    ``repushed`` (a second event in the channel, outside T2)."""

    def __init__(self, client: PushSupplierClient) -> None:
        self.client = client
        self.next = 0
        self.limit = 0
        self.repushed: collections.Counter[int] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.cond = threading.Condition()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="t2-feeder", daemon=True)
        self.thread.start()

    def allow(self, limit: int) -> None:
        with self.cond:
            self.limit = max(self.limit, limit)
            self.cond.notify_all()

    def accepted(self) -> int:
        with self.cond:
            return self.next

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        self.thread.join(30)

    def _run(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.stopped or self.next < self.limit)
                if self.stopped:
                    return
                i = self.next
            try:
                self.client.push_one(make_event(i, reliability=PERSISTENT))
            except CORBA.SystemException as exc:
                self.errors[type(exc).__name__] += 1
                if getattr(exc, "completed", CORBA.COMPLETED_MAYBE) != CORBA.COMPLETED_NO:
                    self.repushed[i] += 1
                time.sleep(0.1)       # the node is down or restarting: try the same event again
                continue
            with self.cond:
                self.next = i + 1
                self.cond.notify_all()


def produce(url: str, queue: str, ids: range) -> None:
    """Persistent STOMP messages with header ``n``, in one broker transaction per 500 (durable on return)."""
    if not ids:
        return
    parts = urlsplit(url)
    conn = stomp.Connection12([(parts.hostname, parts.port)], auto_content_length=False)
    done = threading.Event()

    class Receipts(stomp.ConnectionListener):  # type: ignore[misc]
        def on_receipt(self, frame: Any) -> None:
            done.set()

    conn.set_listener("r", Receipts())
    conn.connect(wait=True)
    try:
        for start in range(ids.start, ids.stop, 500):
            done.clear()
            tx = conn.begin()
            for i in range(start, min(start + 500, ids.stop)):
                conn.send(f"/queue/{queue}", f"m{i}", headers={"persistent": "true", "n": str(i)}, transaction=tx)
            conn.commit(tx, headers={"receipt": f"c{start}"})
            assert done.wait(60), "no receipt for the COMMIT of the inbound messages"
    finally:
        conn.disconnect()


def consumer_ids(consumer: StructuredPushConsumer) -> list[tuple[int, float]]:
    events = consumer.snapshot()
    times = list(consumer.times)[:len(events)]
    return [(int({p.name: p.value.value() for p in ev.filterable_data}["n"]), t)
            for ev, t in zip(events, times, strict=True)]


# --------------------------------------------------------------------------------------------------- the rig
@dataclass
class Route:
    queue: str
    bid: int
    channel: Any


@dataclass
class T2Rig:
    base: Path
    pg: EmbeddedPostgres
    broker: EmbeddedActiveMQ
    server: CrashServer
    java: JavaTool
    orb: ClientOrb
    out: Route | None = None
    inb: Route | None = None
    local: Route | None = None
    feeder: Feeder | None = None
    consumer: StructuredPushConsumer = field(default_factory=StructuredPushConsumer)
    local_consumer: StructuredPushConsumer = field(default_factory=StructuredPushConsumer)
    produced_in: int = 0
    produced_local: int = 0
    kills: list[tuple[float, float]] = field(default_factory=list)   # (killed at, ready again at), monotonic
    faults: list[tuple[float, float]] = field(default_factory=list)  # broker SIGKILL / PostgreSQL stop windows
    jms_seen: list[dict[str, Any]] = field(default_factory=list)      # every outbound message read so far
    bf: Any = None

    @property
    def dsn(self) -> str:
        return self.server.pg_dsn

    def sql(self, query: str, *args: Any) -> int:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute(query, args).fetchone()
            assert row is not None
            return int(row[0])

    def prepared(self) -> int:
        return self.sql("SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()")

    # -- node -----------------------------------------------------------------------------------------------
    def kill_node(self) -> None:
        t = time.monotonic()
        self.server.kill(signal.SIGKILL)
        self.restart_node(t)

    def restart_node(self, killed_at: float) -> None:
        self.server.crash_at = ""
        self.server.start()
        self.kills.append((killed_at, time.monotonic()))

    def kill_broker(self) -> None:
        t = time.monotonic()
        pid = int(self.broker.pid_file.read_text().strip())
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 20)
        self.broker.stop()                    # reaps the child
        self.broker.start()                   # same directory and ports: the store keeps what it confirmed
        self.faults.append((t, time.monotonic()))

    def stop_pg_immediately(self) -> None:
        t = time.monotonic()
        self.pg._pg_ctl("stop", "-m", "immediate")   # no shutdown checkpoint: crash recovery at the next start
        self.pg.start()
        self.faults.append((t, time.monotonic()))

    # -- routes ---------------------------------------------------------------------------------------------
    def setup_routes(self) -> None:
        factory = self.orb.factory(self.server.ior())
        self.bf = bridge_factory(self.orb, self.server)
        qos = [prop("EventReliability", short(PERSISTENT)), prop("ConnectionReliability", short(PERSISTENT))]
        channel, cid = factory.create_channel(qos, [])
        queue = f"t2loop.out.{uuid.uuid4().hex[:8]}"
        bridge, bid = self.bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, queue))
        managed = bridge._narrow(NsjmsAdmin.ManagedBridge)
        managed.enable_transaction(TX_EVENTS, TX_TIMEOUT_S)
        bridge.start_bridge()
        self.out = Route(queue, bid, channel)
        proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
        client = PushSupplierClient(proxy, Form.STRUCTURED)
        client.connect()
        self.feeder = Feeder(client)

        tq = [prop("EnableTransaction", CORBA.Any(CORBA.TC_boolean, True))]
        admin = [prop("TransactionEvents", long_(TX_EVENTS)),
                 prop("TransactionTimeout", CORBA.Any(CORBA.TC_ulong, TX_TIMEOUT_S))]
        self.inb = self._inbound(factory, tq, admin, "t2loop.in", self.consumer)
        self.local = self._inbound(factory, qos, [], "t2loop.local", self.local_consumer)

    def _inbound(self, factory: Any, qos: list[Any], admin: list[Any], prefix: str,
                 consumer: StructuredPushConsumer) -> Route:
        channel, cid = factory.create_channel(qos, admin)
        proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
        connect_push_consumer(proxy, Form.STRUCTURED, consumer)
        queue = f"{prefix}.{uuid.uuid4().hex[:8]}"
        bridge, bid = self.bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, BA.PULL))
        bridge.start_bridge()
        return Route(queue, bid, channel)

    def produce_in(self, upto: int) -> None:
        assert self.inb is not None
        produce(self.broker.url, self.inb.queue, range(self.produced_in, upto))
        self.produced_in = max(self.produced_in, upto)

    def produce_local(self, upto: int) -> None:
        assert self.local is not None
        produce(self.broker.url, self.local.queue, range(self.produced_local, upto))
        self.produced_local = max(self.produced_local, upto)

    # -- settling and counting --------------------------------------------------------------------------------
    def settle(self, out_n: int) -> None:
        """Wait until every event was routed and every T2 ended: all pushes accepted, every inbound id at its
        consumer, nothing queued in any channel, no prepared branch, the outbox empty (rows of a T2 are purged
        only after its END: no re-send can follow)."""
        assert self.feeder is not None
        state: dict[str, Any] = {}

        def done() -> bool:
            state.update(accepted=self.feeder.accepted() if self.feeder else 0,
                         inbound=len({i for i, _ in consumer_ids(self.consumer)}),
                         local=len({i for i, _ in consumer_ids(self.local_consumer)}))
            try:
                state.update(queued=self.sql("SELECT count(*) FROM nsjms_queue"), prepared=self.prepared(),
                             outbox=self.sql("SELECT count(*) FROM nsjms_outbox"))
            except psycopg.Error as exc:
                state["db"] = str(exc)
                return False
            return bool(state["accepted"] >= out_n and state["inbound"] >= self.produced_in
                    and state["local"] >= self.produced_local
                    and state["queued"] == 0 and state["prepared"] == 0 and state["outbox"] == 0)

        assert wait_until(done, SETTLE_TIMEOUT_S, 0.5), f"not settled within {SETTLE_TIMEOUT_S:.0f} s: {state}"

    def jms_messages(self) -> list[dict[str, Any]]:
        """Every message the outbound queue ever held: those read before, and those on it now (the Java client
        reads until a sentinel sent after settling)."""
        assert self.out is not None
        sentinel = f"end-{uuid.uuid4().hex[:8]}"
        parts = urlsplit(self.broker.url)
        conn = stomp.Connection12([(parts.hostname, parts.port)], auto_content_length=False)
        conn.connect(wait=True)
        conn.send(f"/queue/{self.out.queue}", "sentinel", headers={"persistent": "true", "sentinel": sentinel,
                                                                   "receipt": "s"})
        conn.disconnect(receipt="d")
        reader = self.java.consume_async("queue", self.out.queue, 10**7, 600)
        try:
            def seen() -> bool:
                return any(bool(m["properties"].get("sentinel", {}).get("value") == sentinel)
                           for m in list(reader.messages))
            assert wait_until(seen, 300, 0.2), f"the sentinel did not arrive ({reader.count()} messages read)"
        finally:
            reader.stop()
        self.jms_seen += [m for m in reader.messages if "sentinel" not in m["properties"]]
        return list(self.jms_seen)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@pytest.fixture(scope="module")
def t2rig(client_orb: ClientOrb, java_tool: JavaTool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[T2Rig]:
    base = Path(tempfile.mkdtemp(prefix="nsjms-t2loop-"))
    base.chmod(0o755)                      # the postgres OS user must reach the cluster directory
    pg = EmbeddedPostgres(base, free_port())
    openwire = free_port()
    broker = EmbeddedActiveMQ(base, free_port(), openwire, die_with_parent=True)
    state = base / "state"
    state.mkdir()
    server: CrashServer | None = None
    try:
        dsn = pg.start()
        broker.start()
        server = CrashServer(state_dir=state, pg_dsn=dsn, broker_url=broker.url, port=free_port())
        server.start()
        rig = T2Rig(base, pg, broker, server, java_tool.with_url(f"tcp://127.0.0.1:{openwire}"), client_orb)
        rig.setup_routes()
        yield rig
        if rig.feeder is not None:
            rig.feeder.stop()
    finally:
        if server is not None:
            server.stop()
            keep = tmp_path_factory.mktemp("t2loop-logs")
            for log in state.glob("server.*.log"):
                shutil.copy(log, keep / log.name)          # the node's logs outlive the rig (pytest's tmp dir)
            print(f"\nT2 rig: the node's logs are in {keep}")
        broker.stop()
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


# ----------------------------------------------------------------------------------------------- the checks
@dataclass
class OutCount:
    lost: list[int]
    window_dups: int            # same dedupe id again: the broker-commit window
    repush_dups: int            # another dedupe id for an event the supplier pushed again
    unexplained: dict[int, list[str]]
    messages: int


def count_out(messages: list[dict[str, Any]], n: int, repushed: collections.Counter[int]) -> OutCount:
    by_id: dict[int, list[str]] = collections.defaultdict(list)
    for m in messages:
        i = int(m["properties"]["$event_name"]["value"][1:])
        by_id[i].append(m["properties"]["nsjms_dedupe_id"]["value"])
    lost = sorted(set(range(n)) - set(by_id))
    window = sum(len(d) - len(set(d)) for d in by_id.values())
    repush = 0
    unexplained: dict[int, list[str]] = {}
    for i, dedupe in by_id.items():
        extra = len(set(dedupe)) - 1
        if extra and extra <= repushed.get(i, 0):
            repush += extra
        elif extra:
            unexplained[i] = dedupe
    return OutCount(lost, window, repush, unexplained, len(messages))


@dataclass
class InCount:
    lost: list[int]
    dups: dict[int, int]
    unexplained: list[int]


def count_in(received: list[tuple[int, float]], n: int, faults: list[tuple[float, float]]) -> InCount:
    """Duplicates at the consumer are explained only by a fault window (node killed .. ready again, broker or
    PostgreSQL down .. up) between the first copy and the second: the channel pushed the event to its consumer
    and could not record the delivery (its delivery to a consumer is outside T2)."""
    counts = collections.Counter(i for i, _ in received)
    lost = sorted(set(range(n)) - set(counts))
    dups = {i: c for i, c in counts.items() if c > 1}
    unexplained = []
    for i in dups:
        times = sorted(t for j, t in received if j == i)
        if dups[i] > 2 or not any(times[0] <= end and times[-1] >= start for start, end in faults):
            unexplained.append(i)
    return InCount(lost, dups, unexplained)


# ------------------------------------------------------------------------------------------------ the tests
def _progressed(rig: T2Rig, want_in: int, want_out: int) -> bool:
    return len(consumer_ids(rig.consumer)) >= want_in and rig.feeder is not None and rig.feeder.accepted() >= want_out


def test_crash_loop(t2rig: T2Rig) -> None:
    rig, rnd = t2rig, random.Random(SEED)
    assert rig.feeder is not None and rig.inb is not None and rig.out is not None
    chunk = max(1, N_EVENTS // N_KILLS)
    broker_at, pg_at = N_KILLS // 3, (2 * N_KILLS) // 3
    out_base, in_base = rig.feeder.accepted(), rig.produced_in
    kills_before = len(rig.kills)
    print(f"\ncrash loop: {N_EVENTS} events each way, {N_KILLS} node SIGKILLs, seed {SEED}")
    for k in range(N_KILLS):
        upto = min(N_EVENTS, (k + 1) * chunk)
        rig.produce_in(in_base + upto)
        rig.feeder.allow(out_base + upto)
        before_in = len(consumer_ids(rig.consumer))
        before_out = rig.feeder.accepted()
        want_in = min(in_base + upto, before_in + rnd.randint(1, chunk))
        want_out = min(out_base + upto, before_out + rnd.randint(1, chunk))
        assert wait_until(lambda w_in=want_in, w_out=want_out: _progressed(rig, w_in, w_out),  # type: ignore[misc]
                          PROGRESS_TIMEOUT_S, 0.02), \
            f"kill {k}: no progress (in {len(consumer_ids(rig.consumer))}/{want_in}, out " \
            f"{rig.feeder.accepted()}/{want_out})\n{rig.server.stderr_path.read_text()[-3000:]}"
        if k == broker_at:
            rig.kill_broker()
        if k == pg_at:
            rig.stop_pg_immediately()
        rig.kill_node()
    rig.produce_in(in_base + N_EVENTS)
    rig.feeder.allow(out_base + N_EVENTS)
    rig.settle(out_base + N_EVENTS)

    out = count_out(rig.jms_messages(), out_base + N_EVENTS, rig.feeder.repushed)
    inbound = count_in(consumer_ids(rig.consumer), in_base + N_EVENTS, rig.kills + rig.faults)
    inbox = rig.sql("SELECT count(*) FROM nsjms_inbox WHERE bridge_id = %s", rig.inb.bid)
    print(f"channel -> JMS: {out.messages} messages at the Java consumer for {out_base + N_EVENTS} events: "
          f"lost {len(out.lost)}, duplicates with the original's dedupe id (broker-commit window) "
          f"{out.window_dups}, second events from supplier re-pushes {out.repush_dups} "
          f"(re-pushed {sum(rig.feeder.repushed.values())}), unexplained {len(out.unexplained)}")
    print(f"JMS -> channel: {len(consumer_ids(rig.consumer))} events at the CORBA consumer for "
          f"{in_base + N_EVENTS} messages: lost {len(inbound.lost)}, "
          f"duplicates {sum(inbound.dups.values()) - len(inbound.dups)} "
          f"(all from a push in flight at a kill: {not inbound.unexplained}), inbox rows {inbox}")
    print(f"node SIGKILLs {len(rig.kills) - kills_before}, broker SIGKILL 1, PostgreSQL immediate stop 1, "
          f"prepared left {rig.prepared()}, supplier errors {dict(rig.feeder.errors)}")
    assert len(rig.kills) - kills_before >= 20 or N_KILLS < 20
    assert not out.lost, f"channel -> JMS lost {len(out.lost)}: {out.lost[:20]}"
    assert not out.unexplained, \
        f"channel -> JMS duplicates with another dedupe id: {dict(list(out.unexplained.items())[:5])}"
    assert not inbound.lost, f"JMS -> channel lost {len(inbound.lost)}: {inbound.lost[:20]}"
    assert inbox == in_base + N_EVENTS, "each inbound message claimed exactly once in the inbox"
    if inbound.unexplained:
        recv = consumer_ids(rig.consumer)
        t0 = min(t for _, t in recv)
        where = {i: [round(t - t0, 2) for j, t in recv if j == i] for i in inbound.unexplained[:10]}
        print(f"unexplained JMS -> channel duplicates (seconds since the first event): {where}; kills "
              f"{[(round(a - t0, 2), round(b - t0, 2)) for a, b in rig.kills]}; faults "
              f"{[(round(a - t0, 2), round(b - t0, 2)) for a, b in rig.faults]}")
    assert not inbound.unexplained, f"JMS -> channel duplicates outside any fault window: {inbound.unexplained[:20]}"
    assert rig.prepared() == 0


#: how to reach a crash point: (point armed first, if any, to leave recovery work), traffic that passes it
RECOVERY_POINTS = {"t2.recovery.after_pg_commit": "t2.after_decision",
                   "t2.recovery.after_resend": "t2.after_pg_commit"}


@pytest.mark.parametrize("point", sorted(POINTS))
def test_crash_point(t2rig: T2Rig, point: str) -> None:
    """SIGKILL at ``point`` once (NSJMS_CRASH_AT), restart on the same state, and check the invariant."""
    rig = t2rig
    assert rig.feeder is not None and rig.inb is not None and rig.local is not None
    out_n = rig.feeder.accepted() + PER_POINT
    rig.server.stop()
    first = RECOVERY_POINTS.get(point)
    rig.server.crash_at = first or point
    rig.server.start()
    if first is None:
        rig.produce_in(rig.produced_in + PER_POINT)
        rig.produce_local(rig.produced_local + PER_POINT)
    # (a recovery point needs an OUTBOUND T2 left to finish: the inbound one's ack branch needs no re-send)
    rig.feeder.allow(out_n)
    assert rig.server.wait_death(PROGRESS_TIMEOUT_S), f"{first or point} was not reached"
    killed_at = time.monotonic()
    if first is not None:
        rig.server.crash_at = point
        died = not rig.server.start_or_die()
        if not died:          # re-sends run in the housekeeping thread once the node is up
            assert rig.server.wait_death(PROGRESS_TIMEOUT_S), f"{point} was not reached in recovery"
        killed_at = time.monotonic()
    rig.restart_node(killed_at)
    if first is not None:
        rig.produce_in(rig.produced_in + PER_POINT)
        rig.produce_local(rig.produced_local + PER_POINT)
    rig.settle(out_n)
    out = count_out(rig.jms_messages(), out_n, rig.feeder.repushed)
    inbound = count_in(consumer_ids(rig.consumer), rig.produced_in, rig.kills + rig.faults)
    local = count_in(consumer_ids(rig.local_consumer), rig.produced_local, rig.kills + rig.faults)
    print(f"\n{point}: out lost {len(out.lost)} window-dups {out.window_dups} repush-dups {out.repush_dups}; "
          f"in lost {len(inbound.lost)} dups {len(inbound.dups)}; local lost {len(local.lost)}; "
          f"prepared {rig.prepared()}")
    assert not out.lost and not out.unexplained, (out.lost[:10], out.unexplained)
    assert not inbound.lost and not inbound.unexplained, (inbound.lost[:10], inbound.unexplained)
    assert not local.lost and not local.unexplained, (local.lost[:10], local.unexplained)
    assert rig.sql("SELECT count(*) FROM nsjms_inbox WHERE bridge_id = %s", rig.inb.bid) == rig.produced_in
    assert rig.prepared() == 0
