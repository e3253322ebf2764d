"""The coordinator of T2: begin with a deadline, enlist, rollback-only, two-phase commit with a durable decision.

The logic does no I/O of its own: the recovery log, the clock and the participants are injected, so every
failure permutation is a unit test over in-memory twins (``xa.testing``).

``Transaction.commit()``:

1. refuse if rollback-only (roll back, raise :class:`TransactionRolledBack`) or past the deadline (roll back,
   raise :class:`TransactionTimeout`);
2. phase one: ``prepare()`` every participant in :func:`xa.resource.ordered` order (two-phase ones by sort
   key, one-phase ones last), checking the deadline before each;
3. the decision: the deadline is checked once more immediately before the COMMIT record is appended and synced;
   no COMMIT is ever logged past the deadline. From here on the deadline no longer applies;
4. phase two: ``commit()`` every two-phase participant, then the one-phase participant(s) last, so the window
   in which a crash can duplicate a broker send is as short as possible (only between the broker's COMMIT and
   the END record);
5. END when every branch is done; otherwise a PROGRESS record and state COMMIT_PENDING for recovery.

Any failure before the decision rolls back every enlisted branch and re-raises the ORIGINAL error (a failed
rollback of a branch is attached to it as a note and left to recovery's presumed abort). A failed decision
write is rolled back only when the log guarantees the record is absent (:class:`LogWriteFailed`); when it cannot
say, the branches are left prepared and :class:`DecisionUnknown` is raised: recovery reads the log and decides.

``commit()`` returning means the decision is COMMIT (the caller must not retry the work), even when its
:class:`Outcome` is COMMIT_PENDING (a branch, typically the broker, has an unknown outcome that recovery
finishes: re-send with the same dedupe ids) or heuristic (recorded until an operator forgets it).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from psycopg import Xid

from .errors import (
    BranchNotFound,
    DecisionUnknown,
    DuplicateBranch,
    HeuristicKind,
    HeuristicOutcome,
    IllegalTransition,
    LogError,
    LogWriteFailed,
    TransactionRolledBack,
    TransactionTimeout,
    UsageError,
    XAError,
)
from .log import RecoveryLog
from .observer import Guarded, Observer, Phase
from .records import Commit, End, Heuristic, Participant, Progress, Record, Rollback
from .resource import Clock, Resource, ordered
from .states import TERMINAL, Event, State, apply
from .xid import NodeId, branch_xid, new_gtrid

__all__ = ["BranchOutcome", "BranchResult", "Coordinator", "Outcome", "Transaction"]

_log = logging.getLogger("xa.coordinator")
#: states in which this coordinator stops driving the transaction (recovery or an operator may take over).
_HANDED_OFF = TERMINAL | {State.COMMIT_PENDING, State.IN_DOUBT, State.HEURISTIC_COMMIT, State.HEURISTIC_ROLLBACK,
                          State.HEURISTIC_MIXED}


class BranchOutcome(enum.StrEnum):
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    UNKNOWN = "UNKNOWN"  # the call failed or never answered: recovery finishes it (commit / re-send / abort)
    HEURISTIC = "HEURISTIC"  # the branch decided on its own (see BranchResult.heuristic)


@dataclass(frozen=True)
class BranchResult:
    name: str
    outcome: BranchOutcome
    one_phase: bool = False
    error: str = ""
    heuristic: HeuristicKind | None = None


@dataclass(frozen=True)
class Outcome:
    """How a transaction ended as far as this call knows."""

    gtrid: str
    state: State
    branches: tuple[BranchResult, ...]

    @property
    def resend(self) -> tuple[str, ...]:
        """One-phase branches whose commit is unknown: recovery re-sends their outbox rows (same dedupe ids)."""
        return tuple(b.name for b in self.branches if b.one_phase and b.outcome is BranchOutcome.UNKNOWN)


class Coordinator:
    """Creates transactions for one node and knows which are in flight (recovery leaves those alone)."""

    def __init__(self, node: NodeId, log: RecoveryLog, clock: Clock,
                 gtrids: Callable[[NodeId], str] = new_gtrid, *, observer: Observer | None = None) -> None:
        if log.node != node:
            raise UsageError(f"the recovery log belongs to node {log.node}, not {node}")
        self.node, self.log, self.clock = node, log, clock
        self.observer = Guarded(observer)  # telemetry (xa.observer); never changes an outcome
        self._gtrids = gtrids
        self._lock = threading.Lock()
        self._active: dict[str, Transaction] = {}

    def begin(self, timeout: float | None = None) -> Transaction:
        """A new transaction; ``timeout`` seconds (None or 0: no deadline, as ``TransactionTimeout`` = 0)."""
        if timeout is not None and timeout < 0:
            raise UsageError(f"timeout must be >= 0, got {timeout}")
        txn = Transaction(self, self._gtrids(self.node), timeout or None)
        with self._lock:
            self._active[txn.gtrid] = txn
        self.observer.begun(txn.gtrid, timeout or None)
        return txn

    def in_flight(self) -> frozenset[str]:
        """Gtrids this coordinator is still driving; recovery must not touch them."""
        with self._lock:
            return frozenset(self._active)

    def expire(self) -> list[str]:
        """Mark every transaction past its deadline and not yet deciding as timed out (rollback-only). Does no
        I/O on participants: the caller's thread rolls back at its next call. Returns the gtrids marked."""
        with self._lock:
            txns = list(self._active.values())
        return [t.gtrid for t in txns if t._expire()]

    def _finished(self, txn: Transaction) -> None:
        with self._lock:
            self._active.pop(txn.gtrid, None)


