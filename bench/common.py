"""Shared benchmark plumbing: services, a node subprocess, a client ORB, baselines measured in the same run.

Every benchmark reports absolute rates *and* ratios to baselines measured on the same machine in the same run
(raw PostgreSQL commits, raw STOMP sends), because absolute numbers mean little across machines. Nothing here is a
test: there are no thresholds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from router.services import EmbeddedActiveMQ, EmbeddedPostgres, free_port  # noqa: E402

PAYLOAD = "x" * 1000   # 1 KB payloads, like the ENVIRONMENT.md baselines


@contextmanager
def services() -> Iterator[tuple[str, str]]:
    """(PostgreSQL DSN, STOMP URL): from NSJMS_BENCH_PG_DSN / NSJMS_BENCH_BROKER_URL, else embedded ones."""
    base = Path(tempfile.mkdtemp(prefix="nsjms-bench-"))
    base.chmod(0o755)                    # the embedded PostgreSQL runs as the postgres user
    started: list[Any] = []
    try:
        dsn = os.environ.get("NSJMS_BENCH_PG_DSN") or _start(EmbeddedPostgres(base, free_port()), started)
        url = os.environ.get("NSJMS_BENCH_BROKER_URL") or _start(
            EmbeddedActiveMQ(base, free_port(), free_port()), started)
        yield dsn, url
    finally:
        for svc in reversed(started):
            svc.stop()
        shutil.rmtree(base, ignore_errors=True)


def _start(svc: Any, started: list[Any]) -> str:
    url = svc.start()
    started.append(svc)
    return str(url)


@contextmanager
def node(dsn: str, broker_url: str) -> Iterator[dict[str, Any]]:
    """A ``nsjms serve`` subprocess on a fresh database; yields its endpoints."""
    import psycopg

    db = f"bench_{os.getpid()}_{int(time.time())}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    node_dsn = psycopg.conninfo.make_conninfo(dsn, dbname=db)
    state = Path(tempfile.mkdtemp(prefix="nsjms-bench-node-"))
    port = free_port()
    env = dict(os.environ, NSJMS_POSTGRES_DSN=node_dsn, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "router.cli", "serve", "--state-dir", str(state), "--orb-port", str(port),
           "--broker-url", broker_url, "--log-level", "WARNING"]
    try:
        with open(state / "serve.log", "wb") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                deadline = time.time() + 60
                while not (state / "endpoints.json").exists():
                    if proc.poll() is not None or time.time() > deadline:
                        raise RuntimeError("node did not start: " + (state / "serve.log").read_text()[-2000:])
                    time.sleep(0.1)
                yield json.loads((state / "endpoints.json").read_text())
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
    finally:
        shutil.rmtree(state, ignore_errors=True)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def client_orb() -> Any:
    from omniORB import CORBA

    orb = CORBA.ORB_init(["bench", "-ORBendPoint", "giop:tcp:127.0.0.1:", "-ORBclientCallTimeOutPeriod", "60000",
                          "-ORBnativeCharCodeSet", "UTF-8"], CORBA.ORB_ID)
    orb.resolve_initial_references("RootPOA")._get_the_POAManager().activate()
    return orb


def rate(n: int, fn: Callable[[], None], repeats: int = 3) -> float:
    """Median items/s over ``repeats`` runs of ``fn`` (which handles ``n`` items)."""
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


# ------------------------------------------------------------------------------------------------ baselines
def pg_commit_rate(dsn: str, n: int = 1000, per_tx: int = 1) -> float:
    """Rows/s inserting 1 KB rows, ``per_tx`` rows per committed transaction (executemany)."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS bench_rows (id bigserial, body text)")
        conn.commit()

        def run() -> None:
            for _ in range(n // per_tx):
                with conn.cursor() as cur:
                    cur.executemany("INSERT INTO bench_rows(body) VALUES (%s)", [(PAYLOAD,)] * per_tx)
                conn.commit()

        return rate(n, run)


def stomp_send_rate(url: str, n: int = 1000, per_tx: int = 0) -> float:
    """Persistent 1 KB STOMP sends/s with a receipt each (per_tx = 0) or BEGIN + per_tx SENDs + COMMIT(receipt)."""
    import threading
    from urllib.parse import urlsplit

    import stomp

    class Receipts(stomp.ConnectionListener):
        def __init__(self) -> None:
            self.cond = threading.Condition()
            self.seen: set[str] = set()

        def on_receipt(self, frame: Any) -> None:
            with self.cond:
                self.seen.add(frame.headers["receipt-id"])
                self.cond.notify_all()

    parts = urlsplit(url)
    conn = stomp.Connection12([(parts.hostname, parts.port)], auto_content_length=False)
    listener = Receipts()
    conn.set_listener("r", listener)
    conn.connect(wait=True)
    dest = f"/queue/bench.baseline.{os.getpid()}"
    counter = iter(range(10**9))

    def wait_receipt(receipt: str) -> None:
        with listener.cond:
            if not listener.cond.wait_for(lambda: receipt in listener.seen, timeout=30):
                raise RuntimeError("no STOMP receipt within 30 s")
            listener.seen.discard(receipt)

    def run() -> None:
        if per_tx:
            for _ in range(n // per_tx):
                tx = conn.begin()
                for _ in range(per_tx):
                    conn.send(dest, PAYLOAD, headers={"persistent": "true"}, transaction=tx)
                r = f"c{next(counter)}"
                conn.commit(tx, headers={"receipt": r})
                wait_receipt(r)
        else:
            for _ in range(n):
                r = f"s{next(counter)}"
                conn.send(dest, PAYLOAD, headers={"persistent": "true", "receipt": r})
                wait_receipt(r)

    try:
        return rate(n, run)
    finally:
        conn.disconnect()


def report(title: str, rows: list[tuple[str, float, str, float]]) -> None:
    """rows: (what, rate, baseline name, baseline rate)."""
    print(f"\n== {title}")
    print(f"{'measurement':<58} {'rate/s':>10} {'baseline':>34} {'ratio':>7}")
    for what, r, base_name, base in rows:
        ratio = f"{r / base:.2f}" if base else "-"
        print(f"{what:<58} {r:>10,.0f} {base_name:>24} {base:>9,.0f} {ratio:>7}")
