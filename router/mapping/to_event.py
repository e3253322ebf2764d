"""JMS message -> StructuredEvent (NJI 2.4.1, 2.5, with the corrections of the digest §13.2-§13.3).

Two cases:

* **A message made by** :func:`router.mapping.to_jms.event_to_jms` (JMSType ``"Structured Event"`` and a
  ``$nsjms_idl`` manifest): the original event is rebuilt exactly from the ``$`` properties, the manifest and the
  body (the ``$ohf_*`` properties hold the original NS values, e.g. a Priority of 100 that JMSPriority could only
  carry as 9). What the JMS side added is appended to ``filterable_data`` after the event's own entries
  (JMSMessageID, JMSRedelivered when true, a changed JMSCorrelationID/JMSReplyTo, properties the manifest does not
  list), so an unchanged message gives back exactly its event.
* **Any other message** ("foreign"): ``domain_name = ""`` (or ``$domain_name`` when present), ``type_name`` =
  ``%TextMessage`` / ``%MapMessage`` / ``%StreamMessage`` / ``%BytesMessage`` / ``%ObjectMessage`` / ``%Message``
  (no body) (or ``$type_name``), ``event_name`` = the destination name (or ``$event_name``).
  Variable header: ``EventReliability`` (short), ``Priority`` (short), ``StopTime`` (UtcT, from JMSExpiration,
  when not 0), ``StartTime`` (UtcT, from JMSDeliveryTime, when after 1970). Filterable data: ``JMSType``,
  ``JMSMessageID``, ``JMSTimestamp``, ``JMSReplyTo``, ``JMSCorrelationID``, ``JMSDestination`` (each omitted when
  null/0), ``JMSRedelivered``, then every property in message order, Java -> IDL typed.

Both: an expired message raises :class:`~router.mapping.errors.MessageExpired`; StopTime/StartTime are then fitted
to what the receiving channel accepts (:mod:`router.mapping.times`). Text an IDL string cannot hold (a NUL) and
values out of their IDL range are :class:`~router.mapping.errors.MappingError`, never an event the channel would
fail to store.
"""

from __future__ import annotations  # noqa: I001  (omniORB must be imported before the COS stubs)

import base64
import binascii
import time
import zlib
from dataclasses import dataclass
from typing import Any

import omniORB  # (first: it puts the COS stubs on sys.path)
import CosNotification
import TimeBase
from omniORB import CORBA

from router.jms.model import BodyType, DeliveryMode, JmsMessage, JmsType, Typed
from router.mapping import body as bodies
from router.mapping import idltypes as it
from router.mapping import names
from router.mapping import limits
from router.mapping import qos
from router.mapping import times as times_mod
from router.mapping.errors import MappingError
from router.mapping.text import text_any
from router.mapping.times import ANY_CHANNEL, ChannelTimeSupport

__all__ = ["CODESET_MINORS", "TYPE_NAMES", "MappedEvent", "jms_to_event", "map_message", "typed_to_any"]

TYPE_NAMES = {
    BodyType.TEXT: "%TextMessage", BodyType.MAP: "%MapMessage", BodyType.STREAM: "%StreamMessage",
    BodyType.BYTES: "%BytesMessage", BodyType.OBJECT: "%ObjectMessage", BodyType.MESSAGE: "%Message",
}
_JAVA_TO_IDL = {
    JmsType.BOOLEAN: CORBA.TC_boolean, JmsType.BYTE: CORBA.TC_octet, JmsType.SHORT: CORBA.TC_short,
    JmsType.INT: CORBA.TC_long, JmsType.LONG: CORBA.TC_longlong, JmsType.FLOAT: CORBA.TC_float,
    JmsType.DOUBLE: CORBA.TC_double, JmsType.STRING: CORBA.TC_string, JmsType.CHAR: CORBA.TC_wchar,
}


