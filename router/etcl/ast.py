"""Abstract syntax tree of an ETCL constraint (NS 2.4, Trader App. B).

The parser builds these frozen nodes; the evaluator walks them. ``depth`` is the height of the subtree
(a leaf is 1); the parser uses it to bound evaluation recursion. Chains of the same associative
operator (``a or b or c``, ``a + b - c``) are flattened into one n-ary node, so a long chain does not
make a deep tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "IMPLICIT_MEMBERS",
    "Arith",
    "Assoc",
    "BoolLit",
    "BoolOp",
    "Compare",
    "Component",
    "Default",
    "EnumIdent",
    "Exist",
    "Expr",
    "Implicit",
    "In",
    "Index",
    "LabelIdent",
    "Member",
    "Not",
    "NumLit",
    "Path",
    "Position",
    "Step",
    "StrLit",
    "Substr",
    "UnionLabel",
]

IMPLICIT_MEMBERS = ("_length", "_d", "_type_id", "_repos_id")


# --- component path steps -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Member:
    """``.name``: struct, exception or union member by name."""

    name: str


@dataclass(frozen=True, slots=True)
class Position:
    """``.3``: struct member by 0-based position (NS 2.4.6)."""

    index: int


@dataclass(frozen=True, slots=True)
class LabelIdent:
    """An identifier written as a union case label, ``.(CAR)``: an enumerator of the discriminator."""

    name: str


@dataclass(frozen=True, slots=True)
class UnionLabel:
    """``.(5)``, ``.('x')``, ``.(CAR)``, ``.(TRUE)``, ``.()``: union member by case label (NS 2.4.2,
    2.4.6); ``None`` is the default arm. A ``bool`` label is TRUE / FALSE (``bool`` is an ``int``
    subclass, so compare ``type(label)`` where the difference matters)."""

    label: int | str | LabelIdent | None


@dataclass(frozen=True, slots=True)
class Index:
    """``[2]``: array or sequence element."""

    index: int


@dataclass(frozen=True, slots=True)
class Assoc:
    """``(name)``: value of the entry called ``name`` in a name-value pair list (NS 2.4.4)."""

    name: str


@dataclass(frozen=True, slots=True)
class Implicit:
    """``._length``, ``._d``, ``._type_id`` or ``._repos_id`` (always the last step)."""

    name: str


Step = Member | Position | UnionLabel | Index | Assoc | Implicit


@dataclass(frozen=True, slots=True)
class Path:
    """A ``$`` component: the event itself (``var is None``) or a run-time variable, then steps."""

    var: str | None
    escaped: bool
    steps: tuple[Step, ...]
    position: int = field(default=0, compare=False)


# --- expressions ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class BoolLit:
    value: bool
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class NumLit:
    """A numeric constant: weak Long (int) or weak Double (float) (NS 2.4.3)."""

    value: int | float
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class StrLit:
    value: str
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class EnumIdent:
    """A bare identifier, which in a filter names an enum value (e.g. ``HOUSE``)."""

    name: str
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class Component:
    path: Path
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class Exist:
    path: Path
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class Default:
    path: Path
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class Not:
    operand: Expr
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class BoolOp:
    """``and`` / ``or`` over two or more operands, evaluated left to right with short-circuit."""

    op: str
    operands: tuple[Expr, ...]
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class Compare:
    op: str
    left: Expr
    right: Expr
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class In:
    left: Expr
    right: Expr
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class Substr:
    """``left ~ right``: left is contained in right (NS 2.4.1)."""

    left: Expr
    right: Expr
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class Arith:
    """``first op1 x1 op2 x2 ...`` for one precedence group (``+ -`` or ``* /``), folded left."""

    first: Expr
    rest: tuple[tuple[str, Expr], ...]
    depth: int = field(default=1, compare=False)


Expr = (BoolLit | NumLit | StrLit | EnumIdent | Component | Exist | Default | Not | BoolOp | Compare | In
        | Substr | Arith)
