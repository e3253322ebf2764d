"""The Spark work of one audit is pinned (issue 28): the number of Spark jobs and of stages that ran, counted by
Spark's status tracker (audit/sparkwork.py) around the job's whole computation, for a clean ledger and for one with
every kind of fault. Seconds on a shared machine mean nothing; these counts depend only on the ledger and the
settings, so a change that adds a query (a re-join of the ledger, a second latency pass, a table computed by Spark
that the driver can sum) fails here. Lower them when a change removes work; never raise them to make a test pass
without saying why in docs/audit.md ("What the audit costs")."""

# ruff: noqa: F811  (the spark fixture imported from test_audit_transforms, used as a parameter)
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from test_audit_transforms import frame, row, spark  # noqa: F401  (the local Spark session fixture)

from audit import doubtrows, job
from audit import transforms as T
from audit.sparkwork import SparkWork, counted
from audit.synth import SynthSpec, generate, write_parquet

AS_OF = datetime(2026, 1, 2, tzinfo=UTC)
CLEAN = SynthSpec(deliveries=1000, seed=11, rate_per_s=2000.0, nodes=2)
FAULTS = SynthSpec(deliveries=1000, seed=11, rate_per_s=2000.0, nodes=2, lost=3, duplicates=3, in_doubt=3,
                   dead_letters=3)
#: (jobs, stages that ran) of one audit of each ledger on the unit tests' local[1] session; see the module doc
PINNED = {"clean": (7, 7), "faults": (14, 13)}


def _audit(spark: SparkSession, spec: SynthSpec, folder: Path) -> tuple[SparkWork, dict[str, object]]:
    table, _ = generate(spec)
    write_parquet(table, folder / "ledger")
    req = job.AuditRequest(out=folder / "out", source="parquet", as_of=AS_OF, grace=timedelta(minutes=5),
                           parquet=folder / "ledger")
    with counted(spark) as work:
        frames = job._compute(spark, req, lambda _step: None)
    return work, frames


@pytest.mark.parametrize("name", sorted(PINNED))
def test_an_audit_runs_the_pinned_number_of_spark_jobs_and_stages(spark: SparkSession, tmp_path: Path,
                                                                   name: str) -> None:
    work, frames = _audit(spark, CLEAN if name == "clean" else FAULTS, tmp_path)
    by_status: dict[str, int] = {}
    for r in frames["status_counts"]:  # type: ignore[attr-defined]
        by_status[r["status"]] = by_status.get(r["status"], 0) + r["obligations"]
    if name == "faults":   # the audit still finds them: the count is of a complete audit
        assert (by_status["lost"], by_status["duplicated"], by_status["in_doubt"]) == (3, 3, 3)
    assert sum(r["obligations"] for r in frames["node_counts"]) == 1000  # type: ignore[attr-defined]
    assert (work.jobs, work.stages) == PINNED[name], work


# -- the cuts give the rows Spark's transforms give -------------------------------------------------------------
def _arrow(df: DataFrame) -> list[dict[str, Any]]:
    return list(df.toArrow().to_pylist())


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return sorted(map(repr, a)) == sorted(map(repr, b))


def _faults(spark: SparkSession, folder: Path) -> DataFrame:
    table, _ = generate(FAULTS)
    write_parquet(table, folder)
    return T.ledger(spark.read.parquet(str(folder)))


def test_driver_sums_of_the_reconciliation_equal_sparks_tables(spark: SparkSession, tmp_path: Path) -> None:
    led = _faults(spark, tmp_path)
    codes = T.dictionary(r.asDict() for r in T.facets(led).collect())
    assert codes is not None and codes.node == ("node1", "node2")
    rec = T.reconciliation(T.obligations(led, AS_OF, timedelta(minutes=5), codes=codes)).cache()
    small = T.reconciled_rows(_arrow(rec))
    for name, df in (("status_counts", T.status_counts(rec)), ("bridge_counts", T.bridge_counts(rec)),
                     ("node_counts", T.node_counts(rec)), ("lost", T.lost(rec))):
        assert _same(small[name], _arrow(df)), name
    assert len(small["lost"]) == 3 and {r["node"] for r in small["node_counts"]} == {"node1", "node2"}
    rec.unpersist()


def test_one_minute_pass_gives_throughput_and_open_obligations(spark: SparkSession, tmp_path: Path) -> None:
    led = _faults(spark, tmp_path)
    codes = T.dictionary(r.asDict() for r in T.facets(led).collect())
    for c in (codes, None):
        throughput, opened = T.minutes_rows(_arrow(T.minutes(led, c)))
        assert _same(throughput, _arrow(T.throughput_per_minute(led, c)))
        assert _same(opened, _arrow(T.open_per_minute(led)))
        assert len(throughput) > 1 and len(opened) > 1


