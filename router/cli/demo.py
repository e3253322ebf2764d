"""Visible demo traffic for the quick start: CORBA → channel → JMS queue → channel → CORBA, through two bridges.

It talks to the node only through its published ``endpoints.json`` and OMG IDL stubs (omniORB's COS stubs and the
interworking spec's ``CosBridgeAdmin``), as any client would:

1. channel *A* (persistent QoS) with a structured push supplier: telecom-style alarm events;
2. bridge 1: channel A → the ActiveMQ queue ``nsjms.demo.<state-dir tag>.<slot>`` (JMS messages a Java application
   could consume);
3. bridge 2: that queue → channel *B*;
4. a structured push consumer on channel B prints what arrives, JMS headers included.

Restartable: every run records its channels, bridges and queue in ``<state-dir>/demo.json`` with its pid. At start
the demo removes what earlier runs that are no longer running left behind (their bridges first, then their
channels), and any bridge from or to a ``nsjms.demo.*`` queue that no live run owns, whether or not its channel
still exists. A run that ends normally (count reached, Ctrl-C, SIGTERM from ``serve --demo``) removes its own
objects. Two demos at once on one node (or two nodes sharing a broker) use different queues: the queue name holds
a tag of the state directory and the lowest slot no live run uses. Each event carries the run's id
(``demoRun``); an event left in the queue by an earlier run is shown as such and not counted.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DEMO_QUEUE_PREFIX", "DemoResult", "queue_name", "run_demo"]

DEMO_QUEUE_PREFIX = "nsjms.demo."
RECORD = "demo.json"

Out = Callable[[str], None]


@dataclass
class DemoResult:
    """What one run did (``nsjms demo --json`` prints it)."""

    run: str
    queue: str
    channels: list[int] = field(default_factory=list)
    bridges: list[int] = field(default_factory=list)
    pushed: int = 0
    received: int = 0
    stale_received: int = 0
    removed_bridges: list[int] = field(default_factory=list)
    removed_channels: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def queue_name(state_dir: Path, slot: int) -> str:
    """``nsjms.demo.<10 hex of the state directory's real path>.<slot>``: distinct per node, reused per restart."""
    tag = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:10]
    return f"{DEMO_QUEUE_PREFIX}{tag}.{slot}"


