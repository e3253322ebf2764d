"""The audit package without Spark or a database: generator, settings, CLI parsing, import hygiene."""

from __future__ import annotations

import argparse
import pickle
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.compute as pc  # type: ignore[import-untyped]
import pytest

from audit import LedgerError, UsageError
from audit.cli import EXIT_USAGE, main, parse_time
from audit.job import jdbc_options
from audit.ledger import COLUMNS, Outcome, RetentionSettings, day_bounds, partition_name
from audit.report import violations
from audit.synth import SynthSpec, arrow_schema, generate, write_parquet


def test_generator_is_deterministic_and_injects_exactly_what_it_reports(tmp_path: Path) -> None:
    spec = SynthSpec(deliveries=500, seed=3, lost=4, duplicates=3, in_doubt=2, dead_letters=5)
    table, truth = generate(spec)
    again, truth2 = generate(spec)
    assert table.equals(again) and truth == truth2
    assert not generate(SynthSpec(deliveries=500, seed=4))[0].equals(generate(SynthSpec(deliveries=500))[0])
    assert table.schema == arrow_schema() and table.column_names == list(COLUMNS)
    assert table.num_rows == 2 * 500 - 4 + 3  # accepted + one closing row each, minus the lost, plus duplicates
    assert (len(truth.lost), len(truth.duplicated), len(truth.in_doubt)) == (4, 3, 2)
    assert sum(truth.dead_letters.values()) == 5
    rows = table.to_pylist()
    delivered: dict[str, int] = {}
    for r in rows:
        if r["outcome"] == Outcome.DELIVERED:
            delivered[r["dedupe_id"]] = delivered.get(r["dedupe_id"], 0) + 1
            assert r["accepted_at"] < r["dispatched_at"] < r["prepared_at"] < r["decided_at"] \
                < r["broker_committed_at"] < r["acknowledged_at"]
    assert {k for k, n in delivered.items() if n > 1} == truth.duplicated
    assert not (truth.lost | truth.in_doubt) & set(delivered)
    assert {r["gtrid"] for r in rows if r["outcome"] == "in_doubt"} == truth.in_doubt_gtrids
    assert all(r["failure_reason"] for r in rows if r["outcome"] == "dead_letter")
    assert pc.all(pc.greater_equal(table["entry_id"], 1)).as_py()
    files = write_parquet(table, tmp_path)
    assert [f.parent.name for f in files] == ["day=2026-01-01"]


@pytest.mark.parametrize("kwargs", [{"deliveries": 0}, {"deliveries": 3, "lost": 2, "duplicates": 2},
                                    {"deliveries": 3, "rate_per_s": 0},
                                    {"deliveries": 3, "start": datetime(2026, 1, 1)}])
