"""JMS headers and typed properties <-> STOMP frame headers (ActiveMQ Classic's STOMP mapping).

STOMP carries every header as a string, and ActiveMQ turns every non-standard SEND header into a **String** JMS
property. To keep the JMS type of each property across STOMP, the sender adds one companion header::

    nsjms_types: sev=int,ts=long,ok=boolean,load=double

listing every property that is *not* a String as ``name=type`` (``type`` one of boolean, byte, short, int, long,
float, double; in a name, ``%``, ``,`` and ``=`` are written ``%25``, ``%2C``, ``%3D``). Values are written as Java
would print them (``true``/``false``, decimal integers, shortest round-trip floats, ``NaN``, ``Infinity``).
The receiver parses the listed properties back; an unlisted property stays a String, except the JMS-defined
``JMSXDeliveryCount``, ``JMSXGroupSeq`` (int) and ``JMSXRcvTimestamp`` (long) when they look numeric.
The companion is itself an ordinary (String) JMS property, so a Java consumer can use it too.

Standard headers, SEND: ``persistent`` (``true``/``false``; ActiveMQ's STOMP default is NON-persistent, so it is
always sent), ``priority``, ``expires`` (when not 0), ``timestamp`` (when not 0), ``type``, ``correlation-id``,
``reply-to`` (``/queue/x``), ``destination``. JMSDeliveryTime has no STOMP header: it travels as
``nsjms_delivery_time`` (ms), and as ``AMQ_SCHEDULED_DELAY`` when ``now_ms`` is given and it lies in the future
(honoured only by a broker with ``schedulerSupport="true"``). MESSAGE frames add ``message-id``, ``redelivered``
(only when true) and ``persistent:true`` only for persistent messages.

STOMP 1.2 header escaping (``\\\\``, ``\\n``, ``\\r``, ``\\c``) is the transport's job, not done here.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.jms.model import DeliveryMode, Destination, JmsMessage, JmsType, Typed
from router.mapping import idltypes as it
from router.mapping.errors import MappingError

__all__ = [
    "BODY_HEADER",
    "DELIVERY_TIME_HEADER",
    "FRAME_HEADERS",
    "TYPES_HEADER",
    "StandardHeaders",
    "check_header_text",
    "decode_value",
    "encode_value",
    "from_stomp_headers",
    "parse_destination",
    "to_stomp_headers",
]

TYPES_HEADER = "nsjms_types"
DELIVERY_TIME_HEADER = "nsjms_delivery_time"
BODY_HEADER = "nsjms_body"
SCHEDULED_DELAY = "AMQ_SCHEDULED_DELAY"
#: Headers that belong to the STOMP frame or to ActiveMQ, never application properties.
FRAME_HEADERS = frozenset({
    "destination", "message-id", "ack", "subscription", "content-length", "content-type", "receipt",
    "transaction", "transformation", "transformation-error", "amq-msg-type", "persistent", "priority", "expires",
    "timestamp", "type", "correlation-id", "reply-to", "redelivered", "original-destination", "browser",
    "receipt-id", SCHEDULED_DELAY, "scheduledJobId", TYPES_HEADER, DELIVERY_TIME_HEADER, BODY_HEADER,
})
_RESERVED_PROPERTY_NAMES = FRAME_HEADERS
# An Enum member read from its class costs a descriptor call each time: these are read once.
_STRING, _INT, _LONG, _SHORT, _BYTE = JmsType.STRING, JmsType.INT, JmsType.LONG, JmsType.SHORT, JmsType.BYTE
_KNOWN_JMSX = {"JMSXDeliveryCount": JmsType.INT, "JMSXGroupSeq": JmsType.INT, "JMSXRcvTimestamp": JmsType.LONG}
_SENDABLE = frozenset({JmsType.BOOLEAN, JmsType.BYTE, JmsType.SHORT, JmsType.INT, JmsType.LONG, JmsType.FLOAT,
                       JmsType.DOUBLE, JmsType.STRING})


@dataclass(frozen=True)
class StandardHeaders:
    """The JMS header fields read from a STOMP frame (defaults as JMS / ActiveMQ would give them)."""

    destination: Destination | None = None
    delivery_mode: DeliveryMode = DeliveryMode.NON_PERSISTENT
    priority: int = 4
    expiration: int = 0
    delivery_time: int = 0
    timestamp: int = 0
    message_id: str | None = None
    correlation_id: str | None = None
    reply_to: Destination | None = None
    jms_type: str | None = None
    redelivered: bool = False


def to_stomp_headers(msg: JmsMessage, *, now_ms: int | None = None) -> dict[str, str]:
    """SEND headers for a :class:`~router.jms.model.JmsMessage` (body headers are added by ``stomp_body``)."""
    headers = _standard(msg, now_ms)
    types = []
    string = _STRING
    for name, value in msg.properties.items():
        if name in _RESERVED_PROPERTY_NAMES or not name:
            _check_property_name(name)
        raw = value.value
        if value.type is string and isinstance(raw, str):     # most properties: the text itself
            headers[name] = raw
            continue
        headers[name] = encode_value(value, f"property:{name}")
        if value.type != string:
            types.append(f"{_escape(name)}={value.type._value_}")
    if types:
        headers[TYPES_HEADER] = ",".join(types)
    check_header_text(headers)
    return headers


def check_header_text(headers: dict[str, str]) -> None:
    """Refuse a header a STOMP frame cannot carry: a NUL ends the frame (STOMP 1.2 has no escape for it), so it
    would split the frame at the receiver. CR, LF, ``:`` and ``\\`` are escaped by the transport."""
    if "\0" not in "".join(headers) and "\0" not in "".join(headers.values()):
        return                                     # the usual case, found in two scans
    for name, value in headers.items():
        for text in (name, value):
            if "\0" in text:
                field = name if name in FRAME_HEADERS else f"property:{name}"
                raise MappingError(f"a STOMP header cannot carry a NUL character (position {text.index(chr(0))})",
                                   field)


def _standard(msg: JmsMessage, now_ms: int | None) -> dict[str, str]:
    if not 0 <= msg.priority <= 9:
        raise MappingError(f"JMSPriority {msg.priority} is outside 0..9", "JMSPriority")
    headers = {"persistent": "true" if msg.delivery_mode == DeliveryMode.PERSISTENT else "false",
               "priority": str(msg.priority)}
    if msg.destination:                  # in this order (an encoded frame's headers keep it)
        headers["destination"] = msg.destination.stomp()
    if msg.expiration:
        headers["expires"] = str(msg.expiration)
    if msg.timestamp:
        headers["timestamp"] = str(msg.timestamp)
    if msg.jms_type is not None:
        headers["type"] = msg.jms_type
    if msg.correlation_id is not None:
        headers["correlation-id"] = msg.correlation_id
    if msg.reply_to:
        headers["reply-to"] = msg.reply_to.stomp()
    if msg.delivery_time:
        headers[DELIVERY_TIME_HEADER] = str(msg.delivery_time)
    if now_ms is not None and msg.delivery_time > now_ms:
        headers[SCHEDULED_DELAY] = str(msg.delivery_time - now_ms)
    return headers


def _check_property_name(name: str) -> None:
    if name in _RESERVED_PROPERTY_NAMES or not name:
        raise MappingError("property name collides with a STOMP/ActiveMQ header", f"property:{name}")


def _escape(name: str) -> str:
    return name.replace("%", "%25").replace(",", "%2C").replace("=", "%3D")


def _unescape(name: str) -> str:
    return name.replace("%3D", "=").replace("%2C", ",").replace("%25", "%")


def encode_value(value: Typed, field: str) -> str:
    """A property value as header text (the type goes in ``nsjms_types``)."""
    jtype, raw = value.type, value.value
    if jtype is _INT or jtype is _LONG or jtype is _SHORT or jtype is _BYTE:     # the usual typed property
        low, high = it.JAVA_RANGES[jtype]
        if isinstance(raw, int) and not isinstance(raw, bool) and low <= raw <= high:
            return str(raw)
        raise MappingError(f"{raw!r} is not a Java {jtype}", field)
    if value.type not in _SENDABLE:
        raise MappingError(f"a JMS property cannot be of type {value.type}", field)
    raw = value.value
    if value.type == JmsType.BOOLEAN:
        return "true" if raw else "false"
    if value.type in (JmsType.FLOAT, JmsType.DOUBLE):
        if not isinstance(raw, (int, float)) or isinstance(raw, bool):
            raise MappingError(f"{raw!r} is not a number", field)
        return it.format_java_float(float(raw))
    if value.type == JmsType.STRING:
        if not isinstance(raw, str):
            raise MappingError(f"{raw!r} is not a string", field)
        return raw
    low, high = it.JAVA_RANGES[value.type]
    if not isinstance(raw, int) or isinstance(raw, bool) or not low <= raw <= high:
        raise MappingError(f"{raw!r} is not a Java {value.type}", field)
    return str(raw)


def decode_value(text: str, jtype: JmsType, field: str) -> Typed:
    """Inverse of :func:`encode_value`."""
    if jtype == JmsType.BOOLEAN:
        if text not in ("true", "false"):
            raise MappingError(f"not a boolean: {text!r}", field)
        return Typed(jtype, text == "true")
    if jtype in (JmsType.FLOAT, JmsType.DOUBLE):
        return Typed(jtype, it.parse_java_float(text, field))
    if jtype == JmsType.STRING:
        return Typed(jtype, text)
    if jtype not in it.JAVA_RANGES:
        raise MappingError(f"a JMS property cannot be of type {jtype}", field)
    try:
        number = int(text)
    except ValueError:
        raise MappingError(f"not an integer: {text!r}", field) from None
    low, high = it.JAVA_RANGES[jtype]
    if not low <= number <= high:
        raise MappingError(f"{number} is not a Java {jtype}", field)
    return Typed(jtype, number)


# ------------------------------------------------------------------------------------------------ receive
def from_stomp_headers(headers: dict[str, str]) -> tuple[StandardHeaders, dict[str, Typed]]:
    """(standard JMS header values, typed properties) of a MESSAGE (or SEND) frame's headers."""
    types = _parse_types(headers.get(TYPES_HEADER, ""))
    props: dict[str, Typed] = {}
    for name, text in headers.items():
        if name in FRAME_HEADERS:
            continue
        props[name] = _decode_property(name, text, types.get(name))
    return _standard_from(headers), props


