"""The ``nsjms audit`` job: read the ledger (JDBC or Parquet), run :mod:`audit.transforms`, write the results.

Output directory::

    OUT/tables/<name>/*.parquet   lost, duplicates, resent, stuck_in_doubt, dead_letters, status_counts,
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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, overload

from psycopg.conninfo import conninfo_to_dict

from audit import UsageError

__all__ = ["DEFAULT_JDBC_JAR", "SMALL_LEDGER_ROWS", "AuditRequest", "AuditResult", "jdbc_options", "run_audit",
           "small_ledger_java_options"]

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
    from audit.sparkwork import counted

    step = _Progress(req.progress)
    try:
        step("start Spark")
        with _session(req) as spark:
            with counted(spark) as work:
                frames = _compute(spark, req, step)
            log.info("audit: Spark work: %d jobs, %d stages (%d skipped), %d tasks", work.jobs, work.stages,
                     work.skipped_stages, work.tasks)
            step("report")
            summary = report.summary(frames, req, master=str(spark.sparkContext.master))
            summary["spark_work"] = work.as_dict()
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
    java = None if submitted else small_ledger_java_options(req, os.environ)
    if java is not None:
        conf["spark.driver.extraJavaOptions"] = java
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        if not submitted:
            spark.stop()


#: A Parquet ledger of at most this many rows (counted from its files' footers) is audited by a driver JVM that
#: compiles with C1 only (:func:`small_ledger_java_options`).
SMALL_LEDGER_ROWS = 200_000
#: The driver JVM's option for a small ledger: no C2 (the optimising JIT compiler).
SMALL_LEDGER_JAVA = "-XX:TieredStopAtLevel=1"


def small_ledger_java_options(req: AuditRequest, env: Mapping[str, str]) -> str | None:
    """The driver's JVM options for this audit, or None for the JVM's defaults.

    A small ledger's audit is a JVM that lives for seconds and runs a few dozen small queries: most of its CPU was
    the JIT's optimising compiler (C2) compiling Spark's planner and scheduler for code that then runs a handful of
    times (2,000 rows: 41.5 CPU s with C2, 26.5 without; docs/audit.md, "Round 7"). So a Parquet ledger of at most
    :data:`SMALL_LEDGER_ROWS` rows gets ``-XX:TieredStopAtLevel=1`` (C1 only: results unchanged, only how the JVM
    compiles). A larger one (its tasks' loops run millions of times and C2's code is faster there), a JDBC source
    (its size is unknown before Spark reads it) and any audit whose driver JVM options are set elsewhere
    (``PYSPARK_SUBMIT_ARGS``, a ``spark-defaults.conf``: those are left as they are, nothing is added) keep the
    defaults. The caller does not ask when the JVM is not its own (under ``spark-submit``)."""
    if req.source != "parquet" or req.parquet is None:
        return None
    if any(k in env.get("PYSPARK_SUBMIT_ARGS", "") for k in ("driver-java-options", "extraJavaOptions")):
        return None
    for conf_dir in (env.get("SPARK_CONF_DIR"), env.get("SPARK_HOME") and f"{env['SPARK_HOME']}/conf"):
        defaults = Path(conf_dir) / "spark-defaults.conf" if conf_dir else None
        if defaults is not None and defaults.is_file() and "JavaOptions" in defaults.read_text(errors="replace"):
            return None
    return SMALL_LEDGER_JAVA if _parquet_rows(req.parquet, SMALL_LEDGER_ROWS) <= SMALL_LEDGER_ROWS else None


def _parquet_rows(folder: Path, limit: int) -> int:
    """The rows of the Parquet files under ``folder`` (from their footers), counted until more than ``limit``."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    rows = 0
    for f in sorted(folder.rglob("*.parquet")):
        try:
            rows += int(pq.read_metadata(f).num_rows)
        except (OSError, ValueError):   # not readable here: treat the ledger as large (the JVM's defaults)
            return limit + 1
        if rows > limit:
            break
    return rows


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
        assert req.parquet is not None
        known = _export_schema(req.parquet)
        # not exactly the export's schema (e.g. an export from before the ledger's node_id column, perhaps beside
        # newer days): Spark infers it, merging the files' schemas (a column some files lack reads as null)
        reader = spark.read.option("mergeSchema", "true") if known is None else spark.read.schema(known)
        raw = reader.parquet(str(req.parquet))
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


