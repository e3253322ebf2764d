"""ETCL tokenizer and parser: accepted forms, precedence, component paths, syntax errors with positions,
and the length / nesting bounds."""

from __future__ import annotations

import pickle

import pytest

from router.etcl import EtclSyntaxError, compile_constraint
from router.etcl.ast import (
    Arith,
    Assoc,
    BoolOp,
    Compare,
    Component,
    EnumIdent,
    Exist,
    Implicit,
    In,
    Index,
    LabelIdent,
    Member,
    Not,
    NumLit,
    Path,
    Position,
    StrLit,
    Substr,
    UnionLabel,
)
from router.etcl.lexer import MAX_LENGTH, tokenize
from router.etcl.parser import MAX_DEPTH, parse


def comp(*steps: object, var: str | None = None, escaped: bool = False) -> Component:
    return Component(Path(var, escaped, tuple(steps)))  # type: ignore[arg-type]


@pytest.mark.parametrize("text, value", [
    ("42", 42), ("+42", 42), ("-42", -42), ("4.5", 4.5), ("4.", 4.0), (".5", 0.5), ("1e3", 1000.0),
    ("1E-2", 0.01), ("2.5e+1", 25.0), ("- 7", -7),
])
def test_numbers(text: str, value: float) -> None:
    node = parse(text)
    assert isinstance(node, NumLit) and node.value == value
    assert isinstance(node.value, float) is any(c in text for c in ".eE")


@pytest.mark.parametrize("text, value", [
    (r"'it\'s'", "it's"), (r"'a\\b'", "a\\b"), (r"'\n\t'", "\n\t"), (r"'\x41\101'", "AA"),
    (r"'a\qb'", "aqb"), ("''", ""), ("'caf\u00e9'", "caf\u00e9"),
])
def test_strings_and_escapes(text: str, value: str) -> None:
    node = parse(text)
    assert isinstance(node, StrLit) and node.value == value


@pytest.mark.parametrize("text, expected", [
    ("$", comp()),
    ("$.a.b", comp(Member("a"), Member("b"))),
    ("$.header.variable_header(Priority)", comp(Member("header"), Member("variable_header"), Assoc("Priority"))),
    ("$(name)", comp(Assoc("name"))),
    ("$.2[3]", comp(Position(2), Index(3))),
    ("$.1.2", comp(Position(1), Position(2))),
    ("$. (5)", comp(UnionLabel(5))),
    ("$.(-1)", comp(UnionLabel(-1))),
    ("$.(+3)", comp(UnionLabel(3))),
    ("$.('x')", comp(UnionLabel("x"))),
    ("$.()", comp(UnionLabel(None))),
    ("$.(e5)", comp(UnionLabel(LabelIdent("e5")))),
    ("$. ( \\in )", comp(UnionLabel(LabelIdent("in")))),
    ("$.(TRUE)", comp(UnionLabel(True))),
    ("$. _d", comp(Implicit("_d"))),
    ("$.seq._length", comp(Member("seq"), Implicit("_length"))),
    ("$violation(serviceUser)._repos_id", comp(Assoc("serviceUser"), Implicit("_repos_id"), var="violation")),
    ("$threshold._type_id", comp(Implicit("_type_id"), var="threshold")),
    ("$\\curtime", comp(var="curtime", escaped=True)),
    ("$curtime.high", comp(Member("high"), var="curtime")),
    ("$.\\in", comp(Member("in"))),
    ("$.a [ 1 ] ( b )", comp(Member("a"), Index(1), Assoc("b"))),
])
def test_component_paths(text: str, expected: Component) -> None:
    assert parse(text) == expected


def test_precedence_and_associativity() -> None:
    a, b, c = (comp(var=n) for n in "abc")
    assert parse("$a or $b and $c") == BoolOp("or", (a, BoolOp("and", (b, c))))
    assert parse("$a and $b or $c") == BoolOp("or", (BoolOp("and", (a, b)), c))
    assert parse("$a or $b or $c") == BoolOp("or", (a, b, c))
    assert parse("not $a == 1") == Compare("==", Not(a), NumLit(1))
    assert parse("1 + 2 * 3") == Arith(NumLit(1), (("+", Arith(NumLit(2), (("*", NumLit(3)),))),))
    assert parse("1 - 2 - 3") == Arith(NumLit(1), (("-", NumLit(2)), ("-", NumLit(3))))
    assert parse("1 - (2 - 3)") == Arith(NumLit(1), (("-", Arith(NumLit(2), (("-", NumLit(3)),))),))
    assert parse("'x' ~ $a in $b") == In(Substr(StrLit("x"), a), b)
    true = parse("TRUE")
    assert true is not None
    assert parse("$a + 1 < 2 and TRUE") == BoolOp("and", (
        Compare("<", Arith(a, (("+", NumLit(1)),)), NumLit(2)), true))
    assert parse("HOUSE in $a") == In(EnumIdent("HOUSE"), a)
    assert parse("exist x") == Exist(Path("x", False, ()))
    assert parse("\\and == 1") == Compare("==", EnumIdent("and"), NumLit(1))


