"""The data paths of issue 12, each against its raw baseline measured in the same run; prints a markdown table.

    .venv/bin/python bench/paths.py                 # everything, 5,000 x 1 KB persistent events, 3 repetitions
    .venv/bin/python bench/paths.py --quick         # small sizes, for a smoke run
    .venv/bin/python bench/paths.py --only accept1,accept4 --events 2000

Paths (``--only`` names):

* ``to_jms``: channel -> JMS, structured push (a bridge from a Persistent channel to a queue), and ``to_jms_seq``:
  the same with sequence pushes of 100; baseline: raw stomp.py BEGIN + 100 SEND + COMMIT (receipt).
* ``from_jms``: JMS -> channel (bridge from a preloaded queue into a Persistent channel, one push consumer);
  baseline: raw stomp.py consume with ``client-individual`` acks.
* ``accept1`` / ``accept4``: persistent structured pushes accepted (the call returned: stored) with 1 and 4
  suppliers, the channel's only consumer suspended (so nothing is delivered meanwhile); baseline: PostgreSQL
  one-row commits.
* ``latency``: channel -> JMS at fixed offered rates (4 suppliers; one row per ``--rate``, events/s, for
  ``--seconds`` each): latency from each event's scheduled send time to its arrival on the JMS queue, percentiles.
* ``backlog``: 10,000 events queued for a suspended bridge, node restarted, bridge resumed: drain rate against the
  steady-state ``to_jms`` rate of the same run (both observed the same way, ``--observe``).

``to_jms`` and ``to_jms_seq`` end when the channel's queue rows are gone (``--observe store``, the default: the
node deletes a row only once the broker confirmed the COMMIT that carried its event; the messages are then
consumed and counted outside the timed window, a missing one fails the run) or when a consumer running during the
run received the last message (``--observe consumer``: how rounds 1-5 measured; that consumer and the broker's
dispatch to it compete for the same cores, and the raw baseline has none). ``from_jms`` likewise ends once the
channel has stored every event for its consumer, whose proxy is suspended during the timed window and resumed
after it (``store``: the bridge acknowledges a message only once its event is stored), or when that CORBA push
consumer has received every event (``consumer``: the channel's push of each event to it is then in the path).
Each throughput path's baseline is measured just before each of its repetitions (the machine's speed drifts
within minutes) and the ratio is the median, with its spread, of the per-repetition ratios.

Every throughput path also reports PostgreSQL transactions and WAL syncs per event (``pg_stat_database``
``xact_commit`` of the node's database, ``pg_stat_wal`` ``wal_sync``), read once the statistics settled, and (a
second table) the CPU each process needed per event in the timed windows, from ``/proc`` (bench/meter.py): the
process trees this bench started, the node, the broker (with its JIT compiler and GC threads apart), PostgreSQL
(the postmaster and its backends) and the bench's clients, for the path and for its baseline, with how many cores
were busy; other brokers or clusters on the machine are not counted (issue 27). The broker is warmed with
``--warmup`` raw messages before anything is timed, windows default to 20,000 events, and a raw omniORBpy server's
CPU per call (bench/orb_unit.py) is measured before and after the paths as the run's unit. Nothing here is a test:
there are no thresholds.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)

from bridge_bench import (
    OBSERVE,
    Arrivals,
    _endpoint,
    _persistent_channel,
    from_jms_rate,
    to_jms_rate,
)
from channel_bench import Counter, _consumer, _event
from common import (
    METER,
    NodeProcess,
    client_orb,
    median_spread,
    pg_commit_rate,
    services,
    settled_pg_counters,
    stomp_consume_rate,
    stomp_send_rate,
)
from orb_unit import orb_units

ALL = ["to_jms", "to_jms_seq", "from_jms", "accept1", "accept4", "latency", "backlog"]


@dataclass
class Row:
    path: str
    rates: list[float] = field(default_factory=list)
    baseline_name: str = ""
    baseline: list[float] = field(default_factory=list)
    target: str = ""
    tx_per_event: float | None = None
    wal_per_event: float | None = None
    note: str = ""
    paired: bool = False        # baseline[i] was measured just before rates[i]: the ratio is per repetition
    cpu: list[dict[str, float]] = field(default_factory=list)        # common.CpuMeter.take() of each repetition
    base_cpu: list[dict[str, float]] = field(default_factory=list)   # ... and of the baseline before it


@dataclass
class Env:
    orb: Any
    factory: Any
    bridges: Any
    url: str
    dsn: str
    node: NodeProcess


def _measured(env: Env, n: int, fn: Callable[[], float]) -> tuple[float, float, float]:
    """(rate, transactions per event, WAL syncs per event) of one run of ``fn`` handling ``n`` events."""
    c0, w0 = settled_pg_counters(env.dsn)
    r = fn()
    c1, w1 = settled_pg_counters(env.dsn)
    return r, (c1 - c0) / n, (w1 - w0) / n


def _repeat(env: Env, row: Row, reps: int, n: int, fn: Callable[[], float],
            base: Callable[[], float] | None = None) -> Row:
    """``reps`` runs of ``fn``; with ``base``, the raw baseline is measured just before each run (interleaved: the
    machine's speed drifts within minutes) and the row's ratio is the median of the per-repetition ratios."""
    txs, wals = [], []
    if base is not None:
        row.baseline, row.paired = [], True
    for _ in range(reps):
        METER.take()                     # nothing timed before this repetition counts
        if base is not None:
            METER.node_pid = None        # the raw baseline's columns: broker, PostgreSQL, its client (the idle
            row.baseline.append(base())  # node is not counted)
            row.base_cpu.append(METER.take())
        METER.node_pid = env.node.proc.pid if env.node.proc else None
        r, tx, wal = _measured(env, n, fn)
        row.cpu.append(METER.take())
        row.rates.append(r)
        txs.append(tx)
        wals.append(wal)
    row.tx_per_event, row.wal_per_event = statistics.median(txs), statistics.median(wals)
    return row


# -- accept: persistent structured pushes with k suppliers, consumer suspended ----------------------------------
def accept_rate(factory: Any, n: int, suppliers: int) -> float:
    import CosNotifyChannelAdmin as NCA

    channel, _ = _persistent_channel(factory)
    consumer = _consumer(Counter(), False)
    ps, _ = channel._get_default_consumer_admin().obtain_notification_push_supplier(NCA.STRUCTURED_EVENT)
    ps = ps._narrow(NCA.StructuredProxyPushSupplier)
    ps.connect_structured_push_consumer(consumer._this())
    ps.suspend_connection()                      # events are stored and queued, not delivered
    pcs = []
    for _ in range(suppliers):
        pc, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(NCA.STRUCTURED_EVENT)
        pc = pc._narrow(NCA.StructuredProxyPushConsumer)
        pc.connect_structured_push_supplier(None)
        pcs.append(pc)
    per = n // suppliers
    events = [[_event(k * per + i) for i in range(per)] for k in range(suppliers)]
    barrier = threading.Barrier(suppliers + 1)

    def supply(k: int) -> None:
        barrier.wait()
        for ev in events[k]:
            pcs[k].push_structured_event(ev)

    threads = [threading.Thread(target=supply, args=(k,), daemon=True) for k in range(suppliers)]
    for t in threads:
        t.start()
    METER.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    METER.stop(per * suppliers)
    channel.destroy()
    return per * suppliers / elapsed


# -- latency: channel -> JMS at a fixed offered rate -------------------------------------------------------------
def latency(env: Env, rate: float, seconds: float, suppliers: int = 4,
            clients: str = "processes") -> tuple[dict[str, float], str]:
    """``clients``: the suppliers are ``processes`` (one ORB each, as independent clients are) or ``threads`` of
    the bench's own process (one ORB, one GIL, shared with the STOMP consumer counting the arrivals)."""
    import stomp

    import CosNotifyChannelAdmin as NCA

    channel, cid = _persistent_channel(env.factory)
    queue = f"bench.lat.{cid}"
    bridge, _ = env.bridges.create_bridge(_endpoint("SOURCE", cid, None, False), _endpoint("SINK", None, queue,
                                                                                          False))
    bridge.start_bridge()
    n = int(rate * seconds)
    arrived: dict[int, float] = {}
    done = threading.Event()

    class L(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            name = frame.headers.get("$event_name", "")
            if name.startswith("e"):
                arrived[int(name[1:])] = time.time()
                if len(arrived) >= n:
                    done.set()

    parts = urlsplit(env.url)
    conn = stomp.Connection12([(parts.hostname, parts.port)])
    conn.set_listener("l", L())
    conn.connect(wait=True)
    conn.subscribe(f"/queue/{queue}", id="1", ack="auto", headers={"activemq.prefetchSize": "1000"})
    pcs = []
    for _ in range(suppliers):
        pc, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(NCA.STRUCTURED_EVENT)
        pc = pc._narrow(NCA.StructuredProxyPushConsumer)
        pc.connect_structured_push_supplier(None)
        pcs.append(pc)
    pg0 = settled_pg_counters(env.dsn)     # takes 1.2 s or more: read before the schedule starts, not during it
    if clients == "processes":
        sent, returned, start, node_cpu, client_cpu = _supplier_processes(env, pcs, n, rate)
    else:
        sent, returned, start, node_cpu, client_cpu = _supplier_threads(env, pcs, n, rate)
    pushed_by = max(returned.values())
    done.wait(max(60.0, seconds * 10))
    pg1 = settled_pg_counters(env.dsn)          # accept and delivery: every commit the n events caused
    conn.disconnect()
    bridge.destroy()
    channel.destroy()
    lat = sorted((arrived[i] - (start + i / rate)) * 1000 for i in arrived)
    if not lat:
        return {}, f"nothing arrived of {n}"
    pct = {f"p{p}": lat[min(len(lat) - 1, int(len(lat) * p / 100))] for p in (50, 95, 99)}
    pct["max"] = lat[-1]
    push_s = max(1e-9, pushed_by - start)
    accepted = n / push_s
    lag = sorted((sent[i] - (start + i / rate)) * 1000 for i in sent)
    call = sorted((returned[i] - sent[i]) * 1000 for i in returned)
    mean_call = statistics.fmean(call) if call else float("nan")
    achieved = n / max(1e-9, max(sent.values()) - start) if sent else 0.0
    who = ("separate processes, one ORB each" if clients == "processes" else
           "threads of the bench's one process")
    return pct, (f"offered {rate:,.0f}/s for {seconds:g} s by {suppliers} suppliers ({who}, each push "
                 f"synchronous): sent at {achieved:,.0f}/s (send lag behind the schedule p50 "
                 f"{_pct(lag, 50):,.1f} ms, p99 {_pct(lag, 99):,.1f} ms; push call p50 {_pct(call, 50):,.1f} ms, "
                 f"p99 {_pct(call, 99):,.1f} ms, mean {mean_call:,.1f} ms: {suppliers} synchronous suppliers can "
                 f"send {suppliers * 1000 / mean_call:,.0f}/s at most), accepted {accepted:,.0f}/s, arrived "
                 f"{len(lat)}/{n}; CPU while pushing: node {node_cpu / push_s:.0%} of a core, bench suppliers "
                 f"{client_cpu / push_s:.0%}, load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; PG tx/event "
                 f"{(pg1[0] - pg0[0]) / n:.2f}, WAL syncs/event {(pg1[1] - pg0[1]) / n:.2f} (accept and delivery)")


Times = dict[int, float]


def _supplier_threads(env: Env, pcs: list[Any], n: int, rate: float) -> tuple[Times, Times, float, float, float]:
    """(sent, returned, start, node CPU s, suppliers' CPU s): pushes by threads of this process."""
    suppliers = len(pcs)
    events = {i: _event(i) for i in range(n)}
    sent: Times = {}              # when each push was actually sent (late when its supplier lags)
    returned: Times = {}          # when it returned (the event was accepted: stored)
    node_cpu0, client_cpu0 = _cpu_seconds(env.node.proc.pid if env.node.proc else None), _own_cpu_seconds()
    start = time.time() + 0.1

    def supply(k: int) -> None:
        for i in range(k, n, suppliers):
            delay = start + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)            # offered load: the schedule, not the channel, sets the pace
            sent[i] = time.time()
            pcs[k].push_structured_event(events[i])
            returned[i] = time.time()

    threads = [threading.Thread(target=supply, args=(k,), daemon=True) for k in range(suppliers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    node_cpu = _cpu_seconds(env.node.proc.pid if env.node.proc else None) - node_cpu0
    return sent, returned, start, node_cpu, _own_cpu_seconds() - client_cpu0


def _supplier_processes(env: Env, pcs: list[Any], n: int, rate: float) -> tuple[Times, Times, float, float, float]:
    """As :func:`_supplier_threads`, each supplier a process of its own (spawned: its own interpreter and ORB),
    started and ready (events built, proxy resolved) before the schedule's start."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    suppliers = len(pcs)
    iors = [env.orb.object_to_string(pc) for pc in pcs]
    ready, go = ctx.Barrier(suppliers + 1), ctx.Value("d", 0.0)
    results = ctx.Queue()
    procs = [ctx.Process(target=_supply_process, args=(iors[k], k, suppliers, n, rate, ready, go, results),
                         daemon=True) for k in range(suppliers)]
    for p in procs:
        p.start()
    ready.wait(120)
    node_cpu0 = _cpu_seconds(env.node.proc.pid if env.node.proc else None)
    start = time.time() + 0.1
    go.value = start
    ready.wait(120)                          # the start time is set: go
    sent: Times = {}
    returned: Times = {}
    client_cpu = 0.0
    deadline = start + n / rate + 600         # the schedule's length, plus slack for pushes that wait
    pending = len(procs)
    while pending:
        try:
            outcome = results.get(timeout=1)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"latency supplier process(es) failed: exit codes {[p.exitcode for p in dead]} "
                                   "(their traceback is above)") from None
            if time.time() > deadline:
                raise RuntimeError(f"{pending} latency supplier process(es) still pushing after the schedule "
                                   "and 600 s") from None
            continue
        if outcome[0] == "error":
            raise RuntimeError(f"latency supplier {outcome[1]} failed: {outcome[2]}")
        _, s, r, cpu = outcome
        sent.update(s)
        returned.update(r)
        client_cpu += cpu
        pending -= 1
    node_cpu = _cpu_seconds(env.node.proc.pid if env.node.proc else None) - node_cpu0
    for p in procs:
        p.join(30)
    return sent, returned, start, node_cpu, client_cpu


def _supply_process(ior: str, k: int, suppliers: int, n: int, rate: float, ready: Any, go: Any,
                    results: Any) -> None:
    """One supplier process: its own ORB, pushes events k, k + suppliers, ... on the schedule ``go.value + i/rate``;
    puts ("ok", sent, returned, CPU seconds while pushing) on ``results``, or ("error", k, why) when a push failed."""
    import CosNotifyChannelAdmin as NCA

    orb = client_orb()
    pc = orb.string_to_object(ior)._narrow(NCA.StructuredProxyPushConsumer)
    mine = list(range(k, n, suppliers))
    events = {i: _event(i) for i in mine}
    pc._non_existent()                       # connected before the clock starts
    ready.wait(120)
    ready.wait(120)
    start = go.value
    sent: Times = {}
    returned: Times = {}
    cpu0 = _own_cpu_seconds()
    try:
        for i in mine:
            delay = start + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            sent[i] = time.time()
            pc.push_structured_event(events[i])
            returned[i] = time.time()
    except Exception as exc:                 # reported to the parent, which fails the run with it
        results.put(("error", k, f"push {len(returned) + 1} of {len(mine)}: {exc!r}"))
        raise
    else:
        results.put(("ok", sent, returned, _own_cpu_seconds() - cpu0))
    finally:
        orb.destroy()


def _pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(len(values) * p / 100))] if values else float("nan")


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far; 0 when unknown."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- backlog after a restart ----------------------------------------------------------------------------------
def backlog_rate(env: Env, n: int, observe: str = "store") -> tuple[Env, float]:
    """Queue ``n`` events for a stopped bridge, restart the node, start the bridge: drain rate. ``store``: from
    ``start_bridge`` until the channel's queue rows are gone (then every message is counted); ``consumer``: from
    the first arrival at a consumer subscribed before ``start_bridge`` to the last.

    The bridge is stopped (``stop_bridge``, which a restart keeps), not just its proxy suspended: a running bridge
    resumes its suspended proxy when the node starts (bridge.md), so the drain would begin before the bench could
    observe it (rounds 1-5 did that: their backlog figure could include the broker handing a queue already
    complete to the late consumer)."""
    import CosNotifyChannelAdmin as NCA

    channel, cid = _persistent_channel(env.factory)
    queue = f"bench.backlog.{cid}"
    bridge, _ = env.bridges.create_bridge(_endpoint("SOURCE", cid, None, False), _endpoint("SINK", None, queue,
                                                                                          False))
    bridge.start_bridge()
    bridge.stop_bridge()                                 # its proxy suspended; stays stopped over the restart
    pc, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(NCA.STRUCTURED_EVENT)
    pc = pc._narrow(NCA.StructuredProxyPushConsumer)
    pc.connect_structured_push_supplier(None)
    for i in range(n):
        pc.push_structured_event(_event(i))
    env.node.stop()
    env = _connect(env.node.start(), env.url, env.node, env.orb)
    channel = _retry(lambda: env.factory.get_event_channel(cid))   # the references are persistent
    arrivals = Arrivals(observe, env.url, queue, env.dsn, cid)
    t0 = time.perf_counter()
    _retry(bridge.start_bridge)
    arrivals.wait(n if observe == "store" else n - 1)
    end = time.perf_counter()
    arrivals.close(n)
    rate = n / (end - t0) if arrivals.first is None else (n - 1) / (end - arrivals.first)
    try:
        _retry(bridge.destroy)               # a persistent reference: still valid after the restart
    except Exception as exc:  # noqa: BLE001 — a benchmark's cleanup; say so and go on
        print(f"(backlog: could not destroy the bridge after the restart: {exc!r})", file=sys.stderr)
    _retry(channel.destroy)
    return env, rate


def _retry(call: Callable[[], Any]) -> Any:
    """After a restart the client ORB's cached connections fail once each (COMM_FAILURE): try again."""
    from omniORB import CORBA

    for attempt in range(10):
        try:
            return call()
        except (CORBA.COMM_FAILURE, CORBA.TRANSIENT):
            if attempt == 9:
                raise
            time.sleep(0.2)
    return None


# -- plumbing -------------------------------------------------------------------------------------------------
def _connect(ep: dict[str, Any], url: str, node: NodeProcess, orb: Any) -> Env:
    import CosNotifyChannelAdmin as NCA

    from idl.generated import CosBridgeAdmin as BA

    factory = _retry(lambda: orb.string_to_object(ep["event_channel_factory"]["corbaloc"])._narrow(
        NCA.EventChannelFactory))
    bridges = _retry(lambda: orb.string_to_object(ep["bridge_factory"]["corbaloc"])._narrow(BA.BridgeFactory))
    return Env(orb, factory, bridges, url, ep["bench_dsn"], node)


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    med, lo, hi = median_spread(values)
    return f"{med:,.0f} ({lo:,.0f}-{hi:,.0f})" if len(values) > 1 else f"{med:,.0f}"


def table(rows: list[Row], lats: list[tuple[float, tuple[dict[str, float], str]]]) -> str:
    out = ["| path | rate/s median (min-max) | baseline in the same run | ratio | target | PG tx/event | "
           "WAL syncs/event |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.paired and r.rates:
            med, lo, hi = median_spread([a / b for a, b in zip(r.rates, r.baseline, strict=True)])
            ratio = f"{med:.2f} ({lo:.2f}-{hi:.2f})"
        else:
            ratio = (f"{statistics.median(r.rates) / statistics.median(r.baseline):.2f}"
                     if r.rates and r.baseline else "-")
        tx = f"{r.tx_per_event:.2f}" if r.tx_per_event is not None else "-"
        wal = f"{r.wal_per_event:.2f}" if r.wal_per_event is not None else "-"
        out.append(f"| {r.path} | {_fmt(r.rates)} | {r.baseline_name}: {_fmt(r.baseline)} | {ratio} | {r.target} "
                   f"| {tx} | {wal} |")
    for rate, (pct, note) in lats:
        shown = ", ".join(f"{k} {v:,.1f} ms" for k, v in pct.items()) or "-"
        out.append(f"| latency channel → JMS, {rate:,.0f}/s offered | {shown} | {note} | — | keeps up, p99 ≤ 20 ms "
                   f"| - | - |")
    return "\n".join(out)


def cpu_table(rows: list[Row]) -> str:
    """CPU per event of each role in the timed windows (bench/meter.py: the process trees the bench started; the
    broker's JIT compiler and GC threads shown apart, inside its total), medians of the repetitions, the path's
    and its baseline's; "all" includes the bench's clients (the suppliers, the raw client). When both runs keep
    the machine's cores busy, the path cannot beat ``baseline all / path all`` (the last column) whatever waits it
    removes: that is its ceiling on this machine."""
    def med(samples: list[dict[str, float]], key: str) -> float | None:
        values = [c[key] for c in samples if key in c]
        return statistics.median(values) if values else None

    def us(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    out = ["| path | node | broker | of it JIT / GC | PostgreSQL | bench clients | all | cores busy | "
           "baseline: broker | of it JIT / GC | PostgreSQL | client | all | cores busy | "
           "CPU-bound ratio (baseline all / path all) |", "|" + "---|" * 15]

    def jvm(samples: list[dict[str, float]]) -> str:
        return f"{us(med(samples, 'broker_jit'))} / {us(med(samples, 'broker_gc'))}"

    for r in rows:
        if not any(r.cpu):
            continue
        path_all, base_all = med(r.cpu, "total"), med(r.base_cpu, "total")
        cores, base_cores = med(r.cpu, "cores"), med(r.base_cpu, "cores")
        bound = f"{base_all / path_all:.2f}" if path_all and base_all else "-"
        out.append(f"| {r.path} | {us(med(r.cpu, 'node'))} | {us(med(r.cpu, 'broker'))} | {jvm(r.cpu)} | "
                   f"{us(med(r.cpu, 'postgres'))} | {us(med(r.cpu, 'bench'))} | {us(path_all)} | "
                   f"{'-' if cores is None else f'{cores:.2f}'} | {us(med(r.base_cpu, 'broker'))} | "
                   f"{jvm(r.base_cpu)} | {us(med(r.base_cpu, 'postgres'))} | {us(med(r.base_cpu, 'bench'))} | "
                   f"{us(base_all)} | {'-' if base_cores is None else f'{base_cores:.2f}'} | {bound} |")
    return "\n".join(out) if len(out) > 2 else ""


def _rates(text: str) -> list[float]:
    rates = [float(x) for x in text.split(",") if x.strip()]
    if not rates or any(r <= 0 for r in rates):
        raise argparse.ArgumentTypeError(f"expected positive rates, comma-separated: {text!r}")
    return rates


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=20_000,
                    help="events per throughput run (default 20000: a steady-state window, issue 27)")
    ap.add_argument("--warmup", type=int, default=20_000,
                    help="raw persistent messages sent and consumed through the broker before anything is timed, so "
                         "its JIT compilation is not in the windows (default 20000)")
    ap.add_argument("--backlog", type=int, default=10_000, help="backlog size (default 10000)")
    ap.add_argument("--rate", type=_rates, default=[250.0, 500.0, 1000.0],
                    help="offered rates of the latency path, events/s, comma-separated (default 250,500,1000: one "
                         "row each)")
    ap.add_argument("--seconds", type=float, default=10.0, help="duration of the latency path")
    ap.add_argument("--latency-clients", choices=("processes", "threads"), default="processes",
                    help="the latency path's suppliers: separate processes (default) or threads of the bench")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each throughput path (default 3)")
    ap.add_argument("--only", default=",".join(ALL), help=f"comma-separated subset of {','.join(ALL)}")
    ap.add_argument("--raw-socket", choices=("nodelay", "default"), default="nodelay",
                    help="the raw STOMP baselines' socket: TCP_NODELAY as the node's (default since round 7) or "
                         "stomp.py's default, Nagle on (the issue's and rounds 1-6's baselines)")
    ap.add_argument("--quick", action="store_true", help="small sizes: 500 events, backlog 1000, latency 3 s")
    ap.add_argument("--observe", choices=OBSERVE, default="store",
                    help="how to_jms / to_jms_seq / from_jms see their end (bridge_bench.OBSERVE; "
                         "default: %(default)s)")
    args = ap.parse_args(argv)
    only = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = set(only) - set(ALL)
    if unknown:
        ap.error(f"unknown path(s): {', '.join(sorted(unknown))}")
    if args.quick:
        args.events, args.backlog, args.seconds, args.warmup = 500, 1000, 3.0, 1000
    n, reps = args.events, args.reps
    rows: list[Row] = []
    lats: list[tuple[float, tuple[dict[str, float], str]]] = []
    load = os.getloadavg()
    units = [orb_units()]                        # the raw ORB's cost, before and after the paths (same run)
    with services() as (admin_dsn, url):
        stomp_send_rate(url, args.warmup, per_tx=100, nodelay=True)    # the broker warmed (JIT) before any window
        stomp_consume_rate(url, max(1, args.warmup // 3), nodelay=True)
        node = NodeProcess(admin_dsn, url)
        try:
            env = _connect(node.start(), url, node, client_orb())
            nodelay = args.raw_socket == "nodelay"
            raw_sock = ", TCP_NODELAY" if nodelay else ", Nagle on"

            def tx_base() -> float:
                return stomp_send_rate(url, 1000, per_tx=100, nodelay=nodelay)

            def pg1() -> float:
                return pg_commit_rate(admin_dsn, 500, 1)

            def consume() -> float:
                return stomp_consume_rate(url, 1000, nodelay=nodelay)

            obs = args.observe
            to_jms_rate(env.factory, env.bridges, url, 100, False, dsn=env.dsn, observe=obs)      # warm-up
            if "to_jms" in only or "backlog" in only:
                rows.append(_repeat(env, Row("channel → JMS, structured push", baseline_name="raw BEGIN+100 SEND+"
                                             "COMMIT" + raw_sock, target="≥ 0.9"), reps, n,
                                    lambda: to_jms_rate(env.factory, env.bridges, url, n, False, dsn=env.dsn,
                                                        observe=obs), tx_base))
            if "to_jms_seq" in only:
                rows.append(_repeat(env, Row("channel → JMS, sequence push x100", baseline_name="raw BEGIN+100 "
                                             "SEND+COMMIT" + raw_sock, target="≥ 0.9"), reps, n,
                                    lambda: to_jms_rate(env.factory, env.bridges, url, n, True, dsn=env.dsn,
                                                        observe=obs), tx_base))
            if "from_jms" in only:
                label = "stored for its suspended consumer" if obs == "store" else "received by a CORBA consumer"
                rows.append(_repeat(env, Row(f"JMS → channel ({label})",
                                             baseline_name="raw consume + client-individual ack" + raw_sock,
                                             target="≥ 0.9"), reps, n,
                                    lambda: from_jms_rate(env.factory, env.bridges, url, n, dsn=env.dsn,
                                                          observe=obs), consume))
            for k in (1, 4):
                if f"accept{k}" in only:
                    rows.append(_repeat(env, Row(f"persistent structured push accepted ({k} supplier"
                                                 f"{'s' if k > 1 else ''})", baseline_name="PG durable one-row commit",
                                                 target="≥ 0.8"), reps, n,
                                        lambda k=k: accept_rate(env.factory, n, k), pg1))  # type: ignore[misc]
            if "latency" in only:
                lats = [(rate, latency(env, rate, args.seconds, clients=args.latency_clients)) for rate in args.rate]
            if "backlog" in only:
                steady = next(r.rates for r in rows if r.path.startswith("channel → JMS, structured"))
                drains = []
                for _ in range(reps):
                    env, r = backlog_rate(env, args.backlog, args.observe)
                    drains.append(r)
                rows.append(Row(f"backlog of {args.backlog:,} after a restart (drain)", drains,
                                "steady-state channel → JMS structured", steady, "≥ 1"))
        finally:
            node.close()
    units.append(orb_units())
    print(f"\n{n} x 1 KB persistent events per run, {reps} repetition(s), to_jms / to_jms_seq / from_jms / backlog "
          f"observed by {args.observe}, each raw baseline measured just before its repetition; load average before "
          f"the run "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after {os.getloadavg()[0]:.2f}\n")
    print(table(rows, lats))
    cpu = cpu_table(rows)
    if cpu:
        print(f"\nCPU µs per event in the timed windows (the process trees this bench started: the node, the "
              f"broker, PostgreSQL, the bench's clients; {os.cpu_count()} cores; broker warmed with {args.warmup:,} "
              f"messages first):\n")
        print(cpu)
    print("\nunit, the same run: a raw omniORBpy server's CPU per push_structured_event call "
          + " / ".join(f"{u['structured']:.1f}" for u in units) + " µs, per event in push_structured_events x100 "
          + " / ".join(f"{u['sequence']:.1f}" for u in units) + " µs (before / after the paths)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
