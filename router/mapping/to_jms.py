"""StructuredEvent -> JMS message (NJI 2.4.2, 2.5, with the corrections of the digest §13.2-§13.3).

* QoS: ``EventReliability`` -> delivery mode (absent -> PERSISTENT), ``Priority`` -> JMSPriority (NJI Table 2-6,
  absent -> 4), ``Timeout``/``StopTime`` -> ``expiration`` (earliest wins), ``StartTime`` -> ``delivery_time``.
* Fixed header -> String properties ``$domain_name``, ``$type_name``, ``$event_name``.
* Every variable-header entry (the standard ones too, so their full NS value stays selectable) -> ``$ohf_<name>``,
  every filterable-data entry -> ``$fd_<name>``; flattenable structs become one property per leaf; other values
  become a String property holding base64 of the Any's CDR encapsulation (see :mod:`router.mapping.names`).
* ``remainder_of_body`` -> body (see :mod:`router.mapping.body`); ``JMSType = "Structured Event"``.
* ``$nsjms_idl``: a JSON manifest (original names, order, IDL types, which properties hold which entry) that lets
  :func:`router.mapping.to_event.jms_to_event` rebuild the event exactly.
"""

from __future__ import annotations  # noqa: I001  (omniORB must be imported before the COS stubs)

import base64
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import omniORB  # noqa: F401  (first: it puts the COS stubs on sys.path)
import TimeBase
from omniORB import CORBA

from router.jms.model import Destination, JmsMessage, JmsType, Typed
from router.mapping import body as bodies
from router.mapping import idltypes as it
from router.mapping import limits
from router.mapping import names
from router.mapping import qos
from router.mapping.errors import MappingError
from router.mapping.typed_props import parse_destination

__all__ = ["MANIFEST_VERSION", "event_to_jms"]

MANIFEST_VERSION = 1
_STRING = JmsType.STRING
#: ``json.dumps(..., separators=(",", ":"))`` without building an encoder per call.
_JSON = json.JSONEncoder(separators=(",", ":"))
#: The filterable_data entries that set a JMS header (the first of each name); the others only become properties.
_JMS_HEADER_ENTRIES = frozenset({"JMSCorrelationID", "JMSReplyTo"})
_INTEGRAL = frozenset({CORBA.tk_short, CORBA.tk_ushort, CORBA.tk_long, CORBA.tk_ulong, CORBA.tk_longlong,
                       CORBA.tk_ulonglong, CORBA.tk_octet})


def event_to_jms(event: Any, destination: Destination | None, *, now_ms: int, default_persistent: bool = True,
                 max_body_bytes: int | None = bodies.DEFAULT_MAX_BODY_BYTES) -> JmsMessage:
    """The JMS message for ``event``, to be sent at ``now_ms`` (ms since the Unix epoch) to ``destination``.

    Raises :class:`MappingError` for anything that cannot be mapped (a malformed standard QoS field, text that is
    not valid Unicode, a body above ``max_body_bytes``, a value that cannot be CDR-encoded).
    """
    header = event.header
    fixed = header.fixed_header
    variable = list(header.variable_header)
    props: dict[str, Typed] = {
        names.DOMAIN_NAME: _string(fixed.event_type.domain_name, "domain_name"),
        names.TYPE_NAME: _string(fixed.event_type.type_name, "type_name"),
        names.EVENT_NAME: _string(fixed.event_name, "event_name"),
    }
    allocator = names.NameAllocator(props)
    manifest: dict[str, Any] = {"v": MANIFEST_VERSION}
    manifest["ohf"] = [_entry("ohf", p, allocator, props) for p in variable]
    manifest["fd"] = [_entry("fd", p, allocator, props) for p in event.filterable_data]
    body_type, body, manifest["body"] = bodies.body_to_jms(event.remainder_of_body)
    bodies.check_size(body_type, body, max_body_bytes, "remainder_of_body")
    if manifest["body"]["k"] == "cdr" and isinstance(body, bytes) and len(body) > limits.MAX_CDR_BYTES:
        raise MappingError(f"a CDR-encoded body of {len(body)} bytes exceeds the limit of {limits.MAX_CDR_BYTES} "
                           "bytes the receiving side decodes", "remainder_of_body")
    if manifest["body"]["k"] == "cdr":
        props[names.BODY_ENCODING] = Typed(JmsType.STRING, bodies.CDR_ANY)
    props[names.MANIFEST] = Typed(JmsType.STRING, pack_manifest(_JSON.encode(manifest)))
    std = _standard_qos(variable)
    jms = [p for p in event.filterable_data if p.name in _JMS_HEADER_ENTRIES]
    return JmsMessage(
        body_type=body_type, body=body, destination=destination,
        delivery_mode=qos.reliability_to_mode(std.get("EventReliability"), default_persistent),
        priority=qos.ns_to_jms_priority(std["Priority"]) if "Priority" in std else 4,
        expiration=qos.expiration_ms(now_ms, std.get("Timeout"), std.get("StopTime")),
        delivery_time=max(0, qos.utc_to_ms(std["StartTime"])) if "StartTime" in std else 0,
        timestamp=now_ms, jms_type=names.STRUCTURED_EVENT, properties=props,
        correlation_id=_correlation_id(jms) if jms else None, reply_to=_reply_to(jms) if jms else None,
    )


def _first(entries: list[Any], name: str) -> Any | None:
    return next((p.value for p in entries if p.name == name), None)


def _text_entry(entries: list[Any], name: str) -> str | None:
    """The first filterable_data entry ``name`` when it is a string or wstring, else None (such an entry sets no
    header; it still travels as its ``$fd_`` property, so nothing is lost)."""
    value = _first(entries, name)
    if value is None or it.unalias(value.typecode()).kind() not in (CORBA.tk_string, CORBA.tk_wstring):
        return None
    return _string(value.value(), f"filterable_data:{name}").value  # type: ignore[return-value]


