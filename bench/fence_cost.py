"""What the cluster's fence check costs a unit of work (issue 27): this process's CPU per unit of work on the node's
own ``Database``, with and without ``Database.fence`` (``members.check``: one ``SELECT ... FOR KEY SHARE`` round
trip before the COMMIT), alternating, on one embedded PostgreSQL (or ``NSJMS_BENCH_PG_DSN``).

    .venv/bin/python bench/fence_cost.py --units 3000 --reps 3

Each unit of work deletes the queue rows of a batch that is already gone (one ``DELETE`` statement, as the batched
deletes of delivered events): BEGIN, DELETE, [the fence check,] COMMIT. Prints CPU µs and wall µs per unit of work,
median (min-max) over the repetitions. No thresholds: nothing here is a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from router.cluster import members
from router.cluster.lease import LeaseSettings
from router.db import Database

from common import NodeProcess, services


def _run(db: Database, units: int) -> tuple[float, float]:
    """(CPU µs, wall µs) of this process per unit of work."""
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(units):
        with db.unit_of_work() as conn:
            conn.execute("DELETE FROM nsjms_queue WHERE channel_id = %s AND admin_id = %s AND proxy_id = %s "
                         "AND event_id = ANY(%s)", (1, 1, 1, [i, i + 1, i + 2]))
    return (time.process_time() - c0) / units * 1e6, (time.perf_counter() - w0) / units * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    with services() as (dsn, url):
        node = NodeProcess(dsn, url)             # only for its fresh database (never started)
        try:
            db = Database(node.dsn, pool_size=2)
            db.open()
            with db.unit_of_work() as conn:
                epoch = members.join(conn, "bench", "127.0.0.1:1", LeaseSettings(2.0, 600.0))

            def fence(conn: Any) -> None:
                members.check(conn, "bench", epoch)

            _run(db, 200)                         # warm: prepared statements, pool
            db.fence = fence
            _run(db, 200)
            out: dict[str, list[tuple[float, float]]] = {"without": [], "with": []}
            for _ in range(args.reps):
                for name in ("without", "with"):
                    db.fence = fence if name == "with" else None
                    out[name].append(_run(db, args.units))
            db.close()
        finally:
            node.close()
    print(f"{args.units} units of work x {args.reps} repetitions, alternating")
    print("| fence check | CPU µs per unit of work, median (min-max) | wall µs per unit of work |")
    print("|---|---|---|")
    for name, runs in out.items():
        cpu = [c for c, _ in runs]
        wall = [w for _, w in runs]
        print(f"| {name} | {statistics.median(cpu):.0f} ({min(cpu):.0f}-{max(cpu):.0f}) | "
              f"{statistics.median(wall):.0f} |")


if __name__ == "__main__":
    main()
