"""A transport-neutral JMS message (JMS 2.0 chapter 3), shared by the mapping layer and the STOMP transport.

JMS distinguishes property and map-entry types that Python does not (byte/short/int/long, float/double), so typed
values are carried as :class:`Typed`. Bodies by type:

=========  ==================================================
TEXT       ``str``
BYTES      ``bytes``
MAP        ``dict[str, Typed]``
STREAM     ``list[Typed]``
OBJECT     ``bytes`` (the serialised object; opaque to nsjms)
MESSAGE    ``None`` (a message with no body)
=========  ==================================================
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DEDUPE_PROPERTY", "BodyType", "DeliveryMode", "Destination", "JmsMessage", "JmsType", "Typed"]

#: The String property that carries the dedupe id of every message nsjms sends for an event (docs/bridge.md).
DEDUPE_PROPERTY = "nsjms_dedupe_id"


class BodyType(enum.StrEnum):
    TEXT = "text"
    BYTES = "bytes"
    MAP = "map"
    STREAM = "stream"
    OBJECT = "object"
    MESSAGE = "message"


class JmsType(enum.StrEnum):
    """Java types of JMS property values and map/stream entries (JMS 3.5.4, 3.11)."""

    BOOLEAN = "boolean"
    BYTE = "byte"
    SHORT = "short"
    INT = "int"
    LONG = "long"
    FLOAT = "float"
    DOUBLE = "double"
    STRING = "string"
    CHAR = "char"        # map/stream entries only
    BYTES = "bytes"      # map/stream entries only (byte[])


@dataclass(frozen=True)
class Typed:
    """A value with its JMS type, e.g. ``Typed(JmsType.INT, 42)``."""

    type: JmsType
    value: bool | int | float | str | bytes


class DeliveryMode(enum.IntEnum):
    NON_PERSISTENT = 1
    PERSISTENT = 2


@dataclass(frozen=True)
class Destination:
    """A queue or topic by name (``kind`` is ``"queue"`` or ``"topic"``)."""

    kind: str
    name: str

    def stomp(self) -> str:
        return f"/{self.kind}/{self.name}"


@dataclass(frozen=True)
class JmsMessage:
    body_type: BodyType
    body: object = None
    destination: Destination | None = None
    delivery_mode: DeliveryMode = DeliveryMode.PERSISTENT
    priority: int = 4                       # JMS 0-9, default 4
    expiration: int = 0                     # ms since the Unix epoch, 0 = never
    delivery_time: int = 0                  # ms since the Unix epoch, 0 = at once (JMS 2.0 delivery delay)
    timestamp: int = 0                      # ms since the Unix epoch
    message_id: str | None = None
    correlation_id: str | None = None
    reply_to: Destination | None = None
    jms_type: str | None = None             # JMSType
    redelivered: bool = False
    properties: Mapping[str, Typed] = field(default_factory=dict)
