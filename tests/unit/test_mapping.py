"""NS <-> JMS mapping rules (NJI 2.4-2.5 with the digest's corrections): QoS, names, bodies, errors."""

from __future__ import annotations  # noqa: I001  (omniORB must be imported before the COS stubs)

import json
import pickle
from collections.abc import Sequence
from typing import Any

import omniORB
import pytest
from omniORB import CORBA

import CosNotification as N
import CosNotifyChannelAdmin as CA
import TimeBase

from router.jms.model import BodyType, DeliveryMode, Destination, JmsMessage, JmsType, Typed
from router.mapping import MappingError, event_to_jms, jms_to_event
from router.mapping import qos
from router.mapping.times import ChannelTimeSupport
from router.mapping.compare import event_equal
from router.mapping.names import is_identifier

NOW = 1_700_000_000_000
DEST = Destination("queue", "alarms")
P = N.Property


@pytest.fixture(autouse=True, scope="module")
def orb() -> Any:
    return CORBA.ORB_init([], CORBA.ORB_ID)


def utc(ms: int) -> Any:
    return CORBA.Any(TimeBase._tc_UtcT, TimeBase.UtcT(qos.ms_to_utc(ms), 0, 0, 0))


def event(ohf: Sequence[Any] = (), fd: Sequence[Any] = (), body: Any = None, *, domain: str = "Telecom",
          type_name: str = "Alarm", name: str = "e1") -> Any:
    fixed = N.FixedEventHeader(N.EventType(domain, type_name), name)
    return N.StructuredEvent(N.EventHeader(fixed, list(ohf)), list(fd),
                             body if body is not None else CORBA.Any(CORBA.TC_null, None))


def short(name: str, value: int) -> Any:
    return P(name, CORBA.Any(CORBA.TC_short, value))


def to_jms(ev: Any, **kw: Any) -> JmsMessage:
    return event_to_jms(ev, DEST, now_ms=NOW, **kw)


SUPPORTED = ChannelTimeSupport(stop_time=True, start_time=True)


def roundtrip(ev: Any) -> None:
    back = jms_to_event(to_jms(ev), times=SUPPORTED, now_ms=NOW)
    assert event_equal(back, ev)


# ------------------------------------------------------------------------------------------------ priority
@pytest.mark.parametrize("ns, jms", [(-32767, 0), (-32768, 0), (-5, 0), (0, 0), (1, 1), (4, 4), (8, 8), (9, 9),
                                     (100, 9), (32767, 9)])
def test_priority_table_ns_to_jms(ns: int, jms: int) -> None:
    msg = to_jms(event([short("Priority", ns)]))
    assert msg.priority == jms
    assert msg.properties["$ohf_Priority"] == Typed(JmsType.SHORT, ns)   # the full NS value stays selectable


def test_priority_absent_is_jms_default_4() -> None:
    assert to_jms(event()).priority == 4


@pytest.mark.parametrize("jms", range(10))
def test_priority_table_jms_to_ns_is_identity(jms: int) -> None:
    ev = jms_to_event(JmsMessage(BodyType.TEXT, "x", DEST, priority=jms))
    prio = next(p for p in ev.header.variable_header if p.name == "Priority").value
    assert prio.typecode().equal(CORBA.TC_short) and prio.value() == jms


def test_jms_priority_out_of_range_is_an_error() -> None:
    with pytest.raises(MappingError) as info:
        jms_to_event(JmsMessage(BodyType.TEXT, "x", DEST, priority=12))
    assert info.value.field == "JMSPriority"


# ------------------------------------------------------------------------------------------------ reliability
@pytest.mark.parametrize("value, mode", [(0, DeliveryMode.NON_PERSISTENT), (1, DeliveryMode.PERSISTENT)])
def test_event_reliability_to_delivery_mode(value: int, mode: DeliveryMode) -> None:
    assert to_jms(event([short("EventReliability", value)])).delivery_mode == mode


