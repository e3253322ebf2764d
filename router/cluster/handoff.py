"""Drain-and-handoff in PostgreSQL (tables of migration 0010; the decisions are :mod:`router.cluster.placement`,
the node's part :mod:`router.cluster.release`; docs/cluster.md, "Placement and operations").

A move of a channel (with its bridges) is a row of ``nsjms_handoff``:

1. ``requested`` (:func:`request_drain`, :func:`request_rebalance`, :func:`request_placement`): for the owner's
   current incarnation (``from_epoch``);
2. the owner, at its next renewal period, finishes the routing transactions in flight on the channel and stops it
   and its bridges (nothing of them runs there any more), then :func:`release`: in ONE transaction with its fence
   check, the ownership rows of the channel and its bridges move to the target and the row is ``released``;
3. the target, at its next period, loads them from PostgreSQL and starts them, as a takeover does
   (:func:`released_to`, :func:`mark_started`).

Never two nodes at once: the old owner has stopped before its release commits, the new one loads only after.
Every function takes a connection inside a transaction its caller opened.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from router.cluster import members as M
from router.cluster.errors import ClusterError
from router.cluster.ownership import Owned, owned_by
from router.cluster.placement import drain_moves, join_moves, least_loaded, rebalance_moves
from router.cluster.report import xid_gtrid, xid_node

__all__ = ["DrainState", "HandOff", "HandOffRefused", "channel_unit", "drain_state", "draining", "fail",
           "is_draining", "live_targets", "mark_started", "moves_of", "open_from", "place_new", "release",
           "released_to", "report_in_doubt", "request_drain", "request_join", "request_rebalance", "units"]

Conn = psycopg.Connection[Any]

_COLS = ("id, channel_id, from_node, from_epoch, to_node, reason, state, bridges, requested_at, released_at, "
         "started_at, stop_s, error")


class HandOffRefused(ClusterError):
    """A drain or rebalance request was refused (the node is not a live member, no other live member can take its
    channels); nothing was written."""


@dataclass(frozen=True)
class HandOff:
    """One row of ``nsjms_handoff``."""

    id: int
    channel_id: int
    from_node: str
    from_epoch: int
    to_node: str
    reason: str
    state: str
    bridges: tuple[int, ...]
    requested_at: datetime
    released_at: datetime | None
    started_at: datetime | None
    stop_s: float | None
    error: str | None

    def as_dict(self) -> dict[str, Any]:
        took = (self.started_at - self.requested_at).total_seconds() if self.started_at else None
        return {"id": self.id, "channel": self.channel_id, "bridges": list(self.bridges), "from": self.from_node,
                "to": self.to_node, "reason": self.reason, "state": self.state, "error": self.error,
                "stop_s": None if self.stop_s is None else round(self.stop_s, 3),
                "handoff_s": None if took is None else round(took, 3)}


def _row(r: Sequence[Any]) -> HandOff:
    return HandOff(int(r[0]), int(r[1]), str(r[2]), int(r[3]), str(r[4]), str(r[5]), str(r[6]),
                   tuple(int(b) for b in (r[7] or ())), r[8], r[9], r[10], r[11], r[12])


def draining(conn: Conn) -> set[str]:
    """Members being drained in their current incarnation."""
    return {str(r[0]) for r in conn.execute(
        "SELECT d.node_id FROM nsjms_drain d JOIN nsjms_member m ON m.node_id = d.node_id AND m.epoch = d.epoch"
    ).fetchall()}


def live_targets(conn: Conn, exclude: Sequence[str] = ()) -> list[str]:
    """Live members (lease not expired) that are not being drained, minus ``exclude``, by node id."""
    drained = draining(conn)
    return [m.node_id for m in M.members(conn)
            if m.live and m.node_id not in drained and m.node_id not in exclude]


def units(conn: Conn) -> dict[str, dict[int, int]]:
    """node -> (channel id -> 1 + its bridges) for every owned, existing channel."""
    out: dict[str, dict[int, int]] = {}
    for node, cid, nb in conn.execute(
            "SELECT o.node_id, c.id, (SELECT count(*) FROM nsjms_bridge b WHERE b.channel_id = c.id) "
            "FROM nsjms_channel c JOIN nsjms_owner o ON o.kind = 'channel' AND o.object_id = c.id").fetchall():
        out.setdefault(str(node), {})[int(cid)] = 1 + int(nb)
    return out


def _open_channels(conn: Conn) -> set[int]:
    return {int(r[0]) for r in conn.execute(
        "SELECT channel_id FROM nsjms_handoff WHERE state IN ('claimed', 'requested', 'released')").fetchall()}


def _insert(conn: Conn, cid: int, frm: str, epoch: int, to: str, reason: str) -> HandOff | None:
    """A move requested; None when the channel already has an open one (two requests at once, e.g. an operator's
    drain and the drained node's own pass: the first one's move stands)."""
    row = conn.execute(f"INSERT INTO nsjms_handoff (channel_id, from_node, from_epoch, to_node, reason) "
                       f"VALUES (%s, %s, %s, %s, %s) ON CONFLICT (channel_id) WHERE state IN ('requested', "
                       f"'released') DO NOTHING RETURNING {_COLS}", (cid, frm, epoch, to, reason)).fetchone()
    return None if row is None else _row(row)


def _inserted(moves: Sequence[HandOff | None]) -> list[HandOff]:
    return [m for m in moves if m is not None]


def _live_epoch(conn: Conn, node: str) -> int:
    for m in M.members(conn):
        if m.node_id == node:
            if not m.live:
                raise HandOffRefused(f"node {node!r} is not a live member (state {m.state}, lease "
                                     f"{m.lease_left_s:.1f} s left): nothing to drain; a dead node's work is taken "
                                     "over by the survivors", node)
            return m.epoch
    raise HandOffRefused(f"node {node!r} is not a member of this cluster", node)


def request_drain(conn: Conn, node: str) -> tuple[int, list[HandOff]]:
    """Mark ``node`` draining (this incarnation) and request the move of each channel it owns to the least loaded
    other live member. Returns (its epoch, the moves requested now). Refused (:class:`HandOffRefused`) when
    ``node`` is not live or no other live member can take its channels. A channel already being moved keeps its
    move. The member row is read ``FOR KEY SHARE`` (a takeover of ``node`` waits for this request, or this
    request sees it fenced)."""
    conn.execute("SELECT 1 FROM nsjms_member WHERE node_id = %s FOR KEY SHARE", (node,))
    epoch = _live_epoch(conn, node)
    all_units = units(conn)
    mine = {cid: w for cid, w in all_units.get(node, {}).items() if cid not in _open_channels(conn)}
    targets = live_targets(conn, exclude=[node])
    if mine and not targets:
        raise HandOffRefused(f"no other live member to take node {node!r}'s channels: start another node first",
                             node)
    conn.execute("INSERT INTO nsjms_drain (node_id, epoch) VALUES (%s, %s) ON CONFLICT (node_id) DO UPDATE "
                 "SET epoch = EXCLUDED.epoch, in_doubt = NULL, reported_at = NULL, requested_at = clock_timestamp() "
                 "WHERE nsjms_drain.epoch <> EXCLUDED.epoch", (node, epoch))
    loads = {n: sum(u.values()) for n, u in all_units.items()}
    return epoch, _inserted([_insert(conn, cid, node, epoch, to, "drain")
                             for cid, to in sorted(drain_moves(mine, loads, targets).items())])


def request_rebalance(conn: Conn) -> list[HandOff]:
    """Request the moves that even out the loads of the live members that are not draining
    (:func:`router.cluster.placement.rebalance_moves`); channels already being moved are left out."""
    live = {m.node_id: m.epoch for m in M.members(conn) if m.live}
    targets = live_targets(conn)
    busy = {int(c): str(t) for c, t in conn.execute(
        "SELECT channel_id, to_node FROM nsjms_handoff WHERE state IN ('claimed', 'requested', 'released')").fetchall()}
    owned = units(conn)
    fixed: dict[str, int] = {}
    for u in owned.values():
        for cid, w in u.items():
            if cid in busy:                                   # counted where it is going, never moved again
                fixed[busy[cid]] = fixed.get(busy[cid], 0) + w
    movable = {n: {c: w for c, w in u.items() if c not in busy} for n, u in owned.items() if n in targets}
    return _inserted([_insert(conn, cid, frm, live[frm], to, "rebalance")
                      for cid, frm, to in rebalance_moves(movable, targets, fixed)])


#: The key of the transaction-level advisory lock that serialises the join requests (two nodes joining at once each
#: see the other's requested moves, counted at their destination): a lock of one transaction, not of a session.
JOIN_LOCK = 7715012


def request_join(conn: Conn, node: str) -> list[HandOff]:
    """``cluster.rebalance_on_join``: the moves that give ``node``, which has just joined, its share
    (:func:`router.cluster.placement.join_moves`): only channels moving to it, from the most loaded live members
    that are not draining, as many as bring it level; channels already being moved stay out and count where they go.
    Nothing when ``node`` is not a live member or is draining."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (JOIN_LOCK,))
    live = {m.node_id: m.epoch for m in M.members(conn) if m.live}
    targets = live_targets(conn)
    busy = {int(c): str(t) for c, t in conn.execute(
        "SELECT channel_id, to_node FROM nsjms_handoff WHERE state IN ('claimed', 'requested', 'released')").fetchall()}
    owned = units(conn)
    fixed: dict[str, int] = {}
    for u in owned.values():
        for cid, w in u.items():
            if cid in busy:
                fixed[busy[cid]] = fixed.get(busy[cid], 0) + w
    movable = {n: {c: w for c, w in u.items() if c not in busy} for n, u in owned.items() if n in targets}
    return _inserted([_insert(conn, cid, frm, live[frm], to, "join")
                      for cid, frm, to in join_moves(movable, targets, node, fixed)])


