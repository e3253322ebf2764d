"""QoS and admin-property engine of the event channel (NS 2.5, 3.1; NJI 4.2.8, 4.3).

Pure decisions, no I/O: the channel, admin and proxy servants keep their QoS as a plain ``dict[str, object]`` of
Python values (short/long/ulong -> ``int``, boolean -> ``bool``, ``TimeBase::TimeT`` -> ``int`` in 100 ns units)
keyed by the standard property names, and call this module to

* build the QoS of new objects (:func:`channel_defaults`, :func:`inherit`),
* apply or check a ``set_qos``/``validate_qos`` request atomically (:func:`apply_qos`, :func:`validate_qos`),
* compute the effective QoS of one structured event from its header (:func:`event_qos`,
  :func:`validate_event_qos`),
* apply channel admin properties (:func:`admin_defaults`, :func:`apply_admin`),
* convert back to CORBA values (:func:`to_properties`, :func:`to_property_errors`, :func:`to_named_ranges`).

The rules, defaults and error codes are documented in ``docs/qos.md``.

Exceptions (no CORBA exception is raised here; the servants translate)::

    PropertiesError            .problems: tuple[PropertyProblem, ...]
     +-- QoSError              set_qos / validate_qos / validate_event_qos -> CosNotification.UnsupportedQoS
     +-- EventQoSError         QoS in a structured-event header            -> CORBA.BAD_QOS
     +-- AdminError            set_admin                                   -> CosNotification.UnsupportedAdmin
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

# omniORB must come first: importing it puts the COS stubs on sys.path.
# isort: off
import omniORB
import omniORB.any
from omniORB import CORBA

import CosNotification
import TimeBase

from router.routing.qos import ENABLE_TRANSACTION
# isort: on

__all__ = [
    "ACK_ACKNOWLEDGMENT",
    "ACK_NONE",
    "BEST_EFFORT",
    "DELIVERY_RELIABILITY",
    "ENABLE_TRANSACTION",
    "PERSISTENT",
    "RETRIES",
    "RETRY_INTERVAL",
    "SEQUENCE_NUMBER",
    "TIMET_PER_SECOND",
    "TRANSACTION_EVENTS",
    "TRANSACTION_EVENT_SEQUENCES",
    "TRANSACTION_TIMEOUT",
    "UTC_EPOCH_OFFSET",
    "AdminError",
    "Context",
    "EventQoSError",
    "Level",
    "PropertiesError",
    "PropertyProblem",
    "QoSError",
    "Target",
    "admin_defaults",
    "apply_admin",
    "apply_qos",
    "channel_defaults",
    "event_qos",
    "inherit",
    "to_named_ranges",
    "to_properties",
    "to_property_errors",
    "unix_to_utc",
    "utc_to_unix",
    "validate_event_qos",
    "validate_qos",
]

# -- names and constants not in the CosNotification stubs (NJI 4.2.8 CosNotifyCommAck, NJI 4.3) --------------
DELIVERY_RELIABILITY = "DeliveryReliability"
RETRIES = "Retries"
RETRY_INTERVAL = "RetryInterval"
SEQUENCE_NUMBER = "SequenceNumber"
TRANSACTION_EVENTS = "TransactionEvents"
TRANSACTION_EVENT_SEQUENCES = "TransactionEventSequences"
TRANSACTION_TIMEOUT = "TransactionTimeout"
ACK_NONE = 0
ACK_ACKNOWLEDGMENT = 1
BEST_EFFORT: int = CosNotification.BestEffort
PERSISTENT: int = CosNotification.Persistent

#: 100 ns intervals from 1582-10-15T00:00Z (TimeBase::UtcT origin) to 1970-01-01T00:00Z.
UTC_EPOCH_OFFSET = 122_192_928_000_000_000
TIMET_PER_SECOND = 10_000_000

_LONG_MAX = 2**31 - 1
_ULONG_MAX = 2**32 - 1
_ULONGLONG_MAX = 2**64 - 1

_ER = CosNotification.EventReliability
_CR = CosNotification.ConnectionReliability
_ET = ENABLE_TRANSACTION


def utc_to_unix(t: int) -> float:
    """``TimeBase::UtcT.time`` (100 ns since 1582-10-15 UTC) -> Unix seconds."""
    return (t - UTC_EPOCH_OFFSET) / TIMET_PER_SECOND


def unix_to_utc(s: float) -> int:
    """Unix seconds -> ``TimeBase::UtcT.time`` (100 ns since 1582-10-15 UTC)."""
    return round(s * TIMET_PER_SECOND) + UTC_EPOCH_OFFSET


# -- targets and context -------------------------------------------------------------------------------------
class Level(enum.StrEnum):
    """The kind of object whose QoS is set (NS Table 2-5 columns, admins and proxies split by side)."""

    CHANNEL = "channel"
    CONSUMER_ADMIN = "consumer_admin"
    SUPPLIER_ADMIN = "supplier_admin"
    PROXY_SUPPLIER = "proxy_supplier"
    PROXY_CONSUMER = "proxy_consumer"


_PROXIES = frozenset({Level.PROXY_SUPPLIER, Level.PROXY_CONSUMER})


@dataclass(frozen=True)
class Target:
    """The object a QoS request is for; ``sequence`` marks a sequence-style proxy."""

    level: Level
    sequence: bool = False


@dataclass(frozen=True)
class Context:
    """Facts about the target that the reliability rules need (NS 2.5.5.1).

    ``has_children``: for a channel, an admin exists (the default admins count once accessed); for an admin, it
    has proxies. ``parent``: the parent's effective QoS (``None`` for a channel).
    """

    has_children: bool = False
    parent: Mapping[str, object] | None = None


@dataclass(frozen=True)
class PropertyProblem:
    """One rejected property: ``code`` is a ``CosNotification.QoSError_code`` name; the range is for *_VALUE."""

    code: str
    name: str
    low: object | None = None
    high: object | None = None


class PropertiesError(Exception):
    """Base of the errors of this module; carries every problem found."""

    def __init__(self, problems: Iterable[PropertyProblem]) -> None:
        self.problems: tuple[PropertyProblem, ...] = tuple(problems)
        super().__init__("; ".join(f"{p.code} {p.name}" for p in self.problems))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.problems,))


class QoSError(PropertiesError):
    """A ``set_qos``/``validate_qos``/``validate_event_qos`` request cannot be satisfied (UnsupportedQoS)."""


class EventQoSError(PropertiesError):
    """The QoS in a structured event's header cannot be honoured (the servant raises ``CORBA.BAD_QOS``)."""