# -- the record of runs (demo.json), under a file lock --------------------------------------------------------
@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    with open(state_dir / "demo.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_runs(state_dir: Path) -> dict[str, dict[str, Any]]:
    try:
        return dict(json.loads((state_dir / RECORD).read_text()).get("runs", {}))
    except (FileNotFoundError, json.JSONDecodeError, AttributeError):
        return {}


def _write_runs(state_dir: Path, runs: dict[str, dict[str, Any]]) -> None:
    from router.node.lifecycle import write_private

    write_private(state_dir / RECORD, json.dumps({"runs": runs}, indent=2, sort_keys=True) + "\n")


def _alive(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return pid != os.getpid() and b"demo" in cmdline


def live_runs(runs: dict[str, dict[str, Any]], alive: Callable[[int], bool] = _alive) -> dict[str, dict[str, Any]]:
    """The runs whose process still runs (decision only: ``alive`` is injected in tests)."""
    return {run: r for run, r in runs.items() if alive(int(r.get("pid", 0)))}


def free_slot(live: dict[str, dict[str, Any]]) -> int:
    used = {int(r.get("slot", -1)) for r in live.values()}
    return next(i for i in range(len(used) + 1) if i not in used)


# -- CORBA helpers ---------------------------------------------------------------------------------------------
def _event(n: int, run: str) -> Any:
    from omniORB import CORBA  # noqa: I001 — omniORB first: it puts the COS stubs on sys.path
    import CosNotification

    severity = ("minor", "major", "critical")[n % 3]
    header = CosNotification.EventHeader(
        CosNotification.FixedEventHeader(CosNotification.EventType("Telecom", "CommunicationsAlarm"), f"alarm-{n}"),
        [CosNotification.Property("Priority", CORBA.Any(CORBA.TC_short, n % 3))],
    )
    body = [CosNotification.Property("seq", CORBA.Any(CORBA.TC_long, n)),
            CosNotification.Property("severity", CORBA.Any(CORBA.TC_string, severity)),
            CosNotification.Property("managedObject", CORBA.Any(CORBA.TC_string, f"cell-{n % 7}")),
            CosNotification.Property("demoRun", CORBA.Any(CORBA.TC_string, run))]
    return CosNotification.StructuredEvent(header, body, CORBA.Any(CORBA.TC_string, f"link down on cell-{n % 7}"))


def _printer_servant(run: str, progress: Out | None, out: Out) -> Any:
    import CosNotifyComm__POA

    class Printer(CosNotifyComm__POA.StructuredPushConsumer):
        def __init__(self) -> None:
            self.count = 0
            self.stale = 0
            self.seen: set[int] = set()
            self.lock = threading.Lock()

        def push_structured_event(self, ev: Any) -> None:
            fields = {p.name: p.value.value() for p in ev.filterable_data}
            fixed = ev.header.fixed_header
            mine = fields.get("demoRun") == run
            with self.lock:
                if not mine:
                    self.stale += 1
                elif fields.get("seq") not in self.seen:  # a redelivery is shown, counted once
                    self.seen.add(int(fields.get("seq", -1)))
                    self.count += 1
            if progress is not None:
                via = f" via JMS {fields['JMSDestination']}" if "JMSDestination" in fields else ""
                stale = "" if mine else "  (left over from an earlier run)"
                progress(f"  <- received {fixed.event_name:>10}  {fixed.event_type.domain_name}/"
                         f"{fixed.event_type.type_name}  severity={fields.get('severity')}  "
                         f"object={fields.get('managedObject')}{via}{stale}")

        def disconnect_structured_push_consumer(self) -> None:
            out("demo: consumer disconnected by the channel")

        def offer_change(self, added: Any, removed: Any) -> None:
            pass

    return Printer()


def _endpoint_queue(ep: Any) -> str | None:
    conn = ep.connector
    return str(conn._v.destination_name) if conn._d._n == "JMS_MESSAGE" else None


def _endpoint_channel(ep: Any) -> int | None:
    conn = ep.connector
    return None if conn._d._n == "JMS_MESSAGE" else int(conn._v)


def _remove_leftovers(factory: Any, bf: Any, stale: dict[str, dict[str, Any]], live: dict[str, dict[str, Any]],
                      result: DemoResult, out: Out) -> None:
    """Destroy the bridges and channels of ended runs, and any demo-queue bridge no live run owns."""
    from omniORB import CORBA

    live_bridges = {int(b) for r in live.values() for b in r.get("bridges", [])}
    live_queues = {str(r.get("queue")) for r in live.values()}
    bridges = {int(b) for r in stale.values() for b in r.get("bridges", [])}
    channels = {int(c) for r in stale.values() for c in r.get("channels", [])}
    if bf is not None:
        for bid in bf.get_all_bridges():
            if bid in live_bridges or bid in bridges:
                continue
            try:
                bridge = bf.get_bridge_with_id(bid)
                ends = [bridge._get_end_point_receiver(), bridge._get_end_point_sender()]
            except CORBA.Exception:
                continue
            queues = [q for q in map(_endpoint_queue, ends) if q is not None]
            if any(q.startswith(DEMO_QUEUE_PREFIX) and q not in live_queues for q in queues):
                bridges.add(bid)
                channels.update(c for c in map(_endpoint_channel, ends) if c is not None)
        for bid in sorted(bridges):
            with contextlib.suppress(CORBA.Exception):  # already gone
                bf.get_bridge_with_id(bid).destroy()
                result.removed_bridges.append(bid)
    existing = set(factory.get_all_channels())
    for cid in sorted(channels & existing):
        with contextlib.suppress(CORBA.Exception):
            factory.get_event_channel(cid).destroy()
            result.removed_channels.append(cid)
    if result.removed_bridges or result.removed_channels:
        out(f"demo: removed what an earlier run left: bridges {result.removed_bridges or '-'}, "
            f"channels {result.removed_channels or '-'}")


def _create(factory: Any, bf: Any, qos: list[Any], result: DemoResult, out: Out) -> tuple[Any, Any]:
    """Channel A, and (with a BridgeFactory) channel B and the two bridges through the queue; returns (A, B)."""
    channel, cid = factory.create_channel(qos, [])
    result.channels.append(cid)
    if bf is None:
        return channel, channel
    from idl.generated import CosBridgeAdmin as BA

    target, tid = factory.create_channel(qos, [])
    result.channels.append(tid)
    queue = BA.JMSDestination(BA.QUEUE, result.queue, "")

    def channel_ep(role: Any, chan_id: int) -> Any:
        return BA.ExternalEndpoint(role, BA.ExternalEndpointConnector(BA.STRUCTURED_EVENT, chan_id), BA.PUSH,
                                   BA.STRUCTURED_EVENT)

    def jms_ep(role: Any) -> Any:
        return BA.ExternalEndpoint(role, BA.ExternalEndpointConnector(destination=queue), BA.PUSH, BA.JMS_MESSAGE)

    for src, snk in ((channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK)), (jms_ep(BA.SOURCE), channel_ep(BA.SINK, tid))):
        bridge, bid = bf.create_bridge(src, snk)
        result.bridges.append(bid)
        bridge.start_bridge()
    out(f"demo: bridge {result.bridges[0]}: channel {cid} -> JMS queue {result.queue}; "
        f"bridge {result.bridges[1]}: that queue -> channel {tid}")
    return channel, target


def _destroy_own(factory: Any, bf: Any, result: DemoResult) -> None:
    from omniORB import CORBA

    for bid in result.bridges:
        with contextlib.suppress(CORBA.Exception):
            bf.get_bridge_with_id(bid).destroy()
    for cid in result.channels:
        with contextlib.suppress(CORBA.Exception):
            factory.get_event_channel(cid).destroy()


def run_demo(state_dir: Path, *, rate: float = 2.0, count: int = 0, stop: threading.Event | None = None,
             out: Out = print, progress: Out | None = print) -> DemoResult:
    """Push ``count`` events (0 = until stopped) at ``rate`` per second; ``progress`` gets one line per event."""
    from omniORB import CORBA  # noqa: I001 — omniORB first: it puts the COS stubs on sys.path
    import CosNotification
    import CosNotifyChannelAdmin

    stop = stop or threading.Event()
    endpoints = json.loads((state_dir / "endpoints.json").read_text())
    orb = CORBA.ORB_init(["demo", "-ORBendPoint", "giop:tcp:127.0.0.1:", "-ORBclientCallTimeOutPeriod", "30000"],
                         CORBA.ORB_ID)
    run = f"{os.getpid()}-{int(time.time())}"
    try:
        poa = orb.resolve_initial_references("RootPOA")
        poa._get_the_POAManager().activate()
        factory = orb.string_to_object(endpoints["event_channel_factory"]["corbaloc"])._narrow(
            CosNotifyChannelAdmin.EventChannelFactory)
        bf = None
        if endpoints.get("bridge_factory"):
            from idl.generated import CosBridgeAdmin as BA

            bf = orb.string_to_object(endpoints["bridge_factory"]["corbaloc"])._narrow(BA.BridgeFactory)
        persistent = [CosNotification.Property(CosNotification.ConnectionReliability,
                                               CORBA.Any(CORBA.TC_short, CosNotification.Persistent)),
                      CosNotification.Property(CosNotification.EventReliability,
                                               CORBA.Any(CORBA.TC_short, CosNotification.Persistent))]
        with _locked(state_dir):  # clean up and register atomically against a concurrent demo on this node
            runs = _read_runs(state_dir)
            live = live_runs(runs)
            slot = free_slot(live)
            result = DemoResult(run=run, queue=queue_name(state_dir, slot))
            _remove_leftovers(factory, bf, {k: v for k, v in runs.items() if k not in live}, live, result, out)
            try:
                channel, target = _create(factory, bf, persistent, result, out)
            finally:  # record whatever was created, so that a later run can remove it
                live[run] = {"pid": os.getpid(), "slot": slot, "queue": result.queue,
                             "channels": result.channels, "bridges": result.bridges}
                _write_runs(state_dir, live)
        out(f"demo: channel {result.channels[0]} created at {endpoints['event_channel_factory']['corbaloc']}")
        try:
            _pump(channel, target, run, rate, count, stop, result, progress, out)
        finally:
            _destroy_own(factory, bf, result)
            with _locked(state_dir):
                runs = _read_runs(state_dir)
                runs.pop(run, None)
                _write_runs(state_dir, runs)
    finally:
        orb.destroy()
    out(f"demo: pushed {result.pushed}, received {result.received}"
        + (f" ({result.stale_received} left over from an earlier run)" if result.stale_received else ""))
    return result


def _pump(channel: Any, target: Any, run: str, rate: float, count: int, stop: threading.Event, result: DemoResult,
          progress: Out | None, out: Out) -> None:
    import CosNotifyChannelAdmin

    printer = _printer_servant(run, progress, out)
    supplier_proxy, _ = target._get_default_consumer_admin().obtain_notification_push_supplier(
        CosNotifyChannelAdmin.STRUCTURED_EVENT)
    supplier_proxy = supplier_proxy._narrow(CosNotifyChannelAdmin.StructuredProxyPushSupplier)
    supplier_proxy.connect_structured_push_consumer(printer._this())
    consumer_proxy, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(
        CosNotifyChannelAdmin.STRUCTURED_EVENT)
    consumer_proxy = consumer_proxy._narrow(CosNotifyChannelAdmin.StructuredProxyPushConsumer)
    consumer_proxy.connect_structured_push_supplier(None)
    try:
        while not stop.is_set() and (count == 0 or result.pushed < count):
            consumer_proxy.push_structured_event(_event(result.pushed, run))
            if progress is not None:
                progress(f"  -> pushed   alarm-{result.pushed}")
            result.pushed += 1
            stop.wait(1.0 / rate)
        deadline = time.monotonic() + 30
        while printer.count < result.pushed and time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.05)
    finally:
        result.received, result.stale_received = printer.count, printer.stale
