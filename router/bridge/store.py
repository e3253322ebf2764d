"""PostgreSQL persistence of bridges: endpoints, state, the channel objects they use, transaction settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

__all__ = ["BridgeStore", "BridgeRow"]

SCHEMA = """
CREATE SEQUENCE IF NOT EXISTS nsjms_bridge_id START WITH 0 MINVALUE 0;
CREATE TABLE IF NOT EXISTS nsjms_bridge (
    id          integer PRIMARY KEY,
    source      jsonb   NOT NULL,
    sink        jsonb   NOT NULL,
    state       text    NOT NULL CHECK (state IN ('created', 'started', 'stopped')),
    channel_id  integer NOT NULL,
    admin_id    integer,
    proxy_id    integer,
    settings    jsonb   NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
);
"""


@dataclass(frozen=True)
class BridgeRow:
    id: int
    source: dict[str, Any]
    sink: dict[str, Any]
    state: str
    channel_id: int
    admin_id: int | None
    proxy_id: int | None
    settings: dict[str, Any]


class BridgeStore:
    def __init__(self, dsn: str) -> None:
        self._pool = ConnectionPool(dsn, min_size=1, max_size=2, open=False, name="nsjms-bridge")

    def open(self) -> None:
        self._pool.open(wait=True, timeout=30)
        with self._pool.connection() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(7715002)")
            conn.execute(SCHEMA)

    def close(self) -> None:
        self._pool.close()

    def next_id(self) -> int:
        with self._pool.connection() as conn:
            row = conn.execute("SELECT nextval('nsjms_bridge_id')").fetchone()
        assert row is not None
        return int(row[0])

    def insert(self, row: BridgeRow) -> None:
        with self._pool.connection() as conn:
            conn.execute("INSERT INTO nsjms_bridge(id, source, sink, state, channel_id, admin_id, proxy_id, settings) "
                         "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                         (row.id, Jsonb(row.source), Jsonb(row.sink), row.state, row.channel_id, row.admin_id,
                          row.proxy_id, Jsonb(row.settings)))

    def set_state(self, bid: int, state: str) -> None:
        with self._pool.connection() as conn:
            conn.execute("UPDATE nsjms_bridge SET state = %s WHERE id = %s", (state, bid))

    def set_proxy(self, bid: int, admin_id: int, proxy_id: int) -> None:
        with self._pool.connection() as conn:
            conn.execute("UPDATE nsjms_bridge SET admin_id = %s, proxy_id = %s WHERE id = %s",
                         (admin_id, proxy_id, bid))

    def set_settings(self, bid: int, settings: dict[str, Any]) -> None:
        with self._pool.connection() as conn:
            conn.execute("UPDATE nsjms_bridge SET settings = %s WHERE id = %s", (Jsonb(settings), bid))

    def delete(self, bid: int) -> None:
        with self._pool.connection() as conn:
            conn.execute("DELETE FROM nsjms_bridge WHERE id = %s", (bid,))

    def load(self) -> list[BridgeRow]:
        with self._pool.connection() as conn:
            rows = conn.execute("SELECT id, source, sink, state, channel_id, admin_id, proxy_id, settings "
                                "FROM nsjms_bridge ORDER BY id").fetchall()
        return [BridgeRow(*r) for r in rows]
