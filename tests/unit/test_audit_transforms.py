"""The audit's PySpark transforms on small hand-built frames (one local[1] session for the module)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from audit import transforms as T

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
AS_OF = T0 + timedelta(hours=1)
GRACE = timedelta(minutes=5)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = (SparkSession.builder.master("local[1]").appName("nsjms-audit-unit")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "1").config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def ms(n: float) -> timedelta:
    return timedelta(milliseconds=n)


def row(dedupe: str, outcome: str, accepted: datetime = T0, *, gtrid: str | None = None,
        hops: tuple[float, ...] = (), reason: str | None = None, direction: str = "channel_to_jms",
        bridge: int = 1, destination: str = "queue/a") -> dict[str, Any]:
    """A ledger row; ``hops``: ms after the previous hop for dispatched, prepared, decided, committed, acked."""
    r: dict[str, Any] = {c.name: None for c in T.LEDGER_SCHEMA.fields}
    r.update(dedupe_id=dedupe, outcome=outcome, accepted_at=accepted, gtrid=gtrid, failure_reason=reason,
             direction=direction, channel_id=0, bridge_id=bridge, proxy_id=bridge, destination=destination,
             recorded_at=accepted)
    t = accepted
    for name, d in zip(T._TS[1:], hops, strict=False):
        t = t + ms(d)
        r[name] = t
    return r


def frame(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    return spark.createDataFrame(rows, schema=T.LEDGER_SCHEMA)


def delivered(dedupe: str, accepted: datetime = T0, **kw: Any) -> list[dict[str, Any]]:
    return [row(dedupe, "accepted", accepted, **kw),
            row(dedupe, "delivered", accepted, gtrid=f"g-{dedupe}", hops=(1, 2, 3, 4, 5), **kw)]


@pytest.fixture(scope="module")
def ledger(spark: SparkSession) -> DataFrame:
    old = T0
    recent = AS_OF - timedelta(minutes=1)
    rows = [
        *delivered("ok"),
        *delivered("dup"), row("dup", "delivered", gtrid="g-dup-2", hops=(1, 1, 1, 1, 1)),
        row("lost", "accepted", old),
        row("flight", "accepted", recent),
        # in doubt, unresolved and old: stuck
        row("doubt", "accepted", old), row("doubt", "in_doubt", old, gtrid="g-doubt", hops=(1, 1)),
        # in doubt, then rolled back and never retried: lost
        row("rb", "accepted", old), row("rb", "in_doubt", old, gtrid="g-rb", hops=(1, 1)),
        row("rb", "rolled_back", old, gtrid="g-rb", reason="broker refused"),
        # in doubt recently: in doubt, not stuck
        row("fresh-doubt", "accepted", recent), row("fresh-doubt", "in_doubt", recent, gtrid="g-fd", hops=(1, 1)),
        # rolled back once, then delivered by a second transaction: delivered once
        row("retry", "accepted", old), row("retry", "rolled_back", old, gtrid="g-r1", reason="timeout"),
        row("retry", "delivered", old, gtrid="g-r2", hops=(1, 2, 3, 4, 5)),
        row("dl1", "accepted", old), row("dl1", "dead_letter", old, hops=(1,), reason="mapping failed"),
        row("dl2", "accepted", old, direction="jms_to_channel"),
        row("dl2", "dead_letter", old, hops=(1,), reason="mapping failed", direction="jms_to_channel"),
        row("dl3", "accepted", old), row("dl3", "dead_letter", old, hops=(1,), reason="header too large"),
        row("exp", "accepted", old), row("exp", "expired", old, reason="stop time"),
    ]
    return frame(spark, rows).cache()


def collect(df: DataFrame, *order: str) -> list[dict[str, Any]]:
    return [r.asDict(recursive=True) for r in df.orderBy(*order).collect()] if order else [
        r.asDict(recursive=True) for r in df.collect()]


def test_reconciliation_classifies_every_obligation(ledger: DataFrame) -> None:
    obl = T.obligations(T.ledger(ledger), AS_OF, GRACE)
    status = {r["dedupe_id"]: r["status"] for r in collect(obl)}
    assert "SortAggregate" in obl._jdf.queryExecution().executedPlan().toString()  # min over strings
    assert status == {
        "ok": "delivered", "dup": "duplicated", "lost": "lost", "flight": "in_flight", "doubt": "in_doubt",
        "rb": "lost", "fresh-doubt": "in_doubt", "retry": "delivered", "dl1": "dead_letter",
        "dl2": "dead_letter", "dl3": "dead_letter", "exp": "expired",
    }
    assert [r["dedupe_id"] for r in collect(T.lost(obl), "dedupe_id")] == ["lost", "rb"]
    rec = T.reconciliation(obl)
    assert collect(T.lost(rec), "dedupe_id") == collect(T.lost(obl), "dedupe_id")
    counts = {(r["status"], r["direction"]): r["obligations"] for r in collect(T.status_counts(rec))}
    assert counts[("dead_letter", "channel_to_jms")] == 2 and counts[("dead_letter", "jms_to_channel")] == 1
    assert sum(counts.values()) == 12


def test_reconciliation_lists_only_the_lost_and_duplicated(ledger: DataFrame) -> None:
    """One row per lost or duplicated obligation (with its ids and dims), one per other status and direction;
    the counts are those of the per-obligation frame."""
    led = T.ledger(ledger)
    obl = T.obligations(led, AS_OF, GRACE)
    rec = collect(T.reconciliation(obl), "status", "dedupe_id")
    listed = [(r["status"], r["dedupe_id"], r["obligations"]) for r in rec if r["dedupe_id"] is not None]
    assert listed == [("duplicated", "dup", 1), ("lost", "lost", 1), ("lost", "rb", 1)]
    assert all(r["accepted_at"] is None and r["destination"] is None for r in rec if r["dedupe_id"] is None)
    direct = {(r["status"], r["direction"]): r["n"] for r in collect(obl.groupBy("status", "direction").count()
                                                                     .withColumnRenamed("count", "n"))}
    assert {(r["status"], r["direction"]): r["obligations"] for r in collect(T.status_counts(T.reconciliation(obl)))
            } == direct
    assert collect(T.duplicates(led, T.reconciliation(obl))) == collect(T.duplicates(led, obl))


def test_bridge_counts_per_direction_and_bridge(spark: SparkSession) -> None:
    """Every status counted per bridge from the reconciliation frame (issue 28: per-bridge tables)."""
    rows = [*delivered("a", bridge=1), *delivered("b", bridge=2), *delivered("c", bridge=2),
            row("l", "accepted", T0, bridge=2), *delivered("j", bridge=1, direction="jms_to_channel")]
    rec = T.reconciliation(T.obligations(T.ledger(frame(spark, rows)), AS_OF, GRACE))
    got = {(r["status"], r["direction"], r["bridge_id"]): r["obligations"] for r in collect(T.bridge_counts(rec))}
    assert got == {("delivered", "channel_to_jms", 1): 1, ("delivered", "channel_to_jms", 2): 2,
                   ("lost", "channel_to_jms", 2): 1, ("delivered", "jms_to_channel", 1): 1}


def test_open_obligations_over_time(spark: SparkSession) -> None:
    """Accepted rows by the minute of accepted_at, terminal rows by the minute of their last hop; the curve is the
    running difference per direction and returns to zero once everything ended."""
    m = timedelta(minutes=1)
    rows = [row("a", "accepted", T0), row("a", "delivered", T0, hops=(60_000 * 2,)),       # ends 2 min later
            row("b", "accepted", T0 + m), row("b", "dead_letter", T0 + m, hops=(1,), reason="x"),
            row("c", "accepted", T0 + m), row("c", "in_doubt", T0 + m, gtrid="g", hops=(1, 1))]  # still open
    per = collect(T.open_per_minute(T.ledger(frame(spark, rows))), "minute")
    assert [(r["minute"].astimezone(UTC) if r["minute"].tzinfo else r["minute"].replace(tzinfo=UTC),
             r["accepted"], r["ended"]) for r in per] == [(T0, 1, 0), (T0 + m, 2, 1), (T0 + 2 * m, 0, 1)]
    series = T.open_over_time(per)
    assert [n for _, n in series["channel_to_jms"]] == [1, 2, 1]


def test_open_doubts_broadcast_distinct_gtrids_only(spark: SparkSession) -> None:
    """The frames :func:`open_doubts` broadcasts hold distinct gtrids: a transaction with one in-doubt row and
    many resolving rows (or many in-doubt rows) gives one row, so the job's limit on in-doubt rows bounds them."""
    rows = [row("a", "in_doubt", T0, gtrid="g1", hops=(1, 1))]
    rows += [row(f"d{i}", "delivered", T0, gtrid="g1", hops=(1, 1, 1, 1, 1)) for i in range(5)]
    rows += [row(f"x{i}", "in_doubt", T0, gtrid="g2", hops=(1, 1)) for i in range(3)]
    rows += [row("r", "rolled_back", T0, gtrid="g2"), row("r2", "rolled_back", T0, gtrid="g2")]
    rows += [row("open", "in_doubt", T0, gtrid="g3", hops=(1, 1)), row("other", "delivered", T0, gtrid="g4")]
    led = T.ledger(frame(spark, rows))
    assert sorted(r["gtrid"] for r in T.resolving_gtrids(led).collect()) == ["g1", "g2"]
    assert [r["dedupe_id"] for r in T.open_doubts(led).collect()] == ["open"]
    assert [r["dedupe_id"] for r in T.open_doubts(led, broadcast=False).collect()] == ["open"]


