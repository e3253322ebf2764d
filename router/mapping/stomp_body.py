"""JMS message <-> STOMP frame (headers from :mod:`typed_props` plus the body), for ActiveMQ Classic 5.x.

=========  ===========================================================================================  =========
JMS body   SEND frame                                                                                   received
=========  ===========================================================================================  =========
TEXT       UTF-8 body, ``content-length``, ``amq-msg-type:text``                                        Text
BYTES      raw body, ``content-length``, ``amq-msg-type:bytes``                                         Bytes
MAP        ``transformation:jms-map-json``, typed JSON body, **no** ``content-length``                  Map
STREAM     JSON list ``[{"int":1},{"string":"x"}]`` as bytes, ``nsjms_body:stream``                      Bytes
OBJECT     the serialised bytes, ``nsjms_body:object``                                                  Bytes
MESSAGE    empty text body, ``nsjms_body:none``                                                         Text
=========  ===========================================================================================  =========

ActiveMQ cannot carry Map, Stream or Object bodies over plain STOMP (they arrive empty): a MapMessage travels
through the broker's ``jms-map-json`` transformation (needs the jettison and xstream jars; subscribe with
``transformation:jms-json`` to receive Java-sent MapMessages), Stream and Object travel as BytesMessages with the
``nsjms_body`` marker (a Java consumer sees a BytesMessage). The transport must send exactly the headers given
(stomp.py: ``auto_content_length=False``): a ``content-length`` on a MAP frame makes ActiveMQ skip the
transformation. The typed JSON map shape is XStream/Jettison's:
``{"map":{"entry":[{"string":"count","int":42},{"string":["name","link-down"]}]}}``.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from router.jms.model import BodyType, JmsMessage, JmsType, Typed
from router.mapping import limits
from router.mapping import typed_props as tp
from router.mapping.errors import MappingError

__all__ = [
    "MAP_TRANSFORMATION",
    "StompFrame",
    "map_from_json",
    "map_to_json",
    "message_from_stomp",
    "message_to_stomp",
]

MAP_TRANSFORMATION = "jms-map-json"
_XSTREAM_NAMES = {JmsType.BYTES: "byte-array"}
_FROM_XSTREAM = {"byte-array": JmsType.BYTES, **{t.value: t for t in JmsType if t != JmsType.BYTES}}


@dataclass(frozen=True)
class StompFrame:
    """A SEND or MESSAGE frame's headers (unescaped) and body."""

    headers: dict[str, str]
    body: bytes


def message_to_stomp(msg: JmsMessage, *, now_ms: int | None = None) -> StompFrame:
    headers = tp.to_stomp_headers(msg, now_ms=now_ms)
    kind, body = msg.body_type, msg.body
    if kind == BodyType.TEXT:
        return _raw(headers, _utf8(body), "text")
    if kind == BodyType.BYTES:
        return _raw(headers, _bytes(body), "bytes")
    if kind == BodyType.MAP:
        headers["transformation"] = MAP_TRANSFORMATION
        return StompFrame(headers, map_to_json(_map(body)).encode("utf-8"))
    if kind == BodyType.STREAM:
        headers[tp.BODY_HEADER] = "stream"
        items = [_element(v, f"body[{i}]") for i, v in enumerate(_list(body))]
        return _raw(headers, json.dumps(items, separators=(",", ":")).encode("utf-8"), "bytes")
    if kind == BodyType.OBJECT:
        headers[tp.BODY_HEADER] = "object"
        return _raw(headers, _bytes(body), "bytes")
    if kind == BodyType.MESSAGE:
        headers[tp.BODY_HEADER] = "none"
        return _raw(headers, b"", "text")
    raise MappingError(f"unknown body type {kind!r}", "body_type")


def _raw(headers: dict[str, str], body: bytes, amq_type: str) -> StompFrame:
    headers["amq-msg-type"] = amq_type
    headers["content-length"] = str(len(body))
    return StompFrame(headers, body)


def message_from_stomp(headers: dict[str, str], body: bytes) -> JmsMessage:
    """The JMS message a MESSAGE frame carries (or a SEND frame made by :func:`message_to_stomp`)."""
    std, props = tp.from_stomp_headers(headers)
    body_type, value = _body_from(headers, body)
    return JmsMessage(
        body_type=body_type, body=value, destination=std.destination, delivery_mode=std.delivery_mode,
        priority=std.priority, expiration=std.expiration, delivery_time=std.delivery_time,
        timestamp=std.timestamp, message_id=std.message_id, correlation_id=std.correlation_id,
        reply_to=std.reply_to, jms_type=std.jms_type, redelivered=std.redelivered, properties=props)


def _body_from(headers: dict[str, str], body: bytes) -> tuple[BodyType, object]:
    marker = headers.get(tp.BODY_HEADER)
    if marker == "stream":
        return BodyType.STREAM, _stream_from_json(body)
    if marker == "object":
        return BodyType.OBJECT, bytes(body)
    if marker == "none":
        return BodyType.MESSAGE, None
    if marker is not None:
        raise MappingError(f"unknown body marker {marker!r}", tp.BODY_HEADER)
    if headers.get("transformation") == MAP_TRANSFORMATION:
        return BodyType.MAP, map_from_json(_decode(body))
    amq_type = headers.get("amq-msg-type")
    if amq_type == "bytes" or (amq_type != "text" and "content-length" in headers):
        return BodyType.BYTES, bytes(body)
    return BodyType.TEXT, _decode(body)


