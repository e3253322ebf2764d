"""``remainder_of_body`` <-> JMS body (NJI 2.4.1.1 and 2.4.2 "Remainder of body mapping").

NS -> JMS, first match wins:

=========================================================  ========  =========================================
remainder_of_body (through typedefs)                        body      manifest ``body``
=========================================================  ========  =========================================
null / void (no body)                                       MESSAGE   ``{"k": "none", "tc": ...}``
string / wstring                                            TEXT      ``{"k": "text", "tc": ...}``
CosNotification::PropertySeq with unique names              MAP       ``{"k": "map", "tc": ..., "e": [[name, desc]]}``
sequence<octet>                                             BYTES     ``{"k": "bytes", "tc": ...}``
sequence of a leaf type                                     STREAM    ``{"k": "stream", "tc": ...}``
sequence<any> whose elements are all leaves (AnySeq)        STREAM    ``{"k": "stream", "tc": ..., "e": [desc]}``
one leaf value                                              STREAM    ``{"k": "value", "tc": ...}`` (one element)
anything else                                               BYTES     ``{"k": "cdr"}`` + ``$body_encoding=cdr-any``
=========================================================  ========  =========================================

A map entry whose value is not a leaf is a ``byte[]`` entry: the raw octets of a ``sequence<octet>``, else the CDR
encapsulation of the entry's Any (entry descriptor ``"cdr"``). JMS -> NS bodies of foreign messages are in
:mod:`router.mapping.to_event`.
"""

from __future__ import annotations  # noqa: I001  (omniORB must be imported before the COS stubs)

from typing import Any

import omniORB  # noqa: F401  (first: it puts the COS stubs on sys.path)
import CosNotification
from omniORB import CORBA

from router.jms.model import BodyType, JmsType, Typed
from router.mapping import idltypes as it
from router.mapping.errors import MappingError

__all__ = [
    "CDR_ANY",
    "DEFAULT_MAX_BODY_BYTES",
    "as_bytes",
    "as_stream",
    "as_text",
    "body_from_manifest",
    "body_size",
    "body_to_jms",
    "check_size",
]

#: Default body size limit (ActiveMQ's default STOMP/OpenWire maxFrameSize is 100 MB).
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
CDR_ANY = "cdr-any"
_FIELD = "remainder_of_body"
_PROPERTY_ID = "IDL:omg.org/CosNotification/Property:1.0"


_KINDS: dict[Any, str] = {}


def _kind_of(tc: Any) -> str:
    """Which row of the table above a body of type ``tc`` starts from (decided once per type)."""
    kind = it.unalias(tc).kind()
    if kind in (CORBA.tk_null, CORBA.tk_void):
        return "none"
    if kind in (CORBA.tk_string, CORBA.tk_wstring):
        return "text"
    if kind == CORBA.tk_sequence:
        return "sequence"
    return "value" if it.is_leaf(tc) else "cdr"


def body_to_jms(body: Any) -> tuple[BodyType, object, dict[str, Any]]:
    """(body type, body, manifest entry) for a ``remainder_of_body`` Any."""
    tc = body.typecode()
    row = it.type_cached(_KINDS, tc, _kind_of)
    if row == "text":
        return BodyType.TEXT, _text(body.value()), {"k": "text", "tc": it.tc_to_desc(tc)}
    if row == "none":
        return BodyType.MESSAGE, None, {"k": "none", "tc": it.tc_to_desc(tc)}
    if row == "sequence":
        mapped = _sequence(tc, it.unalias(tc), body.value())
        if mapped is not None:
            return mapped
    elif row == "value":
        return (BodyType.STREAM, [it.leaf_to_typed(tc, body.value(), entry=True)],
                {"k": "value", "tc": it.tc_to_desc(tc)})
    return BodyType.BYTES, it.any_to_cdr(body, _FIELD), {"k": "cdr"}


