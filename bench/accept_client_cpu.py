"""The accept path's PostgreSQL client cost per push, CPU-timed in one process (issue 27).

    .venv/bin/python bench/accept_client_cpu.py [--events 3000] [--reps 3] [--tree DIR --tree DIR ...]

What a lone supplier's persistent push costs the node between the channel and PostgreSQL: ``GroupCommit.insert``
of one event (1 KB body, one consumer target, the ledger on as the node's default) on the node's own ``Database``
(pool, autocommit single statement) and ``Store``, each call returning once durable. The figure is this process's
CPU (``time.process_time``: Python, psycopg, libpq and the pool's threads; not PostgreSQL's) per call, after a
warm-up (prepared statements in place). With several ``--tree`` checkouts (e.g. ``git worktree add /tmp/old <base>``
and this one) each round runs one worker per tree, alternating, on the same embedded PostgreSQL and channel: an A/B
of the code, not of the machine's moment. Nothing here is a test: there are no thresholds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker(dsn: str, events: int, seq0: int) -> None:
    """(In a subprocess whose cwd is the tree under test.) Print CPU µs and wall µs per push."""
    sys.path.insert(0, os.getcwd())
    from router.channel.groupcommit import GroupCommit
    from router.channel.store import NewEvent, Store
    from router.db import Database

    db = Database(dsn, 4)
    db.open(migrate=False)
    try:
        import router.db as rdb
        if hasattr(rdb, "FenceToken"):               # a tree whose accept statement carries the node's fence
            token = rdb.FenceToken("bench", 1)

            class Fence:                             # as the node's (router/node/cluster.py), never refused here
                def token(self) -> object:
                    return token

                def refused(self, exc: object) -> None:
                    raise AssertionError(f"the bench's accept was refused: {exc}")

            db.statement_fence = Fence()  # type: ignore[assignment]
        commit = GroupCommit(db, Store(), one_statement=True)
        body = b"x" * 1000

        def push(seq: int) -> None:
            commit.insert(1, [NewEvent(seq, 1, body, 0, None, None, [(0, 1)])])

        for i in range(200):                         # warm-up: connections, prepared statements
            push(seq0 + i)
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(events):
            push(seq0 + 200 + i)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        print(f"{cpu / events * 1e6:.1f} {wall / events * 1e6:.1f}")
    finally:
        db.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tree", action="append", default=[], help="a checkout to measure (default: this one)")
    ap.add_argument("--worker", nargs=3, metavar=("DSN", "EVENTS", "SEQ0"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), int(args.worker[2]))
        return 0
    sys.path.insert(0, str(ROOT))
    import psycopg

    from router.channel.store import Store
    from router.db import Database
    from router.node.services import EmbeddedPostgres, free_port

    trees = [str(Path(t).resolve()) for t in args.tree] or [str(ROOT)]
    base = Path(tempfile.mkdtemp(prefix="nsjms-bench-accept-"))
    base.chmod(0o755)
    pg: EmbeddedPostgres | None = None
    load = os.getloadavg()
    try:
        dsn = os.environ.get("NSJMS_BENCH_PG_DSN") or ""
        if not dsn:
            pg = EmbeddedPostgres(base, free_port())
            dsn = str(pg.start())
        name = f"bench_accept_{os.getpid()}"
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        dsn = psycopg.conninfo.make_conninfo(dsn, dbname=name)
        db = Database(dsn)
        db.open()
        with db.unit_of_work() as conn:
            Store().insert_channel(conn, 1, {}, {}, {"C": {}, "S": {}})
            Store().insert_proxy(conn, 1, "C", 0, 1, "STRUCTURED_PUSH", False, {})
            # the member and owner rows a fenced accept statement checks (a tree without the fence ignores them)
            conn.execute("INSERT INTO nsjms_member (node_id, epoch, state, lease_until, renewed_at, joined_at) "
                         "VALUES ('bench', 1, 'live', now() + interval '1 day', now(), now())")
            conn.execute("INSERT INTO nsjms_owner (kind, object_id, node_id) VALUES ('channel', 1, 'bench')")
        db.close()
        cpu: dict[str, list[float]] = {t: [] for t in trees}
        wall: dict[str, list[float]] = {t: [] for t in trees}
        seq = 1
        for _ in range(args.reps):
            for tree in trees:
                out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", dsn,
                                      str(args.events), str(seq)], cwd=tree, check=True, capture_output=True,
                                     text=True).stdout.split()
                cpu[tree].append(float(out[0]))
                wall[tree].append(float(out[1]))
                seq += args.events + 200
        print(f"\n{args.events} pushes per worker, {args.reps} rounds alternating; load average before "
              f"{load[0]:.2f}, after {os.getloadavg()[0]:.2f}\n")
        print("| tree | client CPU µs per push, median (min-max) | wall µs per push, median |")
        print("|---|---|---|")
        for tree in trees:
            c = cpu[tree]
            print(f"| {tree} | {statistics.median(c):.0f} ({min(c):.0f}-{max(c):.0f}) | "
                  f"{statistics.median(wall[tree]):.0f} |")
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
