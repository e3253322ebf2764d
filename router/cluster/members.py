"""Membership, leases, fencing and ownership in PostgreSQL (tables of migration 0007_cluster; decisions in
:mod:`router.cluster.lease`).

Every function takes a connection inside a transaction its caller opened (the caller owns the transaction), so a
fence check and the write that depends on it commit together.

**Fencing.** A node's ``epoch`` is its fencing token. :func:`check` reads the node's row ``FOR KEY SHARE`` and
refuses unless it is ``live`` with that epoch; :func:`fence` (a survivor's takeover) reads the dead node's row ``FOR
UPDATE``, which conflicts with ``FOR KEY SHARE``: it waits for every transaction that passed a check, and once it
commits (epoch + 1, ``fenced``) every later check of the old epoch fails. So a node paused (GC, SIGSTOP, a VM freeze,
a network partition) across a takeover commits nothing that checked its epoch after the takeover, whatever its clock
says. A lease renewal is a non-key UPDATE (``FOR NO KEY UPDATE``), which does not conflict with the checks: renewals
never wait for the data paths. Session-level advisory locks are not used: a dead client's backend can hold them for a
long time, and poolers drop them.

A prepared T2 branch must not hold such a lock (a takeover would wait for the dead node's in-doubt branches, which
only the takeover can finish): the routing transaction fences its *decision*, a short transaction of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from router.cluster.errors import Fenced, NodeLive, NotExpired
from router.cluster.lease import LeaseSettings, MemberView, Object

__all__ = ["CHANNEL_FENCE_CTE", "assign", "check", "check_owner", "claim", "fence", "incarnation", "join", "leave",
           "loads", "members", "owned", "owner_of", "renew"]

Conn = psycopg.Connection[Any]

_MEMBER = "node_id, epoch, state, address, lease_until, renewed_at, clock_timestamp()"


def _view(row: Sequence[Any]) -> MemberView:
    return MemberView(str(row[0]), int(row[1]), str(row[2]), str(row[3]), row[4], row[5], row[6])


def incarnation(conn: Conn, node_id: str) -> tuple[int, str] | None:
    """(epoch, incarnation token) of ``node_id``'s row, None when it is not a member."""
    row = conn.execute("SELECT epoch, incarnation FROM nsjms_member WHERE node_id = %s", (node_id,)).fetchone()
    return (int(row[0]), str(row[1])) if row else None


def join(conn: Conn, node_id: str, address: str, settings: LeaseSettings, *, steal: bool = False,
         token: str = "") -> int:
    """Join as a new member; returns this incarnation's epoch (1 for a new node id, the last epoch + 1 otherwise).

    A node id whose lease is live is refused (:class:`NodeLive`): another process runs with it, or a killed one's
    lease has not expired. ``steal``: the caller knows the previous incarnation is dead (it holds the node's state
    directory lock, which that process held): its epoch is fenced at once instead of waiting for the expiry."""
    row = conn.execute(f"SELECT {_MEMBER} FROM nsjms_member WHERE node_id = %s FOR UPDATE", (node_id,)).fetchone()
    if row is not None:
        old = _view(row)
        if old.live and not steal:
            raise NodeLive(f"node id {node_id!r} holds a live lease (epoch {old.epoch}, {old.lease_left_s:.1f} s "
                           f"left, at {old.address or 'an unknown address'}): another node runs with this id, or "
                           f"its lease has not expired", node_id)
    epoch = conn.execute(
        "INSERT INTO nsjms_member (node_id, epoch, state, address, incarnation, lease_until, renewed_at, "
        "joined_at) VALUES (%s, 1, 'live', %s, %s, clock_timestamp() + make_interval(secs => %s), "
        "clock_timestamp(), clock_timestamp()) "
        "ON CONFLICT (node_id) DO UPDATE SET epoch = nsjms_member.epoch + 1, state = 'live', "
        "address = EXCLUDED.address, incarnation = EXCLUDED.incarnation, lease_until = EXCLUDED.lease_until, "
        "renewed_at = EXCLUDED.renewed_at, joined_at = EXCLUDED.joined_at, fenced_by = NULL, fenced_at = NULL "
        "RETURNING epoch",
        (node_id, address, token, settings.expiry_s)).fetchone()
    assert epoch is not None
    return int(epoch[0])