def test_absent_reliability_is_persistent_unless_configured() -> None:
    assert to_jms(event()).delivery_mode == DeliveryMode.PERSISTENT
    assert to_jms(event(), default_persistent=False).delivery_mode == DeliveryMode.NON_PERSISTENT


def test_bad_reliability_value_is_an_error() -> None:
    with pytest.raises(MappingError) as info:
        to_jms(event([short("EventReliability", 7)]))
    assert info.value.field == "EventReliability"


def test_bad_qos_type_is_an_error() -> None:
    with pytest.raises(MappingError) as info:
        to_jms(event([P("Priority", CORBA.Any(CORBA.TC_string, "high"))]))
    assert info.value.field == "Priority"
    with pytest.raises(MappingError):
        to_jms(event([P("StopTime", CORBA.Any(CORBA.TC_ulonglong, 5))]))


@pytest.mark.parametrize("mode, value", [(DeliveryMode.PERSISTENT, 1), (DeliveryMode.NON_PERSISTENT, 0)])
def test_delivery_mode_to_event_reliability(mode: DeliveryMode, value: int) -> None:
    ev = jms_to_event(JmsMessage(BodyType.TEXT, "x", DEST, delivery_mode=mode))
    rel = ev.header.variable_header[0]
    assert rel.name == "EventReliability" and rel.value.value() == value
    assert rel.value.typecode().equal(CORBA.TC_short)


# ------------------------------------------------------------------------------------------------ times
def test_time_constants() -> None:
    assert qos.utc_to_ms(qos.UTC_EPOCH_OFFSET) == 0                     # 1970-01-01 in UtcT
    assert qos.ms_to_utc(0) == 122_192_928_000_000_000
    assert qos.utc_to_ms(0) == -12_219_292_800_000                      # 1582-10-15 is 141,427 days earlier
    assert qos.timet_to_ms(10_000) == 1 and qos.timet_to_ms(9_999) == 0
    assert qos.ms_to_timet(1) == 10_000
    assert qos.utc_to_ms(qos.ms_to_utc(NOW)) == NOW


def test_timeout_is_relative_100ns() -> None:
    msg = to_jms(event([P("Timeout", CORBA.Any(TimeBase._tc_TimeT, 5 * 10_000_000))]))   # 5 s
    assert msg.expiration == NOW + 5000


def test_timeout_zero_means_no_expiry() -> None:
    assert to_jms(event([P("Timeout", CORBA.Any(TimeBase._tc_TimeT, 0))])).expiration == 0
    assert to_jms(event()).expiration == 0


def test_stop_time_is_absolute() -> None:
    assert to_jms(event([P("StopTime", utc(NOW + 1234))])).expiration == NOW + 1234


@pytest.mark.parametrize("timeout_ms, stop_ms, expected", [(5000, 2000, NOW + 2000), (1000, 9000, NOW + 1000)])
def test_earliest_of_timeout_and_stop_time_wins(timeout_ms: int, stop_ms: int, expected: int) -> None:
    ohf = [P("Timeout", CORBA.Any(TimeBase._tc_TimeT, timeout_ms * 10_000)), P("StopTime", utc(NOW + stop_ms))]
    assert to_jms(event(ohf)).expiration == expected


def test_stop_time_before_1970_is_already_expired_not_never() -> None:
    ohf = [P("StopTime", CORBA.Any(TimeBase._tc_UtcT, TimeBase.UtcT(0, 0, 0, 0)))]
    assert to_jms(event(ohf)).expiration == 1


def test_start_time_to_delivery_time() -> None:
    assert to_jms(event([P("StartTime", utc(NOW + 60_000))])).delivery_time == NOW + 60_000
    assert to_jms(event()).delivery_time == 0