class AdminError(PropertiesError):
    """A ``set_admin`` request cannot be satisfied (UnsupportedAdmin)."""


# -- the property table --------------------------------------------------------------------------------------
class Kind(enum.Enum):
    """IDL type of a property value."""

    SHORT = "short"
    LONG = "long"
    ULONG = "unsigned long"
    TIMET = "TimeBase::TimeT"
    BOOLEAN = "boolean"
    UTCT = "TimeBase::UtcT"


_TCS: dict[Kind, Any] = {
    Kind.SHORT: CORBA.TC_short, Kind.LONG: CORBA.TC_long, Kind.ULONG: CORBA.TC_ulong,
    Kind.TIMET: TimeBase._tc_TimeT, Kind.BOOLEAN: CORBA.TC_boolean, Kind.UTCT: TimeBase._tc_UtcT,
}
_TKS: dict[Kind, Any] = {
    Kind.SHORT: CORBA.tk_short, Kind.LONG: CORBA.tk_long, Kind.ULONG: CORBA.tk_ulong,
    Kind.TIMET: CORBA.tk_ulonglong, Kind.BOOLEAN: CORBA.tk_boolean,
}


@dataclass(frozen=True)
class Prop:
    """One property: its type, legal range, default and the levels where it may be set."""

    name: str
    kind: Kind
    low: object
    high: object
    default: object
    levels: frozenset[Level] = frozenset()
    sequence_only: bool = False          # at proxy level, only sequence-style proxies

    def domain(self) -> list[object]:
        """Every legal value of a small enumerated property."""
        if self.kind is Kind.BOOLEAN:
            return [False, True]
        return list(range(int(self.low), int(self.high) + 1))  # type: ignore[call-overload]


_ALL = frozenset(Level)
_NOT_SUPPLIER_SIDE = _ALL - {Level.SUPPLIER_ADMIN, Level.PROXY_CONSUMER}
_CHANNEL_ONLY = frozenset({Level.CHANNEL})
_NEVER: frozenset[Level] = frozenset()
_BOOL = (False, True)

