"""T2 under fire (issue 8, "Show it"): a real node SIGKILLed again and again while events flow both ways inside
routing transactions, plus one broker SIGKILL and one PostgreSQL immediate stop; and one SIGKILL at every named
crash point (router.routing.crashpoints.POINTS).

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
import concurrent.futures
import contextlib
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
from router.node.services import EmbeddedActiveMQ, EmbeddedPostgres
from router.routing.crashpoints import ENV as CRASH_ENV
from router.routing.crashpoints import POINTS
from router.security.auth import Role, install_token

from bridgekit import JavaConsumer, JavaTool, bridge_factory, channel_ep, jms_ep
from conftest import ENDPOINTS_FILE, START_TIMEOUT_S, TEST_ADMIN_TOKEN, ClientOrb, NsjmsServer, restart_port
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
READER_LIFETIME_S = 3600            # the Java consumer's own deadline (it is stopped at the end of the module)
PERSISTENT = CosNotification.Persistent


# ------------------------------------------------------------------------------------------------------ the node
@dataclass
class CrashServer(NsjmsServer):
    """``nsjms serve`` with an optional crash point armed (``NSJMS_CRASH_AT``) for its next start."""

    crash_at: str = ""

    def launch(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "server already running"
        (self.state_dir / ENDPOINTS_FILE).unlink(missing_ok=True)
        install_token(self.state_dir, TEST_ADMIN_TOKEN, Role.OPERATOR)  # the test process is an operator (issue 30)
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
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.proc.wait(timeout) is not None
        return False


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

    def allowed(self) -> int:
        """Events handed to the feeder so far (pushed or still to push): the next test's events start here."""
        with self.cond:
            return self.limit

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


_parsed: dict[int, list[tuple[int, float]]] = {}


def consumer_ids(consumer: StructuredPushConsumer) -> list[tuple[int, float]]:
    """(``n``, arrival time) of every event the consumer received, in order. The record only grows: events
    parsed before are kept, so polling it while thousands of events arrive costs little of the CPU the node
    shares with the test."""
    done = _parsed.setdefault(id(consumer), [])
    with consumer._cond:
        events, times = consumer.items[len(done):], consumer.times[len(done):]
    done += [(int({p.name: p.value.value() for p in ev.filterable_data}["n"]), t)
             for ev, t in zip(events, times, strict=True)]
    return list(done)


# --------------------------------------------------------------------------------------------------- the rig
@dataclass
class Route:
    queue: str
    bid: int
    channel: Any


