"""JMS -> channel, before/after: two nodes (``--before DIR``, e.g. a ``git archive`` export of main, and this
checkout) on one PostgreSQL and one ActiveMQ, runs alternating between them; each run's rate, its ratio to a raw
consume measured right before it, the node's CPU per event (``/proc``) and PostgreSQL transactions / WAL syncs per
event. Nothing here is a test: there are no thresholds.

    .venv/bin/python bench/from_jms_ab.py --before /tmp/main-export --messages 2000 --pairs 3
    .venv/bin/python bench/from_jms_ab.py --before /tmp/main-export --t2 100     # pull, in T2s of 100 events
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paths import _connect, _cpu_seconds

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)

import common
from bridge_bench import from_jms_rate
from common import NodeProcess, client_orb, services, settled_pg_counters, stomp_consume_rate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="the checkout the 'before' node runs from")
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--t2", type=int, default=0, help="TransactionEvents: > 0 runs pull rounds in T2s")
    args = ap.parse_args(argv)
    n, t2 = args.messages, args.t2
    roots = {"before": args.before.resolve(), "after": common.ROOT}
    results: dict[str, list[tuple[float, ...]]] = {k: [] for k in roots}
    with services() as (dsn, url):
        envs: dict[str, Any] = {}
        try:
            orb = client_orb()
            for name, root in roots.items():
                common.ROOT = root              # NodeProcess.start runs ``router.cli`` from this directory
                node = NodeProcess(dsn, url)
                envs[name] = _connect(node.start(), url, node, orb)
            for env in envs.values():           # warm-up
                from_jms_rate(env.factory, env.bridges, url, 300, pull=bool(t2), t2_events=t2)
            for p in range(args.pairs):
                for name in (["before", "after"] if p % 2 == 0 else ["after", "before"]):
                    env = envs[name]
                    base = stomp_consume_rate(url, 1000)
                    c0, w0 = settled_pg_counters(env.dsn)
                    cpu0 = _cpu_seconds(env.node.proc.pid)
                    rate = from_jms_rate(env.factory, env.bridges, url, n, pull=bool(t2), t2_events=t2)
                    cpu1 = _cpu_seconds(env.node.proc.pid)
                    c1, w1 = settled_pg_counters(env.dsn)
                    row = (rate, rate / base, (cpu1 - cpu0) * 1000 / n, (c1 - c0) / n, (w1 - w0) / n)
                    results[name].append(row)
                    print(f"{name:6s} {rate:7,.0f}/s ratio {row[1]:.2f} (raw {base:,.0f}/s), node CPU {row[2]:.3f} "
                          f"ms/event, PG tx {row[3]:.3f} / WAL syncs {row[4]:.3f} per event, load "
                          f"{os.getloadavg()[0]:.1f}", flush=True)
        finally:
            for env in envs.values():
                env.node.close()
    for name, rows in results.items():
        if rows:
            print(f"{name}: median {statistics.median(r[0] for r in rows):,.0f}/s, ratio "
                  f"{statistics.median(r[1] for r in rows):.2f}, node CPU {statistics.median(r[2] for r in rows):.3f} "
                  f"ms/event, PG tx {statistics.median(r[3] for r in rows):.3f} per event")
    return 0


if __name__ == "__main__":
    sys.exit(main())
