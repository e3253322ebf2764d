"""Union members by case label (NS 2.4.2, 2.4.6) for every kind of discriminator, in both evaluators.

``$.(label)`` selects the arm of the case label ``x`` for which ``$._d == label`` would hold with the
discriminator ``x``: an enumerator by name (``$.(CAR)``) or ordinal, a boolean as ``TRUE``/``FALSE`` or
1/0, a char by character or code, an integer by value. A value only the default arm covers is reached
with ``$.()``. Each case runs through the tree-walking reference (``evaluator``) and the compiled form
(``compile_constraint``) on real omniORBpy union anys built from generated stubs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import omniORB
from omniORB import CORBA

from router.etcl import compile_constraint
from router.etcl.ast import LabelIdent, UnionLabel
from router.etcl.errors import EtclSyntaxError, EvaluationError
from router.etcl.evaluator import ANY, Context, evaluate
from router.etcl.navigate import Node
from router.etcl.parser import parse


def _support() -> ModuleType:
    name = "etcl_test_support"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("test_etcl_support.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


S = _support()
E, _ = S.load_idl()


def union_any(value: Any) -> Any:
    """A real any holding a generated union value, with the union's own TypeCode."""
    return CORBA.Any(omniORB.findTypeCode(value._NP_RepositoryId), value)


def reference(expr: str, event: Any) -> bool:
    tree = parse(expr)
    assert tree is not None
    try:
        return evaluate(tree, Context(Node(event, CORBA.TC_any), ANY, None)) is True
    except EvaluationError:
        return False


def both(expr: str, value: Any) -> tuple[bool, bool]:
    event = union_any(value)
    return reference(expr, event), compile_constraint(expr).match_any(event)


CASES = [
    # enum discriminator, no default arm
    (E.ByKind(E.CAR, 4), "$.(CAR) == 4", True),
    (E.ByKind(E.CAR, 4), "$.( CAR ) == 4", True),
    (E.ByKind(E.CAR, 4), "$.(CAR) == 4 and $.(1) == 4 and $._d == CAR", True),
    (E.ByKind(E.HOUSE, "street"), "$.(HOUSE) == 'street'", True),
    (E.ByKind(E.CAR, 4), "$.(HOUSE) == 'street'", False),              # arm not active
    (E.ByKind(E.CAR, 4), "exist $.(CAR)", True),
    (E.ByKind(E.HOUSE, "street"), "exist $.(CAR)", False),
    (E.ByKind(E.HOUSE, "street"), "not exist $.(CAR) and exist $.(HOUSE)", True),
    (E.ByKind(E.CAR, 4), "exist $.(BOAT)", False),                     # an enumerator with no case
    (E.ByKind(E.CAR, 4), "exist $.(PURPLE)", False),                   # not an enumerator at all
    (E.ByKind(E.CAR, 4), "$.('CAR') == 4", False),                     # a string label is a char label
    (E.ByKind(E.CAR, 4), "exist $.('CAR')", False),
    # enum discriminator: multi-label arm and default arm
    (E.ByKindDef(E.BOAT, "dock"), "$.(HOUSE) == 'dock' and $.(BOAT) == 'dock'", True),
    (E.ByKindDef(E.BOAT, "dock"), "exist $.(BOAT) and not exist $.(HOUSE)", True),
    (E.ByKindDef(E.BOAT, "dock"), "default $._d", False),
    (E.ByKindDef(E.CAR, 3), "$.() == 3 and default $._d and $._d == CAR", True),
    (E.ByKindDef(E.CAR, 3), "$.(CAR) == 3", False),                    # CAR is no case label: use $.()
    (E.ByKindDef(E.CAR, 3), "exist $.(CAR)", False),
    (E.ByKindDef(E.CAR, 3), "exist $.(HOUSE)", False),
    (E.ByKindDef(E.CAR, 3), "$.other == 3", True),
    # enumerator that is an ETCL keyword (escaped), typedef'd enum discriminator
    (E.ByWay(E._in, 5), "$.(\\in) == 5 and exist $.(\\in)", True),
    (E.ByWay(E._in, 5), "exist $.(outward)", False),
    (E.ByWay(E.outward, "x"), "$.(outward) == 'x' and $._d == outward", True),
    (E.ByAlias(E.CAR, 3), "$.(CAR) == 3 and exist $.(CAR)", True),
    (E.ByAlias(E.CAR, 3), "exist $.(BOAT)", False),
    (E.ByAlias(E.BOAT, "b"), "$.(BOAT) == 'b' and $.(2) == 'b'", True),
    # boolean discriminator
    (E.ByBool(True, 5), "$.(TRUE) == 5 and $.(1) == 5 and $._d == TRUE", True),
    (E.ByBool(True, 5), "exist $.(TRUE) and not exist $.(FALSE)", True),
    (E.ByBool(True, 5), "$.(FALSE) == 'n'", False),
    (E.ByBool(False, "n"), "$.(FALSE) == 'n' and $.(0) == 'n' and exist $.(FALSE)", True),
    (E.ByBool(False, "n"), "exist $.(TRUE)", False),
    (E.ByBool(True, 5), "exist $.(CAR)", False),
    # char discriminator: a char is numeric, so $.(97) is $.('a') as $._d == 97 is $._d == 'a'
    (E.ByChar("a", 5), "$.('a') == 5 and $.(97) == 5 and $._d == 97", True),
    (E.ByChar("a", 5), "exist $.(97) and exist $.('a')", True),
    (E.ByChar("a", 5), "exist $.(98)", False),
    (E.ByChar("a", 5), "exist $.(a)", False),                          # an identifier is an enumerator
    (E.ByChar("a", 5), "exist $.('ab')", False),
    (E.ByChar("z", "zed"), "exist $.('z')", False),                    # covered by the default arm only
    (E.ByChar("z", "zed"), "$.() == 'zed' and default $._d", True),
    # integer discriminator
    (E.NoDef(1, 9), "$.(1) == 9 and $.(+1) == 9 and exist $.(1)", True),
    (E.NoDef(1, 9), "$.(TRUE) == 9", True),                            # TRUE is 1, as in $._d == TRUE
    (E.NoDef(2, "b"), "exist $.(CAR) or exist $.('b') or exist $.(FALSE)", False),
    (E.NoDef(2, "b"), "$.(2) == 'b'", True),
    (E.DefUnion(7, 70), "$.(7) == 70", False),                         # 7 only reaches the default arm
    (E.DefUnion(7, 70), "$.() == 70 and $.defvalue == 70", True),
    (E.DefUnion(1, "t"), "$.(1) == 't' and not default $._d", True),
    # short discriminator, multi-label arm (NS 2.4.6 example union)
    (E.K(2, "two"), "$.(0) == 'two' and exist $.(2) and not exist $.(0)", True),
]


