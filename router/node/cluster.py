"""The node's part in a cluster (router/cluster, docs/cluster.md): its membership and lease, the fence check every
unit of work runs before its COMMIT, what it owns at start, and the takeover of a dead member's channels, bridges and
routing transactions. A mixin of :class:`router.node.server.Node`, which composes the parts it names (``db``, ``t2``,
``factory``, ``bridges``, ``runtime``); kept apart so the node's composition root says one thing."""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import Any

from router.channel.loading import LoadFailed

log = logging.getLogger("nsjms.server")

__all__ = ["HANDOFF_STOP_S", "ClusterRole", "published_address"]

#: How long a hand-off waits for a channel's and its bridges' work in flight to end (a push's own call timeout is
#: 10 s; a routing transaction's phase two is bounded likewise); what has not ended is waited for again at the next
#: renewal period, and the channel is released only once nothing of it runs here.
HANDOFF_STOP_S = 30.0


def published_address(endpoint_publish: str, orb_host: str, orb_port: int) -> str:
    """``host:port`` of a single ``giop:tcp:HOST:PORT`` endpoint (``[v6]`` kept), else ``orb_host:orb_port``."""
    m = re.fullmatch(r"giop:tcp:(\[[0-9A-Fa-f:.]+\]|[^:,\s]+):(\d{1,5})", endpoint_publish.strip())
    if m is not None and 0 < int(m.group(2)) < 65536:
        return f"{m.group(1)}:{m.group(2)}"
    return f"{orb_host}:{orb_port}"