def renew(conn: Conn, node_id: str, epoch: int, settings: LeaseSettings) -> datetime:
    """Extend this incarnation's lease by ``expiry_s`` from now; returns the new end. :class:`Fenced` when the
    epoch is not the live one (taken over, or left): the node must stop and rejoin."""
    row = conn.execute(
        "UPDATE nsjms_member SET lease_until = clock_timestamp() + make_interval(secs => %s), "
        "renewed_at = clock_timestamp() WHERE node_id = %s AND epoch = %s AND state = 'live' RETURNING lease_until",
        (settings.expiry_s, node_id, epoch)).fetchone()
    if row is None:
        raise Fenced(f"node {node_id!r} epoch {epoch} is not the live member any more: its work was taken over",
                     node_id)
    return row[0]  # type: ignore[no-any-return]


def leave(conn: Conn, node_id: str, epoch: int) -> None:
    """A graceful stop: this incarnation is 'left' and its work may be claimed at once (no expiry to wait for)."""
    conn.execute("UPDATE nsjms_member SET state = 'left', lease_until = clock_timestamp() "
                 "WHERE node_id = %s AND epoch = %s AND state = 'live'", (node_id, epoch))


def check(conn: Conn, node_id: str, epoch: int) -> None:
    """The fence check of an ownership-dependent write, in the writer's transaction: the row stays ``FOR KEY
    SHARE`` locked until that transaction ends, so no takeover commits between this check and the write's commit.
    :class:`Fenced` when the epoch is not the live one."""
    row = conn.execute("SELECT state FROM nsjms_member WHERE node_id = %s AND epoch = %s FOR KEY SHARE",
                       (node_id, epoch)).fetchone()
    if row is None or row[0] != "live":
        raise Fenced(f"node {node_id!r} epoch {epoch} is fenced: the write is refused", node_id)


def check_owner(conn: Conn, obj: Object, node_id: str, epoch: int) -> None:
    """:func:`check`, and that ``node_id`` owns ``obj`` (its ownership row locked ``FOR KEY SHARE`` too: a claim or a
    hand-over, which read it ``FOR UPDATE``, waits for the write)."""
    check(conn, node_id, epoch)
    row = conn.execute("SELECT node_id FROM nsjms_owner WHERE kind = %s AND object_id = %s FOR KEY SHARE",
                       obj).fetchone()
    if row is None or row[0] != node_id:
        raise Fenced(f"node {node_id!r} does not own {obj[0]} {obj[1]} (owner: {row[0] if row else 'none'})", node_id)


#: :func:`check_owner` of a channel as common table expressions, for a write that must be fenced in its OWN statement
#: (an autocommit statement is its own transaction: no check can run before its COMMIT). ``fence`` yields one row
#: when node ``%(fnode)s`` is live with epoch ``%(fepoch)s`` and owns channel ``%(cid)s``, none otherwise; the write
#: takes its rows ``FROM fence``, so it writes nothing when the check fails (its caller sees no row returned). Both
#: rows are locked ``FOR KEY SHARE`` until the statement's transaction ends, as :func:`check_owner` locks them: a
#: takeover's :func:`fence` and a :func:`claim` (each ``FOR UPDATE`` first) wait for the write, and a write that
#: waited for either re-reads the changed row and finds the old epoch or owner gone. The member row is locked first
#: (``fence_member`` must yield its row before the owner row can be locked), as a takeover locks them: the two never
#: deadlock.
CHANNEL_FENCE_CTE = """fence_member AS MATERIALIZED (
            SELECT node_id FROM nsjms_member
            WHERE node_id = %(fnode)s::text AND epoch = %(fepoch)s::bigint AND state = 'live'
            FOR KEY SHARE
        ), fence AS MATERIALIZED (
            SELECT 1 AS ok FROM nsjms_owner o JOIN fence_member fm ON fm.node_id = o.node_id
            WHERE o.kind = 'channel' AND o.object_id = %(cid)s::integer
            FOR KEY SHARE OF o
        )"""


