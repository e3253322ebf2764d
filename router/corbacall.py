"""The one boundary for OUTGOING CORBA calls the node makes to objects it does not own (clients, filters, proxies).

A call goes through :func:`call` with a named :class:`CallPolicy` (its client-call timeout and how often a transient
failure is retried); CORBA exceptions come back as one exception type, :class:`CallFailed`, whose ``kind`` says
what the caller may conclude:

==============  ============================================================  =========================================
kind            CORBA exceptions                                              meaning
==============  ============================================================  =========================================
``gone``        ``OBJECT_NOT_EXIST``, ``CosEventComm::Disconnected``          the object no longer exists: stop using it
``unavailable`` ``TRANSIENT``, ``COMM_FAILURE``, ``TIMEOUT``, ``NO_RESPONSE``  retry later (after the policy's retries)
``refused``     any other system exception, or a user exception the caller    this call will fail again as it is
                did not list in ``expected``
==============  ============================================================  =========================================

User exceptions the caller lists in ``expected`` propagate unchanged (they are answers, not failures).
:func:`best_effort` is for notifications whose failure only gets logged (``subscription_change``, ``acknowledge``).

The data paths' push/pull calls keep their own classification (``router.channel.boundary.Outcome``), since a failure
there also depends on the event (poison detection); they still take their timeouts from the policies here.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import omniORB
from omniORB import CORBA

import CosEventComm

__all__ = ["ADMIN", "CHANNEL", "FILTER", "NOTIFY", "PROBE", "CallFailed", "CallPolicy", "Kind", "best_effort", "call",
           "classify"]

log = logging.getLogger("nsjms.corba")


@dataclass(frozen=True)
class CallPolicy:
    """How one kind of outgoing call is made."""

    name: str
    timeout_ms: int            # omniORB client call timeout on a remote reference (0: the ORB's default)
    retries: int = 0           # further attempts after an ``unavailable`` failure
    backoff_s: float = 0.05    # first wait between attempts (doubled each time)


#: ``subscription_change`` / ``offer_change`` / ``acknowledge`` to a client: best effort, never blocks a data path.
NOTIFY = CallPolicy("notify", 5000)
#: ``_is_a`` / ``_non_existent`` on a client, to learn what it is or whether it is still there. No timeout of its
#: own: the reference is the one the data path uses, whose timeout the data path sets (a per-reference setting).
PROBE = CallPolicy("probe", 0)
#: ``match`` / ``match_structured`` of a filter or mapping filter the channel did not create.
FILTER = CallPolicy("filter", 5000)
#: A bridge's administrative calls on its own channel objects (``resume_connection``, ...).
ADMIN = CallPolicy("admin", 10000, retries=2, backoff_s=0.2)
#: A bridge's data-path calls on its own channel's proxy and admin, in this process (``acknowledge`` to an Ack
#: proxy, ``suspend_connection`` at stop_bridge, the admin's ``destroy``): no timeout of their own, no retries (a
#: failed acknowledge only makes the channel resend).
CHANNEL = CallPolicy("channel", 0)


class Kind(enum.StrEnum):
    GONE = "gone"
    UNAVAILABLE = "unavailable"
    REFUSED = "refused"


class CallFailed(Exception):
    """An outgoing call failed; ``kind`` (:class:`Kind`) says what may be concluded; ``cause`` is the CORBA one."""

    def __init__(self, policy: CallPolicy, operation: str, kind: Kind, cause: BaseException) -> None:
        super().__init__(f"{operation} ({policy.name}) failed: {kind.value}: {_text(cause)}")
        self.policy, self.operation, self.kind, self.cause = policy, operation, kind, cause


_GONE: tuple[type[BaseException], ...] = (CORBA.OBJECT_NOT_EXIST, CosEventComm.Disconnected)
_UNAVAILABLE: tuple[type[BaseException], ...] = (CORBA.TRANSIENT, CORBA.COMM_FAILURE, CORBA.TIMEOUT,
                                                 CORBA.NO_RESPONSE)


def classify(exc: BaseException) -> Kind:
    """The :class:`Kind` of a CORBA exception (pure)."""
    if isinstance(exc, _GONE):
        return Kind.GONE
    if isinstance(exc, _UNAVAILABLE):
        return Kind.UNAVAILABLE
    return Kind.REFUSED


def call(target: Any, operation: str, *args: Any, policy: CallPolicy,
         expected: tuple[type[BaseException], ...] = (), stop: threading.Event | None = None) -> Any:
    """``target.operation(*args)`` under ``policy``. ``target`` is an object reference or a local servant (no
    timeout is set on a servant). Raises :class:`CallFailed`, or one of ``expected`` unchanged."""
    if policy.timeout_ms and isinstance(target, CORBA.Object):
        omniORB.setClientCallTimeout(target, policy.timeout_ms)
    method: Callable[..., Any] = getattr(target, operation)
    wait, attempt = policy.backoff_s, 0
    while True:
        try:
            return method(*args)
        except expected:
            raise
        except (CORBA.Exception, CosEventComm.Disconnected) as exc:
            kind = classify(exc)
            if kind is Kind.UNAVAILABLE and attempt < policy.retries:
                attempt += 1
                if (stop or threading.Event()).wait(wait):
                    raise CallFailed(policy, operation, kind, exc) from exc
                wait *= 2
                continue
            raise CallFailed(policy, operation, kind, exc) from exc


def best_effort(target: Any, operation: str, *args: Any, policy: CallPolicy, what: str,
                logger: logging.Logger = log) -> bool:
    """:func:`call` whose failure is only logged (INFO, with ``what``); True if the call returned."""
    try:
        call(target, operation, *args, policy=policy)
    except CallFailed as exc:
        logger.info("%s: %s", what, exc)
        return False
    return True


def _text(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text and text != type(exc).__name__ else type(exc).__name__