_QOS_LIST = (
    Prop(_ER, Kind.SHORT, BEST_EFFORT, PERSISTENT, BEST_EFFORT, _CHANNEL_ONLY),
    Prop(_CR, Kind.SHORT, BEST_EFFORT, PERSISTENT, BEST_EFFORT, _ALL),
    Prop(CosNotification.Priority, Kind.SHORT, CosNotification.LowestPriority, CosNotification.HighestPriority,
         CosNotification.DefaultPriority, _ALL),
    Prop(CosNotification.StartTime, Kind.UTCT, 0, _ULONGLONG_MAX, None, _NEVER),
    Prop(CosNotification.StopTime, Kind.UTCT, 0, _ULONGLONG_MAX, None, _NEVER),
    Prop(CosNotification.Timeout, Kind.TIMET, 0, _ULONGLONG_MAX, 0, _ALL),
    Prop(CosNotification.StartTimeSupported, Kind.BOOLEAN, *_BOOL, True, _ALL),
    Prop(CosNotification.StopTimeSupported, Kind.BOOLEAN, *_BOOL, True, _ALL),
    Prop(CosNotification.MaxEventsPerConsumer, Kind.LONG, 0, _LONG_MAX, 0, _NOT_SUPPLIER_SIDE),
    Prop(CosNotification.OrderPolicy, Kind.SHORT, CosNotification.AnyOrder, CosNotification.DeadlineOrder,
         CosNotification.PriorityOrder, _ALL),
    Prop(CosNotification.DiscardPolicy, Kind.SHORT, CosNotification.AnyOrder, CosNotification.LifoOrder,
         CosNotification.AnyOrder, _NOT_SUPPLIER_SIDE),
    Prop(CosNotification.MaximumBatchSize, Kind.LONG, 1, _LONG_MAX, 1, _ALL, sequence_only=True),
    Prop(CosNotification.PacingInterval, Kind.TIMET, 0, _ULONGLONG_MAX, 0, _ALL, sequence_only=True),
    Prop(DELIVERY_RELIABILITY, Kind.SHORT, ACK_NONE, ACK_ACKNOWLEDGMENT, ACK_NONE, _ALL),
    Prop(RETRIES, Kind.LONG, 0, _LONG_MAX, 3, _ALL),
    Prop(RETRY_INTERVAL, Kind.TIMET, 0, _ULONGLONG_MAX, TIMET_PER_SECOND, _ALL),
    Prop(_ET, Kind.BOOLEAN, *_BOOL, False, _ALL),
)
_ADMIN_LIST = (
    Prop(CosNotification.MaxQueueLength, Kind.LONG, 0, _LONG_MAX, 0),
    Prop(CosNotification.MaxConsumers, Kind.LONG, 0, _LONG_MAX, 0),
    Prop(CosNotification.MaxSuppliers, Kind.LONG, 0, _LONG_MAX, 0),
    Prop(CosNotification.RejectNewEvents, Kind.BOOLEAN, *_BOOL, False),
    Prop(TRANSACTION_EVENTS, Kind.LONG, 1, _LONG_MAX, 1),
    Prop(TRANSACTION_EVENT_SEQUENCES, Kind.LONG, 1, _LONG_MAX, 1),
    Prop(TRANSACTION_TIMEOUT, Kind.ULONG, 0, _ULONG_MAX, 0),
)
QOS_PROPERTIES: Mapping[str, Prop] = {p.name: p for p in _QOS_LIST}
ADMIN_PROPERTIES: Mapping[str, Prop] = {p.name: p for p in _ADMIN_LIST}
_ALL_PROPERTIES: Mapping[str, Prop] = {**QOS_PROPERTIES, **ADMIN_PROPERTIES}

#: Header fields that are per-message QoS (Table 2-5, "Per-Message" column).
MESSAGE_QOS = (_ER, CosNotification.Priority, CosNotification.StartTime, CosNotification.StopTime,
               CosNotification.Timeout)
#: Properties whose legal values depend on one another (the reliability rules below).
_INTERACTING = (_ER, _CR, _ET)


def settable(prop: Prop, target: Target) -> bool:
    """May ``prop`` be set on ``target`` (Table 2-5 and its footnotes)?"""
    if target.level not in prop.levels:
        return False
    return not (prop.sequence_only and target.level in _PROXIES and not target.sequence)