# ------------------------------------------------------------------------------------------------ typed JSON
def map_to_json(entries: dict[str, Typed]) -> str:
    """ActiveMQ's ``jms-map-json`` body for a map."""
    out: list[dict[str, Any]] = []
    for name, value in entries.items():
        element = _element(value, f"body.{name}")
        if value.type == JmsType.STRING:
            out.append({"string": [name, element["string"]]})
        else:
            out.append({"string": name, **element})
    return json.dumps({"map": {"entry": out}}, separators=(",", ":"), allow_nan=False)


def map_from_json(text: str) -> dict[str, Typed]:
    """Inverse of :func:`map_to_json`; also reads Jettison's variants (one entry as an object, numbers as text)."""
    doc = limits.load_json(text, "body", "map body")
    inner = doc.get("map") if isinstance(doc, dict) else None
    if inner in ("", None) or inner == {}:
        return {}
    entries = inner.get("entry", []) if isinstance(inner, dict) else None
    if isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list):
        raise MappingError("map body has no entry list", "body")
    return dict(_map_entry(e) for e in entries)


def _map_entry(entry: object) -> tuple[str, Typed]:
    if not isinstance(entry, dict) or "string" not in entry:
        raise MappingError(f"malformed map entry {entry!r}", "body")
    key = entry["string"]
    if isinstance(key, list) and len(key) == 2 and len(entry) == 1:
        return str(key[0]), Typed(JmsType.STRING, str(key[1]))
    rest = {k: v for k, v in entry.items() if k != "string"}
    if not isinstance(key, str) or len(rest) != 1:
        raise MappingError(f"malformed map entry {entry!r}", "body")
    return key, _parse_element(rest, f"body.{key}")


def _element(value: Typed, field: str) -> dict[str, Any]:
    """One typed JSON value, ``{"int": 42}``; floats as numbers, non-finite ones as ``"NaN"``/``"Infinity"``."""
    name = _XSTREAM_NAMES.get(value.type, value.type.value)
    raw = value.value
    if value.type == JmsType.BYTES:
        return {name: base64.b64encode(_bytes(raw)).decode("ascii")}
    if value.type == JmsType.CHAR:
        if not isinstance(raw, str) or len(raw) != 1:
            raise MappingError(f"{raw!r} is not a char", field)
        return {name: raw}
    text = tp.encode_value(value, field)
    if value.type in (JmsType.FLOAT, JmsType.DOUBLE):
        return {name: float(raw) if text not in ("NaN", "Infinity", "-Infinity") else text}
    if value.type == JmsType.STRING:
        return {name: text}
    return {name: raw if value.type != JmsType.BOOLEAN else bool(raw)}


def _parse_element(element: dict[str, Any], field: str) -> Typed:
    ((name, raw),) = element.items()
    jtype = _FROM_XSTREAM.get(name)
    if jtype is None:
        raise MappingError(f"unknown JSON value type {name!r}", field)
    if jtype == JmsType.BYTES:
        try:
            return Typed(jtype, base64.b64decode(str(raw).encode("ascii"), validate=True))
        except (binascii.Error, UnicodeEncodeError):
            raise MappingError("invalid base64", field) from None
    if jtype == JmsType.CHAR:
        if not isinstance(raw, str) or len(raw) != 1:
            raise MappingError(f"{raw!r} is not a char", field)
        return Typed(jtype, raw)
    if isinstance(raw, bool):
        raw = "true" if raw else "false"
    if isinstance(raw, float):
        if jtype in (JmsType.FLOAT, JmsType.DOUBLE):
            return Typed(jtype, raw)
        return tp.decode_value(repr(raw), jtype, field)
    return tp.decode_value(str(raw), jtype, field)


def _stream_from_json(body: bytes) -> list[Typed]:
    items = limits.load_json(_decode(body), "body", "stream body")
    if not isinstance(items, list) or not all(isinstance(i, dict) and len(i) == 1 for i in items):
        raise MappingError("stream body is not a list of typed values", "body")
    return [_parse_element(item, f"body[{n}]") for n, item in enumerate(items)]


# ------------------------------------------------------------------------------------------------ checks
def _utf8(body: object) -> bytes:
    if not isinstance(body, str):
        raise MappingError(f"text body is a {type(body).__name__}", "body")
    try:
        return body.encode("utf-8")
    except UnicodeEncodeError:
        raise MappingError("text body is not valid Unicode (unpaired surrogate)", "body") from None


def _decode(body: bytes) -> str:
    try:
        return bytes(body).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MappingError(f"body is not valid UTF-8 (byte {exc.start})", "body") from None


def _bytes(body: object) -> bytes:
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    raise MappingError(f"expected bytes, got {type(body).__name__}", "body")


def _map(body: object) -> dict[str, Typed]:
    if not isinstance(body, dict) or not all(isinstance(v, Typed) for v in body.values()):
        raise MappingError("map body is not a dict of typed values", "body")
    return body


def _list(body: object) -> list[Typed]:
    if not isinstance(body, list) or not all(isinstance(v, Typed) for v in body):
        raise MappingError("stream body is not a list of typed values", "body")
    return body


