"""Channel → JMS delivery alone (issue 12, round 3): events queued for a stopped bridge, then drained to the queue.

    .venv/bin/python bench/to_jms_drain.py                    # 2,000 x 1 KB persistent events, 3 repetitions
    .venv/bin/python bench/to_jms_drain.py --events 1000 --reps 3

``bench/paths.py``'s ``to_jms`` measures supplier → channel → JMS with ONE supplier pushing one event per call,
so its rate is capped by the accept side (one PostgreSQL commit per push: its ``accept1`` path). This measures the
delivery side only: the bridge is started, stopped (its proxy suspended), ``--events`` persistent events are
pushed and stored, and the bridge is started again; the rate is events over the
time from ``start_bridge`` until the channel's queue rows are gone (``--observe store``, the default: the node
deletes a row only once the broker confirmed its event's COMMIT; the messages are then consumed and counted
outside the timed window) or until a consumer running during the drain received the last one (``--observe
consumer``, how rounds 3-5 measured: the consumer and the broker's dispatch to it compete with the drain on the
same cores, and the baseline has no consumer). Structured (one event per push) and sequence (MaximumBatchSize 100)
endpoints; baseline: raw stomp.py BEGIN + 100 SEND + COMMIT in the same run, measured once per repetition just
before that repetition's drains; the ratio is the median (and spread) of the per-repetition ratios. PostgreSQL
transactions and WAL syncs per event are those of the drain (the delivery bookkeeping). No thresholds: this is
not a test.
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

from bridge_bench import OBSERVE, Arrivals, _endpoint, _persistent_channel
from channel_bench import _event, push_all
from common import NodeProcess, client_orb, median_spread, services, settled_pg_counters, stomp_send_rate


def drain(env: dict[str, Any], n: int, sequence: bool, observe: str = "store") -> tuple[float, float, float]:
    """(events/s, PG transactions per event, WAL syncs per event) of one drain of ``n`` queued events; ``observe``:
    see ``bridge_bench.OBSERVE``."""
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
    arrivals = Arrivals(observe, url, queue, dsn, cid)
    c0, w0 = settled_pg_counters(dsn)
    t0 = time.perf_counter()
    bridge.start_bridge()
    arrivals.wait(n)
    elapsed = time.perf_counter() - t0
    c1, w1 = settled_pg_counters(dsn)
    arrivals.close(n)
    bridge.destroy()
    channel.destroy()
    return n / elapsed, (c1 - c0) / n, (w1 - w0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--observe", choices=OBSERVE, default="store",
                    help="how the end of a drain is seen (bridge_bench.OBSERVE; default: %(default)s)")
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
            drain(env, 100, False, args.observe)                                     # warm-up
            kinds = (("structured (one event per push)", False), ("sequence x100", True))
            base: list[float] = []
            runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in kinds}
            for _ in range(args.reps):       # interleaved: each repetition's baseline next to its drains
                base.append(stomp_send_rate(url, 1000, per_tx=100))
                for name, seq in kinds:
                    runs[name].append(drain(env, args.events, seq, args.observe))
            for name, _ in kinds:
                got = runs[name]
                rows.append((name, [r[0] for r in got], statistics.median(r[1] for r in got),
                             statistics.median(r[2] for r in got)))
        finally:
            node.close()
    print(f"\n{args.events} x 1 KB persistent events queued per run, {args.reps} repetition(s), observed by "
          f"{args.observe}; load average before "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after {os.getloadavg()[0]:.2f}\n")
    bmed, blo, bhi = median_spread(base)
    print("| channel → JMS drain | rate/s median (min-max) | raw BEGIN+100 SEND+COMMIT | ratio (min-max) | "
          "PG tx/event | WAL syncs/event |\n|---|---|---|---|---|---|")
    for name, rates, tx, wal in rows:
        med, lo, hi = median_spread(rates)
        rmed, rlo, rhi = median_spread([r / b for r, b in zip(rates, base, strict=True)])
        print(f"| {name} | {med:,.0f} ({lo:,.0f}-{hi:,.0f}) | {bmed:,.0f} ({blo:,.0f}-{bhi:,.0f}) | {rmed:.2f} "
              f"({rlo:.2f}-{rhi:.2f}) | {tx:.2f} | {wal:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
