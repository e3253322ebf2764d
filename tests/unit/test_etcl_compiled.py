"""Differential tests: compiled constraints (router.etcl.compiler + fastnav) against the tree-walking
reference evaluator (router.etcl.evaluator + navigate) over hypothesis-generated constraints and events,
plus targeted tests of constant folding, short-circuit with folded errors and per-event caching."""

from __future__ import annotations

import importlib.util
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import omniORB
from omniORB import CORBA
from omniORB.any import to_any

import CosNotification as N

from router.etcl import compile_constraint
from router.etcl.compiler import MALFORMED
from router.etcl.errors import EvaluationError
from router.etcl.evaluator import ANY, STRUCTURED, TYPED, Context, evaluate
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

DIFF = settings(deadline=timedelta(milliseconds=1000), database=None, max_examples=600,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- the reference: the tree-walking evaluator, as Constraint used it before compilation ----------

def reference(text: str, root: Node, form: str, now: int | None) -> bool | str:
    tree = parse(text)
    if tree is None:
        return True
    try:
        return evaluate(tree, Context(root, form, now)) is True
    except EvaluationError:
        return False
    except MALFORMED:
        return False
    except Exception as exc:  # noqa: BLE001  (must escape the compiled form the same way)
        return f"raises {type(exc).__name__}"


def compiled(constraint: Any, method: str, value: Any, now: int | None) -> bool | str:
    try:
        result: bool | str = getattr(constraint, method)(value, now=now)
    except Exception as exc:  # noqa: BLE001
        return f"raises {type(exc).__name__}"
    return result


def check(text: str, event: Any) -> None:
    """Both evaluators agree on ``text`` for ``event`` in every form it can be matched in."""
    c = compile_constraint(text)
    kind, value = event
    cases: list[tuple[str, Any, Node, str]] = []
    if kind == "structured":
        cases.append(("match_structured", value, Node(value, N._tc_StructuredEvent), STRUCTURED))
        props = list(value.filterable_data)
        cases.append(("match_typed", props, Node(list(props), N._tc_PropertySeq), TYPED))
        wrapped = CORBA.Any(N._tc_StructuredEvent, value)
        cases.append(("match_any", wrapped, Node(wrapped, CORBA.TC_any), ANY))
    else:
        cases.append(("match_any", value, Node(value, CORBA.TC_any), ANY))
    for method, arg, root, form in cases:
        for now in (12345, (1 << 32) + 7):
            want = reference(text, root, form, now)
            got = compiled(c, method, arg, now)
            assert got == want, (text, method, now)
            assert compiled(c, method, arg, now) == want  # per-event caches do not leak between events


# --- events ------------------------------------------------------------------------------------------

def _any(value: Any) -> Any:
    try:
        return to_any(value)
    except CORBA.BAD_PARAM:
        return CORBA.Any(CORBA.TC_null, None)


def _fixed_events() -> list[tuple[str, Any]]:
    numbers = CORBA.Any(E._tc_Numbers, E.Numbers(1, 2, -3, 4, 2 ** 40, 2 ** 63, 0.5, 2.5, 255, "H", True))
    mem_b = CORBA.Any(CORBA.TC_any, CORBA.Any(CORBA.TC_long, 7))
    holder = CORBA.Any(E._tc_Holder, E.Holder(CORBA.Any(E._tc_X, E.X(1, "b", 3)), mem_b, E.K(5, 42),
                                               [[1, 2, 3], [4, 5, 6]], b"\x01\x02\x03", [E.CAR, E.BOAT],
                                               ["bob", "eve"], [to_any(7), to_any(8)]))
    holder2 = CORBA.Any(E._tc_Holder, E.Holder(to_any("x"), to_any(2.5), E.K(2, "two"), [[0, 0, 0], [1, 1, 1]],
                                                b"", [], [], []))
    unions = [E.ByKind(E.HOUSE, "street"), E.ByKind(E.CAR, 4), E.ByChar("a", 5), E.ByChar("z", "zed"),
              E.NoDef(1, 9), E.NoDef(2, "b"), E.DefUnion(1, "t"), E.DefUnion(7, 70), E.K(0, "s0"),
              E.K(3, E.X(1, "b", 2)),
              E.K(9, 3), E.ByKindDef(E.BOAT, "dock"), E.ByKindDef(E.CAR, 3), E.ByBool(True, 5),
              E.ByBool(False, "n"), E.ByWay(E._in, 5), E.ByAlias(E.CAR, 3)]
    tests = [E.NV("math", to_any(90)), E.NV("Math", to_any(80)), E.NV("art", to_any("A"))]
    pupil = CORBA.Any(E._tc_Pupil, E.Pupil(3, tests, [1, 2, 3]))
    student = E.Student("ann", [E.TestResult("math", 80), E.TestResult("art", 95)])
    events: list[tuple[str, Any]] = [
        ("any", numbers), ("any", holder), ("any", holder2), ("any", pupil),
        ("any", CORBA.Any(E._tc_Student, student)),
        ("any", CORBA.Any(E._tc_Asset, E.Asset(E.CAR, 1))),
        ("any", CORBA.Any(E._tc_Threshold, 5)), ("any", CORBA.Any(E._tc_Matrix, [[1, 2, 3], [4, 5, 6]])),
        ("any", CORBA.Any(N._tc_PropertySeq, [N.Property("sev", to_any(4)), N.Property("SEV", to_any(5)),
                                               N.Property("x", to_any("ab"))])),
        ("any", to_any(5)), ("any", to_any("x")), ("any", to_any([1, 2])), ("any", CORBA.Any(CORBA.TC_null, None)),
        ("any", CORBA.Any(CORBA.TC_long, "abc")), ("any", CORBA.Any(E._tc_X, 5)),
        ("any", CORBA.Any(E._tc_K, 5)), ("any", CORBA.Any(E._tc_Holder, E.Holder(1, 2, 3, 4, 5, 6, 7, 8))),
        ("any", CORBA.Any(CORBA.TypeCode("IDL:omg.org/CORBA/OctetSeq:1.0"), 5)),
    ]
    for u in unions:
        tc = omniORB.findTypeCode(u._NP_RepositoryId)
        events.append(("any", CORBA.Any(tc, u)))
    import TimeBase

    events.append(("any", CORBA.Any(TimeBase._tc_UtcT, TimeBase.UtcT((1 << 32) + 9, 0, 0, 0))))
    events.append(("any", CORBA.Any(TimeBase._tc_TimeT, (3 << 32) + 1)))
    events.append(("structured", S.structured(
        variable={"Priority": CORBA.Any(CORBA.TC_short, 3), "priority": 1, "dup": 1},
        filterable={"severity": 4, "reason": "link down", "tags": ["a", "b", "c"], "dup": 2, "x": 1.5,
                    "curtime": 5, "event_name": "fd", "a": "q"},
        remainder=CORBA.Any(E._tc_X, E.X(7, "r", 1)))))
    events.append(("structured", S.structured(domain="", type_name="", event_name="",
                                              variable={"PRIORITY": 9, "in": 1}, filterable={"Tags": [1, 2]})))
    bad_header = N.StructuredEvent(N.EventHeader(N.FixedEventHeader(N.EventType("D", "T"), "e"), 5), [], 7)
    events.append(("structured", bad_header))
    bad_pairs = N.StructuredEvent(N.EventHeader(N.FixedEventHeader(N.EventType("D", "T"), "e"), [1, 2]),
                                  [N.Property("a", 3)], CORBA.Any(CORBA.TC_null, None))
    events.append(("structured", bad_pairs))
    return events


FIXED_EVENTS = _fixed_events()

SCALARS = st.one_of(st.integers(-2 ** 40, 2 ** 40), st.floats(allow_nan=True), st.text(max_size=3),
                    st.booleans())
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3), max_leaves=6)
NAMES = st.sampled_from(["a", "b", "x", "priority", "Priority", "curtime", "tags", "severity", "in"])


