"""Tree-walking evaluator of ETCL syntax trees against one event (NS 2.4.2-2.4.5).

``Context`` holds the event as the root ``Node`` and how it arrived (structured, any or typed).
``evaluate`` returns an operand or raises EvaluationError; ``and``/``or`` short-circuit left to right
(NS 2.4.3), so ``FALSE and X`` and ``TRUE or X`` never evaluate X.

Run-time variables ``$name`` resolve in the order of NS 2.4.5: reserved ``curtime``; ``domain_name``,
``type_name``, ``event_name`` from the fixed header; an entry of ``$.header.variable_header``; an entry
of ``$.filterable_data``; otherwise ``$.name``, or ``$(name)`` when the event is a name-value list.
For the two property lists an exact name wins; failing that a case-insensitive match is taken, so the
spec's ``$priority`` finds the standard ``Priority`` header (documented deviation-by-extension).
A typed event is its property list; its fixed header is the Typed→Structured translation of NS 2.1.4
(``domain_name`` ``''``, ``type_name`` ``'%TYPED'``, ``event_name`` ``''``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from omniORB import CORBA

from . import navigate as nav
from .ast import (
    Arith,
    Assoc,
    BoolLit,
    BoolOp,
    Compare,
    Component,
    Default,
    EnumIdent,
    Exist,
    Expr,
    Implicit,
    In,
    Index,
    Member,
    Not,
    NumLit,
    Path,
    Position,
    StrLit,
    Substr,
    UnionLabel,
)
from .errors import EvaluationError
from .operands import EnumName, Operand, arith, compare, contains, require_bool, substring, weak_double, weak_long

__all__ = ["ANY", "STRUCTURED", "TYPED", "Context", "current_utc_time", "evaluate"]

STRUCTURED, ANY, TYPED = "structured", "any", "typed"

UUID_EPOCH_OFFSET = 0x01B21DD213814000
"""100 ns intervals from 1582-10-15 00:00 UTC (TimeBase epoch) to 1970-01-01 00:00 UTC."""

_HEADER_PATHS = {
    "domain_name": ("header", "fixed_header", "event_type", "domain_name"),
    "type_name": ("header", "fixed_header", "event_type", "type_name"),
    "event_name": ("header", "fixed_header", "event_name"),
}
_TYPED_HEADER = {"domain_name": "", "type_name": "%TYPED", "event_name": ""}
_NV_LISTS = (("header", "variable_header"), ("filterable_data",))


def current_utc_time() -> int:
    """Now as a TimeBase::TimeT: 100 ns units since 1582-10-15 00:00 UTC."""
    return time.time_ns() // 100 + UUID_EPOCH_OFFSET


class Context:
    """The event being matched and the value of ``$curtime``."""

    __slots__ = ("_now", "form", "root", "variables")

    def __init__(self, root: nav.Node, form: str, now: int | None) -> None:
        self.root = root
        self.form = form
        self._now = now
        self.variables: dict[tuple[str, bool], nav.Node] = {}  # resolved $names, for this event only

    def now(self) -> int:
        if self._now is None:
            self._now = current_utc_time()
        return self._now


# --- components ---------------------------------------------------------------------------------

def _curtime(ctx: Context) -> nav.Node:
    import TimeBase  # COS stub, importable once omniORB is imported

    return nav.Node(TimeBase.UtcT(ctx.now(), 0, 0, 0), TimeBase._tc_UtcT)


def _try_members(node: nav.Node, names: tuple[str, ...]) -> nav.Node | None:
    try:
        for name in names:
            node = nav.member(node, name)
    except EvaluationError:
        return None
    return node


def _lookup_in_lists(ctx: Context, name: str) -> nav.Node | None:
    for names in _NV_LISTS:
        nv = _try_members(ctx.root, names)
        if nv is not None and nav.is_nv_list(nv):
            found = nav.nv_lookup(nv, name) or nav.nv_lookup(nv, name, fold_case=True)
            if found is not None:
                return found
    return None


def _variable(ctx: Context, name: str, escaped: bool) -> nav.Node:
    if name == "curtime" and not escaped:
        return _curtime(ctx)
    if name in _HEADER_PATHS:
        if ctx.form == TYPED:
            return nav.Node(_TYPED_HEADER[name], CORBA.TC_string)
        found = _try_members(ctx.root, _HEADER_PATHS[name])
        if found is None:
            raise EvaluationError(f"event has no ${name}")
        return found
    found = _lookup_in_lists(ctx, name)
    if found is not None:
        return found
    if nav.is_nv_list(ctx.root):
        found = nav.nv_lookup(ctx.root, name) or nav.nv_lookup(ctx.root, name, fold_case=True)
        if found is None:
            raise EvaluationError(f"event has no ${name}")
        return found
    return nav.member(ctx.root, name)


def _cached_variable(ctx: Context, name: str, escaped: bool) -> nav.Node:
    key = (name, escaped)
    node = ctx.variables.get(key)
    if node is None:
        node = ctx.variables[key] = _variable(ctx, name, escaped)
    return node


_STEPS: dict[type, Callable[[nav.Node, Any], nav.Node]] = {
    Member: lambda n, s: nav.member(n, s.name),
    Position: lambda n, s: nav.position(n, s.index),
    UnionLabel: lambda n, s: nav.union_label(n, s.label),
    Index: lambda n, s: nav.index(n, s.index),
    Assoc: lambda n, s: nav.assoc(n, s.name),
    Implicit: lambda n, s: nav.implicit(n, s.name),
}


def resolve(path: Path, ctx: Context, *, exact_labels: bool = False) -> nav.Node:
    """The node a component path designates; EvaluationError if it does not exist."""
    node = ctx.root if path.var is None else _cached_variable(ctx, path.var, path.escaped)
    for step in path.steps:
        if exact_labels and isinstance(step, UnionLabel):
            node = nav.union_label(node, step.label, exact=True)
        else:
            node = _STEPS[type(step)](node, step)
    return node


# --- expressions --------------------------------------------------------------------------------

def _component(e: Component, ctx: Context) -> Operand:
    return nav.to_operand(resolve(e.path, ctx))


def _exist(e: Exist, ctx: Context) -> Operand:
    try:
        resolve(e.path, ctx, exact_labels=True)
    except EvaluationError:
        return False
    return True


def _default(e: Default, ctx: Context) -> Operand:
    steps = e.path.steps
    if steps and steps[-1] == Implicit("_d"):
        steps = steps[:-1]
    return nav.union_default_active(resolve(Path(e.path.var, e.path.escaped, steps), ctx))


def _not(e: Not, ctx: Context) -> Operand:
    return not require_bool(evaluate(e.operand, ctx), "'not'")


def _bool_op(e: BoolOp, ctx: Context) -> Operand:
    stop = e.op == "or"  # the value that decides the result
    for operand in e.operands:
        if require_bool(evaluate(operand, ctx), f"'{e.op}'") is stop:
            return stop
    return not stop


def _arith(e: Arith, ctx: Context) -> Operand:
    acc = evaluate(e.first, ctx)
    for op, operand in e.rest:
        acc = arith(op, acc, evaluate(operand, ctx))
    return acc


_EVAL: dict[type, Callable[[Any, Context], Operand]] = {
    BoolLit: lambda e, ctx: e.value,
    NumLit: lambda e, ctx: weak_double(e.value) if isinstance(e.value, float) else weak_long(e.value),
    StrLit: lambda e, ctx: e.value,
    EnumIdent: lambda e, ctx: EnumName(e.name),
    Component: _component,
    Exist: _exist,
    Default: _default,
    Not: _not,
    BoolOp: _bool_op,
    Compare: lambda e, ctx: compare(e.op, evaluate(e.left, ctx), evaluate(e.right, ctx)),
    In: lambda e, ctx: contains(evaluate(e.left, ctx), evaluate(e.right, ctx)),
    Substr: lambda e, ctx: substring(evaluate(e.left, ctx), evaluate(e.right, ctx)),
    Arith: _arith,
}


def evaluate(e: Expr, ctx: Context) -> Operand:
    """The value of expression ``e`` for the event in ``ctx``."""
    return _EVAL[type(e)](e, ctx)