@dataclass
class Span:
    """One test's traffic: outbound events [out_lo, out_hi), inbound ids [in_lo, in_hi), local ids
    [local_lo, local_hi); the node kills recorded before it; the inbox rows of the T2 bridge at its start."""

    out_lo: int
    in_lo: int
    local_lo: int
    kills_before: int
    inbox_before: int
    out_hi: int = 0
    in_hi: int = 0
    local_hi: int = 0

    def close(self, rig: T2Rig) -> None:
        assert rig.feeder is not None
        self.out_hi, self.in_hi, self.local_hi = rig.feeder.allowed(), rig.produced_in, rig.produced_local

    def got_in(self, rig: T2Rig) -> int:
        """This test's inbound ids at the consumer so far (each once)."""
        return len({i for i, _ in consumer_ids(rig.consumer) if i >= self.in_lo})

    def missing_in(self, rig: T2Rig) -> set[int]:
        return set(range(self.in_lo, self.in_hi)) - {i for i, _ in consumer_ids(rig.consumer)}

    def missing_local(self, rig: T2Rig) -> set[int]:
        return set(range(self.local_lo, self.local_hi)) - {i for i, _ in consumer_ids(rig.local_consumer)}


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
    down_since: float | None = None     # the node died (or hung) at this time and is not ready again yet
    restart_s: float = 0.0               # time spent in restart_node (for the printed time split)
    faults: list[tuple[float, float]] = field(default_factory=list)  # broker SIGKILL / PostgreSQL stop windows
    jms_seen: list[dict[str, Any]] = field(default_factory=list)      # every outbound message read so far
    reader: JavaConsumer | None = None   # the Java JMS consumer of the outbound queue (one JVM for the module)
    read_upto: int = 0                   # reader.messages already in jms_seen
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
        """Start again; the fault window (killed .. ready again) is recorded once the node is ready. A start that
        fails (the test fails) leaves the window open: the next start that gets ready closes it, so a copy pushed
        before this kill and again after that later start is still seen as straddling a crash."""
        self.server.crash_at = ""
        self.down_since = killed_at if self.down_since is None else min(self.down_since, killed_at)
        t = time.monotonic()
        try:
            self.server.start()
        finally:
            self.restart_s += time.monotonic() - t
        self.kills.append((self.down_since, time.monotonic()))
        self.down_since = None

    def stop_node(self) -> None:
        """SIGTERM (SIGKILL after the stop timeout). A node that had to be SIGKILLed, or that was not ready (a
        failed start left it hanging), is a crash: the window stays open until the next start is ready."""
        t = time.monotonic()
        hung = self.down_since is not None
        was_running = self.server.running()
        code = self.server.stop()
        if was_running and (code is None or hung):
            self.down_since = t if self.down_since is None else self.down_since

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
    def begin(self) -> Span:
        """The start of one test's traffic: its event numbers start where the previous test's ended (whether
        that test passed or not), so each test counts its own events only."""
        assert self.feeder is not None
        return Span(self.feeder.allowed(), self.produced_in, self.produced_local, len(self.kills),
                    self.inbox_rows())

    def inbox_rows(self) -> int:
        assert self.inb is not None
        return self.sql("SELECT count(*) FROM nsjms_inbox WHERE bridge_id = %s", self.inb.bid)

    def settle(self, span: Span, timeout: float = SETTLE_TIMEOUT_S) -> None:
        """Wait until every event of ``span`` was routed and every T2 ended: its pushes accepted, each of its
        inbound ids at its consumer, nothing queued in any channel, no prepared branch, the outbox empty (rows
        of a T2 are purged only after its END: no re-send can follow)."""
        assert self.feeder is not None
        state: dict[str, Any] = {}

        def done() -> bool:
            state.update(accepted=self.feeder.accepted() if self.feeder else 0,
                         inbound=len(span.missing_in(self)), local=len(span.missing_local(self)))
            try:
                state.update(queued=self.sql("SELECT count(*) FROM nsjms_queue"), prepared=self.prepared(),
                             outbox=self.sql("SELECT count(*) FROM nsjms_outbox"))
            except psycopg.Error as exc:
                state["db"] = str(exc)
                return False
            return bool(state["accepted"] >= span.out_hi and not state["inbound"] and not state["local"]
                        and state["queued"] == 0 and state["prepared"] == 0 and state["outbox"] == 0)

        assert wait_until(done, timeout, 0.2), \
            f"not settled within {timeout:.0f} s (inbound/local: ids still missing): {state}"

    def jms_messages(self) -> list[dict[str, Any]]:
        """Every message the outbound queue ever held: those read before, and those on it now (the Java client
        reads until a sentinel sent after settling). One client for the module (one JVM start, not one per
        test), ended only after a sentinel it printed: it acknowledges each message after printing it."""
        assert self.out is not None
        if self.reader is None or self.reader.proc.poll() is not None:
            if self.reader is not None:                     # ended (its deadline): keep what it read
                self.reader.stop()
            self.reader = self.java.consume_async("queue", self.out.queue, 10**7, READER_LIFETIME_S)
            self.read_upto = 0
        reader = self.reader
        sentinel = f"end-{uuid.uuid4().hex[:8]}"
        parts = urlsplit(self.broker.url)
        conn = stomp.Connection12([(parts.hostname, parts.port)], auto_content_length=False)
        conn.connect(wait=True)
        conn.send(f"/queue/{self.out.queue}", "sentinel", headers={"persistent": "true", "sentinel": sentinel,
                                                                   "receipt": "s"})
        conn.disconnect(receipt="d")

        def seen() -> bool:
            return any(bool(m["properties"].get("sentinel", {}).get("value") == sentinel)
                       for m in reader.messages[self.read_upto:])
        assert wait_until(seen, 300, 0.1), f"the sentinel did not arrive ({reader.count()} messages read)"
        with reader._cond:
            new, self.read_upto = reader.messages[self.read_upto:], len(reader.messages)
        self.jms_seen += [m for m in new if "sentinel" not in m["properties"]]
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
    pg = EmbeddedPostgres(base, restart_port())
    openwire = restart_port()
    broker = EmbeddedActiveMQ(base, restart_port(), openwire, die_with_parent=True)
    state = base / "state"
    state.mkdir()
    server: CrashServer | None = None
    rig: T2Rig | None = None
    try:
        # Both at once. The broker from this thread: it dies with the thread that started it (PDEATHSIG).
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            started_pg = pool.submit(pg.start)
            broker.start()
            dsn = started_pg.result()
        server = CrashServer(state_dir=state, pg_dsn=dsn, broker_url=broker.url, port=restart_port())
        server.start()
        rig = T2Rig(base, pg, broker, server, java_tool.with_url(f"tcp://127.0.0.1:{openwire}"), client_orb)
        rig.setup_routes()
        yield rig
        if rig.feeder is not None:
            rig.feeder.stop()
    finally:
        if rig is not None and rig.reader is not None:
            rig.reader.stop()
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


