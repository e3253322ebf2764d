"""The contracts between the coordinator and the things it coordinates.

* :class:`Resource`: one participant (branch) of one transaction, in the shape of zope's data manager.
* :class:`RecoverableManager`: a resource manager seen by recovery (list prepared branches, finish one by xid).
* :class:`Clock`: time, injected so deadlines are testable without sleeping.

Call order for one :class:`Resource` (the coordinator guarantees it; a twin raises on anything else)::

    begin(xid) ─► [caller's work] ─► prepare() ─► commit()          (decision COMMIT, after the log is durable)
                                  └─────────────► rollback()         (any time before the decision)

Two-phase participants (PostgreSQL branches) are prepared in :meth:`Resource.sort_key` order; one-phase
participants (the STOMP branch: STOMP has no prepare) have ``one_phase_only = True``: their ``prepare()`` only
checks that they *could* commit, they come last in both phases, and their ``commit()`` runs after every
two-phase branch is committed. A one-phase participant must be re-drivable after a crash by the recovery
manager's re-send callback (the outbox), because its commit can end with an unknown outcome.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from psycopg import Xid

from .errors import XAError

__all__ = ["BatchManager", "Clock", "RecoverableManager", "Resource", "SystemClock"]


@runtime_checkable
class Resource(Protocol):
    """One participant of one T2 (a branch)."""

    @property
    def name(self) -> str:
        """Branch name, unique in the transaction; becomes the xid's branch qualifier and the log's key."""

    @property
    def kind(self) -> str:
        """What it is, for logs and the operator view (``"postgresql"``, ``"stomp-send"``, ...)."""

    @property
    def manager(self) -> str:
        """Key of the :class:`RecoverableManager` that can finish this branch after a crash (recovery looks
        it up by this key); for a one-phase participant, the key the re-send callback receives."""

    @property
    def one_phase_only(self) -> bool:
        """True if the participant cannot prepare (STOMP). It is committed after the decision is durable."""

    def sort_key(self) -> str:
        """Orders participants in both phases (ties broken by name). Must be stable for the transaction."""

    def begin(self, xid: Xid) -> None:
        """Called once, at enlistment, before the caller's work: associate the branch with ``xid``
        (``tpc_begin``). Must never commit or prepare anything."""

    def prepare(self) -> None:
        """Phase one, called once after the caller's work when the transaction commits. Make the branch's
        changes durable and committable (``PREPARE TRANSACTION``); raise to vote no. A one-phase participant only
        checks it can commit (every send acknowledged) and must never commit here. Must never block past the
        transaction's deadline for long: keep network timeouts bounded."""

    def commit(self) -> None:
        """Phase two, called only after the COMMIT decision is durable in the recovery log. Raise
        :class:`~xa.errors.OutcomeUnknown` / :class:`~xa.errors.BranchUnavailable` when the result is unknown,
        :class:`~xa.errors.HeuristicOutcome` when the branch decided otherwise on its own. Must never roll back
        on its own initiative: the decision is made."""

    def rollback(self) -> None:
        """Called at most once, before any decision (after a failure, rollback-only, deadline, or explicit
        rollback), whether or not ``prepare`` ran. Must never commit, and must not raise for a branch that has
        nothing to roll back."""


@runtime_checkable
class RecoverableManager(Protocol):
    """A resource manager as recovery sees it: its prepared branches and how to finish one of them by xid.

    Every method works on a FRESH session (never the connection that holds a branch: psycopg's
    ``tpc_recover()`` on that connection breaks it).
    """

    @property
    def key(self) -> str:
        """The key participants name as their :attr:`Resource.manager`."""

    def recover(self) -> Sequence[Xid]:
        """Every prepared branch in this manager, foreign ones included (recovery filters them). Raise
        :class:`~xa.errors.BranchUnavailable` if the manager cannot be reached. Must never change anything."""

    def commit_branch(self, xid: Xid) -> None:
        """Commit a prepared branch. Raise :class:`~xa.errors.BranchNotFound` if it no longer exists."""

    def rollback_branch(self, xid: Xid) -> None:
        """Roll back a prepared branch. Raise :class:`~xa.errors.BranchNotFound` if it no longer exists."""


@runtime_checkable
class BatchManager(Protocol):
    """Optional extension of :class:`RecoverableManager`: finish many prepared branches in one call (recovery
    uses it when a manager has it, e.g. to finish 1,000 branches over several sessions at once).

    ``finish_branches(ops)`` must have exactly the effect of calling ``commit_branch`` / ``rollback_branch``
    once per ``("commit"|"rollback", xid)``, in any order or concurrently (recovery never puts two operations on
    one xid in a batch); it returns, for each operation in order, None (done) or the
    :class:`~xa.errors.XAError` that call would have raised (:class:`~xa.errors.BranchNotFound`,
    :class:`~xa.errors.HeuristicOutcome`, ...). It never raises for one branch's failure."""

    def finish_branches(self, ops: Sequence[tuple[str, Xid]]) -> list[XAError | None]:
        """Commit or roll back every xid as its operation says."""


class Clock(Protocol):
    """Time as the coordinator sees it."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; deadlines are measured on it."""

    def wall(self) -> float:
        """Seconds since the epoch, for records an operator reads and for comparing with PostgreSQL's
        ``prepared`` timestamps."""


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


def ordered(resources: Sequence[Resource]) -> list[Resource]:
    """Participants in protocol order: two-phase ones by (sort key, name), then one-phase ones likewise."""
    return sorted(resources, key=lambda r: (r.one_phase_only, r.sort_key(), r.name))