class Transaction:
    """One T2. Use from one thread; :meth:`set_rollback_only` may be called from any thread."""

    def __init__(self, coordinator: Coordinator, gtrid: str, timeout: float | None) -> None:
        self._c = coordinator
        self.gtrid = gtrid
        now = self._began = coordinator.clock.monotonic()
        self.deadline = None if timeout is None else now + timeout
        self.wall_deadline = None if timeout is None else coordinator.clock.wall() + timeout
        self._state = State.ACTIVE
        self._lock = threading.Lock()
        self._resources: list[Resource] = []
        self._reason = ""
        self._rollback_only = False  # a flag of its own: an empty reason still marks the transaction
        self._timed_out = False

    # ----------------------------------------------------------------------------------------- state
    @property
    def state(self) -> State:
        return self._state

    @property
    def rollback_reason(self) -> str:
        return self._reason

    @property
    def timed_out(self) -> bool:
        """True once the deadline passed before the decision (the transaction is or will be rolled back)."""
        return self._timed_out

    def _move(self, event: Event) -> State:
        with self._lock:
            state = self._state = apply(self._state, event, gtrid=self.gtrid)
            if state in _HANDED_OFF:
                self._c._finished(self)
        if state in _HANDED_OFF:
            elapsed = self._c.clock.monotonic() - self._began
            self._c.observer.ended(self.gtrid, state, self._timed_out, elapsed)
        return state

    def _observe(self, phase: Phase, resource: Resource, call: Callable[[], None]) -> None:
        """Run one participant call between ``phase_started`` and ``phase_ended`` (the error is re-raised)."""
        observer = self._c.observer
        observer.phase_started(self.gtrid, phase, resource.name, resource.kind)
        try:
            call()
        except BaseException as exc:
            observer.phase_ended(self.gtrid, phase, resource.name, "failed", f"{type(exc).__name__}: {exc}")
            raise
        observer.phase_ended(self.gtrid, phase, resource.name, "ok", "")

    def _observed(self, phase: Phase, resource: Resource, call: Callable[[Resource], BranchResult]) -> BranchResult:
        """A phase-two call that reports its outcome instead of raising."""
        observer = self._c.observer
        observer.phase_started(self.gtrid, phase, resource.name, resource.kind)
        result = call(resource)
        observer.phase_ended(self.gtrid, phase, resource.name, result.outcome.value, result.error)
        return result

    def _overdue(self) -> bool:
        return self.deadline is not None and self._c.clock.monotonic() >= self.deadline

    def _expire(self) -> bool:
        with self._lock:
            if self._state not in (State.ACTIVE, State.ROLLBACK_ONLY) or not self._overdue():
                return False
            self._timed_out = self._rollback_only = True
            self._reason = self._reason or "deadline passed"
            self._state = apply(self._state, Event.MARK_ROLLBACK_ONLY, gtrid=self.gtrid)
            return True

    def set_rollback_only(self, reason: str) -> None:
        """Force this transaction to roll back (the bridge's role, NJI 2.7.4). The first reason is kept."""
        with self._lock:
            self._state = apply(self._state, Event.MARK_ROLLBACK_ONLY, gtrid=self.gtrid)
            self._rollback_only = True
            self._reason = self._reason or reason or "rollback-only (no reason given)"

    # --------------------------------------------------------------------------------------- enlist
    def enlist(self, resource: Resource) -> Xid:
        """Add a participant and ``begin`` its branch; returns the branch xid. Past the deadline the whole
        transaction is rolled back and :class:`TransactionTimeout` raised."""
        if any(r.name == resource.name for r in self._resources):
            raise DuplicateBranch(f"branch {resource.name!r} is already enlisted", gtrid=self.gtrid)
        xid = branch_xid(self.gtrid, resource.name)
        self._move(Event.ENLIST)
        if self._overdue():
            self._fail_timeout()
        self._resources.append(resource)
        try:
            self._observe(Phase.BEGIN, resource, lambda: resource.begin(xid))
        except Exception as exc:
            if isinstance(exc, XAError) and exc.gtrid is None:
                exc.gtrid = self.gtrid
            self.set_rollback_only(f"branch {resource.name} could not begin: {exc}")
            raise
        return xid

    @property
    def participants(self) -> tuple[Resource, ...]:
        return tuple(ordered(self._resources))

    # --------------------------------------------------------------------------------------- commit
    def commit(self) -> Outcome:
        """Two-phase commit (see the module docstring). Returns once the decision is COMMIT."""
        self.decide()
        return self.complete()

    def decide(self) -> None:
        """Phase one and the durable decision: :meth:`commit` up to and including the COMMIT record's fsync, with
        the same failures (rolled back and re-raised; :class:`DecisionUnknown`). Once it returns the transaction
        WILL commit (state COMMITTING, nothing committed yet): the caller must then run :meth:`complete`, from
        this or one other thread (a pipelining caller hands phase two to a thread of its own and starts its next
        transaction meanwhile). A crash in between is a crash after the decision: recovery commits."""
        if self._overdue():
            self._fail_timeout()
        try:
            self._move(Event.COMMIT_REQUESTED)
        except IllegalTransition:
            if self._state is not State.ROLLBACK_ONLY:  # read after the failed move: no race with the marker
                raise
            self._refuse_rollback_only()
        participants = ordered(self._resources)
        self._phase_one(participants)
        self._move(Event.ALL_PREPARED)
        if self._rollback_only:  # rollback-only was set while preparing
            self._refuse_rollback_only()
        if self._overdue():
            self._fail_timeout()
        self._decide(participants)

    def complete(self) -> Outcome:
        """Phase two of a transaction :meth:`decide` decided (see the module docstring): every branch committed,
        END or PROGRESS. Never raises for a participant's failure (its outcome is UNKNOWN, for recovery). Anything
        else that escapes (a bug, a log that fails outside its contract) hands the transaction to recovery before
        it propagates: COMMIT_PENDING, no longer in :meth:`Coordinator.in_flight`, so recovery finishes its
        phase two from the COMMIT record now, not after a restart."""
        if self._state is not State.COMMITTING:
            raise IllegalTransition(f"complete() needs a decided transaction, state is {self._state}",
                                    gtrid=self.gtrid)
        try:
            return self._phase_two(ordered(self._resources))
        except BaseException as exc:
            self._hand_to_recovery(exc)
            raise

    def _hand_to_recovery(self, exc: BaseException) -> None:
        """Phase two failed outside a participant's outcome: leave the rest to recovery (see :meth:`complete`)."""
        _log.error("T2 %s: phase two failed (%s: %s); handed to recovery", self.gtrid, type(exc).__name__, exc)
        try:
            if self._state is State.COMMITTING:
                self._move(Event.PHASE_TWO_INCOMPLETE)
        finally:
            self._c._finished(self)     # whatever state it reached: this coordinator no longer drives it

    def _refuse_rollback_only(self) -> None:
        if self._timed_out:
            self._fail_timeout()
        self._rollback_all(Event.ROLLBACK_REQUESTED, self._reason)
        raise TransactionRolledBack(f"rolled back: {self._reason}", gtrid=self.gtrid, reason=self._reason)

    def _fail_timeout(self) -> None:
        self._timed_out = True
        self._rollback_all(Event.DEADLINE_PASSED, "deadline passed")
        raise TransactionTimeout("not decided by its deadline, rolled back", gtrid=self.gtrid,
                                 reason="deadline passed")

    def _phase_one(self, participants: Sequence[Resource]) -> None:
        for resource in participants:
            if self._overdue():
                self._fail_timeout()
            try:
                self._observe(Phase.PREPARE, resource, resource.prepare)
            except Exception as exc:
                if isinstance(exc, XAError) and exc.gtrid is None:
                    exc.gtrid = self.gtrid  # every xa error names its transaction
                self._rollback_all(Event.PREPARE_FAILED, f"branch {resource.name} failed to prepare: {exc}", exc)
                raise

    def _decide(self, participants: Sequence[Resource]) -> None:
        clock = self._c.clock
        record = Commit(self.gtrid, tuple(_participant(r) for r in participants), self.wall_deadline, clock.wall())
        try:
            self._c.log.append(record, durable=True)
        except LogWriteFailed as exc:
            self._rollback_all(Event.DECISION_NOT_LOGGED, f"the decision could not be logged: {exc}", exc)
            raise
        except Exception as exc:
            self._move(Event.DECISION_UNKNOWN)
            raise DecisionUnknown(f"the COMMIT record may or may not be durable ({exc}); branches left prepared "
                                  "for recovery", gtrid=self.gtrid) from exc
        self._move(Event.DECISION_LOGGED)
        self._c.observer.decided(self.gtrid, "commit", "")

    def _phase_two(self, participants: Sequence[Resource]) -> Outcome:
        results = tuple(self._observed(Phase.COMMIT, r, _commit_one) for r in participants)
        heuristics = [b for b in results if b.outcome is BranchOutcome.HEURISTIC]
        if heuristics:
            committed = any(b.outcome is BranchOutcome.COMMITTED for b in results)
            only_rollback = all(b.heuristic is HeuristicKind.ROLLBACK for b in heuristics)
            event = Event.HEURISTIC_ROLLBACK if only_rollback and not committed else Event.HEURISTIC_MIXED
            self._record_heuristics(heuristics, results)
            return Outcome(self.gtrid, self._move(event), results)
        if any(b.outcome is BranchOutcome.UNKNOWN for b in results):
            self._record_quietly(_progress(self.gtrid, results, self._c.clock.wall()))
            return Outcome(self.gtrid, self._move(Event.PHASE_TWO_INCOMPLETE), results)
        self._record_quietly(End(self.gtrid, self._c.clock.wall()))
        return Outcome(self.gtrid, self._move(Event.PHASE_TWO_DONE), results)

    def _record_heuristics(self, heuristics: Sequence[BranchResult], results: Sequence[BranchResult]) -> None:
        """HEURISTIC records (durable) BEFORE the PROGRESS record: a crash between them leaves a heuristic
        entry, never a PROGRESS with nothing to explain it."""
        now = self._c.clock.wall()
        for b in heuristics:
            kind = b.heuristic or HeuristicKind.HAZARD
            self._record_quietly(Heuristic(self.gtrid, kind, b.name, f"participant:{b.name}", b.error, now),
                                 durable=True)
        self._record_quietly(_progress(self.gtrid, results, now))

    def _record_quietly(self, record: Record, *, durable: bool = False) -> None:
        """Records after the decision: losing one only makes recovery redo idempotent work, so a log failure
        here is reported, not raised (the decision stands)."""
        try:
            self._c.log.append(record, durable=durable)
        except LogError as exc:
            _log.error("T2 %s: could not log %s after the decision: %s", self.gtrid, type(record).__name__, exc)

    # ------------------------------------------------------------------------------------- rollback
    def rollback(self, reason: str = "rollback requested") -> Outcome:
        """Roll back every branch (before the decision only)."""
        return self._rollback_all(Event.ROLLBACK_REQUESTED, reason)

    def _rollback_all(self, event: Event, reason: str, cause: BaseException | None = None) -> Outcome:
        prepared = self._state in (State.PREPARING, State.PREPARED)
        self._move(event)
        self._reason = self._reason or reason
        self._c.observer.decided(self.gtrid, "rollback", self._reason)
        results = tuple(self._observed(Phase.ROLLBACK, r, lambda res: _rollback_one(res, cause))
                        for r in reversed(ordered(self._resources)))
        heuristics = [b for b in results if b.outcome is BranchOutcome.HEURISTIC]
        if heuristics:
            only_commit = all(b.heuristic is HeuristicKind.COMMIT for b in heuristics)
            rolled = any(b.outcome is BranchOutcome.ROLLED_BACK for b in results)
            self._record_heuristics(heuristics, results)
            ev = Event.HEURISTIC_COMMIT if only_commit and not rolled else Event.HEURISTIC_MIXED
            return Outcome(self.gtrid, self._move(ev), results)
        if prepared and any(b.outcome is BranchOutcome.UNKNOWN for b in results):
            parts = tuple(_participant(r) for r in ordered(self._resources))
            self._record_quietly(Rollback(self.gtrid, parts, reason, self._c.clock.wall()))
        return Outcome(self.gtrid, self._move(Event.ROLLBACK_DONE), results)


