"""Tokenizer for ETCL constraints (NS 2.4.1, 2.4.8; Trader App. B lexical rules).

A ``$`` component is one lexical token (NS 2.4.8 defines ``<Component>`` as a lexical token): the
lexer reads the whole path (``$.a.b[2](name)._length``) and hands the parser a ready ``Path``.
Whitespace is allowed between the parts of a component (the spec itself writes ``$. (5)``), except
between ``$`` and a run-time variable name.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ast import IMPLICIT_MEMBERS, Assoc, Implicit, Index, LabelIdent, Member, Path, Position, Step, UnionLabel
from .errors import EtclSyntaxError

__all__ = ["KEYWORDS", "MAX_LENGTH", "Token", "tokenize"]

MAX_LENGTH = 65536
"""Longest accepted constraint, in characters."""

KEYWORDS = frozenset({"and", "or", "not", "exist", "default", "in", "TRUE", "FALSE"})

_OPERATORS = ("==", "!=", "<=", ">=", "<", ">", "+", "-", "*", "/", "~", "(", ")")
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "v": "\v", "b": "\b", "r": "\r", "f": "\f", "a": "\a",
                   "\\": "\\", "?": "?", "'": "'", '"': '"'}
_WS = " \t\r\n\f\v"
_OCT = "01234567"
_HEX = "0123456789abcdefABCDEF"


@dataclass(frozen=True, slots=True)
class Token:
    """``kind`` is one of num, str, ident, kw, op, comp, eof; ``pos`` is the 0-based start offset."""

    kind: str
    value: object
    pos: int


def _is_letter(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z")


def _is_follow(c: str) -> bool:
    return _is_letter(c) or ("0" <= c <= "9") or c == "_"


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.n = len(text)

    def error(self, message: str, pos: int) -> EtclSyntaxError:
        return EtclSyntaxError(message, self.text, pos)

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.text[j] if j < self.n else ""

    def skip_ws(self) -> None:
        while self.i < self.n and self.text[self.i] in _WS:
            self.i += 1

    def run(self) -> list[Token]:
        tokens: list[Token] = []
        while True:
            self.skip_ws()
            if self.i >= self.n:
                tokens.append(Token("eof", None, self.n))
                return tokens
            tokens.append(self.next_token())

    def next_token(self) -> Token:
        c = self.text[self.i]
        start = self.i
        if _is_digit(c) or (c == "." and _is_digit(self.peek(1))):
            return Token("num", self.number(), start)
        if c == "'":
            return Token("str", self.string(), start)
        if c == "$":
            return Token("comp", self.component(), start)
        if _is_letter(c):
            word = self.word()
            return Token("kw" if word in KEYWORDS else "ident", word, start)
        if c == "\\":
            return Token("ident", self.escaped_ident(), start)
        if c == ":":
            raise self.error("vendor keywords (:name:) are not supported", start)
        for op in _OPERATORS:
            if self.text.startswith(op, start):
                self.i += len(op)
                return Token("op", op, start)
        if c == "=":
            raise self.error("'=' is not an operator (use '==')", start)
        if c == ",":
            raise self.error("the comma operator is not allowed", start)
        raise self.error(f"unexpected character {c!r}", start)

    # --- literals ---------------------------------------------------------------------------------

    def digits(self) -> str:
        start = self.i
        while self.i < self.n and _is_digit(self.text[self.i]):
            self.i += 1
        return self.text[start:self.i]

    def number(self) -> int | float:
        start = self.i
        is_float = False
        self.digits()
        if self.peek() == ".":
            is_float = True
            self.i += 1
            self.digits()
        if self.peek() in ("e", "E"):
            is_float = True
            self.exponent()
        lexeme = self.text[start:self.i]
        if not is_float:
            return int(lexeme)
        value = float(lexeme)
        if value in (float("inf"), float("-inf")):
            raise self.error("number out of range", start)
        return value

    def exponent(self) -> None:
        mark = self.i
        self.i += 1
        if self.peek() in ("+", "-"):
            self.i += 1
        if not self.digits():
            raise self.error("malformed exponent", mark)

    def string(self) -> str:
        start = self.i
        self.i += 1
        out: list[str] = []
        while True:
            if self.i >= self.n:
                raise self.error("unterminated string", start)
            c = self.text[self.i]
            if c == "'":
                self.i += 1
                return "".join(out)
            if c == "\\":
                out.append(self.escape(start))
            else:
                out.append(c)
                self.i += 1

    def escape(self, start: int) -> str:
        self.i += 1
        if self.i >= self.n:
            raise self.error("unterminated string", start)
        c = self.text[self.i]
        if c in _SIMPLE_ESCAPES:
            self.i += 1
            return _SIMPLE_ESCAPES[c]
        if c in _OCT:
            return chr(self.radix_digits(_OCT, 3, 8))
        if c == "x" and self.peek(1) in tuple(_HEX):
            self.i += 1
            return chr(self.radix_digits(_HEX, 2, 16))
        self.i += 1  # undefined escape: the backslash is dropped (NS 2.4.1)
        return c

    def radix_digits(self, alphabet: str, limit: int, base: int) -> int:
        start = self.i
        while self.i < self.n and self.i - start < limit and self.text[self.i] in alphabet:
            self.i += 1
        return int(self.text[start:self.i], base)

    # --- identifiers ------------------------------------------------------------------------------

    def word(self) -> str:
        start = self.i
        self.i += 1
        while self.i < self.n and _is_follow(self.text[self.i]):
            self.i += 1
        return self.text[start:self.i]

    def escaped_ident(self) -> str:
        start = self.i
        self.i += 1
        if not _is_letter(self.peek()):
            raise self.error("'\\' must be followed by an identifier", start)
        return self.word()

    def ident(self, what: str) -> str:
        """An <Ident> inside a component: a non-keyword word, or a backslash-escaped one."""
        start = self.i
        if self.peek() == "\\":
            return self.escaped_ident()
        if not _is_letter(self.peek()):
            raise self.error(f"expected {what}", start)
        name = self.word()
        if name in KEYWORDS:
            raise self.error(f"keyword {name!r} must be escaped as '\\{name}'", start)
        return name

    # --- components -------------------------------------------------------------------------------

    def component(self) -> Path:
        start = self.i
        self.i += 1
        var: str | None = None
        escaped = False
        c = self.peek()
        if c == "\\" or (_is_letter(c) and not self.keyword_ahead()):
            escaped = c == "\\"
            var = self.ident("run-time variable name")
        steps: list[Step] = []
        while True:
            mark = self.i
            self.skip_ws()
            step = self.step()
            if step is None:
                self.i = mark
                return Path(var, escaped, tuple(steps), start)
            steps.append(step)
            if isinstance(step, Implicit):
                return Path(var, escaped, tuple(steps), start)

    def keyword_ahead(self) -> bool:
        j = self.i
        while j < self.n and _is_follow(self.text[j]):
            j += 1
        return self.text[self.i:j] in KEYWORDS

    def step(self) -> Step | None:
        c = self.peek()
        if c == ".":
            self.i += 1
            self.skip_ws()
            return self.dot_step()
        if c == "[":
            return self.index_step()
        if c == "(":
            return self.assoc_step()
        return None

    def dot_step(self) -> Step:
        start = self.i
        c = self.peek()
        if _is_digit(c):
            return Position(int(self.digits()))
        if c == "(":
            return self.union_step()
        if c == "_":
            name = self.word()
            if name not in IMPLICIT_MEMBERS:
                raise self.error(f"unknown implicit member {name!r}", start)
            return Implicit(name)
        return Member(self.ident("a member name, position, '(' or implicit member after '.'"))

    def index_step(self) -> Index:
        self.i += 1
        self.skip_ws()
        start = self.i
        text = self.digits()
        if not text:
            raise self.error("expected digits in '[...]'", start)
        self.expect_close("]")
        return Index(int(text))

    def assoc_step(self) -> Assoc:
        self.i += 1
        self.skip_ws()
        name = self.ident("a name in '(...)'")
        self.expect_close(")")
        return Assoc(name)

    def union_step(self) -> UnionLabel:
        self.i += 1
        self.skip_ws()
        start = self.i
        c = self.peek()
        label: int | str | LabelIdent | None
        if c == ")":
            label = None
        elif c == "'":
            label = self.string()
        elif c == "\\" or _is_letter(c):
            label = self.label_word()
        else:
            sign = -1 if c == "-" else 1
            if c in ("+", "-"):
                self.i += 1
            text = self.digits()
            if not text:
                raise self.error("expected a union label: digits, a string, an identifier or nothing", start)
            label = sign * int(text)
        self.expect_close(")")
        return UnionLabel(label)

    def label_word(self) -> bool | LabelIdent:
        """``TRUE`` / ``FALSE`` (a boolean label) or an <Ident> naming an enumerator (NS 2.4.2)."""
        if self.peek() != "\\" and self.keyword_ahead():
            start = self.i
            word = self.word()
            if word in ("TRUE", "FALSE"):
                return word == "TRUE"
            raise self.error(f"keyword {word!r} must be escaped as '\\{word}'", start)
        return LabelIdent(self.ident("a union label"))

    def expect_close(self, closer: str) -> None:
        self.skip_ws()
        if self.peek() != closer:
            raise self.error(f"expected {closer!r}", self.i)
        self.i += 1


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens, ending with an ``eof`` token; raise EtclSyntaxError on bad input."""
    if len(text) > MAX_LENGTH:
        raise EtclSyntaxError(f"constraint longer than {MAX_LENGTH} characters", text, MAX_LENGTH)
    return _Lexer(text).run()