def test_generator_refuses_impossible_specs(kwargs: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        SynthSpec(**kwargs)  # type: ignore[arg-type]


def test_partition_naming_and_retention_settings() -> None:
    assert partition_name(date(2026, 3, 9)) == "nsjms_ledger_p20260309"
    assert day_bounds(date(2026, 3, 9)) == (datetime(2026, 3, 9, tzinfo=UTC), datetime(2026, 3, 10, tzinfo=UTC))
    with pytest.raises(UsageError):
        RetentionSettings(retention_days=0)
    with pytest.raises(UsageError):
        RetentionSettings(ahead_days=-1)
    err = pickle.loads(pickle.dumps(LedgerError("drop ledger partition x", "boom")))
    assert (err.operation, str(err)) == ("drop ledger partition x", "drop ledger partition x: boom")


def test_violations_only_beyond_the_limits() -> None:
    assert violations(0, 0, 0, 0) == []
    assert violations(1, 2, 0, 0) == ["1 lost (allowed 0)", "2 duplicated (allowed 0)"]
    assert violations(1, 2, 1, 2) == []


def test_times_without_zone_are_utc() -> None:
    assert parse_time("2026-02-01") == datetime(2026, 2, 1, tzinfo=UTC)
    assert parse_time("2026-02-01T10:00:00+02:00").utcoffset() == timedelta(hours=2)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_time("yesterday")


def test_jdbc_options_keep_credentials_out_of_the_url() -> None:
    opts = jdbc_options("postgresql://nsjms:s3cret@127.0.0.1:5433/ledger?sslmode=require")
    assert opts["url"] == "jdbc:postgresql://127.0.0.1:5433/ledger"
    assert (opts["user"], opts["password"], opts["sslmode"]) == ("nsjms", "s3cret", "require")
    with pytest.raises(UsageError):
        jdbc_options("host=/var/run/postgresql dbname=x")


def test_audit_usage_errors_exit_2_before_starting_spark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--out", str(tmp_path), "--parquet", str(tmp_path / "missing")]) == EXIT_USAGE
    assert "is not a directory" in capsys.readouterr().err
    assert main(["audit", "--out", str(tmp_path), "--source", "jdbc"]) == EXIT_USAGE
    assert "needs a PostgreSQL DSN" in capsys.readouterr().err
    assert main(["audit", "--out", str(tmp_path), "--parquet", str(tmp_path), "--from", "2026-02-02",
                 "--to", "2026-02-01"]) == EXIT_USAGE


def test_router_cli_does_not_import_the_audit_stack() -> None:
    code = ("import sys, router.cli\n"
            "router.cli.build_parser().parse_args(['audit', '--out', 'x'])\n"
            "heavy = {'pyspark', 'pyarrow', 'matplotlib', 'tqdm', 'numpy', 'py4j'}\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]"


HEAVY = ("pyspark", "pyarrow", "matplotlib", "tqdm", "numpy", "py4j")


def test_no_router_module_loads_the_audit_stack() -> None:
    """Every module of the running node (router.*, xa.*) imported in a fresh interpreter: none of pyspark, pyarrow,
    matplotlib, tqdm (or their numpy, py4j) is loaded, nor the audit package; pyspark is an optional extra."""
    code = ("import sys, pkgutil, importlib, router, xa\n"
            "for pkg in (router, xa):\n"
            "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
            "        importlib.import_module(m.name)\n"
            f"heavy = set({HEAVY!r}) | {{'audit'}}\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_the_router_imports_the_audit_package_only_in_its_audit_commands() -> None:
    """Source check for imports inside functions (which importing the modules does not run): the router names the
    audit package only in ``router/cli/__init__.py`` (the ``ledger``/``audit`` subcommands) and the console's audit
    page (the psycopg-only readers, see the next test), and no Spark stack anywhere."""
    import re

    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"^\s*(?:import|from)\s+(" + "|".join((*HEAVY, "audit")) + r")\b", re.M)
    found = {(str(p.relative_to(root)), m.group(1)) for d in ("router", "xa") for p in (root / d).rglob("*.py")
             for m in pattern.finditer(p.read_text(encoding="utf-8"))}
    assert found == {("router/cli/__init__.py", "audit"), ("router/console/backend.py", "audit")}, found


def test_the_audit_modules_the_console_reads_load_no_spark_stack() -> None:
    """The console's ledger-audit page (``router/console/backend.py``, inside its functions) reads what
    ``nsjms audit --incremental`` stored through ``audit.incremental`` and ``audit.incremental_report``: importing
    them in a fresh interpreter loads none of the optional extra (pyspark, pyarrow, matplotlib, tqdm, numpy, py4j)."""
    code = ("import sys, audit, audit.incremental, audit.incremental_report\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_summary_counts_every_stuck_transaction_not_only_the_listed_ones(tmp_path: Path) -> None:
    """The stuck-in-doubt list stops at LIST_LIMIT rows; the summary's count (what monitoring reads) is the
    table's whole row count (it said 1000 for 1500 stuck transactions)."""
    from audit.job import LIST_LIMIT, AuditRequest
    from audit.report import summary

    listed: list[dict[str, Any]] = [{"gtrid": f"n:{i:06d}"} for i in range(LIST_LIMIT)]
    frames: dict[str, list[dict[str, Any]]] = {
        "status_counts": [], "dead_letters": [], "latency_percentiles": [], "throughput_totals": [],
        "duplicates": [], "lost": [], "stuck_in_doubt": listed,
        "stuck_in_doubt_total": [{"transactions": LIST_LIMIT + 500}]}
    req = AuditRequest(out=tmp_path, source="parquet", as_of=datetime(2026, 6, 1, tzinfo=UTC),
                       grace=timedelta(seconds=300))
    s = summary(frames, req, master="local[2]")
    assert s["stuck_in_doubt"] == LIST_LIMIT + 500
    assert len(s["stuck_gtrids"]) <= LIST_LIMIT


def test_the_report_lists_percentiles_of_rows_without_a_direction() -> None:
    """A delivered row without a direction gives a percentile row with a null direction next to ``all``: the HTML
    report sorts and lists it (before: TypeError comparing None with a str)."""
    from audit.report import _html

    pct = [{"hop": "dispatch", "direction": d, "samples": 1, "p50_ms": 1.0} for d in ("all", None, "jms_to_channel")]
    summ = {"violations": [], "obligations": 3, "lost": 0, "duplicated": 0, "stuck_in_doubt": 0, "as_of": "t",
            "grace_s": 0, "source": "parquet", "master": "local[1]", "window": {"from": "a", "to": "b"},
            "generated_at": "t"}
    frames: dict[str, list[dict[str, Any]]] = {"latency_percentiles": pct, "lost": [], "duplicates": [],
                                               "stuck_in_doubt": [], "dead_letters": []}
    page = _html(summ, frames, {"throughput": b"", "latency": b"", "faults": b""})
    assert page.count("<td>dispatch</td>") == 3


def test_open_obligations_curve_takes_back_a_duplicates_extra_delivery() -> None:
    """The open-obligations plot (issue 28): a lost obligation keeps the curve at 1 even when another obligation of
    the same direction was delivered twice (its second delivery is an extra end, taken back)."""
    from datetime import UTC, datetime

    from audit.report import open_figure
    from audit.transforms import open_over_time

    m0, m1 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC), datetime(2026, 1, 1, 12, 1, tzinfo=UTC)
    rows = [{"minute": m0, "direction": "d", "accepted": 2, "ended": 0},   # one delivered twice, one lost
            {"minute": m1, "direction": "d", "accepted": 0, "ended": 2}]
    assert [n for _, n in open_over_time(rows)["d"]] == [2, 0]                # the duplicate hides the loss
    assert [n for _, n in open_over_time(rows, [(m1, "d", 1)])["d"]] == [2, 1]
    dup = {"direction": "d", "deliveries": 2, "last_delivered_at": m1.replace(second=7)}
    line = open_figure(rows, [dup]).axes[0].get_lines()[0]
    assert list(line.get_ydata()) == [2, 1]


def test_the_scheduled_audit_units_run_a_command_the_cli_has_and_systemd_accepts_them(tmp_path: Path) -> None:
    """deploy/nsjms-audit.service + .timer (issue 28's scheduled mode): the ExecStart is an ``nsjms audit
    --incremental`` the CLI parses, and ``systemd-analyze verify`` accepts both units."""
    import shlex
    import shutil

    from router.cli import build_parser

    deploy = Path(__file__).resolve().parents[2] / "deploy"
    service = (deploy / "nsjms-audit.service").read_text()
    lines = service.replace("\\\n", " ").splitlines()
    (start,) = [line.partition("=")[2] for line in lines if line.startswith("ExecStart=")]
    argv = shlex.split(start)
    assert argv[0] == "/opt/nsjms/bin/nsjms" and argv[1:3] == ["audit", "--incremental"] and "--if-running" in argv
    args = build_parser().parse_args(argv[1:])          # exits (SystemExit) on an unknown option
    assert args.incremental and args.if_running and args.metrics_file is not None
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is not installed (apt-get install systemd)", pytrace=False)
    (tmp_path / "nsjms-audit.service").write_text(service.replace("/opt/nsjms/bin/nsjms", "/bin/true"))
    shutil.copy(deploy / "nsjms-audit.timer", tmp_path / "nsjms-audit.timer")
    units = [str(tmp_path / "nsjms-audit.service"), str(tmp_path / "nsjms-audit.timer")]
    done = subprocess.run([analyze, "verify", *units], capture_output=True, text=True, check=False, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0 and "nsjms-audit" not in done.stderr, done.stdout + done.stderr


def test_a_small_parquet_ledgers_driver_compiles_with_c1_only(tmp_path: Path) -> None:
    """A Parquet ledger of at most SMALL_LEDGER_ROWS rows gets -XX:TieredStopAtLevel=1 for the driver JVM the audit
    starts (docs/audit.md, "Round 7"); a larger one, a JDBC source and driver JVM options set elsewhere keep the
    JVM's defaults (nothing added, nothing overridden)."""
    from audit import job
    from audit.synth import SynthSpec, generate, write_parquet

    table, _ = generate(SynthSpec(deliveries=1000, seed=3))
    write_parquet(table, tmp_path / "ledger")

    def req(parquet: Path | None = tmp_path / "ledger", source: str = "parquet") -> job.AuditRequest:
        return job.AuditRequest(out=tmp_path / "out", source=source, as_of=datetime(2026, 6, 1, tzinfo=UTC),  # type: ignore[arg-type]
                                grace=timedelta(seconds=300), parquet=parquet, dsn="host=127.0.0.1")

    assert job.small_ledger_java_options(req(), {}) == "-XX:TieredStopAtLevel=1"
    assert job.small_ledger_java_options(req(source="jdbc", parquet=None), {}) is None
    for args in ("--driver-java-options -XX:+UseSerialGC pyspark-shell",
                 "--conf spark.driver.extraJavaOptions=-Xss4m pyspark-shell"):
        assert job.small_ledger_java_options(req(), {"PYSPARK_SUBMIT_ARGS": args}) is None, args
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions -XX:+UseG1GC\n")
    assert job.small_ledger_java_options(req(), {"SPARK_CONF_DIR": str(conf)}) is None
    (conf / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    assert job.small_ledger_java_options(req(), {"SPARK_CONF_DIR": str(conf)}) == "-XX:TieredStopAtLevel=1"
    big, _ = generate(SynthSpec(deliveries=job.SMALL_LEDGER_ROWS // 2 + 1, seed=3))   # two rows per obligation
    write_parquet(big, tmp_path / "big")
    assert big.num_rows > job.SMALL_LEDGER_ROWS
    assert job.small_ledger_java_options(req(parquet=tmp_path / "big"), {}) is None