def _held(prop: Prop, target: Target) -> bool:
    """Does ``target``'s effective QoS hold ``prop``? EventReliability is held read-only below the channel."""
    return settable(prop, target) or prop.name == _ER


def _value(qos: Mapping[str, object], name: str) -> object:
    return qos.get(name, _ALL_PROPERTIES[name].default)


# -- decoding CORBA values -----------------------------------------------------------------------------------
def _pairs(items: Iterable[Any]) -> Iterator[tuple[str, Any]]:
    """``(name, any)`` pairs from tuples or ``CosNotification.Property`` structs."""
    for item in items:
        yield (item[0], item[1]) if isinstance(item, tuple) else (item.name, item.value)


def _unalias(tc: Any) -> Any:
    while tc.kind() == CORBA.tk_alias:
        tc = tc.content_type()
    return tc


def _type_ok(kind: Kind, value: Any) -> bool:
    if not isinstance(value, CORBA.Any):
        return False
    tc = value.typecode()
    if kind is Kind.UTCT:
        return bool(tc.equivalent(TimeBase._tc_UtcT))
    return bool(_unalias(tc).kind() == _TKS[kind])


def _python_value(kind: Kind, value: Any) -> object | None:
    """The Python value inside an Any already known to have the right TypeCode; ``None`` if malformed."""
    v = value.value()
    if kind is Kind.UTCT:
        v = getattr(v, "time", None)
    if kind is Kind.BOOLEAN:
        return bool(v) if isinstance(v, (bool, int)) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def decode(prop: Prop, value: Any) -> tuple[object | None, PropertyProblem | None]:
    """Check type (BAD_TYPE) and legal range (BAD_VALUE) of one value; return the Python value."""
    v = _python_value(prop.kind, value) if _type_ok(prop.kind, value) else None
    if v is None:
        return None, PropertyProblem("BAD_TYPE", prop.name)
    if not prop.low <= v <= prop.high:  # type: ignore[operator]
        return None, PropertyProblem("BAD_VALUE", prop.name, prop.low, prop.high)
    return v, None


def _read(table: Mapping[str, Prop], requested: Iterable[Any],
          target: Target | None) -> tuple[dict[str, object], list[PropertyProblem]]:
    """Decode a request: BAD_PROPERTY, UNSUPPORTED_PROPERTY (``target`` given), BAD_TYPE, BAD_VALUE."""
    values: dict[str, object] = {}
    problems: list[PropertyProblem] = []
    for name, any_value in _pairs(requested):
        prop = table.get(name)
        if prop is None:
            problems.append(PropertyProblem("BAD_PROPERTY", name))
        elif target is not None and not settable(prop, target):
            problems.append(PropertyProblem("UNSUPPORTED_PROPERTY", name))
        else:
            v, problem = decode(prop, any_value)
            if problem is None:
                values[name] = v
            else:
                problems.append(problem)
    return values, problems


# -- the reliability / transaction rules (NS 2.5.5.1, 2.1.5; NJI 4.3) ---------------------------------------
def _implied(current: Mapping[str, object], values: Mapping[str, object]) -> dict[str, object]:
    """Values forced by an EnableTransaction change: TRUE -> both reliabilities Persistent, FALSE -> BestEffort.

    Only a *change* of EnableTransaction forces anything; a reliability set explicitly in the same request wins.
    """
    if _ET not in values or values[_ET] == _value(current, _ET):
        return {}
    forced = PERSISTENT if values[_ET] else BEST_EFFORT
    return {name: forced for name in (_CR, _ER) if name not in values}


def _evaluate(current: Mapping[str, object], values: Mapping[str, object], target: Target,
              ctx: Context) -> tuple[dict[str, object], list[PropertyProblem]]:
    """The new effective QoS for decoded, level-checked ``values``, and the context problems it has."""
    implied = _implied(current, values)
    new = {**current, **implied, **values}
    rules = _Rules(current, new, values, implied, ctx, target)
    return new, rules.problems()