def _export_schema(folder: Path) -> Any:
    """The Spark schema of an ``nsjms ledger export`` directory (the ledger's columns, and ``day`` when it is
    partitioned by day) when its first Parquet file has exactly the export's Arrow schema, else None (Spark then
    infers it). Given to the reader, it saves Spark's schema-inference job; the footer is read here, by the driver."""
    import pyarrow.parquet as pq
    from pyspark.sql.types import DateType, StructField, StructType

    from audit import transforms as T
    from audit.synth import arrow_schema

    days = sorted(p for p in folder.glob("day=*") if p.is_dir())
    first = next((f for f in sorted((days[0] if days else folder).glob("*.parquet"))), None)
    if first is None or not pq.read_schema(first).remove_metadata().equals(arrow_schema()):
        return None
    return StructType([*T.LEDGER_SCHEMA.fields, *([StructField("day", DateType())] if days else [])])


def _compute(spark: Any, req: AuditRequest, step: _Progress) -> dict[str, Any]:
    """Run the transforms, write every table once, return the small ones collected (lists of dicts).

    Passes over the ledger: :func:`~audit.transforms.facets` (dictionary, dead letters, whether anything is in
    doubt), the per-obligation aggregation, the delivered rows' latencies and throughput; and only when there is
    something to find, the open doubts (two narrow scans) and the duplicated obligations' rows. Each result table
    is one Spark query, collected once as Arrow and written by the driver (:func:`_result`); a table known to be
    empty (no lost, no duplicated, no in-doubt row) is written without a query."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from audit import doubtrows as D
    from audit import latminutes as L
    from audit import transforms as T

    step("read ledger")
    ledger = _read(spark, req)
    if req.source == "jdbc":  # read the database once, not once per result: the first query (facets) fills it
        ledger = ledger.persist(StorageLevel.MEMORY_AND_DISK)
    step("reconcile")
    tables = req.out / "tables"
    facets = [r.asDict() for r in T.facets(ledger).collect()]
    codes = T.dictionary(facets)
    doubt_rows = sum(r["rows"] for r in facets if r["outcome"] == "in_doubt")
    few_doubts = doubt_rows <= BROADCAST_LIMIT
    none = ledger.where(F.lit(False))  # an empty ledger: its results are empty without reading anything
    # few in-doubt rows (known from the facets): the driver finds the open doubts (audit.doubtrows: two narrow
    # queries) and gives the per-obligation aggregation their counts as a local frame; else Spark does, as below
    found = _open_doubts(spark, ledger, doubt_rows) if 0 < doubt_rows <= D.COLLECT_LIMIT else None
    spark_doubts = bool(doubt_rows) and found is None
    doubts = T.open_doubts(ledger if spark_doubts else none, broadcast=few_doubts)
    if spark_doubts:  # read twice: by the obligations and by the stuck transactions
        doubts = doubts.persist(StorageLevel.MEMORY_AND_DISK)
    counts = None if found is None else spark.createDataFrame(D.counts(found), "dedupe_id string, open_doubts long")
    obl = T.obligations(ledger, req.as_of, req.grace, doubts=doubts, codes=codes, broadcast=few_doubts,
                        doubt_counts=counts)
    # the per-obligation frame is aggregated once more (to counts and the listed obligations) and not kept: that
    # reconciliation is collected once (one query) and its tables are summed by the driver; only when it has more
    # than SMALL_TABLE_LIMIT rows (that many lost or duplicated obligations) is it kept and each table one query
    out = _reconciled(spark, ledger, T.reconciliation(obl), tables, none)
        # the dead letters are a sum over the collected facets: written by the driver, no query
    dead = T.dead_letters_by_reason(T.facets(none))
    out["dead_letters"] = _write_rows(dead, T.dead_letters_from_facets(facets), tables / "dead_letters")
    # the list keeps LIST_LIMIT rows; the summary's count is of all of them (at most one per in-doubt row)
    stuck_df = T.stuck_in_doubt(none, req.as_of, req.grace, doubts=doubts)
    if found is not None:  # summed by the driver from the open doubts it found: no query
        stuck_rows = D.stuck_rows(found, req.as_of, req.grace)
        out["stuck_in_doubt"], stuck = _write_rows(stuck_df, stuck_rows, tables / "stuck_in_doubt"), len(stuck_rows)
    else:
        out["stuck_in_doubt"], stuck = _result(stuck_df, tables / "stuck_in_doubt", rows=doubt_rows, count=True)
    out["stuck_in_doubt_total"] = [{"transactions": stuck}]
    if spark_doubts:
        doubts.unpersist()
    step("latency")
    # the latency counts and the per-minute rows: one query (audit.latminutes), split by the driver; a table with
    # more rows than its collect limit takes its own query below, as before
    # only for a small Parquet ledger: on 10M rows the merged pass (one wider struct per hop) cost more task CPU
    # than the two scans it saves (docs/audit.md, "Round 8")
    columns, minute_rows = None, None
    if req.source == "parquet" and req.parquet is not None and \
            _parquet_rows(req.parquet, SMALL_LEDGER_ROWS) <= SMALL_LEDGER_ROWS:
        both = L.counts_and_minutes(ledger, codes).limit(COUNTS_LIMIT + SMALL_TABLE_LIMIT + 1).toArrow()
        if both.num_rows <= COUNTS_LIMIT + SMALL_TABLE_LIMIT:
            columns, minute_rows = L.split(both, codes)
        del both
    if columns is not None and len(columns.n) > COUNTS_LIMIT:
        columns = None
    if minute_rows is not None and len(minute_rows) > SMALL_TABLE_LIMIT:
        minute_rows = None
    out.update(_latency(spark, T.latency_counts(T.hop_micros(ledger), codes), tables, columns))
    step("throughput")
    out.update(_minutes(ledger, codes, tables, minute_rows))
    if req.source == "jdbc":
        ledger.unpersist()
    return out


def _open_doubts(spark: Any, ledger: Any, doubt_rows: int) -> list[dict[str, Any]]:
    """The open doubts of a ledger with ``doubt_rows`` (≤ :data:`audit.doubtrows.COLLECT_LIMIT`) in-doubt rows,
    found by the driver (:mod:`audit.doubtrows`): the in-doubt rows collected (one narrow scan, no shuffle), then the
    resolving rows' gtrids among theirs (one narrow scan, one small shuffle)."""
    from audit import doubtrows as D

    rows = D.in_doubt_rows(ledger).toArrow().to_pylist()
    gtrids = {r["gtrid"] for r in rows if r["gtrid"] is not None}
    resolved = {r["gtrid"] for r in D.resolved_among(ledger, gtrids).toArrow().to_pylist()} if gtrids else set()
    return D.open_rows(rows, resolved)


