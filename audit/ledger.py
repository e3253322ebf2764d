"""The delivery ledger in PostgreSQL for the audit: schema, day partitions and retention.

The schema, the row model and the partition functions live in :mod:`router.routing.ledger` (the router writes the rows
in its routing transactions; migration ``router/db/migrations/0003_ledger.sql``): this module re-exports them for
the audit's tools and translates psycopg's errors into :class:`audit.LedgerError`. The table is range-partitioned by
day (UTC) on ``accepted_at``; a DEFAULT partition catches rows of a day that has no partition yet, so a missing
partition never fails a routing transaction. :func:`ensure_partitions` creates the partitions of the coming days
(and moves any rows the default partition holds for them); :func:`drop_expired_partitions` drops whole days older
than the retention.

Every function takes a connection and runs in the caller's transaction (the caller commits): partition
maintenance is DDL, so run it in its own short transaction, not inside a routing transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from functools import partial
from typing import Any, TypeVar

import psycopg

from audit import LedgerError, UsageError
from router.routing import ledger as _router
from router.routing.ledger import (
    COLUMNS,
    DEFAULT_PARTITION,
    HOP_COLUMNS,
    TABLE,
    Direction,
    Outcome,
    day_bounds,
    partition_name,
    schema_sql,
)

T = TypeVar("T")

__all__ = [
    "COLUMNS",
    "DEFAULT_PARTITION",
    "HOP_COLUMNS",
    "TABLE",
    "Direction",
    "Outcome",
    "RetentionSettings",
    "day_bounds",
    "drop_expired_partitions",
    "ensure_partitions",
    "install_schema",
    "list_partitions",
    "maintain",
    "partition_name",
    "schema_sql",
]


@dataclass(frozen=True)
class RetentionSettings:
    """``retention_days``: whole UTC days kept before today; ``ahead_days``: partitions created after today."""

    retention_days: int = 30
    ahead_days: int = 3

    def __post_init__(self) -> None:
        if self.retention_days < 1:
            raise UsageError(f"retention_days must be >= 1, got {self.retention_days}")
        if not 0 <= self.ahead_days <= 366:
            raise UsageError(f"ahead_days must be in 0..366, got {self.ahead_days}")


def install_schema(conn: psycopg.Connection[Any]) -> list[int]:
    """Bring the database's nsjms schema up to date with the node's migration runner (:mod:`router.db.migrate`),
    which creates the ledger (migration 2) with the rest; returns the versions applied (none when up to date)."""
    from router.db.errors import SchemaError
    from router.db.migrate import run

    try:
        return _run(conn, "install ledger schema", partial(run, conn))
    except SchemaError as exc:
        raise LedgerError("install ledger schema", str(exc)) from exc


def list_partitions(conn: psycopg.Connection[Any]) -> list[date]:
    """The days that have a partition, ascending (the default partition is not a day)."""
    return _run(conn, "list ledger partitions", partial(_router.list_partitions, conn))


def ensure_partitions(conn: psycopg.Connection[Any], first: date, days: int) -> list[date]:
    """Create the partitions of ``first`` and the ``days - 1`` following days that are missing; return them."""
    return _run(conn, "create ledger partitions", partial(_router.ensure_partitions, conn, first, days))


def drop_expired_partitions(conn: psycopg.Connection[Any], retention_days: int, today: date) -> list[date]:
    """Drop the day partitions whose day ended more than ``retention_days`` whole days before ``today``.

    A day ``d`` is dropped when ``d < today - retention_days``; with ``retention_days=1`` yesterday is kept.
    Rows in the default partition are never dropped here.
    """
    RetentionSettings(retention_days=retention_days)
    return _run(conn, "drop ledger partitions",
                partial(_router.drop_expired_partitions, conn, retention_days, today))


def maintain(conn: psycopg.Connection[Any], settings: RetentionSettings,
             today: date | None = None) -> tuple[list[date], list[date]]:
    """Create today's and ``ahead_days`` next partitions, drop expired ones; return (created, dropped)."""
    today = today or datetime.now(UTC).date()
    return _run(conn, "maintain ledger partitions",
                partial(_router.maintain, conn, settings.retention_days, settings.ahead_days, today))


def _run(conn: psycopg.Connection[Any], operation: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except psycopg.Error as exc:
        raise LedgerError(operation, f"{type(exc).__name__}: {exc}") from exc