@dataclass(frozen=True)
class MappedEvent:
    """The event for a JMS message, with notes worth a log line (e.g. a StartTime the channel cannot honour)."""

    event: Any
    notes: tuple[str, ...] = ()


def jms_to_event(msg: JmsMessage, *, times: ChannelTimeSupport = ANY_CHANNEL, now_ms: int | None = None,
                 max_body_bytes: int | None = bodies.DEFAULT_MAX_BODY_BYTES) -> Any:
    """The StructuredEvent for ``msg`` (see :func:`map_message`, which also returns the notes)."""
    return map_message(msg, times=times, now_ms=now_ms, max_body_bytes=max_body_bytes).event


def map_message(msg: JmsMessage, *, times: ChannelTimeSupport = ANY_CHANNEL, now_ms: int | None = None,
                max_body_bytes: int | None = bodies.DEFAULT_MAX_BODY_BYTES) -> MappedEvent:
    """The StructuredEvent for ``msg``, fitted to what the receiving channel accepts (``times``).

    ``now_ms`` is the mapping time (ms since the Unix epoch; ``None`` reads the clock). Raises
    :class:`MessageExpired` for a message whose JMSExpiration has passed, :class:`MappingError` for anything
    else that cannot be mapped; nothing else, whatever the message holds.
    """
    if not isinstance(msg.body_type, BodyType) or msg.body_type not in TYPE_NAMES:
        raise MappingError(f"unknown body type {msg.body_type!r}", "body_type")
    bodies.check_size(msg.body_type, msg.body, max_body_bytes, "body")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    times_mod.check_expiry(_int_header(msg.expiration, "JMSExpiration"), now)
    manifest = msg.properties.get(names.MANIFEST)
    if msg.jms_type == names.STRUCTURED_EVENT and manifest is not None:
        event = _rebuild_checked(msg, _load_manifest(manifest))
    else:
        event = _foreign(msg)
    header, filterable, notes = times_mod.fit_times(list(event.header.variable_header),
                                                    list(event.filterable_data), times, now)
    event.header.variable_header = header
    event.filterable_data = filterable
    return MappedEvent(event, notes)