def _decode_property(name: str, text: str, declared: JmsType | None) -> Typed:
    if declared is not None:
        return decode_value(text, declared, f"property:{name}")
    known = _KNOWN_JMSX.get(name)
    if known is not None and text.lstrip("-").isdigit():
        return decode_value(text, known, f"property:{name}")
    return Typed(JmsType.STRING, text)


def _parse_types(text: str) -> dict[str, JmsType]:
    out: dict[str, JmsType] = {}
    for item in filter(None, text.split(",")):
        name, sep, jtype = item.rpartition("=")
        try:
            parsed = JmsType(jtype)
        except ValueError:
            parsed = None
        if not sep or parsed not in _SENDABLE or parsed is None:
            raise MappingError(f"malformed entry {item!r}", TYPES_HEADER)
        out[_unescape(name)] = parsed
    return out


def _standard_from(headers: dict[str, str]) -> StandardHeaders:
    return StandardHeaders(
        destination=parse_destination(headers.get("destination")),
        delivery_mode=(DeliveryMode.PERSISTENT if headers.get("persistent") == "true"
                       else DeliveryMode.NON_PERSISTENT),
        priority=_int(headers, "priority", 4),
        expiration=_int(headers, "expires", 0),
        delivery_time=_int(headers, DELIVERY_TIME_HEADER, 0),
        timestamp=_int(headers, "timestamp", 0),
        message_id=headers.get("message-id"),
        correlation_id=headers.get("correlation-id"),
        reply_to=parse_destination(headers.get("reply-to")),
        jms_type=headers.get("type"),
        redelivered=headers.get("redelivered") == "true",
    )


def _int(headers: dict[str, str], name: str, default: int) -> int:
    text = headers.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise MappingError(f"not an integer: {text!r}", name) from None


def parse_destination(text: str | None) -> Destination | None:
    """``/queue/x`` -> Destination("queue", "x"); also ``/topic/``, ``/temp-queue/``, ``/remote-temp-queue/`` etc."""
    if text is None:
        return None
    for prefix, kind in (("/queue/", "queue"), ("/topic/", "topic"), ("/temp-queue/", "temp-queue"),
                         ("/temp-topic/", "temp-topic"), ("/remote-temp-queue/", "remote-temp-queue"),
                         ("/remote-temp-topic/", "remote-temp-topic")):
        if text.startswith(prefix):
            return Destination(kind, text[len(prefix):])
    raise MappingError(f"not a STOMP destination: {text!r}", "destination")