class ClusterRole:
    """Membership, fencing and takeover for :class:`router.node.server.Node` (its attributes are the node's)."""

    s: Any
    db: Any
    t2: Any
    factory: Any
    bridges: Any
    runtime: Any
    membership: Any
    incarnation: str | None
    takeover: Any
    fenced: bool
    _stopped: threading.Event

    def _join_cluster(self) -> None:
        """This incarnation's membership row and lease (router/cluster, docs/cluster.md), renewed in the background;
        a renewal that finds the node fenced ends :meth:`wait` (``serve`` then exits 1 and is started again)."""
        from router.cluster.lease import LeaseSettings
        from router.cluster.node import Membership
        from router.node.lifecycle import write_private

        self.membership = Membership(self.db, self.s.node_id, self._own_address(),
                                     self.s.state_dir, LeaseSettings(self.s.cluster_renew_s, self.s.cluster_expiry_s),
                                     self._fenced, write_private=write_private, token=self.incarnation)
        self.membership.join()
        self.membership.start()
        self.db.fence = self._fence_check    # every unit of work of this node checks its epoch (docs/cluster.md)
        self.db.statement_fence = _AcceptFence(self)   # the accept statement checks epoch and ownership itself

    def _own_address(self) -> str:
        """``host:port`` at which the other nodes and the clients reach this node: the one endpoint omniORB is told
        to publish (``ORBendPointPublish`` in the environment, which the container image sets from
        ``ORB_PUBLISH_HOST``) when there is one, else ``orb.host:orb.port``. A node listening on every address
        (``0.0.0.0``) never names that in its references nor in its member row (docs/cluster.md, Deployment)."""
        return published_address(os.environ.get("ORBendPointPublish", ""),  # noqa: SIM112 - omniORB's own name
                                 self.s.orb_host, self.s.orb_port)

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
            from router import telemetry

            telemetry.cluster_fenced_write("unit_of_work")
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
        self.runtime.owner = LocalOwner(self.s.node_id, self._live_epoch, self.s.cluster_placement)
        log.info("cluster: node %s owns channels %s and bridges %s", self.s.node_id, list(owned.channels),
                 list(owned.bridges))
        return owned

    def _start_takeover(self) -> None:
        from router.cluster.takeover import Takeover

        fwd = getattr(self.runtime, "forwarder", None)   # cut from PostgreSQL: the owners last read, for a lease's
        if fwd is not None:                              # time (router/cluster/forward.py)
            fwd.stale_s = float(self.s.cluster_expiry_s)

        self.takeover = Takeover(self.db, self.s.node_id, self._live_epoch, self.s.cluster_renew_s,
                                 start=self._take_over, recover=self._recover_dead,
                                 claimed=lambda owned: self.factory.arrive(owned.channels),
                                 handoff=self._handoff_pass)
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
        try:
            self.factory.adopt(set(owned.channels))
        except LoadFailed as exc:                        # each failed channel was undone: its bridges too, and the
            self._unload_bridges(exc.failed)             # others run (all or nothing per channel: loading.py)
            self._resume_new(ids)
            raise
        except Exception:                                # nothing was loaded (e.g. the database away): the bridges
            self._unload_bridges(owned.channels)         # made for them are undone as well
            raise
        self._resume_new(ids)

    def _unload_bridges(self, channels: Any) -> None:
        """The bridges made here for ``channels`` whose load failed are stopped and deactivated (their rows stay):
        the next attempt makes them again with their channel (a bridge never runs without its channel)."""
        from router.channel.txdelivery import drain
        from router.cluster.release import stop_channel

        for cid in sorted(set(channels)):
            if cid in self.factory.channels:
                continue                                 # loaded earlier: it runs, with its bridges
            bids = [bid for bid, b in list(self.bridges.bridges.items()) if b.row.channel_id == cid]
            if bids:
                stop_channel(self.factory, self.bridges, cid, bids, HANDOFF_STOP_S, drain)

    def _resume_new(self, ids: set[int]) -> None:
        """Restart the bridges of ``ids`` that were started, run here now with their channel and have not run yet
        (no supervisor: made by this load, or whose resume failed): a load retried with the same ids (its start
        marked after a database blip, a failed hand-off's stop) must not start a running bridge's workers a second
        time beside the first."""
        fresh = {bid for bid in ids if (b := self.bridges.bridges.get(bid)) is not None
                 and not getattr(b, "_supervising", False) and b.row.channel_id in self.factory.channels}
        self.bridges.resume(fresh)

    def _handoff_pass(self) -> None:
        """Hand-offs (router/cluster/handoff.py), once per renewal period on the takeover thread: release the
        channels this node was asked to give (stopped first, router/cluster/release.py; then the ownership moves in
        one fenced transaction), then start those released to it."""
        from router import telemetry
        from router.channel.txdelivery import drain
        from router.cluster import handoff as H
        from router.cluster.ownership import Owned
        from router.cluster.release import Pending, stop_channel, wait_pending

        epoch = self._live_epoch()
        if epoch is None:
            return
        self._ask_for_share(epoch)
        again: Owned = self.__dict__.pop("_load_retry", Owned())
        if again:                                        # a channel whose hand-off failed, not loaded back yet
            self._load_again(again)
        with self.db.unit_of_work() as conn:
            outbound = H.open_from(conn, self.s.node_id, epoch)
        stuck: dict[int, list[Pending]] = self.__dict__.setdefault("_handoff_stuck", {})
        for h in outbound:
            began = time.monotonic()
            if h.id in stuck:                            # stopped at an earlier pass, something had not ended
                left = wait_pending(stuck[h.id], began + HANDOFF_STOP_S)
            else:
                try:
                    bids = [bid for bid, b in list(self.bridges.bridges.items()) if b.row.channel_id == h.channel_id]
                    left = stop_channel(self.factory, self.bridges, h.channel_id, bids, HANDOFF_STOP_S, drain)
                    late = [bid for bid, b in list(self.bridges.bridges.items()) if b.row.channel_id == h.channel_id]
                    if late:                             # created while the channel stopped: stopped too
                        left += stop_channel(self.factory, self.bridges, h.channel_id, late, HANDOFF_STOP_S, drain)
                except Exception as exc:
                    log.exception("cluster: stopping channel %d for its hand-off failed; it stays on this node",
                                  h.channel_id)
                    with self.db.unit_of_work() as conn:
                        H.fail(conn, h.id, f"stopping it on {self.s.node_id} failed: {type(exc).__name__}: {exc}")
                        unit = H.channel_unit(conn, h.channel_id)
                    telemetry.cluster_handoff("failed", h.reason)
                    self._load_again(unit)
                    continue
            if left:                                     # never released while something of it may still act
                stuck[h.id] = left
                continue
            stuck.pop(h.id, None)
            stop_s = time.monotonic() - began
            try:
                with self.db.unit_of_work() as conn:
                    done = H.release(conn, h, self.s.node_id, epoch, stop_s)
            except H.HandOffRefused:
                continue
            if done.state == "failed":                   # nobody can take it: it runs here again
                log.warning("cluster: hand-off of channel %d failed (%s); it stays on this node", h.channel_id,
                            done.error)
                telemetry.cluster_handoff("failed", h.reason)
                with self.db.unit_of_work() as conn:
                    unit = H.channel_unit(conn, h.channel_id)
                self._load_again(unit)
                continue
            forwarder = getattr(self.runtime, "forwarder", None)   # a cached owner answer is stale now
            if forwarder is not None:
                forwarder.invalidate()
            log.info("cluster: channel %d and bridges %s handed to %s (%s; stopped in %.2f s)", h.channel_id,
                     list(done.bridges), done.to_node, h.reason, stop_s)
            telemetry.cluster_handoff("released", h.reason, stop_s)
        self._report_drained(epoch)
        with self.db.unit_of_work() as conn:
            inbound = H.released_to(conn, self.s.node_id)
        if not inbound:
            return
        owned = Owned(tuple(sorted({h.channel_id for h in inbound})),
                      tuple(sorted({b for h in inbound for b in h.bridges})))
        self.factory.arrive(owned.channels)
        try:
            self._take_over(owned)
        except LoadFailed as exc:                        # the channels that loaded run: their hand-offs started
            started = [h for h in inbound if h.channel_id in set(exc.loaded)]
            if started:
                with self.db.unit_of_work() as conn:
                    H.mark_started(conn, [h.id for h in started])
                for h in started:
                    telemetry.cluster_handoff("started", h.reason)
            raise
        with self.db.unit_of_work() as conn:
            H.mark_started(conn, [h.id for h in inbound])
        for h in inbound:
            telemetry.cluster_handoff("started", h.reason)
        log.info("cluster: took channels %s and bridges %s over by hand-off", list(owned.channels),
                 list(owned.bridges))

    def _load_again(self, unit: Any) -> None:
        """A channel whose hand-off failed runs here again (it never left): loaded whole, or, when that fails,
        undone and loaded again at the next period (until then clients are told to retry: ``arriving``)."""
        from router.cluster.ownership import Owned

        self.factory.arrive(unit.channels)               # TRANSIENT, not OBJECT_NOT_EXIST, while it loads again
        try:
            self._take_over(unit)
        except Exception:
            log.exception("cluster: loading channels %s back failed; retried at the next period", list(unit.channels))
            left: Owned = self.__dict__.get("_load_retry", Owned())
            self.__dict__["_load_retry"] = Owned(tuple(sorted(set(left.channels) | set(unit.channels))),
                                                 tuple(sorted(set(left.bridges) | set(unit.bridges))))

    def _ask_for_share(self, epoch: int) -> None:
        """``cluster.rebalance_on_join``: once per incarnation, at its first period, the node that has just joined
        requests its share of the channels (router/cluster/handoff.py ``request_join``: only moves to it, as many as
        bring it level, each by the hand-off). Never again in this incarnation: a late renewal or a blip moves
        nothing (sticky); a restart is a new incarnation and asks again."""
        from router.cluster import handoff as H

        if not getattr(self.s, "cluster_rebalance_on_join", False) or self.__dict__.get("_share_asked") == epoch:
            return
        with self.db.unit_of_work() as conn:
            moves = H.request_join(conn, self.s.node_id)
        self.__dict__["_share_asked"] = epoch
        log.info("cluster: node %s joined; its share: %s", self.s.node_id,
                 [(m.channel_id, m.from_node) for m in moves] or "nothing to move")

    def _report_drained(self, epoch: int) -> None:
        """While this node is drained: its routing transactions still in doubt in its own log (only it reads
        that), for ``nsjms cluster drain``'s clean / dirty / heuristic (router/cluster/handoff.py)."""
        from router.cluster import handoff as H
        from xa.recovery import SafeAction

        with self.db.unit_of_work() as conn:
            if not H.is_draining(conn, self.s.node_id, epoch):
                return
            try:                             # what it took over from a dead member meanwhile goes on, too
                H.request_drain(conn, self.s.node_id)
            except H.HandOffRefused as exc:
                log.warning("cluster: drained node %s cannot hand on what it owns: %s", self.s.node_id, exc)
        view = [] if self.t2 is None else [
            {"gtrid": v.gtrid, "status": v.status, "action": str(v.action), "reason": v.reason}
            for v in self.t2.view() if v.action is not SafeAction.WAIT]
        with self.db.unit_of_work() as conn:
            H.report_in_doubt(conn, self.s.node_id, epoch, view)

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
        out["forwarding"] = {"forwarded": fwd.forwarded, "retried": fwd.retried,        # waits: activations that
                             "forwarded_last_known": fwd.forwarded_stale,                 # met a request
                             "activation_waits": fwd.activation_waits} if fwd is not None else {}
        return out


