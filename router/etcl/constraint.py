"""Compiled ETCL constraints and their match operations (NS 2.4, CosNotifyFilter match_*)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import omniORB  # noqa: F401  (must precede CosNotification)
import CosNotification
from omniORB import CORBA

from .ast import Expr
from .errors import EvaluationError
from .evaluator import ANY, STRUCTURED, TYPED, Context, evaluate
from .navigate import Node
from .parser import parse

__all__ = ["Constraint", "compile_constraint"]

_log = logging.getLogger(__name__)

# Values that break their TypeCode (possible only for locally built events) fail like bad operands.
_MALFORMED = (AttributeError, TypeError, ValueError, LookupError, ArithmeticError, CORBA.Exception)


class Constraint:
    """A syntactically valid constraint; the match methods never raise (an error means FALSE)."""

    __slots__ = ("expression", "_tree")

    def __init__(self, expression: str, tree: Expr | None) -> None:
        self.expression = expression
        self._tree = tree

    def __repr__(self) -> str:
        return f"Constraint({self.expression!r})"

    def match_structured(self, event: Any, *, now: int | None = None) -> bool:
        """Evaluate against a ``CosNotification.StructuredEvent``."""
        return self._match(Node(event, CosNotification._tc_StructuredEvent), STRUCTURED, now)

    def match_any(self, any_value: Any, *, now: int | None = None) -> bool:
        """Evaluate against the content of a ``CORBA.Any`` (an unstructured event)."""
        return self._match(Node(any_value, CORBA.TC_any), ANY, now)

    def match_typed(self, props: Sequence[Any], *, now: int | None = None) -> bool:
        """Evaluate against a typed event given as a list of ``CosNotification.Property``."""
        return self._match(Node(list(props), CosNotification._tc_PropertySeq), TYPED, now)

    def _match(self, root: Node, form: str, now: int | None) -> bool:
        if self._tree is None:
            return True
        try:
            return evaluate(self._tree, Context(root, form, now)) is True
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
