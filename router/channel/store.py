"""PostgreSQL persistence of the channel: topology always, events when they are persistent (NS 2.5.5.1).

Tables (created by :meth:`Store.migrate`, idempotent):

* ``nsjms_channel`` — one row per channel: QoS, admin properties, id counters.
* ``nsjms_admin`` — consumer ('C') and supplier ('S') admins, with QoS, operator and filter references.
* ``nsjms_proxy`` — proxies of both sides: kind, QoS, connected client reference (IOR), suspension, filters.
* ``nsjms_event`` — persistent events (CDR encapsulation) with their delivery attributes.
* ``nsjms_queue`` — which proxy supplier still has to deliver which persistent event.

Every statement is parameterised. Methods are small transactions; an event and its queue rows are written in
one transaction, so an event acknowledged to its supplier is on disk for every consumer it was routed to.

Errors: this module is the one boundary where psycopg's exceptions become the channel's own::

    StoreError                  the database refused the operation (a bug or a schema problem)
    └── StoreUnavailable        the database could not be reached in time (no connection within the checkout
                                timeout, connection lost); ``in_doubt`` when the connection broke during COMMIT

A connection is checked out within ``checkout_timeout`` seconds (default 5) and each new connection is made within
``connect_timeout`` seconds, so a caller never waits long on a database that is down; pooled connections are
checked before use, so the first operation after the database came back succeeds.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

__all__ = ["AdminRow", "ChannelRow", "NewEvent", "ProxyRow", "QueuedRow", "Store", "StoreError", "StoreUnavailable"]

SCHEMA = """
CREATE SEQUENCE IF NOT EXISTS nsjms_channel_id START WITH 0 MINVALUE 0;
CREATE TABLE IF NOT EXISTS nsjms_channel (
    id            integer PRIMARY KEY,
    qos           jsonb   NOT NULL,
    admin_props   jsonb   NOT NULL,
    next_admin_c  integer NOT NULL DEFAULT 1,
    next_admin_s  integer NOT NULL DEFAULT 1,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS nsjms_admin (
    channel_id    integer NOT NULL REFERENCES nsjms_channel(id) ON DELETE CASCADE,
    side          char(1) NOT NULL CHECK (side IN ('C','S')),
    id            integer NOT NULL,
    es_style      boolean NOT NULL DEFAULT false,
    operator      smallint NOT NULL DEFAULT 0,
    qos           jsonb   NOT NULL,
    next_proxy    integer NOT NULL DEFAULT 0,
    filters       jsonb   NOT NULL DEFAULT '{}'::jsonb,
    extra         jsonb   NOT NULL DEFAULT '{}'::jsonb,
    PRIMARY KEY (channel_id, side, id)
);
CREATE TABLE IF NOT EXISTS nsjms_proxy (
    channel_id    integer NOT NULL,
    side          char(1) NOT NULL CHECK (side IN ('C','S')),
    admin_id      integer NOT NULL,
    id            integer NOT NULL,
    kind          text    NOT NULL,
    es_style      boolean NOT NULL DEFAULT false,
    qos           jsonb   NOT NULL,
    client_ior    text,
    connected     boolean NOT NULL DEFAULT false,
    suspended     boolean NOT NULL DEFAULT false,
    filters       jsonb   NOT NULL DEFAULT '{}'::jsonb,
    extra         jsonb   NOT NULL DEFAULT '{}'::jsonb,
    PRIMARY KEY (channel_id, side, admin_id, id),
    FOREIGN KEY (channel_id, side, admin_id) REFERENCES nsjms_admin(channel_id, side, id) ON DELETE CASCADE
);
CREATE TABLE IF NOT EXISTS nsjms_event (
    id            bigserial PRIMARY KEY,
    channel_id    integer NOT NULL REFERENCES nsjms_channel(id) ON DELETE CASCADE,
    seq           bigint  NOT NULL,
    form          smallint NOT NULL,
    body          bytea   NOT NULL,
    priority      integer NOT NULL,
    deadline      double precision,
    start_at      double precision,
    received_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS nsjms_queue (
    channel_id    integer NOT NULL,
    admin_id      integer NOT NULL,
    proxy_id      integer NOT NULL,
    event_id      bigint  NOT NULL REFERENCES nsjms_event(id) ON DELETE CASCADE,
    PRIMARY KEY (channel_id, admin_id, proxy_id, event_id)
);
CREATE INDEX IF NOT EXISTS nsjms_queue_event ON nsjms_queue(event_id);
"""


DEFAULT_CHECKOUT_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 3


class StoreError(RuntimeError):
    """The database refused an operation; nothing of it was committed."""


class StoreUnavailable(StoreError):
    """The database could not be reached in time or the connection broke.

    ``in_doubt`` is True only when the connection broke while the transaction was being committed: then the
    caller cannot know whether it was committed. Otherwise nothing of the operation was committed.
    """

    def __init__(self, message: str, *, in_doubt: bool = False) -> None:
        super().__init__(message)
        self.in_doubt = in_doubt

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unavailable, (str(self), self.in_doubt))


def _unavailable(message: str, in_doubt: bool) -> StoreUnavailable:
    return StoreUnavailable(message, in_doubt=in_doubt)


@dataclass(frozen=True)
class ChannelRow:
    id: int
    qos: dict[str, Any]
    admin_props: dict[str, Any]
    next_admin_c: int
    next_admin_s: int


@dataclass(frozen=True)
class AdminRow:
    channel_id: int
    side: str
    id: int
    es_style: bool
    operator: int
    qos: dict[str, Any]
    next_proxy: int
    filters: dict[str, Any]
    extra: dict[str, Any]


@dataclass(frozen=True)
class ProxyRow:
    channel_id: int
    side: str
    admin_id: int
    id: int
    kind: str
    es_style: bool
    qos: dict[str, Any]
    client_ior: str | None
    connected: bool
    suspended: bool
    filters: dict[str, Any]
    extra: dict[str, Any]


@dataclass(frozen=True)
class QueuedRow:
    admin_id: int
    proxy_id: int
    event_id: int
    seq: int
    form: int
    body: bytes
    priority: int
    deadline: float | None
    start_at: float | None


@dataclass(frozen=True)
class NewEvent:
    seq: int
    form: int
    body: bytes
    priority: int
    deadline: float | None
    start_at: float | None
    targets: Sequence[tuple[int, int]]   # (consumer admin id, proxy supplier id)


class Store:
    """Thin, parameterised access to the channel tables through a connection pool."""

    def __init__(self, dsn: str, pool_size: int = 8, *, checkout_timeout: float = DEFAULT_CHECKOUT_TIMEOUT,
                 connect_timeout: int = DEFAULT_CONNECT_TIMEOUT) -> None:
        self.checkout_timeout = checkout_timeout
        self._pool = ConnectionPool(dsn, min_size=1, max_size=max(2, pool_size), open=False,
                                    kwargs={"autocommit": False, "connect_timeout": max(1, int(connect_timeout))},
                                    timeout=checkout_timeout, check=ConnectionPool.check_connection,
                                    name="nsjms-channel")
        self._reap_lock = threading.Lock()
        self._reap: list[int] = []

    def open(self, timeout: float = 30.0) -> None:
        self._pool.open(wait=True, timeout=timeout)
        self.migrate()

    def close(self) -> None:
        self._pool.close()

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[Any]]:
        """One transaction on a pooled connection, committed on a clean exit; psycopg's errors translated."""
        stage = "checkout"
        try:
            with self._pool.connection(timeout=self.checkout_timeout) as conn:
                stage = "work"
                yield conn
                stage = "commit"
        except PoolTimeout as exc:
            raise StoreUnavailable(f"no database connection within {self.checkout_timeout:g} s") from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise StoreUnavailable(f"database connection failed during {stage}: {_first_line(exc)}",
                                   in_doubt=stage == "commit") from exc
        except psycopg.Error as exc:
            raise StoreError(f"database error during {stage}: {_first_line(exc)}") from exc

    def transaction(self) -> Any:
        """A pooled connection as a context manager: one transaction, committed on a clean exit.

        For modules that keep their own tables next to the channel's (e.g. ``router.channel.filters``).
        """
        return self._tx()

    def migrate(self) -> None:
        with self._tx() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(7715001)")
            conn.execute(SCHEMA)

    # -- channels ---------------------------------------------------------------------------------------
    def next_channel_id(self) -> int:
        """Channel ids are never reused, even after a channel is destroyed."""
        with self._tx() as conn:
            row = conn.execute("SELECT nextval('nsjms_channel_id')").fetchone()
        assert row is not None
        return int(row[0])

    def insert_channel(self, cid: int, qos: dict[str, Any], admin_props: dict[str, Any],
                       default_admin_qos: dict[str, dict[str, Any]]) -> None:
        """A channel and its two default admins (id 0; QoS by side 'C'/'S') in one transaction."""
        with self._tx() as conn:
            conn.execute("INSERT INTO nsjms_channel(id, qos, admin_props) VALUES (%s, %s, %s)",
                         (cid, Jsonb(qos), Jsonb(admin_props)))
            for side in ("C", "S"):
                conn.execute("INSERT INTO nsjms_admin(channel_id, side, id, qos) VALUES (%s, %s, 0, %s)",
                             (cid, side, Jsonb(default_admin_qos[side])))

    def update_channel(self, cid: int, **cols: Any) -> None:
        self._update("nsjms_channel", {"id": cid}, cols)

    def delete_channel(self, cid: int) -> None:
        with self._tx() as conn:
            conn.execute("DELETE FROM nsjms_queue WHERE channel_id = %s", (cid,))
            conn.execute("DELETE FROM nsjms_proxy WHERE channel_id = %s", (cid,))
            conn.execute("DELETE FROM nsjms_channel WHERE id = %s", (cid,))

    def load_channels(self) -> list[ChannelRow]:
        with self._tx() as conn:
            rows = conn.execute("SELECT id, qos, admin_props, next_admin_c, next_admin_s "
                                "FROM nsjms_channel ORDER BY id").fetchall()
        return [ChannelRow(*r) for r in rows]

    # -- admins -----------------------------------------------------------------------------------------
    def insert_admin(self, cid: int, side: str, aid: int, es_style: bool, operator: int,
                     qos: dict[str, Any]) -> None:
        counter = "next_admin_c" if side == "C" else "next_admin_s"
        with self._tx() as conn:
            conn.execute("INSERT INTO nsjms_admin(channel_id, side, id, es_style, operator, qos) "
                         "VALUES (%s, %s, %s, %s, %s, %s)", (cid, side, aid, es_style, operator, Jsonb(qos)))
            conn.execute(f"UPDATE nsjms_channel SET {counter} = GREATEST({counter}, %s) WHERE id = %s",
                         (aid + 1, cid))

    def update_admin(self, cid: int, side: str, aid: int, **cols: Any) -> None:
        self._update("nsjms_admin", {"channel_id": cid, "side": side, "id": aid}, cols)

    def delete_admin(self, cid: int, side: str, aid: int) -> None:
        with self._tx() as conn:
            if side == "C":
                conn.execute("DELETE FROM nsjms_queue WHERE channel_id = %s AND admin_id = %s", (cid, aid))
            conn.execute("DELETE FROM nsjms_proxy WHERE channel_id = %s AND side = %s AND admin_id = %s",
                         (cid, side, aid))
            conn.execute("DELETE FROM nsjms_admin WHERE channel_id = %s AND side = %s AND id = %s",
                         (cid, side, aid))
            self._delete_orphans(conn, cid)

    def load_admins(self, cid: int) -> list[AdminRow]:
        with self._tx() as conn:
            rows = conn.execute("SELECT channel_id, side, id, es_style, operator, qos, next_proxy, filters, extra "
                                "FROM nsjms_admin WHERE channel_id = %s ORDER BY side, id", (cid,)).fetchall()
        return [AdminRow(*r) for r in rows]

    # -- proxies ----------------------------------------------------------------------------------------
    def insert_proxy(self, cid: int, side: str, aid: int, pid: int, kind: str, es_style: bool,
                     qos: dict[str, Any]) -> None:
        with self._tx() as conn:
            conn.execute("INSERT INTO nsjms_proxy(channel_id, side, admin_id, id, kind, es_style, qos) "
                         "VALUES (%s, %s, %s, %s, %s, %s, %s)", (cid, side, aid, pid, kind, es_style, Jsonb(qos)))
            conn.execute("UPDATE nsjms_admin SET next_proxy = GREATEST(next_proxy, %s) "
                         "WHERE channel_id = %s AND side = %s AND id = %s", (pid + 1, cid, side, aid))

    def update_proxy(self, cid: int, side: str, aid: int, pid: int, **cols: Any) -> None:
        self._update("nsjms_proxy", {"channel_id": cid, "side": side, "admin_id": aid, "id": pid}, cols)

    def delete_proxy(self, cid: int, side: str, aid: int, pid: int) -> None:
        with self._tx() as conn:
            if side == "C":
                conn.execute("DELETE FROM nsjms_queue WHERE channel_id = %s AND admin_id = %s AND proxy_id = %s",
                             (cid, aid, pid))
            conn.execute("DELETE FROM nsjms_proxy WHERE channel_id = %s AND side = %s AND admin_id = %s "
                         "AND id = %s", (cid, side, aid, pid))
            self._delete_orphans(conn, cid)

    def load_proxies(self, cid: int) -> list[ProxyRow]:
        with self._tx() as conn:
            rows = conn.execute("SELECT channel_id, side, admin_id, id, kind, es_style, qos, client_ior, connected, "
                                "suspended, filters, extra FROM nsjms_proxy WHERE channel_id = %s "
                                "ORDER BY side, admin_id, id", (cid,)).fetchall()
        return [ProxyRow(*r) for r in rows]

    # -- events -----------------------------------------------------------------------------------------
    _INSERT_EVENTS = """
        WITH ev AS (
            INSERT INTO nsjms_event(channel_id, seq, form, body, priority, deadline, start_at)
            SELECT %(cid)s, * FROM unnest(%(seq)s::bigint[], %(form)s::smallint[], %(body)s::bytea[],
                                          %(prio)s::integer[], %(deadline)s::float8[], %(start)s::float8[])
            RETURNING id, seq
        ), q AS (
            INSERT INTO nsjms_queue(channel_id, admin_id, proxy_id, event_id)
            SELECT %(cid)s, t.a, t.p, ev.id
            FROM unnest(%(qseq)s::bigint[], %(qadmin)s::integer[], %(qproxy)s::integer[]) AS t(seq, a, p)
            JOIN ev ON ev.seq = t.seq
        )
        SELECT id, seq FROM ev"""

    def insert_events(self, cid: int, events: Sequence[NewEvent]) -> list[int]:
        """Store events and their queue rows atomically, in one statement; returns the new ids in order."""
        if not events:
            return []
        params = {
            "cid": cid,
            "seq": [ev.seq for ev in events], "form": [ev.form for ev in events],
            "body": [ev.body for ev in events], "prio": [ev.priority for ev in events],
            "deadline": [ev.deadline for ev in events], "start": [ev.start_at for ev in events],
            "qseq": [ev.seq for ev in events for _ in ev.targets],
            "qadmin": [a for ev in events for a, _ in ev.targets],
            "qproxy": [p for ev in events for _, p in ev.targets],
        }
        with self._tx() as conn:
            rows = conn.execute(self._INSERT_EVENTS, params).fetchall()
        by_seq = {int(seq): int(eid) for eid, seq in rows}
        return [by_seq[ev.seq] for ev in events]

    def delete_deliveries(self, cid: int, aid: int, pid: int, event_ids: Iterable[int]) -> None:
        """The proxy no longer has to deliver these events."""
        ids = list(event_ids)
        if not ids:
            return
        with self._tx() as conn:
            conn.execute("DELETE FROM nsjms_queue WHERE channel_id = %s AND admin_id = %s AND proxy_id = %s "
                         "AND event_id = ANY(%s)", (cid, aid, pid, ids))

    def delete_events(self, event_ids: Iterable[int]) -> None:
        """Events no queue holds any more (the caller's reference count reached zero)."""
        ids = list(event_ids)
        if ids:
            with self._tx() as conn:
                conn.execute("DELETE FROM nsjms_event WHERE id = ANY(%s)", (ids,))

    def reap_later(self, event_id: int) -> None:
        """Queue a fully delivered event for deletion by :meth:`reap` (batched: one statement for many events).

        Its queue rows are already gone, so until then it is only an orphan row, which startup also removes."""
        with self._reap_lock:
            self._reap.append(event_id)

    def reap(self) -> int:
        """Delete the events queued by :meth:`reap_later`; returns how many."""
        with self._reap_lock:
            ids, self._reap = self._reap, []
        if ids:
            try:
                self.delete_events(ids)
            except StoreError:
                with self._reap_lock:          # try again next time; nothing depends on it meanwhile
                    self._reap.extend(ids)
                raise
        return len(ids)

    def load_queued(self, cid: int) -> list[QueuedRow]:
        with self._tx() as conn:
            self._delete_orphans(conn, cid)
            rows = conn.execute(
                "SELECT q.admin_id, q.proxy_id, e.id, e.seq, e.form, e.body, e.priority, e.deadline, e.start_at "
                "FROM nsjms_queue q JOIN nsjms_event e ON e.id = q.event_id WHERE q.channel_id = %s "
                "ORDER BY e.seq", (cid,)).fetchall()
        return [QueuedRow(*r) for r in rows]

    def max_seq(self) -> int:
        with self._tx() as conn:
            row = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM nsjms_event").fetchone()
        return int(row[0]) if row else 0

    def stats(self) -> dict[str, int]:
        with self._tx() as conn:
            row = conn.execute("SELECT (SELECT count(*) FROM nsjms_channel), (SELECT count(*) FROM nsjms_proxy), "
                               "(SELECT count(*) FROM nsjms_event), (SELECT count(*) FROM nsjms_queue)").fetchone()
        assert row is not None
        return dict(zip(("channels", "proxies", "events", "queued"), map(int, row), strict=True))

    # -- helpers ----------------------------------------------------------------------------------------
    @staticmethod
    def _delete_orphans(conn: psycopg.Connection[Any], cid: int) -> None:
        conn.execute("DELETE FROM nsjms_event e WHERE e.channel_id = %s AND NOT EXISTS "
                     "(SELECT 1 FROM nsjms_queue q WHERE q.event_id = e.id)", (cid,))

    _COLUMNS: ClassVar[frozenset[str]] = frozenset({
        "qos", "admin_props", "operator", "filters", "extra", "client_ior", "connected", "suspended",
        "next_proxy"})

    def _update(self, table: str, key: dict[str, Any], cols: dict[str, Any]) -> None:
        if not cols:
            return
        bad = set(cols) - self._COLUMNS
        if bad:
            raise ValueError(f"unknown column(s) {sorted(bad)}")
        sets = ", ".join(f"{c} = %s" for c in cols)
        where = " AND ".join(f"{k} = %s" for k in key)
        values = [Jsonb(v) if isinstance(v, dict) else v for v in cols.values()]
        with self._tx() as conn:
            conn.execute(f"UPDATE {table} SET {sets} WHERE {where}", (*values, *key.values()))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def dumps(obj: Any) -> str:
    """JSON for logs and status output."""
    return json.dumps(obj, sort_keys=True, default=str)