def test_jms_times_to_stop_and_start_time_when_the_channel_supports_them() -> None:
    ev = jms_to_event(JmsMessage(BodyType.TEXT, "x", DEST, expiration=NOW + 5, delivery_time=NOW + 7),
                      times=SUPPORTED, now_ms=NOW)
    vh = {p.name: p.value for p in ev.header.variable_header}
    assert "Timeout" not in vh                                           # NJI erratum: not Timeout
    assert vh["StopTime"].typecode().equivalent(TimeBase._tc_UtcT)
    assert vh["StopTime"].value().time == qos.ms_to_utc(NOW + 5) and vh["StopTime"].value().tdf == 0
    assert vh["StartTime"].value().time == qos.ms_to_utc(NOW + 7)


def test_jms_zero_times_are_omitted() -> None:
    ev = jms_to_event(JmsMessage(BodyType.TEXT, "x", DEST))
    assert [p.name for p in ev.header.variable_header] == ["EventReliability", "Priority"]


# ------------------------------------------------------------------------------------------------ headers
def test_fixed_header_and_type() -> None:
    msg = to_jms(event(domain="Telecom", type_name="CommunicationsAlarm", name="link-7"))
    assert msg.jms_type == "Structured Event"
    assert msg.properties["$domain_name"] == Typed(JmsType.STRING, "Telecom")
    assert msg.properties["$type_name"] == Typed(JmsType.STRING, "CommunicationsAlarm")
    assert msg.properties["$event_name"] == Typed(JmsType.STRING, "link-7")
    assert msg.destination == DEST and msg.timestamp == NOW and msg.message_id is None


def test_all_property_names_are_legal_jms_identifiers() -> None:
    fd = [P("a.b-c d", CORBA.Any(CORBA.TC_long, 1)), P("NULL", CORBA.Any(CORBA.TC_long, 2)),
          P("JMSType", CORBA.Any(CORBA.TC_long, 3)), P("é", CORBA.Any(CORBA.TC_long, 4)),
          P("", CORBA.Any(CORBA.TC_long, 5)), P("x", CORBA.Any(N._tc_EventType, N.EventType("d", "t")))]
    msg = to_jms(event([short("Priority", 3)], fd))
    for name in msg.properties:
        assert is_identifier(name), name
        assert "." not in name and not name.startswith("JMS")
    assert msg.properties["$fd_a_b_c_d"].value == 1
    assert msg.properties["$fd_x__domain_name"].value == "d"


def test_name_collisions_get_suffixes_and_still_round_trip() -> None:
    fd = [P("a.b", CORBA.Any(CORBA.TC_long, 1)), P("a-b", CORBA.Any(CORBA.TC_long, 2)),
          P("a", CORBA.Any(N._tc_EventType, N.EventType("x", "y"))),
          P("a__domain_name", CORBA.Any(CORBA.TC_long, 3))]
    msg = to_jms(event([], fd))
    assert msg.properties["$fd_a_b"].value == 1 and msg.properties["$fd_a_b_2"].value == 2
    assert msg.properties["$fd_a__domain_name"].value == "x"
    assert msg.properties["$fd_a__domain_name_2"].value == 3
    roundtrip(event([], fd))


def test_struct_is_flattened_with_double_underscore_nested() -> None:
    fh = N.FixedEventHeader(N.EventType("D", "T"), "n")
    msg = to_jms(event([], [P("hdr", CORBA.Any(N._tc_FixedEventHeader, fh))]))
    assert msg.properties["$fd_hdr__event_type__domain_name"] == Typed(JmsType.STRING, "D")
    assert msg.properties["$fd_hdr__event_type__type_name"] == Typed(JmsType.STRING, "T")
    assert msg.properties["$fd_hdr__event_name"] == Typed(JmsType.STRING, "n")


