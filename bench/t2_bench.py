"""T2 (the routing transaction, NJI 2.7) benchmarks, with baselines measured in the same run.

    .venv/bin/python bench/t2_bench.py                 # everything
    .venv/bin/python bench/t2_bench.py --recovery      # only the restart-with-1,000-in-doubt measurement
    .venv/bin/python bench/t2_bench.py --profile DIR   # also write cProfile dumps of the recovery pass to DIR
    .venv/bin/python bench/t2_bench.py --no-recovery --only out --events 1000 --repeats 3   # channel -> JMS alone
    .venv/bin/python bench/t2_bench.py --no-recovery --only latency --latency-rates 1000
    .venv/bin/python bench/t2_bench.py --no-recovery --only out --py-spy /tmp/spy   # + py-spy of the node

Measurements (3 repetitions each, median and spread):

* **recovery**: 1,000 in-doubt T2s made for real — PostgreSQL prepared branches with this node's xids, half of
  them with a COMMIT record in the node's file log and outbox rows (recovery commits them and re-sends the rows
  with their dedupe ids), half undecided (presumed abort) — then (a) ``NodeTransactions.start()`` alone and
  (b) a real ``nsjms serve`` restart on that state until its channel factory answers a call, against (c) the same
  node start with nothing in doubt;
* **channel → JMS** under T2 with ``TransactionEvents=100`` against raw stomp.py BEGIN + 100 SENDs + COMMIT;
* **JMS → channel** under T2 against raw stomp.py consume + client-individual ack;
* **T2 latency** p50/p99 at 1,000 events/s offered.

The data-path measurements need the T2 data paths (EnableTransaction on a bridge); until they exist the bench
says which path is missing and exits non-zero.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # this checkout's router/xa, not the venv's

from router.node.services import EmbeddedActiveMQ, EmbeddedPostgres, free_port

from common import PAYLOAD, ROOT, client_orb

NODE_ID = "node1"          # `nsjms serve`'s default node id: the real restart recovers these transactions
PG_BRANCH, SEND_BRANCH = "pg", "stomp"
MAX_PREPARED = 1200        # the embedded PostgreSQL allows 64 prepared transactions; 1,000 in doubt need more


class _BenchPostgres(EmbeddedPostgres):
    def _server_options(self) -> str:
        return super()._server_options().replace("max_prepared_transactions=64",
                                                 f"max_prepared_transactions={MAX_PREPARED}")


@contextmanager
def t2_services() -> Iterator[tuple[str, str]]:
    """(admin DSN, STOMP URL): NSJMS_BENCH_PG_DSN / NSJMS_BENCH_BROKER_URL, else embedded ones (PostgreSQL with
    max_prepared_transactions large enough for 1,000 in-doubt transactions)."""
    base = Path(tempfile.mkdtemp(prefix="nsjms-t2bench-"))
    base.chmod(0o755)
    started: list[Any] = []
    try:
        dsn = os.environ.get("NSJMS_BENCH_PG_DSN") or _start(_BenchPostgres(base, free_port()), started)
        url = os.environ.get("NSJMS_BENCH_BROKER_URL") or _start(
            EmbeddedActiveMQ(base, free_port(), free_port()), started)
        yield dsn, url
    finally:
        for svc in reversed(started):
            svc.stop()
        shutil.rmtree(base, ignore_errors=True)


def _start(svc: Any, started: list[Any]) -> str:
    url = str(svc.start())
    started.append(svc)
    return url


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f})"


# ------------------------------------------------------------------------------------------------ recovery
class Scenario:
    """A fresh database + state directory holding ``n`` in-doubt T2s of node ``node1`` (see the module doc)."""

    def __init__(self, admin_dsn: str, url: str, n: int, rows_per_txn: int) -> None:
        import psycopg

        self.admin_dsn, self.url, self.n, self.rows = admin_dsn, url, n, rows_per_txn
        self.dbname = f"t2bench_{os.getpid()}_{time.time_ns() % 10**9}"
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.dbname}"')
        self.dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=self.dbname)
        self.state = Path(tempfile.mkdtemp(prefix="nsjms-t2bench-state-"))
        self.queue = f"t2bench.recovery.{self.dbname}"
        self.committed: list[str] = []
        self.undecided: list[str] = []

    def create(self) -> None:
        """Migrate the schema, then make the in-doubt transactions with the node's own xids and log."""
        import psycopg
        from psycopg import sql

        from router.db import Database
        from router.routing.t2.transactions import OutboxRow, outbox_insert
        from xa.log import FileLog
        from xa.records import Commit, Participant
        from xa.xid import NodeId, branch_xid, dedupe_id, new_gtrid

        db = Database(self.dsn, 2)
        db.open()
        db.close()
        node = NodeId(NODE_ID)
        log = FileLog(self.state, node)
        parts = (Participant(PG_BRANCH, "postgresql", "postgresql", False),
                 Participant(SEND_BRANCH, "stomp-send", "stomp-send", True))
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for i in range(self.n):
                gtrid = new_gtrid(node)
                decided = i % 2 == 0
                conn.execute("BEGIN")
                if decided:
                    outbox_insert(conn, [OutboxRow(gtrid, k, dedupe_id(gtrid, k), 1, f"/queue/{self.queue}",
                                                   {"nsjms_dedupe_id": dedupe_id(gtrid, k), "persistent": "true"},
                                                   PAYLOAD.encode()) for k in range(self.rows)])
                else:  # undecided T2: its (uncommitted) outbox rows vanish with the presumed abort
                    outbox_insert(conn, [OutboxRow(gtrid, 0, dedupe_id(gtrid, 0), 1, f"/queue/{self.queue}", {},
                                                   b"never")])
                conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(str(branch_xid(gtrid,
                                                                                                 PG_BRANCH)))))
                if decided:
                    log.append(Commit(gtrid, parts, None, time.time()), durable=False)
                    self.committed.append(gtrid)
                else:
                    self.undecided.append(gtrid)
        log.compact()   # synced
        log.close()

    def check(self) -> None:
        """Nothing prepared is left, the outbox was re-sent exactly (every dedupe id once) and then purged."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            left = conn.execute("SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()")
            row = left.fetchone()
            assert row is not None and row[0] == 0, f"{row} prepared transactions left"
        got = drain(self.url, self.queue, len(self.committed) * self.rows)
        want = {f"{g}/{k}" for g in self.committed for k in range(self.rows)}
        assert got == want, f"re-sent {len(got)} distinct dedupe ids, wanted {len(want)}"

    def drop(self) -> None:
        import psycopg

        shutil.rmtree(self.state, ignore_errors=True)
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')


def drain(url: str, queue: str, want: int, timeout: float = 30.0) -> set[str]:
    """The dedupe ids of the messages on ``queue`` (waits for ``want`` of them, then for silence)."""
    from router.jms.transport import open_transport
    from router.mapping.stomp_codec import StompCodec

    t = open_transport(url, codec=StompCodec())
    t.connect()
    seen: list[str] = []
    try:
        sub = t.subscribe(f"/queue/{queue}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            d = sub.receive(0.5 if len(seen) >= want else 5.0)
            if d is None:
                if len(seen) >= want:
                    break
                continue
            t.ack(d)
            seen.append(d.headers["nsjms_dedupe_id"])
    finally:
        t.close()
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} duplicate re-sends"
    return set(seen)


def time_node_transactions(s: Scenario, profile: Path | None) -> tuple[float, float]:
    """Seconds of ``NodeTransactions.start()`` (the first recovery pass and the purge; the re-sends follow in
    its housekeeping thread) and seconds until every in-doubt T2 is finished (the log holds none)."""
    from router.db import Database
    from router.jms.transport import open_transport
    from router.mapping.stomp_codec import StompCodec
    from router.routing.t2.transactions import NodeTransactions

    db = Database(s.dsn, 8)
    db.open()
    t2 = NodeTransactions(NODE_ID, s.state, db, s.dsn,
                          transport=lambda: open_transport(s.url, codec=StompCodec()))
    prof = cProfile.Profile() if profile else None
    try:
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        report = t2.start(background=True)
        if prof:
            prof.disable()
        started = time.perf_counter() - t0
        deadline = time.monotonic() + 120
        while t2.log.live():
            assert time.monotonic() < deadline, f"{len(t2.log.live())} T2s still in the log after 120 s"
            time.sleep(0.005)
        finished = time.perf_counter() - t0
        assert not report.errors, report.errors[:5]
        assert len(report.rolled_back) == len(s.undecided), (len(report.rolled_back), len(s.undecided))
        resends = len(getattr(report, "deferred", ())) + len(report.resent)   # (older code re-sent in start())
        assert resends == len(s.committed), (resends, len(s.committed))
    finally:
        t2.close()
        db.close()
    if prof and profile:
        profile.mkdir(parents=True, exist_ok=True)
        prof.dump_stats(str(profile / f"recovery-{time.time_ns()}.prof"))
    return started, finished


def time_node_start(s: Scenario) -> float:
    """Seconds from spawning ``nsjms serve`` on the scenario's state until its channel factory answers."""
    import CosNotifyChannelAdmin as NCA

    port = free_port()
    env = dict(os.environ, NSJMS_POSTGRES_DSN=s.dsn, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "router.cli", "serve", "--state-dir", str(s.state), "--orb-port", str(port),
           "--broker-url", s.url, "--log-level", "WARNING"]
    orb = client_orb()
    endpoints = s.state / "endpoints.json"
    endpoints.unlink(missing_ok=True)
    with open(s.state / "serve.log", "ab") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while not endpoints.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("node did not start: " + (s.state / "serve.log").read_text()[-3000:])
                time.sleep(0.005)
            ep = json.loads(endpoints.read_text())
            factory = orb.string_to_object(ep["event_channel_factory"]["corbaloc"])._narrow(NCA.EventChannelFactory)
            factory.get_all_channels()
            elapsed = time.perf_counter() - t0
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            orb.destroy()
    return elapsed


