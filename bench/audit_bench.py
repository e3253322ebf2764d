"""Audit time versus ledger size: ``nsjms audit`` over synthetic Parquet ledgers on ``local[2]``.

Run: ``python bench/audit_bench.py [--rows 1000000 10000000] [--master local[2]] [--driver-memory 2g]
[--repeat 3] [--baseline /tmp/old-main]``.

For each size it generates a ledger of about that many rows (half as many delivery obligations: one
``accepted`` and one closing row each, 0.01 % of them lost/duplicated/in doubt/dead-lettered), writes it as
Parquet by day, then times the whole ``nsjms audit`` command (a new process: JVM and Spark start included) and
reports rows per second. A 2,000-row run first measures the fixed cost (process + Spark start + the
job's fixed stages), so the per-row cost can be read off.

The **floor** of each size is measured in the same run: a new process that starts PySpark the same way, reads the
same Parquet and does one grouped count (``groupBy("outcome").count()``), timed the same way; ``ratio`` = audit
seconds / floor seconds (the issue's targets: <= 1.5 at 2,000 rows, <= 3 at 10M). Seconds are machine- and
load-specific; the **Spark jobs and stages** of each run (from its event log: every job started, every stage that
ran; skipped stages not counted) are not: they depend only on the ledger, so they are printed beside the seconds
and are what to compare between two versions of the audit on a shared machine (docs/audit.md, "What the audit
costs"). Nothing here is a test; tests/unit/test_audit_work.py pins the job count of a small audit.

On a shared machine compare two versions in ONE run: ``--baseline DIR`` (another checkout of the project, e.g.
``git worktree add /tmp/old-main main``) runs that checkout's audit beside this one's (``python -m router.cli`` with
its directory first on the path), ``--repeat N`` measures each size N times; each repetition runs the floor, then
both audits, in alternating order, and every ratio is against the floor of its own repetition. The last lines give
the median ratio per version and size.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from audit.cli import EXIT_OK, EXIT_VIOLATION  # noqa: E402  (after the sys.path line)
from audit.synth import SynthSpec, generate, write_parquet  # noqa: E402


def _faults(rows: int) -> int:
    return max(max(rows // 2, 10) // 10_000, 1)


def _ledger(rows: int, out: Path) -> tuple[int, float]:
    if (out / "rows").is_file():  # kept from an earlier run (--keep-ledgers)
        return int((out / "rows").read_text()), 0.0
    n = max(rows // 2, 10)
    faults = _faults(rows)
    t = time.perf_counter()
    table, _ = generate(SynthSpec(deliveries=n, seed=11, rate_per_s=2_000.0, lost=faults, duplicates=faults,
                                  in_doubt=faults, dead_letters=faults))
    write_parquet(table, out)
    (out / "rows").write_text(str(table.num_rows))
    return int(table.num_rows), time.perf_counter() - t


def _steps(stderr: str) -> dict[str, float]:
    """The audit's own step durations from its log lines (``audit: reconcile done in 12.3 s``)."""
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"audit: ([^:\n]+?) done in ([0-9.]+) s", stderr)}


