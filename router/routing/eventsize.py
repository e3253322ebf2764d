"""The node's one event size limit (``node.max_event_bytes``), which the channel refuses above and the bridge
dead-letters above, and the ORB message size derived from it (``orb.giop_max_msg_size``; docs/configuration.md).

Defined here, below the channel and the bridge that both check it; the configuration (``router.node.config``)
validates the configured values against these and the bounds of its keys.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "GIOP_HEADROOM", "default_giop_max_msg_size", "min_giop_max_msg_size"]

#: ``node.max_event_bytes``: the one event size limit of a node (CDR-encoded StructuredEvent), see NodeConfig.
DEFAULT_MAX_EVENT_BYTES = 8 * 1024 * 1024
GIOP_HEADROOM = 1024 * 1024                 # GIOP/request headers and a few small events around a big one


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
