"""The exceptions of the ``xa`` package: one tree, every class carrying the global transaction id it is about.

::

    XAError                          base; ``gtrid`` (str | None)
    ├── UsageError                   the CALLER misused the API (a bug in nsjms, never retried)
    │   ├── IllegalTransition        an event not allowed in the current state (xa.states)
    │   ├── DuplicateBranch          two participants with the same branch name in one transaction
    │   └── ForeignXid               an xid of another node / format handed to this node's recovery
    ├── TransactionRolledBack        the transaction ended in ROLLBACK; ``reason`` says why (rollback-only, ...)
    │   └── TransactionTimeout       not decided by its deadline, so rolled back (NJI 2.7.6 TransactionTimeout)
    ├── DecisionUnknown              the coordinator cannot tell whether its COMMIT record is durable; branches
    │                                are left prepared and recovery (reading the log from disk) decides
    ├── ResourceError                a PEER (participant) failed; ``branch`` names it
    │   ├── PrepareFailed            the participant voted no / could not prepare
    │   ├── BranchUnavailable        the participant could not be reached; the outcome of the call is unknown
    │   ├── OutcomeUnknown           a one-phase commit whose result never came back (missing STOMP receipt):
    │   │                            UNKNOWN, never "aborted"
    │   ├── BranchNotFound           the prepared branch does not exist (any more): already committed/rolled back
    │   └── HeuristicOutcome         the participant decided on its own; ``kind`` is a :class:`HeuristicKind`
    └── LogError                     the recovery log failed
        ├── LogWriteFailed           the record is guaranteed NOT to be in the log (safe to roll back)
        ├── LogDurabilityUnknown     the record may or may not be durable; the log refuses further writes
        └── LogCorrupted             damage that is not a torn tail: the log refuses to open (operator action)

Every exception is picklable (``__reduce__`` rebuilds it from its constructor arguments), so it can cross a
process boundary (a recovery subprocess, a CLI) intact. Third-party errors (psycopg, OSError) are translated
into these at one boundary per adapter (``xa.pg``, ``xa.log``) with ``raise ... from exc``.
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = [
    "BranchNotFound",
    "BranchUnavailable",
    "DecisionUnknown",
    "DuplicateBranch",
    "ForeignXid",
    "HeuristicKind",
    "HeuristicOutcome",
    "IllegalTransition",
    "LogCorrupted",
    "LogDurabilityUnknown",
    "LogError",
    "LogWriteFailed",
    "OutcomeUnknown",
    "PrepareFailed",
    "ResourceError",
    "TransactionRolledBack",
    "TransactionTimeout",
    "UsageError",
    "XAError",
]


class HeuristicKind(enum.StrEnum):
    """What a participant (or an operator) did on its own, against or without the coordinator's decision."""

    COMMIT = "commit"
    ROLLBACK = "rollback"
    MIXED = "mixed"  # part committed, part rolled back
    HAZARD = "hazard"  # the participant's outcome cannot be learned


class XAError(Exception):
    """Base of every ``xa`` exception. ``gtrid`` is the global transaction id concerned, when there is one."""

    def __init__(self, message: str, *, gtrid: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.gtrid = gtrid

    def _kwargs(self) -> dict[str, Any]:
        return {"gtrid": self.gtrid}

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self._kwargs()))

    def __str__(self) -> str:
        return self.message if self.gtrid is None else f"{self.message} [gtrid={self.gtrid}]"


def _rebuild(cls: type[XAError], message: str, kwargs: dict[str, Any]) -> XAError:
    return cls(message, **kwargs)


# ------------------------------------------------------------------------------------------- misuse
class UsageError(XAError):
    """The caller used the API wrongly (a programming error): never retried, never a peer's fault."""


class IllegalTransition(UsageError):
    """``event`` is not allowed in ``state`` (see :data:`xa.states.TRANSITIONS`)."""

    def __init__(self, message: str, *, gtrid: str | None = None, state: str = "", event: str = "") -> None:
        super().__init__(message, gtrid=gtrid)
        self.state = state
        self.event = event

    def _kwargs(self) -> dict[str, Any]:
        return {"gtrid": self.gtrid, "state": self.state, "event": self.event}


class DuplicateBranch(UsageError):
    """A second participant with an already enlisted branch name."""


class ForeignXid(UsageError):
    """An xid that belongs to another node or another format id: this node never touches it."""


# ------------------------------------------------------------------------------------------ outcome
class TransactionRolledBack(XAError):
    """The transaction was rolled back instead of committed; ``reason`` says why."""

    def __init__(self, message: str, *, gtrid: str | None = None, reason: str = "") -> None:
        super().__init__(message, gtrid=gtrid)
        self.reason = reason

    def _kwargs(self) -> dict[str, Any]:
        return {"gtrid": self.gtrid, "reason": self.reason}


class TransactionTimeout(TransactionRolledBack):
    """Not decided by its deadline (``TransactionTimeout`` admin property), so rolled back."""


class DecisionUnknown(XAError):
    """The COMMIT record may or may not be durable; branches stay prepared until recovery reads the log."""


# ------------------------------------------------------------------------------------- peer failure
class ResourceError(XAError):
    """A participant failed. ``branch`` is its branch name (the xid's branch qualifier)."""

    def __init__(self, message: str, *, gtrid: str | None = None, branch: str = "") -> None:
        super().__init__(message, gtrid=gtrid)
        self.branch = branch

    def _kwargs(self) -> dict[str, Any]:
        return {"gtrid": self.gtrid, "branch": self.branch}


class PrepareFailed(ResourceError):
    """The participant could not prepare (it votes no)."""


class BranchUnavailable(ResourceError):
    """The participant could not be reached; whatever the call was meant to do may or may not have happened."""


class OutcomeUnknown(ResourceError):
    """A one-phase commit sent but never confirmed (no STOMP receipt). Unknown, never treated as aborted."""


class BranchNotFound(ResourceError):
    """No such prepared branch: it was already committed or rolled back (by us earlier, or by an operator)."""


class HeuristicOutcome(ResourceError):
    """The participant took a heuristic decision of ``kind``; kept in the log until an operator forgets it."""

    def __init__(
        self, message: str, *, gtrid: str | None = None, branch: str = "",
        kind: HeuristicKind = HeuristicKind.HAZARD,
    ) -> None:
        super().__init__(message, gtrid=gtrid, branch=branch)
        self.kind = HeuristicKind(kind)

    def _kwargs(self) -> dict[str, Any]:
        return {"gtrid": self.gtrid, "branch": self.branch, "kind": self.kind}


# ----------------------------------------------------------------------------------------------- log
class LogError(XAError):
    """The recovery log failed."""


class LogWriteFailed(LogError):
    """The append failed and the record is guaranteed not to be in the log (the tail was cut back and synced)."""


class LogDurabilityUnknown(LogError):
    """The record may or may not have reached the disk; the log refuses every further write until reopened."""


class LogCorrupted(LogError):
    """A damaged record followed by valid ones (not a torn tail): the log refuses to open rather than guess."""
