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

from router.jms.stomp.link import no_delay  # noqa: E402  (the node's own: the raw baselines' socket as the node's)
from router.node.services import EmbeddedActiveMQ, EmbeddedPostgres, free_port  # noqa: E402
from router.security.auth import Role, install_client, install_token, use_token  # noqa: E402

from meter import CpuMeter  # noqa: E402  (bench/meter.py: CPU of the bench's own process trees)

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
        for svc in started:          # the meter's roots: only the services this bench started (external: not seen)
            METER.roots["postgres" if isinstance(svc, EmbeddedPostgres) else "broker"] = svc.pid
        yield dsn, url
    finally:
        METER.roots.update(broker=None, postgres=None)
        for svc in reversed(started):
            svc.stop()
        shutil.rmtree(base, ignore_errors=True)


def _start(svc: Any, started: list[Any]) -> str:
    url = svc.start()
    started.append(svc)
    return str(url)


class NodeProcess:
    """A ``nsjms serve`` subprocess on its own fresh database, which can be stopped and started again (same state
    directory, database and port: persistent references stay valid across the restart)."""

    def __init__(self, dsn: str, broker_url: str) -> None:
        import psycopg

        self.db = f"bench_{os.getpid()}_{int(time.time() * 1000)}"
        self.admin_dsn = dsn
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.db}"')
        self.dsn = psycopg.conninfo.make_conninfo(dsn, dbname=self.db)
        self.broker_url = broker_url
        self.state = Path(tempfile.mkdtemp(prefix="nsjms-bench-node-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> dict[str, Any]:
        """Start the node and wait until it is ready; returns its endpoints (plus ``bench_dsn``, its database)."""
        (self.state / "endpoints.json").unlink(missing_ok=True)
        install_token(self.state, BENCH_ADMIN_TOKEN, Role.OPERATOR)   # the bench creates channels and bridges
        env = dict(os.environ, NSJMS_POSTGRES_DSN=self.dsn, PYTHONUNBUFFERED="1")
        cmd = [sys.executable, "-m", "router.cli", "serve", "--state-dir", str(self.state), "--orb-port",
               str(self.port), "--broker-url", self.broker_url, "--log-level", "WARNING"]
        with open(self.state / "serve.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while not (self.state / "endpoints.json").exists():
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("node did not start: " + (self.state / "serve.log").read_text()[-2000:])
            time.sleep(0.1)
        endpoints: dict[str, Any] = json.loads((self.state / "endpoints.json").read_text())
        endpoints["bench_dsn"] = self.dsn
        return endpoints

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def close(self) -> None:
        import psycopg

        self.stop()
        shutil.rmtree(self.state, ignore_errors=True)
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')


@contextmanager
def node_process(dsn: str, broker_url: str) -> Iterator[NodeProcess]:
    """A started :class:`NodeProcess` (``.start()`` already called), closed afterwards."""
    proc = NodeProcess(dsn, broker_url)
    try:
        proc.start()
        yield proc
    finally:
        proc.close()


@contextmanager
def node(dsn: str, broker_url: str) -> Iterator[dict[str, Any]]:
    """A ``nsjms serve`` subprocess on a fresh database; yields its endpoints."""
    with node_process(dsn, broker_url) as proc:
        yield json.loads((proc.state / "endpoints.json").read_text()) | {"bench_dsn": proc.dsn}


#: The bench process's admin credential, registered in each bench node's state directory before it starts.
BENCH_ADMIN_TOKEN = "nsjms-bench:" + __import__("secrets").token_urlsafe(24)


def client_orb() -> Any:
    from omniORB import CORBA

    install_client()                 # presents BENCH_ADMIN_TOKEN (docs/security.md)
    use_token(BENCH_ADMIN_TOKEN)
    orb = CORBA.ORB_init(["bench", "-ORBendPoint", "giop:tcp:127.0.0.1:", "-ORBclientCallTimeOutPeriod", "60000",
                          "-ORBnativeCharCodeSet", "UTF-8"], CORBA.ORB_ID)
    orb.resolve_initial_references("RootPOA")._get_the_POAManager().activate()
    return orb


METER = CpuMeter()


def rate(n: int, fn: Callable[[], None], repeats: int = 3) -> float:
    """Median items/s over ``repeats`` runs of ``fn`` (which handles ``n`` items); each run is a timed window of
    :data:`METER`."""
    rates = []
    for _ in range(repeats):
        METER.start()
        t0 = time.perf_counter()
        fn()
        rates.append(n / (time.perf_counter() - t0))
        METER.stop(n)
    return statistics.median(rates)


# ------------------------------------------------------------------------------------------------ baselines
def pg_commit_rate(dsn: str, n: int = 1000, per_tx: int = 1) -> float:
    """Rows/s inserting 1 KB rows, ``per_tx`` rows per committed transaction (executemany), into an ordinary
    (WAL-logged) table, so each commit waits for its WAL flush as the node's commits do. (A TEMP table is not
    WAL-logged: PostgreSQL then commits without flushing, which made this baseline 4x too fast.)"""
    import psycopg

    table = f"bench_rows_{os.getpid()}"
    with psycopg.connect(dsn) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (id bigserial, body text)")
        conn.commit()

        def run() -> None:
            for _ in range(n // per_tx):
                with conn.cursor() as cur:
                    cur.executemany(f"INSERT INTO {table}(body) VALUES (%s)", [(PAYLOAD,)] * per_tx)
                conn.commit()

        try:
            return rate(n, run)
        finally:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.commit()


def _receipts() -> Any:
    """A stomp.py listener that records RECEIPT frames; ``wait(receipt_id)`` blocks until that one came."""
    import threading

    import stomp

    class Receipts(stomp.ConnectionListener):  # type: ignore[misc]
        def __init__(self) -> None:
            self.cond = threading.Condition()
            self.seen: set[str] = set()

        def on_receipt(self, frame: Any) -> None:
            with self.cond:
                self.seen.add(frame.headers["receipt-id"])
                self.cond.notify_all()

        def wait(self, receipt: str) -> None:
            with self.cond:
                if not self.cond.wait_for(lambda: receipt in self.seen, timeout=30):
                    raise RuntimeError("no STOMP receipt within 30 s")
                self.seen.discard(receipt)

    return Receipts()


def stomp_send_rate(url: str, n: int = 1000, per_tx: int = 0, headers: dict[str, str] | None = None, *,
                    nodelay: bool = False) -> float:
    """Persistent 1 KB STOMP sends/s with a receipt each (per_tx = 0) or BEGIN + per_tx SENDs + COMMIT(receipt); the
    median of three runs of ``n``. ``headers``: more headers on every SEND (``persistent`` stays true).
    ``nodelay``: TCP_NODELAY on the client's socket, as the node sets it since round 7 (stomp.py's default, the
    issue's baseline, leaves Nagle's algorithm on)."""
    extra = {**(headers or {}), "persistent": "true"}
    from urllib.parse import urlsplit

    import stomp

    parts = urlsplit(url)
    conn = stomp.Connection12([(parts.hostname, parts.port)], auto_content_length=False)
    listener = _receipts()
    conn.set_listener("r", listener)
    conn.connect(wait=True)
    if nodelay:
        no_delay(conn)
    dest = f"/queue/bench.baseline.{os.getpid()}"
    counter = iter(range(10**9))
    wait_receipt = listener.wait

    def run() -> None:
        if per_tx:
            for _ in range(n // per_tx):
                tx = conn.begin()
                for _ in range(per_tx):
                    conn.send(dest, PAYLOAD, headers=extra, transaction=tx)
                r = f"c{next(counter)}"
                conn.commit(tx, headers={"receipt": r})
                wait_receipt(r)
        else:
            for _ in range(n):
                r = f"s{next(counter)}"
                conn.send(dest, PAYLOAD, headers={**extra, "receipt": r})
                wait_receipt(r)

    try:
        return rate(n, run)
    finally:
        conn.disconnect()


def preload(url: str, queue: str, n: int) -> None:
    """SEND ``n`` persistent 1 KB messages (header ``n`` = 0 .. n-1) to ``queue``, the last with a receipt, and
    return once it came (a timed window that starts earlier would time the broker still storing the preload too;
    the receipt-less sends return long before). STOMP's receipt only says the frames before it were received;
    that they were also stored relies on ActiveMQ Classic handling one connection's frames in order (a persistent
    SEND with a receipt is stored before its receipt)."""
    from urllib.parse import urlsplit

    import stomp

    parts = urlsplit(url)
    conn = stomp.Connection12([(parts.hostname, parts.port)], auto_content_length=False)
    receipts = _receipts()
    conn.set_listener("r", receipts)
    conn.connect(wait=True)
    try:
        for i in range(n):
            headers = {"persistent": "true", "n": str(i)} | ({"receipt": "preloaded"} if i == n - 1 else {})
            conn.send(f"/queue/{queue}", PAYLOAD, headers=headers)
        if n:
            receipts.wait("preloaded")
    finally:
        conn.disconnect()


def stomp_consume_rate(url: str, n: int = 1000, *, nodelay: bool = False) -> float:
    """Raw persistent 1 KB messages/s consumed with ``client-individual`` acks (queue preloaded with ``n``).
    ``nodelay``: TCP_NODELAY on the consumer's socket (see :func:`stomp_send_rate`)."""
    import threading
    from urllib.parse import urlsplit

    import stomp

    parts = urlsplit(url)
    dest = f"/queue/bench.consume.{os.getpid()}.{time.time_ns()}"
    producer = stomp.Connection12([(parts.hostname, parts.port)], auto_content_length=False)
    receipts = _receipts()
    producer.set_listener("r", receipts)
    producer.connect(wait=True)

    class Acker(stomp.ConnectionListener):  # type: ignore[misc]
        def __init__(self, conn: Any) -> None:
            self.conn, self.n, self.done = conn, 0, threading.Event()

        def on_message(self, frame: Any) -> None:
            self.conn.ack(frame.headers["ack"])
            self.n += 1
            if self.n >= n:
                self.done.set()

    rates = []
    for rep in range(3):
        for _ in range(n):
            producer.send(dest, PAYLOAD, headers={"persistent": "true"})
        producer.send(dest, "", headers={"persistent": "true", "receipt": f"loaded{rep}"})
        receipts.wait(f"loaded{rep}")                    # the broker has every message of the preload
        conn = stomp.Connection12([(parts.hostname, parts.port)], auto_content_length=False)
        acker = Acker(conn)
        acker.n = -1                                      # the marker message from the preload
        conn.set_listener("a", acker)
        conn.connect(wait=True)
        if nodelay:
            no_delay(conn)
        METER.start()
        t0 = time.perf_counter()
        conn.subscribe(dest, id="1", ack="client-individual", headers={"activemq.prefetchSize": "1000"})
        if not acker.done.wait(120):
            raise RuntimeError(f"raw consume: only {acker.n}/{n}")
        rates.append(n / (time.perf_counter() - t0))
        METER.stop(n)
        conn.disconnect()
    producer.disconnect()
    return statistics.median(rates)


def pg_counters(dsn: str) -> tuple[int, int]:
    """(transactions committed in this database, WAL syncs of the cluster) from pg_stat_database / pg_stat_wal."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        commits = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
                               ).fetchone()
        syncs = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
    return int(commits[0]) if commits else 0, int(syncs[0]) if syncs else 0


def settled_pg_counters(dsn: str, deadline_s: float = 30.0) -> tuple[int, int]:
    """:func:`pg_counters` once PostgreSQL's statistics have caught up (backends flush them about once a second):
    two reads 1.2 s apart whose commit counts differ by at most 3 (an idle node's background transactions)."""
    end = time.monotonic() + deadline_s
    last = pg_counters(dsn)
    while time.monotonic() < end:
        time.sleep(1.2)
        now = pg_counters(dsn)
        if now[0] - last[0] <= 3:
            return now
        last = now
    return last


def median_spread(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(values), min(values), max(values)


def report(title: str, rows: list[tuple[str, float, str, float]]) -> None:
    """rows: (what, rate, baseline name, baseline rate)."""
    print(f"\n== {title}")
    print(f"{'measurement':<58} {'rate/s':>10} {'baseline':>34} {'ratio':>7}")
    for what, r, base_name, base in rows:
        ratio = f"{r / base:.2f}" if base else "-"
        print(f"{what:<58} {r:>10,.0f} {base_name:>24} {base:>9,.0f} {ratio:>7}")
