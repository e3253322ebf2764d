"""The bounds of the configuration's size keys (``node.max_event_bytes``, ``orb.giop_max_msg_size``;
docs/configuration.md). The limit's default and the ORB message size derived from it are the channel's and the
bridge's (:mod:`router.routing.eventsize`), re-exported here with the configuration that validates them."""

from __future__ import annotations

from router.routing.eventsize import (
    DEFAULT_MAX_EVENT_BYTES,
    GIOP_HEADROOM,
    default_giop_max_msg_size,
    min_giop_max_msg_size,
)

__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "GIOP_HEADROOM",
    "MAX_GIOP_MAX_MSG_SIZE",
    "MAX_MAX_EVENT_BYTES",
    "MIN_MAX_EVENT_BYTES",
    "default_giop_max_msg_size",
    "min_giop_max_msg_size",
]

MIN_MAX_EVENT_BYTES = 64 * 1024
MAX_MAX_EVENT_BYTES = 256 * 1024 * 1024     # the ORB's giopMaxMsgSize (4x + 1 MiB) stays well below 4 GiB
MAX_GIOP_MAX_MSG_SIZE = 2**32 - 1           # omniORB's giopMaxMsgSize is a CORBA::ULong
