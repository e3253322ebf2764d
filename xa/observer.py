"""What the coordinator and recovery tell an observer (telemetry), without ``xa`` knowing who listens.

:class:`Observer` is a small protocol with a no-op default (:class:`NullObserver`); the router implements it
with OpenTelemetry (``router.telemetry.T2Telemetry``). ``xa`` imports nothing of the router.

Calls, for one transaction (from the thread that drives it)::

    begun ─► phase_started/phase_ended (BEGIN, per participant, at enlist)
          ─► phase_started/phase_ended (PREPARE, per participant)
          ─► decided("commit")  ─► phase_started/phase_ended (COMMIT, per participant) ─► ended
          └► decided("rollback") ─► phase_started/phase_ended (ROLLBACK, per participant) ─► ended

``ended`` comes once, when the coordinator stops driving the transaction (COMMITTED, ROLLED_BACK, or handed to
recovery: COMMIT_PENDING, IN_DOUBT, a heuristic state). ``recovery_pass`` comes after every
:meth:`xa.recovery.RecoveryManager.run` (with ``failed`` set when the pass raised).

An observer must be fast and must never raise; :class:`Guarded` wraps one so that a failing observer is logged
and never changes the outcome of a transaction.
"""

from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING, Protocol

from .states import State

if TYPE_CHECKING:
    from .recovery import RecoveryReport

__all__ = ["Guarded", "NullObserver", "Observer", "Phase"]

_log = logging.getLogger("xa.observer")


class Phase(enum.StrEnum):
    BEGIN = "begin"  # Resource.begin at enlist
    PREPARE = "prepare"
    COMMIT = "commit"
    ROLLBACK = "rollback"


class Observer(Protocol):
    def begun(self, gtrid: str, timeout: float | None) -> None:
        """A transaction began (``timeout``: seconds, None = no deadline)."""

    def phase_started(self, gtrid: str, phase: Phase, branch: str, kind: str) -> None:
        """One participant's ``phase`` call starts."""

    def phase_ended(self, gtrid: str, phase: Phase, branch: str, result: str, error: str) -> None:
        """That call returned: ``result`` is ``ok``, ``failed``, or a branch outcome (``COMMITTED``,
        ``UNKNOWN``, ...); ``error`` the failure text or ``""``."""

    def decided(self, gtrid: str, decision: str, reason: str) -> None:
        """``commit`` (the COMMIT record is durable) or ``rollback`` (with the reason)."""

    def ended(self, gtrid: str, state: State, timed_out: bool, duration_s: float) -> None:
        """The coordinator stopped driving the transaction in ``state``, ``duration_s`` after ``begun``."""

    def recovery_pass(self, report: RecoveryReport, duration_s: float, failed: str) -> None:
        """A recovery pass finished (``failed``: why it raised, ``""`` when it did not)."""


class NullObserver:
    """The default: does nothing."""

    def begun(self, gtrid: str, timeout: float | None) -> None:
        pass

    def phase_started(self, gtrid: str, phase: Phase, branch: str, kind: str) -> None:
        pass

    def phase_ended(self, gtrid: str, phase: Phase, branch: str, result: str, error: str) -> None:
        pass

    def decided(self, gtrid: str, decision: str, reason: str) -> None:
        pass

    def ended(self, gtrid: str, state: State, timed_out: bool, duration_s: float) -> None:
        pass

    def recovery_pass(self, report: RecoveryReport, duration_s: float, failed: str) -> None:
        pass


class Guarded:
    """Forwards to an observer; an exception it raises is logged, never propagated."""

    def __init__(self, inner: Observer | None) -> None:
        self.inner: Observer = inner if inner is not None else NullObserver()

    def _warn(self, what: str, exc: Exception) -> None:
        _log.warning("telemetry observer failed in %s: %s: %s", what, type(exc).__name__, exc)

    def begun(self, gtrid: str, timeout: float | None) -> None:
        try:
            self.inner.begun(gtrid, timeout)
        except Exception as exc:  # noqa: BLE001 - telemetry never changes a transaction's outcome
            self._warn("begun", exc)

    def phase_started(self, gtrid: str, phase: Phase, branch: str, kind: str) -> None:
        try:
            self.inner.phase_started(gtrid, phase, branch, kind)
        except Exception as exc:  # noqa: BLE001 - as above
            self._warn("phase_started", exc)

    def phase_ended(self, gtrid: str, phase: Phase, branch: str, result: str, error: str) -> None:
        try:
            self.inner.phase_ended(gtrid, phase, branch, result, error)
        except Exception as exc:  # noqa: BLE001 - as above
            self._warn("phase_ended", exc)

    def decided(self, gtrid: str, decision: str, reason: str) -> None:
        try:
            self.inner.decided(gtrid, decision, reason)
        except Exception as exc:  # noqa: BLE001 - as above
            self._warn("decided", exc)

    def ended(self, gtrid: str, state: State, timed_out: bool, duration_s: float) -> None:
        try:
            self.inner.ended(gtrid, state, timed_out, duration_s)
        except Exception as exc:  # noqa: BLE001 - as above
            self._warn("ended", exc)

    def recovery_pass(self, report: RecoveryReport, duration_s: float, failed: str) -> None:
        try:
            self.inner.recovery_pass(report, duration_s, failed)
        except Exception as exc:  # noqa: BLE001 - as above
            self._warn("recovery_pass", exc)
