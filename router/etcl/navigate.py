"""Walking ``$`` component paths over omniORBpy values (NS 2.4.2, 2.4.4, 2.4.6).

A ``Node`` pairs a Python value with its CORBA TypeCode (possibly an alias). Unnamed ``any`` layers
are skipped silently before every step and before a value is used (NS 2.4.2). Struct members are
matched by their IDL name; omniORBpy stores a member whose name clashes with a keyword with a leading
underscore, so ``in`` also finds ``_in``. Every failure (missing member, inactive union arm, index out
of range, wrong kind) raises EvaluationError.

Extension: ``.high`` / ``.low`` on a ``unsigned long long`` (TimeBase::TimeT) or on a
TimeBase::UtcT give the upper / lower 32 bits of the time, so the NS 2.4.7 example written against the
old ``{low, high}`` TimeT still evaluates. A UtcT used as an operand is its ``time`` value.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import omniORB
from omniORB import CORBA

from .ast import LabelIdent
from .errors import EvaluationError
from .operands import EnumName, EnumValue, Num, Operand, SeqValue, compare, weak_long

__all__ = [
    "Node",
    "assoc",
    "implicit",
    "index",
    "is_nv_list",
    "label_matches",
    "label_operand",
    "member",
    "nv_lookup",
    "position",
    "skip_any",
    "to_operand",
    "union_default_active",
    "union_label",
]

_K = {name: getattr(CORBA, f"tk_{name}")._v for name in (
    "null", "void", "short", "long", "ushort", "ulong", "float", "double", "boolean", "char", "octet",
    "any", "TypeCode", "objref", "struct", "union", "enum", "string", "sequence", "array", "alias",
    "except", "longlong", "ulonglong", "longdouble", "wchar", "wstring", "fixed")}

_NUMERIC = {_K[n]: n for n in ("short", "long", "ushort", "ulong", "float", "double", "octet",
                                "longlong", "ulonglong", "longdouble")}
_IDL_NAMES = {"short": "short", "long": "long", "ushort": "unsigned short", "ulong": "unsigned long",
              "float": "float", "double": "double", "boolean": "boolean", "char": "char",
              "octet": "octet", "any": "any", "TypeCode": "TypeCode", "string": "string",
              "longlong": "long long", "ulonglong": "unsigned long long",
              "longdouble": "long double", "wchar": "wchar", "wstring": "wstring"}
_IDL_NAME_BY_KIND = {_K[k]: v for k, v in _IDL_NAMES.items()}
_STRUCTS = (_K["struct"], _K["except"])
_SEQS = (_K["sequence"], _K["array"])
_STRINGS = (_K["string"], _K["wstring"], _K["char"], _K["wchar"])
_UTCT_ID = "IDL:omg.org/TimeBase/UtcT:1.0"


class Node:
    """A value with its TypeCode."""

    __slots__ = ("tc", "value")

    def __init__(self, value: Any, tc: Any) -> None:
        self.value = value
        self.tc = tc


def kind_of(tc: Any) -> int:
    return int(tc.kind()._v)


def unalias(tc: Any) -> Any:
    while kind_of(tc) == _K["alias"]:
        tc = tc.content_type()
    return tc


def skip_any(node: Node) -> Node:
    """Strip unnamed ``any`` layers; the returned node's tc may still be an alias of a non-any type."""
    while kind_of(unalias(node.tc)) == _K["any"]:
        inner = node.value
        if not isinstance(inner, CORBA.Any):
            raise EvaluationError("malformed any value")
        node = Node(inner.value(), inner.typecode())
    return node


def _base(node: Node) -> tuple[Node, Any, int]:
    node = skip_any(node)
    base = unalias(node.tc)
    return node, base, kind_of(base)


# --- structs ------------------------------------------------------------------------------------

def _member_names(tc: Any) -> list[str]:
    return [tc.member_name(i) for i in range(int(tc.member_count()))]


def _find_member(names: list[str], name: str) -> int | None:
    for candidate in (name, "_" + name):
        if candidate in names:
            return names.index(candidate)
    return None


def _struct_member(node: Node, base: Any, i: int) -> Node:
    attr = base.member_name(i)
    value = getattr(node.value, attr, _MISSING)
    if value is _MISSING:
        value = getattr(node.value, "_" + attr, _MISSING)
    if value is _MISSING:
        raise EvaluationError(f"struct value has no member {attr!r}")
    return Node(value, base.member_type(i))


_MISSING = object()


def _time_half(node: Node, base: Any, k: int, name: str) -> Node | None:
    """``.high`` / ``.low`` on a TimeT or UtcT (see the module docstring)."""
    if k in _STRUCTS and base.id() == _UTCT_ID:
        return _time_half(_struct_member(node, base, 0), CORBA.TC_ulonglong, _K["ulonglong"], name)
    if k == _K["ulonglong"] and isinstance(node.value, int):
        half = node.value >> 32 if name == "high" else node.value & 0xFFFFFFFF
        return Node(half, CORBA.TC_ulong)
    return None


