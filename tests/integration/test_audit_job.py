"""``nsjms audit`` end to end: a real PostgreSQL ledger read over JDBC, a Spark standalone cluster, a real browser.

* a ledger is generated into PostgreSQL; in a copy of that database one delivered row is deleted and another
  duplicated; the audit (JDBC, time-partitioned read) must report exactly that loss and that duplicate, exit 7,
  and its HTML report must render in headless Chromium (screenshot kept in the test's directory);
* the same job runs unchanged on a Spark standalone master + worker started from the installed PySpark on
  loopback (``--master spark://127.0.0.1:PORT``), over the Parquet export of the ledger.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pyspark
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from audit.cli import EXIT_VIOLATION
from audit.export import export_days
from audit.ledger import ensure_partitions, install_schema
from audit.synth import SynthSpec, copy_to_postgres, generate
from router.node.services import free_port

# Spark jobs: about 20-40 s each on an idle 2-core machine, several minutes when the machine is shared.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

START = datetime(2026, 2, 1, 23, 58, tzinfo=UTC)  # 3000 obligations at 20/s: crosses midnight (two partitions)
SPEC = SynthSpec(deliveries=3000, seed=7, start=START, rate_per_s=20.0)
AUDIT_TIMEOUT_S = 900
CLUSTER_READY_S = 120.0
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _audit(out: Path, *args: str, dsn: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "NSJMS_POSTGRES_DSN": dsn}  # DSNs stay off the command line
    return subprocess.run([sys.executable, "-m", "router.cli", "audit", "--out", str(out), *args],
                          check=False, capture_output=True, text=True, timeout=AUDIT_TIMEOUT_S, env=env)


def _copy_database(dsn: str) -> str:
    """CREATE DATABASE … TEMPLATE the given one; the copy is dropped by the caller."""
    name = str(conninfo_to_dict(dsn)["dbname"])
    copy = f"{name}_copy"
    with psycopg.connect(make_conninfo(dsn, dbname="postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(copy), sql.Identifier(name)))
    return make_conninfo(dsn, dbname=copy)


def _drop_database(dsn: str) -> None:
    name = str(conninfo_to_dict(dsn)["dbname"])
    with psycopg.connect(make_conninfo(dsn, dbname="postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def ledger_db(fresh_db: str) -> str:
    """fresh_db holding the synthetic ledger (no injected faults), partitions for both days."""
    table, _ = generate(SPEC)
    with psycopg.connect(fresh_db) as conn:
        install_schema(conn)
        ensure_partitions(conn, START.date(), 2)
        copy_to_postgres(table, conn)
    return fresh_db


def _screenshot(html: Path, png: Path) -> None:
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is not installed (scripts/bootstrap.sh installs it)"
    with tempfile.TemporaryDirectory(prefix="nsjms-chromium-") as profile:
        proc = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1100,2600",
                               f"--screenshot={png}", html.as_uri()],
                              check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_audit_over_jdbc_finds_exactly_the_deleted_and_the_duplicated_delivery(
        ledger_db: str, tmp_path: Path) -> None:
    copy = _copy_database(ledger_db)
    try:
        with psycopg.connect(copy) as conn:
            gone, twice = [r[0] for r in conn.execute(
                "SELECT dedupe_id FROM nsjms_ledger WHERE outcome = 'delivered' ORDER BY accepted_at "
                "OFFSET 100 LIMIT 2").fetchall()]
            conn.execute("DELETE FROM nsjms_ledger WHERE dedupe_id = %s AND outcome = 'delivered'", (gone,))
            cols = "event_id, jms_message_id, dedupe_id, channel_id, proxy_id, bridge_id, destination, direction, " \
                   "gtrid, accepted_at, dispatched_at, prepared_at, decided_at, broker_committed_at, " \
                   "acknowledged_at, outcome, failure_reason"
            conn.execute(f"INSERT INTO nsjms_ledger ({cols}) SELECT {cols} FROM nsjms_ledger "
                         "WHERE dedupe_id = %s AND outcome = 'delivered'", (twice,))
        out = tmp_path / "audit"
        proc = _audit(out, "--source", "jdbc", "--master", "local[2]", "--from", "2026-02-01", "--to", "2026-02-03",
                      "--jdbc-partitions", "4", "--shuffle-partitions", "2", dsn=copy)
    finally:
        _drop_database(copy)
    assert proc.returncode == EXIT_VIOLATION, proc.stdout + proc.stderr[-4000:]
    assert "VIOLATION: 1 lost (allowed 0); 1 duplicated (allowed 0)" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["lost_ids"] == [gone] and summary["duplicate_ids"] == [twice]
    assert summary["lost"] == 1 and summary["duplicated"] == 1
    assert summary["by_status"] == {"delivered": SPEC.deliveries - 2, "lost": 1, "duplicated": 1}
    assert summary["throughput"]["delivered"] == SPEC.deliveries  # 2998 + 2 deliveries of the duplicate
    assert {"lost", "duplicates", "latency_percentiles", "throughput_per_minute", "bridge_counts",
            "open_per_minute"} <= {p.name for p in (out / "tables").iterdir()}
    bridges = summary["by_bridge"]                                 # per direction and bridge: the same totals
    assert sum(b["lost"] for b in bridges) == 1 and sum(b["duplicated"] for b in bridges) == 1
    assert sum(b["delivered"] for b in bridges) == SPEC.deliveries - 2
    assert len({(b["direction"], b["bridge"]) for b in bridges}) == len(bridges) > 1

    html = out / "report.html"
    page = html.read_text()
    assert page.count('src="data:image/png;base64,') == 4  # self-contained: plots embedded
    assert "<h2>Per bridge</h2>" in page and 'alt="open obligations over time"' in page
    png = tmp_path / "report.png"
    _screenshot(html, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 50_000


# ----------------------------------------------------------------------------------- Spark standalone
class Standalone:
    """A Spark standalone master and one worker (1 core) from the installed PySpark, on 127.0.0.1."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, *args: str) -> Path:
        spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
        log = self.base / f"{name}.log"
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_HOME": str(spark_class.parent.parent),
               "SPARK_LOG_DIR": str(self.base), "SPARK_WORKER_DIR": str(self.base / "work")}
        with log.open("wb") as fh:
            self.procs.append(subprocess.Popen([str(spark_class), *args], stdout=fh, stderr=subprocess.STDOUT,
                                               env=env, start_new_session=True))
        return log

    def start(self) -> None:
        log = self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                          "--port", str(self.port), "--webui-port", str(free_port()))
        self._wait(log, "I have been elected leader")
        log = self._start("worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                          "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", "1",
                          "--memory", "2g", "--work-dir", str(self.base / "work"), self.url)
        self._wait(log, "Successfully registered with master")

    def _wait(self, log: Path, line: str) -> None:
        deadline = time.monotonic() + CLUSTER_READY_S
        while time.monotonic() < deadline:
            if line in log.read_text(errors="replace"):
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.5)
        pytest.fail(f"Spark standalone not ready ({line!r} not in {log.name}):\n{log.read_text()[-3000:]}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[Standalone]:
    cluster = Standalone(tmp_path / "spark")
    cluster.base.mkdir()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_same_audit_on_a_spark_standalone_cluster(ledger_db: str, spark_cluster: Standalone, tmp_path: Path) -> None:
    export = export_days(ledger_db, START - timedelta(days=1), START + timedelta(days=2), tmp_path / "ledger",
                         progress=False)
    assert len(export.files) == 2
    out = tmp_path / "audit"
    proc = _audit(out, "--parquet", str(tmp_path / "ledger"), "--master", spark_cluster.url,
                  "--as-of", "2026-02-02T12:00:00", "--shuffle-partitions", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["master"] == spark_cluster.url
    assert summary["by_status"] == {"delivered": SPEC.deliveries}
    assert summary["violations"] == []
    # the work ran on the worker: an executor was launched there for this application
    assert any((tmp_path / "spark" / "work").glob("app-*/*/stderr"))


def test_an_empty_window_exports_and_audits_as_an_empty_result(ledger_db: str, tmp_path: Path) -> None:
    """Issue 28: exporting a window without ledger rows wrote nothing (exit 0) and the audit of it then failed
    (exit 2); now the export leaves an empty day file and the audit reports 0 obligations, exit 0, and says so."""
    lo = START - timedelta(days=30)
    export = export_days(ledger_db, lo, lo + timedelta(days=1), tmp_path / "ledger", progress=False)
    assert export.rows == 0 and len(export.files) == 1
    out = tmp_path / "audit"
    proc = _audit(out, "--parquet", str(tmp_path / "ledger"), "--master", "local[1]", "--shuffle-partitions", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["obligations"] == 0 and summary["violations"] == []
    assert "the whole ledger: no ledger rows in it" in (out / "report.html").read_text()
