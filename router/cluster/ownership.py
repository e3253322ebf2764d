"""Ownership of channels and bridges in PostgreSQL (table ``nsjms_owner`` of migration 0007_cluster).

The unit of ownership is a **channel with its bridges**: a bridge talks to its channel in-process (its channel-side
proxy lives in the channel), so a bridge is always owned by its channel's owner; a claim moves a channel and its
bridges together. Every function takes a connection inside a transaction its caller opened and checks the caller's
epoch first (:func:`router.cluster.members.check`): a fenced node can neither restore, create nor claim anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from router.cluster import members as M

__all__ = ["Owned", "adopt_unowned", "assign_new", "claim_all", "disown", "owned_by"]

Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class Owned:
    """What one node owns: channel ids and bridge ids (bridges of owned channels only)."""

    channels: tuple[int, ...] = ()
    bridges: tuple[int, ...] = field(default_factory=tuple)

    def __bool__(self) -> bool:
        return bool(self.channels or self.bridges)


def owned_by(conn: Conn, node_id: str) -> Owned:
    """The existing channels ``node_id`` owns and the existing bridges of those channels (rows of destroyed objects
    are ignored)."""
    channels = [int(r[0]) for r in conn.execute(
        "SELECT c.id FROM nsjms_channel c JOIN nsjms_owner o ON o.kind = 'channel' AND o.object_id = c.id "
        "WHERE o.node_id = %s ORDER BY c.id", (node_id,)).fetchall()]
    bridges = [int(r[0]) for r in conn.execute(
        "SELECT b.id FROM nsjms_bridge b JOIN nsjms_owner o ON o.kind = 'channel' AND o.object_id = b.channel_id "
        "WHERE o.node_id = %s ORDER BY b.id", (node_id,)).fetchall()]
    return Owned(tuple(channels), tuple(bridges))


def _sync_bridges(conn: Conn) -> None:
    """Bridge rows follow their channel's owner (inserted for bridges that have none, moved when they differ)."""
    conn.execute(
        "INSERT INTO nsjms_owner (kind, object_id, node_id) SELECT 'bridge', b.id, o.node_id FROM nsjms_bridge b "
        "JOIN nsjms_owner o ON o.kind = 'channel' AND o.object_id = b.channel_id "
        "ON CONFLICT (kind, object_id) DO UPDATE SET node_id = EXCLUDED.node_id, since = clock_timestamp() "
        "WHERE nsjms_owner.node_id <> EXCLUDED.node_id")


def adopt_unowned(conn: Conn, node_id: str, epoch: int) -> Owned:
    """At start: channels nobody owns (created before the cluster tables existed, by a node of an earlier version)
    become ``node_id``'s, with their bridges; returns everything ``node_id`` owns. Two nodes starting at once: the
    first insert wins (``ON CONFLICT DO NOTHING``), the other restores only what it owns."""
    M.check(conn, node_id, epoch)
    conn.execute("INSERT INTO nsjms_owner (kind, object_id, node_id) SELECT 'channel', c.id, %s FROM nsjms_channel c "
                 "WHERE NOT EXISTS (SELECT 1 FROM nsjms_owner o WHERE o.kind = 'channel' AND o.object_id = c.id) "
                 "ON CONFLICT (kind, object_id) DO NOTHING", (node_id,))
    _sync_bridges(conn)
    return owned_by(conn, node_id)


def assign_new(conn: Conn, kind: str, object_id: int, node_id: str, epoch: int) -> None:
    """A channel or bridge ``node_id`` creates in this transaction is ``node_id``'s (a node loads only the channels
    it owns, so a bridge it creates is on one of them); :class:`~router.cluster.errors.Fenced` when fenced."""
    M.check(conn, node_id, epoch)
    conn.execute("INSERT INTO nsjms_owner (kind, object_id, node_id) VALUES (%s, %s, %s) "
                 "ON CONFLICT (kind, object_id) DO UPDATE SET node_id = EXCLUDED.node_id, since = clock_timestamp()",
                 (kind, object_id, node_id))


def disown(conn: Conn, kind: str, object_id: int) -> None:
    """The object was destroyed: its ownership row goes with it."""
    conn.execute("DELETE FROM nsjms_owner WHERE kind = %s AND object_id = %s", (kind, object_id))


def claim_all(conn: Conn, dead: str, by: str, by_epoch: int) -> tuple[int, Owned]:
    """A survivor's takeover of ``dead`` in ONE transaction: fence it (epoch + 1, 'fenced'; refused unless its
    lease expired or it left: :class:`~router.cluster.errors.NotExpired`) and move every channel and bridge it owns
    to ``by``. Returns (the dead node's new epoch, what moved). The fence's ``FOR UPDATE`` waits for every write of
    the dead node that passed its check, and each ownership row is read ``FOR UPDATE`` before it moves."""
    new_epoch = M.fence(conn, dead, by, by_epoch)
    moved = owned_by(conn, dead)
    rows: Sequence[tuple[Any, ...]] = conn.execute(
        "SELECT kind, object_id FROM nsjms_owner WHERE node_id = %s ORDER BY kind, object_id FOR UPDATE",
        (dead,)).fetchall()
    for kind, oid in rows:
        M.claim(conn, (str(kind), int(oid)), dead, by)
    # the dead node's open hand-offs end here (migration 0010): a move it was to make ('requested' from it) or to
    # start ('requested' or 'released' to it; the latter's channel moved to ``by`` just above). Left open, one pinned
    # its channel (no other move, never a clean drain), and a 'released' one was started by the dead node's next
    # incarnation beside ``by``: two nodes running one channel (review of this session).
    conn.execute("UPDATE nsjms_handoff SET state = 'failed', error = %s WHERE (from_node = %s AND state = 'requested') "
                 "OR (to_node = %s AND state IN ('claimed', 'requested', 'released'))",
                 (f"node {dead} was taken over by {by}", dead, dead))
    return new_epoch, moved
