"""The ``nsjms audit`` job: read the ledger (JDBC or Parquet), run :mod:`audit.transforms`, write the results.

Output directory::

    OUT/tables/<name>/*.parquet   lost, duplicates, stuck_in_doubt, dead_letters, status_counts,
                                  latency_percentiles, latency_histogram, throughput_per_minute
    OUT/summary.json              counts, violations, percentiles (``audit.report.summary``)
    OUT/report.html               self-contained report, PNG plots embedded as base64

The Spark session is created here (``master``: ``local[*]`` unless given; under ``spark-submit`` the
submitted master is used). The job runs no Python on executors, so cluster workers need no nsjms install:
only a path (Parquet) or the JDBC URL reachable from them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from psycopg.conninfo import conninfo_to_dict

from audit import UsageError

__all__ = ["DEFAULT_JDBC_JAR", "AuditRequest", "AuditResult", "jdbc_options", "run_audit"]

DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"
#: At most this many rows of a list table (lost, duplicates, ...) go into the summary and the report; the
#: Parquet tables hold them all.
LIST_LIMIT = 1000


@dataclass(frozen=True)
class AuditRequest:
    out: Path
    source: Literal["jdbc", "parquet"]
    as_of: datetime
    grace: timedelta
    parquet: Path | None = None
    dsn: str = ""
    start: datetime | None = None
    end: datetime | None = None
    master: str | None = None
    max_lost: int = 0
    max_duplicates: int = 0
    jdbc_partitions: int = 8
    jdbc_jar: str = DEFAULT_JDBC_JAR
    driver_memory: str = "1g"
    shuffle_partitions: int = 8
    progress: bool = False


@dataclass(frozen=True)
class AuditResult:
    summary: dict[str, Any]
    violations: tuple[str, ...]


def run_audit(req: AuditRequest) -> AuditResult:
    """Run the audit; raise :class:`UsageError` for a bad request (before starting Spark when possible)."""
    _check(req)
    from tqdm import tqdm  # type: ignore[import-untyped]

    from audit import report

    steps = ["start Spark", "read ledger", "reconcile", "latency", "throughput", "report"]
    with tqdm(total=len(steps), unit="step", disable=not req.progress, desc="nsjms audit") as bar:
        def step(name: str) -> None:
            bar.set_postfix_str(name)

        step(steps[0])
        with _session(req) as spark:
            bar.update(1)
            step(steps[1])
            frames = _compute(spark, req, bar, step)
            step(steps[5])
            summary = report.summary(frames, req)
            report.write(req.out, summary, frames)
            bar.update(1)
    return AuditResult(summary, tuple(summary["violations"]))


def _check(req: AuditRequest) -> None:
    if req.start is not None and req.end is not None and req.end <= req.start:
        raise UsageError(f"--to ({req.end}) must be after --from ({req.start})")
    if req.source == "parquet" and (req.parquet is None or not req.parquet.is_dir()):
        raise UsageError(f"--parquet: {req.parquet} is not a directory (an `nsjms ledger export` output)")
    if req.source == "jdbc":
        if not req.dsn:
            raise UsageError("--source jdbc needs a PostgreSQL DSN (--pg-dsn or NSJMS_POSTGRES_DSN)")
        if not Path(req.jdbc_jar).is_file():
            raise UsageError(f"--jdbc-jar: {req.jdbc_jar} not found (Debian: apt-get install libpostgresql-jdbc-java)")
    if min(req.max_lost, req.max_duplicates) < 0 or req.jdbc_partitions < 1:
        raise UsageError("--max-lost/--max-duplicates must be >= 0 and --jdbc-partitions >= 1")


@contextmanager
def _session(req: AuditRequest) -> Iterator[Any]:
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise UsageError("pyspark is not installed: pip install 'nsjms[audit]'") from exc
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # running under spark-submit: its master wins
    builder = SparkSession.builder.appName("nsjms-audit")
    if req.master or not submitted:
        builder = builder.master(req.master or "local[*]")
    conf = {"spark.sql.session.timeZone": "UTC", "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false", "spark.driver.memory": req.driver_memory,
            "spark.sql.shuffle.partitions": str(req.shuffle_partitions),
            "spark.driver.host": os.environ["SPARK_LOCAL_IP"], "spark.driver.bindAddress": os.environ["SPARK_LOCAL_IP"]}
    if req.source == "jdbc":
        conf["spark.jars"] = req.jdbc_jar
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        if not submitted:
            spark.stop()


def jdbc_options(dsn: str) -> dict[str, str]:
    """A libpq DSN → Spark JDBC options (url without credentials; user/password as separate options)."""
    info = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    host = info.get("host", "localhost")
    if host.startswith("/"):
        raise UsageError("JDBC needs a TCP host, not a unix socket directory, in the DSN")
    url = f"jdbc:postgresql://{host}:{info.get('port', '5432')}/{info.get('dbname', info.get('user', 'postgres'))}"
    opts = {"url": url, "driver": "org.postgresql.Driver"}
    for key in ("user", "password", "sslmode"):
        if key in info:
            opts[key] = info[key]
    return opts


def _bounds(req: AuditRequest) -> tuple[datetime, datetime] | None:
    """The partitioning range of the JDBC read: the window, or the ledger's min/max accepted_at."""
    if req.start is not None and req.end is not None:
        return req.start, req.end
    import psycopg

    with psycopg.connect(req.dsn) as conn:
        row = conn.execute("SELECT min(accepted_at), max(accepted_at) FROM nsjms_ledger").fetchone()
    if row is None or row[0] is None:
        return None
    return req.start or row[0], req.end or row[1] + timedelta(microseconds=1)


