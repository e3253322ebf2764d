"""One routing transaction (T2, NJI 2.7), run: the loop both directions share (issue 24).

The idea of zope ``transaction``'s ``TransactionManager.run``: the caller hands over the work, the runner owns the
transaction around it and returns what became of it as a value. :meth:`T2Runner.run`:

1. ``coordinator.begin(timeout)``; :meth:`RunHooks.started` (the client marks the T2 as its own);
2. a pooled PostgreSQL session for the T2's branch (``Database.branch()``), kept until phase two is done;
3. the work callback ``work(txn, conn)``: it enlists its branches (the PostgreSQL branch on ``conn``, the
   participant's broker branch) and does the routing step in them; it may raise :class:`Abandon` (nothing to do:
   the T2 rolls back quietly);
4. ``txn.decide()``: phase one and the durable COMMIT record; :meth:`RunHooks.decided` on the caller's thread;
5. phase two (``txn.complete()``, then the session goes back to the pool, then :meth:`RunHooks.completed`) on the
   client's :class:`~router.routing.completer.Completer` (pipelining: the client begins its next T2 meanwhile), or
   inline without one.

Any failure before the decision rolls the T2 back when it is still undecided (with the reason
``describe(exc)``), returns the session (whose boundary translates a psycopg error into the store's error tree)
and is reported, never raised: the result's :attr:`RunResult.error` is the exception to handle. A
:class:`~xa.errors.DecisionUnknown` is left alone (its branches stay prepared; recovery decides). An error that
is not an :class:`Exception` (``KeyboardInterrupt``, ``SystemExit``) is reported the same way, after the same
clean-up, and the caller must re-raise it (:meth:`RunResult.reraise_interrupt`).

Outcomes (a value, matched exhaustively by the clients, CONVENTIONS 19):

====================  ====================================================================================
``COMMITTED``         decided COMMIT and phase two ran inline (no completer)
``DEFERRED``          decided COMMIT; phase two was handed to the completer (the T2 commits whatever happens:
                      recovery finishes it from its COMMIT record after a crash)
``ROLLED_BACK``       rolled back before the decision (``error`` None: the work abandoned it)
``IN_DOUBT``          the COMMIT record may or may not be durable (``DecisionUnknown``): recovery decides
====================  ====================================================================================

The coordinator (``xa``) and the node's T2 wiring (``router.routing.t2.transactions.NodeTransactions``) are used as they
are; this module only orders the calls. Users: ``router.channel.txdelivery.deliver`` (channel → JMS, NJI 2.7.3.1) and
``router.channel.t2in.InboundT2Driver`` (JMS → channel, NJI 2.7.3.2).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import psycopg
from psycopg import Xid

from router.routing.completer import Completer
from xa.coordinator import Coordinator, Transaction
from xa.coordinator import Outcome as XaOutcome
from xa.errors import DecisionUnknown
from xa.resource import Resource
from xa.states import State

__all__ = ["Abandon", "BranchSource", "Enlister", "Outcome", "RunHooks", "RunResult", "T2Runner", "describe"]

log = logging.getLogger("nsjms.routing")

Conn = psycopg.Connection[Any]
R = TypeVar("R")

_UNDECIDED = (State.ACTIVE, State.ROLLBACK_ONLY)


class Outcome(enum.Enum):
    """What became of one T2 (see the module docstring)."""

    COMMITTED = "committed"
    DEFERRED = "deferred"
    ROLLED_BACK = "rolled_back"
    IN_DOUBT = "in_doubt"


class Abandon(Exception):
    """Raised by the work: there is nothing to do in this T2 (e.g. nothing was received); it rolls back quietly."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Enlister(Protocol):
    """The node's routing transactions as the runner uses them (``router.routing.t2.transactions.NodeTransactions``)."""

    coordinator: Coordinator

    def enlist(self, txn: Transaction, resource: Resource) -> Xid:
        ...


class BranchSource(Protocol):
    """Where a T2's PostgreSQL session comes from (``router.db.Database``)."""

    def branch(self) -> AbstractContextManager[Conn]:
        ...


@dataclass(frozen=True)
class RunResult(Generic[R]):
    """One T2's outcome, with what the work returned (decided T2s) or what ended it (the others)."""

    outcome: Outcome
    txn: Transaction | None                  # None: the T2 could not even begin
    value: R | None = None                   # what the work returned (a decided T2)
    error: BaseException | None = None       # what ended it, as the session's boundary translated it
    cause: BaseException | None = None       # the exception the work or the decision raised, untranslated
    reason: str = ""                         # why it rolled back (the transaction's own reason first)

    @property
    def gtrid(self) -> str | None:
        return None if self.txn is None else self.txn.gtrid

    def reraise_interrupt(self) -> None:
        """Re-raise an ``error`` that is not an :class:`Exception` (an interrupt the runner cleaned up after)."""
        if self.error is not None and not isinstance(self.error, Exception):
            raise self.error