@pytest.mark.parametrize("tc, value, expected", [
    (CORBA.TC_boolean, True, Typed(JmsType.BOOLEAN, True)),
    (CORBA.TC_octet, 200, Typed(JmsType.SHORT, 200)),
    (CORBA.TC_char, "c", Typed(JmsType.STRING, "c")),
    (CORBA.TC_short, -3, Typed(JmsType.SHORT, -3)),
    (CORBA.TC_ushort, 65535, Typed(JmsType.INT, 65535)),
    (CORBA.TC_long, -(2**31), Typed(JmsType.INT, -(2**31))),
    (CORBA.TC_ulong, 2**32 - 1, Typed(JmsType.LONG, 2**32 - 1)),
    (CORBA.TC_longlong, 2**63 - 1, Typed(JmsType.LONG, 2**63 - 1)),
    (CORBA.TC_ulonglong, 2**63 - 1, Typed(JmsType.LONG, 2**63 - 1)),
    (CORBA.TC_ulonglong, 2**64 - 1, Typed(JmsType.STRING, str(2**64 - 1))),
    (CORBA.TC_float, 0.5, Typed(JmsType.FLOAT, 0.5)),
    (CORBA.TC_double, 0.1, Typed(JmsType.DOUBLE, 0.1)),
    (CORBA.TC_string, "s", Typed(JmsType.STRING, "s")),
    (CORBA.TC_wstring, "€", Typed(JmsType.STRING, "€")),
    (CA._tc_ClientType, CA.SEQUENCE_EVENT, Typed(JmsType.STRING, "SEQUENCE_EVENT")),
])
def test_leaf_property_types(tc: Any, value: Any, expected: Typed) -> None:
    ev = event([], [P("v", CORBA.Any(tc, value))])
    assert to_jms(ev).properties["$fd_v"] == expected
    roundtrip(ev)


def test_complex_property_is_base64_cdr_and_round_trips() -> None:
    ev = event([], [P("seq", CORBA.Any(CORBA._tc_LongSeq, [1, 2, 3]))])
    msg = to_jms(ev)
    assert msg.properties["$fd_seq"].type == JmsType.STRING
    manifest = json.loads(str(msg.properties["$nsjms_idl"].value))
    assert manifest["fd"] == [["seq", "cdr", ["$fd_seq"]]]
    roundtrip(ev)


def test_standard_qos_round_trips_with_full_ns_values() -> None:
    ohf = [short("Priority", 100), short("EventReliability", 0), P("StopTime", utc(NOW + 10)),
           P("Timeout", CORBA.Any(TimeBase._tc_TimeT, 770_077)), P("StartTime", utc(NOW - 3)), short("user", 1)]
    roundtrip(event(ohf))      # (a Timeout under 1 ms would have expired by the time it is mapped back)


# ------------------------------------------------------------------------------------------------ bodies NS -> JMS
def test_string_body_is_text() -> None:
    msg = to_jms(event(body=CORBA.Any(CORBA.TC_string, "hello")))
    assert (msg.body_type, msg.body) == (BodyType.TEXT, "hello")


def test_property_seq_body_is_map() -> None:
    props = [P("count", CORBA.Any(CORBA.TC_long, 42)), P("name", CORBA.Any(CORBA.TC_string, "link-down")),
             P("raw", CORBA.Any(CORBA._tc_OctetSeq, b"\x00\x01")), P("c", CORBA.Any(CORBA.TC_char, "z")),
             P("deep", CORBA.Any(CORBA._tc_LongSeq, [5]))]
    ev = event(body=CORBA.Any(N._tc_PropertySeq, props))
    msg = to_jms(ev)
    assert msg.body_type == BodyType.MAP
    assert isinstance(msg.body, dict)
    assert msg.body["count"] == Typed(JmsType.INT, 42)
    assert msg.body["name"] == Typed(JmsType.STRING, "link-down")
    assert msg.body["raw"] == Typed(JmsType.BYTES, b"\x00\x01")
    assert msg.body["c"] == Typed(JmsType.CHAR, "z")
    assert msg.body["deep"].type == JmsType.BYTES                        # CDR of the Any
    roundtrip(ev)


def test_property_seq_with_duplicate_names_falls_back_to_cdr() -> None:
    props = [P("a", CORBA.Any(CORBA.TC_long, 1)), P("a", CORBA.Any(CORBA.TC_long, 2))]
    ev = event(body=CORBA.Any(N._tc_PropertySeq, props))
    msg = to_jms(ev)
    assert msg.body_type == BodyType.BYTES and msg.properties["$body_encoding"].value == "cdr-any"
    roundtrip(ev)


