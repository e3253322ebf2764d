"""EXTENDED_TCL (ETCL), the Notification Service's default filter constraint language (NS 2.4).

Pure Python: a hand-written tokenizer (``lexer``), a precedence-climbing parser building an AST
(``parser``, ``ast``), compiled once into nested closures (``compiler``, constant folding included) that
walk omniORBpy values with per-type cached TypeCode information (``fastnav``), with the NS 2.4.3 typing
rules (``operands``). The tree-walking evaluator (``evaluator`` over ``navigate``) is the reference
semantics the compiled form is tested against. No ``eval``/``exec``/code generation; ``~`` is a plain
substring test; input length and nesting depth are bounded.

    >>> c = compile_constraint("$type_name == 'CommunicationsAlarm' and $Priority >= 1")
    >>> c.match_structured(event)                                   # doctest: +SKIP

Exceptions: EtclSyntaxError (a ValueError) from compile_constraint only; match_* never raise.
"""

from __future__ import annotations

from .constraint import Constraint, compile_constraint
from .errors import EtclSyntaxError
from .eventtype import event_type_matches

__all__ = ["Constraint", "EtclSyntaxError", "compile_constraint", "event_type_matches"]