@st.composite
def random_structured(draw: st.DrawFn) -> tuple[str, Any]:
    def props() -> list[Any]:
        return [N.Property(name, _any(draw(VALUES))) for name in draw(st.lists(NAMES, max_size=3))]

    event_type = N.EventType(draw(st.sampled_from(["", "Telecom", "x"])),
                             draw(st.sampled_from(["", "CommunicationsAlarm", "%TYPED"])))
    header = N.EventHeader(N.FixedEventHeader(event_type, draw(st.text(max_size=2))), props())
    return "structured", N.StructuredEvent(header, props(), _any(draw(VALUES)))


EVENTS = st.one_of(st.sampled_from(FIXED_EVENTS), random_structured())

# --- constraints --------------------------------------------------------------------------------------

COMPONENTS = [
    "$", "$.a", "$.a.b", "$.b", "$.x", "$.s", "$.us", "$.l", "$.ul", "$.ll", "$.ull", "$.f", "$.d", "$.o",
    "$.c", "$.0", "$.1", "$.10", "$.11", "$.A", "$.B", "$.memA", "$.memA.B", "$.memA.1", "$.memB",
    "$.memB._type_id", "$.u", "$.u._d", "$.u.M", "$.u.S", "$.u.N", "$.u.L.B", "$.u.(5)", "$.u.(2)", "$.u.(0)",
    "$.u.()", "$.u.('x')", "$.grid", "$.grid[1][2]", "$.grid[2][0]", "$.grid._length", "$.grid[1]._length",
    "$.raw", "$.raw[1]", "$.raw._length", "$.kinds", "$.kinds[0]", "$.names", "$.names[0]", "$.anys",
    "$.anys[1]", "$._d", "$.(0)", "$.(1)", "$.(2)", "$.(-1)", "$.()", "$.('a')", "$.('z')", "$.address",
    "$.wheels", "$.text", "$.defvalue", "$.\\in", "$._type_id", "$._repos_id", "$._length", "$.value",
    "$.header.variable_header(Priority)", "$.header.variable_header(priority)", "$.filterable_data(tags)",
    "$.filterable_data(x)", "$.header.fixed_header.event_type.type_name", "$.header.fixed_header.event_name",
    "$.remainder_of_body", "$.remainder_of_body.A", "$priority", "$Priority", "$PRIORITY", "$x", "$a", "$b",
    "$dup", "$severity", "$reason", "$tags", "$Tags", "$type_name", "$domain_name", "$event_name",
    "$curtime", "$\\curtime", "$curtime.high", "$curtime.low", "$curtime.time", "$curtime._type_id",
    "$(x)", "$(sev)", "$(SEV)", "$sev", "$SEV", "$.tests(math)", "$.tests(Math)", "$tests", "$math",
    "$.test[0].score", "$.test[1].name", "$.test._length", "$.monthly_attendance", "$.gpa", "$.high",
    "$.low", "$.time.low", "$.time.high", "$[0].name", "$[1]", "$[0].value", "$remainder_of_body",
    "$header", "$.header", "$filterable_data", "$\\in", "$name", "$.name",
    "$.(CAR)", "$.(HOUSE)", "$.(BOAT)", "$.(PURPLE)", "$.('CAR')", "$.(TRUE)", "$.(FALSE)", "$.(\\in)",
    "$.(97)", "$.u.(CAR)", "$.place", "$.other", "$.yes", "$.cars",
]
LITERALS = ["0", "1", "-1", "2", "3", "5", "7", "90", "255", "2.5", ".5", "-0.5", "1e300", "1e3",
            "9223372036854775809", "4294967296", "'a'", "'b'", "'x'", "'H'", "'abc'", "'link'", "'bob'",
            "'math'", "''", "'CommunicationsAlarm'", "'Telecom'", "'%TYPED'", "'short'", "'X'", "'UtcT'",
            "'IDL:EtclTest/K:1.0'", "TRUE", "FALSE", "HOUSE", "CAR", "BOAT", "PURPLE"]