def test_any_seq_of_basic_values_is_stream() -> None:
    items = [CORBA.Any(CORBA.TC_long, 1), CORBA.Any(CORBA.TC_string, "x"), CORBA.Any(CORBA.TC_boolean, True),
             CORBA.Any(CORBA.TC_double, 2.5)]
    ev = event(body=CORBA.Any(CORBA._tc_AnySeq, items))
    msg = to_jms(ev)
    assert msg.body_type == BodyType.STREAM
    assert msg.body == [Typed(JmsType.INT, 1), Typed(JmsType.STRING, "x"), Typed(JmsType.BOOLEAN, True),
                        Typed(JmsType.DOUBLE, 2.5)]
    roundtrip(ev)


@pytest.mark.parametrize("tc, value", [(CORBA._tc_LongSeq, [1, -2]), (CORBA._tc_CharSeq, "ab"),
                                       (CORBA.TC_long, 9), (CORBA._tc_StringSeq, [])])
def test_typed_sequences_and_single_values_are_streams(tc: Any, value: Any) -> None:
    ev = event(body=CORBA.Any(tc, value))
    assert to_jms(ev).body_type == BodyType.STREAM
    roundtrip(ev)


def test_octet_sequence_is_bytes() -> None:
    ev = event(body=CORBA.Any(CORBA._tc_OctetSeq, b"\x00\xff"))
    msg = to_jms(ev)
    assert (msg.body_type, msg.body) == (BodyType.BYTES, b"\x00\xff")
    assert "$body_encoding" not in msg.properties
    roundtrip(ev)


def test_other_body_is_cdr_encapsulated_any() -> None:
    ev = event(body=CORBA.Any(TimeBase._tc_UtcT, TimeBase.UtcT(5, 1, 2, 3)))
    msg = to_jms(ev)
    assert msg.body_type == BodyType.BYTES and msg.properties["$body_encoding"].value == "cdr-any"
    decoded = omniORB.cdrUnmarshal(CORBA.TC_any, msg.body)
    assert decoded.typecode().equivalent(TimeBase._tc_UtcT) and decoded.value().tdf == 3
    roundtrip(ev)


def test_no_body_is_plain_message() -> None:
    msg = to_jms(event())
    assert (msg.body_type, msg.body) == (BodyType.MESSAGE, None)
    roundtrip(event())


# ------------------------------------------------------------------------------------------------ JMS -> NS
@pytest.mark.parametrize("body_type, body, type_name", [
    (BodyType.TEXT, "hi", "%TextMessage"), (BodyType.BYTES, b"\x01", "%BytesMessage"),
    (BodyType.MAP, {"k": Typed(JmsType.INT, 1)}, "%MapMessage"),
    (BodyType.STREAM, [Typed(JmsType.LONG, 1)], "%StreamMessage"),
    (BodyType.OBJECT, b"\xac\xed", "%ObjectMessage"), (BodyType.MESSAGE, None, "%Message")])
def test_foreign_fixed_header(body_type: BodyType, body: object, type_name: str) -> None:
    ev = jms_to_event(JmsMessage(body_type, body, Destination("topic", "prices")))
    assert ev.header.fixed_header.event_type.domain_name == ""
    assert ev.header.fixed_header.event_type.type_name == type_name
    assert ev.header.fixed_header.event_name == "prices"