@pytest.mark.parametrize("text", ["", "   ", "\n\t "])
def test_empty_constraint_is_true(text: str) -> None:
    assert parse(text) is None
    assert compile_constraint(text).match_any(None) is True


@pytest.mark.parametrize("text, position", [
    ("$a == 'abc", 6),          # unterminated string
    ("$a = 1", 3),              # '=' is not an operator
    ("1 +", 3),                 # operand missing at the end
    ("(1 == 1", 7),             # ')' missing
    ("1 == 1 == 1", 7),         # comparisons do not chain
    ("'a' ~ 'b' ~ 'c'", 10),    # neither does ~
    ("$.in == 1", 2),           # keyword member must be escaped
    ("$_.d", 1),                # the printed typo
    ("not not TRUE", 4),        # not applies to a factor
    ("- $x", 2),                # unary minus only on numbers
    ("1, 2", 1),                # comma operator forbidden
    (":vendor: == 1", 0),       # vendor keywords unsupported
    ("'a' in 'abc'", 7),        # in needs a component or identifier
    ("$.a[x]", 4),
    ("$.a[1", 5),
    ("$.a._foo", 4),
    ("$.(?)", 3), ("$.(and)", 3),
    ("1e", 1),
    ("1e+", 1),
    ("exist 5", 6),
    ("default x", 8),
    ("$x )", 3),
    ("\\ 5", 0),
    ("TRUE FALSE", 5),
    ("caf\u00e9 == 1", 3),
    ("$.a == 1 and", 12),
    ("()", 1),
    ("$.", 2),
    ("1e999 > 1", 0),
])
def test_syntax_errors_with_positions(text: str, position: int) -> None:
    with pytest.raises(EtclSyntaxError) as info:
        compile_constraint(text)
    assert info.value.position == position, info.value.message
    assert info.value.expression == text
    assert str(info.value).endswith(f"at position {position}")


def test_syntax_error_is_a_picklable_value_error() -> None:
    with pytest.raises(ValueError) as info:
        compile_constraint("$a ==")
    assert isinstance(info.value, EtclSyntaxError)
    copy = pickle.loads(pickle.dumps(info.value))
    assert isinstance(copy, EtclSyntaxError)
    assert (copy.message, copy.expression, copy.position) == (info.value.message, "$a ==", 5)


def test_nesting_limit() -> None:
    ok = "(" * MAX_DEPTH + "TRUE" + ")" * MAX_DEPTH
    assert compile_constraint(ok).match_any(None) is True
    too_deep = "(" * (MAX_DEPTH + 1) + "TRUE" + ")" * (MAX_DEPTH + 1)
    with pytest.raises(EtclSyntaxError) as info:
        compile_constraint(too_deep)
    assert info.value.position == MAX_DEPTH


def test_tree_height_limit_without_parentheses_overflow() -> None:
    right_nested = "1" + " + (1" * 60 + ")" * 60 + " > 0"
    assert compile_constraint(right_nested).match_any(None) is True
    with pytest.raises(EtclSyntaxError):
        compile_constraint("1" + " + (2 * (1" * 60 + "))" * 60 + " > 0")


def test_long_flat_chains_do_not_recurse() -> None:
    assert compile_constraint(" or ".join(["FALSE"] * 5000 + ["TRUE"])).match_any(None) is True
    assert compile_constraint(" + ".join(["1"] * 5000) + " == 5000").match_any(None) is True
    assert compile_constraint(" and ".join(["TRUE"] * 5000)).match_any(None) is True


def test_length_limit() -> None:
    with pytest.raises(EtclSyntaxError) as info:
        compile_constraint("TRUE" + " " * MAX_LENGTH)
    assert info.value.position == MAX_LENGTH
    assert compile_constraint("TRUE" + " " * (MAX_LENGTH - 4)).match_any(None) is True


def test_tokens_carry_positions() -> None:
    kinds = [(t.kind, t.pos) for t in tokenize("$a.b >= 'x' and\tnot HOUSE")]
    assert kinds == [("comp", 0), ("op", 5), ("str", 8), ("kw", 12), ("kw", 16), ("ident", 20), ("eof", 25)]


def test_constraint_keeps_its_text() -> None:
    c = compile_constraint("$a == 1")
    assert c.expression == "$a == 1"
    assert "Constraint" in repr(c)
    with pytest.raises(TypeError):
        compile_constraint(None)  # type: ignore[arg-type]