@dataclass(frozen=True)
class _Rules:
    """The context checks of one request; a problem is blamed on the requested property that caused it."""

    current: Mapping[str, object]
    new: Mapping[str, object]
    values: Mapping[str, object]
    implied: Mapping[str, object]
    ctx: Context
    target: Target

    def problems(self) -> list[PropertyProblem]:
        found = [*self._frozen(), *self._parent(), *self._meaningless(), *self._transactional()]
        first: dict[str, PropertyProblem] = {}
        for problem in found:
            first.setdefault(problem.name, problem)
        return list(first.values())

    def _touched(self, name: str) -> bool:
        return name in self.values or name in self.implied

    def _blame_et(self) -> PropertyProblem:
        cur = bool(_value(self.current, _ET))
        return PropertyProblem("UNAVAILABLE_VALUE", _ET, cur, cur)

    def _frozen(self) -> list[PropertyProblem]:
        """ConnectionReliability may not change once the channel has admins / the admin has proxies."""
        changed = _value(self.new, _CR) != _value(self.current, _CR)
        if not (changed and self.ctx.has_children):
            return []
        if _CR in self.values:
            return [PropertyProblem("UNAVAILABLE_PROPERTY", _CR)]
        return [self._blame_et()]

    def _parent(self) -> list[PropertyProblem]:
        """A child may not be Persistent when its parent is BestEffort."""
        parent = self.ctx.parent
        if parent is None or not self._touched(_CR) or _value(self.new, _CR) != PERSISTENT:
            return []
        if _value(parent, _CR) != BEST_EFFORT:
            return []
        if _CR in self.values:
            return [PropertyProblem("UNAVAILABLE_VALUE", _CR, BEST_EFFORT, BEST_EFFORT)]
        return [PropertyProblem("UNAVAILABLE_VALUE", _ET, False, False)]

    def _meaningless(self) -> list[PropertyProblem]:
        """EventReliability=Persistent with ConnectionReliability=BestEffort is not supported."""
        if not (self._touched(_ER) or self._touched(_CR)):
            return []
        if _value(self.new, _ER) != PERSISTENT or _value(self.new, _CR) != BEST_EFFORT:
            return []
        if self.values.get(_ER) == PERSISTENT:
            return [PropertyProblem("UNAVAILABLE_VALUE", _ER, BEST_EFFORT, BEST_EFFORT)]
        if _CR in self.values:
            return [PropertyProblem("UNAVAILABLE_VALUE", _CR, PERSISTENT, PERSISTENT)]
        return [self._blame_et()]

    def _transactional(self) -> list[PropertyProblem]:
        """While EnableTransaction is TRUE both reliabilities must stay Persistent."""
        if not _value(self.new, _ET):
            return []
        return [PropertyProblem("UNAVAILABLE_VALUE", name, PERSISTENT, PERSISTENT)
                for name in (_CR, _ER) if self.values.get(name, PERSISTENT) != PERSISTENT]


# -- QoS of channels, admins and proxies ---------------------------------------------------------------------
def channel_defaults() -> dict[str, object]:
    """The full effective QoS of a new channel before its creation QoS is applied."""
    return inherit({}, Target(Level.CHANNEL))


def inherit(parent_qos: Mapping[str, object], target: Target) -> dict[str, object]:
    """The QoS of a new child: the parent's values (defaults where missing) of what ``target`` holds."""
    return {p.name: _value(parent_qos, p.name) for p in _QOS_LIST if _held(p, target)}


def apply_qos(current: Mapping[str, object], requested: Sequence[Any], target: Target,
              ctx: Context) -> dict[str, object]:
    """``set_qos``: incremental and atomic; returns a NEW dict or raises :class:`QoSError` with every problem."""
    values, problems = _read(QOS_PROPERTIES, requested, target)
    new, context_problems = _evaluate(current, values, target, ctx)
    if problems or context_problems:
        raise QoSError([*problems, *context_problems])
    return new


def validate_qos(current: Mapping[str, object], requested: Sequence[Any], target: Target,
                 ctx: Context) -> list[tuple[str, object, object]]:
    """``validate_qos``: raise :class:`QoSError` like :func:`apply_qos`, else the additional available QoS.

    Every returned ``(name, low, high)`` may be added to the request with any value in its inclusive range,
    together with any subset of the others (NS 2.5.6.4). Interdependent properties (EventReliability,
    ConnectionReliability, EnableTransaction) are offered, in that order, only with the values that stay valid
    whatever the client picks for those offered before; for these two-valued properties the range is the value
    it could change to, and a property with no such change is left out (NS 2.5.6.8, Example 2).
    """
    values, problems = _read(QOS_PROPERTIES, requested, target)
    _, context_problems = _evaluate(current, values, target, ctx)
    if problems or context_problems:
        raise QoSError([*problems, *context_problems])
    offered = _offer_interacting(current, values, target, ctx)
    independent = [(p.name, p.low, p.high) for p in _QOS_LIST
                   if p.name not in _INTERACTING and p.name not in values and settable(p, target)]
    return [*offered, *independent]