@pytest.mark.parametrize("value, expr, expected", CASES)
def test_union_labels_in_both_evaluators(value: Any, expr: str, expected: bool) -> None:
    assert both(expr, value) == (expected, expected)


@pytest.mark.parametrize("text, label", [
    ("$.(CAR)", LabelIdent("CAR")),
    ("$.( CAR )", LabelIdent("CAR")),
    ("$.(\\in)", LabelIdent("in")),
    ("$.(\\TRUE)", LabelIdent("TRUE")),   # an enumerator called TRUE
    ("$.(e5)", LabelIdent("e5")),
    ("$.(a_1)", LabelIdent("a_1")),
    ("$.(TRUE)", True),
    ("$.(FALSE)", False),
])
def test_identifier_and_boolean_labels_parse(text: str, label: object) -> None:
    tree = parse(text)
    assert tree is not None
    (step,) = tree.path.steps  # type: ignore[union-attr]
    assert step == UnionLabel(label)  # type: ignore[arg-type]
    assert type(step.label) is type(label)


@pytest.mark.parametrize("text", ["$.(in)", "$.(and)", "$.(exist)", "$.(CAR", "$.(CAR x)", "$.(1 CAR)",
                                  "$.(_x)", "$.(\\1)"])
def test_bad_identifier_labels_are_syntax_errors(text: str) -> None:
    with pytest.raises(EtclSyntaxError):
        parse(text)


def test_identifier_labels_are_valid_constraints() -> None:
    """A filter built with ``$.(CAR)`` is accepted (it used to be refused as InvalidConstraint)."""
    c = compile_constraint("$.(CAR) == 4")
    assert c.match_any(union_any(E.ByKind(E.CAR, 4))) is True