def _text(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise MappingError(f"text is not valid Unicode (unpaired surrogate at {exc.start})", _FIELD) from None
    return value


def _sequence(tc: Any, base: Any, value: Any) -> tuple[BodyType, object, dict[str, Any]] | None:
    content = it.unalias(base.content_type())
    ckind = content.kind()
    if ckind == CORBA.tk_octet:
        return BodyType.BYTES, bytes(value), {"k": "bytes", "tc": it.tc_to_desc(tc)}
    if ckind == CORBA.tk_struct and content.id() == _PROPERTY_ID:
        return _map(tc, value)
    if it.is_leaf(content):
        items = [it.leaf_to_typed(content, v, entry=True) for v in value]
        return BodyType.STREAM, items, {"k": "stream", "tc": it.tc_to_desc(tc)}
    if ckind == CORBA.tk_any and all(it.is_leaf(a.typecode()) for a in value):
        items = [it.leaf_to_typed(a.typecode(), a.value(), entry=True) for a in value]
        descs = [it.tc_to_desc(a.typecode()) for a in value]
        return BodyType.STREAM, items, {"k": "stream", "tc": it.tc_to_desc(tc), "e": descs}
    return None


def _map(tc: Any, props: list[Any]) -> tuple[BodyType, object, dict[str, Any]] | None:
    names = [str(p.name) for p in props]
    if len(set(names)) != len(names):
        return None  # a JMS map cannot hold a name twice: carried as cdr-any instead
    entries: dict[str, Typed] = {}
    descs = []
    for prop in props:
        typed, desc = _map_entry(prop)
        entries[str(prop.name)] = typed
        descs.append([str(prop.name), desc])
    return BodyType.MAP, entries, {"k": "map", "tc": it.tc_to_desc(tc), "e": descs}


def _map_entry(prop: Any) -> tuple[Typed, str]:
    tc = prop.value.typecode()
    base = it.unalias(tc)
    if it.is_leaf(tc):
        return it.leaf_to_typed(tc, prop.value.value(), entry=True), it.tc_to_desc(tc)
    if base.kind() == CORBA.tk_sequence and it.unalias(base.content_type()).kind() == CORBA.tk_octet:
        return Typed(JmsType.BYTES, bytes(prop.value.value())), it.tc_to_desc(tc)
    return Typed(JmsType.BYTES, it.any_to_cdr(prop.value, f"{_FIELD}.{prop.name}")), "cdr"


# ------------------------------------------------------------------------------------------------ reverse
def body_from_manifest(desc: dict[str, Any], body_type: BodyType, body: object) -> Any:
    """The ``remainder_of_body`` Any described by a manifest entry, from a message body."""
    kind = desc.get("k")
    if kind == "cdr":
        return it.cdr_to_any(as_bytes(body), _FIELD)
    tc = it.desc_to_tc(desc.get("tc"), _FIELD)
    if kind == "none":
        return CORBA.Any(tc, None)
    if kind == "text":
        return CORBA.Any(tc, as_text(body))
    if kind == "bytes":
        return CORBA.Any(tc, as_bytes(body))
    if kind == "value":
        return CORBA.Any(tc, it.typed_to_leaf(tc, as_stream(body, 1)[0], _FIELD))
    if kind == "stream":
        return CORBA.Any(tc, _stream_value(tc, desc.get("e"), body))
    if kind == "map":
        return CORBA.Any(tc, _map_value(desc.get("e"), body))
    raise MappingError(f"unknown body descriptor kind {str(kind)[:40]!r} for a {body_type} body", _FIELD)


def _stream_value(tc: Any, elements: object, body: object) -> Any:
    if isinstance(elements, list):
        items = as_stream(body, len(elements))
        tcs = [it.desc_to_tc(d, _FIELD) for d in elements]
        return [CORBA.Any(etc, it.typed_to_leaf(etc, item, _FIELD)) for etc, item in zip(tcs, items, strict=True)]
    base = it.unalias(tc)
    if base.kind() not in (CORBA.tk_sequence, CORBA.tk_array):
        raise MappingError(f"a stream body needs a sequence or array type, the manifest says {base}", _FIELD)
    content = base.content_type()
    values = [it.typed_to_leaf(content, item, _FIELD) for item in as_stream(body, None)]
    return "".join(values) if it.unalias(content).kind() == CORBA.tk_char else values


def _map_value(entries: object, body: object) -> list[Any]:
    if not isinstance(entries, list) or not isinstance(body, dict):
        raise MappingError("map body or its manifest is malformed", _FIELD)
    props = []
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
            raise MappingError("malformed map entry descriptor in the manifest", _FIELD)
        name, desc = entry
        field = f"{_FIELD}.{name}"
        typed = body.get(name)
        if not isinstance(typed, Typed):
            raise MappingError("map entry missing", field)
        if desc == "cdr":
            value = it.cdr_to_any(as_bytes(typed.value), field)
        else:
            etc = it.desc_to_tc(desc, field)
            raw = typed.value if typed.type == JmsType.BYTES else it.typed_to_leaf(etc, typed, field)
            value = CORBA.Any(etc, raw)
        props.append(CosNotification.Property(name, value))
    return props


def as_stream(body: object, count: int | None) -> list[Typed]:
    if not isinstance(body, list) or not all(isinstance(x, Typed) for x in body):
        raise MappingError("stream body is not a list of typed values", _FIELD)
    if count is not None and len(body) != count:
        raise MappingError(f"stream has {len(body)} elements, the manifest says {count}", _FIELD)
    return body


def as_text(body: object) -> str:
    if isinstance(body, str):
        return _text(body)
    if isinstance(body, bytes):
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MappingError(f"text body is not valid UTF-8 (byte {exc.start})", _FIELD) from None
    raise MappingError(f"text body is a {type(body).__name__}", _FIELD)


def as_bytes(body: object) -> bytes:
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    raise MappingError(f"expected bytes, got {type(body).__name__}", _FIELD)


# ------------------------------------------------------------------------------------------------ size
def body_size(body_type: BodyType, body: object) -> int:
    """Approximate encoded size in bytes: UTF-8 text, raw bytes, or the sum over map/stream entries."""
    if body is None:
        return 0
    if isinstance(body, str):
        return len(body.encode("utf-8", "surrogatepass"))
    if isinstance(body, (bytes, bytearray)):
        return len(body)
    if isinstance(body, dict):
        return sum(len(str(k).encode("utf-8", "surrogatepass")) + _typed_size(v) for k, v in body.items())
    if isinstance(body, list):
        return sum(_typed_size(v) for v in body)
    raise MappingError(f"unsupported {body_type} body of Python type {type(body).__name__}", "body")


def _typed_size(value: object) -> int:
    raw = value.value if isinstance(value, Typed) else value
    if isinstance(raw, str):
        return len(raw.encode("utf-8", "surrogatepass"))
    if isinstance(raw, (bytes, bytearray)):
        return len(raw)
    return 8


def check_size(body_type: BodyType, body: object, limit: int | None, field: str) -> None:
    """Raise when the body is larger than ``limit`` bytes (``None``: no limit)."""
    if limit is None:
        return
    size = body_size(body_type, body)
    if size > limit:
        raise MappingError(f"body of {size} bytes exceeds the limit of {limit} bytes", field)
