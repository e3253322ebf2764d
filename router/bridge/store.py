"""PostgreSQL persistence of bridges: endpoints, state, the channel objects they use, transaction settings.

The table ``nsjms_bridge`` is created by migration ``router/db/migrations/0001_initial.sql``. Every method takes
``conn``, a connection inside a transaction the caller opened (``with db.unit_of_work() as conn:``,
:class:`router.db.Database`); psycopg's errors reach the caller as :class:`router.db.StoreError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from router.cluster.ownership import disown

__all__ = ["BridgeRow", "BridgeStore"]

Conn = psycopg.Connection[Any]


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
    """Parameterised access to ``nsjms_bridge`` on the caller's connection (no state of its own)."""

    def next_id(self, conn: Conn) -> int:
        row = conn.execute("SELECT nextval('nsjms_bridge_id')").fetchone()
        assert row is not None
        return int(row[0])

    def insert(self, conn: Conn, row: BridgeRow) -> None:
        conn.execute("INSERT INTO nsjms_bridge(id, source, sink, state, channel_id, admin_id, proxy_id, settings) "
                     "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                     (row.id, Jsonb(row.source), Jsonb(row.sink), row.state, row.channel_id, row.admin_id,
                      row.proxy_id, Jsonb(row.settings)))

    def set_state(self, conn: Conn, bid: int, state: str) -> None:
        conn.execute("UPDATE nsjms_bridge SET state = %s WHERE id = %s", (state, bid))

    def set_proxy(self, conn: Conn, bid: int, admin_id: int, proxy_id: int) -> None:
        conn.execute("UPDATE nsjms_bridge SET admin_id = %s, proxy_id = %s WHERE id = %s",
                     (admin_id, proxy_id, bid))

    def set_settings(self, conn: Conn, bid: int, settings: dict[str, Any]) -> None:
        conn.execute("UPDATE nsjms_bridge SET settings = %s WHERE id = %s", (Jsonb(settings), bid))

    def delete(self, conn: Conn, bid: int) -> None:
        conn.execute("DELETE FROM nsjms_bridge WHERE id = %s", (bid,))
        disown(conn, "bridge", bid)        # a destroyed bridge is owned by no node (docs/cluster.md)

    def load(self, conn: Conn) -> list[BridgeRow]:
        rows = conn.execute("SELECT id, source, sink, state, channel_id, admin_id, proxy_id, settings "
                            "FROM nsjms_bridge ORDER BY id").fetchall()
        return [BridgeRow(*r) for r in rows]
