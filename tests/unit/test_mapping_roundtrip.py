"""Property-based round trips: ``jms_to_event(event_to_jms(e)) == e``, directly and through a STOMP frame."""

from __future__ import annotations  # noqa: I001  (omniORB must be imported before the COS stubs)

from collections.abc import Callable
from typing import Any

import omniORB  # noqa: F401
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omniORB import CORBA

import CosNotification as N
import CosNotifyChannelAdmin as CA
import TimeBase

from router.channel import qos as channel_qos
from router.jms.model import Destination, JmsMessage
from router.mapping import event_to_jms, jms_to_event
from router.mapping.errors import MessageExpired
from router.mapping.times import ChannelTimeSupport
from router.mapping.compare import event_equal
from router.mapping.stomp_body import message_from_stomp, message_to_stomp

NOW = 1_700_000_000_000
LATIN1 = st.text(st.characters(min_codepoint=1, max_codepoint=255), max_size=12)   # IDL string, default codeset
# no NUL: an IDL wstring cannot hold one (omniORB refuses to marshal it), and a STOMP header cannot carry one
WIDE = st.text(st.characters(codec="utf-8", min_codepoint=1, max_codepoint=0xFFFF), max_size=12)   # no surrogates


@pytest.fixture(autouse=True, scope="module")
def orb() -> Any:
    return CORBA.ORB_init([], CORBA.ORB_ID)


def ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


LEAVES: list[tuple[Any, st.SearchStrategy[Any]]] = [
    (CORBA.TC_boolean, st.booleans()), (CORBA.TC_octet, ints(0, 255)),
    (CORBA.TC_char, st.characters(min_codepoint=1, max_codepoint=255)),
    (CORBA.TC_short, ints(-(2**15), 2**15 - 1)), (CORBA.TC_ushort, ints(0, 2**16 - 1)),
    (CORBA.TC_long, ints(-(2**31), 2**31 - 1)), (CORBA.TC_ulong, ints(0, 2**32 - 1)),
    (CORBA.TC_longlong, ints(-(2**63), 2**63 - 1)), (CORBA.TC_ulonglong, ints(0, 2**64 - 1)),
    (CORBA.TC_float, st.floats(width=32)), (CORBA.TC_double, st.floats()),
    (CORBA.TC_string, LATIN1), (CORBA.TC_wstring, WIDE), (TimeBase._tc_TimeT, ints(0, 2**64 - 1)),
    (CA._tc_ClientType, st.sampled_from([CA.ANY_EVENT, CA.STRUCTURED_EVENT, CA.SEQUENCE_EVENT])),
]


def _as_any(tc: Any) -> Callable[[Any], Any]:
    return lambda v: CORBA.Any(tc, v)


leaf_any = st.one_of(*[s.map(_as_any(tc)) for tc, s in LEAVES])
utc_value = st.builds(TimeBase.UtcT, ints(0, 2**64 - 1), ints(0, 2**32 - 1), ints(0, 2**16 - 1), ints(-720, 720))
struct_any = st.one_of(
    utc_value.map(lambda u: CORBA.Any(TimeBase._tc_UtcT, u)),
    st.builds(N.EventType, LATIN1, LATIN1).map(lambda e: CORBA.Any(N._tc_EventType, e)),
    st.builds(lambda d, t, n: N.FixedEventHeader(N.EventType(d, t), n), LATIN1, LATIN1, LATIN1)
    .map(lambda f: CORBA.Any(N._tc_FixedEventHeader, f)))
complex_any = st.one_of(
    st.lists(ints(-(2**31), 2**31 - 1), max_size=4).map(lambda v: CORBA.Any(CORBA._tc_LongSeq, v)),
    st.lists(leaf_any, max_size=3).map(lambda v: CORBA.Any(CORBA._tc_AnySeq, v)),
    st.binary(max_size=8).map(lambda v: CORBA.Any(CORBA._tc_OctetSeq, v)),
    st.just(CORBA.Any(CORBA.TC_null, None)))
value_any = st.one_of(leaf_any, struct_any, complex_any)
names = st.one_of(st.sampled_from(["a", "a.b", "a_b", "a__b", "$x", "NULL", "JMSType", "", "é-1"]), LATIN1)
prop = st.builds(N.Property, names, value_any)
qos_prop = st.one_of(
    ints(0, 1).map(lambda v: N.Property("EventReliability", CORBA.Any(CORBA.TC_short, v))),
    ints(-32767, 32767).map(lambda v: N.Property("Priority", CORBA.Any(CORBA.TC_short, v))),
    ints(0, 2**40).map(lambda v: N.Property("Timeout", CORBA.Any(TimeBase._tc_TimeT, v))),
    utc_value.map(lambda u: N.Property("StopTime", CORBA.Any(TimeBase._tc_UtcT, u))),
    utc_value.map(lambda u: N.Property("StartTime", CORBA.Any(TimeBase._tc_UtcT, u))))
