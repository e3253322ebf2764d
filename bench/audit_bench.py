"""Audit time versus ledger size: ``nsjms audit`` over synthetic Parquet ledgers on ``local[2]``.

Run: ``python bench/audit_bench.py [--rows 1000000 10000000] [--master local[2]] [--driver-memory 2g]``.

For each size it generates a ledger of about that many rows (half as many delivery obligations: one
``accepted`` and one closing row each, 0.01 % of them lost/duplicated/in doubt/dead-lettered), writes it as
Parquet by day, then times the whole ``nsjms audit`` command (a new process: JVM and Spark start included) and
reports rows per second. A 2,000-row run first measures the fixed cost (process + Spark start + the
job's fixed stages), so the per-row cost can be read off. Numbers are machine-specific; nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from audit.cli import EXIT_OK, EXIT_VIOLATION  # noqa: E402  (after the sys.path line)
from audit.synth import SynthSpec, generate, write_parquet  # noqa: E402


def _faults(rows: int) -> int:
    return max(max(rows // 2, 10) // 10_000, 1)


def _ledger(rows: int, out: Path) -> tuple[int, float]:
    n = max(rows // 2, 10)
    faults = _faults(rows)
    t = time.perf_counter()
    table, _ = generate(SynthSpec(deliveries=n, seed=11, rate_per_s=2_000.0, lost=faults, duplicates=faults,
                                  in_doubt=faults, dead_letters=faults))
    write_parquet(table, out)
    return int(table.num_rows), time.perf_counter() - t


def _steps(stderr: str) -> dict[str, float]:
    """The audit's own step durations from its log lines (``audit: reconcile done in 12.3 s``)."""
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"audit: ([^:\n]+?) done in ([0-9.]+) s", stderr)}


def _audit(ledger: Path, out: Path, master: str, driver_memory: str) -> tuple[float, int, dict[str, float]]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "router.cli", "audit", "--parquet", str(ledger), "--out", str(out),
                           "--master", master, "--driver-memory", driver_memory],
                          check=False, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t
    if proc.returncode not in (EXIT_OK, EXIT_VIOLATION):     # the injected losses and duplicates make it 7
        raise SystemExit(f"audit failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed, proc.returncode, _steps(proc.stderr)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--master", default="local[2]")
    p.add_argument("--driver-memory", default="2g")
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="nsjms-audit-bench-"))
    results = []
    try:
        for rows in [2_000, *args.rows]:
            made, gen_s = _ledger(rows, base / f"ledger-{rows}")
            audit_s, rc, steps = _audit(base / f"ledger-{rows}", base / f"out-{rows}", args.master, args.driver_memory)
            summary = json.loads((base / f"out-{rows}" / "summary.json").read_text())
            r = {"rows": made, "generate_s": round(gen_s, 1), "audit_s": round(audit_s, 1),
                 "rows_per_s": round(made / audit_s), "steps_s": steps,
                 "job_s": round(sum(v for k, v in steps.items() if k != "start Spark"), 1), "exit": rc,
                 "lost": summary["lost"],
                 "duplicated": summary["duplicated"], "master": args.master, "driver_memory": args.driver_memory,
                 "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 1)}
            if (summary["lost"], summary["duplicated"]) != (_faults(rows), _faults(rows)):
                raise SystemExit(f"the audit did not find exactly the injected faults: {r}")
            results.append(r)
            print(json.dumps(r), flush=True)
            shutil.rmtree(base / f"ledger-{rows}", ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    fixed = results[0]["audit_s"]
    print("\n| rows | audit command (s) | minus the 2,000-row run (s) | job without Spark start (s) | rows/s |\n"
          "| ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['rows']:,} | {r['audit_s']} | {max(r['audit_s'] - fixed, 0):.1f} | {r['job_s']} "
              f"| {r['rows_per_s']:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
