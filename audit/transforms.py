"""The audit as pure PySpark transforms: each function takes DataFrames and returns one, starting with a
``select`` of the columns it reads and ending with a ``select`` of the columns it returns (its schema), joins
state their type, and everything is Spark SQL expressions (no Python UDFs).

Definitions (the contract the router's ledger writes follow):

* an **obligation** is a ``dedupe_id``; its rows share ``accepted_at``;
* **delivered**: it has a ``delivered`` row; **duplicated**: more than one;
* **in doubt**: it has an ``in_doubt`` row whose ``gtrid`` has no resolving row (``delivered``,
  ``rolled_back``, ``dead_letter``, ``discarded``, ``expired``) with the same gtrid; **stuck** once the
  ``prepared_at`` is older than ``as_of - grace``;
* **lost**: accepted at or before ``as_of - grace``, no terminal row, not in doubt;
* **in flight**: accepted after ``as_of - grace``, no terminal row, not in doubt.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

__all__ = [
    "DICTIONARY_LIMIT",
    "HOPS",
    "HOP_NAMES",
    "LEDGER_SCHEMA",
    "PERCENTILES",
    "Codes",
    "CountColumns",
    "bridge_counts",
    "dead_letters_by_reason",
    "dead_letters_from_facets",
    "dictionary",
    "duplicates",
    "facets",
    "hop_latencies",
    "hop_micros",
    "latency_counts",
    "latency_histogram",
    "latency_histogram_rows",
    "latency_percentiles",
    "latency_percentiles_rows",
    "ledger",
    "lost",
    "minutes",
    "minutes_rows",
    "node_counts",
    "obligations",
    "open_doubts",
    "open_over_time",
    "open_per_minute",
    "reconciled_rows",
    "reconciliation",
    "resend_rule",
    "resolving_gtrids",
    "row_node",
    "status_counts",
    "stuck_in_doubt",
    "throughput_per_minute",
    "throughput_totals",
    "throughput_totals_rows",
    "with_resent",
]

_TS = ("accepted_at", "dispatched_at", "prepared_at", "decided_at", "broker_committed_at", "acknowledged_at")
LEDGER_SCHEMA = StructType(
    [StructField(c, LongType()) for c in ("entry_id", "event_id")]
    + [StructField(c, StringType()) for c in ("jms_message_id", "dedupe_id")]
    + [StructField(c, IntegerType()) for c in ("channel_id", "proxy_id", "bridge_id")]
    + [StructField(c, StringType()) for c in ("destination", "direction", "gtrid")]
    + [StructField(c, TimestampType()) for c in _TS]
    + [StructField(c, StringType()) for c in ("outcome", "failure_reason")]
    + [StructField("recorded_at", TimestampType()), StructField("node_id", StringType())]
)
#: (hop name, previous column, to column): a hop runs from the latest EARLIER timestamp the row has (usually the
#: previous column; e.g. a delivery outside a T2 has no prepare/decide/broker hops, so its ``acknowledge`` runs
#: from ``dispatched_at``); ``end_to_end`` ends at the last hop the row has.
HOPS: tuple[tuple[str, str, str], ...] = (
    ("dispatch", "accepted_at", "dispatched_at"),
    ("prepare", "dispatched_at", "prepared_at"),
    ("decide", "prepared_at", "decided_at"),
    ("broker_commit", "decided_at", "broker_committed_at"),
    ("acknowledge", "broker_committed_at", "acknowledged_at"),
)
HOP_NAMES: tuple[str, ...] = (*[h for h, _, _ in HOPS], "end_to_end")
PERCENTILES = (0.5, 0.9, 0.99, 0.999)
_TERMINAL = ("delivered", "dead_letter", "discarded", "expired")
_RESOLVING = ("delivered", "rolled_back", "dead_letter", "discarded", "expired")
_DIMS = ("direction", "channel_id", "bridge_id", "destination")


def ledger(raw: DataFrame) -> DataFrame:
    """Any source (JDBC, Parquet, a test frame) → the ledger schema, typed; extra columns are dropped. A source
    without ``node_id`` (a ledger or an export from before migration 0009) gets it as null: node unknown."""
    have = set(raw.columns)
    return raw.select(*[(F.col(f.name) if f.name in have or f.name != "node_id" else F.lit(None))
                        .cast(f.dataType).alias(f.name) for f in LEDGER_SCHEMA.fields])


def row_node() -> Column:
    """The node a ledger row names: its ``node_id`` (the writer, migration 0009), else, on an older row, the node
    of its ``gtrid`` (``node:token``, a routing transaction's rows), else null."""
    gtrid = F.col("gtrid")
    return F.coalesce(F.col("node_id"), F.when(gtrid.contains(":"), F.substring_index(gtrid, ":", 1)))


def _total(col: str) -> Column:
    """``sum`` of a count column, never null (as the ``count`` it adds up)."""
    return F.coalesce(F.sum(col), F.lit(0)).cast(LongType())


def _count_if(cond: Column) -> Column:
    return F.sum(F.when(cond, 1).otherwise(0)).cast(LongType())


@dataclass(frozen=True)
class Codes:
    """The distinct non-null ``direction`` and ``destination`` values, sorted as Spark orders strings (by their
    UTF-8 bytes, which is Python's order of code points): ``min`` over their 1-based positions is ``min`` over the
    strings, and an integer ``min`` runs as a HashAggregate (a string ``min`` needs a SortAggregate)."""

    direction: tuple[str, ...]
    destination: tuple[str, ...]
    node: tuple[str, ...] = ()      # the nodes the rows name (:func:`row_node`)


#: :func:`dictionary` gives no :class:`Codes` when a column has more distinct values than this (the code of a
#: value is found by a linear search of a literal array); :func:`obligations` then takes the string ``min``.
DICTIONARY_LIMIT = 256


def dictionary(facet_rows: Iterable[Mapping[str, Any]]) -> Codes | None:
    """The :class:`Codes` of collected :func:`facets` rows, or None beyond :data:`DICTIONARY_LIMIT` values."""
    rows = list(facet_rows)
    values = [sorted({str(r[c]) for r in rows if r.get(c) is not None}) for c in ("direction", "destination", "node")]
    if max(len(v) for v in values) > DICTIONARY_LIMIT:
        return None
    return Codes(tuple(values[0]), tuple(values[1]), tuple(values[2]))


def _encode(col: str, values: tuple[str, ...], expr: Column | None = None) -> Column:
    """The 1-based position of the column's value (``expr``, default the column ``col``) in ``values``."""
    if not values:
        return F.lit(None).cast(LongType())
    return F.array_position(F.array(*[F.lit(v) for v in values]), F.col(col) if expr is None else expr)


def _decode(code: Column, values: tuple[str, ...]) -> Column:
    if not values:
        return F.lit(None).cast(StringType())
    return F.when(code.isNotNull(), F.element_at(F.array(*[F.lit(v) for v in values]), code.cast(IntegerType())))


def facets(ledger_df: DataFrame) -> DataFrame:
    """The ledger in one small aggregation: direction, destination, outcome, failure_reason and bridge_id (of
    ``dead_letter`` rows; null on the others), rows, node (:func:`row_node`). Gives the :func:`dictionary`, the
    dead letters (:func:`dead_letters_by_reason`) and whether any row is ``in_doubt``, in one pass over the ledger."""
    dl = F.col("outcome") == "dead_letter"
    return (ledger_df.select("direction", "destination", "outcome", "failure_reason", "bridge_id", "node_id", "gtrid")
            .groupBy("direction", "destination", "outcome", F.when(dl, F.col("failure_reason")).alias("reason"),
                     F.when(dl, F.col("bridge_id")).alias("bridge"), row_node().alias("node"))
            .agg(F.count(F.lit(1)).alias("n"))
            .select("direction", "destination", "outcome", F.col("reason").alias("failure_reason"),
                    F.col("bridge").alias("bridge_id"), F.col("n").cast(LongType()).alias("rows"), "node"))


def open_doubts(ledger_df: DataFrame, broadcast: bool = True) -> DataFrame:
    """In-doubt rows whose gtrid has no resolving row: dedupe_id, gtrid, prepared_at.

    The resolving rows are first narrowed to the (few) in-doubt gtrids by a semi join, so the ledger's
    millions of gtrids are never de-duplicated or shuffled (``broadcast``: the in-doubt gtrids are sent to every
    task; give False when there are millions of in-doubt rows).
    """
    rows = ledger_df.select("dedupe_id", "gtrid", "prepared_at", "outcome")
    doubts = rows.where(F.col("outcome") == "in_doubt").select("dedupe_id", "gtrid", "prepared_at")
    resolved = resolving_gtrids(rows, broadcast)
    return (doubts.join(F.broadcast(resolved) if broadcast else resolved, on="gtrid", how="left_anti")
            .select("dedupe_id", "gtrid", "prepared_at"))


def resolving_gtrids(ledger_df: DataFrame, broadcast: bool = True) -> DataFrame:
    """gtrid: the distinct gtrids that have an ``in_doubt`` row and a resolving row. Both frames
    :func:`open_doubts` broadcasts (the in-doubt gtrids, then these) hold distinct gtrids, so neither has more
    rows than the ledger has ``in_doubt`` rows, whatever the number of resolving rows per transaction."""
    rows = ledger_df.select("gtrid", "outcome")
    ids = rows.where(F.col("outcome") == "in_doubt").select("gtrid").distinct()
    return (rows.where(F.col("outcome").isin(*_RESOLVING) & F.col("gtrid").isNotNull()).select("gtrid")
            .join(F.broadcast(ids) if broadcast else ids, on="gtrid", how="left_semi").distinct())


def obligations(ledger_df: DataFrame, as_of: datetime, grace: timedelta, *, doubts: DataFrame | None = None,
                codes: Codes | None = None, broadcast: bool = True,
                doubt_counts: DataFrame | None = None) -> DataFrame:
    """One row per dedupe_id with its counts and ``status`` (delivered, duplicated, dead_letter, discarded,
    expired, in_doubt, lost, in_flight), its ``node`` and ``multi_node``.

    ``node``: the node of its ``accepted`` row (:func:`row_node`: the node that took responsibility for it), else the
    first node any of its rows names (in Spark's string order), null when none does. ``multi_node``: its rows'
    ``node_id`` name more than one node (e.g. accepted by one node, delivered by another).

    ``doubts``: :func:`open_doubts` of the same ledger, when the caller has it already. ``codes``: the ledger's
    :func:`dictionary`; with it the aggregation takes ``min`` of integer codes of the string dims (a
    HashAggregate), without it ``min`` of the strings (a SortAggregate); the results are the same.
    ``broadcast``: the open doubts are few (see :func:`open_doubts`). ``doubt_counts``: dedupe_id, open_doubts
    (the open doubts already counted per obligation, e.g. by the driver: :mod:`audit.doubtrows`), instead of
    ``doubts``."""
    rows = ledger_df.select("dedupe_id", *_DIMS, "gtrid", "accepted_at", "prepared_at", "outcome", "node_id")
    accepted = F.col("outcome") == "accepted"
    if codes is None:
        dims = [F.min(c).alias(c) for c in _DIMS]
        decoded = [F.col(c) for c in _DIMS]
        node, writer = row_node(), F.col("node_id")
        decode_node = F.col("node")
    else:
        coded = {"direction": codes.direction, "destination": codes.destination}
        dims = [F.min(_encode(c, coded[c]) if c in coded else F.col(c)).alias(c) for c in _DIMS]
        decoded = [_decode(F.col(c), coded[c]).alias(c) if c in coded else F.col(c) for c in _DIMS]
        rows = rows.withColumn("node_code", _encode("node", codes.node, row_node()))
        node, writer = F.col("node_code"), F.when(F.col("node_id").isNotNull(), F.col("node_code"))
        decode_node = _decode(F.col("node"), codes.node)
    per = rows.groupBy("dedupe_id").agg(
        *dims,
        F.coalesce(F.min(F.when(accepted, node)), F.min(node)).alias("node"),
        (F.min(writer) != F.max(writer)).alias("multi_node"),
        F.min("accepted_at").alias("accepted_at"),
        _count_if(F.col("outcome") == "accepted").alias("accepted_rows"),
        _count_if(F.col("outcome") == "delivered").alias("deliveries"),
        *[_count_if(F.col("outcome") == o).alias(o) for o in ("dead_letter", "discarded", "expired")],
    ).select("dedupe_id", *decoded, decode_node.alias("node"),
             F.coalesce(F.col("multi_node"), F.lit(False)).alias("multi_node"), "accepted_at", "accepted_rows",
             "deliveries", "dead_letter", "discarded", "expired")
    if doubt_counts is not None:
        doubt = doubt_counts.select("dedupe_id", "open_doubts")
    else:
        open_ = doubts if doubts is not None else open_doubts(rows, broadcast)
        doubt = open_.groupBy("dedupe_id").agg(F.count(F.lit(1)).alias("open_doubts"))
    cutoff = F.lit(as_of - grace).cast(TimestampType())
    status = (F.when(F.col("deliveries") > 1, "duplicated").when(F.col("deliveries") == 1, "delivered")
              .when(F.col("dead_letter") > 0, "dead_letter").when(F.col("discarded") > 0, "discarded")
              .when(F.col("expired") > 0, "expired").when(F.col("open_doubts") > 0, "in_doubt")
              .when(F.col("accepted_at") <= cutoff, "lost").otherwise("in_flight"))
    return (per.join(F.broadcast(doubt) if broadcast else doubt, on="dedupe_id", how="left_outer")
            .select("dedupe_id", *_DIMS, "accepted_at", "accepted_rows", "deliveries",
                    F.coalesce(F.col("open_doubts"), F.lit(0)).cast(LongType()).alias("open_doubts"),
                    status.alias("status"), "node", "multi_node"))


_LISTED = ("lost", "duplicated")


def reconciliation(obl: DataFrame) -> DataFrame:
    """The per-obligation frame (:func:`obligations`) reduced to what the reconciliation reports, in one
    aggregation: status, dedupe_id, direction, channel_id, bridge_id, destination, accepted_at, obligations, node,
    multi_node. Lost and duplicated obligations keep one row each (their ids and dims, ``obligations`` 1); every
    other status is one row per direction, bridge, node and multi_node with the other columns null
    (:func:`bridge_counts`, :func:`node_counts`). Small unless nearly everything is lost, so the caller can keep it
    (or collect it) instead of the per-obligation frame; :func:`status_counts`, :func:`bridge_counts`,
    :func:`node_counts`, :func:`lost` and :func:`duplicates` read it."""
    listed = F.col("status").isin(*_LISTED)
    kept = ("dedupe_id", "channel_id", "destination", "accepted_at")
    return (obl.select("status", "dedupe_id", *_DIMS, "accepted_at", "node", "multi_node")
            .groupBy("status", "direction", "bridge_id", "node", "multi_node",
                     *[F.when(listed, F.col(c)).alias(c) for c in kept])
            .agg(F.count(F.lit(1)).alias("n"))
            .select("status", "dedupe_id", *_DIMS, "accepted_at", F.col("n").cast(LongType()).alias("obligations"),
                    "node", "multi_node"))


def status_counts(rec: DataFrame) -> DataFrame:
    """status, direction, obligations (``rec``: :func:`reconciliation`)."""
    return (rec.select("status", "direction", "obligations").groupBy("status", "direction")
            .agg(_total("obligations").alias("n"))
            .select("status", "direction", F.col("n").cast(LongType()).alias("obligations")))


def bridge_counts(rec: DataFrame) -> DataFrame:
    """status, direction, bridge_id, obligations (``rec``: :func:`reconciliation`; bridge_id null: the channel's
    own CORBA consumers)."""
    return (rec.select("status", "direction", "bridge_id", "obligations").groupBy("status", "direction", "bridge_id")
            .agg(_total("obligations").alias("n"))
            .select("status", "direction", "bridge_id", F.col("n").cast(LongType()).alias("obligations")))


def node_counts(rec: DataFrame) -> DataFrame:
    """node, status, obligations, multi_node (how many of them have rows of more than one node), from
    :func:`reconciliation` (node null: no row of the obligation names a node, e.g. written before migration 0009
    outside a routing transaction)."""
    return (rec.select("node", "status", "obligations", "multi_node").groupBy("node", "status")
            .agg(_total("obligations").alias("n"),
                 _total_if(F.col("multi_node"), "obligations").alias("m"))
            .select("node", "status", F.col("n").cast(LongType()).alias("obligations"),
                    F.col("m").cast(LongType()).alias("multi_node")))


def _total_if(cond: Column, col: str) -> Column:
    return F.coalesce(F.sum(F.when(cond, F.col(col)).otherwise(0)), F.lit(0)).cast(LongType())


def reconciled_rows(rec_rows: Iterable[Mapping[str, Any]],
                    resent: Collection[str] = ()) -> dict[str, list[dict[str, Any]]]:
    """:func:`status_counts`, :func:`bridge_counts`, :func:`node_counts` and :func:`lost` of collected
    :func:`reconciliation` rows, in Python (the same rows, unordered): the job collects the reconciliation once
    instead of running a Spark query per table. Integer sums only: exact. ``resent``: the ids of the duplicated
    obligations whose deliveries are a takeover's re-send (:func:`duplicates`' ``resend``): counted with the
    status ``resent`` (as :func:`with_resent`)."""
    status: dict[tuple[Any, ...], int] = {}
    bridge: dict[tuple[Any, ...], int] = {}
    node: dict[tuple[Any, ...], list[int]] = {}
    lost_rows: list[dict[str, Any]] = []
    for r in rec_rows:
        if r["status"] == "duplicated" and r["dedupe_id"] in resent:
            r = {**r, "status": "resent"}
        n = int(r["obligations"])
        status[(r["status"], r["direction"])] = status.get((r["status"], r["direction"]), 0) + n
        key = (r["status"], r["direction"], r["bridge_id"])
        bridge[key] = bridge.get(key, 0) + n
        got = node.setdefault((r["node"], r["status"]), [0, 0])
        got[0] += n
        got[1] += n if r["multi_node"] else 0
        if r["status"] == "lost":
            lost_rows.append({c: r[c] for c in ("dedupe_id", *_DIMS, "accepted_at", "node")})
    return {
        "status_counts": [{"status": s_, "direction": d, "obligations": n} for (s_, d), n in _ordered(status)],
        "bridge_counts": [{"status": s_, "direction": d, "bridge_id": b, "obligations": n}
                          for (s_, d, b), n in _ordered(bridge)],
        "node_counts": [{"node": k, "status": s_, "obligations": v[0], "multi_node": v[1]}
                        for (k, s_), v in _ordered(node)],
        "lost": sorted(lost_rows, key=lambda r: _key((r["dedupe_id"],))),
    }


def _key(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """A sort key of a tuple that may hold nulls: nulls first (Spark's ascending order)."""
    return tuple((v is not None, v if v is not None else 0) for v in values)


def _ordered(sums: Mapping[tuple[Any, ...], Any]) -> list[tuple[tuple[Any, ...], Any]]:
    return sorted(sums.items(), key=lambda kv: _key(kv[0]))


def open_per_minute(ledger_df: DataFrame) -> DataFrame:
    """minute (UTC), direction, accepted, ended: the ``accepted`` rows by the minute of ``accepted_at`` and the
    terminal rows (delivered, dead_letter, discarded, expired) by the minute of their last hop; the obligations open
    at the end of a minute are the accepted minus the ended up to it (:func:`open_over_time`)."""
    done = F.coalesce(*[F.col(c) for c in reversed(_TS)])
    accepted = F.col("outcome") == "accepted"
    return (ledger_df.select("direction", *_TS, "outcome").where(F.col("outcome").isin("accepted", *_TERMINAL))
            .groupBy(F.date_trunc("minute", F.when(accepted, F.col("accepted_at")).otherwise(done)).alias("minute"),
                     "direction")
            .agg(_count_if(accepted).alias("a"), _count_if(~accepted).alias("e"))
            .select("minute", "direction", F.col("a").alias("accepted"), F.col("e").alias("ended")))


def open_over_time(rows: Iterable[Mapping[str, Any]],
                   extra_ends: Iterable[tuple[Any, Any, int]] = ()) -> dict[str, list[tuple[Any, int]]]:
    """Collected :func:`open_per_minute` rows → per direction, (minute, obligations open at its end), by minute:
    the running sum of accepted minus ended. ``extra_ends``: (minute, direction, n) ends that are not an
    obligation's first (a duplicated delivery ends its obligation again: the :func:`duplicates` rows' extra
    deliveries at the minute of their last one), taken back so the curve is not low by the duplicates."""
    ended: dict[tuple[Any, str], int] = {}
    accepted: dict[tuple[Any, str], int] = {}
    for r in rows:
        if r["minute"] is not None:
            key = (r["minute"], r["direction"] or "-")
            accepted[key] = accepted.get(key, 0) + int(r["accepted"])
            ended[key] = ended.get(key, 0) + int(r["ended"])
    for minute, direction, n in extra_ends:
        key = (minute, direction or "-")
        if key in ended:
            ended[key] -= n
    series: dict[str, list[tuple[Any, int]]] = {}
    running: dict[str, int] = {}
    for minute, d in sorted(accepted, key=lambda k: k[0]):
        running[d] = running.get(d, 0) + accepted[(minute, d)] - ended[(minute, d)]
        series.setdefault(d, []).append((minute, running[d]))
    return series


def lost(obl: DataFrame) -> DataFrame:
    """The lost obligations: dedupe_id, direction, channel_id, bridge_id, destination, accepted_at, node (the node
    it is attributed to: the one that wrote its ``accepted`` row, see :func:`obligations`) (``obl``:
    :func:`obligations` or its :func:`reconciliation`)."""
    return (obl.select("dedupe_id", *_DIMS, "accepted_at", "node", "status").where(F.col("status") == "lost")
            .select("dedupe_id", *_DIMS, "accepted_at", "node"))


def duplicates(ledger_df: DataFrame, obl: DataFrame, broadcast: bool = True) -> DataFrame:
    """dedupe_ids delivered more than once (``obl``: :func:`obligations` or its :func:`reconciliation`):
    deliveries, distinct_gtrids, first/last delivery time (of the last hop), ``nodes`` (the distinct ``node_id``
    of its delivered rows, sorted, comma-separated; null when none names one) and ``resend`` (:func:`resend_rule`:
    the one re-send a survivor's takeover of a dead node may make, docs/cluster.md; not a violation).
    ``broadcast``: the duplicated ids are few (sent to every task, so the ledger's delivered rows are not
    shuffled)."""
    done = F.coalesce(*[F.col(c) for c in reversed(_TS)])
    dup_ids = obl.select("dedupe_id", "status").where(F.col("status") == "duplicated").select("dedupe_id")
    rows = (ledger_df.select("dedupe_id", *_DIMS, "gtrid", "jms_message_id", "node_id", *_TS, "outcome")
            .where(F.col("outcome") == "delivered")
            .join(F.broadcast(dup_ids) if broadcast else dup_ids, on="dedupe_id", how="left_semi"))
    owner = F.when(F.col("gtrid").contains(":"), F.substring_index(F.col("gtrid"), ":", 1))
    per = rows.groupBy("dedupe_id").agg(
        *[F.min(c).alias(c) for c in _DIMS], F.count(F.lit(1)).alias("deliveries"),
        F.size(F.collect_set("gtrid")).alias("distinct_gtrids"),  # as countDistinct (nulls not counted), one shuffle
        F.min(done).alias("first_delivered_at"), F.max(done).alias("last_delivered_at"),
        F.min("gtrid").alias("g_min"), F.max("gtrid").alias("g_max"),
        F.min("jms_message_id").alias("m_min"), F.max("jms_message_id").alias("m_max"),
        _count_if(F.col("node_id") == owner).alias("by_owner"),
        _count_if(F.col("node_id").isNotNull() & (F.col("node_id") != owner)).alias("by_other"),
        F.array_sort(F.collect_set("node_id")).alias("node_set"))
    return per.select("dedupe_id", *_DIMS, F.col("deliveries").cast(LongType()).alias("deliveries"),
                      F.col("distinct_gtrids").cast(LongType()).alias("distinct_gtrids"),
                      "first_delivered_at", "last_delivered_at",
                      F.when(F.size("node_set") > 0, F.array_join("node_set", ",")).alias("nodes"),
                      F.coalesce(resend_rule(), F.lit(False)).alias("resend"))


def resend_rule() -> Column:
    """Whether a duplicated obligation's deliveries are exactly what a takeover's re-send records (docs/cluster.md,
    docs/audit.md "Nodes"): a channel → JMS obligation with two ``delivered`` rows of ONE routing transaction
    (the same gtrid, ``node:token``) and ONE JMS message (the same ``jms_message_id``, its ``nsjms_dedupe_id``),
    one written by the transaction's own node (its branch) and one by another node (the survivor that fenced it,
    committed its decision and re-sent its outbox rows: ``router.routing.ledger_takeover.record_resends``). Over the
    columns of :func:`duplicates`' aggregation (``deliveries``, ``g_min``/``g_max``, ``m_min``/``m_max``, ``by_owner``,
    ``by_other``, ``direction``); null when a column is. Anything else delivered twice stays a duplicate."""
    return ((F.col("direction") == "channel_to_jms") & (F.col("deliveries") == 2)
            & F.col("g_min").contains(":") & (F.col("g_min") == F.col("g_max"))
            & (F.col("m_min") == F.col("m_max")) & (F.col("by_owner") == 1) & (F.col("by_other") == 1))


def with_resent(rec: DataFrame, resent_ids: DataFrame, broadcast: bool = True) -> DataFrame:
    """The :func:`reconciliation` ``rec`` with the duplicated obligations whose id is in ``resent_ids``
    (dedupe_id: the :func:`duplicates` rows with ``resend``) given the status ``resent`` (what
    :func:`reconciled_rows` does with its ``resent`` ids, as a Spark query for a reconciliation too large to
    collect)."""
    ids = resent_ids.select("dedupe_id").withColumn("resent", F.lit(True))
    return (rec.join(F.broadcast(ids) if broadcast else ids, on="dedupe_id", how="left_outer")
            .select(F.when(F.col("resent") & (F.col("status") == "duplicated"), F.lit("resent"))
                    .otherwise(F.col("status")).alias("status"),
                    "dedupe_id", *_DIMS, "accepted_at", "obligations", "node", "multi_node"))


def stuck_in_doubt(ledger_df: DataFrame, as_of: datetime, grace: timedelta, *,
                   doubts: DataFrame | None = None) -> DataFrame:
    """gtrids prepared before ``as_of - grace`` with no decision recorded: gtrid, items, prepared_at, age_s.
    ``doubts``: :func:`open_doubts` of the same ledger, when the caller has it already."""
    open_ = doubts if doubts is not None else open_doubts(ledger_df)
    cutoff = F.lit(as_of - grace).cast(TimestampType())
    return (open_.where(F.col("prepared_at") <= cutoff)
            .groupBy("gtrid").agg(F.countDistinct("dedupe_id").alias("items"), F.min("prepared_at").alias("p"))
            .select("gtrid", F.col("items").cast(LongType()).alias("items"), F.col("p").alias("prepared_at"),
                    ((F.unix_micros(F.lit(as_of).cast(TimestampType())) - F.unix_micros(F.col("p")))
                     .cast(DoubleType()) / 1e6).alias("age_s")))


def dead_letters_by_reason(facets_df: DataFrame) -> DataFrame:
    """failure_reason, direction, bridge_id, destination, dead_letters (rows), from the ledger's :func:`facets`."""
    return (facets_df.select("failure_reason", "direction", "bridge_id", "destination", "outcome", "rows")
            .where(F.col("outcome") == "dead_letter")
            .groupBy("failure_reason", "direction", "bridge_id", "destination").agg(_total("rows").alias("n"))
            .select("failure_reason", "direction", "bridge_id", "destination",
                    F.col("n").cast(LongType()).alias("dead_letters")))


def dead_letters_from_facets(facet_rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """:func:`dead_letters_by_reason` of collected :func:`facets` rows, in Python (the same rows, unordered)."""
    keys = ("failure_reason", "direction", "bridge_id", "destination")
    sums: dict[tuple[Any, ...], int] = {}
    for r in facet_rows:
        if r["outcome"] == "dead_letter":
            key = tuple(r[k] for k in keys)
            sums[key] = sums.get(key, 0) + int(r["rows"])
    return [{**dict(zip(keys, key, strict=True)), "dead_letters": n} for key, n in sums.items()]


def hop_micros(ledger_df: DataFrame) -> DataFrame:
    """From ``delivered`` rows, one column per hop in whole microseconds (a long; null when the row lacks the
    hop's timestamp): dedupe_id, direction, dispatch_us, prepare_us, decide_us, broker_commit_us, acknowledge_us,
    end_to_end_us. Each hop ends at its column and starts at the latest earlier timestamp the row has
    (:data:`HOPS`), so the hops a row has add up to its ``end_to_end`` (accepted to the last hop the row has)."""
    rows = ledger_df.select("dedupe_id", "direction", *_TS, "outcome").where(F.col("outcome") == "delivered")
    last = F.coalesce(*[F.col(c) for c in reversed(_TS[1:])])
    hops = []
    for name, _, to in HOPS:
        earlier = _TS[:_TS.index(to)]
        hops.append(_us(F.coalesce(*[F.col(c) for c in reversed(earlier)]), F.col(to)).alias(f"{name}_us"))
    return rows.select("dedupe_id", "direction", *hops, _us(F.col("accepted_at"), last).alias("end_to_end_us"))


def _us(a: Column, b: Column) -> Column:
    return F.unix_micros(b) - F.unix_micros(a)


def _us_to_ms(us: Column) -> Column:
    """Microseconds (a long) → milliseconds (a double), as every ``*_ms`` column of the audit is computed."""
    return us.cast(DoubleType()) / 1000.0


def hop_latencies(ledger_df: DataFrame) -> DataFrame:
    """:func:`hop_micros` in milliseconds (doubles): dedupe_id, direction, dispatch_ms, prepare_ms, decide_ms,
    broker_commit_ms, acknowledge_ms, end_to_end_ms."""
    return (hop_micros(ledger_df)
            .select("dedupe_id", "direction", *[_us_to_ms(F.col(f"{h}_us")).alias(f"{h}_ms") for h in HOP_NAMES]))


def latency_counts(lat: DataFrame, codes: Codes | None = None) -> DataFrame:
    """hop, direction, v_ms, n: how many delivered rows of :func:`hop_micros` had each exact latency, per hop
    and direction (rows without the hop omitted). Latencies are whole microseconds, so this is far smaller than
    the ledger, and every percentile and histogram bin is exact from it. Grouped by the hop's position and the
    latency in microseconds (longs: every key a primitive, no floating-point normalisation), ``v_ms`` computed
    after the aggregation (the same double as :func:`hop_latencies` gives). ``codes``: the ledger's
    :func:`dictionary`; with it the direction is aggregated as its integer code, encoded once per delivered row
    before the hops are exploded (same rows)."""
    direction = F.col("direction") if codes is None else _encode("direction", codes.direction)
    decoded = F.col("direction") if codes is None else _decode(F.col("direction"), codes.direction)
    stack = F.explode(F.array(*[F.struct(F.lit(i + 1).alias("h"), F.col(f"{h}_us").alias("v"))
                                for i, h in enumerate(HOP_NAMES)]))  # the hop's position: cheaper to hash
    return (lat.select(direction.alias("direction"), *[f"{h}_us" for h in HOP_NAMES])
            .select("direction", stack.alias("x"))
            .select(F.col("x.h").alias("h"), "direction", F.col("x.v").alias("v_us"))
            .where(F.col("v_us").isNotNull())
            .groupBy("h", "direction", "v_us").agg(F.count(F.lit(1)).alias("n"))
            .select(F.element_at(F.array(*[F.lit(h) for h in HOP_NAMES]), F.col("h")).alias("hop"),
                    decoded.alias("direction"), _us_to_ms(F.col("v_us")).alias("v_ms"),
                    F.col("n").cast(LongType()).alias("n")))


def latency_percentiles(counts: DataFrame) -> DataFrame:
    """hop, direction (each, and ``all``), samples, p50_ms, p90_ms, p99_ms, p999_ms, max_ms, from
    :func:`latency_counts`. Exact nearest-rank percentiles: the p-th is the smallest latency whose cumulative
    count reaches ``ceil(p * samples)`` (what ``percentile_approx`` approximates)."""
    rows = counts.select("hop", "direction", "v_ms", "n")
    every = (rows.groupBy("hop", "v_ms").agg(F.sum("n").alias("n"))
             .select("hop", F.lit("all").alias("direction"), "v_ms", "n"))
    both = rows.unionByName(every)
    group = Window.partitionBy("hop", "direction")
    ranked = both.select("hop", "direction", "v_ms", "n",
                         F.sum("n").over(group.orderBy("v_ms")).alias("cum"), F.sum("n").over(group).alias("total"))
    reach = [F.min(F.when(F.col("cum") >= F.ceil(F.lit(p) * F.col("total")), F.col("v_ms"))).alias(_pname(p))
             for p in PERCENTILES]
    return (ranked.groupBy("hop", "direction").agg(_total("n").alias("samples"), *reach, F.max("v_ms").alias("mx"))
            .select("hop", "direction", F.col("samples").cast(LongType()).alias("samples"),
                    *[_pname(p) for p in PERCENTILES], F.col("mx").alias("max_ms")))


class CountColumns(NamedTuple):
    """Collected :func:`latency_counts` as four columns (no dict per row)."""

    hop: list[Any]
    direction: list[Any]
    v_ms: list[Any]
    n: list[Any]


def latency_percentiles_rows(count_rows: Iterable[Mapping[str, Any]] | CountColumns) -> list[dict[str, Any]]:
    """:func:`latency_percentiles` of collected :func:`latency_counts` rows (or their :class:`CountColumns`), in
    Python (the same rows, unordered): per hop and direction (and ``all``), sum the counts of each distinct latency
    in ascending order; the p-th percentile is the first latency whose running sum reaches ``ceil(p * samples)``
    (the same double product and ceiling as Spark's), ``max_ms`` the largest latency. Only comparisons and integer
    sums: exact."""
    if isinstance(count_rows, CountColumns):
        rows: Iterable[tuple[Any, Any, Any, Any]] = zip(*count_rows, strict=True)
    else:
        rows = ((r["hop"], r["direction"], r["v_ms"], r["n"]) for r in count_rows)
    groups: dict[tuple[Any, Any], dict[float, int]] = {}
    for hop, direction, v, n_ in rows:
        n = int(n_)
        for key in ((hop, direction), (hop, "all")):
            counts = groups.setdefault(key, {})
            counts[v] = counts.get(v, 0) + n
    out = []
    for (hop, direction), counts in groups.items():
        values = sorted(counts)
        total = sum(counts.values())
        needs = [(_pname(p), math.ceil(p * float(total))) for p in PERCENTILES]
        row: dict[str, Any] = {"hop": hop, "direction": direction, "samples": total}
        cum, i = 0, 0
        for v in values:
            cum += counts[v]
            while i < len(needs) and cum >= needs[i][1]:
                row[needs[i][0]] = v
                i += 1
        row.update({name: row.get(name) for name, _ in needs})
        row["max_ms"] = values[-1]
        out.append(row)
    return out


def _pname(p: float) -> str:
    return f"p{str(p).split('.')[1]:0<2}_ms"


def latency_histogram(counts: DataFrame, hop: str = "end_to_end", bins_per_decade: int = 10) -> DataFrame:
    """hop, lo_ms, hi_ms, samples for one hop, from :func:`latency_counts`: log-spaced bins
    (``bins_per_decade`` per factor of 10; latencies below 1 µs share the lowest bin), empty bins omitted."""
    k = F.floor(F.log10(F.greatest(F.col("v_ms"), F.lit(1e-3))) * bins_per_decade)
    return (counts.select("hop", "v_ms", "n").where(F.col("hop") == hop)
            .groupBy(k.alias("k")).agg(_total("n").alias("n"))
            .select(F.lit(hop).alias("hop"), F.pow(F.lit(10.0), F.col("k") / bins_per_decade).alias("lo_ms"),
                    F.pow(F.lit(10.0), (F.col("k") + 1) / bins_per_decade).alias("hi_ms"),
                    F.col("n").cast(LongType()).alias("samples")))


def latency_histogram_rows(counts: CountColumns, strict_log10: Callable[[float], float],
                           strict_pow: Callable[[float, float], float], hop: str = "end_to_end",
                           bins_per_decade: int = 10) -> list[dict[str, Any]]:
    """:func:`latency_histogram` of collected :func:`latency_counts` columns, in Python (the same rows, unordered).
    Spark's ``log10`` and ``pow`` are ``java.lang.StrictMath``'s; Python's ``math.log10`` may differ from it in the
    last bit, which moves a latency to another bin only when ``log10 * bins_per_decade`` is within rounding of an
    integer: those few latencies (and every bin edge) are computed by ``strict_log10`` / ``strict_pow`` (the job
    passes StrictMath itself, through the driver's JVM), so the bins and edges are Spark's exactly."""
    sums: dict[int, int] = {}
    for h, v, n in zip(counts.hop, counts.v_ms, counts.n, strict=True):
        if h != hop:
            continue
        x = max(float(v), 1e-3)
        scaled = math.log10(x) * bins_per_decade
        if abs(scaled - round(scaled)) < 1e-6:
            scaled = strict_log10(x) * bins_per_decade
        k = math.floor(scaled)
        sums[k] = sums.get(k, 0) + int(n)
    return [{"hop": hop, "lo_ms": strict_pow(10.0, k / bins_per_decade),
             "hi_ms": strict_pow(10.0, (k + 1) / bins_per_decade), "samples": n} for k, n in sorted(sums.items())]


def throughput_per_minute(ledger_df: DataFrame, codes: Codes | None = None) -> DataFrame:
    """minute (UTC, of the last hop), direction, channel_id, bridge_id, destination, delivered. ``codes``: the
    ledger's :func:`dictionary`; with it direction and destination are grouped as their integer codes (every
    key a primitive), same rows."""
    done = F.coalesce(*[F.col(c) for c in reversed(_TS)])
    coded = {} if codes is None else {"direction": codes.direction, "destination": codes.destination}
    keys = [_encode(c, coded[c]).alias(c) if c in coded else F.col(c) for c in _DIMS]
    decoded = [_decode(F.col(c), coded[c]).alias(c) if c in coded else F.col(c) for c in _DIMS]
    return (ledger_df.select(*_DIMS, *_TS, "outcome").where(F.col("outcome") == "delivered")
            .groupBy(F.date_trunc("minute", done).alias("minute"), *keys).agg(F.count(F.lit(1)).alias("n"))
            .select("minute", *decoded, F.col("n").cast(LongType()).alias("delivered")))


#: :func:`minutes` ``kind``: an ``accepted`` row, a ``delivered`` row, any other terminal row.
_KINDS = ("accepted", "delivered", "ended")


def minutes(ledger_df: DataFrame, codes: Codes | None = None) -> DataFrame:
    """:func:`throughput_per_minute` and :func:`open_per_minute` in ONE aggregation (one pass, one shuffle):
    minute, direction, kind (``accepted``, ``delivered``, ``ended``: another terminal outcome), channel_id,
    bridge_id, destination (those three of ``delivered`` rows only, null on the others), rows. The minute is of
    ``accepted_at`` for an ``accepted`` row, of the last hop for the others, as in both. :func:`minutes_rows` gives
    both tables' rows from it (integer sums)."""
    done = F.coalesce(*[F.col(c) for c in reversed(_TS)])
    outcome = F.col("outcome")
    kind = F.when(outcome == "accepted", 1).when(outcome == "delivered", 2).otherwise(3)
    coded = {} if codes is None else {"direction": codes.direction, "destination": codes.destination}
    delivered = outcome == "delivered"
    keys = [(_encode(c, coded[c]) if c in coded else F.col(c)) for c in _DIMS]
    keys = [keys[0], *[F.when(delivered, k) for k in keys[1:]]]
    decoded = [_decode(F.col(c), coded[c]).alias(c) if c in coded else F.col(c) for c in _DIMS]
    return (ledger_df.select(*_DIMS, *_TS, "outcome").where(outcome.isin("accepted", *_TERMINAL))
            .groupBy(F.date_trunc("minute", F.when(outcome == "accepted", F.col("accepted_at")).otherwise(done))
                     .alias("minute"), kind.alias("k"), *[k.alias(c) for k, c in zip(keys, _DIMS, strict=True)])
            .agg(F.count(F.lit(1)).alias("n"))
            .select("minute", decoded[0], F.element_at(F.array(*[F.lit(k) for k in _KINDS]), F.col("k")).alias("kind"),
                    *decoded[1:], F.col("n").cast(LongType()).alias("rows")))


def minutes_rows(minute_rows: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(:func:`throughput_per_minute` rows, :func:`open_per_minute` rows) of collected :func:`minutes` rows, in
    Python (the same rows, unordered; integer sums only)."""
    throughput: list[dict[str, Any]] = []
    opened: dict[tuple[Any, Any], list[int]] = {}
    for r in minute_rows:
        n = int(r["rows"])
        if r["kind"] == "delivered":
            throughput.append({"minute": r["minute"], **{c: r[c] for c in _DIMS}, "delivered": n})
        got = opened.setdefault((r["minute"], r["direction"]), [0, 0])
        got[0 if r["kind"] == "accepted" else 1] += n
    return throughput, [{"minute": m, "direction": d, "accepted": v[0], "ended": v[1]}
                        for (m, d), v in _ordered(opened)]


def throughput_totals(per_minute: DataFrame) -> DataFrame:
    """minute, direction, delivered: the per-minute table summed over channels, bridges and destinations."""
    return (per_minute.select("minute", "direction", "delivered").groupBy("minute", "direction")
            .agg(F.sum("delivered").alias("n"))
            .select("minute", "direction", F.col("n").cast(LongType()).alias("delivered")))


def throughput_totals_rows(per_minute_rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """:func:`throughput_totals` of collected :func:`throughput_per_minute` rows, in Python, by minute (nulls
    first, as Spark orders them)."""
    sums: dict[tuple[Any, Any], int] = {}
    for r in per_minute_rows:
        key = (r["minute"], r["direction"])
        sums[key] = sums.get(key, 0) + int(r["delivered"])
    rows = [{"minute": m, "direction": d, "delivered": n} for (m, d), n in sums.items()]
    return sorted(rows, key=lambda r: (r["minute"] is not None, r["minute"] or 0))
