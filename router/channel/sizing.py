"""A cheap, conservative upper bound of an event's CDR encoding, so the size limit needs no encoding.

:func:`size_bound` walks the event's values (omniORBpy keeps each ``CORBA.Any``'s type descriptor in ``_t._d``)
and adds, per item, the largest number of bytes CDR can use for it: the item's own size plus the most alignment
padding it can need (``size - 1``), four bytes per character of a string (UTF-8 and UTF-16 never use more per code
point) plus the length and the terminating NUL, and for an ``any`` the largest encoding of its TypeCode. The sum is
therefore never below ``len(encode(event))`` (``tests/unit/test_event_size_bound.py`` checks this against the
real encoder for generated events). It answers ``None`` for shapes it does not model (object references, unions,
enums inside TypeCodes, values, fixed, long double, TypeCodes as values, recursive TypeCodes, values of the wrong
Python type): the caller then encodes the event to measure it exactly.

The walk is also the channel's depth check: values nested deeper than :data:`MAX_EVENT_DEPTH` levels (each Any,
struct member, sequence element or TypeCode level counts one) raise :class:`EventTooDeep`, which the channel
answers with ``BAD_PARAM`` (``COMPLETED_NO``) instead of letting a recursion fail somewhere later (issue 31: an Any
nested 5,000 deep gave ``UNKNOWN`` from a ``RecursionError`` here). A shape too deep for this recursive walk but
within the limit (a ``RecursionError``) answers ``None`` like an unmodelled one, and :func:`check_depth` then measures
it without recursion.

The bound is what makes the check cheap: an event whose bound is within the limit is within the limit, without
being encoded; only an event whose bound is above the limit (or whose shape is not modelled) is encoded.
"""

from __future__ import annotations

from typing import Any

from omniORB import CORBA, tcInternal

from router.channel.events import Event, Form
from router.mapping.limits import value_depth

__all__ = ["MAX_EVENT_DEPTH", "EventTooDeep", "check_depth", "size_bound"]

#: Deepest nesting of an event's values the channel accepts (the JMS -> event mapping's decoders stop at 400
#: object levels, ``router.mapping.limits.MAX_VALUE_DEPTH``, so whatever a bridge maps is accepted).
MAX_EVENT_DEPTH = 512

_T = tcInternal
# Largest CDR size (including worst-case alignment padding) of the primitive kinds, by omniORBpy descriptor.
_PRIMITIVE: dict[int, int] = {
    _T.tv_null: 0, _T.tv_void: 0,
    _T.tv_short: 2 + 1, _T.tv_ushort: 2 + 1,
    _T.tv_long: 4 + 3, _T.tv_ulong: 4 + 3, _T.tv_float: 4 + 3,
    _T.tv_double: 8 + 7, _T.tv_longlong: 8 + 7, _T.tv_ulonglong: 8 + 7,
    _T.tv_boolean: 1, _T.tv_char: 1, _T.tv_octet: 1,
    _T.tv_wchar: 1 + 4 + 3,               # GIOP 1.2: length octet + up to 4 octets; GIOP 1.1: a (padded) ulong
}
# Element sizes of sequences/arrays of primitives: n elements take at most (size - 1) + n * size bytes.
_ELEMENT: dict[int, int] = {
    _T.tv_short: 2, _T.tv_ushort: 2, _T.tv_long: 4, _T.tv_ulong: 4, _T.tv_float: 4,
    _T.tv_double: 8, _T.tv_longlong: 8, _T.tv_ulonglong: 8, _T.tv_boolean: 1, _T.tv_octet: 1,
}
_ULONG = 4 + 3                            # a length or count: 4 bytes, at most 3 of padding
_TC_SIMPLE = _ULONG                       # a TypeCode of a primitive kind is its kind (a ulong)


class _Unmodelled(Exception):
    """The value's shape is outside what the bound models: measure it exactly instead."""


class EventTooDeep(Exception):
    """The event's values are nested deeper than :data:`MAX_EVENT_DEPTH` levels."""

    def __init__(self, limit: int = MAX_EVENT_DEPTH) -> None:
        super().__init__(f"the event's values are nested deeper than {limit} levels")
        self.limit = limit


def size_bound(event: Event) -> int | None:
    """An upper bound of ``len(encode(event))``, or None when the event must be encoded to know its size (then
    call :func:`check_depth` first). Raises :class:`EventTooDeep` for values nested beyond the limit."""
    try:
        if event.form is Form.STRUCTURED:
            return 1 + _structured(event.value)            # 1: the encapsulation's byte-order octet
        return 1 + _any(event.value, 1)
    except (_Unmodelled, AttributeError, TypeError, RecursionError):
        return None