def _children_cpu() -> float:
    """User + system CPU seconds of the finished child processes (the audit command and its JVM: this process is
    their subreaper, :func:`_reap`)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _subreaper() -> None:
    """Adopt orphaned descendants (the JVM PySpark starts outlives the audit's Python process for a moment), so
    their CPU time counts in this process's RUSAGE_CHILDREN once :func:`_reap` waited for them (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _reap() -> None:
    """Wait for every adopted descendant (the audit's JVM) to end."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _spark_work(event_dir: Path) -> dict[str, float]:
    """Load-independent work of one audit from its Spark event log: jobs, stages and tasks run (skipped stages
    not counted), and the shuffle bytes written and records read, over the whole application."""
    work: dict[str, float] = {"jobs": 0, "stages": 0, "tasks": 0, "shuffle_write_bytes": 0, "input_records": 0,
                              "task_cpu_s": 0.0}
    for log in sorted(f for f in event_dir.rglob("*") if f.is_file() and not f.name.startswith(("appstatus", "."))):
        for line in log.read_text().splitlines():
            ev = json.loads(line)
            kind = ev.get("Event")
            if kind == "SparkListenerJobStart":
                work["jobs"] += 1
            elif kind == "SparkListenerStageCompleted":
                info = ev["Stage Info"]
                work["stages"] += 1
                work["tasks"] += int(info.get("Number of Tasks", 0))
                acc = {a.get("Name"): a.get("Value") for a in info.get("Accumulables", [])}
                work["shuffle_write_bytes"] += int(acc.get("internal.metrics.shuffle.write.bytesWritten") or 0)
                work["input_records"] += int(acc.get("internal.metrics.input.recordsRead") or 0)
                work["task_cpu_s"] += int(acc.get("internal.metrics.executorCpuTime") or 0) / 1e9
    work["task_cpu_s"] = round(work["task_cpu_s"], 1)
    return work


def _audit(ledger: Path, out: Path, master: str, driver_memory: str, event_dir: Path,
           java_options: str = "", as_of: str = "", tree: Path = ROOT) -> tuple[float, float, int, dict[str, float]]:
    event_dir.mkdir(parents=True, exist_ok=True)
    java = f"--driver-java-options {shlex.quote(java_options)} " if java_options else ""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",   # the event log gives the load-independent work
           "PYSPARK_SUBMIT_ARGS": f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir={event_dir} "
                                  f"--conf spark.eventLog.compress=false {java}pyspark-shell"}
    t, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.run([sys.executable, "-m", "router.cli", "audit", "--parquet", str(ledger), "--out", str(out),
                           "--master", master, "--driver-memory", driver_memory,
                           *(["--as-of", as_of] if as_of else [])],
                          check=False, capture_output=True, text=True, env=env, cwd=tree)
    elapsed = time.perf_counter() - t
    _reap()
    cpu = _children_cpu() - cpu
    if proc.returncode not in (EXIT_OK, EXIT_VIOLATION):     # the injected losses and duplicates make it 7
        raise SystemExit(f"audit failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed, cpu, proc.returncode, _steps(proc.stderr)


def _floor_job(ledger: str, master: str, driver_memory: str) -> None:
    """The floor (run in its own process, ``--floor-job``): start PySpark as the audit does, read the Parquet
    ledger, one grouped count, collected."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName("nsjms-audit-floor")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", driver_memory).config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    try:
        spark.read.parquet(ledger).groupBy("outcome").count().collect()
    finally:
        spark.stop()


