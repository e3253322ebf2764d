"""The node's part in a cluster (router/cluster, docs/cluster.md): its membership and lease, the fence check every
unit of work runs before its COMMIT, what it owns at start, and the takeover of a dead member's channels, bridges and
routing transactions. A mixin of :class:`router.server.Node`, which composes the parts it names (``db``, ``t2``,
``factory``, ``bridges``, ``runtime``); kept apart so the node's composition root says one thing."""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger("nsjms.server")

__all__ = ["ClusterRole"]


class ClusterRole:
    """Membership, fencing and takeover for :class:`router.server.Node` (its attributes are the node's)."""

    s: Any
    db: Any
    t2: Any
    factory: Any
    bridges: Any
    runtime: Any
    membership: Any
    takeover: Any
    fenced: bool
    _stopped: threading.Event

    def _join_cluster(self) -> None:
        """This incarnation's membership row and lease (router/cluster, docs/cluster.md), renewed in the background;
        a renewal that finds the node fenced ends :meth:`wait` (``serve`` then exits 1 and is started again)."""
        from router.cluster.lease import LeaseSettings
        from router.cluster.node import Membership
        from router.lifecycle import write_private

        self.membership = Membership(self.db, self.s.node_id, f"{self.s.orb_host}:{self.s.orb_port}",
                                     self.s.state_dir, LeaseSettings(self.s.cluster_renew_s, self.s.cluster_expiry_s),
                                     self._fenced, write_private=write_private)
        self.membership.join()
        self.membership.start()
        self.db.fence = self._fence_check    # every unit of work of this node checks its epoch (docs/cluster.md)

    def _live_epoch(self) -> int | None:
        m = self.membership
        return None if m is None or m.fenced or m.epoch is None else int(m.epoch)

    def _fence_check(self, conn: Any) -> None:
        """The fence check run last, before the COMMIT, in each of this node's units of work (not its T2 branches: a
        prepared branch must hold no lock a takeover waits for; T2 is fenced at its decision). A fenced node's write
        is refused as a :class:`router.db.StoreError` (its callers keep the work and retry; the node is stopping)."""
        from router.cluster import members as M
        from router.cluster.errors import Fenced
        from router.db import StoreError

        if self.membership is not None and self.membership.is_leave(conn):
            return                                       # its own leave (the last write of a clean stop), only it
        epoch = self._live_epoch()
        try:
            if epoch is None:
                raise Fenced(f"node {self.s.node_id!r} is fenced", self.s.node_id)
            M.check(conn, self.s.node_id, epoch)
        except Fenced as exc:
            if self.membership is not None:
                self.membership.notice_fenced(exc)       # the node stops (serve exits 1 and is started again)
            raise StoreError(f"write refused: {exc}") from exc

    def _owned_at_start(self) -> Any:
        """What this node restores: the channels (and their bridges) it owns, after adopting those nobody owns (a
        database of an earlier version, or of a single node)."""
        from router.cluster.local import LocalOwner
        from router.cluster.ownership import adopt_unowned

        epoch = self._live_epoch()
        assert epoch is not None
        with self.db.unit_of_work() as conn:
            owned = adopt_unowned(conn, self.s.node_id, epoch)
        self.runtime.owner = LocalOwner(self.s.node_id, self._live_epoch)
        log.info("cluster: node %s owns channels %s and bridges %s", self.s.node_id, list(owned.channels),
                 list(owned.bridges))
        return owned

    def _start_takeover(self) -> None:
        from router.cluster.takeover import Takeover

        self.takeover = Takeover(self.db, self.s.node_id, self._live_epoch, self.s.cluster_renew_s,
                                 start=self._take_over, recover=self._recover_dead,
                                 claimed=lambda owned: self.factory.arrive(owned.channels))
        self.takeover.start()

    def _take_over(self, owned: Any) -> None:
        """Start what this node claimed from a dead one: its bridges' servants first (the channel's dispatchers push
        to them at once), then the channels with their queues, then the bridges that were started. Idempotent over
        ``owned`` (a failed start is retried with the same ids, router/cluster/takeover.py): what is loaded already is
        not loaded again, and every claimed bridge is repointed and resumed, not only those this call made."""
        ids = set(owned.bridges)
        self.bridges.restore(ids)
        for bid in sorted(ids):                          # their channel proxies' clients were the old node's
            bridge = self.bridges.bridges.get(bid)
            if bridge is not None:
                bridge.repoint_stored_proxy()
        self.factory.adopt(set(owned.channels))
        self.bridges.resume(ids)

    def _recover_dead(self, dead: str) -> None:
        """Finish a fenced node's routing transactions from PostgreSQL (router/cluster/decisions.py)."""
        if self.t2 is not None:
            self.t2.recover_fenced(dead)

    def _fenced(self) -> None:
        self.fenced = True
        self._stopped.set()

    def _cluster_status(self) -> dict[str, Any]:
        if self.membership is None:
            return {}
        out: dict[str, Any] = self.membership.status()
        out["owned"] = {"channels": sorted(self.factory.channels) if self.factory is not None else [],
                        "bridges": sorted(self.bridges.bridges) if self.bridges is not None else []}
        out["takeovers"] = self.takeover.status() if self.takeover is not None else []
        fwd = getattr(self.runtime, "forwarder", None)          # requests for objects other nodes run (forward.py)
        out["forwarding"] = {"forwarded": fwd.forwarded, "retried": fwd.retried} if fwd is not None else {}
        return out
