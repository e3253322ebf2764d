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
import dataclasses
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
from router.mapping.idltypes import new_typed
from router.mapping.typed_props import parse_destination

__all__ = ["MANIFEST_VERSION", "event_to_jms"]

MANIFEST_VERSION = 1
_STRING = JmsType.STRING
#: ``json.dumps(..., separators=(",", ":"))`` without building an encoder per call.
_JSON = json.JSONEncoder(separators=(",", ":"))
#: The filterable_data entries that set a JMS header (the first of each name); the others only become properties.
_CDR_ANY = Typed(JmsType.STRING, bodies.CDR_ANY)
_JMS_HEADER_ENTRIES = frozenset({"JMSCorrelationID", "JMSReplyTo"})
_INTEGRAL = frozenset({CORBA.tk_short, CORBA.tk_ushort, CORBA.tk_long, CORBA.tk_ulong, CORBA.tk_longlong,
                       CORBA.tk_ulonglong, CORBA.tk_octet})


def event_to_jms(event: Any, destination: Destination | None, *, now_ms: int, default_persistent: bool = True,
                 max_body_bytes: int | None = bodies.DEFAULT_MAX_BODY_BYTES) -> JmsMessage:
    """The JMS message for ``event``, to be sent at ``now_ms`` (ms since the Unix epoch) to ``destination``.

    Raises :class:`MappingError` for anything that cannot be mapped (a malformed standard QoS field, text that is
    not valid Unicode, a body above ``max_body_bytes``, a value that cannot be CDR-encoded, types nested too deeply
    for the mapping's recursive walk: the channel accepts values nested up to 512 levels).
    """
    try:
        return _event_to_jms(event, destination, now_ms=now_ms, default_persistent=default_persistent,
                             max_body_bytes=max_body_bytes)
    except RecursionError:
        raise MappingError("the event's types or values are nested too deeply to map to JMS",
                           "remainder_of_body or a property") from None


def _event_to_jms(event: Any, destination: Destination | None, *, now_ms: int, default_persistent: bool,
                  max_body_bytes: int | None) -> JmsMessage:
    header = event.header
    fixed = header.fixed_header
    variable = header.variable_header
    filterable = event.filterable_data
    props: dict[str, Typed] = {
        names.DOMAIN_NAME: _string(fixed.event_type.domain_name, "domain_name"),
        names.TYPE_NAME: _string(fixed.event_type.type_name, "type_name"),
        names.EVENT_NAME: _string(fixed.event_name, "event_name"),
    }
    remainder = event.remainder_of_body
    shape = _shape(variable, filterable, remainder)
    try:
        plan = _SHAPES.get(shape) if shape is not None else None
    except TypeError:                                 # an unhashable descriptor (a recursive type)
        plan = None
    if plan is None:
        plan, manifest = _plan_shape(variable, filterable, props)
        body_type, body, manifest["body"] = bodies.body_to_jms(remainder)
        body_manifest = manifest["body"]
        manifest_text = pack_manifest(_JSON.encode(manifest))
        manifest_typed: Typed | None = None
        if shape is not None and _cacheable(shape):
            if len(_SHAPES) >= SHAPE_CACHE_MAX:
                _SHAPES.clear()
            _SHAPES[shape] = _Shape(plan.entries, plan.ohf, plan.fd, body_manifest, manifest_text,
                                    Typed(JmsType.STRING, manifest_text))
    else:
        entries = plan.entries
        if len(entries) == 1:                 # the usual small event: one entry, no tuple of both sections
            field, entry_plan, pnames = entries[0]
            _values(field, entry_plan, pnames, (variable or filterable)[0].value, props)
        else:
            for (field, entry_plan, pnames), prop in zip(entries, (*variable, *filterable), strict=True):
                _values(field, entry_plan, pnames, prop.value, props)
        body_type, body, body_manifest = bodies.body_to_jms(remainder)
        if body_manifest == plan.body:        # the usual case: the manifest of the shape, encoded once
            manifest_text = plan.manifest
            manifest_typed = plan.manifest_typed
        else:                                 # a body whose manifest holds per-value parts (map, AnySeq)
            manifest_text = pack_manifest(_JSON.encode({"v": MANIFEST_VERSION, "ohf": plan.ohf, "fd": plan.fd,
                                                        "body": body_manifest}))
            manifest_typed = None
    bodies.check_size(body_type, body, max_body_bytes, "remainder_of_body")
    if body_manifest["k"] == "cdr" and isinstance(body, bytes) and len(body) > limits.MAX_CDR_BYTES:
        raise MappingError(f"a CDR-encoded body of {len(body)} bytes exceeds the limit of {limits.MAX_CDR_BYTES} "
                           "bytes the receiving side decodes", "remainder_of_body")
    if body_manifest["k"] == "cdr":
        props[names.BODY_ENCODING] = _CDR_ANY
    props[names.MANIFEST] = manifest_typed or new_typed(_STRING, manifest_text)
    std = _standard_qos(variable)
    jms = [p for p in filterable if p.name in _JMS_HEADER_ENTRIES]
    return _message(
        body_type=body_type, body=body, destination=destination,
        delivery_mode=qos.reliability_to_mode(std.get("EventReliability"), default_persistent),
        priority=qos.ns_to_jms_priority(std["Priority"]) if "Priority" in std else 4,
        expiration=qos.expiration_ms(now_ms, std.get("Timeout"), std.get("StopTime")),
        delivery_time=max(0, qos.utc_to_ms(std["StartTime"])) if "StartTime" in std else 0,
        timestamp=now_ms, jms_type=names.STRUCTURED_EVENT, properties=props,
        correlation_id=_correlation_id(jms) if jms else None, reply_to=_reply_to(jms) if jms else None,
    )


