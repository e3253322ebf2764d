"""Component navigation for compiled constraints, with the TypeCode work done once per type.

Same semantics as :mod:`navigate` (which stays the reference implementation used by the tree-walking
evaluator): every function here mirrors the function of the same name there, step for step, including
which exception is raised where. The difference is that a value travels with a ``TypeInfo`` instead of
a bare TypeCode: the ``TypeInfo`` holds what ``navigate`` asks the TypeCode again on every event
(un-aliased kind, member names, member types, union labels, element type, ...), computed lazily on first
use and memoised. A TypeCode's behaviour is a pure function of its omniORBpy descriptor, so infos are
shared by all TypeCodes with an equal (hashable) descriptor; the shared table is bounded.

A located value is a ``(value, info)`` pair; no ``Node`` objects are built.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import omniORB
from omniORB import CORBA

from . import navigate as nav
from .ast import LabelIdent
from .errors import EvaluationError
from .operands import EnumValue, Num, Operand, SeqValue

__all__ = [
    "Located",
    "TypeInfo",
    "assoc",
    "implicit",
    "index",
    "info_for",
    "is_nv_list",
    "member",
    "nv_find",
    "position",
    "skip_any",
    "to_operand",
    "union_default_active",
    "union_label",
]

Located = tuple[Any, "TypeInfo"]

_K = nav._K
_ANY = _K["any"]
_UNION = _K["union"]
_ULONGLONG = _K["ulonglong"]
_BOOLEAN = _K["boolean"]
_ENUM = _K["enum"]
_FIXED = _K["fixed"]
_STRUCTS = frozenset(nav._STRUCTS)
_SEQS = frozenset(nav._SEQS)
_STRINGS = frozenset(nav._STRINGS)
_NV_KEYS = frozenset((_K["string"], _K["wstring"]))
_NUMERIC = nav._NUMERIC
_MISSING = object()
_UTCT_ID = nav._UTCT_ID

_CACHE: dict[Any, TypeInfo] = {}
_CACHE_LIMIT = 4096
_ARMS_LIMIT = 256  # distinct written labels remembered per union type


class TypeInfo:
    """What navigation needs to know about one TypeCode (``tc``, possibly an alias)."""

    __slots__ = (
        "_arms",
        "_content",
        "_default",
        "_disc",
        "_enum",
        "_find",
        "_labels",
        "_mtypes",
        "_names",
        "_nv",
        "_nv_elem",
        "_repos_id",
        "_type_id",
        "_utct",
        "base",
        "is_any",
        "kind",
        "plans",
        "tc",
    )

    def __init__(self, tc: Any) -> None:
        self.tc = tc
        base = nav.unalias(tc)
        self.base = base
        self.kind = nav.kind_of(base)
        self.is_any = self.kind == _ANY
        self._names: list[str] | None = None
        self._find: dict[str, int | None] = {}
        self._mtypes: dict[int, TypeInfo] = {}
        self._content: TypeInfo | None = None
        self._labels: list[Any] | None = None
        self._default: int | None = None
        self._nv: bool | None = None
        self._type_id: str | EvaluationError | None = None  # None: not computed yet
        self._repos_id: str | EvaluationError | None = None
        self._enum: tuple[tuple[str, ...], str] | None = None
        self._utct: bool | None = None
        self._disc: TypeInfo | None = None
        self._nv_elem: tuple[str, str, TypeInfo] | None = None
        self._arms: dict[tuple[type, int | str | LabelIdent], int | None] = {}
        self.plans: dict[str, tuple[str, TypeInfo]] = {}  # struct member name -> (attribute, type)

    # -- structs, exceptions, unions --
    def names(self) -> list[str]:
        names = self._names
        if names is None:
            names = self._names = nav._member_names(self.base)
        return names

    def find(self, name: str) -> int | None:
        try:
            return self._find[name]
        except KeyError:
            i = self._find[name] = nav._find_member(self.names(), name)
            return i

    def member_info(self, i: int) -> TypeInfo:
        info = self._mtypes.get(i)
        if info is None:
            info = self._mtypes[i] = info_for(self.base.member_type(i))
        return info

    def member_count(self) -> int:
        return len(self.names())

    def default(self) -> int:
        d = self._default
        if d is None:
            d = self._default = int(self.base.default_index())
        return d

    def labels(self) -> list[Any]:
        """Label value of each union member (None at the default member, whose label is never read)."""
        labels = self._labels
        if labels is None:
            default = self.default()
            labels = self._labels = [None if i == default else nav._label_value(self.base, i)
                                     for i in range(int(self.base.member_count()))]
        return labels

    def arm_for(self, label: int | str | LabelIdent) -> int | None:
        """Index of the first non-default member whose case label is ``label`` (``navigate.label_matches``)."""
        key = (type(label), label)  # TRUE is not 1 here: the kind of label is part of the key
        try:
            return self._arms[key]
        except KeyError:
            pass
        wanted = nav.label_operand(label)
        disc_tc = self.base.discriminator_type()
        default = self.default()
        found = next((i for i, value in enumerate(self.labels())
                      if i != default and nav.label_matches(wanted, value, disc_tc)), None)
        if len(self._arms) >= _ARMS_LIMIT:
            self._arms.clear()
        self._arms[key] = found
        return found

    def disc_info(self) -> TypeInfo:
        d = self._disc
        if d is None:
            d = self._disc = info_for(self.base.discriminator_type())
        return d

    def is_utct(self) -> bool:
        u = self._utct
        if u is None:
            u = self._utct = self.kind in _STRUCTS and self.base.id() == _UTCT_ID
        return u

    def enum_meta(self) -> tuple[tuple[str, ...], str]:
        meta = self._enum
        if meta is None:
            meta = self._enum = (tuple(nav._member_names(self.base)), str(self.base.id()))
        return meta

    # -- sequences, arrays --
    def content(self) -> TypeInfo:
        c = self._content
        if c is None:
            c = self._content = info_for(self.base.content_type())
        return c

    def nv_list(self) -> bool:
        """``navigate.is_nv_list`` for a value of this (non-any) type."""
        nv = self._nv
        if nv is None:
            if self.kind not in _SEQS:
                nv = False
            else:
                element = nav.unalias(self.base.content_type())
                nv = (nav.kind_of(element) in _STRUCTS and int(element.member_count()) >= 2
                      and nav.kind_of(nav.unalias(element.member_type(0))) in _NV_KEYS)
            self._nv = nv
        return nv

    def nv_element(self) -> tuple[str, str, TypeInfo]:
        """(name of member 0, name of member 1, info of member 1) of the un-aliased element type."""
        e = self._nv_elem
        if e is None:
            element = nav.unalias(self.base.content_type())
            e = self._nv_elem = (str(element.member_name(0)), str(element.member_name(1)),
                                 info_for(element.member_type(1)))
        return e

    # -- implicit members (results or the error they give) --
    def type_id(self) -> str:
        t = self._type_id
        if t is None:
            try:
                t = nav._type_id(self.tc)
            except EvaluationError as exc:
                t = exc
            self._type_id = t
        if isinstance(t, EvaluationError):
            raise EvaluationError(str(t))
        return t

    def repos_id(self) -> str:
        r = self._repos_id
        if r is None:
            try:
                r = nav._repos_id(self.tc)
            except EvaluationError as exc:
                r = exc
            self._repos_id = r
        if isinstance(r, EvaluationError):
            raise EvaluationError(str(r))
        return r


def info_for(tc: Any) -> TypeInfo:
    """The (shared) TypeInfo of ``tc``."""
    key = getattr(tc, "_d", None)
    if key is None:
        return TypeInfo(tc)
    try:
        return _CACHE[key]
    except KeyError:
        pass
    except TypeError:  # a descriptor with a mutable part (recursive types): not shared
        return TypeInfo(tc)
    info = TypeInfo(tc)
    if len(_CACHE) >= _CACHE_LIMIT:
        _CACHE.clear()
    _CACHE[key] = info
    return info


STRING = info_for(CORBA.TC_string)
ULONG = info_for(CORBA.TC_ulong)


def skip_any(v: Any, info: TypeInfo) -> Located:
    while info.is_any:
        if not isinstance(v, CORBA.Any):
            raise EvaluationError("malformed any value")
        v, info = v.value(), info_for(v.typecode())
    return v, info


def _struct_member(v: Any, info: TypeInfo, i: int) -> Located:
    attr = info.names()[i]
    value = getattr(v, attr, _MISSING)
    if value is _MISSING:
        value = getattr(v, "_" + attr, _MISSING)
    if value is _MISSING:
        raise EvaluationError(f"struct value has no member {attr!r}")
    return value, info.member_info(i)


def _time_half(v: Any, info: TypeInfo, name: str) -> Located | None:
    k = info.kind
    if k in _STRUCTS and info.is_utct():
        t, _ = _struct_member(v, info, 0)
        return _time_half(t, _ULONGLONG_INFO, name)
    if k == _ULONGLONG and isinstance(v, int):
        return (v >> 32 if name == "high" else v & 0xFFFFFFFF), ULONG
    return None


_ULONGLONG_INFO = info_for(CORBA.TC_ulonglong)


def member(v: Any, info: TypeInfo, name: str) -> Located:
    plan = info.plans.get(name)
    if plan is not None:  # fast path: a struct member seen before (what _struct_member does)
        attr, child = plan
        value = getattr(v, attr, _MISSING)
        if value is _MISSING:
            value = getattr(v, "_" + attr, _MISSING)
            if value is _MISSING:
                raise EvaluationError(f"struct value has no member {attr!r}")
        return value, child
    if info.is_any:
        v, info = skip_any(v, info)
    k = info.kind
    if k == _UNION:
        i = info.find(name)
        if i is None:
            raise EvaluationError(f"union has no member {name!r}")
        return _active_member(v, info, i)
    if k in _STRUCTS:
        i = info.find(name)
        if i is not None:
            info.plans[name] = (info.names()[i], info.member_info(i))
            return _struct_member(v, info, i)
    if name in ("high", "low"):
        half = _time_half(v, info, name)
        if half is not None:
            return half
    raise EvaluationError(f"no member {name!r}")


def position(v: Any, info: TypeInfo, i: int) -> Located:
    if info.is_any:
        v, info = skip_any(v, info)
    if info.kind not in _STRUCTS or i >= int(info.base.member_count()):
        raise EvaluationError(f"no member at position {i}")
    return _struct_member(v, info, i)


def _active_index(v: Any, info: TypeInfo) -> int | None:
    disc = getattr(v, "_d", _MISSING)
    if disc is _MISSING:
        raise EvaluationError("malformed union value")
    default = info.default()
    for i, label in enumerate(info.labels()):
        if i != default and label == disc:
            return i
    return default if default >= 0 else None


def _active_member(v: Any, info: TypeInfo, i: int) -> Located:
    active = _active_index(v, info)
    names = info.names()
    if active is None or names[active] != names[i]:
        raise EvaluationError(f"union member {names[i]!r} is not active")
    return getattr(v, "_v", None), info.member_info(i)


def union_label(v: Any, info: TypeInfo, label: int | str | LabelIdent | None, exact: bool = False) -> Located:
    if info.is_any:
        v, info = skip_any(v, info)
    if info.kind != _UNION:
        raise EvaluationError("'.(label)' needs a union")
    default = info.default()
    if label is None:
        if default < 0:
            raise EvaluationError("union has no default member")
        return _active_member(v, info, default)
    i = info.arm_for(label)
    if i is None:
        raise EvaluationError(f"union has no case label {label!r}")
    if exact and _active_index(v, info) != i:
        raise EvaluationError(f"union discriminator is not {label!r}")
    return _active_member(v, info, i)


def union_default_active(v: Any, info: TypeInfo) -> bool:
    if info.is_any:
        v, info = skip_any(v, info)
    if info.kind != _UNION:
        raise EvaluationError("'default' needs a union")
    default = info.default()
    return default >= 0 and _active_index(v, info) == default


def _elements(v: Any) -> Any:
    if not isinstance(v, (list, tuple, bytes, str)):
        raise EvaluationError("malformed sequence value")
    return v


def index(v: Any, info: TypeInfo, i: int) -> Located:
    if info.is_any:
        v, info = skip_any(v, info)
    if info.kind not in _SEQS:
        raise EvaluationError("'[n]' needs an array or sequence")
    items = _elements(v)
    if i >= len(items):
        raise EvaluationError(f"index {i} out of range")
    return items[i], info.content()


def is_nv_list(v: Any, info: TypeInfo) -> bool:
    if info.is_any:
        v, info = skip_any(v, info)
    return info.nv_list()


def nv_find(v: Any, info: TypeInfo, name: str, folded: str | None) -> Located | None:
    """``nv_lookup(name) or nv_lookup(name, fold_case=True)`` in one pass (``folded`` is
    ``name.casefold()``, or None for an exact lookup only). Reads the same pairs in the same order."""
    if info.is_any:
        v, info = skip_any(v, info)
    key_attr, value_attr, value_info = info.nv_element()
    first_folded = None
    for pair in _elements(v):
        key = getattr(pair, key_attr, _MISSING)
        if key is _MISSING:
            key = getattr(pair, "_" + key_attr, _MISSING)
            if key is _MISSING:
                raise EvaluationError(f"struct value has no member {key_attr!r}")
        if isinstance(key, str):
            if key == name:
                return _pair_value(pair, value_attr, value_info)
            if folded is not None and first_folded is None and key.casefold() == folded:
                first_folded = pair
    if first_folded is not None:
        return _pair_value(first_folded, value_attr, value_info)
    return None


def _pair_value(pair: Any, attr: str, info: TypeInfo) -> Located:
    value = getattr(pair, attr, _MISSING)
    if value is _MISSING:
        value = getattr(pair, "_" + attr, _MISSING)
    if value is _MISSING:
        raise EvaluationError(f"struct value has no member {attr!r}")
    return value, info


def assoc(v: Any, info: TypeInfo, name: str) -> Located:
    if not is_nv_list(v, info):
        raise EvaluationError("'(name)' needs a name-value pair list")
    found = nv_find(v, info, name, None)
    if found is None:
        raise EvaluationError(f"no entry {name!r}")
    return found


def implicit(v: Any, info: TypeInfo, name: str) -> Located:
    if info.is_any:
        v, info = skip_any(v, info)
    k = info.kind
    if name == "_length":
        if k not in _SEQS:
            raise EvaluationError("_length needs an array or sequence")
        return len(_elements(v)), ULONG
    if name == "_d":
        if k != _UNION:
            raise EvaluationError("_d needs a union")
        return getattr(v, "_d", None), info.disc_info()
    if name == "_type_id":
        return info.type_id(), STRING
    return info.repos_id(), STRING


def _sequence(v: Any, info: TypeInfo) -> SeqValue:
    items = _elements(v)
    element = info.content()

    def operands() -> Iterator[Operand]:
        for item in items:
            yield to_operand(item, element)

    return SeqValue(len(items), operands)


def to_operand(v: Any, info: TypeInfo) -> Operand:
    if info.is_any:
        v, info = skip_any(v, info)
    k = info.kind
    numeric = _NUMERIC.get(k)
    if numeric is not None:
        if type(v) is int and numeric not in ("float", "double", "longdouble"):
            return Num(v, numeric, False)
        return nav._number(v, numeric)
    if k in _STRINGS:
        if not isinstance(v, str):
            raise EvaluationError("malformed string value")
        return v
    if k == _BOOLEAN:
        if not isinstance(v, (bool, int)):
            raise EvaluationError("malformed boolean value")
        return bool(v)
    if k == _ENUM:
        if not isinstance(v, omniORB.EnumItem):
            raise EvaluationError("malformed enum value")
        members, repo_id = info.enum_meta()
        return EnumValue(v._n, int(v._v), members, repo_id)
    if k in _SEQS:
        return _sequence(v, info)
    if k == _FIXED:
        return nav._number(v, "fixed")
    if k in _STRUCTS and info.is_utct():
        t, _ = _struct_member(v, info, 0)
        return nav._number(t, "ulonglong")
    raise EvaluationError(f"a {nav._type_id_or_kind(info.tc)} is not a simple value")