def test_duplicates_counts_deliveries_and_transactions(ledger: DataFrame) -> None:
    led = T.ledger(ledger)
    dups = collect(T.duplicates(led, T.obligations(led, AS_OF, GRACE)))
    assert [(r["dedupe_id"], r["deliveries"], r["distinct_gtrids"]) for r in dups] == [("dup", 2, 2)]
    assert dups[0]["first_delivered_at"] < dups[0]["last_delivered_at"]


def test_stuck_in_doubt_only_old_unresolved_transactions(ledger: DataFrame) -> None:
    stuck = collect(T.stuck_in_doubt(T.ledger(ledger), AS_OF, GRACE))
    assert [(r["gtrid"], r["items"]) for r in stuck] == [("g-doubt", 1)]
    assert stuck[0]["age_s"] == pytest.approx((AS_OF - T0 - ms(2)).total_seconds())


def test_dead_letters_by_reason(ledger: DataFrame) -> None:
    got = {(r["failure_reason"], r["direction"]): r["dead_letters"]
           for r in collect(T.dead_letters_by_reason(T.facets(T.ledger(ledger))))}
    assert got == {("mapping failed", "channel_to_jms"): 1, ("mapping failed", "jms_to_channel"): 1,
                   ("header too large", "channel_to_jms"): 1}