def _reconciled(spark: Any, ledger: Any, rec: Any, tables: Path, none: Any) -> dict[str, Any]:
    """Write the tables of the :func:`~audit.transforms.reconciliation` ``rec``: status_counts, lost, duplicates,
    resent, bridge_counts, node_counts; return them listed (``none``: the ledger with no row). The duplicated
    obligations whose deliveries are a takeover's re-send (:func:`~audit.transforms.resend_rule`) go to ``resent``
    and are counted with the status ``resent``, not ``duplicated`` (docs/audit.md, "Nodes")."""
    from pyspark import StorageLevel

    from audit import transforms as T

    collected = rec.limit(SMALL_TABLE_LIMIT + 1).toArrow()
    out: dict[str, Any] = {}
    if collected.num_rows <= SMALL_TABLE_LIMIT:
        rows = collected.to_pylist()
        del collected
        duplicated = [r["dedupe_id"] for r in rows if r["status"] == "duplicated"]
        # the duplicated ids as a local frame: the duplicates' query reads the ledger, not the reconciliation again
        ids = spark.createDataFrame([(i, "duplicated") for i in duplicated], "dedupe_id string, status string")
        dups = T.duplicates(ledger if duplicated else none, ids, broadcast=len(duplicated) <= BROADCAST_LIMIT)
        out["duplicates"], out["resent"], resent = _split_duplicates(dups, tables, len(duplicated))
        small = T.reconciled_rows(rows, resent)
        for name, df in (("status_counts", T.status_counts(rec)), ("lost", T.lost(rec)),
                         ("bridge_counts", T.bridge_counts(rec)), ("node_counts", T.node_counts(rec))):
            out[name] = _write_rows(df, small[name], tables / name)
        return out
    del collected
    rec = rec.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        n_dup = sum(r["obligations"] for r in T.status_counts(rec).collect() if r["status"] == "duplicated")
        dups = T.duplicates(ledger if n_dup else none, rec, broadcast=n_dup <= BROADCAST_LIMIT)
        if n_dup:
            dups = dups.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            resend = dups.where("resend")
            out["duplicates"] = _result(dups.where("NOT resend"), tables / "duplicates", rows=n_dup)
            out["resent"] = _result(resend, tables / "resent", rows=n_dup)
            judged = T.with_resent(rec, resend, broadcast=n_dup <= BROADCAST_LIMIT) if n_dup else rec
            out["status_counts"] = _result(T.status_counts(judged), tables / "status_counts")
            n_lost = sum(r["obligations"] for r in out["status_counts"] if r["status"] == "lost")
            out["lost"] = _result(T.lost(rec), tables / "lost", rows=n_lost)
            out["bridge_counts"] = _result(T.bridge_counts(judged), tables / "bridge_counts")
            out["node_counts"] = _result(T.node_counts(judged), tables / "node_counts")
        finally:
            if n_dup:
                dups.unpersist()
        return out
    finally:
        rec.unpersist()


