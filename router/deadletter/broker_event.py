"""A retry of an *event* a channel -> JMS bridge dead-lettered to ``nsjms.DLQ`` (``nsjms_dlq_origin=event``): the
dead letter's body is the StructuredEvent's CDR encapsulation; the copy a retry sends is that event mapped again
exactly as the bridge maps it (:func:`router.mapping.event_to_jms`, encoded by the node's STOMP codec,
:class:`router.mapping.stomp_codec.StompCodec`, with ActiveMQ's limits checked), to the bridge's JMS destination.

Pure apart from the ORB's unmarshalling; raises :class:`EventUnmappable` with the reason when the bytes are not a
StructuredEvent or the mapping (or the broker's limits) still refuses it.
"""

from __future__ import annotations

import re
import time

from router.jms.browsing import BrowsedMessage, OutgoingCopy
from router.jms.model import Destination
from router.mapping import event_to_jms
from router.mapping.errors import MappingError
from router.mapping.stomp_codec import StompCodec

__all__ = ["EventUnmappable", "event_copy", "sink_destination"]

_SINK = re.compile(r"^(queue|topic):([^\s\[]+)")


class EventUnmappable(Exception):
    """The dead-lettered event cannot be mapped to a message (the reason in the message)."""


def sink_destination(sink: str) -> str | None:
    """A bridge's sink as ``nsjms bridge list`` words it (``queue:NAME [profile] (push)``) as a STOMP destination;
    None for a channel sink."""
    m = _SINK.match(sink.strip())
    return f"/{m.group(1)}/{m.group(2)}" if m else None


def event_copy(msg: BrowsedMessage, destination: str) -> OutgoingCopy:
    """The message the bridge would have sent for the dead-lettered event ``msg`` holds, to ``destination``."""
    import omniORB

    import CosNotification


    kind, _, name = destination.strip("/").partition("/")
    if kind not in ("queue", "topic") or not name:
        raise EventUnmappable(f"not a JMS destination: {destination!r}")
    from omniORB import CORBA

    CORBA.ORB_init(["nsjms-deadletter"], CORBA.ORB_ID)     # the process's ORB (the node's own; the CLI's: a new one)
    try:
        event = omniORB.cdrUnmarshal(CosNotification._tc_StructuredEvent, bytes(msg.body))
    except Exception as exc:  # noqa: BLE001 - any unmarshalling failure: the bytes are not an event
        raise EventUnmappable(f"its body is not a StructuredEvent's CDR encoding ({type(exc).__name__})") from None
    codec = StompCodec()
    try:
        jms = event_to_jms(event, Destination(kind, name), now_ms=int(time.time() * 1000))
        encoded = codec.encode(jms)
        codec.check(encoded)
    except MappingError as exc:
        raise EventUnmappable(f"the mapping still refuses it: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - as the bridge: any failure to map the event refuses this event only
        raise EventUnmappable(f"the mapping still fails: {type(exc).__name__}: {exc}") from None
    return OutgoingCopy(destination, dict(encoded.headers), bytes(encoded.body))