def test_latency_per_hop_and_end_to_end(spark: SparkSession) -> None:
    # five deliveries whose dispatch hop takes 1..5 ms and everything else 1 ms; one with no broker hops
    rows = [row(f"d{i}", "delivered", hops=(i, 1, 1, 1, 1), gtrid=f"g{i}") for i in range(1, 6)]
    rows.append(row("short", "delivered", hops=(10, 1), gtrid="gs", direction="jms_to_channel"))
    lat = T.latency_counts(T.hop_micros(T.ledger(frame(spark, rows))))
    pct = {(r["hop"], r["direction"]): r for r in collect(T.latency_percentiles(lat))}
    assert pct[("dispatch", "channel_to_jms")]["samples"] == 5
    assert pct[("dispatch", "channel_to_jms")]["p50_ms"] == 3.0
    assert pct[("dispatch", "channel_to_jms")]["max_ms"] == 5.0
    assert pct[("dispatch", "all")]["samples"] == 6 and pct[("dispatch", "all")]["max_ms"] == 10.0
    assert ("decide", "jms_to_channel") not in pct  # no sample, no row
    assert pct[("end_to_end", "jms_to_channel")]["p50_ms"] == 11.0  # accepted → last hop it has
    assert pct[("end_to_end", "channel_to_jms")]["p999_ms"] == 9.0
    hist = collect(T.latency_histogram(lat, bins_per_decade=1), "lo_ms")
    assert [(round(r["lo_ms"]), round(r["hi_ms"]), r["samples"]) for r in hist] == [(1, 10, 5), (10, 100, 1)]


