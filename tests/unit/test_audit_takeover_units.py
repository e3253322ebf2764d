"""Cluster-aware verdicts (issue 28, docs/audit.md "Nodes"): a takeover's documented re-send (docs/cluster.md: the
survivor re-sends a dead node's decided channel → JMS messages with their original's nsjms_dedupe_id, and records
it, ``router.routing.ledger.record_resends``) is counted apart as ``resent``, never a violation; any other duplicate,
also one across nodes, and any loss stay violations attributed to a node."""

# ruff: noqa: F811  (the spark fixture imported from test_audit_transforms, used as a parameter)
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
from pyspark.sql import SparkSession
from test_audit_transforms import AS_OF, GRACE, frame, row, spark  # noqa: F401  (the Spark session fixture)

from audit import job, report
from audit import transforms as T
from audit.sparkwork import counted
from audit.synth import SURVIVOR, SynthSpec, generate, write_parquet

TAKEOVER = SynthSpec(deliveries=1000, seed=11, rate_per_s=2000.0, nodes=2, lost=3, duplicates=3, in_doubt=3,
                     dead_letters=3, resent=4, cross_node_duplicates=2)


def _r(dedupe: str, outcome: str, node: str | None, gtrid: str | None = None, msg: str | None = None,
       direction: str = "channel_to_jms") -> dict[str, Any]:
    return {**row(dedupe, outcome, gtrid=gtrid, direction=direction, hops=(1, 2, 3, 4)), "node_id": node,
            "jms_message_id": msg}


def _deliveries(dedupe: str, *writers: tuple[str | None, str | None, str | None],
                direction: str = "channel_to_jms") -> list[dict[str, Any]]:
    """An obligation accepted by node a and delivered once per (node, gtrid, message) of ``writers``."""
    return [_r(dedupe, "accepted", "a", direction=direction),
            *[_r(dedupe, "delivered", n, g, m, direction) for n, g, m in writers]]


def _ledger(spark: SparkSession) -> Any:
    rows = [
        *_deliveries("resent", ("a", "a:1", "a:1/0"), ("b", "a:1", "a:1/0")),          # the takeover's re-send
        *_deliveries("same-node", ("a", "a:2", "a:2/0"), ("a", "a:2", "a:2/0")),       # one node twice
        *_deliveries("two-txns", ("a", "a:3", "a:3/0"), ("b", "b:4", "b:4/0")),        # routed again by b
        *_deliveries("two-msgs", ("a", "a:5", "a:5/0"), ("b", "a:5", "a:5/1")),        # another message
        *_deliveries("thrice", ("a", "a:6", "a:6/0"), ("b", "a:6", "a:6/0"), ("c", "a:6", "a:6/0")),
        *_deliveries("no-node", ("a", "a:7", "a:7/0"), (None, "a:7", "a:7/0")),        # a writer unknown
        *_deliveries("plain-gtrid", ("a", "g8", "g8/0"), ("b", "g8", "g8/0")),         # not a node's gtrid
        *_deliveries("inbound", ("a", "a:9", "m9"), ("b", "a:9", "m9"), direction="jms_to_channel"),  # exactly once
        *_deliveries("ok", ("a", "a:10", "a:10/0")),
        _r("lost", "accepted", "b"),
    ]
    return T.ledger(frame(spark, rows))


def test_only_the_takeovers_re_send_is_resent_every_other_duplicate_is_one(spark: SparkSession) -> None:
    led = _ledger(spark)
    obl = T.obligations(led, AS_OF, GRACE)
    dups = {r["dedupe_id"]: r.asDict() for r in T.duplicates(led, obl).collect()}
    assert {k for k, r in dups.items() if r["resend"]} == {"resent"}
    assert set(dups) == {"resent", "same-node", "two-txns", "two-msgs", "thrice", "no-node", "plain-gtrid", "inbound"}
    assert (dups["resent"]["nodes"], dups["two-txns"]["nodes"], dups["same-node"]["nodes"]) == ("a,b", "a,b", "a")
    assert dups["no-node"]["nodes"] == "a" and dups["thrice"]["nodes"] == "a,b,c"
    rec = T.reconciliation(obl).cache()
    rows = [r.asDict() for r in rec.collect()]
    small = T.reconciled_rows(rows, {"resent"})
    by_status: dict[str, int] = {}
    for r in small["status_counts"]:
        by_status[r["status"]] = by_status.get(r["status"], 0) + r["obligations"]
    assert by_status == {"resent": 1, "duplicated": 7, "delivered": 1, "lost": 1}
    # the Spark query for a reconciliation too large to collect gives the same rows
    judged = T.with_resent(rec, T.duplicates(led, obl).where("resend"))
    for name, df in (("status_counts", T.status_counts(judged)), ("bridge_counts", T.bridge_counts(judged)),
                     ("node_counts", T.node_counts(judged))):
        assert sorted(map(repr, small[name])) == sorted(map(repr, [r.asDict() for r in df.collect()])), name
    # a loss is attributed to the node that accepted it
    assert [(r["dedupe_id"], r["node"]) for r in small["lost"]] == [("lost", "b")]
    assert [(r["dedupe_id"], r["node"]) for r in T.lost(rec).collect()] == [("lost", "b")]
    rec.unpersist()