def member(node: Node, name: str) -> Node:
    """``.name`` on a struct, exception or union (the union arm must be the active one)."""
    node, base, k = _base(node)
    if k == _K["union"]:
        return _union_member_by_name(node, base, name)
    if k in _STRUCTS:
        i = _find_member(_member_names(base), name)
        if i is not None:
            return _struct_member(node, base, i)
    if name in ("high", "low"):
        half = _time_half(node, base, k, name)
        if half is not None:
            return half
    raise EvaluationError(f"no member {name!r}")


def position(node: Node, i: int) -> Node:
    """``.3``: the struct member at 0-based position ``i``."""
    node, base, k = _base(node)
    if k not in _STRUCTS or i >= int(base.member_count()):
        raise EvaluationError(f"no member at position {i}")
    return _struct_member(node, base, i)


# --- unions -------------------------------------------------------------------------------------

def _label_value(base: Any, i: int) -> Any:
    return base.member_label(i).value()


def _active_index(node: Node, base: Any) -> int | None:
    disc = getattr(node.value, "_d", _MISSING)
    if disc is _MISSING:
        raise EvaluationError("malformed union value")
    default = int(base.default_index())
    for i in range(int(base.member_count())):
        if i != default and _label_value(base, i) == disc:
            return i
    return default if default >= 0 else None


def _active_member(node: Node, base: Any, i: int) -> Node:
    active = _active_index(node, base)
    if active is None or base.member_name(active) != base.member_name(i):
        raise EvaluationError(f"union member {base.member_name(i)!r} is not active")
    return Node(getattr(node.value, "_v", None), base.member_type(i))


def _union_member_by_name(node: Node, base: Any, name: str) -> Node:
    names = _member_names(base)
    i = _find_member(names, name)
    if i is None:
        raise EvaluationError(f"union has no member {name!r}")
    return _active_member(node, base, i)


def label_operand(label: int | str | LabelIdent) -> Operand:
    """The constant a written case label stands for, as the right operand of ``$._d == label``."""
    if isinstance(label, LabelIdent):
        return EnumName(label.name)
    if isinstance(label, (bool, str)):
        return label
    return weak_long(label)


def label_matches(wanted: Operand, value: Any, disc_tc: Any) -> bool:
    """Whether the case label ``value`` (read from the union's TypeCode, whose discriminator type is
    ``disc_tc``) is the written label ``wanted``: exactly when ``$._d == wanted`` would be TRUE with
    that discriminator, so an enumerator matches by name or ordinal, a char by character or code, a
    boolean as TRUE / FALSE or 1 / 0, an integer by value; other pairs never match."""
    try:
        return compare("==", to_operand(Node(value, disc_tc)), wanted)
    except EvaluationError:
        return False


def union_label(node: Node, label: int | str | LabelIdent | None, *, exact: bool = False) -> Node:
    """``.(label)``: the union arm for a case label, ``.()`` for the default arm (NS 2.4.2, 2.4.6).

    A label selects the arm of the case label ``x`` for which ``$._d == label`` would hold if the
    discriminator were ``x`` (see ``label_matches``); ``.(CAR)`` names an enumerator. Any label of a
    multi-label arm reaches it (``$.(0)`` reads arm ``case 0: case 2:`` when the discriminator is 2).
    A value that only the default arm covers is no case label: that arm is ``.()``. With ``exact``
    (used by ``exist``) the discriminator must select that very label, so ``exist $.(0)`` is
    ``$._d == 0`` (NS 2.4.6).
    """
    node, base, k = _base(node)
    if k != _K["union"]:
        raise EvaluationError("'.(label)' needs a union")
    default = int(base.default_index())
    if label is None:
        if default < 0:
            raise EvaluationError("union has no default member")
        return _active_member(node, base, default)
    wanted = label_operand(label)
    disc_tc = base.discriminator_type()
    for i in range(int(base.member_count())):
        if i != default and label_matches(wanted, _label_value(base, i), disc_tc):
            if exact and _active_index(node, base) != i:
                raise EvaluationError(f"union discriminator is not {label!r}")
            return _active_member(node, base, i)
    raise EvaluationError(f"union has no case label {label!r}")


def union_default_active(node: Node) -> bool:
    """``default``: TRUE when the union has a default arm and it is the active one (NS 2.4.3)."""
    node, base, k = _base(node)
    if k != _K["union"]:
        raise EvaluationError("'default' needs a union")
    default = int(base.default_index())
    return default >= 0 and _active_index(node, base) == default


# --- sequences and name-value lists -------------------------------------------------------------

def _elements(node: Node, base: Any) -> Any:
    value = node.value
    if not isinstance(value, (list, tuple, bytes, str)):
        raise EvaluationError("malformed sequence value")
    return value


def index(node: Node, i: int) -> Node:
    """``[i]``: element ``i`` (0-based) of an array or sequence."""
    node, base, k = _base(node)
    if k not in _SEQS:
        raise EvaluationError("'[n]' needs an array or sequence")
    items = _elements(node, base)
    if i >= len(items):
        raise EvaluationError(f"index {i} out of range")
    return Node(items[i], base.content_type())


