"""The default :class:`~router.jms.transport.MessageCodec` of both transports: TEXT/BYTES bodies and String
properties as STOMP headers (the mapping layer's codec, :mod:`router.mapping.stomp_codec`, carries everything else)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from router.jms.errors import LocalProtocolError
from router.jms.model import DEDUPE_PROPERTY, BodyType, DeliveryMode, Destination, JmsMessage, JmsType, Typed
from router.jms.transport import Delivery, EncodedMessage, parse_destination

__all__ = ["RESERVED_HEADERS", "SimpleCodec", "body_lost", "frame_delivery"]


#: Headers with a STOMP or JMS-header meaning; never application properties.
RESERVED_HEADERS = frozenset({
    "destination", "message-id", "subscription", "ack", "receipt", "receipt-id", "transaction", "content-length",
    "content-type", "expires", "priority", "persistent", "timestamp", "redelivered", "correlation-id", "reply-to",
    "type", "id", "selector", "AMQ_SCHEDULED_DELAY",
})


class SimpleCodec:
    """TEXT/BYTES/empty bodies, String properties and the STOMP-mapped JMS headers (digest §13.4).

    Other body types and non-String properties are refused with :class:`LocalProtocolError`: supply the mapping
    layer's codec for those.
    """

    name = "simple"

    def __init__(self, clock_ms: Callable[[], int] | None = None) -> None:
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))

    def check(self, encoded: EncodedMessage) -> None:
        """Nothing to check: what :meth:`encode` cannot carry it refuses itself."""

    def encode(self, message: JmsMessage) -> EncodedMessage:
        headers = self._jms_headers(message)
        for name, value in message.properties.items():
            headers[name] = self._property(name, value)
        body, is_bytes = self._body(message)
        if is_bytes:
            headers["content-length"] = str(len(body))
        return EncodedMessage(headers, body)

    def decode(self, headers: Mapping[str, str], body: bytes) -> JmsMessage:
        is_bytes = "content-length" in headers
        props = {k: Typed(JmsType.STRING, v) for k, v in headers.items() if k not in RESERVED_HEADERS}
        reply = headers.get("reply-to")
        return JmsMessage(
            body_type=BodyType.BYTES if is_bytes else BodyType.TEXT,
            body=bytes(body) if is_bytes else body.decode("utf-8", errors="replace"),
            destination=_maybe_destination(headers.get("destination")),
            delivery_mode=(DeliveryMode.PERSISTENT if headers.get("persistent") == "true"
                           else DeliveryMode.NON_PERSISTENT),
            priority=_int(headers.get("priority"), 4), expiration=_int(headers.get("expires"), 0),
            timestamp=_int(headers.get("timestamp"), 0), message_id=headers.get("message-id"),
            correlation_id=headers.get("correlation-id"), reply_to=_maybe_destination(reply),
            jms_type=headers.get("type"), redelivered=headers.get("redelivered") == "true", properties=props)

    def _jms_headers(self, message: JmsMessage) -> dict[str, str]:
        headers = {"priority": str(message.priority)}
        if message.expiration:
            headers["expires"] = str(message.expiration)
        delay = message.delivery_time - self._clock_ms() if message.delivery_time else 0
        if delay > 0:
            headers["AMQ_SCHEDULED_DELAY"] = str(delay)
        optional = {"correlation-id": message.correlation_id, "type": message.jms_type,
                    "reply-to": message.reply_to.stomp() if message.reply_to else None}
        headers.update({k: v for k, v in optional.items() if v is not None})
        return headers

    @staticmethod
    def _property(name: str, value: Typed) -> str:
        if name in RESERVED_HEADERS or not name:
            raise LocalProtocolError(f"property name {name!r} clashes with a STOMP header")
        if value.type is not JmsType.STRING or not isinstance(value.value, str):
            raise LocalProtocolError(f"SimpleCodec carries String properties only; {name!r} is {value.type}")
        return value.value

    @staticmethod
    def _body(message: JmsMessage) -> tuple[bytes, bool]:
        kind, body = message.body_type, message.body
        if kind is BodyType.TEXT and isinstance(body, str):
            return body.encode("utf-8"), False
        if kind is BodyType.BYTES and isinstance(body, (bytes, bytearray)):
            return bytes(body), True
        if kind is BodyType.MESSAGE:
            return b"", False
        raise LocalProtocolError(f"SimpleCodec cannot carry a {kind} body of type {type(body).__name__}")


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def _maybe_destination(text: str | None) -> Destination | None:
    if not text:
        return None
    try:
        return parse_destination(text)
    except LocalProtocolError:
        return None


#: What marks a body an empty frame still has: ActiveMQ's ``content-length`` (a BytesMessage), the mapping codec's
#: body kind (``nsjms_body``) and IDL type (``$nsjms_idl``); besides, the MapMessage transformation.
_BODY_MARKS = ("content-length", "nsjms_body", "$nsjms_idl")


def frame_delivery(message: JmsMessage, headers: Mapping[str, str], body: bytes, *, subscription: str, ack_id: str,
                   message_id: str, epoch: int, decode_error: str | None) -> Delivery:
    """The :class:`~router.jms.transport.Delivery` of a received STOMP MESSAGE frame, its typed fields read from
    the frame's headers once, here: the STOMP transport's and the in-memory twin's (whose frames have the same
    headers) deliveries."""
    try:
        timestamp = int(headers.get("timestamp") or 0)
    except ValueError:
        timestamp = 0
    return Delivery(message=message, headers=headers, body=body, subscription=subscription, ack_id=ack_id,
                    message_id=message_id, destination=headers.get("destination", ""),
                    redelivered=headers.get("redelivered") == "true", epoch=epoch, decode_error=decode_error,
                    timestamp_ms=timestamp, dedupe_id=headers.get(DEDUPE_PROPERTY),
                    body_lost=body_lost(headers, body))


def body_lost(headers: Mapping[str, str], body: bytes) -> bool:
    """An empty body that nothing marks: over STOMP a Java Map/Stream/Object message arrives exactly like this
    (ENVIRONMENT.md, docs/bridge.md), so it cannot be told from an empty TextMessage."""
    return (not body and not any(mark in headers for mark in _BODY_MARKS)
            and headers.get("transformation") != "jms-map-json")
