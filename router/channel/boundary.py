"""The channel's limits and the mapping of its own failures to CORBA exceptions (the servant boundary).

Servants call :func:`store_faults` (defined with the minor codes in ``router.routing.faults``, which the bridge's
servants share) around work that touches the store, so a supplier sees a CORBA system exception
it can act on instead of ``UNKNOWN``:

=====================================  ===========================================================================
``StoreUnavailable``                   ``TRANSIENT`` (minor ``MINOR_STORE_UNAVAILABLE``), ``COMPLETED_NO``; retry.
                                       ``COMPLETED_MAYBE`` only when the connection broke during COMMIT.
``StoreTimeout``                       ``TRANSIENT`` (minor ``MINOR_STORE_TIMEOUT``), ``COMPLETED_NO``: the database
                                       cancelled a statement (statement or lock timeout); nothing stored; a retry
                                       may succeed. Told apart from an outage by its minor code.
other ``StoreError``                   ``PERSIST_STORE`` (minor ``MINOR_STORE_FAILED``), ``COMPLETED_NO``.
event above ``max_event_bytes``        ``IMP_LIMIT`` (minor ``MINOR_EVENT_TOO_LARGE``), ``COMPLETED_NO``; do not
                                       retry the same event.
event nested deeper than 512 levels    ``BAD_PARAM`` (minor ``MINOR_EVENT_TOO_DEEP``), ``COMPLETED_NO``; do not
                                       retry the same event (``router.channel.sizing.MAX_EVENT_DEPTH``).
blocking pull waited ``max_pull_wait``  ``TRANSIENT`` (minor ``MINOR_PULL_WAIT_OVER``), ``COMPLETED_NO``, nothing
                                       taken; pull again.
=====================================  ===========================================================================

Minor codes carry the unofficial vendor id ``NSJMS_VMCID`` (``0x4E530000``, "NS"), which the OMG did not assign;
they are documented in ``docs/channel.md``.

Delivery outcomes (:class:`Outcome`) classify a failed push: a failure caused by the event itself (its size or
content: ``MARSHAL``, ``IMP_LIMIT``, ``BAD_PARAM``, ``DATA_CONVERSION``, or a conversion error in the channel) is
tried :data:`POISON_ATTEMPTS` times alone and then dead-lettered, so it cannot stall the events behind it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from omniORB import CORBA

from router.routing.eventsize import DEFAULT_MAX_EVENT_BYTES as _NODE_DEFAULT
from router.routing.eventsize import default_giop_max_msg_size, min_giop_max_msg_size
from router.routing.faults import (
    MINOR_EVENT_TOO_DEEP,
    MINOR_EVENT_TOO_LARGE,
    MINOR_PULL_WAIT_OVER,
    MINOR_STORE_FAILED,
    MINOR_STORE_TIMEOUT,
    MINOR_STORE_UNAVAILABLE,
    NSJMS_VMCID,
    store_boundary,
    store_faults,
)

__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "EVENT_SPECIFIC",
    "MINOR_EVENT_TOO_DEEP",
    "MINOR_EVENT_TOO_LARGE",
    "MINOR_PULL_WAIT_OVER",
    "MINOR_STORE_FAILED",
    "MINOR_STORE_TIMEOUT",
    "MINOR_STORE_UNAVAILABLE",
    "NSJMS_VMCID",
    "POISON_ATTEMPTS",
    "Outcome",
    "check_size",
    "giop_max_msg_size",
    "min_giop_max_msg_size",
    "store_boundary",
    "store_faults",
]

DEFAULT_MAX_EVENT_BYTES = _NODE_DEFAULT        # CDR-encoded size of one event (node.max_event_bytes)
POISON_ATTEMPTS = 3                             # event-specific failures of one event, alone, before dead-lettering

# Push failures caused by the event, not by the consumer's availability.
EVENT_SPECIFIC: tuple[type[Exception], ...] = (CORBA.MARSHAL, CORBA.IMP_LIMIT, CORBA.BAD_PARAM,
                                               CORBA.DATA_CONVERSION)


class Outcome(enum.Enum):
    """What one delivery attempt of a batch came to."""

    DELIVERED = "delivered"
    RETRY = "retry"                # consumer unavailable: keep the batch, retry with backoff
    GONE = "gone"                  # consumer no longer exists: the proxy disconnects
    EVENT_FAILED = "event_failed"  # the batch's content failed: isolate, count, dead-letter after the limit


def giop_max_msg_size(max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> int:
    """The ORB's default ``giopMaxMsgSize`` for a node whose events may be ``max_event_bytes`` long
    (:func:`router.routing.eventsize.default_giop_max_msg_size`: 4 x the limit + 1 MiB)."""
    return default_giop_max_msg_size(max_event_bytes)


def check_size(size: int, limit: int) -> None:
    """Refuse an event whose encoded size is above the channel's limit (0 = no limit)."""
    if limit and size > limit:
        raise CORBA.IMP_LIMIT(MINOR_EVENT_TOO_LARGE, CORBA.COMPLETED_NO)


def store_boundary_all(tables: Iterable[dict[str, type]]) -> None:
    for table in tables:
        store_boundary(*table.values())


def describe(exc: BaseException) -> str:
    """A short, operator-readable reason for a failed delivery (a system exception with its minor code's name)."""
    if isinstance(exc, CORBA.SystemException):
        return str(exc).removeprefix("CORBA.")
    return f"{type(exc).__name__}: {exc}"
