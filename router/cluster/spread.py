"""A dead node's work spread over the survivors, in PostgreSQL (migration 0012; docs/cluster.md, "Takeover").

The survivor that fences a dead node (:func:`claim_spread`) assigns, **in the fence's transaction**, each channel the
dead node owned (with its bridges: the unit that moves together) to a live member that is not being drained, least
loaded first (:func:`router.cluster.placement.drain_moves`: heaviest unit first, each to the least loaded member at
its turn, the fencer included). Every ownership row moves at once (read ``FOR UPDATE`` first, as a claim does), so no
object is ever unowned or owned by two nodes. A channel assigned to the fencer is loaded by it after the recovery,
as before; a channel assigned to another survivor gets a row of ``nsjms_handoff`` (reason ``takeover``, state
``claimed``): its new owner does not load it yet.

Then the fencer finishes the dead node's routing transactions from PostgreSQL (``recover_fenced``) and
:func:`release_recovered` turns those rows ``released``: each survivor loads its share at its next period with the
hand-off's start path (:func:`router.cluster.handoff.released_to`). So the dead node's in-doubt transactions are
finished once, by the fencer, before the moved work resumes on anyone. When the fencer dies before it released
them, the node that finishes the dead node's recovery in its place (:func:`router.cluster.takeover.to_recover`)
releases them; a row whose dead node has rejoined meanwhile (its own restart recovers its transactions) is released
at the next pass of any node. A survivor that dies holding a ``claimed`` share is taken over like any member: its
takeover claims those channels and fails their rows.

Sticky: nothing here runs on a lease blip. A member whose renewal is late but within ``expiry_s`` is live; only an
expired, departed or fenced member's work moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from router.cluster import members as M
from router.cluster.handoff import live_targets, units
from router.cluster.ownership import Owned
from router.cluster.placement import drain_moves

__all__ = ["Spread", "claim_spread", "release_recovered"]

Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class Spread:
    """One takeover's outcome: the dead node's new epoch, what the fencer loads itself (``mine``), and what each
    other survivor was given (``others``: node -> channels with their bridges), each loaded once released."""

    epoch: int
    mine: Owned
    others: dict[str, Owned] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.mine) or any(self.others.values())


def claim_spread(conn: Conn, dead: str, by: str, by_epoch: int) -> Spread:
    """The takeover of ``dead`` by ``by`` in ONE transaction (the caller's): fence it (refused unless its lease
    expired or it left: :class:`~router.cluster.errors.NotExpired`), assign each of its channels with its bridges to
    the least loaded live member not being drained (``by`` when no one else is), move the ownership rows, and record
    the other survivors' shares as ``claimed`` hand-offs. Ends the dead node's open hand-offs, as
    :func:`router.cluster.ownership.claim_all` does."""
    new_epoch = M.fence(conn, dead, by, by_epoch)
    rows: Sequence[tuple[Any, ...]] = conn.execute(
        "SELECT kind, object_id FROM nsjms_owner WHERE node_id = %s ORDER BY kind, object_id FOR UPDATE",
        (dead,)).fetchall()
    theirs = units(conn).get(dead, {})
    targets = live_targets(conn, exclude=[dead]) or [by]
    loads = {n: c for n, c in M.loads(conn).items() if n != dead}
    plan = drain_moves(theirs, loads, targets)
    # the dead node's open moves end (see claim_all): one it was to make, or to start (claimed, requested, released);
    # first, so that a share recorded below is the channel's only open move (the unique index nsjms_handoff_open)
    conn.execute("UPDATE nsjms_handoff SET state = 'failed', error = %s WHERE (from_node = %s AND state = 'requested') "
                 "OR (to_node = %s AND state IN ('claimed', 'requested', 'released'))",
                 (f"node {dead} was taken over by {by}", dead, dead))
    given: dict[str, tuple[list[int], list[int]]] = {}
    moved: set[tuple[str, int]] = set()
    for cid, to in sorted(plan.items()):
        bridges = [int(r[0]) for r in conn.execute(
            "SELECT id FROM nsjms_bridge WHERE channel_id = %s ORDER BY id", (cid,)).fetchall()]
        M.claim(conn, ("channel", cid), dead, to)
        moved.add(("channel", cid))
        for bid in bridges:
            M.claim(conn, ("bridge", bid), dead, to)
            moved.add(("bridge", bid))
        chans, brs = given.setdefault(to, ([], []))
        chans.append(cid)
        brs.extend(bridges)
        if to != by:
            conn.execute("INSERT INTO nsjms_handoff (channel_id, from_node, from_epoch, to_node, reason, state, "
                         "bridges) VALUES (%s, %s, %s, %s, 'takeover', 'claimed', %s)",
                         (cid, dead, new_epoch, to, bridges))
    for kind, oid in rows:                    # rows of no existing channel's unit (destroyed objects): the fencer's
        if (str(kind), int(oid)) not in moved:
            M.claim(conn, (str(kind), int(oid)), dead, by)
    shares = {n: Owned(tuple(sorted(c)), tuple(sorted(b))) for n, (c, b) in given.items()}
    mine = shares.pop(by, Owned())
    return Spread(new_epoch, mine, shares)


def release_recovered(conn: Conn, recovered: Sequence[str]) -> list[tuple[int, str]]:
    """After the recovery of the fenced nodes ``recovered`` ran: their ``claimed`` shares become ``released`` (their
    new owners load them at their next period), and so do the shares of dead nodes that rejoined meanwhile (a
    restarted node recovers its own transactions). Returns (channel, new owner) of each row released."""
    return [(int(c), str(t)) for c, t in conn.execute(
        "UPDATE nsjms_handoff h SET state = 'released', released_at = clock_timestamp() "
        "WHERE h.state = 'claimed' AND (h.from_node = ANY(%s) OR NOT EXISTS (SELECT 1 FROM nsjms_member m "
        "WHERE m.node_id = h.from_node AND m.state = 'fenced')) RETURNING h.channel_id, h.to_node",
        (list(recovered),)).fetchall()]
