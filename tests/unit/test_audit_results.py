"""The audit's result tables written by the driver (one query each, pyarrow) equal what Spark wrote before: the
same rows and the same Parquet schema; the Python sums over collected rows equal the Spark transforms; the
ledger's known export schema is the one Spark infers (one local[1] session for the module)."""

# ruff: noqa: F811  (the spark fixture imported from test_audit_transforms, used as a parameter)
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from test_audit_transforms import spark  # noqa: F401  (the local Spark session fixture)

from audit import job
from audit import transforms as T
from audit.synth import SynthSpec, generate, write_parquet

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def ledger(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> DataFrame:
    folder = tmp_path_factory.mktemp("ledger")
    table, _ = generate(SynthSpec(deliveries=300, seed=5, rate_per_s=2.0, lost=3, duplicates=2, in_doubt=2,
                                  dead_letters=4))
    write_parquet(table, folder)
    return T.ledger(spark.read.parquet(str(folder))).cache()


def _read(path: Path) -> tuple[str, list[tuple[Any, ...]]]:
    table = pq.read_table(path)
    return str(table.schema), sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)


def _frames(ledger: DataFrame) -> dict[str, DataFrame]:
    as_of, grace = T0 + timedelta(days=30), timedelta(minutes=5)
    rec = T.reconciliation(T.obligations(ledger, as_of, grace)).cache()
    counts = T.latency_counts(T.hop_micros(ledger))
    return {"status_counts": T.status_counts(rec), "lost": T.lost(rec), "duplicates": T.duplicates(ledger, rec),
            "latency_percentiles": T.latency_percentiles(counts), "nothing": T.lost(rec).where(F.lit(False))}


def test_driver_written_tables_equal_sparks(ledger: DataFrame, tmp_path: Path) -> None:
    """Every kind of column (strings, ints, not-null longs, doubles, INT96 timestamps, nulls), an empty table
    too: the same schema (with Spark's metadata) and rows as ``coalesce(1).write.parquet``, and the listed rows
    are Spark's ``orderBy(first column)`` rows; Spark reads the driver's table back with the frame's types."""
    for name, df in _frames(ledger).items():
        df.coalesce(1).write.parquet(str(tmp_path / "spark" / name))
        listed = job._result(df, tmp_path / "driver" / name)
        assert _read(tmp_path / "driver" / name) == _read(tmp_path / "spark" / name), name
        first = df.columns[0]
        assert [r[first] for r in listed] == sorted(r[first] for r in pq.read_table(tmp_path / "spark" / name)
                                                    .to_pylist()), name
    again = ledger.sparkSession.read.parquet(str(tmp_path / "driver" / "duplicates"))
    assert [f.dataType for f in again.schema] == [f.dataType for f in _frames(ledger)["duplicates"].schema]


def test_known_empty_table_is_written_without_a_query(ledger: DataFrame, tmp_path: Path) -> None:
    df = T.lost(T.obligations(ledger, T0, timedelta(0)))
    listed, n = job._result(df, tmp_path / "empty", rows=0, count=True)
    assert (listed, n) == ([], 0)
    df.where(F.lit(False)).coalesce(1).write.parquet(str(tmp_path / "spark"))
    assert _read(tmp_path / "empty") == _read(tmp_path / "spark")


def test_python_sums_equal_the_spark_transforms(ledger: DataFrame) -> None:
    facets = [r.asDict() for r in T.facets(ledger).collect()]
    spark_dead = T.dead_letters_by_reason(T.facets(ledger)).collect()
    assert sorted(map(repr, T.dead_letters_from_facets(facets))) == sorted(repr(r.asDict()) for r in spark_dead)
    assert sum(r["dead_letters"] for r in T.dead_letters_from_facets(facets)) == 4
    per_minute = T.throughput_per_minute(ledger)
    rows = per_minute.toArrow().to_pylist()
    spark_totals = [(r["minute"].replace(tzinfo=None), r["direction"], r["delivered"])
                    for r in T.throughput_totals(per_minute).collect()]
    python_totals = [(r["minute"].astimezone(UTC).replace(tzinfo=None), r["direction"], r["delivered"])
                     for r in T.throughput_totals_rows(rows)]
    assert sorted(python_totals, key=repr) == sorted(spark_totals, key=repr)
    minutes = [r["minute"] for r in T.throughput_totals_rows(rows)]
    assert minutes == sorted(minutes)


def test_known_export_schema_is_the_one_spark_infers(ledger: DataFrame, tmp_path: Path) -> None:
    table, _ = generate(SynthSpec(deliveries=20, seed=1))
    write_parquet(table, tmp_path / "by-day")
    pq.write_table(table, tmp_path / "flat.parquet")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat.parquet").rename(tmp_path / "flat" / "part-0.parquet")
    spark = ledger.sparkSession
    for folder in (tmp_path / "by-day", tmp_path / "flat"):
        known = job._export_schema(folder)
        assert known is not None
        assert known == spark.read.parquet(str(folder)).schema
    other = table.drop_columns(["gtrid"])
    (tmp_path / "other").mkdir()
    pq.write_table(other, tmp_path / "other" / "part-0.parquet")
    assert job._export_schema(tmp_path / "other") is None  # not an export: Spark infers it


def test_driver_written_timestamps_outside_the_nanosecond_range_are_written_like_sparks(
        spark: SparkSession, tmp_path: Path) -> None:
    """A timestamp Spark holds but nanoseconds cannot (year 2300, e.g. a clock-skewed ledger row): the driver's
    writer cast every timestamp to nanoseconds and failed, aborting the whole audit, where Spark's writer did
    not. Spark reads the driver's table back with the same values."""
    rows = [("a", datetime(2300, 1, 1, tzinfo=UTC)), ("b", datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)),
            ("c", None)]
    df = spark.createDataFrame(rows, "dedupe_id string, accepted_at timestamp")
    listed = job._result(df, tmp_path / "driver")
    assert [r["accepted_at"] for r in listed] == [r[1] for r in rows]
    back = spark.read.parquet(str(tmp_path / "driver")).orderBy("dedupe_id").collect()
    assert back == df.orderBy("dedupe_id").collect()


def test_latency_percentiles_beyond_the_collect_limit_come_from_spark(ledger: DataFrame, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver collects the latency counts only up to ``COUNTS_LIMIT`` rows (their number grows with the spread
    of the latencies, not with the ledger): beyond, Spark's window query writes the same table."""
    counts = T.latency_counts(T.hop_micros(ledger)).cache()
    n = counts.count()
    collected = job._latency_percentiles(counts, tmp_path / "driver")
    taken: list[int] = []
    real = T.latency_percentiles_rows
    monkeypatch.setattr(T, "latency_percentiles_rows", lambda rows: taken.append(1) or real(rows))
    monkeypatch.setattr(job, "COUNTS_LIMIT", n - 1)
    by_spark = job._latency_percentiles(counts, tmp_path / "spark")
    assert not taken                                       # over the limit: nothing taken by the driver
    assert _read(tmp_path / "driver") == _read(tmp_path / "spark")
    key = lambda r: (r["hop"], r["direction"] or "")  # noqa: E731
    assert sorted(collected, key=key) == sorted(by_spark, key=key) and len(collected) > 6
    monkeypatch.setattr(job, "COUNTS_LIMIT", n)            # at the limit: the driver's
    job._latency_percentiles(counts, tmp_path / "again")
    assert taken == [1]
