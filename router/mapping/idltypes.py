"""IDL TypeCode helpers for the mapping: leaf conversions IDL <-> JMS types, struct flattening, type descriptors.

Pure functions over omniORBpy values. Only :func:`tc_to_desc` / :func:`desc_to_tc` for non-basic types and
:func:`any_to_cdr` / :func:`cdr_to_any` marshal, which needs an initialised ORB (``CORBA.ORB_init``).

*Leaf* kinds (mapped to one JMS value): boolean, octet, char, wchar, short, ushort, long, ulong, long long,
unsigned long long, float, double, string, wstring and enum, seen through any number of typedefs.

=====================  =====================  ==============================================================
IDL                    JMS type               note
=====================  =====================  ==============================================================
boolean                boolean
octet                  short                  widened, so 0..255 keeps its sign (Java byte is signed)
char, wchar            String (1 char)        ``char`` in map/stream entries
short                  short
unsigned short, long   int
unsigned long          long                   widened
long long              long
unsigned long long     long                   String (decimal) when above 2**63-1
float / double         float / double
string / wstring       String
enum                   String                 the enumerator's name
=====================  =====================  ==============================================================
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import omniORB
from omniORB import CORBA, tcInternal

from router.jms.model import JmsType, Typed
from router.mapping import limits
from router.mapping.errors import MappingError

__all__ = [
    "JAVA_RANGES",
    "any_to_cdr",
    "build_struct",
    "cdr_to_any",
    "desc_to_tc",
    "describe",
    "flatten",
    "float32",
    "format_java_float",
    "is_flattenable",
    "is_leaf",
    "leaf_converter",
    "leaf_paths",
    "leaf_to_typed",
    "new_typed",
    "parse_java_float",
    "tc_to_desc",
    "type_cached",
    "typed_to_leaf",
    "unalias",
]

_K = CORBA
_BASIC: dict[str, Any] = {
    "boolean": CORBA.TC_boolean, "octet": CORBA.TC_octet, "char": CORBA.TC_char, "wchar": CORBA.TC_wchar,
    "short": CORBA.TC_short, "ushort": CORBA.TC_ushort, "long": CORBA.TC_long, "ulong": CORBA.TC_ulong,
    "longlong": CORBA.TC_longlong, "ulonglong": CORBA.TC_ulonglong, "float": CORBA.TC_float,
    "double": CORBA.TC_double, "string": CORBA.TC_string, "wstring": CORBA.TC_wstring,
    "null": CORBA.TC_null, "void": CORBA.TC_void, "any": CORBA.TC_any,
}
_LEAF_KINDS = frozenset({
    _K.tk_boolean, _K.tk_octet, _K.tk_char, _K.tk_wchar, _K.tk_short, _K.tk_ushort, _K.tk_long, _K.tk_ulong,
    _K.tk_longlong, _K.tk_ulonglong, _K.tk_float, _K.tk_double, _K.tk_string, _K.tk_wstring, _K.tk_enum,
})
_INT_RANGES = {  # IDL integer kinds: (min, max)
    _K.tk_octet: (0, 255), _K.tk_short: (-(2**15), 2**15 - 1), _K.tk_ushort: (0, 2**16 - 1),
    _K.tk_long: (-(2**31), 2**31 - 1), _K.tk_ulong: (0, 2**32 - 1),
    _K.tk_longlong: (-(2**63), 2**63 - 1), _K.tk_ulonglong: (0, 2**64 - 1),
}
_INT_JMS = {
    _K.tk_octet: JmsType.SHORT, _K.tk_short: JmsType.SHORT, _K.tk_ushort: JmsType.INT, _K.tk_long: JmsType.INT,
    _K.tk_ulong: JmsType.LONG, _K.tk_longlong: JmsType.LONG, _K.tk_ulonglong: JmsType.LONG,
}
#: Value ranges of the Java integral types.
JAVA_RANGES = {
    JmsType.BYTE: (-(2**7), 2**7 - 1), JmsType.SHORT: (-(2**15), 2**15 - 1),
    JmsType.INT: (-(2**31), 2**31 - 1), JmsType.LONG: (-(2**63), 2**63 - 1),
}


T = TypeVar("T")
#: Entries a :func:`type_cached` table holds at most (it is emptied when full: event types are few in practice).
TYPE_CACHE_MAX = 4096
_MISSING = object()


def _plain(descriptor: object) -> bool:
    """True when ``descriptor`` (an omniORBpy TypeCode's ``_d``) holds only ints, strings, classes, None and tuples
    of them: then two TypeCodes with equal descriptors are the same type in every respect :func:`describe` and the
    leaf conversions look at. Enum items compare by value only (not by name) and recursive types hold lists: those
    TypeCodes are never cached."""
    if descriptor is None or isinstance(descriptor, (int, str, type)):
        return True
    return isinstance(descriptor, tuple) and all(_plain(item) for item in descriptor)


def type_cached(table: dict[Any, T], tc: Any, make: Callable[[Any], T]) -> T:
    """``make(tc)``, remembered in ``table`` per type (by the TypeCode's descriptor, see :func:`_plain`): the
    per-type decisions of the mapping are taken once per event type instead of once per event (issue 12)."""
    key = getattr(tc, "_d", None)
    try:
        found = table.get(key, _MISSING)
    except TypeError:                   # an unhashable descriptor (a recursive type): not cached
        return make(tc)
    if found is not _MISSING:
        return found  # type: ignore[return-value]
    made = make(tc)
    if key is not None and _plain(key):
        if len(table) >= TYPE_CACHE_MAX:
            table.clear()
        table[key] = made
    return made


def unalias(tc: Any) -> Any:
    """The TypeCode behind any number of typedefs."""
    while tc.kind() == _K.tk_alias:
        tc = tc.content_type()
    return tc


def is_leaf(tc: Any) -> bool:
    return unalias(tc).kind() in _LEAF_KINDS


def is_flattenable(tc: Any) -> bool:
    """A struct whose members are all leaves or flattenable structs (NJI 2.4.2 "linearisation")."""
    base = unalias(tc)
    if base.kind() != _K.tk_struct:
        return False
    members = (base.member_type(i) for i in range(int(base.member_count())))
    return all(is_leaf(m) or is_flattenable(m) for m in members)


# ------------------------------------------------------------------------------------------------ leaf values
def leaf_to_typed(tc: Any, value: Any, *, entry: bool = False) -> Typed:
    """An IDL leaf value as a JMS value; ``entry`` for map/stream entries (which may be ``char``)."""
    kind = unalias(tc).kind()
    if kind == _K.tk_boolean:
        return Typed(JmsType.BOOLEAN, bool(value))
    if kind in _INT_JMS:
        number = int(value)
        if kind == _K.tk_ulonglong and number > JAVA_RANGES[JmsType.LONG][1]:
            return Typed(JmsType.STRING, str(number))
        return Typed(_INT_JMS[kind], number)
    if kind == _K.tk_float:
        return Typed(JmsType.FLOAT, float(value))
    if kind == _K.tk_double:
        return Typed(JmsType.DOUBLE, float(value))
    if kind in (_K.tk_char, _K.tk_wchar):
        return Typed(JmsType.CHAR if entry else JmsType.STRING, str(value))
    if kind in (_K.tk_string, _K.tk_wstring):
        return Typed(JmsType.STRING, str(value))
    if kind == _K.tk_enum:
        return Typed(JmsType.STRING, str(value._n))
    raise MappingError(f"IDL kind {kind} is not a leaf type", "type")


def new_typed(jtype: JmsType, value: bool | int | float | str | bytes) -> Typed:
    """``Typed(jtype, value)``, the same object, without the frozen dataclass's ``__init__`` (its two
    ``object.__setattr__`` calls are about half the cost of making one; issue 12, round 5: the NS -> JMS mapping
    makes several per event). ``tests/unit/test_mapping_caches.py`` pins equality, hash and repr."""
    made = _new(Typed)
    attrs = made.__dict__
    attrs["type"] = jtype
    attrs["value"] = value
    return made


_new = object.__new__


def leaf_converter(tc: Any) -> Callable[[Any], Typed]:
    """``lambda value: leaf_to_typed(tc, value)`` with the kind decided once (``entry`` False); its values are made
    by :func:`new_typed`."""
    kind = unalias(tc).kind()
    string = JmsType.STRING
    if kind == _K.tk_boolean:
        boolean = JmsType.BOOLEAN
        return lambda value: new_typed(boolean, bool(value))
    if kind == _K.tk_ulonglong:
        top, long_ = JAVA_RANGES[JmsType.LONG][1], JmsType.LONG

        def ulonglong(value: Any) -> Typed:
            number = int(value)
            return new_typed(string, str(number)) if number > top else new_typed(long_, number)
        return ulonglong
    if kind in _INT_JMS:
        jtype = _INT_JMS[kind]
        return lambda value: new_typed(jtype, int(value))
    if kind in (_K.tk_float, _K.tk_double):
        ftype = JmsType.FLOAT if kind == _K.tk_float else JmsType.DOUBLE
        return lambda value: new_typed(ftype, float(value))
    if kind in (_K.tk_char, _K.tk_wchar, _K.tk_string, _K.tk_wstring):
        return lambda value: new_typed(string, str(value))
    if kind == _K.tk_enum:
        return lambda value: new_typed(string, str(value._n))
    raise MappingError(f"IDL kind {kind} is not a leaf type", "type")


def typed_to_leaf(tc: Any, typed: Typed, field: str) -> Any:
    """The IDL value of leaf type ``tc`` carried by ``typed``; a String is parsed (it may have crossed STOMP)."""
    base = unalias(tc)
    kind = base.kind()
    raw = typed.value
    if kind == _K.tk_boolean:
        return _to_bool(raw, field)
    if kind in _INT_RANGES:
        return _to_int(raw, _INT_RANGES[kind], field)
    if kind in (_K.tk_float, _K.tk_double):
        return _to_float(raw, field)
    if kind in (_K.tk_char, _K.tk_wchar):
        if not isinstance(raw, str) or len(raw) != 1:
            raise MappingError(f"expected one character, got {raw!r}", field)
        return raw
    if kind in (_K.tk_string, _K.tk_wstring):
        if not isinstance(raw, str):
            raise MappingError(f"expected a string, got {type(raw).__name__}", field)
        return raw
    if kind == _K.tk_enum:
        return _to_enum(base, raw, field)
    raise MappingError(f"IDL kind {kind} is not a leaf type", field)


def _to_bool(raw: object, field: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if raw in ("true", "false"):
        return raw == "true"
    raise MappingError(f"expected a boolean, got {raw!r}", field)


def _to_int(raw: object, bounds: tuple[int, int], field: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise MappingError(f"expected an integer, got {raw!r}", field)
    try:
        number = int(raw)
    except ValueError:
        raise MappingError(f"expected an integer, got {raw!r}", field) from None
    if not bounds[0] <= number <= bounds[1]:
        raise MappingError(f"{number} is outside {bounds[0]}..{bounds[1]}", field)
    return number


def _to_float(raw: object, field: str) -> float:
    if isinstance(raw, float):
        return raw
    if isinstance(raw, str):
        return parse_java_float(raw, field)
    raise MappingError(f"expected a floating-point number, got {raw!r}", field)


def parse_java_float(text: str, field: str) -> float:
    """A float written by :func:`format_java_float` or by Java's ``Double.toString``."""
    special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
    if text in special:
        return special[text]
    try:
        return float(text)
    except ValueError:
        raise MappingError(f"not a floating-point number: {text!r}", field) from None


def format_java_float(value: float) -> str:
    """Shortest exact text of a double, with Java's spellings of the non-finite values."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def _to_enum(base: Any, raw: object, field: str) -> Any:
    for item in base._d[3]:
        if item._n == raw:
            return item
    raise MappingError(f"{raw!r} is not an enumerator of {base.id()}", field)


def float32(value: float) -> float:
    """``value`` rounded to an IDL/Java float (what CDR marshalling would do)."""
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


# ------------------------------------------------------------------------------------------------ structs
def flatten(tc: Any, value: Any) -> list[tuple[tuple[str, ...], Any, Any]]:
    """(member path, leaf TypeCode, leaf value) of a flattenable struct, in declaration order."""
    base = unalias(tc)
    out: list[tuple[tuple[str, ...], Any, Any]] = []
    for i in range(int(base.member_count())):
        name, mtc = str(base.member_name(i)), base.member_type(i)
        member = getattr(value, name)
        if is_leaf(mtc):
            out.append(((name,), mtc, member))
        else:
            out.extend(((name, *path), ltc, lval) for path, ltc, lval in flatten(mtc, member))
    return out


def leaf_paths(tc: Any) -> list[tuple[tuple[str, ...], Any]]:
    """(member path, leaf TypeCode) of a flattenable struct type, in the order :func:`flatten` produces."""
    base = unalias(tc)
    out: list[tuple[tuple[str, ...], Any]] = []
    for i in range(int(base.member_count())):
        name, mtc = str(base.member_name(i)), base.member_type(i)
        if is_leaf(mtc):
            out.append(((name,), mtc))
        else:
            out.extend(((name, *path), ltc) for path, ltc in leaf_paths(mtc))
    return out


def build_struct(tc: Any, leaves: Iterator[Any]) -> Any:
    """The struct value of type ``tc`` whose leaves, in :func:`leaf_paths` order, come from ``leaves``."""
    base = unalias(tc)
    members = []
    for i in range(int(base.member_count())):
        mtc = base.member_type(i)
        members.append(next(leaves) if is_leaf(mtc) else build_struct(mtc, leaves))
    return base._d[1](*members)


# ------------------------------------------------------------------------------------------------ descriptors
_DESCS: dict[Any, Any] = {}


def tc_to_desc(tc: Any) -> Any:
    """A deterministic JSON-able description of ``tc`` (see :func:`describe`); CDR base64 for exotic kinds. Computed
    once per type (:func:`type_cached`): the result is shared, callers must not change it."""
    return type_cached(_DESCS, tc, _tc_to_desc)


def _tc_to_desc(tc: Any) -> Any:
    try:
        return describe(tc, frozenset())
    except _Exotic:
        return "tc:" + base64.b64encode(_marshal(CORBA._tc_TypeCode, tc, "type")).decode("ascii")


class _Exotic(Exception):
    """A TypeCode :func:`describe` does not spell out (union, valuetype, objref, fixed, recursion, ...)."""


def describe(tc: Any, seen: frozenset[str]) -> Any:
    """``"long"``; ``["alias", id, name, inner]``; ``["struct", id, name, [[member, desc], ...]]``;
    ``["enum", id, name, [names]]``; ``["sequence", bound, inner]``; ``["array", length, inner]``;
    ``["string", bound]``; ``["wstring", bound]``."""
    for name, basic in _BASIC.items():
        if tc.kind() == basic.kind() and tc.equal(basic):
            return name
    kind = tc.kind()
    if kind == _K.tk_alias:
        return ["alias", str(tc.id()), str(tc.name()), describe(tc.content_type(), seen)]
    if kind == _K.tk_struct and str(tc.id()) not in seen:
        inner = seen | {str(tc.id())}
        members = [[str(tc.member_name(i)), describe(tc.member_type(i), inner)]
                   for i in range(int(tc.member_count()))]
        return ["struct", str(tc.id()), str(tc.name()), members]
    if kind == _K.tk_enum:
        return ["enum", str(tc.id()), str(tc.name()), [str(tc.member_name(i)) for i in range(int(tc.member_count()))]]
    if kind in (_K.tk_sequence, _K.tk_array):
        return [_KIND_WORD[kind], int(tc.length()), describe(tc.content_type(), seen)]
    if kind in (_K.tk_string, _K.tk_wstring):
        return [_KIND_WORD[kind], int(tc.length())]
    raise _Exotic(str(kind))


_KIND_WORD = {_K.tk_sequence: "sequence", _K.tk_array: "array", _K.tk_string: "string", _K.tk_wstring: "wstring"}


def desc_to_tc(desc: object, field: str, depth: int = 0) -> Any:
    """Inverse of :func:`tc_to_desc`; a descriptor nested deeper than :data:`limits.MAX_TYPE_DEPTH` is refused."""
    if depth > limits.MAX_TYPE_DEPTH:
        raise MappingError(f"type descriptor nested deeper than {limits.MAX_TYPE_DEPTH} levels", field)
    if isinstance(desc, str) and desc in _BASIC:
        return _BASIC[desc]
    if isinstance(desc, str) and desc.startswith("tc:"):
        tc = limits.unmarshal(CORBA._tc_TypeCode, _b64(desc[3:], field), field)
        if limits.value_depth(tc, limits.MAX_TYPE_DEPTH) > limits.MAX_TYPE_DEPTH:
            raise MappingError(f"TypeCode nested deeper than {limits.MAX_TYPE_DEPTH} levels", field)
        return tc
    if isinstance(desc, list) and desc:
        try:
            return _build_tc(desc, field, depth + 1)
        except (TypeError, ValueError, IndexError, OverflowError, CORBA.SystemException) as exc:
            raise MappingError(f"malformed type descriptor: {exc}", field) from exc
    raise MappingError(f"unknown type descriptor {_short(desc)}", field)


def _short(value: object) -> str:
    """A bounded, non-recursive rendering of a hostile value for an error message."""
    if isinstance(value, (list, dict)):
        return f"<{type(value).__name__} of {len(value)}>"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _enum_tc(repo_id: str, name: str, members: list[str]) -> Any:
    """The enum TypeCode: the stubs' own when registered, else a new one (tcInternal.createEnumTC's items lack
    the ``_parent_id`` that EnumItem comparison needs, so the items are made here)."""
    known = omniORB.findType(repo_id)
    if known is not None and known[0] == tcInternal.tv_enum and [str(i) for i in known[3]] == members:
        return tcInternal.createTypeCode(known)
    items = []
    for value, member in enumerate(members):
        item = omniORB.EnumItem(member, value)
        item._parent_id = repo_id
        items.append(item)
    return tcInternal.createTypeCode((tcInternal.tv_enum, repo_id, name, tuple(items)))


def _build_tc(desc: list[Any], field: str, depth: int) -> Any:
    word = desc[0]
    if word == "alias":
        return tcInternal.createAliasTC(_text(desc[1]), _text(desc[2]), desc_to_tc(desc[3], field, depth))
    if word == "struct":
        members = [CORBA.StructMember(_text(m), desc_to_tc(d, field, depth), None) for m, d in desc[3]]
        return tcInternal.createStructTC(_text(desc[1]), _text(desc[2]), members)
    if word == "enum":
        if not isinstance(desc[3], list):
            raise TypeError("enum members are not a list")
        return _enum_tc(_text(desc[1]), _text(desc[2]), [_text(m) for m in desc[3]])
    if word == "sequence":
        return tcInternal.createSequenceTC(_bound(desc[1]), desc_to_tc(desc[2], field, depth))
    if word == "array":
        return tcInternal.createArrayTC(_bound(desc[1]), desc_to_tc(desc[2], field, depth))
    if word == "string":
        return tcInternal.createStringTC(_bound(desc[1]))
    if word == "wstring":
        return tcInternal.createWStringTC(_bound(desc[1]))
    raise MappingError(f"unknown type descriptor {_short(desc)}", field)


def _text(value: object) -> str:
    if not isinstance(value, str) or "\0" in value:
        raise TypeError(f"expected a name, got {_short(value)}")
    return value


def _bound(value: object) -> int:
    """A sequence/array/string bound: an integer 0..2**32-1 (CDR ``unsigned long``)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"bound {_short(value)} is not 0..2**32-1")
    return value


def any_to_cdr(value: Any, field: str) -> bytes:
    """CDR encapsulation of an Any (its TypeCode included); what a Java client reads with ``AnyHelper``."""
    return _marshal(CORBA.TC_any, value, field)


def cdr_to_any(data: bytes, field: str) -> Any:
    """The Any in an untrusted CDR encapsulation (size- and depth-bounded, see :mod:`router.mapping.limits`)."""
    return limits.unmarshal(CORBA.TC_any, data, field)


def _b64(text: str, field: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise MappingError("invalid base64", field) from None


def _marshal(tc: Any, value: Any, field: str) -> bytes:
    try:
        return bytes(omniORB.cdrMarshal(tc, value))
    except (CORBA.SystemException, TypeError, ValueError) as exc:
        raise MappingError(f"cannot CDR-encode the value: {exc}", field) from exc
