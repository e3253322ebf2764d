"""Exceptions of the ETCL constraint engine.

Exception tree::

    ValueError
    └── EtclSyntaxError      the constraint text is not valid ETCL (caller's input; raised by compile_constraint)
    Exception
    └── EvaluationError      an operand has the wrong type or a component does not exist at match time
                             (internal: match_* turn it into FALSE, NS 2.4.3)
"""

from __future__ import annotations

__all__ = ["EtclSyntaxError", "EvaluationError"]


class EtclSyntaxError(ValueError):
    """The constraint is not valid EXTENDED_TCL.

    ``position`` is the 0-based character offset where the problem was found,
    ``expression`` the full constraint text and ``message`` the bare explanation.
    """

    def __init__(self, message: str, expression: str, position: int) -> None:
        super().__init__(f"{message} at position {position}")
        self.message = message
        self.expression = expression
        self.position = position

    def __reduce__(self) -> tuple[type[EtclSyntaxError], tuple[str, str, int]]:
        return (type(self), (self.message, self.expression, self.position))


class EvaluationError(Exception):
    """Evaluation of a constraint against one event failed (the match result is FALSE)."""