ATOMS = st.one_of(
    st.sampled_from(LITERALS),
    st.sampled_from(COMPONENTS),
    st.sampled_from(COMPONENTS).map(lambda c: f"exist {c}"),
    st.sampled_from(["x", "in_", "HOUSE", "priority"]).map(lambda c: f"exist {c}"),
    st.sampled_from(COMPONENTS).map(lambda c: f"default {c}"),
)


def _combine(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    paren = inner.map(lambda s: f"({s})")
    return st.one_of(
        st.tuples(paren, st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), paren).map(" ".join),
        st.tuples(paren, st.sampled_from(["+", "-", "*", "/"]), paren).map(" ".join),
        st.lists(paren, min_size=2, max_size=5).flatmap(
            lambda xs: st.sampled_from([" or ", " and ", " + ", " * ", " - ", " / "]).map(lambda op: op.join(xs))),
        paren.map(lambda s: f"not {s}"),
        st.tuples(paren, st.sampled_from(COMPONENTS + ["HOUSE"])).map(lambda t: f"{t[0]} in {t[1]}"),
        st.tuples(paren, paren).map(lambda t: f"{t[0]} ~ {t[1]}"),
    )


CONSTRAINTS = st.recursive(ATOMS, _combine, max_leaves=8)


@DIFF
@given(CONSTRAINTS, EVENTS)
def test_compiled_matches_reference(text: str, event: tuple[str, Any]) -> None:
    check(text, event)


