"""A survivor's takeover of dead members' work (docs/cluster.md).

Every ``period`` seconds (the lease renewal period) a node reads the members; for each one whose lease expired or
that left, it runs, in ONE PostgreSQL transaction, the fence (the dead node's epoch + 1, ``fenced``) and the
assignment of every channel (with its bridges) the dead node owned to the live members, least loaded first
(:func:`router.cluster.spread.claim_spread`: the other survivors' shares are ``claimed`` hand-offs). Then, outside
that transaction:

1. ``recover(dead)``: finish the dead node's routing transactions from PostgreSQL alone (its decisions in
   ``nsjms_decision``; :mod:`router.cluster.decisions`), so no prepared branch of it still locks the queue rows
   the survivors are about to load, and no logged COMMIT is delivered again;
2. the other survivors' shares are released (:func:`router.cluster.spread.release_recovered`): each loads its own
   at its next period (the hand-off's start path, ``handoff``);
3. ``start(owned)``: load this node's share from PostgreSQL and start it.

Two survivors never both take one node over: the fence reads the member row ``FOR UPDATE``; the second finds it
``fenced`` and claims nothing. A survivor that dies after its claim committed owns the work like any other member:
its own lease expires and the next survivor takes it all over. ``recover`` is retried every pass for the members
this node fenced, and for every fenced member whose fencer is no longer live (the fencer died before it finished:
its successor, or any other live node, finishes the work; :func:`router.cluster.decisions.recover_fenced` holds the
dead member's row ``FOR UPDATE`` while it works, so one node at a time does it), until they rejoin (a failed pass,
or a branch a paused node prepared after the fence and never decided: its decision is refused by the fence, so it
is rolled back). A ``start`` that fails after its claim committed is retried every pass until it succeeds (the
claimed ids stay pending; ``start`` is idempotent: it loads what is not loaded yet).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from router import telemetry
from router.cluster import members as M
from router.cluster.blockers import EndBlockers
from router.cluster.errors import ClusterError, Fenced, NotExpired
from router.cluster.lease import expired
from router.cluster.ownership import Owned
from router.cluster.sessions import end_fenced_sessions
from router.cluster.spread import Spread, claim_spread, release_recovered

__all__ = ["TakenOver", "Takeover"]

log = logging.getLogger("nsjms.cluster")


@dataclass(frozen=True)
class TakenOver:
    """One takeover this node did: whom, when (``time.time()``), how long after the dead node's last renewal (from
    PostgreSQL's clock), its new epoch, and what moved here (``owned``) and to each other survivor (``others``).
    ``started`` turns true once what moved here is loaded and running (until then the claim is committed but a
    client asking this node for a claimed channel is told to retry)."""

    node_id: str
    at: float
    after_last_renewal_s: float
    epoch: int
    owned: Owned
    started: bool = False
    others: dict[str, Owned] | None = None


class Takeover:
    """The takeover loop of one node (see the module docstring). ``db``: the node's :class:`router.db.Database`;
    ``epoch()``: this node's live epoch (None once fenced); ``recover(dead)`` and ``start(owned)`` are the node's."""

    def __init__(self, db: Any, node_id: str, epoch: Callable[[], int | None], period_s: float, *,
                 start: Callable[[Owned], None], recover: Callable[[str], None] | None = None,
                 claimed: Callable[[Owned], None] | None = None,
                 handoff: Callable[[], None] | None = None) -> None:
        self.db, self.node_id, self._epoch, self.period_s = db, node_id, epoch, period_s
        self._start, self._recover, self._claimed = start, recover, claimed
        self._handoff = handoff          # the node's hand-off step (router/cluster/handoff.py), after the takeovers
        self.done: list[TakenOver] = []
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending = Owned()          # claimed, not started yet (a failed start): retried every pass

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="cluster-takeover", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.period_s + 30)

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.pass_once()
                self.last_error = None
            except Fenced:
                return                                        # the membership's renewal stops the node
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("cluster: takeover pass failed (%s); retrying in %g s", self.last_error, self.period_s,
                            exc_info=True)

    def pass_once(self) -> list[TakenOver]:
        """One pass: take every expired or departed member over, then retry the transaction recovery of the members
        this node fenced. Returns the takeovers of this pass."""
        with self._lock:
            epoch = self._epoch()
            if epoch is None:
                raise Fenced(f"node {self.node_id!r} is not a live member", self.node_id)
            with self.db.unit_of_work() as conn:
                views = M.members(conn)
            renewed = {v.node_id: (v.now - v.renewed_at).total_seconds() for v in views}
            out = []
            for dead in expired(views):
                if dead == self.node_id:
                    continue
                try:
                    with self.db.unit_of_work() as conn:
                        conn.execute("SET LOCAL lock_timeout = '10s'")
                        pid = getattr(getattr(conn, "info", None), "backend_pid", None)
                        with EndBlockers(self.db, pid, max(self.period_s, 1.0), f"node {dead}"):  # a paused one's
                            spread = claim_spread(conn, dead, self.node_id, epoch)                # open unit of work
                except NotExpired:
                    continue                                   # it renewed, or rejoined, meanwhile
                self._end_sessions(dead)
                telemetry.cluster_takeover(dead)
                owned = spread.mine
                if spread:
                    done = TakenOver(dead, time.time(), renewed.get(dead, 0.0), spread.epoch, owned,
                                     started=not owned, others=dict(spread.others))   # nothing here: started
                    log.warning("cluster: node %s fenced (epoch %d); took over channels %s and bridges %s; "
                                "spread to the other survivors: %s", dead, spread.epoch, list(owned.channels),
                                list(owned.bridges), _shares(spread))
                    self.done.append(done)
                    out.append(done)
                    self._pending = _merge(self._pending, owned)
                    if self._claimed is not None and owned:
                        self._claimed(owned)                   # claimed, not loaded yet: clients are told to retry
                    if self._finish(dead):
                        self._release([dead])                  # the others' shares, after the recovery only
                    self._start_pending()
                else:
                    log.info("cluster: node %s fenced (epoch %d); it owned nothing", dead, spread.epoch)
                    self._finish(dead)
            recovered = [dead for dead in self._to_recover() if self._finish(dead)]
            self._release(recovered)         # shares a fencer that died could not release, and of rejoined nodes
            self._start_pending()            # a start that failed at an earlier pass (after the recoveries)
            if self._handoff is not None:
                self._handoff()              # under the same lock: never beside a takeover's start
            return out

    def _end_sessions(self, dead: str) -> None:
        """After the fence: end the fenced incarnation's sessions (:mod:`router.cluster.sessions`), so an open
        transaction of a paused node does not hold the rows the survivor now routes. A failure is logged: its
        sessions then end by PostgreSQL's own timeouts, as before."""
        try:
            with self.db.unit_of_work() as conn:
                ended = end_fenced_sessions(conn, dead)
        except Exception as exc:  # noqa: BLE001 - best effort; the takeover goes on
            log.warning("cluster: could not end the PostgreSQL sessions of fenced node %s: %s", dead, exc)
            return
        if ended:
            log.warning("cluster: ended %d PostgreSQL session(s) of fenced node %s (pids %s)", len(ended), dead,
                        ended)

    def _release(self, recovered: list[str]) -> None:
        """The other survivors' shares of the members in ``recovered`` (whose recovery ran) become loadable
        (:func:`router.cluster.spread.release_recovered`)."""
        with self.db.unit_of_work() as conn:
            released = release_recovered(conn, recovered)
        if released:
            log.info("cluster: released taken-over channels to their new owners: %s", released)

    def _start_pending(self) -> None:
        if self._pending:
            self._start(self._pending)
            self._pending = Owned()
            for i, t in enumerate(self.done):
                if not t.started:
                    self.done[i] = replace(t, started=True)

    def _finish(self, dead: str) -> bool:
        """The recovery of ``dead``'s routing transactions; False when it failed (retried at the next pass; the
        other survivors' shares of ``dead`` stay ``claimed`` until it worked)."""
        if self._recover is None:
            return True
        try:
            self._recover(dead)
        except ClusterError:
            raise
        except Exception as exc:  # noqa: BLE001 - retried at the next pass (the member stays fenced by us)
            self.last_error = f"recovery of {dead}'s transactions: {type(exc).__name__}: {exc}"
            log.warning("cluster: %s; retried in %g s", self.last_error, self.period_s)
            return False
        return True

    def _to_recover(self) -> list[str]:
        with self.db.unit_of_work() as conn:
            return to_recover(conn, self.node_id)

    def status(self) -> list[dict[str, Any]]:
        return [{"node_id": t.node_id, "at": t.at, "after_last_renewal_s": round(t.after_last_renewal_s, 1),
                 "epoch": t.epoch, "channels": list(t.owned.channels), "bridges": list(t.owned.bridges),
                 "started": t.started,
                 "spread": {n: {"channels": list(o.channels), "bridges": list(o.bridges)}
                            for n, o in sorted((t.others or {}).items())}}
                for t in self.done]


def to_recover(conn: Any, me: str) -> list[str]:
    """The fenced members whose transactions ``me`` must (try to) finish: those ``me`` fenced, and those whose
    fencer is no longer a live member with a live lease (it died, left or was fenced in turn before it finished)."""
    rows = conn.execute(
        "SELECT m.node_id FROM nsjms_member m WHERE m.state = 'fenced' AND m.node_id <> %s "
        "AND (m.fenced_by = %s OR m.fenced_by IS NULL OR NOT EXISTS (SELECT 1 FROM nsjms_member f "
        "WHERE f.node_id = m.fenced_by AND f.state = 'live' AND f.lease_until > clock_timestamp())) "
        "ORDER BY m.node_id", (me, me)).fetchall()
    return [str(r[0]) for r in rows]


def _shares(spread: Spread) -> dict[str, list[int]]:
    return {n: list(o.channels) for n, o in sorted(spread.others.items())}


def _merge(a: Owned, b: Owned) -> Owned:
    return Owned(tuple(sorted(set(a.channels) | set(b.channels))), tuple(sorted(set(a.bridges) | set(b.bridges))))