# ------------------------------------------------------------------------------------------ helpers
def _participant(resource: Resource) -> Participant:
    return Participant(resource.name, resource.kind, resource.manager, resource.one_phase_only)


def _commit_one(resource: Resource) -> BranchResult:
    one = resource.one_phase_only
    try:
        resource.commit()
    except BranchNotFound:
        return BranchResult(resource.name, BranchOutcome.COMMITTED, one, "branch already gone")
    except HeuristicOutcome as exc:
        if exc.kind is HeuristicKind.COMMIT:
            return BranchResult(resource.name, BranchOutcome.COMMITTED, one)
        return BranchResult(resource.name, BranchOutcome.HEURISTIC, one, str(exc), exc.kind)
    except Exception as exc:  # noqa: BLE001 - after the decision every failure is "unknown", for recovery
        _log.warning("T2 branch %s: commit outcome unknown: %s", resource.name, exc)
        return BranchResult(resource.name, BranchOutcome.UNKNOWN, one, f"{type(exc).__name__}: {exc}")
    return BranchResult(resource.name, BranchOutcome.COMMITTED, one)


def _rollback_one(resource: Resource, cause: BaseException | None) -> BranchResult:
    one = resource.one_phase_only
    try:
        resource.rollback()
    except HeuristicOutcome as exc:
        if exc.kind is HeuristicKind.ROLLBACK:
            return BranchResult(resource.name, BranchOutcome.ROLLED_BACK, one)
        return BranchResult(resource.name, BranchOutcome.HEURISTIC, one, str(exc), exc.kind)
    except Exception as exc:  # noqa: BLE001 - left to recovery (presumed abort); noted on the original error
        if cause is not None:
            cause.add_note(f"rollback of branch {resource.name} also failed: {type(exc).__name__}: {exc}")
        _log.warning("T2 branch %s: rollback failed, left to recovery: %s", resource.name, exc)
        return BranchResult(resource.name, BranchOutcome.UNKNOWN, one, f"{type(exc).__name__}: {exc}")
    return BranchResult(resource.name, BranchOutcome.ROLLED_BACK, one)


def _progress(gtrid: str, results: Sequence[BranchResult], now: float) -> Progress:
    done = tuple(b.name for b in results if b.outcome is BranchOutcome.COMMITTED)
    unknown = tuple(b.name for b in results if b.outcome is BranchOutcome.UNKNOWN)
    return Progress(gtrid, done, unknown, now)