def recovery(dsn: str, url: str, n: int, rows: int, repeats: int, profile: Path | None) -> dict[str, list[float]]:
    empty = "node start, nothing in doubt"
    out: dict[str, list[float]] = {"NodeTransactions.start()": [], "  ... until every T2 finished": [],
                                   "node restart until routing": [], empty: []}
    for _ in range(repeats):
        for what in ("NodeTransactions.start()", "node restart until routing", empty):
            s = Scenario(dsn, url, n if what != empty else 0, rows)
            try:
                s.create()
                if what == "NodeTransactions.start()":
                    started, finished = time_node_transactions(s, profile)
                    out[what].append(started)
                    out["  ... until every T2 finished"].append(finished)
                else:
                    out[what].append(time_node_start(s))
                s.check()
            finally:
                s.drop()
    return out


def print_recovery(n: int, rows: int, res: dict[str, list[float]]) -> None:
    print(f"\n== recovery: {n} in-doubt T2s ({n // 2} with a logged COMMIT and {rows} outbox row(s) each, "
          f"{n - n // 2} undecided), seconds")
    for what, values in res.items():
        print(f"{what:<34} {spread(values)}")


# ----------------------------------------------------------------------------------------- data paths
def missing_paths() -> list[str]:
    """The T2 data paths this tree lacks (empty when both are there)."""
    import importlib.util

    wanted = {"channel → JMS under T2 (router.bridge.txout, branch h/t2out)": "router.bridge.txout",
              "JMS → channel under T2 (router.bridge.t2in, branch h/t2in)": "router.bridge.t2in"}
    return [what for what, module in wanted.items() if importlib.util.find_spec(module) is None]