body = st.one_of(
    LATIN1.map(lambda s: CORBA.Any(CORBA.TC_string, s)), WIDE.map(lambda s: CORBA.Any(CORBA.TC_wstring, s)),
    st.lists(st.builds(N.Property, names, value_any), max_size=4).map(lambda v: CORBA.Any(N._tc_PropertySeq, v)),
    st.lists(leaf_any, max_size=4).map(lambda v: CORBA.Any(CORBA._tc_AnySeq, v)),
    st.lists(st.floats(), max_size=4).map(lambda v: CORBA.Any(CORBA._tc_DoubleSeq, v)),
    st.binary(max_size=16).map(lambda v: CORBA.Any(CORBA._tc_OctetSeq, v)),
    leaf_any, struct_any, st.just(CORBA.Any(CORBA.TC_null, None)), st.just(CORBA.Any(CORBA.TC_void, None)))
events = st.builds(
    lambda d, t, n, ohf, fd, b: N.StructuredEvent(
        N.EventHeader(N.FixedEventHeader(N.EventType(d, t), n), ohf), fd, b),
    LATIN1, LATIN1, LATIN1, st.lists(st.one_of(qos_prop, prop), max_size=5), st.lists(prop, max_size=5), body)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


SUPPORTED = ChannelTimeSupport(stop_time=True, start_time=True)


def back(msg: JmsMessage) -> Any:
    """Map back into a channel that honours StopTime/StartTime, at the last moment before the message expires
    (an expired message is refused with MessageExpired, tested in test_mapping_times.py)."""
    return jms_to_event(msg, times=SUPPORTED, now_ms=msg.expiration - 1 if msg.expiration else NOW)


@SETTINGS
@given(events)
def test_round_trip(ev: Any) -> None:
    msg = event_to_jms(ev, Destination("topic", "t"), now_ms=NOW)
    assert event_equal(back(msg), ev)


@SETTINGS
@given(events)
def test_round_trip_through_a_stomp_frame(ev: Any) -> None:
    frame = message_to_stomp(event_to_jms(ev, Destination("queue", "q"), now_ms=NOW), now_ms=NOW)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in frame.headers.items())
    assert event_equal(back(message_from_stomp(frame.headers, frame.body)), ev)


def test_equality_helper_detects_differences() -> None:
    """The oracle itself must be able to fail."""
    def ev(v: Any) -> Any:
        return N.StructuredEvent(N.EventHeader(N.FixedEventHeader(N.EventType("", ""), ""), []),
                                 [N.Property("x", v)], CORBA.Any(CORBA.TC_null, None))
    assert event_equal(ev(CORBA.Any(CORBA.TC_long, 1)), ev(CORBA.Any(CORBA.TC_long, 1)))
    assert not event_equal(ev(CORBA.Any(CORBA.TC_long, 1)), ev(CORBA.Any(CORBA.TC_long, 2)))
    assert not event_equal(ev(CORBA.Any(CORBA.TC_long, 1)), ev(CORBA.Any(CORBA.TC_ulong, 1)))
    assert not event_equal(ev(CORBA.Any(CORBA.TC_double, 0.0)), ev(CORBA.Any(CORBA.TC_double, -0.0)))
    assert not event_equal(ev(CORBA.Any(CORBA.TC_ulonglong, 5)), ev(CORBA.Any(TimeBase._tc_TimeT, 5)))


STRICT_PROXY = {N.StopTimeSupported: False, N.StartTimeSupported: False, N.ConnectionReliability: 1}
LENIENT_PROXY = {N.StopTimeSupported: True, N.StartTimeSupported: True, N.ConnectionReliability: 1}


@SETTINGS
@given(events)
def test_by_default_a_channel_without_time_support_accepts_what_comes_back(ev: Any) -> None:
    """Whatever a channel supporting StopTime/StartTime accepts, one supporting neither accepts after the default
    mapping (issue 7: expiring JMS messages were refused with BAD_QOS and dead-lettered)."""
    try:
        channel_qos.event_qos(LENIENT_PROXY, ev.header.variable_header)
    except channel_qos.EventQoSError:
        return                                  # the original itself is not acceptable QoS: nothing to compare
    msg = event_to_jms(ev, Destination("queue", "q"), now_ms=NOW)
    try:
        mapped = jms_to_event(msg, now_ms=msg.expiration - 1 if msg.expiration else NOW)
    except MessageExpired:
        return                                  # its StopTime lies before the send time
    channel_qos.event_qos(STRICT_PROXY, mapped.header.variable_header)
    names_back = [p.name for p in mapped.header.variable_header]
    assert "StopTime" not in names_back and "StartTime" not in names_back
    kept = [p for p in ev.header.variable_header if p.name not in ("StopTime", "StartTime", "Timeout")]
    assert [p.name for p in kept] == [n for n in names_back if n != "Timeout"]
