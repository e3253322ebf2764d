"""Property tests: arbitrary text and random token sequences given to compile_constraint raise nothing
but EtclSyntaxError, and compiled constraints never raise on random events (each call is bounded by a
hypothesis deadline)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import omniORB  # noqa: F401
from omniORB import CORBA
from omniORB.any import to_any

import CosNotification as N

from router.etcl import Constraint, EtclSyntaxError, compile_constraint

FAST = settings(deadline=timedelta(milliseconds=500), database=None, max_examples=300,
                suppress_health_check=[HealthCheck.too_slow])

TOKENS = [
    "and", "or", "not", "exist", "default", "in", "TRUE", "FALSE", "==", "!=", "<", "<=", ">", ">=",
    "+", "-", "*", "/", "~", "(", ")", "$", "$.", "$.a", "$.b", "$.a.b", "$x", "$priority", "$Priority",
    "$type_name", "$domain_name", "$event_name", "$curtime", "$\\curtime", "$.header.variable_header",
    "(Priority)", "[0]", "[1]", ".0", ".1", "._length", "._d", "._type_id", "._repos_id", ".()", ".(1)",
    ".('a')", "$(x)", "$.\\in", "HOUSE", "\\in", "0", "1", "2.5", "-3", "+4", "1e3", ".5", "'a'", "'abc'",
    "'it\\'s'", "x", "y", "[", "]", ".", "'", "\\", ":v:", ",", "=", "!", "$_", "$1",
]

SCALARS = st.one_of(st.integers(-2 ** 31, 2 ** 31 - 1), st.floats(allow_nan=True), st.text(max_size=5),
                    st.booleans())
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(["a", "b", "x", "priority", "header"]), inner,
                                            min_size=1, max_size=3)),
    max_leaves=10,
)
NAMES = st.sampled_from(["a", "b", "x", "priority", "Priority", "curtime", "threshold", "in"])


def _any(value: Any) -> Any:
    try:
        return to_any(value)
    except CORBA.BAD_PARAM:
        return CORBA.Any(CORBA.TC_null, None)


@st.composite
def structured_events(draw: st.DrawFn) -> Any:
    def props() -> list[Any]:
        return [N.Property(name, _any(draw(VALUES))) for name in draw(st.lists(NAMES, max_size=3))]

    event_type = N.EventType(draw(st.text(max_size=4)), draw(st.text(max_size=4)))
    header = N.EventHeader(N.FixedEventHeader(event_type, draw(st.text(max_size=4))), props())
    return N.StructuredEvent(header, props(), _any(draw(VALUES)))


def _exercise(c: Constraint, event: Any, value: Any) -> None:
    assert c.match_structured(event, now=12345) in (True, False)
    assert c.match_any(_any(value)) in (True, False)
    assert c.match_typed(list(event.filterable_data)) in (True, False)


@FAST
@given(st.text(max_size=120))
def test_random_text_only_raises_syntax_errors(text: str) -> None:
    try:
        compile_constraint(text)
    except EtclSyntaxError as exc:
        assert 0 <= exc.position <= len(text)


@FAST
@given(st.lists(st.sampled_from(TOKENS), max_size=30), st.sampled_from([" ", ""]),
       structured_events(), VALUES)
def test_random_token_sequences(tokens: list[str], sep: str, event: Any, value: Any) -> None:
    text = sep.join(tokens)
    try:
        c = compile_constraint(text)
    except EtclSyntaxError as exc:
        assert 0 <= exc.position <= len(text)
        return
    _exercise(c, event, value)


TEMPLATES = st.sampled_from([
    "$.a == {v}", "$.a.b > {v}", "$a + {v} < 3", "$priority >= {v}", "{v} in $.a", "{v} ~ $.x",
    "exist $.a[1] and $.a[1] != {v}", "$.a._length == {v} or $x / {v} == 1", "$(x) == {v}",
    "$.header.variable_header(priority) * {v} > 0", "not ($.b == {v}) or $.b.a == {v}",
    "$._type_id == {v} or $._repos_id == {v}", "default $._d or $.(1) == {v} or $.() == {v}",
])
LITERALS = st.sampled_from(["0", "1", "-1", "2.5", "'a'", "'abc'", "TRUE", "FALSE", "HOUSE", "1e300"])


@FAST
@given(TEMPLATES, LITERALS, structured_events(), VALUES)
def test_valid_constraints_never_raise_on_random_events(template: str, literal: str, event: Any,
                                                        value: Any) -> None:
    _exercise(compile_constraint(template.format(v=literal)), event, value)