@DIFF
@given(st.lists(st.sampled_from(COMPONENTS + LITERALS), min_size=1, max_size=6),
       st.sampled_from(["==", "!=", "<", ">=", "+", "*", "/", "~"]),
       st.sampled_from([" or ", " and "]), EVENTS)
def test_compiled_matches_reference_on_flat_shapes(parts: list[str], op: str, joiner: str,
                                                   event: tuple[str, Any]) -> None:
    comparisons = [f"{a} {op} {b}" if op in ("==", "!=", "<", ">=", "~") else f"{a} {op} {b} == 1"
                   for a, b in zip(parts, parts[1:] + parts[:1], strict=True)]
    check(joiner.join(comparisons), event)


@pytest.mark.parametrize("event", FIXED_EVENTS, ids=lambda e: e[0])
@pytest.mark.parametrize("text", [
    "", "TRUE", "FALSE", "1 == 1", "1 / 0 == 0", "TRUE or 1 / 0 == 0", "FALSE and 1 / 0 == 0",
    "$x == 1 and 1 / 0 == 0", "$x == 1 or 1 / 0 == 0", "1 / 0 == 0 or TRUE", "not (1 / 0 == 0)",
    "$.s == 1 or FALSE or 1", "$.s == 1 or FALSE", "$.s == 1 and TRUE", "$.s == 1 or TRUE or 1/0 == 1",
    "1 + 2 + $.s == 4", "$.s + 1 + 2 == 4", "1e300 * 1e300 > 0", "9223372036854775809 * 2 > 1.0",
    "'a' + 1 == 98", "HOUSE == HOUSE", "HOUSE < CAR", "1 in HOUSE", "'b' ~ 'abc'", "$priority == $Priority",
    "$Priority + $Priority == 6", "exist $Priority and $Priority > 2", "$curtime > 0 and $curtime.high == 1",
    "$type_name == 'CommunicationsAlarm' and $Priority >= 1 and $Priority <= 5",
    "'link' ~ $reason and 'b' in $.filterable_data(tags)", "exist $.header.variable_header(required_rights)",
    "$.header.variable_header(Priority) > 2 or $severity + 1 > 3",
    " or ".join(["FALSE"] * 50 + ["$.s == 1"]), " + ".join(["1"] * 50) + " == $.ul",
])
def test_compiled_matches_reference_on_examples(text: str, event: tuple[str, Any]) -> None:
    check(text, event)


UNION_LABELS = ["()", "(0)", "(1)", "(2)", "(97)", "('a')", "('z')", "('CAR')", "(CAR)", "(HOUSE)", "(BOAT)",
                "(PURPLE)", "(TRUE)", "(FALSE)", "(\\in)", "(outward)", "(a)"]


@pytest.mark.parametrize("label", UNION_LABELS)
def test_union_labels_agree_on_every_union(label: str) -> None:
    """Every label form, as a value, under ``exist`` and after ``default``, on every fixed union event."""
    unions = [e for e in FIXED_EVENTS if e[0] == "any" and "union" in repr(e[1].typecode().kind())]
    assert len(unions) >= 15
    for event in unions:
        for text in (f"$.{label} == 4", f"$.{label} == 'dock'", f"exist $.{label}",
                     f"exist $.{label} and $.{label} != 5", f"default $._d and exist $.{label}"):
            check(text, event)


def test_constant_constraints_are_folded() -> None:
    assert compile_constraint("1 + 2 == 3 and 'b' ~ 'abc'")._constant is True
    assert compile_constraint("1 / 0 == 0")._constant is False
    assert compile_constraint("TRUE or $x == 1")._constant is True
    assert compile_constraint("FALSE and $x == 1")._constant is False
    assert compile_constraint("$x == 1 or TRUE")._constant is None      # $x may fail first
    assert compile_constraint("$x == 1 and 1/0 == 0")._constant is None


def test_long_flat_chains_compile_and_run_without_recursion() -> None:
    event = S.structured(filterable={"x": 1})
    assert compile_constraint(" or ".join(["$x == 2"] * 5000 + ["$x == 1"])).match_structured(event)
    assert compile_constraint(" + ".join(["$x"] * 5000) + " == 5000").match_structured(event)
    assert compile_constraint(" and ".join(["$x == 1"] * 5000)).match_structured(event)
    deep = "$x" + " + ($x" * 90 + ")" * 90 + " == 91"
    assert compile_constraint(deep).match_structured(event)