def _t2_out_route(factory: Any, bf: Any, tx_events: int) -> tuple[Any, Any, str]:
    """A Persistent channel and a bridge to a fresh queue with ``enable_transaction(tx_events, 60)``."""
    from idl.generated import NsjmsAdmin

    from bridge_bench import _endpoint, _persistent_channel

    channel, cid = _persistent_channel(factory)
    queue = f"bench.t2out.{cid}"
    bridge, _ = bf.create_bridge(_endpoint("SOURCE", cid, None, False), _endpoint("SINK", None, queue, False))
    bridge._narrow(NsjmsAdmin.ManagedBridge).enable_transaction(tx_events, 60)
    bridge.start_bridge()
    return channel, bridge, queue


def to_jms_t2_rate(factory: Any, bf: Any, url: str, n: int, tx_events: int = 100) -> float:
    """Channel → JMS under T2: events pushed 100 per call (a sequence supplier, so the supplier is not the limit),
    timed until the last one is received by a STOMP consumer."""
    import CosNotifyChannelAdmin as NCA

    from bridge_bench import _count_queue
    from channel_bench import Counter, _event

    channel, bridge, queue = _t2_out_route(factory, bf, tx_events)
    counter = Counter()
    conn = _count_queue(url, queue, counter)
    pc, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(NCA.SEQUENCE_EVENT)
    pc = pc._narrow(NCA.SequenceProxyPushConsumer)
    pc.connect_sequence_push_supplier(None)
    events = [_event(i) for i in range(n)]
    t0 = time.perf_counter()
    for i in range(0, n, 100):
        pc.push_structured_events(events[i:i + 100])
    counter.wait(n)
    elapsed = time.perf_counter() - t0
    conn.disconnect()
    bridge.destroy()
    channel.destroy()
    return n / elapsed


