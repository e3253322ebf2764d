"""Per-message CPU of channel → JMS delivery in the node (issue 12, round 4): mapping + STOMP framing, no broker.

    .venv/bin/python bench/to_jms_cpu.py                       # 20,000 of the benches' 1 KB events, 3 repetitions
    .venv/bin/python bench/to_jms_cpu.py --profile             # + cProfile of one repetition, grouped by stage
    .venv/bin/python bench/to_jms_cpu.py --event rich          # an event with QoS fields and 12 properties

What a push proxy's dispatcher does per batch of a channel → JMS bridge of the same node
(``router.channel.localpush``), less the channel's queue: the bridge's mapping entry (``_to_jms_frame``: event →
JMS message → STOMP headers, limits checked) and ``LocalBatches`` (BEGIN, 100 SENDs without receipt, COMMIT
receipted, pipelined as ``localpush`` does), through the real ``StompTransport`` and stomp.py, to a sink process on
127.0.0.1 that answers CONNECT and receipts and discards the rest. Prints microseconds of this process's CPU
(every thread: the dispatcher and stomp.py's receiver) and of wall time per message, median of the repetitions,
and with ``--profile`` the share of the dispatcher's time per stage. The sink costs CPU too (on another core when
there is one): compare runs on the same machine, back to back. No thresholds: this is not a test.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import omniORB  # noqa: E402,F401  (puts the COS stubs on sys.path)

SINK = r"""
import re, socket
srv = socket.create_server(("127.0.0.1", 0))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
buf = b""
while b"\x00" not in buf:                       # the STOMP/CONNECT frame
    buf += conn.recv(65536)
conn.sendall(b"CONNECTED\nversion:1.2\nheart-beat:0,0\n\n\x00")
buf = b""
rid = re.compile(rb"\nreceipt:([^\n]*)\n")
while chunk := conn.recv(1 << 20):
    buf = buf[-200:] + chunk
    end = 0
    for m in rid.finditer(buf):
        conn.sendall(b"RECEIPT\nreceipt-id:" + m.group(1) + b"\n\n\x00")
        end = m.end()
    buf = buf[end:]
"""


def _events(kind: str, n: int) -> list[Any]:
    from omniORB import CORBA

    import CosNotification as N

    payload = "x" * 1000
    out = []
    for i in range(n):
        fixed = N.FixedEventHeader(N.EventType("Bench", "Event"), f"e{i}")
        if kind == "bench":
            out.append(N.StructuredEvent(N.EventHeader(fixed, []), [N.Property("n", CORBA.Any(CORBA.TC_long, i))],
                                         CORBA.Any(CORBA.TC_string, payload)))
            continue
        ohf = [N.Property("EventReliability", CORBA.Any(CORBA.TC_short, 1)),
               N.Property("Priority", CORBA.Any(CORBA.TC_short, 5)),
               N.Property("Timeout", CORBA.Any(CORBA.TC_ulonglong, 600_000_000))]
        fd = [N.Property(f"field_{k}", CORBA.Any(CORBA.TC_long, i + k)) for k in range(6)]
        fd += [N.Property(f"text-{k}", CORBA.Any(CORBA.TC_string, f"value {i}:{k}")) for k in range(4)]
        fd += [N.Property("ok", CORBA.Any(CORBA.TC_boolean, True)), N.Property("load", CORBA.Any(CORBA.TC_double, 0.5))]
        out.append(N.StructuredEvent(N.EventHeader(fixed, ohf), fd, CORBA.Any(CORBA.TC_string, payload)))
    return out


class _Bridge:
    id = 1

    @staticmethod
    def running() -> bool:
        return True

    def acknowledge_channel(self, events: Any) -> None:
        pass

    def note_broker_problem(self, exc: Any) -> None:
        raise RuntimeError(exc)


class _Flow:
    """What ``LocalBatches`` uses of the bridge's ``ChannelToJms``."""

    def __init__(self, transport: Any, destination: Any) -> None:
        self.transport, self.destination, self.bridge, self.forwarded = transport, destination, _Bridge(), 0

    def _dead_letter(self, body: bytes, reason: str) -> None:
        raise RuntimeError(f"dead letter: {reason}")


def raw(conn: Any, n: int, size: int) -> None:
    """The baseline of ``to_jms_drain.py`` (``common.stomp_send_rate``): raw stomp.py BEGIN + SENDs + COMMIT."""
    payload = "x" * 1000
    for k in range(0, n, size):
        tx = conn.begin()
        for _ in range(size):
            conn.send("/queue/bench.raw", payload, headers={"persistent": "true"}, transaction=tx)
        conn.commit(tx, headers={"receipt": f"c{k}"})
        conn.wait_receipt(f"c{k}")


def _raw_connection(port: int) -> Any:
    import threading

    import stomp

    class Receipts(stomp.ConnectionListener):  # type: ignore[misc]
        def __init__(self) -> None:
            self.cond, self.seen = threading.Condition(), set[str]()

        def on_receipt(self, frame: Any) -> None:
            with self.cond:
                self.seen.add(frame.headers["receipt-id"])
                self.cond.notify_all()

    conn = stomp.Connection12([("127.0.0.1", port)], auto_content_length=False, heartbeats=(0, 0))
    listener = Receipts()
    conn.set_listener("r", listener)
    conn.connect(wait=True)

    def wait_receipt(rid: str) -> None:
        with listener.cond:
            if not listener.cond.wait_for(lambda: rid in listener.seen, timeout=30):
                raise RuntimeError("no receipt")
            listener.seen.discard(rid)

    conn.wait_receipt = wait_receipt
    return conn


