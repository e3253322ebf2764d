"""PostgreSQL branches committed by someone other than their T2's driver, told to the running channels (issue 31).

A JMS -> channel T2 stores its events and their queue rows in its PostgreSQL branch; its driver
(``router.channel.t2in.InboundT2Driver``) queues them in memory once it committed that branch itself, or, when
recovery commits a branch the driver decided (its phase two failed), once recovery did. Any other commit of such a
branch happens behind the channels' back:

* an operator's ``nsjms txn commit --heuristic`` of an undecided branch while the node runs (its driver gave up:
  phase one failed and the rollback could not reach PostgreSQL);
* a recovery pass that commits a previous incarnation's prepared branch after the channels restored their queues
  (the first pass at start failed on it, and a later one succeeds).

Before, those events stayed in PostgreSQL and reached their consumers only at the next start (which loads every
queue row). :class:`LateCommitManager` wraps the recovery's :class:`xa.pg.PgManager` (every commit by recovery or by
an operator goes through it): before it commits prepared branches it reads their PostgreSQL transaction ids
(``pg_prepared_xacts.transaction``; a row the branch inserted keeps it as its ``xmin`` once committed), and after
each successful commit it hands the ids to :class:`LateCommits`, which passes those of T2s no driver owns to the
channels (``router.channel.late.queue_committed``: the queue rows whose ``xmin`` is one of the ids, each event
queued unless the channel already holds it). Commits made before the channels' restore began are dropped (the
restore loads every committed queue row); those made during the restore are kept and handed over when the channels
attach: restore loaded some of those rows (they are then skipped), the others are queued.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from psycopg import Xid

from xa.errors import BranchUnavailable, ResourceError

__all__ = ["BranchManager", "LateCommitManager", "LateCommits", "PreparedIds", "Sink"]

log = logging.getLogger("nsjms.t2")

#: The PostgreSQL transaction ids (as text) of prepared transactions, by GID; raises when PostgreSQL cannot say.
PreparedIds = Callable[[Sequence[str]], dict[str, str]]
#: Queues the events of branches committed late, by their PostgreSQL transaction ids; returns how many it queued.
Sink = Callable[[Sequence[str]], int]


class BranchManager(Protocol):
    """What recovery needs of a PostgreSQL manager (:class:`xa.pg.PgManager`)."""

    key: str

    def recover(self) -> Sequence[Xid]: ...

    def commit_branch(self, xid: Xid) -> None: ...

    def rollback_branch(self, xid: Xid) -> None: ...

    def finish_branches(self, ops: Sequence[tuple[str, Xid]]) -> list[ResourceError | None]: ...

    def close(self) -> None: ...


class LateCommits:
    """The T2s a driver of this node owns (it queues their events itself), and the hand-over of the others'
    late commits to the channels (see the module docstring). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owned: set[str] = set()
        self._pending: list[str] = []
        self._sink: Sink | None = None

    def own(self, gtrid: str) -> None:
        """A driver begins ``gtrid``: it queues its events itself, whoever commits its branch."""
        with self._lock:
            self._owned.add(gtrid)

    def disown(self, gtrid: str) -> None:
        """The driver is done with ``gtrid`` (published, rolled back, or given up undecided)."""
        with self._lock:
            self._owned.discard(gtrid)

    def owned(self, gtrid: str) -> bool:
        with self._lock:
            return gtrid in self._owned

    def committed(self, branches: Sequence[tuple[str, str]]) -> None:
        """``(gtrid, PostgreSQL transaction id)`` of branches just committed by recovery or an operator."""
        with self._lock:
            ids = [txid for gtrid, txid in branches if gtrid not in self._owned]
            sink = self._sink
            if sink is None:
                self._pending.extend(ids)
                return
        self._hand(sink, ids)

    def restoring(self) -> None:
        """The channels' restore begins: it loads every queue row committed so far, so the ids held until now are
        dropped (handing them over at :meth:`attach` could queue again an event delivered and released meanwhile:
        a duplicate). Commits from now until :meth:`attach` are still handed over."""
        with self._lock:
            self._pending = []

    def attach(self, sink: Sink) -> None:
        """The channels are restored: from now on late commits go to ``sink``, first those made before."""
        with self._lock:
            self._sink = sink
            pending, self._pending = self._pending, []
        self._hand(sink, pending)

    @staticmethod
    def _hand(sink: Sink, ids: Sequence[str]) -> None:
        if not ids:
            return
        try:
            queued = sink(ids)
        except Exception:  # the rows stay stored: the next start loads them (said, never silent)
            log.exception("events of %d PostgreSQL branch(es) committed by recovery or an operator could not be "
                          "queued; they are delivered after the node restarts", len(ids))
            return
        if queued:
            log.warning("queued %d event(s) of %d PostgreSQL branch(es) committed by recovery or an operator",
                        queued, len(ids))


class LateCommitManager:
    """``inner`` (recovery's PostgreSQL manager) telling :class:`LateCommits` what it committed."""

    def __init__(self, inner: BranchManager, late: LateCommits, prepared_ids: PreparedIds) -> None:
        self.inner = inner
        self.key = inner.key
        self.late = late
        self._prepared_ids = prepared_ids

    def recover(self) -> Sequence[Xid]:
        return self.inner.recover()

    def rollback_branch(self, xid: Xid) -> None:
        self.inner.rollback_branch(xid)

    def close(self) -> None:
        self.inner.close()

    def _ids(self, xids: Sequence[Xid]) -> dict[str, str]:
        """The transaction ids of ``xids`` before they commit: without them their events could not be found, so a
        failure here fails the commit (recovery tries again; never a commit whose events are left unqueued)."""
        try:
            return self._prepared_ids([str(x) for x in xids])
        except Exception as exc:  # translated: recovery retries the branch at its next pass
            raise BranchUnavailable(f"the prepared branches' transaction ids could not be read ({exc}); "
                                    "nothing committed") from exc

    def commit_branch(self, xid: Xid) -> None:
        ids = self._ids([xid])
        try:
            self.inner.commit_branch(xid)
        finally:
            # handed over on every outcome: a COMMIT PREPARED whose answer was lost may have committed, and the next
            # pass no longer sees the branch; an id that did not commit finds no rows (a later commit hands it again)
            if str(xid) in ids:
                self.late.committed([(xid.gtrid, ids[str(xid)])])

    def finish_branches(self, ops: Sequence[tuple[str, Xid]]) -> list[ResourceError | None]:
        commits = [xid for step, xid in ops if step == "commit"]
        try:
            ids = self._ids(commits) if commits else {}
        except BranchUnavailable as exc:
            return self._rollbacks_only(ops, exc)
        results = self.inner.finish_branches(ops)
        # every commit, failed ones too: a lost answer may hide a commit (see commit_branch)
        done = [(xid.gtrid, ids[str(xid)]) for step, xid in ops if step == "commit" and str(xid) in ids]
        if done:
            self.late.committed(done)
        return results

    def _rollbacks_only(self, ops: Sequence[tuple[str, Xid]], exc: ResourceError) -> list[ResourceError | None]:
        """The ids could not be read: the rollbacks go on, the commits wait for the next pass."""
        rollbacks = [(step, xid) for step, xid in ops if step != "commit"]
        done = iter(self.inner.finish_branches(rollbacks))
        return [exc if step == "commit" else next(done) for step, _ in ops]
