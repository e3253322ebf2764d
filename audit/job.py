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

import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, overload

from psycopg.conninfo import conninfo_to_dict

from audit import UsageError

__all__ = ["DEFAULT_JDBC_JAR", "AuditRequest", "AuditResult", "jdbc_options", "run_audit"]

DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"
log = logging.getLogger("nsjms.audit")
#: At most this many rows of a list table (lost, duplicates, ...) go into the summary and the report; the
#: Parquet tables hold them all.
LIST_LIMIT = 1000
#: Up to this many in-doubt ledger rows or duplicated obligations, their ids are sent to every task (a broadcast
#: join) instead of shuffling the ledger's rows to meet them. Every broadcast frame holds distinct ids: the
#: duplicated dedupe_ids; the in-doubt gtrids, the resolved ones among them and the open doubts' dedupe_ids (each
#: at most as many as the in-doubt rows, whatever the number of resolving rows per transaction).
BROADCAST_LIMIT = 1_000_000


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


class _Progress:
    """A tqdm bar over the job's steps (on a terminal) and one log line per finished step (always)."""

    STEPS = ("start Spark", "read ledger", "reconcile", "latency", "throughput", "report")

    def __init__(self, show: bool) -> None:
        from tqdm import tqdm  # type: ignore[import-untyped]

        self.bar = tqdm(total=len(self.STEPS), unit="step", disable=not show, desc="nsjms audit")
        self.name, self.t0, self.start = "", time.monotonic(), time.monotonic()

    def __call__(self, name: str) -> None:
        self._done()
        self.name, self.t0 = name, time.monotonic()
        self.bar.set_postfix_str(name)

    def _done(self) -> None:
        if self.name:
            log.info("audit: %s done in %.1f s", self.name, time.monotonic() - self.t0)
            self.bar.update(1)

    def close(self) -> None:
        self._done()
        self.bar.close()
        log.info("audit: finished in %.1f s", time.monotonic() - self.start)


def run_audit(req: AuditRequest) -> AuditResult:
    """Run the audit; raise :class:`UsageError` for a bad request (before starting Spark when possible)."""
    _check(req)
    from audit import report

    step = _Progress(req.progress)
    try:
        step("start Spark")
        with _session(req) as spark:
            frames = _compute(spark, req, step)
            step("report")
            summary = report.summary(frames, req, master=str(spark.sparkContext.master))
            report.write(req.out, summary, frames)
    finally:
        step.close()
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
            # the kept small result frames may be coalesced by adaptive execution like any other (fewer tasks)
            "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
            # adaptive execution coalesces a shuffle into partitions of about this size: at 64 MB (the default)
            # the per-obligation aggregation of 10M rows ran as 3 tasks on 2 cores; at 16 MB the big shuffles
            # split evenly while the small ones still become one partition
            "spark.sql.adaptive.advisoryPartitionSizeInBytes": "16m",
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


def _compute(spark: Any, req: AuditRequest, step: _Progress) -> dict[str, Any]:
    """Run the transforms, write every table once, return the small ones collected (lists of dicts).

    Passes over the ledger: :func:`~audit.transforms.facets` (dictionary, dead letters, whether anything is in
    doubt), the per-obligation aggregation, the delivered rows' latencies and throughput; and only when there is
    something to find, the open doubts (two narrow scans) and the duplicated obligations' rows."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from audit import transforms as T

    step("read ledger")
    ledger = _read(spark, req)
    if req.source == "jdbc":  # read the database once, not once per result
        ledger = ledger.persist(StorageLevel.MEMORY_AND_DISK)
        ledger.count()
    step("reconcile")
    tables = req.out / "tables"
    facets = [r.asDict() for r in T.facets(ledger).collect()]
    codes = T.dictionary(facets)
    doubt_rows = sum(r["rows"] for r in facets if r["outcome"] == "in_doubt")
    few_doubts = doubt_rows <= BROADCAST_LIMIT
    none = ledger.where(F.lit(False))  # an empty ledger: its results are empty without reading anything
    doubts = T.open_doubts(ledger if doubt_rows else none, broadcast=few_doubts).persist(StorageLevel.MEMORY_AND_DISK)
    obl = T.obligations(ledger, req.as_of, req.grace, doubts=doubts, codes=codes, broadcast=few_doubts)
    # the per-obligation frame is aggregated once more (to counts and the listed obligations) and not kept
    rec = T.reconciliation(obl).persist(StorageLevel.MEMORY_AND_DISK)
    out: dict[str, Any] = {"status_counts": _write_collect(T.status_counts(rec), tables / "status_counts")}
    duplicated = sum(r["obligations"] for r in out["status_counts"] if r["status"] == "duplicated")
    facets_df = spark.createDataFrame(facets, schema=T.facets(ledger).schema) if facets else T.facets(none)
    for name, df in (("lost", T.lost(rec)),
                     ("duplicates", T.duplicates(ledger if duplicated else none, rec,
                                                 broadcast=duplicated <= BROADCAST_LIMIT)),
                     ("dead_letters", T.dead_letters_by_reason(facets_df))):
        out[name] = _write_collect(df, tables / name)
    # the list keeps LIST_LIMIT rows; the summary's count is of all of them
    out["stuck_in_doubt"], stuck = _write_collect(T.stuck_in_doubt(none, req.as_of, req.grace, doubts=doubts),
                                                  tables / "stuck_in_doubt", count=True)
    out["stuck_in_doubt_total"] = [{"transactions": stuck}]
    rec.unpersist()
    doubts.unpersist()
    step("latency")
    counts = T.latency_counts(T.hop_latencies(ledger), codes).persist(StorageLevel.MEMORY_AND_DISK)
    for name, df in (("latency_percentiles", T.latency_percentiles(counts)),
                     ("latency_histogram", T.latency_histogram(counts))):
        out[name] = _write_collect(df, tables / name)
    counts.unpersist()
    step("throughput")
    per_minute = T.throughput_per_minute(ledger, codes).persist(StorageLevel.MEMORY_AND_DISK)
    per_minute.write.mode("overwrite").parquet(str(tables / "throughput_per_minute"))
    out["throughput_totals"] = [r.asDict() for r in T.throughput_totals(per_minute).orderBy("minute").collect()]
    per_minute.unpersist()
    if req.source == "jdbc":
        ledger.unpersist()
    return out


@overload
def _write_collect(df: Any, path: Path) -> list[dict[str, Any]]: ...
@overload
def _write_collect(df: Any, path: Path, *, count: Literal[True]) -> tuple[list[dict[str, Any]], int]: ...


def _write_collect(df: Any, path: Path, *, count: bool = False) -> Any:
    """Write a result table once (one Parquet file set) and return its first :data:`LIST_LIMIT` rows (by the
    first column), computed once: the frame is kept while it is written and its rows are taken. With ``count``
    also the number of all its rows (the list stops at :data:`LIST_LIMIT`)."""
    from pyspark import StorageLevel

    df = df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        df.coalesce(1).write.mode("overwrite").parquet(str(path))
        rows = [r.asDict(recursive=True) for r in df.orderBy(df.columns[0]).limit(LIST_LIMIT).collect()]
        return (rows, int(df.count())) if count else rows
    finally:
        df.unpersist()