def _offer_interacting(current: Mapping[str, object], values: Mapping[str, object], target: Target,
                       ctx: Context) -> list[tuple[str, object, object]]:
    offered: dict[str, list[object]] = {}
    for name in _INTERACTING:
        prop = QOS_PROPERTIES[name]
        if name in values or not settable(prop, target):
            continue
        changes = [v for v in prop.domain() if v != _value(current, name)
                   and _always_valid(current, {**values, name: v}, offered, target, ctx)]
        if changes:
            offered[name] = changes
    return [(name, min(vs), max(vs)) for name, vs in offered.items()]  # type: ignore[type-var]


def _always_valid(current: Mapping[str, object], values: Mapping[str, object],
                  offered: Mapping[str, list[object]], target: Target, ctx: Context) -> bool:
    """Is ``values`` valid combined with every choice (absent or any offered value) of the ``offered`` ones?"""
    names = list(offered)
    for combo in itertools.product(*[[None, *offered[n]] for n in names]):
        extra = {n: v for n, v in zip(names, combo, strict=True) if v is not None}
        if _evaluate(current, {**values, **extra}, target, ctx)[1]:
            return False
    return True


# -- per-event QoS -------------------------------------------------------------------------------------------
def _read_event(proxy_qos: Mapping[str, object], header: Iterable[Any],
                strict: bool) -> tuple[dict[str, object], list[PropertyProblem]]:
    """Decode the per-message QoS of a header; non-QoS names are user data unless ``strict``."""
    fields = []
    problems: list[PropertyProblem] = []
    for name, value in _pairs(header):
        if name in MESSAGE_QOS:
            fields.append((name, value))
        elif strict:
            code = "UNSUPPORTED_PROPERTY" if name in QOS_PROPERTIES else "BAD_PROPERTY"
            problems.append(PropertyProblem(code, name))
    values, decode_problems = _read(QOS_PROPERTIES, fields, None)
    return values, [*problems, *decode_problems, *_event_context(proxy_qos, values)]


def _event_context(proxy_qos: Mapping[str, object], values: Mapping[str, object]) -> list[PropertyProblem]:
    problems = []
    if values.get(_ER) == PERSISTENT and _value(proxy_qos, _CR) != PERSISTENT:
        problems.append(PropertyProblem("UNAVAILABLE_VALUE", _ER, BEST_EFFORT, BEST_EFFORT))
    for field, flag in ((CosNotification.StartTime, CosNotification.StartTimeSupported),
                        (CosNotification.StopTime, CosNotification.StopTimeSupported)):
        if field in values and not _value(proxy_qos, flag):
            problems.append(PropertyProblem("UNAVAILABLE_PROPERTY", field))
    return problems


class EventQoS(TypedDict):
    """The per-event QoS the channel acts on (see :func:`event_qos`)."""

    priority: int
    persistent: bool
    start_time: int | None          # UtcT.time
    stop_time: int | None           # UtcT.time
    timeout: int                    # TimeT, 0 = none


def _as_int(value: object) -> int:
    """A QoS value already checked by the property table (a Python int from an IDL integer type)."""
    if isinstance(value, (int, float, str)):
        return int(value)
    raise TypeError(f"QoS value {value!r} is not a number")


def _opt_int(value: object) -> int | None:
    return None if value is None else _as_int(value)


