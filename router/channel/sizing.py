"""A cheap, conservative upper bound of an event's CDR encoding, so the size limit needs no encoding.

:func:`size_bound` walks the event's values (omniORBpy keeps each ``CORBA.Any``'s type descriptor in ``_t._d``)
and adds, per item, the largest number of bytes CDR can use for it: the item's own size plus the most alignment
padding it can need (``size - 1``), four bytes per character of a string (UTF-8 and UTF-16 never use more per code
point) plus the length and the terminating NUL, and for an ``any`` the largest encoding of its TypeCode. The sum is
therefore never below ``len(encode(event))`` (``tests/unit/test_event_size_bound.py`` checks this against the
real encoder for generated events). It answers ``None`` for shapes it does not model (object references, unions,
enums inside TypeCodes, values, fixed, long double, TypeCodes as values, recursive TypeCodes, values of the wrong
Python type): the caller then encodes the event to measure it exactly.

The bound is what makes the check cheap: an event whose bound is within the limit is within the limit, without
being encoded; only an event whose bound is above the limit (or whose shape is not modelled) is encoded.
"""

from __future__ import annotations

from typing import Any

from omniORB import CORBA, tcInternal

from router.channel.events import Event, Form

__all__ = ["size_bound"]

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


def size_bound(event: Event) -> int | None:
    """An upper bound of ``len(encode(event))``, or None when the event must be encoded to know its size."""
    try:
        if event.form is Form.STRUCTURED:
            return 1 + _structured(event.value)            # 1: the encapsulation's byte-order octet
        return 1 + _any(event.value)
    except (_Unmodelled, AttributeError, TypeError):
        return None


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
            + _properties(header.variable_header) + _properties(ev.filterable_data) + _any(ev.remainder_of_body))


def _properties(props: Any) -> int:
    total = _ULONG
    for p in props:
        total += _string(p.name) + _any(p.value)
    return total


def _any(a: Any) -> int:
    if not isinstance(a, CORBA.Any):
        raise _Unmodelled
    d = a._t._d
    if type(d) is int:                                  # primitive (or a nested any): the fast path
        size = _PRIMITIVE.get(d)
        if size is None:
            if d != _T.tv_any:
                raise _Unmodelled
            return _TC_SIMPLE + _any(a._v)
        return _TC_SIMPLE + size
    return _typecode(d) + _value(d, a._v)


def _value(d: Any, v: Any) -> int:
    if type(d) is int:
        if d == _T.tv_any:
            return _any(v)
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
        return _value(d[3], v)
    if kind == _T.tv_struct:
        return sum(_value(d[i + 1], getattr(v, d[i])) for i in range(4, len(d), 2))
    if kind in (_T.tv_sequence, _T.tv_array):
        head = _ULONG if kind == _T.tv_sequence else 0
        return head + _elements(d[1], v)
    raise _Unmodelled


def _elements(d: Any, v: Any) -> int:
    if type(d) is int:
        if d in (_T.tv_octet, _T.tv_char) and isinstance(v, (bytes, str)):
            return 4 * len(v) if isinstance(v, str) else len(v)
        size = _ELEMENT.get(d)
        if size is not None:
            return size - 1 + len(v) * size
    return sum(_value(d, item) for item in v)


def _typecode(d: Any) -> int:
    """Upper bound of a TypeCode's encoding (kind, then for complex kinds an encapsulation of its parameters)."""
    if type(d) is int:
        if d not in _PRIMITIVE and d != _T.tv_any:
            raise _Unmodelled
        return _TC_SIMPLE
    kind = d[0]
    if kind in (_T.tv_string, _T.tv_wstring):
        return _ULONG + _ULONG                           # kind, bound
    encapsulation = _ULONG + _ULONG + 1                  # kind, encapsulation length, byte order
    if kind in (_T.tv_sequence, _T.tv_array):
        return encapsulation + _typecode(d[1]) + _ULONG  # element type, bound/length
    if kind == _T.tv_alias:
        return encapsulation + _string(d[1]) + _string(d[2]) + _typecode(d[3])
    if kind == _T.tv_struct:
        members = sum(_string(d[i]) + _typecode(d[i + 1]) for i in range(4, len(d), 2))
        return encapsulation + _string(d[2]) + _string(d[3]) + _ULONG + members
    raise _Unmodelled