class RunHooks(Generic[R]):
    """The client's part of a run (each a no-op here; override what the client needs). Never called for a T2
    that could not begin."""

    def started(self, txn: Transaction) -> None:
        """Right after begin, before the session is checked out."""

    def decided(self, txn: Transaction, value: R) -> None:
        """On the caller's thread once the COMMIT record is durable, before phase two is handed on."""

    def before_phase_two(self, txn: Transaction) -> None:
        """On the phase-two thread, just before ``txn.complete()`` (crash and pause points of the tests)."""

    def completed(self, txn: Transaction, value: R, outcome: XaOutcome | None, error: Exception | None) -> None:
        """After phase two and the return of the session. ``outcome`` None: phase two failed (``error``) and the
        coordinator handed the T2 to recovery, which commits it from its COMMIT record."""

    def settled(self, txn: Transaction) -> None:
        """Last, on the phase-two thread, whatever happened in phase two (a teardown waiting for it is let go)."""


def describe(exc: BaseException) -> str:
    """The rollback reason of a failure: its ``reason`` when it carries one, else its type and message."""
    return getattr(exc, "reason", "") or f"{type(exc).__name__}: {exc}"


class T2Runner:
    """Runs T2s over the node's coordinator and database (see the module docstring)."""

    def __init__(self, t2: Enlister, db: BranchSource, *,
                 reason: Callable[[BaseException], str] = describe) -> None:
        self.t2 = t2
        self.db = db
        self._reason = reason

    def run(self, work: Callable[[Transaction, Conn], R], hooks: RunHooks[R] | None = None, *,
            timeout: float | None = None, completer: Completer | None = None) -> RunResult[R]:
        """One T2 around ``work`` (see the module docstring); ``timeout``: TransactionTimeout in seconds."""
        hooks = hooks or RunHooks()
        try:
            txn = self.t2.coordinator.begin(timeout)
        except BaseException as exc:  # noqa: BLE001 — reported (re-raised by the caller): nothing began
            return RunResult(Outcome.ROLLED_BACK, None, error=exc, cause=exc, reason=self._reason(exc))
        session = ExitStack()                   # the branch's pooled session: kept until phase two is done
        abandoned: Abandon | None = None
        try:
            hooks.started(txn)
            conn = session.enter_context(self.db.branch())
            try:
                value = work(txn, conn)
            except Abandon as why:
                abandoned = why
                txn.rollback(why.reason)
                session.close()
            else:
                txn.decide()                    # phase one + the durable COMMIT record; phase two below
        except BaseException as exc:  # noqa: BLE001 — rolled back and reported; the caller re-raises interrupts
            return self._failed(txn, session, exc)
        if abandoned is not None:
            return RunResult(Outcome.ROLLED_BACK, txn, reason=abandoned.reason)
        hooks.decided(txn, value)
        if completer is None:
            self._finish(txn, value, session, hooks)
            return RunResult(Outcome.COMMITTED, txn, value)
        completer.submit(lambda: self._finish(txn, value, session, hooks))
        return RunResult(Outcome.DEFERRED, txn, value)

    # -- failure before the decision ----------------------------------------------------------------------------
    def _failed(self, txn: Transaction, session: ExitStack, exc: BaseException) -> RunResult[R]:
        """Roll back an undecided T2 while the branch's session is still ours, then give the session back (its
        boundary may translate ``exc``: the translated error is the one reported)."""
        reason = self._reason(exc)
        if txn.state in _UNDECIDED:
            try:
                txn.rollback(reason)
            except Exception as again:  # noqa: BLE001 — left to recovery's presumed abort
                log.warning("T2 %s: rollback after %s failed (%s); recovery rolls it back", txn.gtrid, reason, again)
        error = exc
        try:
            session.__exit__(type(exc), exc, exc.__traceback__)
        except BaseException as translated:  # noqa: BLE001 — the session re-raises it, maybe translated
            error = translated
        outcome = Outcome.IN_DOUBT if isinstance(exc, DecisionUnknown) else Outcome.ROLLED_BACK
        return RunResult(outcome, txn, error=error, cause=exc, reason=txn.rollback_reason or reason)

    # -- phase two ---------------------------------------------------------------------------------------------
    def _finish(self, txn: Transaction, value: R, session: ExitStack, hooks: RunHooks[R]) -> None:
        try:
            hooks.before_phase_two(txn)
            outcome, error = self._phase_two(txn, session)
            hooks.completed(txn, value, outcome, error)
        finally:
            hooks.settled(txn)

    @staticmethod
    def _phase_two(txn: Transaction, session: ExitStack) -> tuple[XaOutcome | None, Exception | None]:
        try:
            return txn.complete(), None
        except Exception as exc:  # noqa: BLE001 — the coordinator handed it to recovery (COMMIT_PENDING)
            return None, exc
        finally:
            try:
                session.close()
            except Exception:
                log.exception("T2 %s: returning the branch's session failed", txn.gtrid)
