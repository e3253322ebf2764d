"""The open doubts of a ledger with few in-doubt rows, found by the driver in two small queries (issue 28).

:func:`audit.transforms.open_doubts` finds them in Spark (two broadcasts of distinct gtrids, a scan each) and the
job then joined them into the per-obligation frame and grouped them again for the stuck transactions: nine Spark
jobs for a handful of rows. When the ledger's ``facets`` say there are at most :data:`COLLECT_LIMIT` in-doubt rows,
the job instead collects the in-doubt rows (:func:`in_doubt_rows`, one narrow scan, no shuffle) and the resolving
rows' gtrids among theirs (:func:`resolved_among`, one narrow scan filtered by a literal set), and the driver
derives the same three things from them: the open doubts (:func:`open_rows`), their count per obligation
(:func:`counts`, joined into the per-obligation aggregation as a local frame) and the stuck transactions
(:func:`stuck_rows`). Same definitions as :mod:`audit.transforms` (its module doc): an ``in_doubt`` row is open
when no row with its gtrid is a resolving one (a null gtrid never is); exact.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

__all__ = ["COLLECT_LIMIT", "counts", "in_doubt_rows", "open_rows", "resolved_among", "stuck_rows"]

#: Up to this many ``in_doubt`` ledger rows the driver finds the open doubts (their gtrids are a literal set in the
#: second query's filter: a hash set, Spark's ``InSet``); beyond, :func:`audit.transforms.open_doubts` does.
COLLECT_LIMIT = 10_000
_RESOLVING = ("delivered", "rolled_back", "dead_letter", "discarded", "expired")


def in_doubt_rows(ledger_df: DataFrame) -> DataFrame:
    """dedupe_id, gtrid, prepared_at of the ``in_doubt`` rows (a filter: no shuffle)."""
    return (ledger_df.select("dedupe_id", "gtrid", "prepared_at", "outcome").where(F.col("outcome") == "in_doubt")
            .select("dedupe_id", "gtrid", "prepared_at"))


def resolved_among(ledger_df: DataFrame, gtrids: Collection[str]) -> DataFrame:
    """gtrid: the distinct ``gtrids`` that have a resolving row (at most ``len(gtrids)`` rows)."""
    rows = ledger_df.select("gtrid", "outcome")
    return (rows.where(F.col("outcome").isin(*_RESOLVING) & F.col("gtrid").isin(*sorted(gtrids)))
            .select("gtrid").distinct())


def open_rows(doubt_rows: Iterable[Mapping[str, Any]], resolved: Collection[str]) -> list[dict[str, Any]]:
    """The collected :func:`in_doubt_rows` whose gtrid is null or not ``resolved``: the rows of
    :func:`audit.transforms.open_doubts`."""
    return [dict(r) for r in doubt_rows if r["gtrid"] is None or r["gtrid"] not in resolved]


def counts(rows: Iterable[Mapping[str, Any]]) -> list[tuple[Any, int]]:
    """(dedupe_id, open doubts) of :func:`open_rows`: what :func:`audit.transforms.obligations` counts per
    obligation."""
    n: dict[Any, int] = {}
    for r in rows:
        n[r["dedupe_id"]] = n.get(r["dedupe_id"], 0) + 1
    return sorted(n.items(), key=lambda kv: (kv[0] is not None, kv[0] or ""))


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t


def _micros(t: datetime) -> int:
    d = _utc(t) - datetime(1970, 1, 1, tzinfo=UTC)
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


def stuck_rows(rows: Iterable[Mapping[str, Any]], as_of: datetime, grace: timedelta) -> list[dict[str, Any]]:
    """:func:`audit.transforms.stuck_in_doubt` of :func:`open_rows`: gtrid, items (distinct non-null dedupe_ids),
    prepared_at (the earliest), age_s (``as_of`` minus it, whole microseconds as a double / 1e6, as Spark's), for the
    rows prepared at or before ``as_of - grace``. A naive time is taken as UTC (the session's time zone)."""
    cutoff = _utc(as_of) - grace
    groups: dict[Any, tuple[set[Any], datetime]] = {}
    for r in rows:
        p = r["prepared_at"]
        if p is None or _utc(p) > cutoff:
            continue
        ids, first = groups.get(r["gtrid"], (set(), p))
        if r["dedupe_id"] is not None:
            ids.add(r["dedupe_id"])
        groups[r["gtrid"]] = (ids, min(first, p, key=_utc))
    now = _micros(as_of)
    return [{"gtrid": g, "items": len(ids), "prepared_at": p, "age_s": float(now - _micros(p)) / 1e6}
            for g, (ids, p) in groups.items()]
