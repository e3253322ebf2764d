"""Recursive-descent (precedence-climbing) parser for ETCL (NS 2.4.8 over Trader App. B).

Precedence, lowest first: ``or``, ``and``, comparisons, ``in``, ``~``, ``+ -``, ``* /``, ``not``,
then factors (``exist``, ``default``, literals, components, parentheses). Comparisons, ``in`` and
``~`` do not chain (``a == b == c`` is a syntax error, as in the BNF). ``not`` applies to a factor,
so ``not $x == 1`` is ``(not $x) == 1``. The right operand of ``in`` must be a component or an
identifier. Unary ``-``/``+`` apply to numeric literals only.

Nesting is bounded: more than ``MAX_DEPTH`` open parentheses or a tree taller than ``MAX_DEPTH``
raises EtclSyntaxError, so neither parsing nor evaluation can hit Python's recursion limit.
"""

from __future__ import annotations

from .ast import (
    Arith,
    BoolLit,
    BoolOp,
    Compare,
    Component,
    Default,
    EnumIdent,
    Exist,
    Expr,
    In,
    Not,
    NumLit,
    Path,
    StrLit,
    Substr,
)
from .errors import EtclSyntaxError
from .lexer import Token, tokenize

__all__ = ["MAX_DEPTH", "parse"]

MAX_DEPTH = 100
"""Deepest accepted nesting of parentheses, and tallest accepted syntax tree."""

_PREC = {"or": 1, "and": 2, "==": 3, "!=": 3, "<": 3, "<=": 3, ">": 3, ">=": 3,
         "in": 4, "~": 5, "+": 6, "-": 6, "*": 7, "/": 7}
_NON_ASSOC = {3, 4, 5}


def _height(*children: Expr) -> int:
    return 1 + max(child.depth for child in children)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.k = 0
        self.nesting = 0

    def error(self, message: str, tok: Token | None = None) -> EtclSyntaxError:
        return EtclSyntaxError(message, self.text, (tok or self.tok).pos)

    @property
    def tok(self) -> Token:
        return self.tokens[self.k]

    def advance(self) -> Token:
        tok = self.tokens[self.k]
        if tok.kind != "eof":
            self.k += 1
        return tok

    def binary_op(self) -> str | None:
        tok = self.tok
        if tok.kind in ("op", "kw") and isinstance(tok.value, str) and tok.value in _PREC:
            return tok.value
        return None

    def parse(self) -> Expr | None:
        if self.tok.kind == "eof":
            return None
        expr = self.expression(1)
        if self.tok.kind != "eof":
            raise self.error(f"unexpected {self.describe(self.tok)}")
        return expr

    def expression(self, min_prec: int) -> Expr:
        left = self.unary()
        last_prec = 0
        while True:
            op = self.binary_op()
            if op is None or _PREC[op] < min_prec:
                return left
            prec = _PREC[op]
            if prec == last_prec and prec in _NON_ASSOC:
                raise self.error(f"operator {op!r} cannot be chained; add parentheses")
            op_tok = self.advance()
            right = self.in_operand() if op == "in" else self.expression(prec + 1)
            left = self.check_depth(self.combine(op, left, right), op_tok)
            last_prec = prec

    def combine(self, op: str, left: Expr, right: Expr) -> Expr:
        if op in ("and", "or"):
            if isinstance(left, BoolOp) and left.op == op:
                operands = left.operands + (right,)
                return BoolOp(op, operands, max(left.depth, 1 + right.depth))
            return BoolOp(op, (left, right), _height(left, right))
        if op in ("+", "-", "*", "/"):
            same_group = ("+", "-") if op in ("+", "-") else ("*", "/")
            if isinstance(left, Arith) and left.rest[0][0] in same_group:
                return Arith(left.first, left.rest + ((op, right),), max(left.depth, 1 + right.depth))
            return Arith(left, ((op, right),), _height(left, right))
        if op == "in":
            return In(left, right, _height(left, right))
        if op == "~":
            return Substr(left, right, _height(left, right))
        return Compare(op, left, right, _height(left, right))

    def check_depth(self, node: Expr, tok: Token) -> Expr:
        if node.depth > MAX_DEPTH:
            raise self.error(f"expression nested deeper than {MAX_DEPTH} levels", tok)
        return node

    def in_operand(self) -> Expr:
        tok = self.advance()
        if tok.kind == "comp" and isinstance(tok.value, Path):
            return Component(tok.value)
        if tok.kind == "ident" and isinstance(tok.value, str):
            return EnumIdent(tok.value)
        raise self.error("'in' must be followed by a $component or an identifier", tok)

    def unary(self) -> Expr:
        if self.tok.kind == "kw" and self.tok.value == "not":
            tok = self.advance()
            operand = self.factor()
            return self.check_depth(Not(operand, operand.depth + 1), tok)
        return self.factor()

    def factor(self) -> Expr:
        tok = self.tok
        if tok.kind == "op" and tok.value == "(":
            return self.parenthesised()
        if tok.kind == "op" and tok.value in ("-", "+"):
            return self.signed_number()
        self.advance()
        if tok.kind == "num" and isinstance(tok.value, (int, float)):
            return NumLit(tok.value)
        if tok.kind == "str" and isinstance(tok.value, str):
            return StrLit(tok.value)
        if tok.kind == "ident" and isinstance(tok.value, str):
            return EnumIdent(tok.value)
        if tok.kind == "comp" and isinstance(tok.value, Path):
            return Component(tok.value)
        if tok.kind == "kw":
            return self.keyword_factor(tok)
        raise self.error(f"unexpected {self.describe(tok)}", tok)

    def keyword_factor(self, tok: Token) -> Expr:
        if tok.value in ("TRUE", "FALSE"):
            return BoolLit(tok.value == "TRUE")
        if tok.value == "exist":
            return Exist(self.exist_operand())
        if tok.value == "default":
            nxt = self.advance()
            if nxt.kind != "comp" or not isinstance(nxt.value, Path):
                raise self.error("'default' must be followed by a $component", nxt)
            return Default(nxt.value)
        raise self.error(f"unexpected {self.describe(tok)}", tok)

    def exist_operand(self) -> Path:
        tok = self.advance()
        if tok.kind == "comp" and isinstance(tok.value, Path):
            return tok.value
        if tok.kind == "ident" and isinstance(tok.value, str):
            return Path(tok.value, False, (), tok.pos)
        raise self.error("'exist' must be followed by a $component or an identifier", tok)

    def parenthesised(self) -> Expr:
        open_tok = self.advance()
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            raise self.error(f"parentheses nested deeper than {MAX_DEPTH} levels", open_tok)
        inner = self.expression(1)
        if not (self.tok.kind == "op" and self.tok.value == ")"):
            raise self.error(f"expected ')' but found {self.describe(self.tok)}")
        self.advance()
        self.nesting -= 1
        return inner

    def signed_number(self) -> Expr:
        sign = self.advance()
        tok = self.advance()
        if tok.kind != "num" or not isinstance(tok.value, (int, float)):
            raise self.error(f"unary {sign.value!r} applies only to a number (write -1 * (expr))", tok)
        return NumLit(-tok.value if sign.value == "-" else tok.value)

    @staticmethod
    def describe(tok: Token) -> str:
        if tok.kind == "eof":
            return "end of constraint"
        if tok.kind == "comp":
            return "component"
        return f"{tok.value!r}"


def parse(text: str) -> Expr | None:
    """Parse ``text``; ``None`` for an empty (all-whitespace) constraint, which is TRUE."""
    return _Parser(text).parse()
