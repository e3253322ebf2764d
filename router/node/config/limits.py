"""The node's one event size limit and the ORB message size derived from it (``node.max_event_bytes``,
``orb.giop_max_msg_size``; docs/configuration.md)."""

from __future__ import annotations

__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "GIOP_HEADROOM",
    "MAX_GIOP_MAX_MSG_SIZE",
    "MAX_MAX_EVENT_BYTES",
    "MIN_MAX_EVENT_BYTES",
    "default_giop_max_msg_size",
    "min_giop_max_msg_size",
]

#: ``node.max_event_bytes``: the one event size limit of a node (CDR-encoded StructuredEvent), see NodeConfig.
DEFAULT_MAX_EVENT_BYTES = 8 * 1024 * 1024
MIN_MAX_EVENT_BYTES = 64 * 1024
MAX_MAX_EVENT_BYTES = 256 * 1024 * 1024     # the ORB's giopMaxMsgSize (4x + 1 MiB) stays well below 4 GiB
GIOP_HEADROOM = 1024 * 1024                 # GIOP/request headers and a few small events around a big one
MAX_GIOP_MAX_MSG_SIZE = 2**32 - 1           # omniORB's giopMaxMsgSize is a CORBA::ULong


def default_giop_max_msg_size(max_event_bytes: int) -> int:
    """The ORB's ``giopMaxMsgSize`` when ``orb.giop_max_msg_size`` is not set: 4 x ``node.max_event_bytes`` + 1 MiB.

    Well above the event limit, so a push of an event even several times too large reaches the channel, which
    answers ``IMP_LIMIT`` (do not retry), instead of the ORB cutting the connection (``COMM_FAILURE``, which
    suppliers retry: issue 31, a 20 MB push against a 17 MiB ORB limit)."""
    return 4 * max_event_bytes + GIOP_HEADROOM


def min_giop_max_msg_size(max_event_bytes: int) -> int:
    """The smallest ``orb.giop_max_msg_size`` accepted: 2 x ``node.max_event_bytes`` + 1 MiB, so a push of an event
    at the limit, and every message the channel sends, fit in one ORB message."""
    return 2 * max_event_bytes + GIOP_HEADROOM