class _AcceptFence:
    """The node's :class:`router.db.StatementFence`: the token its accept statements carry (router/channel/store.py,
    ``CHANNEL_FENCE_CTE``), and what a refused one means. A refusal is counted (``nsjms.cluster.fenced_writes``,
    ``accept``); when the node's epoch is no longer live (checked then, one unit of work) the node notices it was
    fenced and stops, as at a refused unit of work; a refusal because the channel moved alone leaves it running."""

    def __init__(self, role: ClusterRole) -> None:
        self._role = role

    def token(self) -> Any:
        from router.db import FenceToken, WriteFenced

        epoch = self._role._live_epoch()
        if epoch is None:
            raise WriteFenced(f"write refused: node {self._role.s.node_id!r} is fenced; nothing was stored")
        return FenceToken(self._role.s.node_id, epoch)

    def refused(self, exc: Any) -> None:
        from router import telemetry
        from router.cluster import members as M
        from router.cluster.errors import Fenced

        telemetry.cluster_fenced_write("accept")
        role = self._role
        epoch = role._live_epoch()
        if epoch is None:
            return                                       # known already: the node is stopping
        try:
            with role.db.statement() as conn:            # one read, no unit of work (its check would count again)
                M.check(conn, role.s.node_id, epoch)
        except Fenced as fenced:
            if role.membership is not None:
                role.membership.notice_fenced(fenced)    # the node stops (serve exits 1 and is started again)
        except Exception:                                # never raises (the refusal itself goes to the pushes)
            log.warning("cluster: checking the epoch after a refused accept failed", exc_info=True)