def _split_duplicates(dups: Any, tables: Path, rows: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                   set[str]]:
    """Write :func:`~audit.transforms.duplicates` ``dups`` (at most ``rows`` ≤ :data:`SMALL_TABLE_LIMIT` rows) as
    two tables, ``duplicates`` (violations) and ``resent`` (a takeover's re-send, its ``resend`` column true), from
    ONE query (none when ``rows`` is 0); return both listed and the ids of the re-sent obligations."""
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    if rows == 0:
        return _write_rows(dups, [], tables / "duplicates"), _write_rows(dups, [], tables / "resent"), set()
    table = dups.toArrow()
    resend = pc.fill_null(table.column("resend"), False)
    resent = _write_arrow(dups, table.filter(resend), tables / "resent")
    dup = _write_arrow(dups, table.filter(pc.invert(resend)), tables / "duplicates")
    return (dup.slice(0, LIST_LIMIT).to_pylist(), resent.slice(0, LIST_LIMIT).to_pylist(),
            set(resent.column("dedupe_id").to_pylist()))


#: The latency counts (one row per hop, direction and distinct latency in µs: their number grows with the spread of
#: the latencies, not with the ledger's rows) are collected for the driver's percentiles up to this many rows
#: (about 100 MB of Python lists); beyond, Spark's window query computes the same rows.
COUNTS_LIMIT = 1_000_000

def _latency(spark: Any, counts: Any, tables: Path, columns: Any = None) -> dict[str, Any]:
    """Write ``latency_percentiles`` and ``latency_histogram`` from the latency ``counts`` (one row per hop,
    direction and distinct latency): collected once (one query) up to :data:`COUNTS_LIMIT` rows, and both tables
    computed by the driver from those rows (exact percentiles, :func:`audit.transforms.latency_percentiles_rows`;
    the histogram with Spark's own StrictMath, :func:`audit.transforms.latency_histogram_rows`); beyond, the counts
    are kept and each table is a Spark query (:func:`_latency_percentiles`). ``columns``: the counts already
    collected (:class:`~audit.transforms.CountColumns`, at most :data:`COUNTS_LIMIT` rows; :mod:`audit.latminutes`):
    no query."""
    from pyspark import StorageLevel

    from audit import transforms as T

    if columns is not None:
        return _latency_tables(spark, counts, columns, tables)
    collected = counts.limit(COUNTS_LIMIT + 1).toArrow()
    if collected.num_rows > COUNTS_LIMIT:
        del collected
        counts = counts.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            return {"latency_percentiles": _latency_percentiles(counts, tables / "latency_percentiles"),
                    "latency_histogram": _result(T.latency_histogram(counts), tables / "latency_histogram")}
        finally:
            counts.unpersist()
    columns = T.CountColumns(*(collected.column(c).to_pylist() for c in ("hop", "direction", "v_ms", "n")))
    del collected
    return _latency_tables(spark, counts, columns, tables)