def _floor(ledger: Path, master: str, driver_memory: str, event_dir: Path) -> tuple[float, float, dict[str, float]]:
    event_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_SUBMIT_ARGS": f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir={event_dir} "
                                  "--conf spark.eventLog.compress=false pyspark-shell"}
    t, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.run([sys.executable, __file__, "--floor-job", str(ledger), master, driver_memory],
                          check=False, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t
    _reap()
    cpu = _children_cpu() - cpu
    if proc.returncode != 0:
        raise SystemExit(f"floor job failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed, cpu, _spark_work(event_dir)


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--floor-job":
        _floor_job(*sys.argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--master", default="local[2]")
    p.add_argument("--driver-memory", default="2g")
    p.add_argument("--java-options", default="", help="extra JVM options of the audit's driver (to compare)")
    p.add_argument("--keep-ledgers", type=Path, default=None,
                   help="keep the generated ledgers in this directory and reuse them in later runs")
    p.add_argument("--as-of", default="", help="the audits' --as-of (default now): fixed, two runs' outputs compare")
    p.add_argument("--keep-out", type=Path, default=None,
                   help="copy each audit's output here (out-ROWS), e.g. for bench/audit_compare.py")
    p.add_argument("--repeat", type=int, default=1, help="measure each size this many times (floor each time)")
    p.add_argument("--baseline", type=Path, default=None,
                   help="another checkout of the project (e.g. a worktree of main): its audit runs beside this one's")
    args = p.parse_args()
    _subreaper()
    base = Path(tempfile.mkdtemp(prefix="nsjms-audit-bench-"))
    ledgers = args.keep_ledgers or base
    trees = [("this", ROOT), *([("baseline", args.baseline.resolve())] if args.baseline else [])]
    results = []
    try:
        for rows in dict.fromkeys([2_000, *args.rows]):      # the 2,000-row run once, first
            made, gen_s = _ledger(rows, ledgers / f"ledger-{rows}")
            for rep in range(args.repeat):
                load_before = round(os.getloadavg()[0], 1)
                floor_s, floor_cpu, floor_work = _floor(ledgers / f"ledger-{rows}", args.master, args.driver_memory,
                                                        base / f"floor-events-{rows}-{rep}")
                for name, tree in (trees if rep % 2 == 0 else trees[::-1]):
                    r = _one(args, tree, name, rows, rep, made, gen_s, base, ledgers)
                    r.update({"floor_s": round(floor_s, 1), "ratio": round(r["audit_s"] / floor_s, 2),
                              "floor_cpu_s": round(floor_cpu, 1), "floor_jobs": floor_work["jobs"],
                              "floor_stages": floor_work["stages"], "load_avg_1m_before": load_before})
                    results.append(r)
                    print(json.dumps(r), flush=True)
            if args.keep_ledgers is None:
                shutil.rmtree(base / f"ledger-{rows}", ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    _table(results)
    return 0


def _one(args: argparse.Namespace, tree: Path, name: str, rows: int, rep: int, made: int, gen_s: float, base: Path,
         ledgers: Path) -> dict[str, Any]:
    """One audit of the ``rows`` ledger by the checkout ``tree``; its figures (without the floor's)."""
    out, events = base / f"out-{rows}-{name}-{rep}", base / f"events-{rows}-{name}-{rep}"
    audit_s, cpu_s, rc, steps = _audit(ledgers / f"ledger-{rows}", out, args.master, args.driver_memory, events,
                                       args.java_options, args.as_of, tree)
    if args.keep_out is not None and name == "this" and rep == 0:
        shutil.rmtree(args.keep_out / f"out-{rows}", ignore_errors=True)
        shutil.copytree(out, args.keep_out / f"out-{rows}")
    work = _spark_work(events)
    summary = json.loads((out / "summary.json").read_text())
    r: dict[str, Any] = {
        "tree": name, "rep": rep, "rows": made, "generate_s": round(gen_s, 1), "audit_s": round(audit_s, 1),
        "audit_counted": summary.get("spark_work", {}), "rows_per_s": round(made / audit_s), "steps_s": steps,
        "job_s": round(sum(v for k, v in steps.items() if k != "start Spark"), 1), "process_cpu_s": round(cpu_s, 1),
        "exit": rc, "lost": summary["lost"], "duplicated": summary["duplicated"], "master": args.master,
        "driver_memory": args.driver_memory, "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 1),
        **work}
    if (summary["lost"], summary["duplicated"]) != (_faults(rows), _faults(rows)):
        raise SystemExit(f"the audit did not find exactly the injected faults: {r}")
    shutil.rmtree(out, ignore_errors=True)
    return r


def _table(results: list[dict[str, Any]]) -> None:
    first = next(r for r in results if r["tree"] == "this")
    fixed = float(first["audit_s"])
    print("\n| version | rows | audit command (s) | floor (s) | ratio | jobs | stages | floor jobs / stages "
          "| minus the 2,000-row run (s) | job without Spark start (s) | rows/s "
          "| CPU s (process / tasks / floor process) | tasks | shuffle written (MB) "
          "| load avg 1 min (before / after) |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for a in results:
        print(f"| {a['tree']} | {a['rows']:,} | {a['audit_s']} | {a['floor_s']} | {a['ratio']} | {a['jobs']} "
              f"| {a['stages']} | {a['floor_jobs']} / {a['floor_stages']} | {max(a['audit_s'] - fixed, 0):.1f} "
              f"| {a['job_s']} | {a['rows_per_s']:,} | {a['process_cpu_s']} / {a['task_cpu_s']} / {a['floor_cpu_s']} "
              f"| {a['tasks']} | {a['shuffle_write_bytes'] / 1e6:.1f} "
              f"| {a['load_avg_1m_before']} / {a['load_avg_1m']} |")
    print()
    for key in dict.fromkeys((r["tree"], r["rows"]) for r in results):
        ratios = [float(r["ratio"]) for r in results if (r["tree"], r["rows"]) == key]
        print(f"median ratio {key[0]} {key[1]:,} rows: {statistics.median(ratios):.2f} "
              f"(of {len(ratios)}: {', '.join(f'{x:.2f}' for x in ratios)})")


if __name__ == "__main__":
    sys.exit(main())
