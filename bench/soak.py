"""Soak: T2 bridges both ways at a steady offered rate for a long time (issue 31). Never run by CI.

Starts its own PostgreSQL and ActiveMQ (the node's embedded configuration, ``router.node.services``) and a
``nsjms serve`` subprocess, then, with independent clients only:

* channel → JMS: a standard-stub CORBA structured push supplier pushes 1 KB events (``n``, ``t`` = send time) into
  a channel with EnableTransaction TRUE; a T2 bridge (``enable_transaction``) routes them to ``soak.out.<cid>``, where
  a stomp.py consumer counts them;
* JMS → channel: a stomp.py producer SENDs persistent 1 KB messages to ``soak.in.<cid>``; a T2 bridge (the channel
  pulls from it, EnableTransaction TRUE) routes them into a channel, where a CORBA structured push consumer counts
  them.

Each producer offers ``--rate`` messages per second on a fixed schedule (it never slows down for the node: a bridge
that falls behind shows as a growing backlog). Every minute it prints, per direction, what was offered and received
in that minute, the backlog (offered minus received so far) and the median and maximum latency of that minute's
arrivals, and the broker's heap used right after a full GC (``jcmd GC.class_histogram`` runs one) with its count of
``StompAckEntry`` objects (ActiveMQ's per-acknowledged-message STOMP state, issue 31). At the end the producers stop,
the bridges drain, and it reports what was lost (sent, never received) and duplicated each way.

    .venv/bin/python bench/soak.py                          # 73/s each way for 30 minutes
    .venv/bin/python bench/soak.py --rate 300 --minutes 5   # a faster way to load the broker
    .venv/bin/python bench/soak.py --backlog 30000 --minutes 8  # JMS -> channel starts 30,000 behind
    .venv/bin/python bench/soak.py --json out.json          # also write every minute's row
    .venv/bin/python bench/soak.py --node-log node.log      # keep the node's log (WARNING and above)

Exit code 0 when nothing was lost either way, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)

from router.node.services import EmbeddedActiveMQ, EmbeddedPostgres, free_port

from common import PAYLOAD, NodeProcess, client_orb


# ------------------------------------------------------------------------------------------------ counting
class Tally:
    """Sent and received ids of one direction, with the latency of each arrival (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = 0
        self.got: Counter[int] = Counter()
        self.latencies: list[float] = []      # since the last minute's row

    def arrived(self, n: int, sent_at: float) -> None:
        now = time.time()
        with self.lock:
            self.got[n] += 1
            self.latencies.append(now - sent_at)

    def minute(self) -> tuple[int, int, list[float]]:
        with self.lock:
            lat, self.latencies = self.latencies, []
            return self.sent, len(self.got), lat


def paced(rate: float, stop: threading.Event, send: Any, tally: Tally, first: int = 0) -> None:
    """Call ``send(n, t)`` for n = first, first + 1, ... on a fixed schedule of ``rate`` per second until ``stop``."""
    t0 = time.monotonic()
    n = first
    while not stop.is_set():
        due = t0 + (n - first) / rate
        delay = due - time.monotonic()
        if delay > 0:
            stop.wait(delay)
            continue
        send(n, time.time())
        with tally.lock:
            tally.sent = n + 1
        n += 1


# ------------------------------------------------------------------------------------------------ CORBA side
def _props(ev: Any) -> dict[str, Any]:
    return {p.name: p.value.value() for p in ev.filterable_data}


def corba_consumer(tally: Tally) -> Any:
    import CosNotifyComm__POA

    class Consumer(CosNotifyComm__POA.StructuredPushConsumer):  # type: ignore[misc]
        def push_structured_event(self, ev: Any) -> None:
            p = _props(ev)
            tally.arrived(int(p["n"]), float(p["t"]))

        def disconnect_structured_push_consumer(self) -> None: ...
        def offer_change(self, a: Any, r: Any) -> None: ...

    return Consumer()


def corba_event(n: int, t: float) -> Any:
    from omniORB import CORBA

    import CosNotification

    header = CosNotification.EventHeader(
        CosNotification.FixedEventHeader(CosNotification.EventType("Soak", "Event"), f"e{n}"), [])
    return CosNotification.StructuredEvent(header, [CosNotification.Property("n", CORBA.Any(CORBA.TC_long, n)),
                                                    CosNotification.Property("t", CORBA.Any(CORBA.TC_double, t))],
                                           CORBA.Any(CORBA.TC_string, PAYLOAD))


def t2_channel(factory: Any, tx_events: int) -> tuple[Any, int]:
    from omniORB import CORBA

    import CosNotification

    qos = [CosNotification.Property("EnableTransaction", CORBA.Any(CORBA.TC_boolean, True))]
    admin = [CosNotification.Property("TransactionEvents", CORBA.Any(CORBA.TC_long, tx_events))]
    made: tuple[Any, int] = factory.create_channel(qos, admin)
    return made


def endpoint(role: str, cid: int | None, queue: str | None, style: str = "PUSH") -> Any:
    from idl.generated import CosBridgeAdmin as BA

    if queue is not None:
        connector = BA.ExternalEndpointConnector(destination=BA.JMSDestination(BA.QUEUE, queue, ""))
        return BA.ExternalEndpoint(getattr(BA, role), connector, BA.PUSH, BA.JMS_MESSAGE)
    return BA.ExternalEndpoint(getattr(BA, role), BA.ExternalEndpointConnector(BA.STRUCTURED_EVENT, cid),
                               getattr(BA, style), BA.STRUCTURED_EVENT)


# ------------------------------------------------------------------------------------------------ STOMP side
def stomp_conn(url: str) -> Any:
    import stomp

    parts = urlsplit(url)
    conn = stomp.Connection12([(parts.hostname, parts.port)], auto_content_length=False, heartbeats=(0, 0))
    return conn


def stomp_consumer(url: str, queue: str, tally: Tally) -> Any:
    import stomp

    class L(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            h = frame.headers          # the event's filterable data "n" is the JMS property "$fd_n" (NJI 2.4)
            tally.arrived(int(h.get("$fd_n", h.get("n"))), float(h.get("$fd_t", h.get("t"))))

    conn = stomp_conn(url)
    conn.set_listener("c", L())
    conn.connect(wait=True)
    conn.subscribe(f"/queue/{queue}", id="1", ack="auto", headers={"activemq.prefetchSize": "1000"})
    return conn


# ------------------------------------------------------------------------------------------------ the broker
def broker_heap(pid: int | None) -> tuple[float, int]:
    """(MB used right after a full GC, StompAckEntry objects alive): ``GC.class_histogram`` collects first."""
    if pid is None:
        return float("nan"), -1
    hist = subprocess.run(["jcmd", str(pid), "GC.class_histogram"], capture_output=True, text=True, timeout=120).stdout
    m = re.search(r"^\s*\d+:\s+(\d+)\s+\d+\s+org\.apache\.activemq\.transport\.stomp\.StompAckEntry\s*$", hist, re.M)
    info = subprocess.run(["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True, timeout=60).stdout
    used = re.search(r"used (\d+)K", info)
    return (int(used.group(1)) / 1024 if used else float("nan")), (int(m.group(1)) if m else 0)


# ------------------------------------------------------------------------------------------------ the run
def minute_row(minute: int, out: Tally, inn: Tally, prev: dict[str, tuple[int, int]], pid: int | None
               ) -> dict[str, Any]:
    row: dict[str, Any] = {"minute": minute}
    for name, tally in (("to_jms", out), ("from_jms", inn)):
        sent, got, lat = tally.minute()
        ps, pg = prev.get(name, (0, 0))
        prev[name] = (sent, got)
        row[name] = {"offered_per_s": round((sent - ps) / 60, 1), "received_per_s": round((got - pg) / 60, 1),
                     "backlog": sent - got,
                     "latency_median_s": round(statistics.median(lat), 3) if lat else None,
                     "latency_max_s": round(max(lat), 3) if lat else None}
    heap, entries = broker_heap(pid)
    row["broker_heap_mb_after_gc"] = round(heap, 1)
    row["stomp_ack_entries"] = entries
    return row


def print_row(row: dict[str, Any]) -> None:
    def side(d: dict[str, Any]) -> str:
        return (f"{d['offered_per_s']:6.1f} {d['received_per_s']:6.1f} {d['backlog']:7d} "
                f"{d['latency_median_s'] if d['latency_median_s'] is not None else '-':>7} "
                f"{d['latency_max_s'] if d['latency_max_s'] is not None else '-':>7}")
    print(f"| {row['minute']:3d} | {side(row['to_jms'])} | {side(row['from_jms'])} | "
          f"{row['broker_heap_mb_after_gc']:7.1f} | {row['stomp_ack_entries']:7d} |", flush=True)


def lost_and_dups(tally: Tally) -> tuple[int, int]:
    with tally.lock:
        lost = sum(1 for n in range(tally.sent) if n not in tally.got)
        dups = sum(c - 1 for c in tally.got.values() if c > 1)
    return lost, dups


def run(args: argparse.Namespace) -> int:
    import CosNotifyChannelAdmin as NCA

    from idl.generated import CosBridgeAdmin as BA
    from idl.generated import NsjmsAdmin

    base = Path(tempfile.mkdtemp(prefix="nsjms-soak-"))
    base.chmod(0o755)
    pg = EmbeddedPostgres(base, free_port())
    amq = EmbeddedActiveMQ(base, free_port(), free_port())
    node: NodeProcess | None = None
    stop = threading.Event()
    try:
        dsn = pg.start()
        url = amq.start()
        node = NodeProcess(dsn, url)
        ep = node.start()
        orb = client_orb()
        factory = orb.string_to_object(ep["event_channel_factory"]["corbaloc"])._narrow(NCA.EventChannelFactory)
        bf = orb.string_to_object(ep["bridge_factory"]["corbaloc"])._narrow(BA.BridgeFactory)
        out, inn = Tally(), Tally()

        # channel -> JMS: supplier -> T2 channel -> T2 bridge -> queue -> stomp.py consumer
        ch_out, cid_out = t2_channel(factory, args.tx_events)
        q_out = f"soak.out.{cid_out}"
        bridge_out, _ = bf.create_bridge(endpoint("SOURCE", cid_out, None), endpoint("SINK", None, q_out))
        bridge_out._narrow(NsjmsAdmin.ManagedBridge).enable_transaction(args.tx_events, 60)
        bridge_out.start_bridge()
        reader = stomp_consumer(url, q_out, out)
        pc, _ = ch_out._get_default_supplier_admin().obtain_notification_push_consumer(NCA.STRUCTURED_EVENT)
        pc = pc._narrow(NCA.StructuredProxyPushConsumer)
        pc.connect_structured_push_supplier(None)

        # JMS -> channel: stomp.py producer -> queue -> T2 bridge (pulled by the channel) -> consumer
        ch_in, cid_in = t2_channel(factory, args.tx_events)
        q_in = f"soak.in.{cid_in}"
        consumer = corba_consumer(inn)
        ps, _ = ch_in._get_default_consumer_admin().obtain_notification_push_supplier(NCA.STRUCTURED_EVENT)
        ps = ps._narrow(NCA.StructuredProxyPushSupplier)
        ps.connect_structured_push_consumer(consumer._this())
        bridge_in, _ = bf.create_bridge(endpoint("SOURCE", None, q_in), endpoint("SINK", cid_in, None, "PULL"))
        writer = stomp_conn(url)
        writer.connect(wait=True)
        write_lock = threading.Lock()
        if args.backlog:                  # JMS -> channel starts behind: the rows show how fast it catches up
            for n in range(args.backlog):
                writer.send(f"/queue/{q_in}", PAYLOAD, headers={"persistent": "true", "n": str(n),
                                                                "t": repr(time.time())})
            inn.sent = args.backlog
        bridge_in.start_bridge()

        def send_jms(n: int, t: float) -> None:
            with write_lock:
                writer.send(f"/queue/{q_in}", PAYLOAD, headers={"persistent": "true", "n": str(n), "t": repr(t)})

        def push(n: int, t: float) -> None:
            pc.push_structured_event(corba_event(n, t))

        threads = [threading.Thread(target=paced, args=(args.rate, stop, fn, tally, first), daemon=True)
                   for fn, tally, first in ((push, out, 0), (send_jms, inn, args.backlog))]
        print(f"soak: {args.rate:g}/s each way for {args.minutes:g} min; T2 bridges both ways (TransactionEvents "
              f"{args.tx_events}); JMS -> channel backlog at the start {args.backlog}; broker pid {amq.pid}, node "
              f"pid {node.proc.pid if node.proc else '?'}", flush=True)
        print("| min | to JMS: offered/s recv/s backlog lat-med lat-max | from JMS: offered/s recv/s backlog "
              "lat-med lat-max | heap MB | AckEntry |", flush=True)
        rows: list[dict[str, Any]] = []
        prev: dict[str, tuple[int, int]] = {"from_jms": (args.backlog, 0)}   # the preload is no offered rate
        for th in threads:
            th.start()
        t0 = time.monotonic()
        minute = 0
        while minute < args.minutes:
            minute += 1
            time.sleep(max(0.0, t0 + 60 * minute - time.monotonic()))
            rows.append(minute_row(minute, out, inn, prev, amq.pid))
            print_row(rows[-1])
        stop.set()
        for th in threads:
            th.join(30)
        drain_t0 = time.monotonic()
        while time.monotonic() - drain_t0 < args.drain_minutes * 60:
            if all(lost_and_dups(t)[0] == 0 for t in (out, inn)):
                break
            time.sleep(1.0)
        drained_s = time.monotonic() - drain_t0
        result: dict[str, Any] = {"rate": args.rate, "minutes": args.minutes, "rows": rows,
                                  "drain_s": round(drained_s, 1)}
        bad = False
        for name, tally in (("to_jms", out), ("from_jms", inn)):
            lost, dups = lost_and_dups(tally)
            result[name] = {"sent": tally.sent, "received": len(tally.got), "lost": lost, "duplicates": dups}
            bad = bad or lost > 0
            print(f"{name}: sent {tally.sent}, received {len(tally.got)}, lost {lost}, duplicates {dups}", flush=True)
        print(f"drained {drained_s:.1f} s after the producers stopped", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        reader.disconnect()
        writer.disconnect()
        return 1 if bad else 0
    finally:
        stop.set()
        if node is not None:
            log = node.state / "serve.log"
            if args.node_log and log.exists():
                shutil.copy(log, args.node_log)
            node.close()
        amq.stop()
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=73.0, help="messages per second offered each way (73)")
    ap.add_argument("--minutes", type=float, default=30.0, help="how long the producers offer (30)")
    ap.add_argument("--tx-events", type=int, default=100, help="TransactionEvents of both T2 routes (100)")
    ap.add_argument("--drain-minutes", type=float, default=10.0, help="how long to wait for the backlog after (10)")
    ap.add_argument("--backlog", type=int, default=0,
                    help="messages on the JMS -> channel queue before its bridge starts (0): how it catches up")
    ap.add_argument("--json", help="write the rows and totals to this file")
    ap.add_argument("--node-log", help="copy the node's log here at the end")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # a TERM stops the services too (finally)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