def fence(conn: Conn, dead: str, by: str, by_epoch: int) -> int:
    """A survivor's takeover of ``dead``: its epoch + 1 and 'fenced' (returned), once every transaction that passed
    a check of its old epoch has ended. The survivor must itself be live (:class:`Fenced` otherwise); a node whose
    lease has not expired and which has not left is refused (:class:`NotExpired`)."""
    check(conn, by, by_epoch)
    row = conn.execute(f"SELECT {_MEMBER} FROM nsjms_member WHERE node_id = %s FOR UPDATE", (dead,)).fetchone()
    if row is None:
        raise NotExpired(f"node {dead!r} is not a member", dead)
    view = _view(row)
    if view.state == "fenced":
        return view.epoch
    if view.state == "live" and view.lease_until > view.now:
        raise NotExpired(f"node {dead!r} holds a live lease ({view.lease_left_s:.1f} s left): not taken over", dead)
    epoch = conn.execute("UPDATE nsjms_member SET epoch = epoch + 1, state = 'fenced', fenced_by = %s, "
                         "fenced_at = clock_timestamp() WHERE node_id = %s RETURNING epoch", (by, dead)).fetchone()
    assert epoch is not None
    return int(epoch[0])


def members(conn: Conn) -> list[MemberView]:
    """Every member, by node id, as of PostgreSQL's clock now."""
    return [_view(r) for r in conn.execute(f"SELECT {_MEMBER} FROM nsjms_member ORDER BY node_id").fetchall()]


def assign(conn: Conn, obj: Object, node_id: str) -> None:
    """Record ``node_id`` as the owner of a new ``obj`` (refused by the primary key when it has one)."""
    conn.execute("INSERT INTO nsjms_owner (kind, object_id, node_id) VALUES (%s, %s, %s)", (*obj, node_id))


def claim(conn: Conn, obj: Object, frm: str, to: str) -> bool:
    """Move ``obj`` from ``frm`` (fenced, left, or handing it over) to ``to``; False when ``frm`` does not own it
    (another survivor claimed it first). The row is read ``FOR UPDATE``: a write of the old owner that checked it
    ends first."""
    row = conn.execute("SELECT node_id FROM nsjms_owner WHERE kind = %s AND object_id = %s FOR UPDATE",
                       obj).fetchone()
    if row is None or row[0] != frm:
        return False
    conn.execute("UPDATE nsjms_owner SET node_id = %s, since = clock_timestamp() WHERE kind = %s AND object_id = %s",
                 (to, *obj))
    return True


def owner_of(conn: Conn, obj: Object) -> str | None:
    row = conn.execute("SELECT node_id FROM nsjms_owner WHERE kind = %s AND object_id = %s", obj).fetchone()
    return str(row[0]) if row else None


def owned(conn: Conn, node_id: str) -> list[Object]:
    rows = conn.execute("SELECT kind, object_id FROM nsjms_owner WHERE node_id = %s ORDER BY kind, object_id",
                        (node_id,)).fetchall()
    return [(str(k), int(i)) for k, i in rows]


def loads(conn: Conn) -> dict[str, int]:
    """Objects owned per node (nodes owning nothing are absent)."""
    return {str(n): int(c) for n, c in
            conn.execute("SELECT node_id, count(*) FROM nsjms_owner GROUP BY node_id").fetchall()}