def test_a_hop_starts_at_the_latest_earlier_timestamp_the_row_has(spark: SparkSession) -> None:
    """A delivery outside a T2 has dispatched and acknowledged times only: its acknowledge hop runs from dispatch
    (before, it was null because broker_committed_at is); the hops a row has add up to its end to end."""
    plain = row("plain", "delivered", direction="channel_to_consumer")
    plain.update(dispatched_at=T0 + ms(2), acknowledged_at=T0 + ms(7))
    t2_in = row("t2in", "delivered", hops=(1, 2, 3, 4), gtrid="g", direction="jms_to_channel")
    t2_in["acknowledged_at"] = t2_in["broker_committed_at"]      # JMS → channel: the ACK commit is both
    lat = {r["dedupe_id"]: r for r in collect(T.hop_latencies(T.ledger(frame(spark, [plain, t2_in]))), "dedupe_id")}
    assert (lat["plain"]["dispatch_ms"], lat["plain"]["acknowledge_ms"], lat["plain"]["end_to_end_ms"]) == (2, 5, 7)
    assert lat["plain"]["prepare_ms"] is None and lat["plain"]["broker_commit_ms"] is None
    got = [lat["t2in"][f"{h}_ms"] for h in T.HOP_NAMES]
    assert got == [1, 2, 3, 4, 0, 10]


def test_throughput_per_minute_by_destination(spark: SparkSession) -> None:
    rows = [row(f"a{i}", "delivered", T0 + timedelta(seconds=20 * i), hops=(1, 1, 1, 1, 1)) for i in range(4)]
    rows += [row("b", "delivered", T0, hops=(1, 1, 1, 1, 1), destination="queue/b"),
             row("b", "accepted", T0, destination="queue/b")]
    per_minute = T.throughput_per_minute(T.ledger(frame(spark, rows)))
    got = [(r["minute"].minute, r["destination"], r["delivered"]) for r in collect(per_minute, "minute", "destination")]
    assert got == [(0, "queue/a", 3), (0, "queue/b", 1), (1, "queue/a", 1)]
    totals = collect(T.throughput_totals(per_minute), "minute")
    assert [r["delivered"] for r in totals] == [4, 1]


def test_every_transform_states_its_schema_and_runs_no_python(ledger: DataFrame) -> None:
    led = T.ledger(ledger.withColumn("day", ledger["accepted_at"].cast("date")))  # extra columns are dropped
    assert led.schema == T.LEDGER_SCHEMA
    obl = T.obligations(led, AS_OF, GRACE)
    lat = T.hop_micros(led)
    counts = T.latency_counts(lat)
    facets = T.facets(led)
    outputs = {
        "obligations": obl, "reconciliation": T.reconciliation(obl),
        "status_counts": T.status_counts(T.reconciliation(obl)), "lost": T.lost(obl),
        "counts_coded": T.latency_counts(lat, T.dictionary(r.asDict() for r in facets.collect())),
        "tpm_coded": T.throughput_per_minute(led, T.dictionary(r.asDict() for r in facets.collect())),
        "obligations_coded": T.obligations(led, AS_OF, GRACE, codes=T.dictionary(r.asDict() for r in facets.collect())),
        "duplicates": T.duplicates(led, obl), "stuck": T.stuck_in_doubt(led, AS_OF, GRACE),
        "open_doubts": T.open_doubts(led), "facets": facets,
        "dead": T.dead_letters_by_reason(facets), "lat": lat, "lat_ms": T.hop_latencies(led),
        "counts": counts, "pct": T.latency_percentiles(counts),
        "hist": T.latency_histogram(counts), "tpm": T.throughput_per_minute(led),
        "resent": T.with_resent(T.reconciliation(obl), T.duplicates(led, obl).where("resend")),
    }
    assert outputs["pct"].columns == ["hop", "direction", "samples", "p50_ms", "p90_ms", "p99_ms", "p999_ms",
                                      "max_ms"]
    assert outputs["lost"].columns == ["dedupe_id", "direction", "channel_id", "bridge_id", "destination",
                                       "accepted_at", "node"]       # node: the loss's node (issue 28, takeovers)
    assert outputs["duplicates"].columns == ["dedupe_id", "direction", "channel_id", "bridge_id", "destination",
                                             "deliveries", "distinct_gtrids", "first_delivered_at",
                                             "last_delivered_at", "nodes", "resend"]
    assert outputs["resent"].columns == outputs["reconciliation"].columns
    for name, df in outputs.items():
        plan = df._jdf.queryExecution().executedPlan().toString()
        assert "Python" not in plan, f"{name} runs Python on executors:\n{plan}"


