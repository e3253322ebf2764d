"""CPU of an idle node per second: the periodic work (service watches, cluster lease, status snapshots, reaper,
T2 loop, telemetry) that every event's window also pays for (issue 27).

    .venv/bin/python bench/idle_cpu.py                        # 3 windows of 30 s after 15 s of settling
    .venv/bin/python bench/idle_cpu.py --bridge --windows 5   # with a channel and a running channel -> JMS bridge

Starts its own PostgreSQL and ActiveMQ (bench/common.py ``services``) and a ``nsjms serve`` subprocess, waits
``--settle`` s, then measures CPU milliseconds per second of the node, the broker and PostgreSQL (their process
trees: bench/meter.py) over ``--windows`` windows of ``--seconds`` s each; prints each window and the median.
Nothing here is a test: there are no thresholds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)

from bridge_bench import _endpoint, _persistent_channel
from common import METER, NodeProcess, client_orb, services


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settle", type=float, default=15.0, help="seconds after the node is ready (default 15)")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of one window (default 30)")
    ap.add_argument("--windows", type=int, default=3, help="windows (default 3)")
    ap.add_argument("--bridge", action="store_true", help="create a Persistent channel and a running bridge first")
    args = ap.parse_args(argv)
    load = os.getloadavg()
    rows: list[dict[str, float]] = []
    with services() as (admin_dsn, url):
        node = NodeProcess(admin_dsn, url)
        try:
            ep = node.start()
            METER.node_pid = node.proc.pid if node.proc else None
            if args.bridge:
                import CosNotifyChannelAdmin as NCA

                from idl.generated import CosBridgeAdmin as BA

                orb = client_orb()
                factory = orb.string_to_object(ep["event_channel_factory"]["corbaloc"])._narrow(NCA.EventChannelFactory)
                bridges = orb.string_to_object(ep["bridge_factory"]["corbaloc"])._narrow(BA.BridgeFactory)
                _, cid = _persistent_channel(factory)
                bridge, _ = bridges.create_bridge(_endpoint("SOURCE", cid, None, False),
                                                  _endpoint("SINK", None, f"bench.idle.{cid}", False))
                bridge.start_bridge()
            time.sleep(args.settle)
            for _ in range(args.windows):
                METER.take()
                METER.start()
                time.sleep(args.seconds)
                METER.stop(int(args.seconds * 1000))      # per millisecond of wall time: µs CPU per ms
                rows.append(METER.take())
        finally:
            node.close()

    def ms(row: dict[str, float], key: str) -> float:
        return row.get(key, float("nan"))         # µs of CPU per ms of wall time = ms of CPU per s

    print(f"\nidle node{' with a channel and a running bridge' if args.bridge else ''}: CPU ms per second of "
          f"wall time, {args.windows} windows of {args.seconds:g} s after {args.settle:g} s; load average before "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after {os.getloadavg()[0]:.2f}\n")
    print("| window | node | broker | PostgreSQL |\n|---|---|---|---|")
    for i, row in enumerate(rows, 1):
        print(f"| {i} | {ms(row, 'node'):.1f} | {ms(row, 'broker'):.1f} | {ms(row, 'postgres'):.1f} |")
    med = {k: statistics.median(ms(r, k) for r in rows) for k in ("node", "broker", "postgres")}
    print(f"| median | {med['node']:.1f} | {med['broker']:.1f} | {med['postgres']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