def count_out(messages: list[dict[str, Any]], ids: range, repushed: collections.Counter[int]) -> OutCount:
    """The messages of events ``ids`` (another test's events are that test's to count)."""
    by_id: dict[int, list[str]] = collections.defaultdict(list)
    for m in messages:
        i = int(m["properties"]["$event_name"]["value"][1:])
        if i in ids:
            by_id[i].append(m["properties"]["nsjms_dedupe_id"]["value"])
    lost = sorted(set(ids) - set(by_id))
    window = sum(len(d) - len(set(d)) for d in by_id.values())
    repush = 0
    unexplained: dict[int, list[str]] = {}
    for i, dedupe in by_id.items():
        extra = len(set(dedupe)) - 1
        if extra and extra <= repushed.get(i, 0):
            repush += extra
        elif extra:
            unexplained[i] = dedupe
    return OutCount(lost, window, repush, unexplained, sum(map(len, by_id.values())))


@dataclass
class InCount:
    lost: list[int]
    dups: dict[int, int]
    unexplained: list[int]


def count_in(received: list[tuple[int, float]], ids: range, faults: list[tuple[float, float]]) -> InCount:
    """Of the events ``ids``: duplicates at the consumer are explained only by a fault window (node killed .. ready
    again, broker or PostgreSQL down .. up) between the first copy and the second: the channel pushed the event to
    its consumer and could not record the delivery (its delivery to a consumer is outside T2; at-least-once
    across a crash). One copy more per such window at most: three copies are never explained.

    A kill whose restart failed (the node hung and was stopped by the next test) counts until the next start that
    got ready (:meth:`T2Rig.restart_node`): in the CI run of 94037b0, event 856 was pushed just before the
    kill whose restart hung (the start deadlock fixed with this test's return) and again after the next test
    restarted the node; that kill's window was never recorded, so the rule called a promised duplicate
    unexplained. (The run's other duplicates, 43, 360, 674 and 812, fit the kill schedule as one per earlier
    kill, and 856 as the fifth kill's: the one whose restart hung.) The rule is not wider than the
    guarantee: one extra copy, across a fault only; the inbox is checked to hold exactly one row per message."""
    received = [(i, t) for i, t in received if i in ids]
    counts = collections.Counter(i for i, _ in received)
    lost = sorted(set(ids) - set(counts))
    dups = {i: c for i, c in counts.items() if c > 1}
    unexplained = []
    for i in dups:
        times = sorted(t for j, t in received if j == i)
        if dups[i] > 2 or not any(times[0] <= end and times[-1] >= start for start, end in faults):
            unexplained.append(i)
    return InCount(lost, dups, unexplained)