def check_depth(event: Event, limit: int = MAX_EVENT_DEPTH) -> None:
    """Raise :class:`EventTooDeep` when the event's values are nested deeper than ``limit`` (iterative: safe for
    any depth the ORB could unmarshal)."""
    if value_depth(event.value, limit) > limit:
        raise EventTooDeep(limit)


def _deeper(depth: int) -> int:
    if depth >= MAX_EVENT_DEPTH:
        raise EventTooDeep
    return depth + 1


def _string(s: Any) -> int:
    if isinstance(s, str):
        return _ULONG + 4 * len(s) + 1
    if isinstance(s, bytes):
        return _ULONG + len(s) + 1
    raise _Unmodelled


def _structured(ev: Any) -> int:
    header = ev.header
    fixed = header.fixed_header
    kind = fixed.event_type
    return (_string(kind.domain_name) + _string(kind.type_name) + _string(fixed.event_name)
            + _properties(header.variable_header) + _properties(ev.filterable_data)
            + _any(ev.remainder_of_body, 3))


def _properties(props: Any) -> int:
    total = _ULONG
    for p in props:
        total += _string(p.name) + _any(p.value, 4)
    return total


def _any(a: Any, depth: int) -> int:
    if not isinstance(a, CORBA.Any):
        raise _Unmodelled
    d = a._t._d
    if type(d) is int:                                  # primitive (or a nested any): the fast path
        size = _PRIMITIVE.get(d)
        if size is None:
            if d != _T.tv_any:
                raise _Unmodelled
            return _TC_SIMPLE + _any(a._v, _deeper(depth))
        return _TC_SIMPLE + size
    return _typecode(d, depth) + _value(d, a._v, depth)


def _value(d: Any, v: Any, depth: int) -> int:
    depth = _deeper(depth)
    if type(d) is int:
        if d == _T.tv_any:
            return _any(v, depth)
        size = _PRIMITIVE.get(d)
        if size is None:
            raise _Unmodelled
        return size
    kind = d[0]
    if kind == _T.tv_string:
        return _string(v)
    if kind == _T.tv_wstring:
        if not isinstance(v, str):
            raise _Unmodelled
        return _ULONG + 4 * (len(v) + 1)                # UTF-16 code units (GIOP 1.2) or 4-byte chars + NUL
    if kind == _T.tv_alias:
        return _value(d[3], v, depth)
    if kind == _T.tv_struct:
        return sum(_value(d[i + 1], getattr(v, d[i]), depth) for i in range(4, len(d), 2))
    if kind in (_T.tv_sequence, _T.tv_array):
        head = _ULONG if kind == _T.tv_sequence else 0
        return head + _elements(d[1], v, depth)
    raise _Unmodelled


def _elements(d: Any, v: Any, depth: int) -> int:
    if type(d) is int:
        if d in (_T.tv_octet, _T.tv_char) and isinstance(v, (bytes, str)):
            return 4 * len(v) if isinstance(v, str) else len(v)
        size = _ELEMENT.get(d)
        if size is not None:
            return size - 1 + len(v) * size
    return sum(_value(d, item, depth) for item in v)


def _typecode(d: Any, depth: int) -> int:
    """Upper bound of a TypeCode's encoding (kind, then for complex kinds an encapsulation of its parameters)."""
    if type(d) is int:
        if d not in _PRIMITIVE and d != _T.tv_any:
            raise _Unmodelled
        return _TC_SIMPLE
    depth = _deeper(depth)
    kind = d[0]
    if kind in (_T.tv_string, _T.tv_wstring):
        return _ULONG + _ULONG                           # kind, bound
    encapsulation = _ULONG + _ULONG + 1                  # kind, encapsulation length, byte order
    if kind in (_T.tv_sequence, _T.tv_array):
        return encapsulation + _typecode(d[1], depth) + _ULONG  # element type, bound/length
    if kind == _T.tv_alias:
        return encapsulation + _string(d[1]) + _string(d[2]) + _typecode(d[3], depth)
    if kind == _T.tv_struct:
        members = sum(_string(d[i]) + _typecode(d[i + 1], depth) for i in range(4, len(d), 2))
        return encapsulation + _string(d[2]) + _string(d[3]) + _ULONG + members
    raise _Unmodelled
