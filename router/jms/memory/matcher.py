"""JMS message selectors for the in-memory broker twin: a selector's text compiled to a predicate over a message's
String headers (comparisons, AND/OR/NOT, IN, LIKE, BETWEEN, IS NULL, with ActiveMQ's String-to-number/boolean
conversion; no arithmetic). A syntax error raises :class:`~router.jms.errors.BrokerError`, as the broker answers."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Selector", "compile_selector"]

Selector = Callable[[Mapping[str, str]], bool | None]


# --------------------------------------------------------------------------------------------------- selectors
_TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>\d+(?:\.\d+)?)|(?P<op><>|<=|>=|[=<>(),])"
                    r"|(?P<id>[A-Za-z_$][\w$.]*))")
_KEYWORDS = {"AND", "OR", "NOT", "IN", "LIKE", "ESCAPE", "IS", "NULL", "BETWEEN", "TRUE", "FALSE"}


class _SelectorSyntax(ValueError):
    pass


def _tokens(text: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    pos, text = 0, text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise _SelectorSyntax(f"bad selector near {text[pos:pos + 10]!r}")
        pos = m.end()
        kind = m.lastgroup or ""
        value: Any = m.group(kind)
        if kind == "str":
            value = value[1:-1].replace("''", "'")
        elif kind == "num":
            value = float(value) if "." in value else int(value)
        elif kind == "id" and value.upper() in _KEYWORDS:
            kind, value = "kw", value.upper()
        out.append((kind, value))
    return out


def _header_value(headers: Mapping[str, str], name: str) -> Any:
    if name == "JMSPriority":
        return int(headers.get("priority", "4"))
    if name == "JMSDeliveryMode":
        return "PERSISTENT" if headers.get("persistent") == "true" else "NON_PERSISTENT"
    aliases = {"JMSType": "type", "JMSCorrelationID": "correlation-id", "JMSMessageID": "message-id"}
    return headers.get(aliases.get(name, name))


class _Parser:
    """Recursive descent over the JMS selector subset; builds closures returning True / False / None."""

    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0

    def peek(self, *values: str) -> bool:
        return self.i < len(self.toks) and self.toks[self.i][1] in values and self.toks[self.i][0] in ("kw", "op")

    def take(self, value: str) -> None:
        if not self.peek(value):
            raise _SelectorSyntax(f"expected {value}")
        self.i += 1

    def parse(self) -> Selector:
        node = self.disjunction()
        if self.i != len(self.toks):
            raise _SelectorSyntax(f"unexpected {self.toks[self.i][1]!r}")
        return node

    def disjunction(self) -> Selector:
        node = self.conjunction()
        while self.peek("OR"):
            self.i += 1
            node = _or(node, self.conjunction())
        return node

    def conjunction(self) -> Selector:
        node = self.negation()
        while self.peek("AND"):
            self.i += 1
            node = _and(node, self.negation())
        return node

    def negation(self) -> Selector:
        if self.peek("NOT"):
            self.i += 1
            inner = self.negation()
            return lambda h: None if (v := inner(h)) is None else not v
        return self.comparison()

    def comparison(self) -> Selector:
        left = self.operand()
        negate = self.peek("NOT")
        self.i += negate
        if self.peek("=", "<>", "<", ">", "<=", ">=") and not negate:
            op = self.toks[self.i][1]
            self.i += 1
            if op not in ("=", "<>") and self.i < len(self.toks) and self.toks[self.i][0] == "str":
                raise _SelectorSyntax(f"{op} needs a numeric operand")   # as ActiveMQ's grammar
            return _compare(op, left, self.operand())
        if self.peek("IS"):
            return self._is_null(left)
        node = self._special(left)
        return (lambda h: None if (v := node(h)) is None else not v) if negate else node

    def _is_null(self, left: Callable[[Mapping[str, str]], Any]) -> Selector:
        self.i += 1
        want_null = not self.peek("NOT")
        self.i += not want_null
        self.take("NULL")
        return lambda h: (left(h) is None) == want_null

    def _special(self, left: Callable[[Mapping[str, str]], Any]) -> Selector:
        if self.peek("IN"):
            self.i += 1
            self.take("(")
            values = [self.string()]
            while self.peek(","):
                self.i += 1
                values.append(self.string())
            self.take(")")
            return lambda h: None if (v := left(h)) is None else v in values
        if self.peek("LIKE"):
            self.i += 1
            return _like(left, self.string(), self._escape())
        if self.peek("BETWEEN"):
            self.i += 1
            low = self.operand()
            self.take("AND")
            return _and(_compare(">=", left, low), _compare("<=", left, self.operand()))
        if self.i == len(self.toks) or self.peek(")", "AND", "OR"):
            return lambda h: v if isinstance(v := left(h), bool) else None
        raise _SelectorSyntax(f"unexpected {self.toks[self.i][1]!r}")

    def _escape(self) -> str | None:
        if not self.peek("ESCAPE"):
            return None
        self.i += 1
        return self.string()

    def string(self) -> str:
        value = self.literal()
        if not isinstance(value, str):
            raise _SelectorSyntax(f"expected a string literal, got {value!r}")
        return value

    def literal(self) -> Any:
        if self.i >= len(self.toks) or self.toks[self.i][0] not in ("str", "num", "kw"):
            raise _SelectorSyntax("expected a literal")
        kind, value = self.toks[self.i]
        if kind == "kw" and value not in ("TRUE", "FALSE"):
            raise _SelectorSyntax(f"expected a literal, got {value}")
        self.i += 1
        return value == "TRUE" if kind == "kw" else value

    def operand(self) -> Callable[[Mapping[str, str]], Any]:
        if self.peek("("):
            self.i += 1
            inner = self.disjunction()
            self.take(")")
            return inner
        if self.i < len(self.toks) and self.toks[self.i][0] == "id":
            name = self.toks[self.i][1]
            self.i += 1
            return lambda h: _header_value(h, name)
        value = self.literal()
        return lambda h: value


def _or(a: Selector, b: Selector) -> Selector:
    def run(h: Mapping[str, str]) -> bool | None:
        x, y = a(h), b(h)
        return True if x or y else (None if x is None or y is None else False)
    return run


def _and(a: Selector, b: Selector) -> Selector:
    def run(h: Mapping[str, str]) -> bool | None:
        x, y = a(h), b(h)
        return False if x is False or y is False else (None if x is None or y is None else True)
    return run


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda x, y: x == y, "<>": lambda x, y: x != y, "<": lambda x, y: x < y, ">": lambda x, y: x > y,
    "<=": lambda x, y: x <= y, ">=": lambda x, y: x >= y}


def _compare(op: str, left: Callable[[Mapping[str, str]], Any], right: Callable[[Mapping[str, str]], Any]
             ) -> Selector:
    def run(h: Mapping[str, str]) -> bool | None:
        x, y = left(h), right(h)
        x, y = _coerce(x, y), _coerce(y, x)
        if x is None or y is None:
            return None
        if isinstance(x, bool) != isinstance(y, bool) or isinstance(x, str) != isinstance(y, str):
            return False
        return _OPS[op](x, y)
    return run


def _coerce(value: Any, other: Any) -> Any:
    """ActiveMQ converts a String operand to the other side's type (number, boolean); None when it cannot."""
    if not isinstance(value, str) or isinstance(other, str) or other is None:
        return value
    if isinstance(other, bool):
        return value.lower() == "true" if value.lower() in ("true", "false") else None
    try:
        return int(value) if value.strip().lstrip("+-").isdigit() else float(value)
    except ValueError:
        return None


def _like(left: Callable[[Mapping[str, str]], Any], pattern: str, escape: str | None) -> Selector:
    regex, chars = "", iter(pattern)
    for ch in chars:
        if escape and ch == escape:
            regex += re.escape(next(chars, ""))
        else:
            regex += ".*" if ch == "%" else "." if ch == "_" else re.escape(ch)
    compiled = re.compile(regex, re.DOTALL)
    return lambda h: None if not isinstance(v := left(h), str) else compiled.fullmatch(v) is not None


def compile_selector(text: str | None) -> Selector:
    """A predicate over STOMP headers; :class:`ValueError` for a malformed selector."""
    if not text or not text.strip():
        return lambda h: True
    return _Parser(text).parse()
