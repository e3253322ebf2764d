"""Where channels go: the decisions of drain, rebalance and least-loaded placement, free of I/O (the PostgreSQL side
is :mod:`router.cluster.handoff`; docs/cluster.md, "Placement and operations").

The unit that moves is a **channel with its bridges** (a bridge talks to its channel in-process). A node's **load**
is the number of objects it owns, channels and bridges counted alike (``nsjms_owner`` rows): a plain count, not
events per second; a busy channel and an idle one weigh the same. A unit weighs 1 + its bridges.

Assignment is **sticky**: nothing here runs by itself on a lease blip. A channel moves only when an operator drains
its node or asks for a rebalance, when its node dies (the takeover), right after its creation when
``cluster.placement = "least-loaded"`` names another node, or once when a node joins with
``cluster.rebalance_on_join`` (its share, :func:`join_moves`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["drain_moves", "join_moves", "least_loaded", "rebalance_moves"]


def least_loaded(loads: Mapping[str, int], candidates: Sequence[str]) -> str | None:
    """The candidate owning the fewest objects (ties by node id); None without a candidate."""
    if not candidates:
        return None
    return min(candidates, key=lambda n: (loads.get(n, 0), n))


def drain_moves(units: Mapping[int, int], loads: Mapping[str, int], targets: Sequence[str]) -> dict[int, str]:
    """Where each channel of a drained node goes: ``units`` (channel id -> weight, 1 + its bridges) to the
    ``targets`` (live members, not draining), heaviest first (then by id), each to the least loaded target at its
    turn (``loads``: what each target owns already)."""
    if not units:
        return {}
    if not targets:
        raise ValueError("no live member to take the drained node's channels")
    load = {n: loads.get(n, 0) for n in targets}
    out: dict[int, str] = {}
    for cid, weight in sorted(units.items(), key=lambda kv: (-kv[1], kv[0])):
        to = min(targets, key=lambda n: (load[n], n))
        out[cid] = to
        load[to] += weight
    return out


def rebalance_moves(units: Mapping[str, Mapping[int, int]], live: Sequence[str],
                    fixed: Mapping[str, int] | None = None) -> list[tuple[int, str, str]]:
    """The moves (channel, from, to) that even the live members' loads out: repeatedly, a unit of the most loaded
    member moves to the least loaded one when that narrows their gap (its weight is below the gap), the unit whose
    weight is nearest half the gap (then the lowest id); each channel moves at most once. Stops when no move helps:
    loads that differ by less than the lightest unit stay as they are (no churn for a difference of one).
    ``units``: node -> (channel id -> weight) of every live member (members owning nothing may be absent) that may
    move; ``fixed``: load that counts but does not move (channels already being moved, at their destination)."""
    load = {n: (fixed or {}).get(n, 0) + sum(units.get(n, {}).values()) for n in live}
    held = {n: dict(units.get(n, {})) for n in live}
    moved: set[int] = set()
    out: list[tuple[int, str, str]] = []
    while len(live) > 1:
        hi = max(live, key=lambda n: (load[n], n))
        lo = min(live, key=lambda n: (load[n], n))
        gap = load[hi] - load[lo]
        fits = [(cid, w) for cid, w in held[hi].items() if cid not in moved and 0 < w < gap]
        if not fits:
            break
        cid, w = min(fits, key=lambda cw: (abs(2 * cw[1] - gap), cw[0]))
        out.append((cid, hi, lo))
        moved.add(cid)
        del held[hi][cid]
        held[lo][cid] = w
        load[hi] -= w
        load[lo] += w
    return out


def join_moves(units: Mapping[str, Mapping[int, int]], live: Sequence[str], joiner: str,
               fixed: Mapping[str, int] | None = None) -> list[tuple[int, str, str]]:
    """The share of a node that has just joined: the moves (channel, from, to ``joiner``) of :func:`rebalance_moves`
    with the joiner always the receiving end, so only as many channels move as bring it level with the others, and
    no channel moves between the other members. Repeatedly, from the most loaded member that has a unit lighter than
    its gap to the joiner, the unit whose weight is nearest half that gap (then the lowest id); each channel at most
    once. ``units``, ``fixed``: as for :func:`rebalance_moves`; nothing when the joiner is not in ``live``."""
    if joiner not in live:
        return []
    load = {n: (fixed or {}).get(n, 0) + sum(units.get(n, {}).values()) for n in live}
    held = {n: dict(units.get(n, {})) for n in live}
    out: list[tuple[int, str, str]] = []
    while True:
        best: tuple[int, int, str] | None = None
        for hi in sorted((n for n in live if n != joiner), key=lambda n: (-load[n], n)):
            gap = load[hi] - load[joiner]
            fits = [(cid, w) for cid, w in held[hi].items() if 0 < w < gap]
            if fits:
                cid, w = min(fits, key=lambda cw: (abs(2 * cw[1] - gap), cw[0]))
                best = (cid, w, hi)
                break
        if best is None:
            return out
        cid, w, hi = best
        out.append((cid, hi, joiner))
        del held[hi][cid]
        load[hi] -= w
        load[joiner] += w
