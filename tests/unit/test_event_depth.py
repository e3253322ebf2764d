"""Deeply nested events are refused at the channel's door with ``BAD_PARAM`` ``COMPLETED_NO`` (issue 31).

An Any nested 5,000 deep used to make ``size_bound`` raise ``RecursionError``, which the supplier saw as
``UNKNOWN COMPLETED_MAYBE``. The channel now refuses values nested deeper than ``MAX_EVENT_DEPTH`` levels with
``BAD_PARAM`` (minor ``MINOR_EVENT_TOO_DEEP``), whatever the shape (nested Anys, nested sequence TypeCodes, shapes
the size bound does not model), and accepts events within the limit.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_event_size_bound import _channel, _Source

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)
from omniORB import CORBA, tcInternal

import CosNotification as N

from router.channel.boundary import MINOR_EVENT_TOO_DEEP
from router.channel.events import Event, Form
from router.channel.sizing import MAX_EVENT_DEPTH, EventTooDeep, check_depth, size_bound
from router.mapping.limits import MAX_VALUE_DEPTH


@pytest.fixture(autouse=True, scope="module")
def orb() -> Any:
    return CORBA.ORB_init(["test", "-ORBnativeCharCodeSet", "UTF-8"], CORBA.ORB_ID)  # as the node


def nested_any(levels: int) -> Any:
    value = CORBA.Any(CORBA.TC_long, 1)
    for _ in range(levels):
        value = CORBA.Any(CORBA.TC_any, value)
    return value


def nested_sequence(levels: int) -> Any:
    tc, value = CORBA.TC_long, 1
    for _ in range(levels):
        tc, value = tcInternal.createSequenceTC(0, tc), [value]
    return CORBA.Any(tc, value)


def nested_union_free_objref(levels: int) -> Any:
    """Nested Anys around an object reference: a shape ``size_bound`` does not model (it answers None)."""
    value = CORBA.Any(CORBA.TypeCode("IDL:omg.org/CORBA/Object:1.0"), None)
    for _ in range(levels):
        value = CORBA.Any(CORBA.TC_any, value)
    return value


def structured(body: Any) -> Event:
    header = N.EventHeader(N.FixedEventHeader(N.EventType("D", "T"), "e"), [])
    return Event(Form.STRUCTURED, N.StructuredEvent(header, [N.Property("x", body)], CORBA.Any(CORBA.TC_null, None)))


def test_the_limit_is_above_what_the_jms_mapping_accepts() -> None:
    assert MAX_EVENT_DEPTH > MAX_VALUE_DEPTH + 10     # a bridge's mapped events are never refused for depth


@pytest.mark.parametrize("make", [nested_any, nested_sequence, nested_union_free_objref])
def test_5000_levels_are_refused_with_bad_param_completed_no(make: Any) -> None:
    for event in (structured(make(5000)), Event(Form.ANY, make(5000))):
        ch, proxy = _channel(8 * 1024 * 1024, persistent=False)
        with pytest.raises(CORBA.BAD_PARAM) as info:
            ch.route(_Source(), [event])
        assert info.value.minor == MINOR_EVENT_TOO_DEEP
        assert info.value.completed == CORBA.COMPLETED_NO
        assert proxy.records == []


@pytest.mark.parametrize(("make", "deepest"), [(nested_any, 20000), (nested_sequence, 1500)])
def test_size_bound_never_raises_recursion_error(make: Any, deepest: int) -> None:
    for levels in (MAX_EVENT_DEPTH + 1, deepest):     # (nested sequence TypeCodes take long to build)
        with pytest.raises(EventTooDeep):
            size_bound(Event(Form.ANY, make(levels)))


def test_check_depth_is_iterative() -> None:
    with pytest.raises(EventTooDeep):
        check_depth(Event(Form.ANY, nested_union_free_objref(50000)))
    check_depth(Event(Form.ANY, nested_union_free_objref(100)))


@pytest.mark.parametrize("make", [nested_any, nested_sequence, nested_union_free_objref])
def test_events_within_the_limit_are_accepted(make: Any) -> None:
    ch, proxy = _channel(8 * 1024 * 1024, persistent=False)
    ch.route(_Source(), [structured(make(MAX_VALUE_DEPTH))])
    assert len(proxy.records) == 1


def test_a_deep_event_the_channel_accepted_maps_to_jms_or_is_a_mapping_error() -> None:
    """Channel -> JMS: an accepted event nested 500 levels is either mapped or refused with MappingError (which
    the bridge dead-letters with the reason), never a RecursionError."""
    from router.jms.model import Destination
    from router.mapping.errors import MappingError
    from router.mapping.to_jms import event_to_jms

    for make in (nested_any, nested_sequence):
        ev = structured(make(500))
        ch, proxy = _channel(8 * 1024 * 1024, persistent=False)
        ch.route(_Source(), [ev])                       # within the channel's limit
        assert len(proxy.records) == 1
        try:
            event_to_jms(ev.value, Destination("queue", "q"), now_ms=1)
        except MappingError as exc:
            assert "nested too deeply" in str(exc)
