"""Prepared statements on the channel's hot statements (issue 12): psycopg's ``prepare_threshold``.

    .venv/bin/python bench/prepare_bench.py [--events 1000] [--reps 3]

On one connection to a fresh, migrated database (an embedded PostgreSQL, or ``NSJMS_BENCH_PG_DSN``), each round
stores one persistent event with one queue row (``Store.insert_events``, one commit) and deletes its delivery
(``Store.delete_deliveries``, one commit): the per-event statements of a structured push through a Persistent
channel. Rounds alternate between ``prepare_threshold`` None (never prepared), 5 (psycopg's default: prepared
from the fifth execution on a connection; what the node runs with) and 0 (prepared at once); prints the median and
spread of the events/s of each. Nothing here is a test: there are no thresholds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from router.channel.store import NewEvent, Store
from router.db import Database
from router.node.services import EmbeddedPostgres, free_port

THRESHOLDS: list[int | None] = [None, 5, 0]


def rate(dsn: str, store: Store, threshold: int | None, n: int, seq0: int) -> float:
    with psycopg.connect(dsn, prepare_threshold=threshold) as conn:
        body = b"x" * 1000
        t0 = time.perf_counter()
        for i in range(n):
            with conn.transaction():
                [eid] = store.insert_events(conn, 1, [NewEvent(seq0 + i, 1, body, 0, None, None, [(0, 1)])])
            with conn.transaction():
                store.delete_deliveries(conn, 1, 0, 1, [eid])
        return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="nsjms-bench-prep-"))
    base.chmod(0o755)
    pg: EmbeddedPostgres | None = None
    load = os.getloadavg()
    try:
        dsn = os.environ.get("NSJMS_BENCH_PG_DSN") or ""
        if not dsn:
            pg = EmbeddedPostgres(base, free_port())
            dsn = str(pg.start())
        name = f"bench_prep_{os.getpid()}"
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        dsn = psycopg.conninfo.make_conninfo(dsn, dbname=name)
        db = Database(dsn)
        db.open()
        store = Store()
        with db.unit_of_work() as conn:
            store.insert_channel(conn, 1, {}, {}, {"C": {}, "S": {}})
            store.insert_proxy(conn, 1, "C", 0, 1, "STRUCTURED_PUSH", False, {})
        db.close()
        rates: dict[Any, list[float]] = {t: [] for t in THRESHOLDS}
        seq = 1
        rate(dsn, store, 5, 100, 10_000_000)                      # warm-up
        for _ in range(args.reps):
            for t in THRESHOLDS:
                rates[t].append(rate(dsn, store, t, args.events, seq))
                seq += args.events
        print(f"\n{args.events} events per round, {args.reps} rounds; load average before {load[0]:.2f}, "
              f"after {os.getloadavg()[0]:.2f}\n")
        print("| prepare_threshold | insert + delete commits, events/s median (min-max) | vs None |")
        print("|---|---|---|")
        ref = statistics.median(rates[None])
        for t in THRESHOLDS:
            med = statistics.median(rates[t])
            print(f"| {t} | {med:,.0f} ({min(rates[t]):,.0f}-{max(rates[t]):,.0f}) | {med / ref:.2f} |")
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
