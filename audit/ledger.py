"""The delivery ledger in PostgreSQL: schema, day partitions and retention.

The table (``audit/sql/ledger.sql``) is range-partitioned by day (UTC) on ``accepted_at``; a DEFAULT
partition catches rows of a day that has no partition yet, so a missing partition never fails a routing
transaction. :func:`ensure_partitions` creates the partitions of the coming days (and moves any rows the
default partition holds for them); :func:`drop_expired_partitions` drops whole days older than the retention.

Every function takes a connection and runs in the caller's transaction (the caller commits): partition
maintenance is DDL, so run it in its own short transaction, not inside a routing transaction.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from functools import partial
from importlib import resources
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from audit import LedgerError, UsageError

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

TABLE = "nsjms_ledger"
DEFAULT_PARTITION = "nsjms_ledger_default"
_PARTITION_RE = re.compile(r"^nsjms_ledger_p(\d{8})$")

#: The hop timestamps, in the order a delivery passes them.
HOP_COLUMNS: tuple[str, ...] = (
    "accepted_at", "dispatched_at", "prepared_at", "decided_at", "broker_committed_at", "acknowledged_at",
)
#: Every column, in table order (``entry_id`` and ``recorded_at`` are filled by PostgreSQL on insert).
COLUMNS: tuple[str, ...] = (
    "entry_id", "event_id", "jms_message_id", "dedupe_id", "channel_id", "proxy_id", "bridge_id", "destination",
    "direction", "gtrid", *HOP_COLUMNS, "outcome", "failure_reason", "recorded_at",
)


class Outcome(StrEnum):
    """What a ledger row records (``outcome`` column)."""

    ACCEPTED = "accepted"        # nsjms took responsibility for the item
    IN_DOUBT = "in_doubt"        # T2 prepared, decision not yet known
    ROLLED_BACK = "rolled_back"  # T2 rolled back; the item stays queued and is retried
    DELIVERED = "delivered"      # terminal: handed over and acknowledged
    DEAD_LETTER = "dead_letter"  # terminal: dead-lettered, failure_reason says why
    DISCARDED = "discarded"      # terminal: discarded by a QoS policy, failure_reason says which
    EXPIRED = "expired"          # terminal: its deadline passed, failure_reason says which

    @property
    def terminal(self) -> bool:
        return self in (Outcome.DELIVERED, Outcome.DEAD_LETTER, Outcome.DISCARDED, Outcome.EXPIRED)


class Direction(StrEnum):
    CHANNEL_TO_JMS = "channel_to_jms"
    JMS_TO_CHANNEL = "jms_to_channel"


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


def schema_sql() -> str:
    """The text of ``audit/sql/ledger.sql`` (schema version 1)."""
    return resources.files("audit").joinpath("sql/ledger.sql").read_text(encoding="utf-8")


def install_schema(conn: psycopg.Connection[Any]) -> None:
    """Create the ledger table and its default partition (fails if it exists: a migration runs once)."""
    _run(conn, "install ledger schema", lambda: conn.execute(schema_sql()))


def partition_name(day: date) -> str:
    return f"{TABLE}_p{day:%Y%m%d}"


def day_bounds(day: date) -> tuple[datetime, datetime]:
    """``[day 00:00 UTC, next day 00:00 UTC)``."""
    start = datetime.combine(day, time(0), tzinfo=UTC)
    return start, start + timedelta(days=1)


def list_partitions(conn: psycopg.Connection[Any]) -> list[date]:
    """The days that have a partition, ascending (the default partition is not a day)."""
    rows = _run(conn, "list ledger partitions", lambda: conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = %s::regclass", (TABLE,)).fetchall())
    days = []
    for (name,) in rows:
        m = _PARTITION_RE.match(str(name))
        if m:
            days.append(datetime.strptime(m.group(1), "%Y%m%d").date())
    return sorted(days)


def ensure_partitions(conn: psycopg.Connection[Any], first: date, days: int) -> list[date]:
    """Create the partitions of ``first`` and the ``days - 1`` following days that are missing; return them."""
    have = set(list_partitions(conn))
    created = []
    for n in range(days):
        day = first + timedelta(days=n)
        if day not in have:
            _run(conn, f"create ledger partition {partition_name(day)}", partial(_create, conn, day))
            created.append(day)
    return created


def _create(conn: psycopg.Connection[Any], day: date) -> None:
    lo, hi = day_bounds(day)
    name, parent, default = sql.Identifier(partition_name(day)), sql.Identifier(TABLE), sql.Identifier(
        DEFAULT_PARTITION)
    bounds = sql.SQL("FOR VALUES FROM ({}) TO ({})").format(sql.Literal(lo), sql.Literal(hi))
    stray = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE accepted_at >= %s AND accepted_at < %s)")
                         .format(default), (lo, hi)).fetchone()
    if not (stray and stray[0]):
        conn.execute(sql.SQL("CREATE TABLE {} PARTITION OF {} {}").format(name, parent, bounds))
        return
    # Rows already arrived for this day: move them out of the default partition, then attach.
    conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)").format(name, parent))
    conn.execute(sql.SQL("WITH moved AS (DELETE FROM {} WHERE accepted_at >= %s AND accepted_at < %s RETURNING *) "
                         "INSERT INTO {} SELECT * FROM moved").format(default, name), (lo, hi))
    conn.execute(sql.SQL("ALTER TABLE {} ATTACH PARTITION {} {}").format(parent, name, bounds))


def drop_expired_partitions(conn: psycopg.Connection[Any], retention_days: int, today: date) -> list[date]:
    """Drop the day partitions whose day ended more than ``retention_days`` whole days before ``today``.

    A day ``d`` is dropped when ``d < today - retention_days``; with ``retention_days=1`` yesterday is kept.
    Rows in the default partition are never dropped here.
    """
    RetentionSettings(retention_days=retention_days)
    cutoff = today - timedelta(days=retention_days)
    dropped = []
    for day in list_partitions(conn):
        if day < cutoff:
            stmt = sql.SQL("DROP TABLE {}").format(sql.Identifier(partition_name(day)))
            _run(conn, f"drop ledger partition {partition_name(day)}", partial(conn.execute, stmt))
            dropped.append(day)
    return dropped


def maintain(conn: psycopg.Connection[Any], settings: RetentionSettings,
             today: date | None = None) -> tuple[list[date], list[date]]:
    """Create today's and ``ahead_days`` next partitions, drop expired ones; return (created, dropped)."""
    today = today or datetime.now(UTC).date()
    created = ensure_partitions(conn, today, settings.ahead_days + 1)
    dropped = drop_expired_partitions(conn, settings.retention_days, today)
    return created, dropped


def _run(conn: psycopg.Connection[Any], operation: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except psycopg.Error as exc:
        raise LedgerError(operation, f"{type(exc).__name__}: {exc}") from exc
