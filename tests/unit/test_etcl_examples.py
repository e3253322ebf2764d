"""The worked examples of NS 2.4.3, 2.4.6 and 2.4.7 (spec digest §9.5-9.7), each with events that must
and must not match."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

import omniORB  # noqa: F401
from omniORB import CORBA
from omniORB.any import to_any

import CosNotification as N
import TimeBase

from router.etcl import EtclSyntaxError, compile_constraint


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
E, TN = S.load_idl()


def any_match(expr: str, value: object) -> bool:
    return compile_constraint(expr).match_any(value if isinstance(value, CORBA.Any) else to_any(value))


# --- NS 2.4.3: evaluation errors and short-circuit -----------------------------------------------

HAWAII = "($.a + 1 > 32) or ($.b == 5) or ($.c > 3)"
HAWAII_FIXED = "($.a + 1 > 32) or (exist $.b and $.b == 5) or ($.c > 3)"


@pytest.mark.parametrize("event, expected", [
    ({"a": "Hawaii", "c": 5.0}, False),   # string + 1 is an error: the whole match is FALSE
    ({"a": "H", "c": 5.0}, True),         # 'H' is a char: 72 + 1 > 32, and $.b is never touched
    ({"a": 5, "c": 5.0}, False),          # $.b is missing: error, even though $.c > 3
    ({"a": 5, "b": 5.0}, True),           # 5 is converted to 5.0; $.c is never needed
])
def test_ns_2_4_3_error_example(event: dict[str, object], expected: bool) -> None:
    assert any_match(HAWAII, event) is expected


def test_ns_2_4_3_rewritten_constraint_guards_the_missing_member() -> None:
    assert any_match(HAWAII_FIXED, {"a": 5, "c": 5.0}) is True
    assert any_match(HAWAII_FIXED, {"a": 5, "c": 1.0}) is False


def test_ns_2_4_3_char_typed_member_is_numeric() -> None:
    event = CORBA.Any(CORBA.TypeCode("IDL:EtclTest/X:1.0"), E.X(1, "b", 2))
    assert any_match("$.B + 1 == 99", event) is True          # 'b' is a one-character string: a char
    assert any_match("$.B + 1 == 99", {"B": "bb"}) is False


def test_ns_2_4_1_integer_division_and_cast() -> None:
    event = {"one": 1, "two": 2}
    assert any_match("2.5 * ($.one / $.two) > 1", event) is False
    assert any_match("2.5 * (1.0 * $.one / $.two) > 1", event) is True


# --- NS 2.4.6: positional notation ---------------------------------------------------------------

def k_union(disc: int, value: object) -> CORBA.Any:
    return CORBA.Any(E._tc_K, E.K(disc, value))


@pytest.mark.parametrize("named, positional", [
    ("$.M < 54", "$.(5) < 54"),
    ("$.L.C < 128", "$.(3).2 < 128"),
    ("$.N == 999", "$.() == 999"),
    ("$._d == 2 and $.S != 'hoob'", "$._d == 2 and $.(0) != 'hoob'"),
    ("$._d == 2 and $.S != 'hoob'", "$._d == 2 and $.(2) != 'hoob'"),
    ("'putty' ~ $.S", "'putty' ~ $. (2)"),
    ("exist $.S", "exist $.(0) or exist $.(2)"),
])
@pytest.mark.parametrize("event", [
    k_union(5, 10), k_union(5, 60), k_union(3, E.X(1, "b", 100)), k_union(3, E.X(1, "b", 200)),
    k_union(7, 999), k_union(-1, 5), k_union(2, "putty!"), k_union(2, "hoob"), k_union(0, "putty"),
])
def test_ns_2_4_6_positional_equals_named(named: str, positional: str, event: CORBA.Any) -> None:
    assert any_match(named, event) is any_match(positional, event)


@pytest.mark.parametrize("expr, event, expected", [
    ("$.(5) < 54", k_union(5, 10), True),
    ("$.(5) < 54", k_union(5, 60), False),
    ("$.(5) < 54", k_union(0, "x"), False),
    ("$.(3).2 < 128", k_union(3, E.X(1, "b", 100)), True),
    ("$.() == 999", k_union(7, 999), True),
    ("$.() == 999", k_union(5, 999), False),
    ("$._d == 2 and $.(0) != 'hoob'", k_union(2, "putty"), True),
    ("$._d == 2 and $.(0) != 'hoob'", k_union(2, "hoob"), False),
    ("$._d == 2 and $.(0) != 'hoob'", k_union(0, "putty"), False),
    ("exist $.(0)", k_union(0, "x"), True),
    ("exist $.(0)", k_union(2, "x"), False),       # exist $.(0) is $._d == 0
    ("exist $.(2)", k_union(2, "x"), True),
    ("exist $.S", k_union(2, "x"), True),
    ("exist $.S", k_union(3, E.X(1, "b", 1)), False),
])
def test_ns_2_4_6_union_positions(expr: str, event: CORBA.Any, expected: bool) -> None:
    assert any_match(expr, event) is expected


def test_ns_2_4_6_struct_positions() -> None:
    tests = [N.Property("midterm", to_any(70)), N.Property("final", to_any(60))]
    pupil = CORBA.Any(E._tc_Pupil, E.Pupil(85, tests, [20, 20, 20, 8]))
    named = "$.gpa < 80 or $.tests(midterm) > $.tests(final) or $.monthly_attendance[3] < 10"
    positional = "$.0 < 80 or $.1(midterm) > $.1(final) or $.2[3] < 10"
    assert any_match(named, pupil) is True
    assert any_match(positional, pupil) is True
    dull = CORBA.Any(E._tc_Pupil, E.Pupil(85, [N.Property("midterm", to_any(50)),
                                               N.Property("final", to_any(60))], [20] * 4))
    assert any_match(named, dull) is False
    assert any_match(positional, dull) is False


def test_printed_positional_typo_is_a_syntax_error() -> None:
    with pytest.raises(EtclSyntaxError):
        compile_constraint("$.3 < 80 or $1.(midterm) > $1(final)")


# --- NS 2.4.7: the twelve examples ---------------------------------------------------------------

def test_example_1_communications_alarm_but_not_lost_packet() -> None:
    c = compile_constraint("$type_name == 'CommunicationsAlarm' and not ($event_name == 'lost_packet')")
    assert c.match_structured(S.structured(event_name="link_down")) is True
    assert c.match_structured(S.structured(event_name="lost_packet")) is False
    assert c.match_structured(S.structured(type_name="QoSAlarm", event_name="link_down")) is False


@pytest.mark.parametrize("variable, expected", [
    ({"priority": 1}, True), ({"priority": 5}, True), ({"priority": 3}, True),
    ({"priority": 0}, False), ({"priority": 6}, False),
    ({}, False),                                  # no priority entry: error, FALSE
    ({"Priority": CORBA.Any(CORBA.TC_short, 4)}, True),   # the standard header name, found case-insensitively
    ({"priority": "high"}, False),                # string >= 1: type error, FALSE
])
def test_example_2_priority_range(variable: dict[str, object], expected: bool) -> None:
    c = compile_constraint("$type_name == 'CommunicationsAlarm' and $priority >= 1 and $priority <= 5")
    assert c.match_structured(S.structured(variable=variable)) is expected


def movie(type_name: str, stars: list[str]) -> CORBA.Any:
    header = {"fixed_header": {"event_type": {"domain_name": "Cinema", "type_name": type_name},
                               "event_name": "film"}}
    return to_any({"header": header, "starlist": stars})


MARX = ("$type_name == 'MOVIE' and (('groucho' in $.starlist) + ('chico' in $.starlist) + "
        "('harpo' in $.starlist) + ('zeppo' in $.starlist) + ('gummo' in $.starlist)) > 2")


@pytest.mark.parametrize("event, expected", [
    (movie("MOVIE", ["groucho", "chico", "harpo"]), True),
    (movie("MOVIE", ["groucho", "chico", "harpo", "zeppo", "gummo", "margaret"]), True),
    (movie("MOVIE", ["groucho", "chico", "margaret"]), False),
    (movie("MOVIE", ["margaret"]), False),
    (movie("PLAY", ["groucho", "chico", "harpo"]), False),
])
def test_example_3_marx_brothers(event: CORBA.Any, expected: bool) -> None:
    assert compile_constraint(MARX).match_any(event) is expected


NOW = (1000 << 32) + (1 << 31)   # a fixed $curtime
MINUTE = 60 * 10_000_000         # TimeT units


def stamped(time_t: int) -> object:
    utc = CORBA.Any(TimeBase._tc_UtcT, TimeBase.UtcT(time_t, 0, 0, 0))
    return S.structured(variable={"origination_timestamp": utc})


def test_example_4_as_printed_selects_old_events() -> None:
    c = compile_constraint("$origination_timestamp.high + 2 < $curtime.high")
    assert c.match_structured(stamped(NOW - 30 * MINUTE), now=NOW) is True
    assert c.match_structured(stamped(NOW - MINUTE), now=NOW) is False


def test_example_4_with_greater_than_selects_recent_events() -> None:
    c = compile_constraint("$origination_timestamp.high + 2 > $curtime.high")
    assert c.match_structured(stamped(NOW - MINUTE), now=NOW) is True
    assert c.match_structured(stamped(NOW - 30 * MINUTE), now=NOW) is False


def student(*scores: int) -> CORBA.Any:
    return CORBA.Any(E._tc_Student, E.Student("ann", [E.TestResult(f"t{i}", s) for i, s in enumerate(scores)]))


@pytest.mark.parametrize("scores, expected", [
    ((80, 80, 80), True), ((100, 100, 40), True), ((90, 70, 85), True),
    ((100, 100, 39), False),      # 239 / 3 is 79 in integer division
    ((80, 80), False), ((80, 80, 80, 80), False),
])
def test_example_5_three_tests_average_80(scores: tuple[int, ...], expected: bool) -> None:
    expr = ("$.test._length == 3 and "
            "($.test[0].score + $.test[1].score + $.test[2].score) / 3 >= 80")
    assert compile_constraint(expr).match_any(student(*scores)) is expected


def test_example_5_division_is_integer_division() -> None:
    assert any_match("($.test[0].score + $.test[1].score) / 2 == 80", student(80, 81, 0)) is True


@pytest.mark.parametrize("proc, expected", [
    (E.Proc(1_100_000, 0.0, 0), False),          # 200000.0
    (E.Proc(0, 400.0, 0), True),                 # 510000.0
    (E.Proc(1_100_000, 100.0, 200_000), True),   # 200000 + 127500 + 250000
    (E.Proc(0, 0.0, 400_000), False),            # exactly 500000.0 is not greater
])
def test_example_6_usage_threshold(proc: object, expected: bool) -> None:
    expr = "$.memsize / 5.5 + $.cputime * 1275.0 + $.filesize * 1.25 > 500000.0"
    assert any_match(expr, CORBA.Any(E._tc_Proc, proc)) is expected


@pytest.mark.parametrize("event, expected", [
    (CORBA.Any(E._tc_DefUnion, E.DefUnion(7, 2)), True),
    (CORBA.Any(E._tc_DefUnion, E.DefUnion(-9, 2)), True),
    (CORBA.Any(E._tc_DefUnion, E.DefUnion(7, 3)), False),
    (CORBA.Any(E._tc_DefUnion, E.DefUnion(1, "two")), False),
    (CORBA.Any(E._tc_NoDef, E.NoDef(1, 2)), False),     # no default arm: default is FALSE
])
def test_example_7_default_union_member(event: CORBA.Any, expected: bool) -> None:
    assert compile_constraint("default $._d and $.defvalue == 2").match_any(event) is expected


def test_example_7_printed_form_is_a_syntax_error() -> None:
    with pytest.raises(EtclSyntaxError):
        compile_constraint("default $_.d and $.defvalue == 2")


@pytest.mark.parametrize("filterable, expected", [
    ({"threshold": CORBA.Any(CORBA.TC_short, 5)}, True),
    ({"threshold": CORBA.Any(CORBA.TC_long, 5)}, False),
    ({"threshold": CORBA.Any(E._tc_Threshold, 5)}, False),   # the alias's own name, 'Threshold'
    ({}, False),
])
def test_example_8_threshold_type(filterable: dict[str, object], expected: bool) -> None:
    c = compile_constraint("exist $threshold._type_id and $threshold._type_id == 'short'")
    assert c.match_structured(S.structured(filterable=filterable)) is expected


def test_example_9_only_structured_events() -> None:
    real_id = "$._repos_id == 'IDL:omg.org/CosNotification/StructuredEvent:1.0'"
    event = S.structured()
    assert compile_constraint(real_id).match_structured(event) is True
    assert compile_constraint(real_id).match_any(CORBA.Any(N._tc_StructuredEvent, event)) is True
    assert compile_constraint(real_id).match_any(student(1, 2, 3)) is False
    assert compile_constraint(real_id).match_any(to_any(5)) is False
    # As printed, the id lacks the omg.org prefix that the real StructuredEvent TypeCode carries.
    printed = "$._repos_id == 'IDL:CosNotification/StructuredEvent:1.0'"
    assert compile_constraint(printed).match_structured(event) is False


def violation(value: CORBA.Any | None) -> object:
    entries = [] if value is None else [N.Property("serviceUser", value)]
    entries.append(N.Property("other", to_any(1)))
    return S.structured(filterable={"violation": CORBA.Any(N._tc_PropertySeq, entries)})


@pytest.mark.parametrize("event, expected", [
    (violation(CORBA.Any(TN._tc_ServiceUserType, TN.ServiceUserType("bob"))), True),
    (violation(to_any("bob")), False),
    (violation(CORBA.Any(E._tc_X, E.X(1, "b", 2))), False),
    (violation(None), False),
    (S.structured(), False),
])
def test_example_10_service_user_type(event: object, expected: bool) -> None:
    expr = "$violation(serviceUser)._repos_id == 'IDL:TelecomNotification/ServiceUserType:1.0'"
    assert compile_constraint(expr).match_structured(event) is expected


def test_example_11_required_rights() -> None:
    c = compile_constraint("exist $.header.variable_header(required_rights)")
    assert c.match_structured(S.structured(variable={"required_rights": ["read", "write"]})) is True
    assert c.match_structured(S.structured(variable={"Priority": 1})) is False
    assert c.match_structured(S.structured(filterable={"required_rights": ["read"]})) is False


@pytest.mark.parametrize("kind, expected", [("HOUSE", True), ("CAR", True), ("BOAT", False)])
def test_example_12_escaped_in_member(kind: str, expected: bool) -> None:
    asset = CORBA.Any(E._tc_Asset, E.Asset(getattr(E, kind), 1))
    assert any_match("$.\\in == HOUSE or $.\\in == CAR", asset) is expected


def test_example_12_printed_and_unescaped_forms_are_syntax_errors() -> None:
    for printed in ("$_.in == HOUSE or $_.in == CAR", "$.in == HOUSE"):
        with pytest.raises(EtclSyntaxError):
            compile_constraint(printed)


# --- NS 2.4.5 / digest §9.6: short-hand and long forms agree --------------------------------------

@pytest.mark.parametrize("event", [
    S.structured(event_name="lost_packet", variable={"priority": 1}),
    S.structured(event_name="lost_packet", variable={"priority": 2}),
    S.structured(event_name="other", variable={"priority": 1}),
    S.structured(type_name="X", event_name="lost_packet", variable={"priority": 1}),
])
def test_runtime_variables_equal_long_form(event: object) -> None:
    short = "$type_name == 'CommunicationsAlarm' and $event_name == 'lost_packet' and $priority < 2"
    long = ("$.header.fixed_header.event_type.type_name == 'CommunicationsAlarm' and "
            "$.header.fixed_header.event_name == 'lost_packet' and $.header.variable_header(priority) < 2")
    assert compile_constraint(short).match_structured(event) is compile_constraint(long).match_structured(event)


def test_one_constraint_for_structured_and_unstructured_events() -> None:
    c = compile_constraint("$.header.fixed_header.event_type.type_name == 'CommunicationsAlarm'")
    assert c.match_structured(S.structured()) is True
    unstructured = to_any({"header": {"fixed_header": {"event_type": {"type_name": "CommunicationsAlarm"}}}})
    assert c.match_any(unstructured) is True
    assert c.match_any(to_any({"header": 5})) is False
