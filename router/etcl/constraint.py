"""Compiled ETCL constraints and their match operations (NS 2.4, CosNotifyFilter match_*)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import omniORB  # noqa: F401  (must precede CosNotification)
from omniORB import CORBA

import CosNotification

from . import fastnav
from .ast import Expr
from .compiler import MALFORMED, Run, State, compile_tree
from .errors import EvaluationError
from .evaluator import ANY, STRUCTURED, TYPED
from .operands import Operand
from .parser import parse

__all__ = ["Constraint", "compile_constraint"]

_log = logging.getLogger(__name__)

# Values that break their TypeCode (possible only for locally built events) fail like bad operands.
_MALFORMED = MALFORMED

def _true(state: State) -> Operand:
    """The empty constraint (never run: its constant result is used)."""
    return True


_STRUCTURED_INFO = fastnav.info_for(CosNotification._tc_StructuredEvent)
_ANY_INFO = fastnav.info_for(CORBA.TC_any)
_TYPED_INFO = fastnav.info_for(CosNotification._tc_PropertySeq)


class Constraint:
    """A syntactically valid constraint; the match methods never raise (an error means FALSE).

    The syntax tree is compiled once into closures (:mod:`compiler`); ``_constant`` is the result of a
    constraint that does not depend on the event (empty, or folded to a constant), else None.
    """

    __slots__ = ("_constant", "_run", "_tree", "expression")

    _run: Run
    _constant: bool | None

    def __init__(self, expression: str, tree: Expr | None) -> None:
        self.expression = expression
        self._tree = tree
        if tree is None:
            self._run, self._constant = _true, True
        else:
            self._run, self._constant = compile_tree(tree)

    def __repr__(self) -> str:
        return f"Constraint({self.expression!r})"

    def match_structured(self, event: Any, *, now: int | None = None) -> bool:
        """Evaluate against a ``CosNotification.StructuredEvent``."""
        return self._match(event, _STRUCTURED_INFO, STRUCTURED, now)

    def match_any(self, any_value: Any, *, now: int | None = None) -> bool:
        """Evaluate against the content of a ``CORBA.Any`` (an unstructured event)."""
        return self._match(any_value, _ANY_INFO, ANY, now)

    def match_typed(self, props: Sequence[Any], *, now: int | None = None) -> bool:
        """Evaluate against a typed event given as a list of ``CosNotification.Property``."""
        return self._match(list(props), _TYPED_INFO, TYPED, now)

    def _match(self, value: Any, info: fastnav.TypeInfo, form: str, now: int | None) -> bool:
        constant = self._constant
        if constant is not None:
            return constant
        try:
            return self._run(State(value, info, form, now)) is True
        except EvaluationError as exc:
            _log.debug("constraint %r is FALSE: %s", self.expression, exc)
        except _MALFORMED as exc:
            _log.debug("constraint %r is FALSE on a malformed value: %r", self.expression, exc)
        return False


def compile_constraint(expr: str) -> Constraint:
    """Parse ``expr``; raise EtclSyntaxError if it is not valid ETCL. Whitespace only is TRUE."""
    if not isinstance(expr, str):
        raise TypeError("a constraint expression must be a str")
    return Constraint(expr, parse(expr))