def test_foreign_bodies() -> None:
    text = jms_to_event(JmsMessage(BodyType.TEXT, "hi", DEST)).remainder_of_body
    assert text.typecode().equal(CORBA.TC_string) and text.value() == "hi"
    for kind in (BodyType.BYTES, BodyType.OBJECT):
        raw = jms_to_event(JmsMessage(kind, b"\x01\x02", DEST)).remainder_of_body
        assert raw.typecode().equivalent(CORBA._tc_OctetSeq) and raw.value() == b"\x01\x02"
    body = {"n": Typed(JmsType.SHORT, 5), "s": Typed(JmsType.STRING, "x"), "b": Typed(JmsType.BYTES, b"\x09")}
    mapped = jms_to_event(JmsMessage(BodyType.MAP, body, DEST)).remainder_of_body
    assert mapped.typecode().equivalent(N._tc_PropertySeq)
    got = {p.name: p.value for p in mapped.value()}
    assert got["n"].typecode().equal(CORBA.TC_short) and got["n"].value() == 5
    assert got["b"].value() == b"\x09"
    stream = jms_to_event(JmsMessage(BodyType.STREAM, [Typed(JmsType.DOUBLE, 1.5), Typed(JmsType.CHAR, "q")],
                                     DEST)).remainder_of_body
    assert stream.typecode().equivalent(CORBA._tc_AnySeq)
    assert [a.value() for a in stream.value()] == [1.5, "q"]
    assert stream.value()[1].typecode().equal(CORBA.TC_wchar)
    none = jms_to_event(JmsMessage(BodyType.MESSAGE, None, DEST)).remainder_of_body
    assert none.typecode().equal(CORBA.TC_null)


def test_foreign_headers_and_properties_to_filterable_data() -> None:
    props = {"flag": Typed(JmsType.BOOLEAN, True), "b": Typed(JmsType.BYTE, -1), "s": Typed(JmsType.SHORT, -2),
             "i": Typed(JmsType.INT, 3), "l": Typed(JmsType.LONG, 2**40), "f": Typed(JmsType.FLOAT, 0.5),
             "d": Typed(JmsType.DOUBLE, 0.25), "str": Typed(JmsType.STRING, "v"),
             "JMSXDeliveryCount": Typed(JmsType.INT, 2)}
    msg = JmsMessage(BodyType.TEXT, "x", DEST, timestamp=NOW, message_id="ID:1", correlation_id="c-1",
                     reply_to=Destination("topic", "replies"), jms_type="car", redelivered=True, properties=props)
    fd = {p.name: p.value for p in jms_to_event(msg).filterable_data}
    assert fd["JMSType"].value() == "car" and fd["JMSMessageID"].value() == "ID:1"
    assert fd["JMSTimestamp"].typecode().equal(CORBA.TC_longlong) and fd["JMSTimestamp"].value() == NOW
    assert fd["JMSReplyTo"].value() == "/topic/replies" and fd["JMSCorrelationID"].value() == "c-1"
    assert fd["JMSDestination"].value() == "/queue/alarms" and fd["JMSRedelivered"].value() is True
    expected = {"flag": CORBA.TC_boolean, "b": CORBA.TC_octet, "s": CORBA.TC_short, "i": CORBA.TC_long,
                "l": CORBA.TC_longlong, "f": CORBA.TC_float, "d": CORBA.TC_double, "str": CORBA.TC_string,
                "JMSXDeliveryCount": CORBA.TC_long}
    for name, tc in expected.items():
        assert fd[name].typecode().equal(tc), name
    assert fd["b"].value() == 255                                         # Java byte -1 as octet (two's complement)


def test_foreign_null_headers_are_omitted() -> None:
    fd = [p.name for p in jms_to_event(JmsMessage(BodyType.TEXT, "x")).filterable_data]
    assert fd == ["JMSRedelivered"]


def test_foreign_nji_message_uses_dollar_fixed_header() -> None:
    props = {"$domain_name": Typed(JmsType.STRING, "D"), "$type_name": Typed(JmsType.STRING, "T"),
             "$event_name": Typed(JmsType.STRING, "E")}
    ev = jms_to_event(JmsMessage(BodyType.TEXT, "x", DEST, jms_type="Structured Event", properties=props))
    assert ev.header.fixed_header.event_type.type_name == "T" and ev.header.fixed_header.event_name == "E"