def event_qos(proxy_qos: Mapping[str, object], variable_header: Iterable[Any]) -> EventQoS:
    """Effective QoS of one event: the supplying proxy's QoS overridden by the header (not remembered).

    Returns ``priority`` (int), ``persistent`` (bool, EventReliability), ``start_time``/``stop_time``
    (``UtcT.time`` or None) and ``timeout`` (TimeT, 0 = none). Raises :class:`EventQoSError` on a per-message
    QoS field of the wrong type, an illegal value, or one the proxy's QoS does not allow.
    """
    values, problems = _read_event(proxy_qos, variable_header, strict=False)
    if problems:
        raise EventQoSError(problems)
    merged = {**proxy_qos, **values}
    return {
        "priority": _as_int(_value(merged, CosNotification.Priority)),
        "persistent": _value(merged, _ER) == PERSISTENT,
        "start_time": _opt_int(values.get(CosNotification.StartTime)),
        "stop_time": _opt_int(values.get(CosNotification.StopTime)),
        "timeout": _as_int(_value(merged, CosNotification.Timeout) or 0),
    }


def validate_event_qos(proxy_qos: Mapping[str, object],
                       requested: Sequence[Any]) -> list[tuple[str, object, object]]:
    """``validate_event_qos``: raise :class:`QoSError`, else the other per-message QoS with usable ranges."""
    values, problems = _read_event(proxy_qos, requested, strict=True)
    if problems:
        raise QoSError(problems)
    persistent_ok = _value(proxy_qos, _CR) == PERSISTENT
    ranges: dict[str, tuple[object, object]] = {
        _ER: (BEST_EFFORT, PERSISTENT if persistent_ok else BEST_EFFORT),
        CosNotification.Priority: (CosNotification.LowestPriority, CosNotification.HighestPriority),
        CosNotification.Timeout: (0, _ULONGLONG_MAX),
    }
    for field, flag in ((CosNotification.StartTime, CosNotification.StartTimeSupported),
                        (CosNotification.StopTime, CosNotification.StopTimeSupported)):
        if _value(proxy_qos, flag):
            ranges[field] = (0, _ULONGLONG_MAX)
    return [(name, low, high) for name, (low, high) in ranges.items() if name not in values]


# -- admin properties (NS 2.5.7; NJI 4.3) --------------------------------------------------------------------
def admin_defaults() -> dict[str, object]:
    """Admin properties of a new channel."""
    return {p.name: p.default for p in _ADMIN_LIST}


def apply_admin(current: Mapping[str, object], requested: Sequence[Any]) -> dict[str, object]:
    """``set_admin``: incremental and atomic; returns a NEW dict or raises :class:`AdminError`."""
    values, problems = _read(ADMIN_PROPERTIES, requested, None)
    if problems:
        raise AdminError(problems)
    return {**current, **values}


# -- back to CORBA values ------------------------------------------------------------------------------------
def to_any(name: str, value: object) -> Any:
    """A Python value of property ``name`` as a ``CORBA.Any`` with the property's TypeCode."""
    prop = _ALL_PROPERTIES.get(name)
    if value is None:
        return CORBA.Any(CORBA.TC_null, None)
    if prop is None:
        return omniORB.any.to_any(value)
    if prop.kind is Kind.UTCT:
        return CORBA.Any(TimeBase._tc_UtcT, TimeBase.UtcT(int(value), 0, 0, 0))  # type: ignore[call-overload]
    if prop.kind is Kind.BOOLEAN:
        return CORBA.Any(CORBA.TC_boolean, bool(value))
    return CORBA.Any(_TCS[prop.kind], int(value))  # type: ignore[call-overload]


def to_properties(qos: Mapping[str, object]) -> list[Any]:
    """A QoS or admin dict as a ``CosNotification.PropertySeq`` (table order, then unknown names sorted)."""
    known = [name for name in _ALL_PROPERTIES if name in qos]
    names = known + sorted(set(qos) - set(known))
    return [CosNotification.Property(n, to_any(n, qos[n])) for n in names if qos[n] is not None]


def to_property_errors(problems: Iterable[PropertyProblem]) -> list[Any]:
    """Problems as a ``CosNotification.PropertyErrorSeq`` for UnsupportedQoS / UnsupportedAdmin."""
    return [CosNotification.PropertyError(
        getattr(CosNotification, p.code), p.name,
        CosNotification.PropertyRange(to_any(p.name, p.low), to_any(p.name, p.high))) for p in problems]


def to_named_ranges(available: Iterable[tuple[str, object, object]]) -> list[Any]:
    """``validate_*`` results as a ``CosNotification.NamedPropertyRangeSeq``."""
    return [CosNotification.NamedPropertyRange(
        name, CosNotification.PropertyRange(to_any(name, low), to_any(name, high))) for name, low, high in available]