def _int_header(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MappingError(f"expected an integer, got {type(value).__name__}", field)
    return value


# ------------------------------------------------------------------------------------------------ round trip
_MANIFEST_MAX = 4 * 1024 * 1024    # bound on an unpacked manifest (a compressed one must not expand without limit)


def unpack_manifest(text: str) -> str:
    """The manifest's JSON text, at most 4 MiB whether sent plain or packed (``z:`` + base64 of zlib)."""
    if not text.startswith("z:"):
        if len(text) > _MANIFEST_MAX:
            raise MappingError("manifest is larger than 4 MiB", names.MANIFEST)
        return text
    try:
        packed = base64.b64decode(text[2:], validate=True)
        inflater = zlib.decompressobj()
        raw = inflater.decompress(packed, _MANIFEST_MAX)
        if inflater.unconsumed_tail or not inflater.eof:
            raise MappingError("packed manifest is truncated or larger than 4 MiB", names.MANIFEST)
        return raw.decode("utf-8")
    except (ValueError, zlib.error):
        raise MappingError("packed manifest is not valid base64/zlib/UTF-8", names.MANIFEST) from None


def _load_manifest(prop: Typed) -> dict[str, Any]:
    if not isinstance(prop, Typed) or not isinstance(prop.value, str):
        raise MappingError("manifest is not a String property", names.MANIFEST)
    manifest = limits.load_json(unpack_manifest(prop.value), names.MANIFEST, "manifest")
    if not isinstance(manifest, dict) or manifest.get("v") != 1:
        raise MappingError("unsupported manifest version", names.MANIFEST)
    return manifest


def _rebuild_checked(msg: JmsMessage, manifest: dict[str, Any]) -> Any:
    """:func:`_rebuild`, with the ORB's own errors on a TypeCode a manifest describes (``BadKind``, ``Bounds``:
    e.g. a stream body whose type is not a sequence) translated at this one boundary."""
    try:
        return _rebuild(msg, manifest)
    except CORBA.Exception as exc:
        raise MappingError(f"the manifest does not match the message: {type(exc).__name__} {exc}",
                           names.MANIFEST) from None


def _rebuild(msg: JmsMessage, manifest: dict[str, Any]) -> Any:
    props = msg.properties
    fixed = CosNotification.FixedEventHeader(
        CosNotification.EventType(_fixed(props, names.DOMAIN_NAME), _fixed(props, names.TYPE_NAME)),
        _fixed(props, names.EVENT_NAME))
    ohf, fd = _records(manifest, "ohf"), _records(manifest, "fd")
    variable = [_rebuild_entry(rec, props) for rec in ohf]
    filterable = [_rebuild_entry(rec, props) for rec in fd]
    body = manifest.get("body")
    if not isinstance(body, dict):
        raise MappingError("manifest has no body descriptor", names.MANIFEST)
    remainder = bodies.body_from_manifest(body, msg.body_type, msg.body)
    listed = {pname for rec in (*ohf, *fd) for pname in rec[2]}
    filterable.extend(_jms_additions(msg, listed, filterable))
    event = CosNotification.StructuredEvent(CosNotification.EventHeader(fixed, variable), filterable, remainder)
    _check_encodable(event)
    return event


#: MARSHAL minor codes that come from the ORB's wide-character configuration, not from the value: ``wchar`` in an
#: encapsulation needs a negotiated wide codeset, which an ORB started without ``-ORBnativeCharCodeSet`` lacks.
CODESET_MINORS = frozenset({omniORB.MARSHAL_MessageTooLong, omniORB.MARSHAL_WCharSentByGIOP10Client,
                            omniORB.MARSHAL_WCharSentByGIOP10Server, omniORB.MARSHAL_InvalidWCharSize})


def _check_encodable(event: Any) -> None:
    """A manifest can describe values its IDL types cannot hold (a bounded string or sequence overrun, an array
    of the wrong length, a NUL in a string): refuse here what the channel could not store. Codeset limits
    (``DATA_CONVERSION``, :data:`CODESET_MINORS`) depend on the ORB's configuration, not on the message, and are
    left to the channel (docs/mapping.md, deviation 10)."""
    try:
        omniORB.cdrMarshal(CosNotification._tc_StructuredEvent, event)
    except CORBA.DATA_CONVERSION:
        pass
    except CORBA.SystemException as exc:
        if not (isinstance(exc, CORBA.MARSHAL) and exc.minor in CODESET_MINORS):
            raise MappingError(f"the rebuilt event cannot be CDR-encoded: {exc}", names.MANIFEST) from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise MappingError(f"the rebuilt event is malformed: {exc}", names.MANIFEST) from None


#: Properties nsjms itself adds besides those the manifest lists.
_OWN_PROPERTIES = frozenset({names.DOMAIN_NAME, names.TYPE_NAME, names.EVENT_NAME, names.BODY_ENCODING,
                             names.MANIFEST})


def _jms_additions(msg: JmsMessage, listed: set[str], filterable: list[Any]) -> list[Any]:
    """What the JMS side added to a message nsjms made (NJI 2.4.1), appended after the event's own filterable
    data: JMSMessageID (when set), JMSRedelivered (when true), JMSCorrelationID / JMSReplyTo when they differ
    from what the event itself maps to, and every property the manifest does not list (JMSX properties, those a
    JMS application added). JMSTimestamp, JMSDestination, JMSType and the QoS headers are nsjms's own (derived
    from the event or the bridge), so an unchanged message gives back exactly the event it was made from."""
    out: list[Any] = []

    def string(name: str, value: str) -> None:
        out.append(CosNotification.Property(name, text_any(_idl_text(value, name))))

    if msg.message_id is not None:
        string("JMSMessageID", msg.message_id)
    if msg.redelivered:
        out.append(CosNotification.Property("JMSRedelivered", CORBA.Any(CORBA.TC_boolean, True)))
    if msg.correlation_id is not None and msg.correlation_id != _first_string(filterable, "JMSCorrelationID"):
        string("JMSCorrelationID", msg.correlation_id)
    reply_to = msg.reply_to.stomp() if msg.reply_to else None
    if reply_to is not None and reply_to != _first_string(filterable, "JMSReplyTo"):
        string("JMSReplyTo", reply_to)
    for name, value in msg.properties.items():
        if name not in listed and name not in _OWN_PROPERTIES:
            out.append(_property_entry(name, value))
    return out


def _first_string(entries: list[Any], name: str) -> str | None:
    """The value of the first entry called ``name`` when it is a string (what ``event_to_jms`` maps)."""
    for prop in entries:
        if prop.name == name:
            value = prop.value.value()
            return value if isinstance(value, str) else None
    return None


def _fixed(props: Any, name: str) -> str:
    value = props.get(name)
    if not isinstance(value, Typed):
        raise MappingError("property missing", f"property:{name}")
    return _idl_text(str(value.value), f"property:{name}")


def _records(manifest: dict[str, Any], section: str) -> list[Any]:
    records = manifest.get(section)
    if not isinstance(records, list):
        raise MappingError(f"manifest has no {section} list", names.MANIFEST)
    for rec in records:
        if not (isinstance(rec, list) and len(rec) == 3 and isinstance(rec[0], str) and isinstance(rec[2], list)
                and all(isinstance(p, str) for p in rec[2])):
            raise MappingError(f"malformed {section} record", names.MANIFEST)
    return records


def _rebuild_entry(record: list[Any], props: Any) -> Any:
    name, desc, pnames = record
    name = _idl_text(name, names.MANIFEST)
    values = [_property(props, p) for p in pnames]
    if desc == "cdr" and len(values) == 1:
        return CosNotification.Property(name, _cdr_property(values[0], pnames[0]))
    field = f"property:{pnames[0] if pnames else name}"
    tc = it.desc_to_tc(desc, field)
    if it.is_leaf(tc) and len(values) == 1:
        return CosNotification.Property(name, CORBA.Any(tc, it.typed_to_leaf(tc, values[0], field)))
    paths = it.leaf_paths(tc) if it.is_flattenable(tc) else None
    if paths is None or len(paths) != len(values):
        raise MappingError(f"manifest record for {name!r} does not match its type", field)
    leaves = [it.typed_to_leaf(ltc, v, f"property:{p}") for (_, ltc), v, p in zip(paths, values, pnames, strict=True)]
    return CosNotification.Property(name, CORBA.Any(tc, it.build_struct(tc, iter(leaves))))


def _property(props: Any, name: str) -> Typed:
    value = props.get(name)
    if not isinstance(value, Typed):
        raise MappingError("property missing", f"property:{name}")
    return value


def _cdr_property(value: Typed, pname: str) -> Any:
    field = f"property:{pname}"
    try:
        data = base64.b64decode(str(value.value).encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise MappingError("invalid base64", field) from None
    return it.cdr_to_any(data, field)


# ------------------------------------------------------------------------------------------------ foreign
def _foreign(msg: JmsMessage) -> Any:
    props = msg.properties
    domain = _str_prop(props, names.DOMAIN_NAME, "")
    type_name = _str_prop(props, names.TYPE_NAME, TYPE_NAMES[msg.body_type])
    event_name = _str_prop(props, names.EVENT_NAME, msg.destination.name if msg.destination else "")
    fixed = CosNotification.FixedEventHeader(CosNotification.EventType(domain, type_name), event_name)
    header = CosNotification.EventHeader(fixed, _variable_header(msg))
    return CosNotification.StructuredEvent(header, _filterable(msg), _foreign_body(msg))


def _str_prop(props: Any, name: str, default: str) -> str:
    value = props.get(name)
    if isinstance(value, Typed) and value.type == JmsType.STRING:
        return _idl_text(value.value, f"property:{name}")
    return _idl_text(default, "destination" if name == names.EVENT_NAME else name)


def _idl_text(value: object, field: str) -> str:
    """A string an IDL ``string`` can carry: valid Unicode without NUL (CDR strings are NUL-terminated)."""
    if not isinstance(value, str):
        raise MappingError(f"expected a string, got {type(value).__name__}", field)
    if not _is_unicode(value):
        raise MappingError("not valid Unicode (unpaired surrogate)", field)
    if "\0" in value:
        raise MappingError(f"an IDL string cannot hold a NUL character (position {value.index(chr(0))})", field)
    return value


_UTC_MAX_MS = qos.utc_to_ms(2**64 - 1)
_UTC_MIN_MS = qos.utc_to_ms(0) + 1


def _variable_header(msg: JmsMessage) -> list[Any]:
    priority = _int_header(msg.priority, "JMSPriority")
    if not 0 <= priority <= 9:
        raise MappingError(f"JMSPriority {priority} is outside 0..9", "JMSPriority")
    if not isinstance(msg.delivery_mode, DeliveryMode):
        raise MappingError(f"unknown delivery mode {msg.delivery_mode!r}", "JMSDeliveryMode")
    out = [
        CosNotification.Property("EventReliability",
                                 CORBA.Any(CORBA.TC_short, qos.mode_to_reliability(msg.delivery_mode))),
        CosNotification.Property("Priority", CORBA.Any(CORBA.TC_short, qos.jms_to_ns_priority(priority))),
    ]
    if msg.expiration:
        out.append(CosNotification.Property("StopTime", _utc_any(msg.expiration, "JMSExpiration")))
    delivery_time = _int_header(msg.delivery_time, "JMSDeliveryTime")
    if delivery_time > 0:                       # 0: at once; before 1970: already due
        out.append(CosNotification.Property("StartTime", _utc_any(delivery_time, "JMSDeliveryTime")))
    return out


def _utc_any(ms: int, field: str) -> Any:
    if not _UTC_MIN_MS <= ms <= _UTC_MAX_MS:
        raise MappingError(f"{ms} ms is outside what TimeBase::UtcT can hold", field)
    return CORBA.Any(TimeBase._tc_UtcT, TimeBase.UtcT(qos.ms_to_utc(ms), 0, 0, 0))


def _filterable(msg: JmsMessage) -> list[Any]:
    def string(name: str, value: str | None) -> None:
        if value is not None:
            out.append(CosNotification.Property(name, text_any(_idl_text(value, name))))

    out: list[Any] = []
    string("JMSType", msg.jms_type)
    string("JMSMessageID", msg.message_id)
    timestamp = _int_header(msg.timestamp, "JMSTimestamp")
    if timestamp:
        low, high = it.JAVA_RANGES[JmsType.LONG]
        if not low <= timestamp <= high:
            raise MappingError(f"JMSTimestamp {timestamp} is not a Java long", "JMSTimestamp")
        out.append(CosNotification.Property("JMSTimestamp", CORBA.Any(CORBA.TC_longlong, timestamp)))
    string("JMSReplyTo", msg.reply_to.stomp() if msg.reply_to else None)
    string("JMSCorrelationID", msg.correlation_id)
    string("JMSDestination", msg.destination.stomp() if msg.destination else None)
    out.append(CosNotification.Property("JMSRedelivered", CORBA.Any(CORBA.TC_boolean, bool(msg.redelivered))))
    out.extend(_property_entry(name, value) for name, value in msg.properties.items())
    return out


def _property_entry(name: object, value: object) -> Any:
    """A JMS property as a filterable_data entry, Java -> IDL typed (NJI 2.4.1)."""
    field = f"property:{name}"
    typed = _typed(value, field)
    if typed.type in (JmsType.CHAR, JmsType.BYTES):
        raise MappingError(f"a JMS property cannot be of type {typed.type}", field)
    return CosNotification.Property(_idl_text(name, field), typed_to_any(typed, field))


def typed_to_any(value: Typed, field: str) -> Any:
    """A JMS value as an Any: boolean, byte->octet (two's complement), short, int->long, long->long long, float,
    double, String->string (wstring when it holds a character outside ISO-8859-1), char->wchar,
    byte[]->CORBA::OctetSeq."""
    if value.type == JmsType.BYTES:
        if not isinstance(value.value, (bytes, bytearray)):
            raise MappingError("byte[] value is not bytes", field)
        return CORBA.Any(CORBA._tc_OctetSeq, bytes(value.value))
    if value.type not in _JAVA_TO_IDL:
        raise MappingError(f"unknown JMS type {value.type!r}", field)
    _check_java(value, field)
    raw = value.value
    if value.type == JmsType.STRING:
        return text_any(str(raw))               # string when it fits ISO-8859-1, else wstring (mapping.text)
    if value.type == JmsType.BYTE:
        raw = int(raw) & 0xFF
    elif value.type in (JmsType.FLOAT, JmsType.DOUBLE):
        try:
            raw = float(raw)
        except OverflowError:
            raise MappingError(f"{value.type} value out of range", field) from None
    return CORBA.Any(_JAVA_TO_IDL[value.type], raw)


def _check_java(value: Typed, field: str) -> None:
    """Reject a value its declared Java type cannot hold (e.g. ``Typed(INT, 2**40)``)."""
    raw, jtype = value.value, value.type
    if jtype == JmsType.BOOLEAN:
        ok = isinstance(raw, bool)
    elif jtype in it.JAVA_RANGES:
        low, high = it.JAVA_RANGES[jtype]
        ok = isinstance(raw, int) and not isinstance(raw, bool) and low <= raw <= high
    elif jtype in (JmsType.FLOAT, JmsType.DOUBLE):
        ok = isinstance(raw, (float, int)) and not isinstance(raw, bool)
    elif jtype == JmsType.CHAR:
        ok = isinstance(raw, str) and len(raw) == 1 and 0 < ord(raw) <= 0xFFFF and _is_unicode(raw)
    else:
        ok = isinstance(raw, str) and _is_unicode(raw) and "\0" not in raw
    if not ok:
        raise MappingError(f"value {raw!r} cannot be represented as a Java {jtype}", field)


def _is_unicode(text: str) -> bool:
    if text.isascii():              # most header and property texts: no surrogate possible, no encoding needed
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _foreign_body(msg: JmsMessage) -> Any:
    kind, body = msg.body_type, msg.body
    if kind == BodyType.MESSAGE:
        return CORBA.Any(CORBA.TC_null, None)
    if kind == BodyType.TEXT:
        return text_any(_idl_text(bodies.as_text(body), "body"))
    if kind in (BodyType.BYTES, BodyType.OBJECT):
        return CORBA.Any(CORBA._tc_OctetSeq, bodies.as_bytes(body))
    if kind == BodyType.MAP:
        if not isinstance(body, dict):
            raise MappingError("map body is not a dict", "body")
        return CORBA.Any(CosNotification._tc_PropertySeq, [
            CosNotification.Property(_idl_text(k, f"body.{k}"), typed_to_any(_typed(v, f"body.{k}"), f"body.{k}"))
            for k, v in body.items()])
    items = bodies.as_stream(body, None)
    return CORBA.Any(CORBA._tc_AnySeq, [typed_to_any(v, f"body[{i}]") for i, v in enumerate(items)])


def _typed(value: object, field: str) -> Typed:
    if not isinstance(value, Typed):
        raise MappingError(f"expected a typed value, got {type(value).__name__}", field)
    return value