def _read(spark: Any, req: AuditRequest) -> Any:
    from pyspark.sql import functions as F

    from audit import transforms as T

    if req.source == "parquet":
        raw = spark.read.parquet(str(req.parquet))
        if "day" in raw.columns:  # prune whole day directories before reading them
            if req.start is not None:
                raw = raw.where(F.col("day") >= F.lit(req.start.strftime("%Y-%m-%d")).cast("date"))
            if req.end is not None:
                raw = raw.where(F.col("day") <= F.lit(req.end.strftime("%Y-%m-%d")).cast("date"))
    else:
        reader = spark.read.format("jdbc").options(**jdbc_options(req.dsn), dbtable="nsjms_ledger", fetchsize="20000")
        bounds = _bounds(req)
        if bounds is not None and req.jdbc_partitions > 1:
            fmt = "%Y-%m-%d %H:%M:%S.%f"
            reader = reader.options(partitionColumn="accepted_at", numPartitions=str(req.jdbc_partitions),
                                    lowerBound=bounds[0].astimezone(UTC).strftime(fmt),
                                    upperBound=bounds[1].astimezone(UTC).strftime(fmt))
        raw = reader.load()
    ledger = T.ledger(raw)
    if req.start is not None:
        ledger = ledger.where(F.col("accepted_at") >= F.lit(req.start))
    if req.end is not None:
        ledger = ledger.where(F.col("accepted_at") < F.lit(req.end))
    return ledger


def _compute(spark: Any, req: AuditRequest, bar: Any, step: Any) -> dict[str, Any]:
    """Run the transforms, write every table, return the small ones collected (lists of dicts)."""
    from pyspark import StorageLevel

    from audit import transforms as T

    ledger = _read(spark, req)
    if req.source == "jdbc":  # read the database once, not once per result
        ledger = ledger.persist(StorageLevel.MEMORY_AND_DISK)
    bar.update(1)
    step("reconcile")
    obl = T.obligations(ledger, req.as_of, req.grace).persist(StorageLevel.MEMORY_AND_DISK)
    tables = {
        "status_counts": T.status_counts(obl), "lost": T.lost(obl), "duplicates": T.duplicates(ledger, obl),
        "stuck_in_doubt": T.stuck_in_doubt(ledger, req.as_of, req.grace),
        "dead_letters": T.dead_letters_by_reason(ledger),
    }
    out: dict[str, Any] = {}
    for name, df in tables.items():
        out[name] = _write_collect(df, req.out / "tables" / name, limit=LIST_LIMIT)
    obl.unpersist()
    bar.update(1)
    step("latency")
    lat = T.hop_latencies(ledger)
    out["latency_percentiles"] = _write_collect(T.latency_percentiles(lat), req.out / "tables" / "latency_percentiles")
    out["latency_histogram"] = _write_collect(T.latency_histogram(lat), req.out / "tables" / "latency_histogram")
    bar.update(1)
    step("throughput")
    per_minute = T.throughput_per_minute(ledger)
    per_minute.write.mode("overwrite").parquet(str(req.out / "tables" / "throughput_per_minute"))
    minute_df = spark.read.parquet(str(req.out / "tables" / "throughput_per_minute"))
    out["throughput_totals"] = [r.asDict() for r in T.throughput_totals(minute_df).orderBy("minute").collect()]
    if req.source == "jdbc":
        ledger.unpersist()
    bar.update(1)
    return out


def _write_collect(df: Any, path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Write a result table as one Parquet file set; return its rows (the first ``limit`` by its first column)."""
    df = df.persist()
    df.coalesce(1).write.mode("overwrite").parquet(str(path))
    part = df if limit is None else df.orderBy(df.columns[0]).limit(limit)
    rows = [r.asDict(recursive=True) for r in part.collect()]
    df.unpersist()
    return rows