def test_coded_obligations_equal_the_string_aggregation(ledger: DataFrame) -> None:
    """The dictionary path (min over integer codes, a HashAggregate) gives exactly the rows of the string path,
    also when an obligation's rows disagree on a dim and when a dim is null on some rows."""
    led = T.ledger(ledger)
    odd = T.ledger(frame(ledger.sparkSession, [
        row("mixed", "accepted", T0 - timedelta(hours=1), destination="queue/z", direction="jms_to_channel"),
        row("mixed", "delivered", T0 - timedelta(hours=1), destination="queue/b", hops=(1, 1, 1, 1, 1)),
        {**row("nulls", "accepted", T0 - timedelta(hours=1)), "destination": None},
        row("nulls", "expired", T0 - timedelta(hours=1), destination="queue/é", reason="stop time"),
    ]))
    both = led.unionByName(odd)
    codes = T.dictionary(r.asDict() for r in T.facets(both).collect())
    assert codes is not None and codes.destination == ("queue/a", "queue/b", "queue/z", "queue/é")
    coded = T.obligations(both, AS_OF, GRACE, codes=codes)
    plan = coded._jdf.queryExecution().executedPlan().toString()
    assert "SortAggregate" not in plan and "HashAggregate" in plan
    assert collect(coded, "dedupe_id") == collect(T.obligations(both, AS_OF, GRACE), "dedupe_id")
    mixed = next(r for r in collect(coded) if r["dedupe_id"] == "mixed")
    assert (mixed["destination"], mixed["direction"]) == ("queue/b", "channel_to_jms")


def test_coded_latency_and_throughput_equal_the_string_aggregation(ledger: DataFrame) -> None:
    """Latency counts and throughput grouped by integer codes (every key a primitive) give the string rows,
    also for a null direction and a destination outside ASCII."""
    odd = T.ledger(frame(ledger.sparkSession, [
        {**row("nd", "delivered", T0, hops=(1, 2, 3, 4, 5)), "direction": None},
        row("u", "delivered", T0, hops=(2, 2, 2), destination="queue/é", direction="jms_to_channel"),
    ]))
    both = T.ledger(ledger).unionByName(odd)
    codes = T.dictionary(r.asDict() for r in T.facets(both).collect())
    assert codes is not None
    lat = T.hop_micros(both)
    coded = T.latency_counts(lat, codes)
    assert "SortAggregate" not in coded._jdf.queryExecution().executedPlan().toString()
    assert collect(coded, "hop", "direction", "v_ms") == collect(T.latency_counts(lat), "hop", "direction", "v_ms")
    order = ("minute", "direction", "destination", "bridge_id")
    assert collect(T.throughput_per_minute(both, codes), *order) == collect(T.throughput_per_minute(both), *order)
    assert T.throughput_per_minute(both, codes).schema == T.throughput_per_minute(both).schema
    assert coded.schema == T.latency_counts(lat).schema