def place_new(conn: Conn, cid: int, creator: str, epoch: int) -> HandOff | None:
    """Least-loaded placement of a channel ``creator`` has just created (in the creating transaction): when another
    live member owns fewer objects than the creator, a move to it is requested (the creator hands the new channel
    over at its next period). None when the creator is the least loaded."""
    loads = M.loads(conn)
    to = least_loaded(loads, live_targets(conn))
    if to is None or to == creator or loads.get(to, 0) >= loads.get(creator, 0) - 1:
        return None
    return _insert(conn, cid, creator, epoch, to, "placement")


def open_from(conn: Conn, node: str, epoch: int) -> list[HandOff]:
    """The moves ``node`` (this incarnation) has still to release, oldest first."""
    return [_row(r) for r in conn.execute(
        f"SELECT {_COLS} FROM nsjms_handoff WHERE from_node = %s AND from_epoch = %s AND state = 'requested' "
        "ORDER BY id", (node, epoch)).fetchall()]


def release(conn: Conn, h: HandOff, node: str, epoch: int, stop_s: float) -> HandOff:
    """The old owner's release, in ONE transaction: its fence check, the move row still ``requested``, the target
    still a live member not draining (else the least loaded other one; none: the move ``failed`` and the channel
    stays), the ownership rows of the channel and its bridges (each ``FOR UPDATE``) moved to it. Returns the row as
    written. The caller has stopped the channel and its bridges first."""
    M.check(conn, node, epoch)
    row = conn.execute(f"SELECT {_COLS} FROM nsjms_handoff WHERE id = %s FOR UPDATE", (h.id,)).fetchone()
    if row is None or _row(row).state != "requested":
        raise HandOffRefused(f"hand-off {h.id} is no longer requested", node)
    targets = live_targets(conn, exclude=[node])
    to = h.to_node if h.to_node in targets else least_loaded(M.loads(conn), targets)
    if to is None:
        return fail(conn, h.id, "no live member to take the channel: it stays here")
    bridges = [int(r[0]) for r in conn.execute(
        "SELECT id FROM nsjms_bridge WHERE channel_id = %s ORDER BY id", (h.channel_id,)).fetchall()]
    if not M.claim(conn, ("channel", h.channel_id), node, to):
        return fail(conn, h.id, f"channel {h.channel_id} is not owned by {node} any more")
    for bid in bridges:
        M.claim(conn, ("bridge", bid), node, to)
    out = conn.execute(f"UPDATE nsjms_handoff SET state = 'released', to_node = %s, bridges = %s, "
                       f"released_at = clock_timestamp(), stop_s = %s WHERE id = %s RETURNING {_COLS}",
                       (to, bridges, stop_s, h.id)).fetchone()
    assert out is not None
    return _row(out)


