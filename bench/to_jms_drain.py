"""Channel → JMS delivery alone (issue 12, round 3): events queued for a stopped bridge, then drained to the queue.

    .venv/bin/python bench/to_jms_drain.py                    # 2,000 x 1 KB persistent events, 3 repetitions
    .venv/bin/python bench/to_jms_drain.py --events 1000 --reps 3

``bench/paths.py``'s ``to_jms`` measures supplier → channel → JMS with ONE supplier pushing one event per call,
so its rate is capped by the accept side (one PostgreSQL commit per push: its ``accept1`` path). This measures the
delivery side only: the bridge is started, stopped (its proxy suspended), ``--events`` persistent events are
pushed and stored, a counter subscribes to the queue, and the bridge is started again; the rate is events over the
time from ``start_bridge`` to the last arrival. Structured (one event per push) and sequence (MaximumBatchSize 100)
endpoints; baseline: raw stomp.py BEGIN + 100 SEND + COMMIT in the same run. PostgreSQL transactions and WAL syncs
per event are those of the drain (the delivery bookkeeping). No thresholds: this is not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)

from bridge_bench import _count_queue, _endpoint, _persistent_channel
from channel_bench import Counter, _event, push_all
from common import NodeProcess, client_orb, median_spread, services, settled_pg_counters, stomp_send_rate


def drain(env: dict[str, Any], n: int, sequence: bool) -> tuple[float, float, float]:
    """(events/s, PG transactions per event, WAL syncs per event) of one drain of ``n`` queued events."""
    import CosNotifyChannelAdmin as NCA

    factory, bf, url, dsn = env["factory"], env["bridges"], env["url"], env["dsn"]
    channel, cid = _persistent_channel(factory, 100 if sequence else 1)
    queue = f"bench.drain.{cid}"
    bridge, _ = bf.create_bridge(_endpoint("SOURCE", cid, None, sequence), _endpoint("SINK", None, queue, sequence))
    bridge.start_bridge()
    bridge.stop_bridge()                                  # the bridge's proxy is suspended: events queue for it
    kind = NCA.SEQUENCE_EVENT if sequence else NCA.STRUCTURED_EVENT
    pc, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(kind)
    events = [_event(i) for i in range(n)]
    push_all(pc, events, sequence)
    counter = Counter()
    conn = _count_queue(url, queue, counter)
    c0, w0 = settled_pg_counters(dsn)
    t0 = time.perf_counter()
    bridge.start_bridge()
    counter.wait(n, timeout=600)
    elapsed = time.perf_counter() - t0
    c1, w1 = settled_pg_counters(dsn)
    conn.disconnect()
    bridge.destroy()
    channel.destroy()
    return n / elapsed, (c1 - c0) / n, (w1 - w0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    load = os.getloadavg()
    rows = []
    with services() as (admin_dsn, url):
        node = NodeProcess(admin_dsn, url)
        try:
            import CosNotifyChannelAdmin as NCA

            from idl.generated import CosBridgeAdmin as BA

            ep = node.start()
            orb = client_orb()
            env = {"factory": orb.string_to_object(ep["event_channel_factory"]["corbaloc"])._narrow(
                       NCA.EventChannelFactory),
                   "bridges": orb.string_to_object(ep["bridge_factory"]["corbaloc"])._narrow(BA.BridgeFactory),
                   "url": url, "dsn": ep["bench_dsn"]}
            base = [stomp_send_rate(url, 1000, per_tx=100) for _ in range(args.reps)]
            drain(env, 100, False)                                                   # warm-up
            for name, seq in (("structured (one event per push)", False), ("sequence x100", True)):
                runs = [drain(env, args.events, seq) for _ in range(args.reps)]
                rows.append((name, [r[0] for r in runs], statistics.median(r[1] for r in runs),
                             statistics.median(r[2] for r in runs)))
        finally:
            node.close()
    print(f"\n{args.events} x 1 KB persistent events queued per run, {args.reps} repetition(s); load average before "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after {os.getloadavg()[0]:.2f}\n")
    bmed, blo, bhi = median_spread(base)
    print("| channel → JMS drain | rate/s median (min-max) | raw BEGIN+100 SEND+COMMIT | ratio | PG tx/event | "
          "WAL syncs/event |\n|---|---|---|---|---|---|")
    for name, rates, tx, wal in rows:
        med, lo, hi = median_spread(rates)
        print(f"| {name} | {med:,.0f} ({lo:,.0f}-{hi:,.0f}) | {bmed:,.0f} ({blo:,.0f}-{bhi:,.0f}) | {med / bmed:.2f} "
              f"| {tx:.2f} | {wal:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
