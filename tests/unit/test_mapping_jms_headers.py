"""JMS headers and properties around nsjms-made messages (issue 7, NJI 2.4.1) and request/reply (NJI 2.4)."""

from __future__ import annotations  # noqa: I001  (omniORB must be imported before the COS stubs)

from typing import Any

import omniORB  # noqa: F401
import pytest
from omniORB import CORBA

import CosNotification as N

from router.jms.model import BodyType, Destination, JmsMessage, JmsType, Typed
from router.mapping import MappingError, event_to_jms, jms_to_event
from router.mapping.compare import event_equal
from router.mapping.stomp_body import message_from_stomp, message_to_stomp

NOW = 1_700_000_000_000
DEST = Destination("queue", "q")
P = N.Property


@pytest.fixture(autouse=True, scope="module")
def orb() -> Any:
    return CORBA.ORB_init([], CORBA.ORB_ID)


def event(fd: list[Any]) -> Any:
    return N.StructuredEvent(N.EventHeader(N.FixedEventHeader(N.EventType("d", "t"), "e"),
                                           [P("Priority", CORBA.Any(CORBA.TC_short, 2))]),
                             fd, CORBA.Any(CORBA.TC_string, "body"))


def string(name: str, value: str) -> Any:
    return P(name, CORBA.Any(CORBA.TC_string, value))


def fd_of(ev: Any) -> list[tuple[str, Any]]:
    return [(p.name, p.value.value()) for p in ev.filterable_data]


# ------------------------------------------------------------------------------------------------ NJI 2.4.1
def test_what_the_jms_side_added_to_an_nsjms_message_reaches_filterable_data() -> None:
    """Before: for a message with the manifest, JMSRedelivered, JMSXDeliveryCount, JMSMessageID and properties a
    JMS application added were all dropped."""
    original = event([P("n", CORBA.Any(CORBA.TC_long, 7))])
    frame = message_to_stomp(event_to_jms(original, DEST, now_ms=NOW))
    headers = dict(frame.headers, **{"message-id": "ID:broker-1", "redelivered": "true", "JMSXDeliveryCount": "2",
                                     "JMSXGroupID": "g", "region": "eu", "weight": "1.5",
                                     "nsjms_types": frame.headers.get("nsjms_types", "") + ",weight=double"})
    back = jms_to_event(message_from_stomp(headers, frame.body), now_ms=NOW)
    fd = back.filterable_data
    assert event_equal(N.StructuredEvent(back.header, fd[:1], back.remainder_of_body), original)  # exact prefix
    assert fd_of(back)[1:] == [("JMSMessageID", "ID:broker-1"), ("JMSRedelivered", True),
                               ("JMSXDeliveryCount", 2), ("JMSXGroupID", "g"), ("region", "eu"), ("weight", 1.5)]
    types = {p.name: p.value.typecode() for p in fd}
    assert types["JMSXDeliveryCount"].equal(CORBA.TC_long) and types["weight"].equal(CORBA.TC_double)
    assert types["JMSRedelivered"].equal(CORBA.TC_boolean)


def test_an_unchanged_nsjms_message_still_gives_back_exactly_its_event() -> None:
    original = event([P("n", CORBA.Any(CORBA.TC_long, 7)), string("JMSCorrelationID", "c-1")])
    frame = message_to_stomp(event_to_jms(original, DEST, now_ms=NOW))
    assert event_equal(jms_to_event(message_from_stomp(frame.headers, frame.body), now_ms=NOW), original)


def test_unmappable_added_property_is_a_mapping_error() -> None:
    msg = event_to_jms(event([]), DEST, now_ms=NOW)
    props = dict(msg.properties, extra=Typed(JmsType.INT, 2**40))
    with pytest.raises(MappingError) as info:
        jms_to_event(JmsMessage(msg.body_type, msg.body, DEST, jms_type=msg.jms_type, properties=props), now_ms=NOW)
    assert info.value.field == "property:extra"


# ------------------------------------------------------------------------------------------------ request/reply
def test_correlation_id_and_reply_to_come_from_filterable_data() -> None:
    """Before: event -> JMS never set JMSCorrelationID or JMSReplyTo, so request/reply broke."""
    msg = event_to_jms(event([string("JMSCorrelationID", "req-42"), string("JMSReplyTo", "/queue/replies")]),
                       DEST, now_ms=NOW)
    assert msg.correlation_id == "req-42" and msg.reply_to == Destination("queue", "replies")
    headers = message_to_stomp(msg).headers
    assert headers["correlation-id"] == "req-42" and headers["reply-to"] == "/queue/replies"


def test_a_jms_request_round_trips_its_correlation_id_and_reply_to() -> None:
    """JMS request -> event (NJI 2.4.1 names) -> a reply event copying them -> JMS: the requester can match it."""
    request = JmsMessage(BodyType.TEXT, "q?", DEST, message_id="ID:7", correlation_id="corr-1",
                         reply_to=Destination("temp-queue", "ID:host-1:1:1"))
    ev = jms_to_event(request, now_ms=NOW)
    fd = dict(fd_of(ev))
    reply = event_to_jms(event([string("JMSCorrelationID", fd["JMSCorrelationID"]),
                                string("JMSReplyTo", fd["JMSReplyTo"])]), DEST, now_ms=NOW)
    assert reply.correlation_id == "corr-1" and reply.reply_to == Destination("temp-queue", "ID:host-1:1:1")
    forwarded = event_to_jms(ev, DEST, now_ms=NOW)                      # the request event itself, forwarded
    assert forwarded.correlation_id == "corr-1" and forwarded.reply_to == request.reply_to


def test_wstring_correlation_id_is_accepted() -> None:
    msg = event_to_jms(event([P("JMSCorrelationID", CORBA.Any(CORBA.TC_wstring, "w-1"))]), DEST, now_ms=NOW)
    assert msg.correlation_id == "w-1"


@pytest.mark.parametrize("entry", [
    P("JMSCorrelationID", CORBA.Any(CORBA.TC_long, 5)), P("JMSReplyTo", CORBA.Any(CORBA.TC_long, 5)),
    string("JMSReplyTo", "replies"), string("JMSReplyTo", "/queue/"), string("JMSReplyTo", "")])
def test_entries_that_cannot_be_the_header_set_none_and_still_round_trip(entry: Any) -> None:
    """An NS supplier may use these names for something else: no header, but the entry is not lost."""
    original = event([entry])
    msg = event_to_jms(original, DEST, now_ms=NOW)
    assert msg.correlation_id is None and msg.reply_to is None
    frame = message_to_stomp(msg)
    assert "correlation-id" not in frame.headers and "reply-to" not in frame.headers
    assert event_equal(jms_to_event(message_from_stomp(frame.headers, frame.body), now_ms=NOW), original)


def test_a_changed_correlation_id_on_an_nsjms_message_is_reported_not_duplicated() -> None:
    original = event([string("JMSCorrelationID", "c-1")])
    msg = event_to_jms(original, DEST, now_ms=NOW)
    same = JmsMessage(msg.body_type, msg.body, DEST, jms_type=msg.jms_type, properties=msg.properties,
                      correlation_id="c-1", reply_to=None)
    assert event_equal(jms_to_event(same, now_ms=NOW), original)
    changed = JmsMessage(msg.body_type, msg.body, DEST, jms_type=msg.jms_type, properties=msg.properties,
                         correlation_id="c-2", reply_to=Destination("topic", "r"))
    assert fd_of(jms_to_event(changed, now_ms=NOW)) == [("JMSCorrelationID", "c-1"), ("JMSCorrelationID", "c-2"),
                                                         ("JMSReplyTo", "/topic/r")]