def channel_unit(conn: Conn, cid: int) -> Owned:
    """Channel ``cid`` with its bridges, as :class:`~router.cluster.ownership.Owned`."""
    bridges = [int(r[0]) for r in conn.execute(
        "SELECT id FROM nsjms_bridge WHERE channel_id = %s ORDER BY id", (cid,)).fetchall()]
    return Owned((cid,), tuple(bridges))


def fail(conn: Conn, hid: int, error: str) -> HandOff:
    out = conn.execute(f"UPDATE nsjms_handoff SET state = 'failed', error = %s WHERE id = %s RETURNING {_COLS}",
                       (error, hid)).fetchone()
    assert out is not None
    return _row(out)


def released_to(conn: Conn, node: str) -> list[HandOff]:
    """The moves released to ``node`` that it has still to start, oldest first: only those whose channel ``node``
    still owns (a takeover may have moved it on meanwhile; :func:`router.cluster.ownership.claim_all` also ends
    them)."""
    cols = ", ".join(f"h.{c.strip()}" for c in _COLS.split(","))
    return [_row(r) for r in conn.execute(
        f"SELECT {cols} FROM nsjms_handoff h JOIN nsjms_owner o ON o.kind = 'channel' AND o.object_id = h.channel_id "
        "AND o.node_id = h.to_node WHERE h.to_node = %s AND h.state = 'released' ORDER BY h.id",
        (node,)).fetchall()]