# ------------------------------------------------------------------------------------------------ the tests
def test_crash_loop(t2rig: T2Rig) -> None:
    rig, rnd = t2rig, random.Random(SEED)
    assert rig.feeder is not None and rig.inb is not None and rig.out is not None
    chunk = max(1, N_EVENTS // N_KILLS)
    broker_at, pg_at = N_KILLS // 3, (2 * N_KILLS) // 3
    span = rig.begin()
    out_base, in_base = span.out_lo, span.in_lo
    print(f"\ncrash loop: {N_EVENTS} events each way, {N_KILLS} node SIGKILLs, seed {SEED}")
    t_loop, restart_before, faults_s = time.monotonic(), rig.restart_s, 0.0
    for k in range(N_KILLS):
        upto = min(N_EVENTS, (k + 1) * chunk)
        rig.produce_in(in_base + upto)
        rig.feeder.allow(out_base + upto)
        before_in = span.got_in(rig)
        before_out = rig.feeder.accepted()
        want_in = min(upto, before_in + rnd.randint(1, chunk))
        want_out = min(out_base + upto, before_out + rnd.randint(1, chunk))
        assert wait_until(lambda w_in=want_in, w_out=want_out, f=rig.feeder:  # type: ignore[misc]
                          span.got_in(rig) >= w_in and f.accepted() >= w_out, PROGRESS_TIMEOUT_S, 0.02), \
            f"kill {k}: no progress (in {span.got_in(rig)}/{want_in}, out " \
            f"{rig.feeder.accepted()}/{want_out})\n{rig.server.stderr_path.read_text()[-3000:]}"
        t_fault = time.monotonic()
        if k == broker_at:
            rig.kill_broker()
        if k == pg_at:
            rig.stop_pg_immediately()
        faults_s += time.monotonic() - t_fault
        rig.kill_node()
    rig.produce_in(in_base + N_EVENTS)
    rig.feeder.allow(out_base + N_EVENTS)
    span.close(rig)
    t_settle = time.monotonic()
    rig.settle(span)
    settle_s, loop_s = time.monotonic() - t_settle, t_settle - t_loop

    out = count_out(rig.jms_messages(), range(span.out_lo, span.out_hi), rig.feeder.repushed)
    inbound = count_in(consumer_ids(rig.consumer), range(span.in_lo, span.in_hi), rig.kills + rig.faults)
    inbox = rig.inbox_rows() - span.inbox_before
    print(f"channel -> JMS: {out.messages} messages at the Java consumer for {N_EVENTS} events: "
          f"lost {len(out.lost)}, duplicates with the original's dedupe id (broker-commit window) "
          f"{out.window_dups}, second events from supplier re-pushes {out.repush_dups} "
          f"(re-pushed {sum(rig.feeder.repushed.values())}), unexplained {len(out.unexplained)}")
    print(f"JMS -> channel: {N_EVENTS + sum(inbound.dups.values()) - len(inbound.dups)} events at the CORBA "
          f"consumer for {N_EVENTS} messages: lost {len(inbound.lost)}, "
          f"duplicates {sum(inbound.dups.values()) - len(inbound.dups)} "
          f"(all from a push in flight at a kill: {not inbound.unexplained}), inbox rows {inbox}")
    print(f"node SIGKILLs {len(rig.kills) - span.kills_before}, broker SIGKILL 1, PostgreSQL immediate stop 1, "
          f"prepared left {rig.prepared()}, supplier errors {dict(rig.feeder.errors)}")
    print(f"time: kills {loop_s:.0f} s (node restarts {rig.restart_s - restart_before:.0f} s, broker and PostgreSQL "
          f"restarts {faults_s:.0f} s, the rest routing between kills), then the rest routed in {settle_s:.0f} s")
    assert len(rig.kills) - span.kills_before >= 20 or N_KILLS < 20
    assert not out.lost, f"channel -> JMS lost {len(out.lost)}: {out.lost[:20]}"
    assert not out.unexplained, \
        f"channel -> JMS duplicates with another dedupe id: {dict(list(out.unexplained.items())[:5])}"
    assert not inbound.lost, f"JMS -> channel lost {len(inbound.lost)}: {inbound.lost[:20]}"
    assert inbox == N_EVENTS, "each inbound message claimed exactly once in the inbox"
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
    """SIGKILL at ``point`` once (NSJMS_CRASH_AT), restart on the same state, and check the invariant on this
    test's own events (another test's failure, or its events still in flight, do not count here)."""
    rig = t2rig
    assert rig.feeder is not None and rig.inb is not None and rig.local is not None
    rig.stop_node()
    span = rig.begin()
    first = RECOVERY_POINTS.get(point)
    rig.server.crash_at = first or point
    rig.server.start()
    if first is None:
        rig.produce_in(rig.produced_in + PER_POINT)
        rig.produce_local(rig.produced_local + PER_POINT)
    # (a recovery point needs an OUTBOUND T2 left to finish: the inbound one's ack branch needs no re-send)
    rig.feeder.allow(span.out_lo + PER_POINT)
    assert rig.server.wait_death(PROGRESS_TIMEOUT_S), f"{first or point} was not reached"
    killed_at = time.monotonic()
    rig.down_since = killed_at if rig.down_since is None else rig.down_since
    if first is not None:
        rig.server.crash_at = point
        died = not rig.server.start_or_die()
        if not died:          # re-sends run in the housekeeping thread once the node is up
            assert rig.server.wait_death(PROGRESS_TIMEOUT_S), f"{point} was not reached in recovery"
    rig.restart_node(killed_at)
    if first is not None:
        rig.produce_in(rig.produced_in + PER_POINT)
        rig.produce_local(rig.produced_local + PER_POINT)
    span.close(rig)
    rig.settle(span)
    out = count_out(rig.jms_messages(), range(span.out_lo, span.out_hi), rig.feeder.repushed)
    inbound = count_in(consumer_ids(rig.consumer), range(span.in_lo, span.in_hi), rig.kills + rig.faults)
    local = count_in(consumer_ids(rig.local_consumer), range(span.local_lo, span.local_hi), rig.kills + rig.faults)
    inbox = rig.inbox_rows() - span.inbox_before
    print(f"\n{point}: out lost {len(out.lost)} window-dups {out.window_dups} repush-dups {out.repush_dups}; "
          f"in lost {len(inbound.lost)} dups {len(inbound.dups)}; local lost {len(local.lost)} dups "
          f"{len(local.dups)}; inbox +{inbox} for {span.in_hi - span.in_lo}; prepared {rig.prepared()}")
    assert not out.lost and not out.unexplained, (out.lost[:10], out.unexplained)
    assert not inbound.lost and not inbound.unexplained, (inbound.lost[:10], inbound.unexplained)
    assert not local.lost and not local.unexplained, (local.lost[:10], local.unexplained)
    assert inbox == span.in_hi - span.in_lo, "each inbound message claimed exactly once in the inbox"
    assert rig.prepared() == 0
