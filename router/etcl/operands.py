"""Run-time operand values and the ETCL operators on them (NS 2.4.3, digest §9.3-9.4).

Operands are plain Python ``bool`` and ``str`` (a 1-character string is also a *char*, which is
numeric), ``Num`` (a number with its CORBA type and weak/strong attribute), ``EnumValue`` (an enum
member read from an event), ``EnumName`` (a bare identifier from the constraint) and ``SeqValue``
(an array or sequence read from an event). Every operator raises EvaluationError on operand types
the spec does not allow; the constraint's match result is then FALSE.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .errors import EvaluationError

__all__ = [
    "EnumName",
    "EnumValue",
    "Num",
    "Operand",
    "SeqValue",
    "arith",
    "compare",
    "contains",
    "require_bool",
    "substring",
    "weak_double",
    "weak_long",
]

_FLOAT_KINDS = ("longdouble", "double", "float")
_INT_RANK = {"octet": 1, "short": 2, "ushort": 2, "long": 3, "ulong": 3, "longlong": 4, "ulonglong": 4}
_UNSIGNED = frozenset({"octet", "ushort", "ulong", "ulonglong"})


@dataclass(frozen=True, slots=True)
class Num:
    """A number; ``kind`` is its CORBA type name, ``weak`` marks constants and booleans (NS 2.4.3)."""

    value: int | float
    kind: str
    weak: bool


@dataclass(frozen=True, slots=True)
class EnumValue:
    """An enum member taken from an event: its name, ordinal and the names of all members."""

    name: str
    ordinal: int
    members: tuple[str, ...]
    repo_id: str


@dataclass(frozen=True, slots=True)
class EnumName:
    """A bare identifier from the constraint, compared with enum values by name."""

    name: str


@dataclass(frozen=True, slots=True)
class SeqValue:
    """A sequence or array; ``items`` yields its elements as operands (converted lazily)."""

    length: int
    items: Callable[[], Iterator[Operand]]


Operand = bool | str | Num | EnumValue | EnumName | SeqValue


def weak_long(value: int) -> Num:
    return Num(value, "long", True)


def weak_double(value: float) -> Num:
    return Num(value, "double", True)


def _type_name(x: Operand) -> str:
    if isinstance(x, bool):
        return "boolean"
    if isinstance(x, str):
        return "string"
    if isinstance(x, Num):
        return x.kind
    return type(x).__name__


def require_bool(x: Operand, what: str) -> bool:
    """A boolean operand; a number is not a boolean (NS 2.4.3)."""
    if isinstance(x, bool):
        return x
    raise EvaluationError(f"{what} needs a boolean, not {_type_name(x)}")


def _as_num(x: Operand) -> Num | None:
    """The numeric view of an operand: numbers, booleans (weak Long 1/0) and chars."""
    if isinstance(x, Num):
        return x
    if isinstance(x, bool):
        return Num(int(x), "long", True)
    if isinstance(x, str) and len(x) == 1:
        return Num(ord(x), "long", True)
    return None


# --- arithmetic ---------------------------------------------------------------------------------

def _pick(a: Num, b: Num, kind: str) -> Num:
    """The result type ``kind`` with the weak attribute of the operand(s) that have that kind."""
    weak = all(x.weak for x in (a, b) if x.kind == kind) if kind in (a.kind, b.kind) else False
    return Num(0, kind, weak)


def _integer_result(a: Num, b: Num) -> Num:
    if a.weak != b.weak:
        return b if a.weak else a
    ra, rb = _INT_RANK.get(a.kind, 3), _INT_RANK.get(b.kind, 3)
    if ra != rb:
        return a if ra > rb else b
    return a if a.kind in _UNSIGNED else b


def _result_type(a: Num, b: Num) -> Num:
    """The conversion cascade of NS 2.4.3 (digest §9.4)."""
    kinds = (a.kind, b.kind)
    for kind in _FLOAT_KINDS:
        if kind in kinds:
            return _pick(a, b, kind)
    if "longlong" in kinds or "ulonglong" in kinds:
        unsigned = a.kind in _UNSIGNED and b.kind in _UNSIGNED
        return Num(0, "ulonglong" if unsigned else "longlong", a.weak and b.weak)
    chosen = _integer_result(a, b)
    return Num(0, chosen.kind, chosen.weak)


def _int_div(x: int, y: int) -> int:
    q = abs(x) // abs(y)
    return q if (x >= 0) == (y >= 0) else -q


def _apply(op: str, x: int | float, y: int | float, floating: bool) -> int | float:
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    if y == 0:
        raise EvaluationError("division by zero")
    if floating:
        return x / y
    return _int_div(int(x), int(y))


def arith(op: str, left: Operand, right: Operand) -> Num:
    """``left op right`` for op in + - * /, with the NS 2.4.3 conversions; integer division truncates."""
    a, b = _as_num(left), _as_num(right)
    if a is None or b is None:
        raise EvaluationError(f"'{op}' needs numbers, not {_type_name(left)} and {_type_name(right)}")
    result = _result_type(a, b)
    floating = result.kind in _FLOAT_KINDS
    x, y = (float(a.value), float(b.value)) if floating else (a.value, b.value)
    return Num(_apply(op, x, y, floating), result.kind, result.weak)


# --- comparison ---------------------------------------------------------------------------------

_ORDERED: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
    ">=": operator.ge,
}


def _ordered(op: str, x: str | bool | int | float, y: str | bool | int | float) -> bool:
    """``x op y`` for two values of one comparable kind (the callers check the kinds)."""
    return _ORDERED[op](x, y)


def _enum_ordinal(e: EnumValue, other: Operand) -> int | None:
    """The ordinal to compare ``e`` with, or None when ``other`` is not comparable with it."""
    if isinstance(other, EnumValue):
        return other.ordinal if other.repo_id == e.repo_id else None
    if isinstance(other, EnumName):
        return e.members.index(other.name) if other.name in e.members else None
    if isinstance(other, Num) and isinstance(other.value, int):
        return other.value  # positional notation: enum members are numbered from 0 (NS 2.4.6)
    return None


def _compare_enum(op: str, left: Operand, right: Operand) -> bool:
    if isinstance(left, EnumName) and isinstance(right, EnumName) and op in ("==", "!="):
        return _ordered(op, left.name, right.name)
    if isinstance(left, EnumValue):
        if isinstance(right, EnumName) and op in ("==", "!="):
            return _ordered(op, left.name, right.name)
        ordinal = _enum_ordinal(left, right)
        if ordinal is not None:
            return _ordered(op, left.ordinal, ordinal)
    elif isinstance(right, EnumValue):
        return _compare_enum(_MIRROR[op], right, left)
    raise EvaluationError(f"cannot compare {_type_name(left)} {op} {_type_name(right)}")


_MIRROR = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_ENUMS = (EnumValue, EnumName)


def compare(op: str, left: Operand, right: Operand) -> bool:
    """A comparison: both boolean, both numeric (incl. boolean and char), both string, or enums."""
    if isinstance(left, str) and isinstance(right, str):
        return _ordered(op, left, right)
    if isinstance(left, bool) and isinstance(right, bool):
        return _ordered(op, left, right)
    if isinstance(left, _ENUMS) or isinstance(right, _ENUMS):
        return _compare_enum(op, left, right)
    a, b = _as_num(left), _as_num(right)
    if a is None or b is None:
        raise EvaluationError(f"cannot compare {_type_name(left)} {op} {_type_name(right)}")
    return _ordered(op, a.value, b.value)


# --- in, ~ --------------------------------------------------------------------------------------

def contains(item: Operand, seq: Operand) -> bool:
    """``item in seq``: a simple operand in a sequence of the same type."""
    if not isinstance(seq, SeqValue):
        raise EvaluationError(f"'in' needs a sequence on its right, not {_type_name(seq)}")
    if isinstance(item, SeqValue):
        raise EvaluationError("'in' needs a simple value on its left")
    return any(compare("==", item, element) for element in seq.items())


def substring(left: Operand, right: Operand) -> bool:
    """``left ~ right``: left is contained in right; strings only."""
    if isinstance(left, str) and isinstance(right, str):
        return left in right
    raise EvaluationError(f"'~' needs strings, not {_type_name(left)} and {_type_name(right)}")