def mark_started(conn: Conn, ids: Sequence[int]) -> None:
    conn.execute("UPDATE nsjms_handoff SET state = 'started', started_at = clock_timestamp() "
                 "WHERE id = ANY(%s) AND state = 'released'", (list(ids),))


def is_draining(conn: Conn, node: str, epoch: int) -> bool:
    return conn.execute("SELECT 1 FROM nsjms_drain WHERE node_id = %s AND epoch = %s",
                        (node, epoch)).fetchone() is not None


def report_in_doubt(conn: Conn, node: str, epoch: int, in_doubt: list[dict[str, Any]]) -> None:
    """A drained node's routing transactions still in doubt in its own log (gtrid, status, safe action)."""
    conn.execute("UPDATE nsjms_drain SET in_doubt = %s::jsonb, reported_at = clock_timestamp() "
                 "WHERE node_id = %s AND epoch = %s", (json.dumps(in_doubt), node, epoch))


@dataclass(frozen=True)
class DrainState:
    """What ``nsjms cluster drain`` reports: the moves, the node's state, and what it leaves in doubt."""

    node_id: str
    epoch: int
    live: bool                        # the node is still the live member of that epoch
    moves: list[HandOff]
    owns: Owned                       # what it still owns
    reported: bool                    # its in-doubt report is newer than its last release
    in_doubt: list[dict[str, Any]]    # from its log: gtrid, status, action
    prepared: list[str]               # prepared branches of its xids in PostgreSQL ("gtrid (gid ...)")
    decided: list[str]                # its decision rows a survivor would have to finish (gtrids)

    @property
    def finished(self) -> bool:
        return all(m.state in ("started", "failed") for m in self.moves)

    @property
    def heuristic(self) -> list[str]:
        return sorted(str(t["gtrid"]) for t in self.in_doubt if str(t.get("status", "")).startswith("heuristic"))

    def verdict(self) -> str:
        """clean | dirty | heuristic | failed (a move failed, or the node is gone)."""
        if not self.live or any(m.state == "failed" for m in self.moves) or self.owns:
            return "failed"
        if self.heuristic:
            return "heuristic"
        if self.in_doubt or self.prepared or self.decided:
            return "dirty"
        return "clean"

    def as_dict(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "epoch": self.epoch, "live": self.live, "result": self.verdict(),
                "moves": [m.as_dict() for m in self.moves],
                "still_owns": {"channels": list(self.owns.channels), "bridges": list(self.owns.bridges)},
                "in_doubt": self.in_doubt, "heuristic": self.heuristic, "prepared": self.prepared,
                "decided": self.decided}


def drain_state(conn: Conn, node: str, epoch: int, ids: Sequence[int] | None = None) -> DrainState:
    """The state of ``node``'s drain as ``nsjms cluster drain`` reports it; ``ids``: its moves (None: every drain move
    of this incarnation, those the node requested itself for what it took over meanwhile included)."""

    live = any(m.node_id == node and m.epoch == epoch and m.live for m in M.members(conn))
    if ids is None:
        ids = [int(r[0]) for r in conn.execute(
            "SELECT id FROM nsjms_handoff WHERE from_node = %s AND from_epoch = %s AND reason = 'drain'",
            (node, epoch)).fetchall()]
    moves = moves_of(conn, ids)
    row = conn.execute("SELECT in_doubt, reported_at FROM nsjms_drain WHERE node_id = %s AND epoch = %s",
                       (node, epoch)).fetchone()
    last = max((m.released_at for m in moves if m.released_at is not None), default=None)
    reported = row is not None and row[1] is not None and (last is None or row[1] > last)
    prepared = sorted(f"{xid_gtrid(str(g))} (gid {g})" for (g,) in conn.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()").fetchall()
        if xid_node(str(g)) == node)
    decided = sorted(str(g) for (g,) in conn.execute(
        "SELECT gtrid FROM nsjms_decision WHERE node_id = %s", (node,)).fetchall())
    return DrainState(node, epoch, live, moves, owned_by(conn, node), reported,
                      list(row[0] or []) if row is not None else [], prepared, decided)


def moves_of(conn: Conn, ids: Sequence[int]) -> list[HandOff]:
    """The rows ``ids``, by id (what a drain or rebalance requested, as they are now)."""
    return [_row(r) for r in conn.execute(f"SELECT {_COLS} FROM nsjms_handoff WHERE id = ANY(%s) ORDER BY id",
                                          (list(ids),)).fetchall()]
