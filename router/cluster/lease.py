"""The cluster's decisions, free of I/O (the PostgreSQL side is :mod:`router.cluster.members`).

Times come from PostgreSQL's clock (one clock for every node): the functions here take ``now`` as an argument.
Defaults follow ActiveMQ Artemis's JDBC lease (renewed every 2 s, expiring after 20 s): a node is declared dead
only after ten missed renewals, so a GC pause or a slow disk is not a takeover.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

__all__ = ["LeaseSettings", "MemberView", "Object", "claims", "expired", "owner_for_new"]

Object = tuple[str, int]          # (kind, object_id): ("channel", 3), ("bridge", 7)


@dataclass(frozen=True)
class LeaseSettings:
    """``renew_s``: how often a node renews its lease; ``expiry_s``: how long a lease lasts from its last renewal."""

    renew_s: float = 2.0
    expiry_s: float = 20.0

    def __post_init__(self) -> None:
        if self.renew_s <= 0 or self.expiry_s < 3 * self.renew_s:
            raise ValueError(f"cluster lease: need renew_s > 0 and expiry_s >= 3 x renew_s (a lease must survive two "
                             f"missed renewals), got renew_s={self.renew_s}, expiry_s={self.expiry_s}")


@dataclass(frozen=True)
class MemberView:
    """One row of ``nsjms_member`` as read at ``now`` (PostgreSQL's clock)."""

    node_id: str
    epoch: int
    state: str                    # live | fenced | left
    address: str
    lease_until: datetime
    renewed_at: datetime
    now: datetime

    @property
    def lease_left_s(self) -> float:
        return (self.lease_until - self.now).total_seconds()

    @property
    def live(self) -> bool:
        """Live and its lease not expired."""
        return self.state == "live" and self.lease_until > self.now


def expired(members: Iterable[MemberView]) -> list[str]:
    """The node ids whose work a survivor may take over: live members whose lease expired, and members that left
    (a graceful stop needs no waiting), sorted."""
    return sorted(m.node_id for m in members
                  if (m.state == "live" and m.lease_until <= m.now) or m.state == "left")


def owner_for_new(loads: Mapping[str, int], live: Sequence[str]) -> str:
    """The live node that gets a new channel or bridge: the least loaded (objects owned), ties by node id."""
    if not live:
        raise ValueError("no live node to own a new object")
    return min(live, key=lambda n: (loads.get(n, 0), n))


def claims(objects: Iterable[Object], loads: Mapping[str, int], survivors: Sequence[str]) -> dict[Object, str]:
    """Spread a dead node's ``objects`` over the ``survivors``, each to the least loaded at its turn (``loads``:
    what each survivor owns already), in a deterministic order (by kind, then id), whatever order they come in."""
    if not survivors:
        raise ValueError("no survivor to claim the objects")
    load = {n: loads.get(n, 0) for n in survivors}
    out: dict[Object, str] = {}
    for obj in sorted(objects):
        owner = min(survivors, key=lambda n: (load[n], n))
        out[obj] = owner
        load[owner] += 1
    return out