def _correlation_id(entries: list[Any]) -> str | None:
    """JMSCorrelationID: the first ``JMSCorrelationID`` filterable_data entry (the name JMS -> NS gives it)."""
    return _text_entry(entries, "JMSCorrelationID")


def _reply_to(entries: list[Any]) -> Destination | None:
    """JMSReplyTo: the first ``JMSReplyTo`` filterable_data entry when it names a STOMP destination (``/queue/x``,
    ``/topic/x``, ``/temp-queue/x``, ...); anything else sets no header (it stays a ``$fd_`` property)."""
    text = _text_entry(entries, "JMSReplyTo")
    if text is None:
        return None
    try:
        destination = parse_destination(text)
    except MappingError:
        return None
    return destination if destination is not None and destination.name else None


MANIFEST_PACK_OVER = 2048     # bytes of JSON; STOMP header lines are limited (ActiveMQ: 10 KiB)


def pack_manifest(text: str) -> str:
    """Large manifests travel as ``z:`` + base64(zlib(JSON)) so events with many properties fit in one STOMP
    header line; a JSON manifest always starts with ``{``, so the two forms cannot be confused."""
    if len(text) <= MANIFEST_PACK_OVER:
        return text
    return "z:" + base64.b64encode(zlib.compress(text.encode("utf-8"), 9)).decode("ascii")


def _string(value: object, field: str) -> Typed:
    if not isinstance(value, str):
        raise MappingError(f"expected a string, got {type(value).__name__}", field)
    if value.isascii():                  # nothing to check: only a lone surrogate fails to encode
        return Typed(_STRING, value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise MappingError("not valid Unicode (unpaired surrogate)", field) from None
    return Typed(JmsType.STRING, value)


# ------------------------------------------------------------------------------------------------ properties
@dataclass(frozen=True)
class _Plan:
    """What the mapping of an ohf/fd entry of one IDL type needs, decided once per type (issue 12): a leaf's
    converter, a flattenable struct's leaves, or neither (the value travels as CDR)."""

    desc: Any                                                   # tc_to_desc (shared: never changed)
    leaf: Callable[[Any], Typed] | None = None
    #: (member path, its names joined by ".", the leaf's converter) of a flattenable struct, in flatten order
    leaves: tuple[tuple[tuple[str, ...], str, Callable[[Any], Typed]], ...] | None = None


_PLANS: dict[Any, _Plan] = {}


def _make_plan(tc: Any) -> _Plan:
    if it.is_leaf(tc):
        return _Plan(it.tc_to_desc(tc), leaf=it.leaf_converter(tc))
    if it.is_flattenable(tc):
        leaves = tuple((path, ".".join(path), it.leaf_converter(ltc)) for path, ltc in it.leaf_paths(tc))
        return _Plan(it.tc_to_desc(tc), leaves=leaves)
    return _Plan("cdr")


def _entry(section: str, prop: Any, allocator: names.NameAllocator, out: dict[str, Typed]) -> list[Any]:
    """Add the properties for one ohf/fd entry to ``out``; its manifest record ``[name, desc, [properties]]``."""
    name = str(prop.name)
    field = f"{section}:{name}"
    _string(name, field)
    value_any = prop.value
    plan = it.type_cached(_PLANS, value_any.typecode(), _make_plan)
    if plan.leaf is not None:
        pname = allocator.allocate(section, name)
        out[pname] = _checked(plan.leaf(value_any.value()), field)
        return [name, plan.desc, [pname]]
    if plan.leaves is not None:
        value = value_any.value()
        pnames = []
        for path, dotted, convert in plan.leaves:
            leaf = value
            for member in path:
                leaf = getattr(leaf, member)
            pname = allocator.allocate(section, name, path)
            out[pname] = _checked(convert(leaf), f"{field}.{dotted}")
            pnames.append(pname)
        return [name, plan.desc, pnames]
    pname = allocator.allocate(section, name)
    encoded = base64.b64encode(it.any_to_cdr(value_any, field)).decode("ascii")
    out[pname] = Typed(JmsType.STRING, encoded)
    return [name, "cdr", [pname]]


def _checked(typed: Typed, field: str) -> Typed:
    if isinstance(typed.value, str):
        _string(typed.value, field)
    return typed


# ------------------------------------------------------------------------------------------------ standard QoS
def _standard_qos(variable: list[Any]) -> dict[str, int]:
    """The standard QoS header fields present (first occurrence wins), as integers; malformed -> MappingError."""
    found: dict[str, int] = {}
    for prop in variable:
        name = str(prop.name)
        if name in found:
            continue
        if name in ("EventReliability", "Priority", "Timeout"):
            found[name] = _integral(prop.value, name)
        elif name in ("StopTime", "StartTime"):
            found[name] = _utc(prop.value, name)
    reliability = found.get("EventReliability")
    if reliability is not None and reliability not in (qos.BEST_EFFORT, qos.PERSISTENT):
        raise MappingError(f"EventReliability must be 0 or 1, got {reliability}", "EventReliability")
    if found.get("Timeout", 0) < 0:
        raise MappingError("Timeout must not be negative", "Timeout")
    return found


def _integral(value: Any, field: str) -> int:
    if it.unalias(value.typecode()).kind() not in _INTEGRAL:
        raise MappingError(f"expected an integer type, got {value.typecode()}", field)
    return int(value.value())


def _utc(value: Any, field: str) -> int:
    if not value.typecode().equivalent(TimeBase._tc_UtcT):
        raise MappingError(f"expected TimeBase::UtcT, got {value.typecode()}", field)
    return int(value.value().time)