def t2_latency(factory: Any, bf: Any, url: str, n: int, per_s: float, tx_events: int = 100,
               suppliers: int = 10) -> tuple[list[float], float]:
    """Channel → JMS under T2: ``n`` events offered at ``per_s`` by ``suppliers`` threads (each its own structured
    push proxy: one push is a PostgreSQL commit into the channel, so one thread alone cannot offer 1,000/s), each
    paced on the clock; returns each event's milliseconds from the push call to its arrival at a STOMP consumer,
    and the rate actually offered."""
    from urllib.parse import urlsplit

    import stomp

    from omniORB import CORBA

    import CosNotification
    import CosNotifyChannelAdmin as NCA

    channel, bridge, queue = _t2_out_route(factory, bf, tx_events)
    lat: list[float] = []
    done = threading.Event()

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            lat.append((time.time_ns() - int(frame.headers["$fd_sent"])) / 1e6)
            if len(lat) >= n:
                done.set()

    parts = urlsplit(url)
    conn = stomp.Connection12([(parts.hostname, parts.port)])
    conn.set_listener("l", Listener())
    conn.connect(wait=True)
    conn.subscribe(f"/queue/{queue}", id="1", ack="auto", headers={"activemq.prefetchSize": "1000"})
    head = CosNotification.EventHeader(CosNotification.FixedEventHeader(
        CosNotification.EventType("Bench", "Latency"), "lat"), [])
    proxies = []
    for _ in range(suppliers):
        pc, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(NCA.STRUCTURED_EVENT)
        pc = pc._narrow(NCA.StructuredProxyPushConsumer)
        pc.connect_structured_push_supplier(None)
        proxies.append(pc)
    t0 = time.perf_counter() + 0.1

    def supply(k: int) -> None:
        for i in range(k, n, suppliers):
            delay = t0 + i / per_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            fd = [CosNotification.Property("sent", CORBA.Any(CORBA.TC_string, str(time.time_ns())))]
            proxies[k].push_structured_event(CosNotification.StructuredEvent(head, fd,
                                                                             CORBA.Any(CORBA.TC_string, PAYLOAD)))

    threads = [threading.Thread(target=supply, args=(k,)) for k in range(suppliers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    offered = n / (time.perf_counter() - t0)
    if not done.wait(120):
        raise RuntimeError(f"only {len(lat)}/{n} latency events arrived")
    conn.disconnect()
    bridge.destroy()
    channel.destroy()
    return lat, offered


def pipelined_raw_rate(url: str, n: int, connections: int, per_tx: int = 100) -> float:
    """Raw stomp.py in the pattern of a pipelined channel -> JMS T2, without the node: one thread sends BEGIN +
    ``per_tx`` persistent SENDs (the last receipted) and waits for that receipt, then hands the COMMIT (receipt
    awaited) to a second thread and goes on with the next transaction while at most one COMMIT is pending, on one
    connection or on ``connections`` connections in turn. Shows what the broker's serialisation of one connection
    costs (the next transaction's frames wait behind the previous COMMIT's sync)."""
    from urllib.parse import urlsplit

    import stomp

    from common import _receipts

    parts = urlsplit(url)
    conns = []
    for _ in range(connections):
        c = stomp.Connection12([(parts.hostname, parts.port)], auto_content_length=False)
        listener = _receipts()
        c.set_listener("r", listener)
        c.connect(wait=True)
        conns.append((c, listener))
    dest = f"/queue/bench.pipelined.{os.getpid()}.{connections}"
    pending = threading.Semaphore(1)             # at most one COMMIT in flight, as the proxy's completer
    commits: list[threading.Thread] = []
    t0 = time.perf_counter()
    for k in range(n // per_tx):
        conn, listener = conns[k % connections]
        tx = conn.begin()
        for i in range(per_tx):
            headers = {"persistent": "true"} | ({"receipt": f"s{k}"} if i == per_tx - 1 else {})
            conn.send(dest, PAYLOAD, headers=headers, transaction=tx)
        listener.wait(f"s{k}")
        pending.acquire()

        def commit(conn: Any = conn, listener: Any = listener, tx: str = tx, k: int = k) -> None:
            conn.commit(tx, headers={"receipt": f"c{k}"})
            listener.wait(f"c{k}")
            pending.release()

        commits.append(threading.Thread(target=commit))
        commits[-1].start()
    for t in commits:
        t.join()
    elapsed = time.perf_counter() - t0
    for c, _ in conns:
        c.disconnect()
    return n / elapsed


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextmanager
def _py_spy(pid: int, out: Path | None) -> Iterator[None]:
    """``py-spy record --idle --format raw`` of the node while the block runs (``out`` None: nothing)."""
    if out is None:
        yield
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    spy = subprocess.Popen([exe, "record", "--idle", "--threads", "--format", "raw", "-r", "50", "-o", str(out),
                            "--pid", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)                      # attached before the measured work starts
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(30)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()


def data_paths(dsn: str, url: str, n: int, repeats: int, latency_rates: tuple[float, ...] = (1000.0,),
               latency_events: int = 5000, only: frozenset[str] = frozenset(("out", "in", "latency")),
               spy_dir: Path | None = None) -> None:
    from bridge_bench import from_jms_rate, stomp_consume_rate
    from common import node_process, settled_pg_counters, stomp_send_rate

    rates: dict[str, list[float]] = {k: [] for k in ("raw tx", "t2 out", "raw consume", "t2 in",
                                                     "raw pipelined, 1 connection", "raw pipelined, 2 connections")}
    p50: dict[float, list[float]] = {r: [] for r in latency_rates}
    p99: dict[float, list[float]] = {r: [] for r in latency_rates}
    offered: dict[float, list[float]] = {r: [] for r in latency_rates}
    per_event: list[tuple[float, float]] = []      # (PostgreSQL commits, WAL syncs) per event of a channel -> JMS run
    if "latency" not in only:
        latency_rates = ()
    with node_process(dsn, url) as proc:
        import CosNotifyChannelAdmin as NCA

        from idl.generated import CosBridgeAdmin as BA

        ep = json.loads((proc.state / "endpoints.json").read_text())
        assert proc.proc is not None
        orb = client_orb()
        factory = orb.string_to_object(ep["event_channel_factory"]["corbaloc"])._narrow(NCA.EventChannelFactory)
        bf = orb.string_to_object(ep["bridge_factory"]["corbaloc"])._narrow(BA.BridgeFactory)
        if "out" in only or latency_rates:
            to_jms_t2_rate(factory, bf, url, 500)                               # warm-up
        if "in" in only:
            from_jms_rate(factory, bf, url, 200, pull=True, t2_events=100)
        for rep in range(repeats):
            if "out" in only:
                rates["raw tx"].append(stomp_send_rate(url, n, per_tx=100))
                c0, w0 = settled_pg_counters(proc.dsn)
                with _py_spy(proc.proc.pid, spy_dir / f"t2out-{rep}.txt" if spy_dir else None):
                    rates["t2 out"].append(to_jms_t2_rate(factory, bf, url, n))
                c1, w1 = settled_pg_counters(proc.dsn)
                per_event.append(((c1 - c0) / n, (w1 - w0) / n))
            if "raw2" in only:
                rates["raw pipelined, 1 connection"].append(pipelined_raw_rate(url, n, 1))
                rates["raw pipelined, 2 connections"].append(pipelined_raw_rate(url, n, 2))
            if "in" in only:
                rates["raw consume"].append(stomp_consume_rate(url, n))
                rates["t2 in"].append(from_jms_rate(factory, bf, url, n, pull=True, t2_events=100))
            for per_s in latency_rates:
                events = max(200, min(latency_events, int(per_s * latency_events / 1000.0)))
                lat, rate_offered = t2_latency(factory, bf, url, events, per_s)
                offered[per_s].append(rate_offered)
                p50[per_s].append(pct(lat, 0.50))
                p99[per_s].append(pct(lat, 0.99))
    print(f"\n== T2 data paths, 1 KB payloads, {n} events per run, {repeats} runs (median, min..max)")
    for label, r, base in (("channel -> JMS under T2, TransactionEvents=100", "t2 out", "raw tx"),
                           ("JMS -> channel under T2 (pull), TransactionEvents=100", "t2 in", "raw consume")):
        if not rates[r]:
            continue
        ratios = [a / b for a, b in zip(rates[r], rates[base], strict=True)]
        print(f"{label:<56} {statistics.median(rates[r]):>8,.0f}/s  baseline {statistics.median(rates[base]):>8,.0f}/s"
              f"  ratio {statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f})")
    print(f"{'  baselines: raw stomp.py BEGIN+100 SENDs+COMMIT; raw consume + client-individual ack'}")
    for per_s in latency_rates:
        label = f"T2 latency, {per_s:,.0f} events/s asked (channel -> JMS), ms"
        print(f"{label:<56} p50 {spread(p50[per_s])}; p99 {spread(p99[per_s])}; "
              f"offered {spread(offered[per_s])} events/s")
    for what, values in rates.items():
        if values:
            print(f"  {what}: runs {', '.join(f'{v:,.0f}' for v in values)} /s")
    if per_event:
        print("  channel -> JMS: PostgreSQL commits / WAL syncs per event (node's database / cluster, settled): "
              + ", ".join(f"{c:.3f} / {w:.3f}" for c, w in per_event))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recovery", action="store_true", help="only the recovery measurement")
    ap.add_argument("--in-doubt", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=1, help="outbox rows per committed in-doubt T2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", type=Path, default=None, help="write cProfile dumps of start() here")
    ap.add_argument("--events", type=int, default=5000, help="events per throughput run")
    ap.add_argument("--no-recovery", action="store_true", help="only the data paths")
    ap.add_argument("--latency-rates", default="1000",
                    help="offered rates (events/s, comma-separated) of the T2 latency measurement, e.g. 200,500,1000")
    ap.add_argument("--latency-events", type=int, default=5000,
                    help="events per latency run at 1,000/s (scaled to the rate: the same duration, >= 200)")
    ap.add_argument("--only", default="out,in,latency",
                    help="data paths to measure (comma-separated: out = channel -> JMS, in = JMS -> channel, latency; "
                         "raw2 = raw stomp.py in a pipelined T2's pattern on one and on two connections)")
    ap.add_argument("--py-spy", type=Path, default=None, dest="py_spy",
                    help="record the node with py-spy (--idle --threads, raw) during each channel -> JMS run, "
                         "into this directory")
    args = ap.parse_args()
    only = frozenset(w.strip() for w in args.only.split(",") if w.strip())
    missing = [] if args.recovery else missing_paths()
    if missing:
        print("t2_bench: the T2 data path is missing in this tree: " + "; ".join(missing)
              + " (run with --recovery for the recovery measurement alone)", file=sys.stderr)
        return 2
    with t2_services() as (dsn, url):
        if not args.recovery:
            rates = tuple(float(r) for r in args.latency_rates.split(",") if r.strip())
            data_paths(dsn, url, args.events, args.repeats, rates, args.latency_events, only, args.py_spy)
        if not args.no_recovery:
            res = recovery(dsn, url, args.in_doubt, args.rows, args.repeats, args.profile)
            print_recovery(args.in_doubt, args.rows, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