def is_nv_list(node: Node) -> bool:
    """A sequence of structs whose first member is a string: a name-value pair list (NS 2.4.4)."""
    node, base, k = _base(node)
    if k not in _SEQS:
        return False
    element = unalias(base.content_type())
    return (kind_of(element) in _STRUCTS and int(element.member_count()) >= 2
            and kind_of(unalias(element.member_type(0))) in (_K["string"], _K["wstring"]))


def nv_lookup(node: Node, name: str, *, fold_case: bool = False) -> Node | None:
    """The value of the first pair called ``name``, or None; ``fold_case`` ignores letter case."""
    node, base, _ = _base(node)
    element_tc = unalias(base.content_type())
    wanted = name.casefold() if fold_case else name
    for pair in _elements(node, base):
        pair_node = Node(pair, element_tc)
        key = _struct_member(pair_node, element_tc, 0).value
        if isinstance(key, str) and (key.casefold() if fold_case else key) == wanted:
            return _struct_member(pair_node, element_tc, 1)
    return None


def assoc(node: Node, name: str) -> Node:
    """``(name)``: associative lookup in a name-value pair list."""
    if not is_nv_list(node):
        raise EvaluationError("'(name)' needs a name-value pair list")
    found = nv_lookup(node, name)
    if found is None:
        raise EvaluationError(f"no entry {name!r}")
    return found


# --- implicit members ---------------------------------------------------------------------------

def _type_id(base_or_alias: Any) -> str:
    k = kind_of(base_or_alias)
    if k in _IDL_NAME_BY_KIND:
        return _IDL_NAME_BY_KIND[k]
    try:
        name = base_or_alias.name()
    except Exception as exc:  # omniORB raises TypeCode.BadKind for anonymous kinds
        raise EvaluationError("_type_id is not available for this component") from exc
    if not name:
        raise EvaluationError("_type_id is not available for this component")
    return str(name)


def _repos_id(tc: Any) -> str:
    try:
        rid = tc.id()
    except Exception as exc:  # TypeCode.BadKind for basic and anonymous kinds
        raise EvaluationError("_repos_id is not available for this component") from exc
    if not rid or not str(rid).startswith("IDL:"):
        raise EvaluationError("_repos_id is not available for this component")
    return str(rid)


def implicit(node: Node, name: str) -> Node:
    """``._length``, ``._d``, ``._type_id``, ``._repos_id`` (NS 2.4.2)."""
    node, base, k = _base(node)
    if name == "_length":
        if k not in _SEQS:
            raise EvaluationError("_length needs an array or sequence")
        return Node(len(_elements(node, base)), CORBA.TC_ulong)
    if name == "_d":
        if k != _K["union"]:
            raise EvaluationError("_d needs a union")
        return Node(getattr(node.value, "_d", None), base.discriminator_type())
    if name == "_type_id":
        return Node(_type_id(node.tc), CORBA.TC_string)
    return Node(_repos_id(node.tc), CORBA.TC_string)


# --- conversion to operands ---------------------------------------------------------------------

def _number(value: Any, kind: str) -> Num:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if kind == "fixed" or hasattr(value, "precision"):
            return Num(float(value), "double", False)
        raise EvaluationError(f"malformed {kind} value")
    if kind in ("float", "double", "longdouble"):
        return Num(float(value), kind, False)
    if not isinstance(value, int):
        raise EvaluationError(f"malformed {kind} value")
    return Num(value, kind, False)


def _enum(value: Any, base: Any) -> EnumValue:
    if not isinstance(value, omniORB.EnumItem):
        raise EvaluationError("malformed enum value")
    return EnumValue(value._n, int(value._v), tuple(_member_names(base)), str(base.id()))


def _sequence(node: Node, base: Any) -> SeqValue:
    items = _elements(node, base)
    element_tc = base.content_type()

    def operands() -> Iterator[Operand]:
        for item in items:
            yield to_operand(Node(item, element_tc))

    return SeqValue(len(items), operands)


def to_operand(node: Node) -> Operand:
    """The operand a component stands for; structs, unions and other complex values are errors."""
    node, base, k = _base(node)
    value = node.value
    if k in _NUMERIC:
        return _number(value, _NUMERIC[k])
    if k == _K["boolean"]:
        if not isinstance(value, (bool, int)):
            raise EvaluationError("malformed boolean value")
        return bool(value)
    if k in _STRINGS:
        if not isinstance(value, str):
            raise EvaluationError("malformed string value")
        return value
    if k == _K["enum"]:
        return _enum(value, base)
    if k in _SEQS:
        return _sequence(node, base)
    if k == _K["fixed"]:
        return _number(value, "fixed")
    if k in _STRUCTS and base.id() == _UTCT_ID:
        return _number(_struct_member(node, base, 0).value, "ulonglong")
    raise EvaluationError(f"a {_type_id_or_kind(node.tc)} is not a simple value")


def _type_id_or_kind(tc: Any) -> str:
    try:
        return _type_id(tc)
    except EvaluationError:
        return "complex value"