def _latency_tables(spark: Any, counts: Any, columns: Any, tables: Path) -> dict[str, Any]:
    """Write both latency tables from the collected count ``columns`` (``counts``: their frame, for its schema)."""
    from audit import transforms as T

    strict = spark.sparkContext._jvm.java.lang.StrictMath
    return {"latency_percentiles": _write_rows(T.latency_percentiles(counts), T.latency_percentiles_rows(columns),
                                               tables / "latency_percentiles"),
            "latency_histogram": _write_rows(T.latency_histogram(counts),
                                             T.latency_histogram_rows(columns, strict.log10, strict.pow),
                                             tables / "latency_histogram")}


def _latency_percentiles(counts: Any, path: Path) -> list[dict[str, Any]]:
    """Write and return the latency percentiles of the (cached) latency ``counts``: up to :data:`COUNTS_LIMIT`
    count rows are collected once (filling the cache the histogram then reads) and the driver takes the exact
    percentiles from them (:func:`audit.transforms.latency_percentiles_rows`); beyond (many distinct latencies:
    a long outage, a wide spread) Spark's window query (:func:`audit.transforms.latency_percentiles`, the same
    rows) computes them, spilling instead of filling the driver."""
    from audit import transforms as T

    collected = counts.limit(COUNTS_LIMIT + 1).toArrow()
    if collected.num_rows > COUNTS_LIMIT:
        del collected
        return _result(T.latency_percentiles(counts), path)
    columns = T.CountColumns(*(collected.column(c).to_pylist() for c in ("hop", "direction", "v_ms", "n")))
    del collected
    return _write_rows(T.latency_percentiles(counts), T.latency_percentiles_rows(columns), path)


#: A result table of at most this many rows is collected to the driver once (as Arrow) and written there by
#: pyarrow; a larger one (e.g. millions of lost obligations) is written by Spark's executors.
SMALL_TABLE_LIMIT = 100_000


@overload
def _result(df: Any, path: Path, *, rows: int | None = None) -> list[dict[str, Any]]: ...
@overload
def _result(df: Any, path: Path, *, rows: int | None = None,
            count: Literal[True]) -> tuple[list[dict[str, Any]], int]: ...


def _result(df: Any, path: Path, *, rows: int | None = None, count: bool = False) -> Any:
    """Write a result table once and return its first :data:`LIST_LIMIT` rows (by the first column); with
    ``count`` also the number of all its rows. ``rows``: an upper bound of its size known beforehand (None: small
    by construction). Zero rows: an empty table is written, no query; up to :data:`SMALL_TABLE_LIMIT`: one query
    (collected as Arrow, written by the driver, :func:`_write_arrow`); beyond: written by Spark, listed by a
    second query (and counted by a third)."""
    if rows == 0:
        listed = _write_rows(df, [], path)
        return (listed, 0) if count else listed
    if rows is None or rows <= SMALL_TABLE_LIMIT:
        table = _write_arrow(df, df.toArrow(), path)
        listed = table.slice(0, LIST_LIMIT).to_pylist()
        return (listed, table.num_rows) if count else listed
    from pyspark import StorageLevel

    df = df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        df.coalesce(1).write.mode("overwrite").parquet(str(path))
        listed = [r.asDict(recursive=True) for r in df.orderBy(df.columns[0]).limit(LIST_LIMIT).collect()]
        return (listed, int(df.count())) if count else listed
    finally:
        df.unpersist()