def test_driver_histogram_equals_sparks_also_on_bin_edges(spark: SparkSession) -> None:
    """Latencies exactly on a bin edge (powers of ten, 10^(k/10) rounded to a microsecond) and around it."""
    ms = [0.0, 0.001, 0.0005, 0.1, 1.0, 10.0, 100.0, 1000.0, 1.259, 1.258, 1.585, 1.584, 3.162, 3.163, 7.943, 2.5]
    rows = []
    for i, v in enumerate(ms):
        rows += [row(f"h{i}", "accepted"), row(f"h{i}", "delivered", hops=(v,))]
    counts = T.latency_counts(T.hop_micros(T.ledger(frame(spark, rows))))
    collected = counts.toArrow()
    columns = T.CountColumns(*(collected.column(c).to_pylist() for c in ("hop", "direction", "v_ms", "n")))
    strict = spark.sparkContext._jvm.java.lang.StrictMath
    assert _same(T.latency_histogram_rows(columns, strict.log10, strict.pow), _arrow(T.latency_histogram(counts)))


def test_an_obligations_node_is_its_accepted_rows_and_a_handover_is_seen(spark: SparkSession) -> None:
    def r(dedupe: str, outcome: str, node: str | None, gtrid: str | None = None) -> dict[str, Any]:
        return {**row(dedupe, outcome, gtrid=gtrid), "node_id": node}

    led = T.ledger(frame(spark, [
        r("same", "accepted", "n1"), r("same", "delivered", "n1", "n1:1"),
        r("moved", "accepted", "n2"), r("moved", "delivered", "n1", "n1:2"),       # accepted by n2, delivered by n1
        r("old", "accepted", None), r("old", "delivered", None, "n3:3"),           # before migration 0009: the gtrid
        r("none", "accepted", None),                                              # no node at all: lost, node null
    ]))
    codes = T.dictionary(x.asDict() for x in T.facets(led).collect())
    assert codes is not None and codes.node == ("n1", "n2", "n3")
    for c in (codes, None):
        got = {x["dedupe_id"]: (x["node"], x["multi_node"], x["status"])
               for x in T.obligations(led, AS_OF, timedelta(minutes=5), codes=c).collect()}
        assert got == {"same": ("n1", False, "delivered"), "moved": ("n2", True, "delivered"),
                       "old": ("n3", False, "delivered"), "none": (None, False, "lost")}, c


def test_an_export_from_before_the_node_column_is_still_read(spark: SparkSession, tmp_path: Path) -> None:
    """Day 1 exported before migration 0009 (no node_id), day 2 after: both days are read, day 1's node is null."""
    table, _ = generate(SynthSpec(deliveries=200, seed=2, rate_per_s=0.002, nodes=2))   # spans two UTC days
    write_parquet(table, tmp_path / "ledger")
    days = sorted((tmp_path / "ledger").glob("day=*"))
    assert len(days) >= 2
    for f in days[0].glob("*.parquet"):
        pq.write_table(pq.read_table(f).drop_columns(["node_id"]), f)
    req = job.AuditRequest(out=tmp_path / "out", source="parquet", as_of=AS_OF, grace=timedelta(minutes=5),
                           parquet=tmp_path / "ledger")
    led = job._read(spark, req)
    got = {(str(r["day"]), r["node_id"] is None) for r in
           led.select(F.col("accepted_at").cast("date").alias("day"), "node_id").distinct().collect()}
    assert {d for d, _ in got} == {p.name.split("=")[1] for p in days}
    assert (days[0].name.split("=")[1], True) in got and (days[-1].name.split("=")[1], False) in got
    assert led.count() == table.num_rows


def test_the_spark_fallbacks_beyond_the_collect_limits_write_the_same_tables(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the collect limits at 0 every table takes its former path (one Spark query each, kept frames, Spark's
    writer): the same rows as the collected path."""
    table, _ = generate(FAULTS)
    write_parquet(table, tmp_path / "ledger")

    def audit(out: str) -> dict[str, list[str]]:
        req = job.AuditRequest(out=tmp_path / out, source="parquet", as_of=AS_OF, grace=timedelta(minutes=5),
                               parquet=tmp_path / "ledger")
        job._compute(spark, req, lambda _step: None)
        return {p.name: sorted(map(repr, pq.read_table(p).to_pylist()))
                for p in sorted((tmp_path / out / "tables").iterdir())}

    collected = audit("collected")
    monkeypatch.setattr(job, "SMALL_TABLE_LIMIT", 0)
    monkeypatch.setattr(job, "COUNTS_LIMIT", 0)
    monkeypatch.setattr(doubtrows, "COLLECT_LIMIT", 0)
    assert audit("spark") == collected
    assert "node_counts" in collected and len(collected["lost"]) == 3
