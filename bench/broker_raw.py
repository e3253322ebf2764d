"""What the broker alone does with the channel → JMS traffic pattern (issue 12, round 6): raw stomp.py, no node.

    .venv/bin/python bench/broker_raw.py                       # 3,000 x 1 KB persistent messages, 4 repetitions
    .venv/bin/python bench/broker_raw.py --messages 3000 --reps 4

Five variants, interleaved in each repetition (the machine's speed drifts within minutes), each BEGIN + 100
persistent SENDs + COMMIT (receipt) per transaction on one connection:

* ``serial``: the issue's baseline (``common.stomp_send_rate``, itself the median of three runs of ``--messages``):
  write a transaction, wait for its COMMIT receipt, then the next;
* ``serial, TCP_NODELAY``: the same with Nagle's algorithm off on the client's socket (as the node's since round 7);
* ``serial, mapped headers``: the same with the eleven headers a mapped 1 KB structured event carries
  (``$domain_name``, ``$type_name``, ``$event_name``, a filterable field, ``$nsjms_idl``, ``nsjms_types``,
  ``amq-msg-type``, ``priority``, ``timestamp``, ``type``, ``persistent``; the golden frame of
  ``tests/unit/to_jms_wire_golden.txt``): the broker's own cost of the mapping's headers;
* ``pipelined``: the pattern of ``router.channel.localpush``: transaction *n+1*'s BEGIN and SENDs are written while
  *n*'s COMMIT receipt is in flight, its COMMIT once that receipt came (mapped headers);
* ``pipelined + live consumer``: the same while a stomp.py consumer in this process receives every message (auto
  ack, prefetch 1,000), timed until the consumer has the last one: what a consumer on the same cores costs the
  producer's rate (rounds 1-5 of the channel → JMS benches timed with such a consumer).

Prints the median (min-max) of each and its ratio to ``serial``. No thresholds: this is not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bridge_bench import _count_queue
from channel_bench import Counter
from common import PAYLOAD, _receipts, median_spread, services, stomp_send_rate

PER_TX = 100
#: The headers of a mapped 1 KB structured event (tests/unit/to_jms_wire_golden.txt's first SEND, less
#: ``destination``, ``transaction`` and ``content-length``, which stomp.py adds).
MAPPED = {"$domain_name": "Bench", "$event_name": "e7", "$fd_n": "7",
          "$nsjms_idl": '{"v":1,"ohf":[],"fd":[["n","long",["$fd_n"]]],"body":{"k":"text","tc":"string"}}',
          "$type_name": "Event", "amq-msg-type": "text", "nsjms_types": "$fd_n=int", "persistent": "true",
          "priority": "4", "timestamp": "1700000000000", "type": "Structured Event"}


class Producer:
    def __init__(self, url: str) -> None:
        import stomp

        parts = urlsplit(url)
        self.conn = stomp.Connection12([(parts.hostname, parts.port)], auto_content_length=False)
        self.receipts = _receipts()
        self.conn.set_listener("r", self.receipts)
        self.conn.connect(wait=True)
        self._k = 0

    def write(self, dest: str, headers: dict[str, str]) -> str:
        tx: str = self.conn.begin()
        for _ in range(PER_TX):
            self.conn.send(dest, PAYLOAD, headers=headers, transaction=tx)
        return tx

    def commit(self, tx: str) -> str:
        self._k += 1
        receipt = f"c{self._k}"
        self.conn.commit(tx, headers={"receipt": receipt})
        return receipt

    def pipelined(self, dest: str, n: int, headers: dict[str, str]) -> None:
        pending: str | None = None
        for _ in range(n // PER_TX):
            tx = self.write(dest, headers)             # written while the previous COMMIT's receipt is in flight
            if pending is not None:
                self.receipts.wait(pending)
            pending = self.commit(tx)
        if pending is not None:
            self.receipts.wait(pending)


def _timed(fn: Callable[[], None], n: int) -> float:
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=4)
    args = ap.parse_args()
    n = args.messages
    load = os.getloadavg()
    names = ("serial", "serial, TCP_NODELAY", "serial, mapped headers", "pipelined", "pipelined + live consumer")
    rates: dict[str, list[float]] = {name: [] for name in names}
    with services() as (_, url):
        p = Producer(url)

        def dest() -> str:
            return f"bench.raw.{os.getpid()}.{time.time_ns()}"

        def with_consumer() -> float:
            queue, counter = dest(), Counter()
            consumer = _count_queue(url, queue, counter)

            def run() -> None:
                p.pipelined(f"/queue/{queue}", n, MAPPED)
                counter.wait(n)

            try:
                return _timed(run, n)
            finally:
                consumer.disconnect()

        runs: dict[str, Callable[[], float]] = {
            "serial": lambda: stomp_send_rate(url, n, per_tx=PER_TX),
            "serial, TCP_NODELAY": lambda: stomp_send_rate(url, n, per_tx=PER_TX, nodelay=True),
            "serial, mapped headers": lambda: stomp_send_rate(url, n, per_tx=PER_TX, headers=MAPPED),
            "pipelined": lambda: _timed(lambda: p.pipelined(f"/queue/{dest()}", n, MAPPED), n),
            "pipelined + live consumer": with_consumer,
        }
        for name in names:                       # warm-up
            runs[name]()
        for _ in range(args.reps):
            for name in names:
                rates[name].append(runs[name]())
        p.conn.disconnect()
    print(f"\n{n} x 1 KB persistent messages per run, BEGIN + {PER_TX} SEND + COMMIT, {args.reps} repetition(s); "
          f"load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}\n")
    print("| raw stomp.py | rate/s median (min-max) | ratio to serial (median of medians) |\n|---|---|---|")
    base = statistics.median(rates["serial"])
    for name in names:
        med, lo, hi = median_spread(rates[name])
        print(f"| {name} | {med:,.0f} ({lo:,.0f}-{hi:,.0f}) | {med / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
