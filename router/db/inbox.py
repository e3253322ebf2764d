"""The JMS -> channel inbox's day partitions (``nsjms_inbox``, migration ``0005_inbox_partitions.sql``).

One row per message a JMS -> channel bridge turned into an event, kept ``inbox_retention`` (7 days) after it was
received so that a redelivery is acknowledged without a second event. The table is partitioned by ``sent_day``,
the UTC day of the message's JMSTimestamp: a redelivery carries the same timestamp, so it lands in the partition
of its first delivery and the primary key ``(bridge_id, message_id, sent_day)`` recognises it exactly (see the
migration). Purging is dropping a partition, not deleting millions of rows:

* :func:`maintain` creates the partitions of today and ``ahead_days`` next days, and drops each day partition whose
  day ended more than the retention ago. Rows of such a partition received within the retention (a message that
  waited days in the broker before the bridge took it) are moved to the default partition first, in the same
  transaction: every row is kept at least the retention after it was received, as before.
* :func:`purge_default` deletes the default partition's rows received longer than the retention ago (messages
  without a timestamp, rows moved there, rows migrated from before 0005): the only DELETE left.

DDL takes the parent table's ACCESS EXCLUSIVE lock for an instant: run :func:`maintain` in a short transaction of
its own with a ``lock_timeout`` (a prepared T2 that holds the table makes it fail and the next period retry,
never stall routing for longer than the timeout).
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import psycopg
from psycopg import sql

__all__ = ["DEFAULT_PARTITION", "NO_TIMESTAMP_DAY", "TABLE", "list_partitions", "maintain", "partition_name",
           "purge_default", "sent_day"]

TABLE = "nsjms_inbox"
DEFAULT_PARTITION = "nsjms_inbox_default"
#: ``sent_day`` of a message without a JMSTimestamp (0): always the default partition.
NO_TIMESTAMP_DAY = date(1970, 1, 1)
_PARTITION_RE = re.compile(r"^nsjms_inbox_p(\d{8})$")
_MAX_MS = 253402300799999            # 9999-12-31T23:59:59.999Z: a larger JMSTimestamp has no date


def sent_day(timestamp_ms: int | str | None) -> date:
    """The partition key of a message with JMSTimestamp ``timestamp_ms`` (ms since the epoch, or the STOMP
    ``timestamp`` header's text; 0, None or not a number: none)."""
    try:
        timestamp_ms = int(timestamp_ms or 0)
    except ValueError:
        return NO_TIMESTAMP_DAY
    if timestamp_ms <= 0 or timestamp_ms > _MAX_MS:
        return NO_TIMESTAMP_DAY
    return datetime.fromtimestamp(timestamp_ms / 1000, UTC).date()


def partition_name(day: date) -> str:
    return f"{TABLE}_p{day:%Y%m%d}"


def list_partitions(conn: psycopg.Connection[Any]) -> list[date]:
    """The days that have a partition, ascending (the default partition is not a day)."""
    rows = conn.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                        "WHERE i.inhparent = %s::regclass", (TABLE,)).fetchall()
    days = [datetime.strptime(m.group(1), "%Y%m%d").date()
            for (name,) in rows if (m := _PARTITION_RE.match(str(name)))]
    return sorted(days)


def _bounds(day: date) -> sql.Composable:
    return sql.SQL("FOR VALUES FROM ({}) TO ({})").format(sql.Literal(day), sql.Literal(day + timedelta(days=1)))


def _create(conn: psycopg.Connection[Any], day: date) -> None:
    """The partition of ``day``; rows the default partition holds for that day move into it (same transaction)."""
    name, parent, default = (sql.Identifier(partition_name(day)), sql.Identifier(TABLE),
                             sql.Identifier(DEFAULT_PARTITION))
    stray = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE sent_day = %s)").format(default),
                         (day,)).fetchone()
    if not (stray and stray[0]):
        conn.execute(sql.SQL("CREATE TABLE {} PARTITION OF {} {}").format(name, parent, _bounds(day)))
        return
    conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)").format(name, parent))
    conn.execute(sql.SQL("WITH moved AS (DELETE FROM {} WHERE sent_day = %s RETURNING *) "
                         "INSERT INTO {} SELECT * FROM moved").format(default, name), (day,))
    conn.execute(sql.SQL("ALTER TABLE {} ATTACH PARTITION {} {}").format(parent, name, _bounds(day)))


def _drop(conn: psycopg.Connection[Any], day: date, retention_s: float) -> int:
    """Detach and drop the partition of ``day``; its rows received within the retention go to the default
    partition first. Returns how many rows were kept that way."""
    name = sql.Identifier(partition_name(day))
    conn.execute(sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(sql.Identifier(TABLE), name))
    kept = conn.execute(sql.SQL("INSERT INTO {} SELECT * FROM {} WHERE received_at >= now() - make_interval("
                                "secs => %s)").format(sql.Identifier(TABLE), name), (retention_s,)).rowcount
    conn.execute(sql.SQL("DROP TABLE {}").format(name))
    return max(0, kept)


def maintain(conn: psycopg.Connection[Any], retention_s: float, ahead_days: int = 2,
             now: datetime | None = None) -> tuple[list[date], list[date]]:
    """Create the partitions of today and the ``ahead_days`` next days that are missing, drop those whose day
    ended more than ``retention_s`` ago; return (created, dropped). In the caller's transaction."""
    now = now or datetime.now(UTC)
    today = now.date()
    have = set(list_partitions(conn))
    created = []
    for n in range(ahead_days + 1):
        day = today + timedelta(days=n)
        if day not in have:
            _create(conn, day)
            created.append(day)
    dropped = []
    for day in sorted(have):
        end = datetime.combine(day + timedelta(days=1), time(0), tzinfo=UTC)
        if now - end > timedelta(seconds=retention_s):
            _drop(conn, day, retention_s)
            dropped.append(day)
    return created, dropped


def purge_default(conn: psycopg.Connection[Any], retention_s: float) -> int:
    """Delete the default partition's rows received more than ``retention_s`` ago; returns how many."""
    return max(0, conn.execute(sql.SQL("DELETE FROM {} WHERE received_at < now() - make_interval(secs => %s)")
                               .format(sql.Identifier(DEFAULT_PARTITION)), (retention_s,)).rowcount)