def _minutes(ledger: Any, codes: Any, tables: Path, rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Write ``throughput_per_minute`` and ``open_per_minute``; return the throughput totals and the open rows.
    One query (:func:`~audit.transforms.minutes`, collected with a limit one beyond :data:`SMALL_TABLE_LIMIT`) and
    both tables summed by the driver; beyond, one Spark query each (:func:`_throughput`). ``rows``: the
    :func:`~audit.transforms.minutes` rows already collected (:mod:`audit.latminutes`): no query."""
    from audit import transforms as T

    per_minute, opened = T.throughput_per_minute(ledger, codes), T.open_per_minute(ledger)
    if rows is None:
        collected = T.minutes(ledger, codes).limit(SMALL_TABLE_LIMIT + 1).toArrow()
        if collected.num_rows > SMALL_TABLE_LIMIT:
            del collected
            return {"throughput_totals": _throughput(per_minute, tables / "throughput_per_minute"),
                    "open_per_minute": _result(opened, tables / "open_per_minute")}
        rows = collected.to_pylist()
        del collected
    throughput, open_rows = T.minutes_rows(rows)
    _write_rows(per_minute, throughput, tables / "throughput_per_minute")
    return {"throughput_totals": T.throughput_totals_rows(throughput),
            "open_per_minute": _write_rows(opened, open_rows, tables / "open_per_minute")}


def _throughput(per_minute: Any, path: Path) -> list[dict[str, Any]]:
    """Write the per-minute table; return its totals per minute and direction (all of them, by minute). One query
    while it has at most :data:`SMALL_TABLE_LIMIT` rows (taken with a limit one beyond it: the table's size is
    not known beforehand); beyond, written by Spark and summed by Spark."""
    from audit import transforms as T

    table = per_minute.limit(SMALL_TABLE_LIMIT + 1).toArrow()
    if table.num_rows <= SMALL_TABLE_LIMIT:
        table = _write_arrow(per_minute, table, path, sort=False)
        return T.throughput_totals_rows(table.to_pylist())
    from pyspark import StorageLevel

    per_minute = per_minute.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        per_minute.write.mode("overwrite").parquet(str(path))
        return [r.asDict() for r in T.throughput_totals(per_minute).orderBy("minute").collect()]
    finally:
        per_minute.unpersist()


def _write_rows(df: Any, rows: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    """Write Python rows as the table ``df`` would be (its schema; ``df`` is not run); return its listed rows."""
    import pyarrow as pa

    table = _write_arrow(df, pa.Table.from_pylist(rows, schema=_arrow_schema(df)), path)
    listed: list[dict[str, Any]] = table.slice(0, LIST_LIMIT).to_pylist()
    return listed


def _write_arrow(df: Any, table: Any, path: Path, *, sort: bool = True) -> Any:
    """Write ``table`` (``df``'s rows as Arrow) to ``path`` as Spark's ``df.coalesce(1).write.parquet`` would, and
    return it sorted by its first column (Spark's ascending order: nulls first; ``sort`` False: as given).

    Same Parquet schema as Spark's writer: each column optional or required as ``df``'s schema says, timestamps
    as INT96, strings as UTF-8, the ``org.apache.spark.*`` key-value metadata Spark readers use; one
    ``part-00000-….snappy.parquet`` file and a ``_SUCCESS`` marker in a directory replaced as a whole. Written by the
    driver: ``path`` is on the driver's file system (as ``summary.json`` is), not the executors'."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _arrow_schema(df)
    table = pa.Table.from_arrays([table.column(i).cast(f.type) for i, f in enumerate(schema)], schema=schema)
    if sort and table.num_rows:
        table = table.sort_by([(schema.names[0], "ascending", "at_start")])
    meta = {"org.apache.spark.version": df.sparkSession.version,
            "org.apache.spark.sql.parquet.row.metadata": df._jdf.schema().json()}
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    # Spark's timestamps read back as naive nanoseconds (of UTC) from INT96: the same Arrow type here; a column
    # holding a time nanoseconds cannot (before 1677 or after 2262, e.g. a clock-skewed ledger row) stays in
    # microseconds (still INT96, as Spark writes it; only a pyarrow reader sees microseconds) instead of failing
    cols, fields = [], []
    for c, f in zip(table.columns, schema, strict=True):
        if pa.types.is_timestamp(f.type):
            c = c.cast(pa.timestamp("us"))
            try:
                c, f = c.cast(pa.timestamp("ns")), pa.field(f.name, pa.timestamp("ns"), f.nullable)
            except pa.ArrowInvalid:
                f = pa.field(f.name, pa.timestamp("us"), f.nullable)
        cols.append(c)
        fields.append(f)
    parquet = pa.Table.from_arrays(cols, schema=pa.schema(fields))
    pq.write_table(parquet.replace_schema_metadata(meta), path / "part-00000-driver.snappy.parquet",
                   compression="snappy", use_deprecated_int96_timestamps=True)
    (path / "_SUCCESS").touch()
    return table


def _arrow_schema(df: Any) -> Any:
    """``df``'s schema in Arrow: its types (timestamps in UTC) and each column's nullability."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    fields = zip(to_arrow_schema(df.schema, timezone="UTC"), df.schema.fields, strict=True)
    return pa.schema([a.with_nullable(s.nullable) for a, s in fields])