def _audit(spark: SparkSession, spec: SynthSpec, folder: Path) -> dict[str, Any]:
    table, _ = generate(spec)
    write_parquet(table, folder / "ledger")
    req = job.AuditRequest(out=folder / "out", source="parquet", as_of=datetime(2026, 1, 2, tzinfo=UTC),
                           grace=timedelta(minutes=5), parquet=folder / "ledger")
    frames = job._compute(spark, req, lambda _step: None)
    return {"frames": frames, "summary": report.summary(frames, req, master="local[1]"), "req": req}


def test_an_audit_of_a_ledger_with_takeovers_counts_re_sends_apart(spark: SparkSession, tmp_path: Path) -> None:
    _, truth = generate(TAKEOVER)
    assert len(truth.resent) == 4 and len(truth.duplicated) == 5
    table, _ = generate(TAKEOVER)
    write_parquet(table, tmp_path / "ledger")
    req = job.AuditRequest(out=tmp_path / "out", source="parquet", as_of=datetime(2026, 1, 2, tzinfo=UTC),
                           grace=timedelta(minutes=5), parquet=tmp_path / "ledger")
    with counted(spark) as work:
        frames = job._compute(spark, req, lambda _step: None)
    # the split costs no query: as many Spark jobs as the pinned audit with faults (test_audit_work)
    assert (work.jobs, work.stages) == (14, 13), work
    summ = report.summary(frames, req, master="local[1]")
    assert summ["resent"] == 4 and set(summ["resent_ids"]) == truth.resent
    assert summ["duplicated"] == 5 and set(summ["duplicate_ids"]) == truth.duplicated
    assert summ["violations"] == ["3 lost (allowed 0)", "5 duplicated (allowed 0)"], "re-sends are no violation"
    tables = tmp_path / "out" / "tables"
    resent = pq.read_table(tables / "resent").to_pylist()
    assert {r["dedupe_id"] for r in resent} == truth.resent and all(r["resend"] for r in resent)
    assert all(r["deliveries"] == 2 and r["distinct_gtrids"] == 1 and SURVIVOR in r["nodes"] for r in resent)
    dups = pq.read_table(tables / "duplicates").to_pylist()
    assert {r["dedupe_id"] for r in dups} == truth.duplicated and not any(r["resend"] for r in dups)
    cross = [r for r in dups if r["nodes"] and SURVIVOR in r["nodes"]]
    assert len(cross) == 2 and all(r["distinct_gtrids"] == 2 for r in cross), "across nodes, two transactions"
    lost = pq.read_table(tables / "lost").to_pylist()
    assert {r["dedupe_id"] for r in lost} == truth.lost and all(r["node"] in ("node1", "node2") for r in lost)
    by_node = {r["node"]: r for r in report.node_table(frames["node_counts"])}
    assert sum(r["resent"] for r in by_node.values()) == 4 and sum(r["lost"] for r in by_node.values()) == 3
    assert all(r["multi_node"] >= r["resent"] for r in by_node.values())
    report.write(req.out, summ, frames)
    page = (req.out / "report.html").read_text()
    assert "Re-sent at a takeover (allowed)" in page and sorted(truth.resent)[0] in page


def test_a_ledger_whose_only_duplicates_are_re_sends_passes(spark: SparkSession, tmp_path: Path) -> None:
    got = _audit(spark, SynthSpec(deliveries=300, seed=3, rate_per_s=2000.0, nodes=2, resent=5), tmp_path)
    assert (got["summary"]["resent"], got["summary"]["duplicated"], got["summary"]["violations"]) == (5, 0, [])


@pytest.mark.parametrize("limit", [0, 3])
def test_the_spark_path_of_a_large_reconciliation_splits_the_same_way(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
    collected = _audit(spark, TAKEOVER, tmp_path / "collected")["summary"]
    monkeypatch.setattr(job, "SMALL_TABLE_LIMIT", limit)
    spark_path = _audit(spark, TAKEOVER, tmp_path / "spark")["summary"]
    for key in ("by_status", "resent", "resent_ids", "duplicated", "duplicate_ids", "lost_ids", "by_node",
                "by_bridge", "violations"):
        assert spark_path[key] == collected[key], key
    for name in ("resent", "duplicates", "lost", "status_counts", "node_counts", "bridge_counts"):
        a = sorted(map(repr, pq.read_table(tmp_path / "collected" / "out" / "tables" / name).to_pylist()))
        b = sorted(map(repr, pq.read_table(tmp_path / "spark" / "out" / "tables" / name).to_pylist()))
        assert a == b, name

