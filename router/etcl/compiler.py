"""Compilation of ETCL syntax trees into nested Python closures (no ``eval``/``exec``/code generation).

``compile_tree(tree)`` turns the parser's AST into one function ``run(state) -> Operand`` with the exact
semantics of the tree-walking reference evaluator (:mod:`evaluator`): it returns the same operand or
raises the same class of error (EvaluationError, or one of the malformed-value exceptions that
``Constraint`` turns into FALSE) for every event. What is done once at compile time instead of per event:

- dispatch on node types and operators (each node becomes a closure bound to its operator function);
- constant folding: a subexpression made only of literals is evaluated once; if that fails, the closure
  raises the same error when (and only when) the reference evaluator would evaluate it, so short-circuit
  order is kept (``TRUE or 1/0 == 0`` is TRUE, ``$x == 1 and 1/0 == 0`` is FALSE);
  constant operands of ``and``/``or`` that cannot decide the result are dropped, and nothing after a
  deciding constant is compiled;
- component paths: the order of ``$name`` lookups (NS 2.4.5) is resolved per name, steps become bound
  functions, and type information comes from :mod:`fastnav`'s per-type cache;
- per event (``State``): a ``$name`` used more than once is resolved once, and the two name-value lists
  (``variable_header``, ``filterable_data``) are located once.

Tree height is bounded by the parser (MAX_DEPTH), so neither compiling nor running recurses deeper than
about twice that; flat ``and``/``or``/``+`` chains are loops.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from omniORB import CORBA

from . import fastnav as fn
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
from .evaluator import _HEADER_PATHS, _NV_LISTS, _TYPED_HEADER, TYPED, current_utc_time
from .operands import EnumName, Num, Operand, arith, compare, contains, require_bool, substring

__all__ = ["MALFORMED", "State", "compile_tree"]

# Values that break their TypeCode (possible only for locally built events) fail like bad operands.
MALFORMED = (AttributeError, TypeError, ValueError, LookupError, ArithmeticError, CORBA.Exception)

Run = Callable[["State"], Operand]
Step = Callable[[Any, fn.TypeInfo], fn.Located]


class State:
    """One evaluation: the event, how it arrived, ``$curtime`` and the per-event caches."""

    __slots__ = ("form", "info", "lists", "now", "value", "variables")

    def __init__(self, value: Any, info: fn.TypeInfo, form: str, now: int | None) -> None:
        self.value = value
        self.info = info
        self.form = form
        self.now = now
        self.variables: dict[tuple[str, bool], fn.Located] | None = None
        self.lists: list[fn.Located | None] | None = None


# --- constants ------------------------------------------------------------------------------------

class _Const:
    """A folded subexpression: its value, or the error evaluating it gives."""

    __slots__ = ("error", "value")

    def __init__(self, value: Operand = False, error: str | None = None) -> None:  # value unused with an error
        self.value = value
        self.error = error


def _fold(compute: Callable[..., Operand], *args: Any) -> _Const | None:
    """Evaluate a constant subexpression, ``compute(*args)``, now; None if it fails in an unexpected way
    (left to run time)."""
    try:
        return _Const(compute(*args))
    except EvaluationError as exc:
        return _Const(error=str(exc) or "evaluation error")
    except MALFORMED as exc:
        return _Const(error=f"{type(exc).__name__}: {exc}")
    except Exception:  # noqa: BLE001  (not foldable; evaluated, and raised, at run time)
        return None


def _negate(x: Operand) -> Operand:
    return not require_bool(x, "'not'")


def _const_run(c: _Const) -> Run:
    if c.error is not None:
        message = c.error

        def fail(state: State) -> Operand:
            raise EvaluationError(message)

        return fail
    value = c.value
    return lambda state: value


class _Compiled:
    """A compiled subexpression: ``run``, and ``const`` when it is a literal-only expression."""

    __slots__ = ("const", "run")

    def __init__(self, run: Run, const: _Const | None = None) -> None:
        self.run = run
        self.const = const


def _constant(c: _Const) -> _Compiled:
    return _Compiled(_const_run(c), c)


# --- components -----------------------------------------------------------------------------------

def _curtime(state: State) -> fn.Located:
    import TimeBase  # COS stub, importable once omniORB is imported

    if state.now is None:
        state.now = current_utc_time()
    return TimeBase.UtcT(state.now, 0, 0, 0), _utct_info()


_UTCT: list[fn.TypeInfo] = []


def _utct_info() -> fn.TypeInfo:
    if not _UTCT:
        import TimeBase

        _UTCT.append(fn.info_for(TimeBase._tc_UtcT))
    return _UTCT[0]


def _try_members(v: Any, info: fn.TypeInfo, names: tuple[str, ...]) -> fn.Located | None:
    try:
        for name in names:
            v, info = fn.member(v, info, name)
    except EvaluationError:
        return None
    return v, info


def _nv_list(state: State, i: int) -> fn.Located | None:
    """The event's i-th name-value list searched for ``$name`` (``_NV_LISTS``), or None; located once
    per event, and only when the lookup gets that far (as in the reference evaluator)."""
    lists = state.lists
    if lists is None:
        lists = state.lists = [_UNSET] * len(_NV_LISTS)
    found = lists[i]
    if found is _UNSET:
        found = _try_members(state.value, state.info, _NV_LISTS[i])
        if found is not None and not fn.is_nv_list(*found):
            found = None
        lists[i] = found
    return found


_UNSET: Any = object()
_LIST_INDEXES = tuple(range(len(_NV_LISTS)))


def _header_variable(name: str) -> Callable[[State], fn.Located]:
    path = _HEADER_PATHS[name]
    typed = (_TYPED_HEADER[name], fn.STRING)
    message = f"event has no ${name}"

    def lookup(state: State) -> fn.Located:
        if state.form == TYPED:
            return typed
        found = _try_members(state.value, state.info, path)
        if found is None:
            raise EvaluationError(message)
        return found

    return lookup


def _named_variable(name: str) -> Callable[[State], fn.Located]:
    folded = name.casefold()
    message = f"event has no ${name}"

    def lookup(state: State) -> fn.Located:
        for i in _LIST_INDEXES:
            nv = _nv_list(state, i)
            if nv is not None:
                found = fn.nv_find(nv[0], nv[1], name, folded)
                if found is not None:
                    return found
        v, info = state.value, state.info
        if fn.is_nv_list(v, info):
            found = fn.nv_find(v, info, name, folded)
            if found is None:
                raise EvaluationError(message)
            return found
        return fn.member(v, info, name)

    return lookup


def _variable(name: str, escaped: bool, shared: bool) -> Callable[[State], fn.Located]:
    """``$name`` in the lookup order of NS 2.4.5; ``shared`` caches the result for this event."""
    if name == "curtime" and not escaped:
        return _curtime  # the time is fixed per event already
    lookup = _header_variable(name) if name in _HEADER_PATHS else _named_variable(name)
    if not shared:
        return lookup
    key = (name, escaped)

    def cached(state: State) -> fn.Located:
        variables = state.variables
        if variables is None:
            variables = state.variables = {}
        else:
            found = variables.get(key)
            if found is not None:
                return found
        found = variables[key] = lookup(state)
        return found

    return cached


def _step(step: Any, exact_labels: bool) -> Step:
    if isinstance(step, Member):
        name = step.name
        return lambda v, info: fn.member(v, info, name)
    if isinstance(step, Position):
        i = step.index
        return lambda v, info: fn.position(v, info, i)
    if isinstance(step, UnionLabel):
        label = step.label
        return lambda v, info: fn.union_label(v, info, label, exact_labels)
    if isinstance(step, Index):
        i = step.index
        return lambda v, info: fn.index(v, info, i)
    if isinstance(step, Assoc):
        name = step.name
        return lambda v, info: fn.assoc(v, info, name)
    if isinstance(step, Implicit):
        name = step.name
        return lambda v, info: fn.implicit(v, info, name)
    raise TypeError(f"unknown path step {step!r}")


def _root(state: State) -> fn.Located:
    return state.value, state.info


class _Compiler:
    def __init__(self, tree: Expr) -> None:
        self.var_uses: dict[tuple[str, bool], int] = {}
        self._count_vars(tree)

    # Variables used more than once are cached per event; count them (iteratively: long flat chains).
    def _count_vars(self, tree: Expr) -> None:
        todo: list[Any] = [tree]
        while todo:
            e = todo.pop()
            if isinstance(e, (Component, Exist, Default)):
                if e.path.var is not None:
                    key = (e.path.var, e.path.escaped)
                    self.var_uses[key] = self.var_uses.get(key, 0) + 1
            elif isinstance(e, Not):
                todo.append(e.operand)
            elif isinstance(e, BoolOp):
                todo.extend(e.operands)
            elif isinstance(e, (Compare, In, Substr)):
                todo.extend((e.left, e.right))
            elif isinstance(e, Arith):
                todo.append(e.first)
                todo.extend(operand for _, operand in e.rest)

    def locate(self, path: Path, exact_labels: bool = False) -> Callable[[State], fn.Located]:
        """A function giving the (value, info) a path designates; EvaluationError if it does not exist."""
        start: Callable[[State], fn.Located]
        if path.var is None:
            start = _root
        else:
            key = (path.var, path.escaped)
            start = _variable(path.var, path.escaped, self.var_uses.get(key, 0) > 1)
        steps = tuple(_step(s, exact_labels) for s in path.steps)
        if not steps:
            return start
        if len(steps) == 1:
            (only,) = steps

            def one(state: State) -> fn.Located:
                return only(*start(state))

            return one
        if len(steps) == 2:
            first, second = steps

            def two(state: State) -> fn.Located:
                return second(*first(*start(state)))

            return two

        def many(state: State) -> fn.Located:
            v, info = start(state)
            for step in steps:
                v, info = step(v, info)
            return v, info

        return many

    # --- expressions ---

    def compile(self, e: Expr) -> _Compiled:
        method = _DISPATCH[type(e)]
        return method(self, e)

    def bool_lit(self, e: BoolLit) -> _Compiled:
        return _constant(_Const(e.value))

    def num_lit(self, e: NumLit) -> _Compiled:
        kind = "double" if isinstance(e.value, float) else "long"
        return _constant(_Const(Num(e.value, kind, True)))

    def str_lit(self, e: StrLit) -> _Compiled:
        return _constant(_Const(e.value))

    def enum_ident(self, e: EnumIdent) -> _Compiled:
        return _constant(_Const(EnumName(e.name)))

    def component(self, e: Component) -> _Compiled:
        locate = self.locate(e.path)
        to_operand = fn.to_operand
        return _Compiled(lambda state: to_operand(*locate(state)))

    def exist(self, e: Exist) -> _Compiled:
        locate = self.locate(e.path, exact_labels=True)

        def run(state: State) -> Operand:
            try:
                locate(state)
            except EvaluationError:
                return False
            return True

        return _Compiled(run)

    def default(self, e: Default) -> _Compiled:
        steps = e.path.steps
        if steps and steps[-1] == Implicit("_d"):
            steps = steps[:-1]
        locate = self.locate(Path(e.path.var, e.path.escaped, steps))
        active = fn.union_default_active
        return _Compiled(lambda state: active(*locate(state)))

    def not_(self, e: Not) -> _Compiled:
        inner = self.compile(e.operand)
        if inner.const is not None:
            c = inner.const
            if c.error is not None:
                return _constant(c)
            folded = _fold(_negate, c.value)
            if folded is not None:
                return _constant(folded)
        run = inner.run

        def negate(state: State) -> Operand:
            x = run(state)
            if x is True:
                return False
            if x is False:
                return True
            return not require_bool(x, "'not'")

        return _Compiled(negate)

    def bool_op(self, e: BoolOp) -> _Compiled:
        stop = e.op == "or"  # the value that decides the result
        what = f"'{e.op}'"
        runs: list[Run] = []
        ended: _Const | None = None  # a constant operand that ends the evaluation (result or error)
        for operand in e.operands:
            c = self.compile(operand)
            if c.const is None:
                runs.append(c.run)
                continue
            k = c.const
            if k.error is None:
                if k.value is stop:
                    ended = k
                    break
                if k.value is (not stop):
                    continue  # a constant that does not decide: require_bool passes, evaluation goes on
                ended = _fold(require_bool, k.value, what) or _Const(error=f"{what} needs a boolean")
                break
            ended = k
            break
        tail = _const_run(ended) if ended is not None else None
        if not runs:
            return _constant(ended if ended is not None else _Const(not stop))
        operands = tuple(runs)
        if len(operands) == 1 and tail is None:
            (only,) = operands

            def single(state: State) -> Operand:
                x = only(state)
                if x is True or x is False:
                    return x
                return require_bool(x, what)

            return _Compiled(single)
        if len(operands) == 2 and tail is None:
            first, second = operands

            def pair(state: State) -> Operand:
                x = first(state)
                if x is not stop:
                    if x is not (not stop):
                        require_bool(x, what)
                    x = second(state)
                    if x is not stop and x is not (not stop):
                        require_bool(x, what)
                return x

            return _Compiled(pair)
        result = not stop

        def chain(state: State) -> Operand:
            for run in operands:
                x = run(state)
                if x is stop:
                    return stop
                if x is not result:
                    require_bool(x, what)
            if tail is not None:
                return tail(state)
            return result

        return _Compiled(chain)

    def compare(self, e: Compare) -> _Compiled:
        op = e.op
        left, right = self.compile(e.left), self.compile(e.right)
        lc, rc = left.const, right.const
        if lc is not None and rc is not None:
            if lc.error is not None or rc.error is not None:  # left is evaluated first
                return _constant(lc if lc.error is not None else rc)
            folded = _fold(compare, op, lc.value, rc.value)
            if folded is not None:
                return _constant(folded)
        lrun, rrun = left.run, right.run
        opf = _OPERATORS[op]
        if rc is not None and rc.error is None and lc is None:
            r = rc.value
            if type(r) is str:
                def cmp_str(state: State) -> Operand:
                    x = lrun(state)
                    if type(x) is str:
                        return opf(x, r)
                    return compare(op, x, r)

                return _Compiled(cmp_str)
            if type(r) is Num:
                rv = r.value

                def cmp_num(state: State) -> Operand:
                    x = lrun(state)
                    if type(x) is Num:
                        return opf(x.value, rv)
                    return compare(op, x, r)

                return _Compiled(cmp_num)
        return _Compiled(lambda state: compare(op, lrun(state), rrun(state)))

    def in_(self, e: In) -> _Compiled:
        return self._binary(e, contains)

    def substr(self, e: Substr) -> _Compiled:
        return self._binary(e, substring)

    def _binary(self, e: In | Substr, function: Callable[[Operand, Operand], Operand]) -> _Compiled:
        left, right = self.compile(e.left), self.compile(e.right)
        lc, rc = left.const, right.const
        if lc is not None and rc is not None:
            if lc.error is not None or rc.error is not None:
                return _constant(lc if lc.error is not None else rc)
            folded = _fold(function, lc.value, rc.value)
            if folded is not None:
                return _constant(folded)
        lrun, rrun = left.run, right.run
        if function is substring and lc is not None and lc.error is None and type(lc.value) is str:
            needle = lc.value

            def contained(state: State) -> Operand:
                x = rrun(state)
                if type(x) is str:
                    return needle in x
                return substring(needle, x)

            return _Compiled(contained)
        return _Compiled(lambda state: function(lrun(state), rrun(state)))

    def arith(self, e: Arith) -> _Compiled:
        acc = self.compile(e.first)
        rest = [(op, self.compile(operand)) for op, operand in e.rest]
        # fold the constant prefix (left to right, as evaluated)
        while rest:
            ac = acc.const
            if ac is None or ac.error is not None:
                break
            op, c = rest[0]
            cc = c.const
            if cc is None:
                break
            if cc.error is not None:
                acc = _constant(cc)
            else:
                folded = _fold(arith, op, ac.value, cc.value)
                if folded is None:
                    break
                acc = _constant(folded)
            rest.pop(0)
        if not rest:
            return acc
        first = acc.run
        ops = tuple((op, c.run) for op, c in rest)
        if len(ops) == 1:
            ((op, second),) = ops
            return _Compiled(lambda state: arith(op, first(state), second(state)))

        def chain(state: State) -> Operand:
            value = first(state)
            for op, run in ops:
                value = arith(op, value, run(state))
            return value

        return _Compiled(chain)


_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
    ">=": operator.ge,
}

_DISPATCH: dict[type, Callable[[_Compiler, Any], _Compiled]] = {
    BoolLit: _Compiler.bool_lit, NumLit: _Compiler.num_lit, StrLit: _Compiler.str_lit,
    EnumIdent: _Compiler.enum_ident, Component: _Compiler.component, Exist: _Compiler.exist,
    Default: _Compiler.default, Not: _Compiler.not_, BoolOp: _Compiler.bool_op, Compare: _Compiler.compare,
    In: _Compiler.in_, Substr: _Compiler.substr, Arith: _Compiler.arith,
}


def compile_tree(tree: Expr) -> tuple[Run, bool | None]:
    """``(run, constant)``: ``constant`` is the match result when it does not depend on the event
    (the whole constraint folded), else None and ``run(state)`` gives the operand."""
    compiled = _Compiler(tree).compile(tree)
    c = compiled.const
    if c is not None:
        return compiled.run, (c.error is None and c.value is True)
    return compiled.run, None