# ------------------------------------------------------------------------------------------------ errors
def test_mapping_error_is_picklable_and_names_the_field() -> None:
    err = pickle.loads(pickle.dumps(MappingError("too big", "remainder_of_body")))
    assert (err.reason, err.field) == ("too big", "remainder_of_body")
    assert "remainder_of_body" in str(err)


def test_invalid_utf8_text_body_is_an_error() -> None:
    with pytest.raises(MappingError) as info:
        jms_to_event(JmsMessage(BodyType.TEXT, b"\xff\xfe", DEST))
    assert "UTF-8" in info.value.reason
    with pytest.raises(MappingError):
        jms_to_event(JmsMessage(BodyType.TEXT, "bad \udcff", DEST))
    with pytest.raises(MappingError):
        to_jms(event(body=CORBA.Any(CORBA.TC_wstring, "bad \ud800")))


def test_oversized_bodies_are_errors_both_ways() -> None:
    with pytest.raises(MappingError) as info:
        to_jms(event(body=CORBA.Any(CORBA._tc_OctetSeq, b"x" * 101)), max_body_bytes=100)
    assert info.value.field == "remainder_of_body"
    to_jms(event(body=CORBA.Any(CORBA._tc_OctetSeq, b"x" * 100)), max_body_bytes=100)
    with pytest.raises(MappingError):
        jms_to_event(JmsMessage(BodyType.TEXT, "é" * 51, DEST), max_body_bytes=100)   # 102 UTF-8 bytes
    jms_to_event(JmsMessage(BodyType.TEXT, "é" * 50, DEST), max_body_bytes=100)


def test_unknown_body_type_is_an_error() -> None:
    with pytest.raises(MappingError):
        jms_to_event(JmsMessage("weird", b"", DEST))  # type: ignore[arg-type]
    with pytest.raises(MappingError):
        jms_to_event(JmsMessage(BodyType.MAP, [1, 2], DEST))


@pytest.mark.parametrize("value", [Typed(JmsType.INT, 2**40), Typed(JmsType.CHAR, "c"),
                                   Typed(JmsType.BYTES, b"x"), Typed(JmsType.BOOLEAN, 1),
                                   Typed(JmsType.STRING, 5), Typed(JmsType.BYTE, 300)])
def test_unrepresentable_property_is_an_error(value: Typed) -> None:
    with pytest.raises(MappingError) as info:
        jms_to_event(JmsMessage(BodyType.TEXT, "x", DEST, properties={"p": value}))
    assert info.value.field == "property:p"


def test_tampered_round_trip_message_is_an_error_not_a_guess() -> None:
    msg = to_jms(event([short("Priority", 3)]))
    props = dict(msg.properties)
    del props["$ohf_Priority"]
    with pytest.raises(MappingError) as info:
        jms_to_event(JmsMessage(msg.body_type, msg.body, DEST, jms_type=msg.jms_type, properties=props))
    assert info.value.field == "property:$ohf_Priority"
    props = dict(msg.properties, **{"$nsjms_idl": Typed(JmsType.STRING, "{not json")})
    with pytest.raises(MappingError):
        jms_to_event(JmsMessage(msg.body_type, msg.body, DEST, jms_type=msg.jms_type, properties=props))


def test_string_typed_properties_are_parsed_back_on_the_round_trip() -> None:
    """After STOMP without the types header every property is a String; the manifest still restores types."""
    ev = event([short("Priority", 100)], [P("n", CORBA.Any(CORBA.TC_ulong, 7)),
                                          P("ok", CORBA.Any(CORBA.TC_boolean, True)),
                                          P("x", CORBA.Any(CORBA.TC_float, 0.5))])
    msg = to_jms(ev)
    as_strings = {k: Typed(JmsType.STRING, str(v.value).lower() if v.type == JmsType.BOOLEAN else str(v.value))
                  for k, v in msg.properties.items()}
    back = jms_to_event(JmsMessage(msg.body_type, msg.body, DEST, jms_type=msg.jms_type, properties=as_strings))
    assert event_equal(back, ev)
