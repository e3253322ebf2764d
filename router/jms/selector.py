"""JMS message selector syntax check (JMS 2.0 §3.8.1.1), for refusing a bad selector when it is presented.

nsjms never evaluates a selector: the broker does. But a selector the broker rejects gives a subscription that is
answered with an ERROR frame at every attempt, so ``bridge create`` checks the syntax first, with the grammar of
``/work/shared/spec-digest.md`` §12.4 (keywords case-insensitive, identifiers case-sensitive)::

    selector   ::= orExpr
    orExpr     ::= andExpr { OR andExpr }
    andExpr    ::= notExpr { AND notExpr }
    notExpr    ::= NOT notExpr | predicate
    predicate  ::= arith [ comparison | between | in | like | isnull ]   (in/like/isnull: after an identifier)
    comparison ::= ('='|'<>'|'>'|'>='|'<'|'<=') arith
    between    ::= [NOT] BETWEEN arith AND arith
    in         ::= [NOT] IN '(' stringLit {',' stringLit} ')'
    like       ::= [NOT] LIKE stringLit [ESCAPE stringLit]                (the escape: one character)
    isnull     ::= IS [NOT] NULL
    arith      ::= term { ('+'|'-') term } ;  term ::= unary { ('*'|'/') unary } ;  unary ::= ['+'|'-'] unary | primary
    primary    ::= '(' orExpr ')' | identifier | exactLit | approxLit | stringLit | TRUE | FALSE

Semantic checks are optional (§3.8.1.1) and not made: ``'a' > 1`` parses. No maintained Python package parses JMS
selectors (PyPI has none; the parser of ``router.jms.memory``, the in-memory twin, covers only the subset the twin
evaluates, without arithmetic), hence this module: a tokenizer and a recursive descent, no evaluation, no I/O.
"""

from __future__ import annotations

import re

__all__ = ["SelectorSyntaxError", "check_selector"]


class SelectorSyntaxError(ValueError):
    """The selector is not JMS selector syntax; the message says where."""


_KEYWORDS = frozenset({"AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "IS", "NULL", "TRUE", "FALSE"})
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>'(?:[^']|'')*')
  | (?P<approx>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?[dDfF]?|\d+[eE][+-]?\d+[dDfF]?|\d+[dDfF])
  | (?P<exact>0[xX][0-9a-fA-F]+[lL]?|\d+[lL]?)
  | (?P<op><>|<=|>=|[=<>()+\-*/,])
  | (?P<id>[^\W\d][\w$]*|\$[\w$]*)
""", re.VERBOSE)
_COMPARE = frozenset({"=", "<>", ">", ">=", "<", "<="})


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise SelectorSyntaxError(f"unexpected {text[pos:pos + 12]!r} at character {pos + 1}")
        kind, value = m.lastgroup or "", m.group()
        if kind == "id" and value.upper() in _KEYWORDS:
            kind, value = "kw", value.upper()
        if kind != "ws":
            out.append((kind, value, pos))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0
        self.end = len(text)

    def peek(self, kind: str, value: str | None = None) -> bool:
        if self.i >= len(self.toks):
            return False
        k, v, _ = self.toks[self.i]
        return k == kind and (value is None or v == value)

    def take(self, kind: str, value: str | None = None) -> bool:
        if self.peek(kind, value):
            self.i += 1
            return True
        return False

    def expect(self, kind: str, value: str | None, what: str) -> None:
        if not self.take(kind, value):
            self.fail(what)

    def fail(self, what: str) -> None:
        if self.i >= len(self.toks):
            raise SelectorSyntaxError(f"expected {what} at the end of the selector")
        _, v, pos = self.toks[self.i]
        raise SelectorSyntaxError(f"expected {what} at character {pos + 1}, found {v!r}")

    def selector(self) -> None:
        if not self.toks:
            raise SelectorSyntaxError("the selector is empty")
        self.or_expr()
        if self.i < len(self.toks):
            self.fail("AND, OR or the end of the selector")

    def or_expr(self) -> None:
        self.and_expr()
        while self.take("kw", "OR"):
            self.and_expr()

    def and_expr(self) -> None:
        self.not_expr()
        while self.take("kw", "AND"):
            self.not_expr()

    def not_expr(self) -> None:
        if self.take("kw", "NOT"):
            self.not_expr()
        else:
            self.predicate()

    def predicate(self) -> None:
        identifier = self.arith()
        if self.i < len(self.toks) and self.toks[self.i][0] == "op" and self.toks[self.i][1] in _COMPARE:
            self.i += 1
            self.arith()
            return
        negated = self.take("kw", "NOT")
        if self.take("kw", "BETWEEN"):
            self.arith()
            self.expect("kw", "AND", "AND of BETWEEN")
            self.arith()
        elif self.peek("kw", "IN") or self.peek("kw", "LIKE") or self.peek("kw", "IS"):
            if not identifier:
                self.fail("an identifier before IN, LIKE or IS")
            self._identifier_predicate(negated)
        elif negated:
            self.fail("BETWEEN, IN or LIKE after NOT")

    def _identifier_predicate(self, negated: bool) -> None:
        if self.take("kw", "IN"):
            self.expect("op", "(", "'(' after IN")
            self.expect("str", None, "a string literal in IN (...)")
            while self.take("op", ","):
                self.expect("str", None, "a string literal in IN (...)")
            self.expect("op", ")", "')' closing IN (...)")
        elif self.take("kw", "LIKE"):
            self.expect("str", None, "a string literal pattern after LIKE")
            if self.take("kw", "ESCAPE"):
                if not self.peek("str") or len(self.toks[self.i][1][1:-1].replace("''", "'")) != 1:
                    self.fail("a one-character string literal after ESCAPE")
                self.i += 1
        else:
            self.take("kw", "IS")
            if negated:
                self.fail("IS NULL (NOT goes after IS)")
            self.take("kw", "NOT")
            self.expect("kw", "NULL", "NULL after IS [NOT]")

    def arith(self) -> bool:
        """True when the expression was one bare identifier (IN, LIKE and IS apply to an identifier only)."""
        bare = self.term()
        while self.take("op", "+") or self.take("op", "-"):
            self.term()
            bare = False
        return bare

    def term(self) -> bool:
        bare = self.unary()
        while self.take("op", "*") or self.take("op", "/"):
            self.unary()
            bare = False
        return bare

    def unary(self) -> bool:
        if self.take("op", "+") or self.take("op", "-"):
            self.unary()
            return False
        if self.take("op", "("):
            self.or_expr()
            self.expect("op", ")", "')'")
            return False
        if self.take("id"):
            return True
        if self.take("exact") or self.take("approx") or self.take("str"):
            return False
        if self.take("kw", "TRUE") or self.take("kw", "FALSE"):
            return False
        self.fail("an identifier, a literal or '('")
        return False


def check_selector(text: str) -> str:
    """The selector stripped, or :class:`SelectorSyntaxError` naming what is wrong and where (pure)."""
    stripped = text.strip()
    _Parser(stripped).selector()
    return stripped
