"""ETCL evaluation: operator and typing tables (NS 2.4.3), components over omniORBpy values, run-time
variables (NS 2.4.5), short-circuit, and the three match forms."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

import omniORB
from omniORB import CORBA
from omniORB.any import to_any

import CosNotification as N

from router.etcl import compile_constraint
from router.etcl.errors import EvaluationError
from router.etcl.evaluator import UUID_EPOCH_OFFSET
from router.etcl.operands import EnumName, Num, arith, compare


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


def on_any(expr: str, value: object) -> bool:
    return compile_constraint(expr).match_any(value if isinstance(value, CORBA.Any) else to_any(value))


def literal(expr: str) -> bool:
    return compile_constraint(expr).match_structured(S.structured())


# --- operators on constants ----------------------------------------------------------------------

@pytest.mark.parametrize("expr, expected", [
    ("TRUE", True), ("FALSE", False), ("not FALSE", True), ("not (1 == 2)", True),
    ("1 + 2 == 3", True), ("7 / 2 == 3", True), ("-7 / 2 == -3", True), ("7 / 2.0 == 3.5", True),
    ("7 - 2 * 3 == 1", True), ("(7 - 2) * 3 == 15", True), ("10 / 2 / 5 == 1", True),
    ("2.5 * (1 / 2) > 1", False), ("2.5 * (1.0 * 1 / 2) > 1", True),
    ("+5 == 5", True), ("-5 < 0", True), ("1e2 == 100", True), (".5 == 0.5", True), ("5. == 5", True),
    ("TRUE + TRUE == 2", True), ("TRUE == 1", True), ("FALSE < TRUE", True), ("TRUE < FALSE", False),
    ("'a' + 1 == 98", True), ("'b' > 'a'", True), ("'abc' < 'abd'", True), ("'a' == 'a'", True),
    ("'a' == 97", True), ("'b' ~ 'abc'", True), ("'abc' ~ 'b'", False), ("'' ~ 'x'", True),
    ("'it\\'s' ~ 'it\\'s here'", True), ("'a\\qb' == 'aqb'", True),
    ("HOUSE == HOUSE", True), ("HOUSE != CAR", True),
    ("1 != 2", True), ("2 >= 2", True), ("2 <= 1", False), ("1.5 > 1", True),
])
def test_operators_on_constants(expr: str, expected: bool) -> None:
    assert literal(expr) is expected


@pytest.mark.parametrize("expr", [
    "1", "'abc'", "HOUSE",                               # not a boolean result
    "not 1", "1 and TRUE", "TRUE and 1", "FALSE or 1",   # boolean operators need booleans
    "'ab' + 1 == 1", "1 / 0 == 0", "1.0 / 0.0 > 0", "1 / 0.0 > 0",
    "'abc' == 1", "'abc' < 2", "1 ~ 'abc'", "'a' ~ 1", "TRUE ~ 'TRUE'",
    "HOUSE < CAR", "HOUSE == 'HOUSE'", "HOUSE + 1 == 1", "TRUE == 'TRUE'",
    "1 in HOUSE",
])
def test_type_errors_make_the_match_false(expr: str) -> None:
    assert literal(expr) is False
    # the error aborts the whole evaluation: negating the part does not turn it into TRUE
    assert literal(f"not ({expr})") is False


@pytest.mark.parametrize("expr, expected", [
    ("TRUE or $nope == 1", True), ("FALSE and $nope == 1", False),
    ("not (FALSE and $nope == 1)", True), ("TRUE or 1", True), ("FALSE and 'x'", False),
    ("$nope == 1 or TRUE", False), ("TRUE and $nope == 1", False), ("FALSE or $nope == 1", False),
    ("FALSE or FALSE or TRUE", True), ("TRUE and TRUE and FALSE", False),
])
def test_short_circuit(expr: str, expected: bool) -> None:
    assert literal(expr) is expected


# --- arithmetic conversion table (NS 2.4.3, digest §9.4) -----------------------------------------

def strong(value: float, kind: str) -> Num:
    return Num(value, kind, False)


def weak(value: float, kind: str = "long") -> Num:
    return Num(value, kind, True)


@pytest.mark.parametrize("a, b, kind, is_weak", [
    (weak(1), weak(2), "long", True),
    (weak(1), strong(2, "short"), "short", False),         # the strongly typed operand decides
    (strong(1, "short"), strong(2, "long"), "long", False),
    (strong(1, "ushort"), strong(2, "long"), "long", False),   # shorter unsigned + larger signed: signed
    (strong(1, "ulong"), strong(2, "long"), "ulong", False),
    (strong(1, "long"), strong(2, "longlong"), "longlong", False),
    (strong(1, "ulong"), strong(2, "ulonglong"), "ulonglong", False),
    (weak(1), strong(2, "ulonglong"), "longlong", False),
    (strong(1, "float"), strong(2, "long"), "float", False),
    (strong(1, "float"), weak(2.0, "double"), "double", True),
    (strong(1, "double"), strong(2, "float"), "double", False),
    (strong(1, "longdouble"), strong(2, "double"), "longdouble", False),
    (weak(1), weak(2.0, "double"), "double", True),
])
def test_result_types(a: Num, b: Num, kind: str, is_weak: bool) -> None:
    result = arith("+", a, b)
    assert (result.kind, result.weak) == (kind, is_weak)
    assert result.value == 3


def test_booleans_and_chars_are_weak_longs() -> None:
    assert arith("+", True, weak(1)) == Num(2, "long", True)
    assert arith("*", "A", weak(2)) == Num(130, "long", True)
    assert arith("/", weak(-7), weak(2)) == Num(-3, "long", True)
    with pytest.raises(EvaluationError):
        arith("+", "AB", weak(1))
    with pytest.raises(EvaluationError):
        arith("/", weak(1), weak(0))


def test_enum_comparison_table() -> None:
    with pytest.raises(EvaluationError):
        compare("<", EnumName("A"), EnumName("B"))
    assert compare("==", EnumName("A"), EnumName("A")) is True
    with pytest.raises(EvaluationError):
        compare("==", EnumName("A"), "A")


# --- values from events: basic types --------------------------------------------------------------

NUMBERS = CORBA.Any(E._tc_Numbers, E.Numbers(1, 2, -3, 4, 2 ** 40, 2 ** 63, 0.5, 2.5, 255, "H", True))


@pytest.mark.parametrize("expr, expected", [
    ("$.s + $.us == 3", True), ("$.o == 255", True), ("$.c == 'H'", True), ("$.c == 72", True),
    ("$.c + 1 == 73", True), ("$.b", True), ("$.b == TRUE", True), ("$.b + 1 == 2", True),
    ("$.ull > $.ll", True), ("$.ull + 1 == 9223372036854775809", True), ("$.f * 2 == 1", True),
    ("$.l / 2 == -1", True), ("$.d / 2 == 1.25", True), ("$.ul - 5 == -1", True),
    ("$.s._type_id == 'short'", True), ("$.us._type_id == 'unsigned short'", True),
    ("$.ull._type_id == 'unsigned long long'", True), ("$.c._type_id == 'char'", True),
    ("$._type_id == 'Numbers'", True), ("$._repos_id == 'IDL:EtclTest/Numbers:1.0'", True),
    ("exist $.s._repos_id", False), ("$.s._repos_id == 'x'", False), ("not ($.s._repos_id == 'x')", False),
    ("$.s", False), ("$ == 1", False), ("$.missing == 1", False), ("exist $.missing", False),
    ("exist $.s", True), ("exist $", True), ("$.s._length == 1", False), ("$.s._d == 1", False),
    ("$.0 == 1", True), ("$.10", True), ("$.11 == 1", False),
])
def test_basic_members(expr: str, expected: bool) -> None:
    assert on_any(expr, NUMBERS) is expected


def holder() -> CORBA.Any:
    mem_b = CORBA.Any(CORBA.TC_any, CORBA.Any(CORBA.TC_long, 7))
    value = E.Holder(CORBA.Any(E._tc_X, E.X(1, "b", 3)), mem_b, E.K(5, 42), [[1, 2, 3], [4, 5, 6]],
                     b"\x01\x02\x03", [E.CAR, E.BOAT], ["bob", "eve"], [to_any(7), to_any(8)])
    return CORBA.Any(E._tc_Holder, value)


@pytest.mark.parametrize("expr, expected", [
    ("$.memA.B == 'b'", True), ("$.memA.1 == 'b'", True), ("$.memA.3 == 1", False),
    ("$.memB == 7", True), ("$.memB._type_id == 'long'", True),           # unnamed any layers skipped
    ("$.memA._type_id == 'X'", True),
    ("$.u._d == 5", True), ("$.u.M == 42", True), ("$.u.(5) == 42", True), ("$.u.S == 'x'", False),
    ("exist $.u.M", True), ("exist $.u.N", False), ("exist $.u.nothing", False),
    ("$.grid._length == 2", True), ("$.grid[1]._length == 3", True), ("$.grid[1][2] == 6", True),
    ("$.grid[2][0] == 1", False), ("exist $.grid[1][3]", False), ("exist $.grid[1][2]", True),
    ("$.raw._length == 3", True), ("$.raw[1] == 2", True), ("2 in $.raw", True), ("9 in $.raw", False),
    ("CAR in $.kinds", True), ("HOUSE in $.kinds", False), ("$.kinds[1] == BOAT", True),
    ("'bob' in $.names", True), ("'zed' in $.names", False), ("1 in $.names", False),
    ("not (1 in $.names)", False), ("7 in $.anys", True), ("$.anys[1] == 8", True),
    ("$.names in $.names", False), ("'bob' in $.u", False), ("$.names == 'bob'", False),
    ("$.names._type_id == 'x'", False), ("exist $.names._repos_id", False),
    ("$.u._repos_id == 'IDL:EtclTest/K:1.0'", True), ("$.grid._repos_id == 'IDL:EtclTest/Matrix:1.0'", True),
    ("$.names._length == 2 and $.names[0] ~ 'bobby'", True),
])
def test_constructed_members(expr: str, expected: bool) -> None:
    assert on_any(expr, holder()) is expected


@pytest.mark.parametrize("value, expr, expected", [
    (E.ByKind(E.HOUSE, "street"), "$._d == HOUSE", True),
    (E.ByKind(E.HOUSE, "street"), "$._d == 0", True),
    (E.ByKind(E.HOUSE, "street"), "$.(0) == 'street'", True),
    (E.ByKind(E.HOUSE, "street"), "$.address == 'street'", True),
    (E.ByKind(E.CAR, 4), "$.wheels == 4 and $.(1) == 4", True),
    (E.ByKind(E.CAR, 4), "default $._d", False),
    (E.ByChar("a", 5), "$.('a') == 5 and $._d == 'a'", True),
    (E.ByChar("z", "zed"), "$.() == 'zed' and default $._d", True),
    (E.ByChar("z", "zed"), "$.('a') == 5", False),
    (E.NoDef(1, 9), "not default $._d", True),
    (E.NoDef(1, 9), "$.() == 9", False),
    (E.NoDef(1, 9), "$.(7) == 9", False),
    (E.NoDef(1, 9), "default $", False),
])
def test_unions(value: object, expr: str, expected: bool) -> None:
    tc = omniORB.findTypeCode(value._NP_RepositoryId)  # type: ignore[attr-defined]
    assert on_any(expr, CORBA.Any(tc, value)) is expected


def test_default_on_a_non_union_is_an_error() -> None:
    assert on_any("not default $", NUMBERS) is False


@pytest.mark.parametrize("expr, expected", [
    ("$.\\in == CAR", True), ("$.\\in != HOUSE", True), ("$.\\in > HOUSE", True), ("$.\\in < BOAT", True),
    ("HOUSE < $.\\in", True), ("$.\\in == 1", True), ("$.0 == CAR", True),
    ("$.\\in == 'CAR'", False), ("$.\\in + 1 == 2", False), ("$.\\in == PURPLE", False),
    ("$.\\in != PURPLE", True), ("$.\\in < PURPLE", False), ("$.\\in == TRUE", False),
])
def test_enums(expr: str, expected: bool) -> None:
    assert on_any(expr, CORBA.Any(E._tc_Asset, E.Asset(E.CAR, 1))) is expected


# --- run-time variables (NS 2.4.5) ---------------------------------------------------------------

def test_variable_lookup_order() -> None:
    event = S.structured(event_name="e1", variable={"dup": 1, "priority": 1, "Priority": 2, "only_vh": 3},
                         filterable={"dup": 2, "only_fd": 4, "event_name": "fd"})
    assert compile_constraint("$dup == 1").match_structured(event)                  # header before data
    assert compile_constraint("$only_fd == 4 and $only_vh == 3").match_structured(event)
    assert compile_constraint("$priority == 1 and $Priority == 2").match_structured(event)  # exact first
    assert compile_constraint("$PRIORITY == 1").match_structured(event)            # then case-insensitive
    assert compile_constraint("$event_name == 'e1'").match_structured(event)       # fixed header wins
    assert compile_constraint("$domain_name == 'Telecom'").match_structured(event)
    assert compile_constraint("exist $remainder_of_body").match_structured(event)  # then $.name
    assert not compile_constraint("exist $nothing").match_structured(event)


def test_curtime_is_reserved_unless_escaped() -> None:
    event = S.structured(filterable={"curtime": 5})
    assert compile_constraint("$\\curtime == 5").match_structured(event) is True
    assert compile_constraint("$curtime == 5").match_structured(event) is False
    assert compile_constraint("$curtime == 123").match_structured(event, now=123) is True
    assert compile_constraint("$curtime.time == 123 and $curtime.tdf == 0").match_structured(event, now=123)
    assert compile_constraint("$curtime.high == 1 and $curtime.low == 7").match_structured(
        event, now=(1 << 32) + 7)
    assert compile_constraint("$curtime._type_id == 'UtcT'").match_structured(event)


def test_curtime_defaults_to_the_current_time() -> None:
    day_ago = (time.time_ns() // 100) + UUID_EPOCH_OFFSET - 864_000_000_000
    assert compile_constraint(f"$curtime > {day_ago}").match_any(to_any(1)) is True
    assert compile_constraint(f"$curtime < {day_ago}").match_any(to_any(1)) is False


def test_any_events() -> None:
    assert on_any("$ == 5", CORBA.Any(CORBA.TC_long, 5)) is True
    assert on_any("$ == 'x' and $._type_id == 'char'", CORBA.Any(CORBA.TC_char, "x")) is True
    nv = CORBA.Any(N._tc_PropertySeq, [N.Property("sev", to_any(4))])
    assert on_any("$sev == 4 and $(sev) == 4 and $SEV == 4", nv) is True
    assert on_any("$other == 4", nv) is False
    wrapped = CORBA.Any(N._tc_StructuredEvent, S.structured(variable={"Priority": 3}))
    assert on_any("$type_name == 'CommunicationsAlarm' and $Priority == 3", wrapped) is True
    assert on_any("$type_name == 'x'", to_any(5)) is False


def test_typed_events() -> None:
    props = [N.Property("event_type", CORBA.Any(N._tc_EventType, N.EventType("IDL:Mod/If:1.0", "op"))),
             N.Property("severity", to_any(4))]
    c = compile_constraint
    assert c("$severity == 4 and $(severity) == 4").match_typed(props) is True
    assert c("$event_type.type_name == 'op'").match_typed(props) is True
    assert c("$type_name == '%TYPED' and $domain_name == '' and $event_name == ''").match_typed(props)
    assert c("$._length == 2 and $[1].name == 'severity'").match_typed(props) is True
    assert c("$missing == 1").match_typed(props) is False
    assert c("").match_typed(props) is True


def test_malformed_values_give_false_not_exceptions() -> None:
    assert on_any("$ == 1", CORBA.Any(CORBA.TC_long, "abc")) is False
    assert on_any("$.A == 1", CORBA.Any(E._tc_X, 5)) is False
    assert on_any("$[0] == 1", CORBA.Any(CORBA.TypeCode("IDL:omg.org/CORBA/OctetSeq:1.0"), 5)) is False
    assert on_any("$._d == 1", CORBA.Any(E._tc_K, 5)) is False
    assert on_any("$.memB == 1", CORBA.Any(E._tc_Holder, E.Holder(1, 2, 3, 4, 5, 6, 7, 8))) is False
