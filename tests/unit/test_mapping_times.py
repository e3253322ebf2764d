"""JMS -> channel times (issue 7): StopTime/StartTime fitted to what the channel accepts (NS 2.5.5.3-4), expiry."""

from __future__ import annotations  # noqa: I001  (omniORB must be imported before the COS stubs)

import pickle
from typing import Any

import omniORB  # noqa: F401
import pytest
from omniORB import CORBA

import CosNotification as N
import TimeBase

from router.channel import qos as channel_qos
from router.jms.model import BodyType, Destination, JmsMessage
from router.mapping import MappingError, event_to_jms, jms_to_event
from router.mapping import qos
from router.mapping.compare import any_equal, event_equal
from router.mapping.errors import MessageExpired
from router.mapping.times import ChannelTimeSupport
from router.mapping.to_event import map_message

NOW = 1_700_000_000_000
DEST = Destination("queue", "q")
P = N.Property
SUPPORTED = ChannelTimeSupport(stop_time=True, start_time=True)
#: a proxy consumer that honours neither per-event time (the channel's QoS FALSE)
STRICT_PROXY = {N.StopTimeSupported: False, N.StartTimeSupported: False, N.ConnectionReliability: 1}


@pytest.fixture(autouse=True, scope="module")
def orb() -> Any:
    return CORBA.ORB_init([], CORBA.ORB_ID)


def utc(ms: int) -> Any:
    return CORBA.Any(TimeBase._tc_UtcT, TimeBase.UtcT(qos.ms_to_utc(ms), 0, 0, 0))


def header(ev: Any) -> dict[str, Any]:
    return {p.name: p.value for p in ev.header.variable_header}


def expiring(**kw: Any) -> JmsMessage:
    return JmsMessage(BodyType.TEXT, "x", DEST, **kw)


# ------------------------------------------------------------------------------------------------ channel accepts
def test_by_default_an_expiring_message_becomes_an_event_a_strict_channel_accepts() -> None:
    """Before: StopTime in the header, which a channel with StopTimeSupported=FALSE refuses (BAD_QOS)."""
    ev = jms_to_event(expiring(expiration=NOW + 5_000, delivery_time=NOW + 7_000), now_ms=NOW)
    channel_qos.event_qos(STRICT_PROXY, ev.header.variable_header)      # raises EventQoSError when refused
    vh = header(ev)
    assert "StopTime" not in vh and "StartTime" not in vh
    assert vh["Timeout"].typecode().equivalent(TimeBase._tc_TimeT)
    assert vh["Timeout"].value() == 5_000 * qos.TICKS_PER_MS          # remaining lifetime, relative
    moved = ev.filterable_data[-2:]                                     # the originals, kept for consumers
    assert [p.name for p in moved] == ["StopTime", "StartTime"]
    assert any_equal(moved[0].value, utc(NOW + 5_000)) and any_equal(moved[1].value, utc(NOW + 7_000))


def test_a_start_time_in_the_future_the_channel_cannot_honour_is_reported() -> None:
    mapped = map_message(expiring(delivery_time=NOW + 7_000), now_ms=NOW)
    assert len(mapped.notes) == 1 and "7000 ms in the future" in mapped.notes[0]
    assert map_message(expiring(delivery_time=NOW - 1), now_ms=NOW).notes == ()     # already due: nothing changes


def test_the_channel_refuses_what_the_old_mapping_produced() -> None:
    """The premise: the channel's own check refuses a StopTime when StopTimeSupported is FALSE."""
    ev = jms_to_event(expiring(expiration=NOW + 5_000), times=SUPPORTED, now_ms=NOW)
    with pytest.raises(channel_qos.EventQoSError):
        channel_qos.event_qos(STRICT_PROXY, ev.header.variable_header)


def test_a_channel_that_supports_the_times_gets_them_unchanged() -> None:
    ev = jms_to_event(expiring(expiration=NOW + 5_000, delivery_time=NOW + 7_000), times=SUPPORTED, now_ms=NOW)
    vh = header(ev)
    assert any_equal(vh["StopTime"], utc(NOW + 5_000)) and any_equal(vh["StartTime"], utc(NOW + 7_000))
    assert "Timeout" not in vh and [p.name for p in ev.filterable_data][-1] == "JMSRedelivered"


def test_only_the_unsupported_time_is_converted() -> None:
    only_stop = jms_to_event(expiring(expiration=NOW + 5, delivery_time=NOW + 7),
                             times=ChannelTimeSupport(stop_time=True), now_ms=NOW)
    assert set(header(only_stop)) == {"EventReliability", "Priority", "StopTime"}
    only_start = jms_to_event(expiring(expiration=NOW + 5, delivery_time=NOW + 7),
                              times=ChannelTimeSupport(start_time=True), now_ms=NOW)
    assert set(header(only_start)) == {"EventReliability", "Priority", "Timeout", "StartTime"}