#: JmsMessage's fields with a plain default (``properties`` has a factory: :func:`_message` is always given it).
_MESSAGE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(JmsMessage) if f.default is not dataclasses.MISSING}
_MESSAGE_REQUIRED = frozenset(f.name for f in dataclasses.fields(JmsMessage)) - _MESSAGE_DEFAULTS.keys()


def _message(**values: Any) -> JmsMessage:
    """``JmsMessage(**values)``, the same object, without the frozen dataclass's ``__init__`` (one
    ``object.__setattr__`` per field: about 4 us of the mapping's per-event cost; issue 12, round 5). Every field
    without a plain default must be given (``test_mapping_caches`` pins equality with the constructor)."""
    if not values.keys() >= _MESSAGE_REQUIRED:
        raise TypeError(f"JmsMessage needs {sorted(_MESSAGE_REQUIRED - values.keys())}")
    made = _new(JmsMessage)
    attrs = made.__dict__
    attrs.update(_MESSAGE_DEFAULTS)
    attrs.update(values)
    return made


_new = object.__new__


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
        return new_typed(_STRING, value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise MappingError("not valid Unicode (unpaired surrogate)", field) from None
    return new_typed(_STRING, value)


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


def _entry(section: str, prop: Any, allocator: names.NameAllocator, out: dict[str, Typed]
           ) -> tuple[list[Any], _EntryPlan]:
    """Add the properties for one ohf/fd entry to ``out``; its manifest record ``[name, desc, [properties]]`` and
    what a later event of the same shape needs to map this entry (:class:`_Shape`)."""
    name = str(prop.name)
    field = f"{section}:{name}"
    _string(name, field)
    value_any = prop.value
    plan = it.type_cached(_PLANS, value_any.typecode(), _make_plan)
    if plan.leaves is not None:
        pnames = tuple(allocator.allocate(section, name, path) for path, _, _ in plan.leaves)
    else:
        pnames = (allocator.allocate(section, name),)
    _values(field, plan, pnames, value_any, out)
    return [name, plan.desc, list(pnames)], (field, plan, pnames)


def _values(field: str, plan: _Plan, pnames: tuple[str, ...], value_any: Any, out: dict[str, Typed]) -> None:
    """The properties of one entry's value, under the names ``pnames`` chosen for its shape."""
    if plan.leaf is not None:
        out[pnames[0]] = _checked(plan.leaf(value_any.value()), field)
    elif plan.leaves is not None:
        value = value_any.value()
        for (path, dotted, convert), pname in zip(plan.leaves, pnames, strict=True):
            leaf = value
            for member in path:
                leaf = getattr(leaf, member)
            out[pname] = _checked(convert(leaf), f"{field}.{dotted}")
    else:
        out[pnames[0]] = new_typed(_STRING, base64.b64encode(it.any_to_cdr(value_any, field)).decode("ascii"))


# ------------------------------------------------------------------------------------------------ event shapes
#: (field, type plan, property names) of one ohf/fd entry, decided for a shape.
_EntryPlan = tuple[str, _Plan, tuple[str, ...]]


@dataclass(frozen=True)
class _Shape:
    """What every event of one shape shares (issue 12, round 5): the same entry names and IDL types in the same
    order and the same body type give the same property names (the allocator's choices), the same manifest
    records and, unless the body's manifest entry holds per-value parts (a map's entries, an AnySeq's element
    types), the same manifest text. Decided by mapping the first such event in full; a later one only converts
    its values."""

    entries: tuple[_EntryPlan, ...]          # ohf entries then fd entries, in order
    ohf: list[Any]                           # the manifest's records (never changed)
    fd: list[Any]
    body: dict[str, Any]                     # the body's manifest entry of the first event
    manifest: str                            # the packed manifest text of the first event
    manifest_typed: Typed | None = None      # its property (Typed is immutable: shared by the events)


_SHAPES: dict[Any, _Shape] = {}
#: Shapes remembered at most (emptied when full, as the per-type tables).
SHAPE_CACHE_MAX = 1024


def _shape(variable: Any, filterable: Any, remainder: Any) -> Any:
    """The key of an event's shape: the entries' names and TypeCode descriptors and the body's descriptor; None
    when one cannot be read."""
    try:
        return (tuple([(p.name, p.value.typecode()._d) for p in variable]),
                tuple([(p.name, p.value.typecode()._d) for p in filterable]),
                remainder.typecode()._d)
    except AttributeError:
        return None


def _cacheable(shape: Any) -> bool:
    """A shape is remembered only when all its names are strings and its descriptors are plain (no enum, no
    recursive type: ``idltypes.type_cached``'s rule), so an equal key means the same types."""
    ohf, fd, body = shape
    try:
        hash(shape)
    except TypeError:
        return False
    return (body is not None and it._plain(body)
            and all(isinstance(name, str) and desc is not None and it._plain(desc)
                    for name, desc in (*ohf, *fd)))


def _plan_shape(variable: Any, filterable: Any, props: dict[str, Typed]) -> tuple[_Shape, dict[str, Any]]:
    """Map the entries of a first event of its shape into ``props`` (the full mapping); its shape (without the
    body's parts) and the manifest so far."""
    allocator = names.NameAllocator(props)
    ohf: list[Any] = []
    fd: list[Any] = []
    plans: list[_EntryPlan] = []
    for section, entries, records in (("ohf", variable, ohf), ("fd", filterable, fd)):
        for prop in entries:
            record, plan = _entry(section, prop, allocator, props)
            records.append(record)
            plans.append(plan)
    shape = _Shape(tuple(plans), ohf, fd, {}, "")
    return shape, {"v": MANIFEST_VERSION, "ohf": ohf, "fd": fd}


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