def _sink() -> tuple[subprocess.Popen[str], int]:
    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    assert sink.stdout is not None
    return sink, int(sink.stdout.readline())


def _measure(fn: Any, n: int, reps: int) -> tuple[float, float]:
    """(median CPU us/message of this process, median wall us/message)."""
    cpu, wall = [], []
    for _ in range(reps):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append((time.process_time() - c0) / n * 1e6)
        wall.append((time.perf_counter() - w0) / n * 1e6)
    return statistics.median(cpu), statistics.median(wall)


def run(events: list[Any], batches: Any, size: int) -> None:
    """``localpush.deliver``'s pipelining: the next batch is written while the previous COMMIT's receipt is due."""
    pending = None
    for start in range(0, len(events), size):
        batch = batches.batch(events[start:start + size])
        batches.start(batch)
        if pending is not None:
            batches.settle(pending)
        batches.commit(batch)
        pending = batch
    if pending is not None:
        batches.settle(pending)


STAGES = (  # (label, function name as cProfile reports it: file suffix, function) - cumulative time inside
    ("mapping: event_to_jms", "mapping/to_jms.py", "event_to_jms"),
    ("  of which NameAllocator.allocate", "mapping/names.py", "allocate"),
    ("encoding: message_to_stomp", "mapping/stomp_body.py", "message_to_stomp"),
    ("limits: check_stomp_limits", "mapping/stomp_limits.py", "check_stomp_limits"),
    ("framing + socket: send_encoded (one by one)", "jms/stomp/transport.py", "send_encoded"),
    ("framing + socket: send_encoded_many (a batch)", "jms/stomp/transport.py", "send_encoded_many"),
    ("  of which stomp.py convert_frame", "stomp/utils.py", "convert_frame"),
    ("  of which encode_send_frame (one frame)", "jms/stomp/sendframe.py", "encode_send_frame"),
    ("  of which FrameTemplates.encode (a batch's frames)", "jms/stomp/sendframe.py", "encode"),
    ("  of which socket sendall", "~", "<method 'sendall' of '_socket.socket' objects>"),
    ("BEGIN (_begin_pipelined)", "jms/stomp/transport.py", "_begin_pipelined"),
    ("COMMIT written (commit_pipelined)", "jms/stomp/transport.py", "commit_pipelined"),
    ("COMMIT receipt wait (settle)", "bridge/batchout.py", "settle"),
)


def _shares(prof: cProfile.Profile, n: int) -> None:
    stats = pstats.Stats(prof)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = max(v[3] for v in raw.values())
    print(f"\ncProfile of one repetition ({n} messages): total {total / n * 1e6:.1f} us/message "
          "(cProfile's own overhead included)\n")
    print("| stage | cumulative share | us/message |\n|---|---|---|")
    for label, path, func in STAGES:
        cum = sum(v[3] for (file, _, name), v in raw.items() if name == func and file.endswith(path))
        print(f"| {label} | {cum / total:.0%} | {cum / n * 1e6:.1f} |")
    print()
    stats.sort_stats("tottime").print_stats(18)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--event", choices=("bench", "rich"), default="bench")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()

    from omniORB import CORBA

    from router.bridge.batchout import LocalBatches
    from router.bridge.brokerlink import BrokerLink
    from router.jms.model import Destination
    from router.jms.stomp.transport import StompTransport
    from router.mapping.stomp_codec import StompCodec

    CORBA.ORB_init([], CORBA.ORB_ID)
    n = args.events
    load = os.getloadavg()
    raw_sink, raw_port = _sink()
    conn = _raw_connection(raw_port)
    try:
        raw(conn, 1000, args.batch)                                                   # warm-up
        raw_cpu, raw_wall = _measure(lambda: raw(conn, n, args.batch), n, args.reps)
    finally:
        conn.disconnect()
        raw_sink.kill()
        raw_sink.wait()
    sink, port = _sink()
    transport = StompTransport(f"stomp://127.0.0.1:{port}", heartbeats=(0, 0), codec=StompCodec())
    transport.connect()
    destination = Destination("queue", "bench.cpu")
    bridge = SimpleNamespace(codec=StompCodec())        # the bridge's codec (BrokerSettings.codec)
    batches = LocalBatches(_Flow(transport, destination),  # type: ignore[arg-type]
                           lambda ev, dest: BrokerLink._to_jms_frame(bridge, ev, dest))  # type: ignore[arg-type]
    events = _events(args.event, n)
    try:
        run(events[:1000], batches, args.batch)                                     # warm-up
        cpu, wall = _measure(lambda: run(events, batches, args.batch), n, args.reps)
        print(f"{n} '{args.event}' events per repetition, batches of {args.batch}, {args.reps} repetition(s); "
              f"load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}\n")
        print("| per message (median) | CPU of this process, us | wall, us |\n|---|---|---|")
        print(f"| raw stomp.py BEGIN + {args.batch} SEND + COMMIT (receipt), 1 KB text | {raw_cpu:.1f} | "
              f"{raw_wall:.1f} |")
        print(f"| nsjms mapping + LocalBatches | {cpu:.1f} | {wall:.1f} |")
        print(f"| ratio raw / nsjms | {raw_cpu / cpu:.2f} | {raw_wall / wall:.2f} |")
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            run(events, batches, args.batch)
            prof.disable()
            _shares(prof, n)
    finally:
        transport.close()
        sink.kill()
        sink.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