def test_dictionary_gives_up_beyond_its_limit() -> None:
    many = [{"direction": "channel_to_jms", "destination": f"queue/{i}"} for i in range(T.DICTIONARY_LIMIT + 1)]
    assert T.dictionary(many) is None
    assert T.dictionary(many[:-1]) == T.Codes(("channel_to_jms",), tuple(sorted(r["destination"] for r in many[:-1])))


def test_facets_give_the_dead_letters_and_the_in_doubt_rows(ledger: DataFrame) -> None:
    rows = collect(T.facets(T.ledger(ledger)))
    assert sum(r["rows"] for r in rows) == ledger.count()
    assert sum(r["rows"] for r in rows if r["outcome"] == "in_doubt") == 3
    assert all(r["failure_reason"] is None and r["bridge_id"] is None for r in rows if r["outcome"] != "dead_letter")


def test_percentiles_are_exact_nearest_rank(spark: SparkSession) -> None:
    """p-th percentile = the smallest latency whose cumulative count reaches ceil(p * n), per direction and
    for all; ties and a large sample (where percentile_approx would be approximate) included."""
    import math
    import random

    rnd = random.Random(7)
    rows, values = [], {"channel_to_jms": [], "jms_to_channel": []}  # type: ignore[var-annotated]
    for i in range(3000):
        direction = "channel_to_jms" if i % 3 else "jms_to_channel"
        d = float(rnd.choice([1, 2, 2, 3, 5, 8, 13, 21, 34, 55, 89]) + rnd.randint(0, 50) / 1000)
        rows.append(row(f"x{i}", "delivered", hops=(d,), direction=direction))
        values[direction].append(d)
    values["all"] = values["channel_to_jms"] + values["jms_to_channel"]
    counts = T.latency_counts(T.hop_micros(T.ledger(frame(spark, rows))))
    pct = {r["direction"]: r for r in collect(T.latency_percentiles(counts)) if r["hop"] == "dispatch"}
    driver = {r["direction"]: r for r in T.latency_percentiles_rows(r.asDict() for r in counts.collect())
              if r["hop"] == "dispatch"}
    assert driver == pct  # the driver's percentiles of the collected counts: the same rows, exactly
    for direction, vs in values.items():
        vs.sort()
        for p in T.PERCENTILES:
            want = vs[math.ceil(p * len(vs)) - 1]
            assert pct[direction][T._pname(p)] == pytest.approx(want, abs=1e-9), (direction, p)
        assert (pct[direction]["samples"], pct[direction]["max_ms"]) == (len(vs), pytest.approx(vs[-1]))


def test_percentiles_of_collected_counts_equal_sparks(ledger: DataFrame) -> None:
    """The job takes the percentiles from the collected latency counts (:func:`latency_percentiles_rows`): the
    same rows as :func:`latency_percentiles`, with a null direction, a hop some rows lack and ties."""
    odd = T.ledger(frame(ledger.sparkSession, [
        {**row("nd", "delivered", T0, hops=(1, 2, 3, 4, 5)), "direction": None},
        row("u", "delivered", T0, hops=(2, 2, 2), destination="queue/é", direction="jms_to_channel"),
        row("t", "delivered", T0, hops=(2, 2, 2), direction="jms_to_channel"),
    ]))
    both = T.ledger(ledger).unionByName(odd)
    codes = T.dictionary(r.asDict() for r in T.facets(both).collect())
    for counts in (T.latency_counts(T.hop_micros(both)), T.latency_counts(T.hop_micros(both), codes)):
        plan = counts._jdf.queryExecution().executedPlan().toString()
        assert "normalizenanandzero" not in plan, plan  # grouped by whole microseconds (longs), not doubles
        spark_rows = [r.asDict() for r in T.latency_percentiles(counts).collect()]
        driver_rows = T.latency_percentiles_rows(r.asDict() for r in counts.collect())
        key = lambda r: (r["hop"], r["direction"] or "")  # noqa: E731
        assert sorted(driver_rows, key=key) == sorted(spark_rows, key=key)
        assert len(spark_rows) > 6