def test_nsjms_events_get_the_earlier_of_timeout_and_stop_time() -> None:
    ev = N.StructuredEvent(N.EventHeader(N.FixedEventHeader(N.EventType("d", "t"), "e"), [
        P("Timeout", CORBA.Any(TimeBase._tc_TimeT, 60_000 * qos.TICKS_PER_MS)), P("StopTime", utc(NOW + 9_000)),
        P("Priority", CORBA.Any(CORBA.TC_short, 3))]), [], CORBA.Any(CORBA.TC_null, None))
    msg = event_to_jms(ev, DEST, now_ms=NOW)
    back = jms_to_event(msg, now_ms=NOW + 1_000)
    assert [p.name for p in back.header.variable_header] == ["Timeout", "Priority"]
    assert header(back)["Timeout"].value() == 8_000 * qos.TICKS_PER_MS  # StopTime was 8 s away, Timeout 60 s
    assert [p.name for p in back.filterable_data] == ["StopTime"]
    channel_qos.event_qos(STRICT_PROXY, back.header.variable_header)
    assert event_equal(jms_to_event(msg, times=SUPPORTED, now_ms=NOW + 1_000), ev)   # exact when supported


@pytest.mark.parametrize("qos_in, expected", [
    ([P(N.StopTimeSupported, CORBA.Any(CORBA.TC_boolean, True)),
      P(N.StartTimeSupported, CORBA.Any(CORBA.TC_boolean, False))], ChannelTimeSupport(True, False)),
    ({N.StopTimeSupported: False, N.StartTimeSupported: True}, ChannelTimeSupport(False, True)),
    ({N.StartTimeSupported: CORBA.Any(CORBA.TC_boolean, True)}, ChannelTimeSupport(False, True)),
    ([], ChannelTimeSupport()), ({N.StopTimeSupported: 1}, ChannelTimeSupport())])
def test_support_from_the_proxy_qos(qos_in: Any, expected: ChannelTimeSupport) -> None:
    assert ChannelTimeSupport.from_qos(qos_in) == expected


# ------------------------------------------------------------------------------------------------ expiry
@pytest.mark.parametrize("expiration", [-1, -(2**62), 1, NOW - 1, NOW])
def test_an_expired_or_negative_expiration_raises_message_expired(expiration: int) -> None:
    """Before: a negative expiration became a StopTime before 1970 and the event vanished in the channel."""
    with pytest.raises(MessageExpired) as info:
        jms_to_event(expiring(expiration=expiration), now_ms=NOW)
    assert isinstance(info.value, MappingError) and info.value.field == "JMSExpiration"
    assert (info.value.expiration, info.value.now_ms) == (expiration, NOW)
    for times in (SUPPORTED, ChannelTimeSupport()):
        with pytest.raises(MessageExpired):
            jms_to_event(expiring(expiration=expiration), times=times, now_ms=NOW)


def test_zero_never_expires_and_a_future_expiration_is_kept() -> None:
    assert "Timeout" not in header(jms_to_event(expiring(expiration=0), now_ms=NOW))
    assert header(jms_to_event(expiring(expiration=NOW + 1), now_ms=NOW))["Timeout"].value() == qos.TICKS_PER_MS


def test_an_nsjms_message_past_its_stop_time_is_expired() -> None:
    ev = N.StructuredEvent(N.EventHeader(N.FixedEventHeader(N.EventType("d", "t"), "e"), [
        P("StopTime", utc(NOW + 100))]), [], CORBA.Any(CORBA.TC_null, None))
    msg = event_to_jms(ev, DEST, now_ms=NOW)
    with pytest.raises(MessageExpired):
        jms_to_event(msg, now_ms=NOW + 100)
    stripped = JmsMessage(msg.body_type, msg.body, DEST, jms_type=msg.jms_type, properties=msg.properties)
    with pytest.raises(MessageExpired) as info:          # the StopTime itself, even without JMSExpiration
        jms_to_event(stripped, now_ms=NOW + 100)
    assert info.value.field == "StopTime"


def test_message_expired_is_picklable() -> None:
    err = pickle.loads(pickle.dumps(MessageExpired(5, 9)))
    assert isinstance(err, MessageExpired) and (err.expiration, err.now_ms, err.field) == (5, 9, "JMSExpiration")
    assert "4 ms before" in str(err)


def test_out_of_range_jms_times_are_mapping_errors() -> None:
    """Before: a StopTime/JMSTimestamp outside the IDL type's range, which the channel then fails to encode."""
    for msg in (expiring(expiration=2**62), expiring(delivery_time=2**62), expiring(timestamp=2**70)):
        with pytest.raises(MappingError):
            jms_to_event(msg, times=SUPPORTED, now_ms=NOW)
