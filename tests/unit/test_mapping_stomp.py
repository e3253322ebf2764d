"""Typed properties and bodies across STOMP (ActiveMQ's header/body conventions), without a broker."""

from __future__ import annotations

import json
import math

import pytest

from router.jms.model import BodyType, DeliveryMode, Destination, JmsMessage, JmsType, Typed
from router.mapping import MappingError
from router.mapping.stomp_body import map_from_json, map_to_json, message_from_stomp, message_to_stomp
from router.mapping.typed_props import from_stomp_headers, to_stomp_headers

DEST = Destination("queue", "q")
PROPS = {"flag": Typed(JmsType.BOOLEAN, False), "b": Typed(JmsType.BYTE, -128), "s": Typed(JmsType.SHORT, 7),
         "i": Typed(JmsType.INT, -(2**31)), "l": Typed(JmsType.LONG, 2**63 - 1), "f": Typed(JmsType.FLOAT, 0.5),
         "d": Typed(JmsType.DOUBLE, 0.1), "str": Typed(JmsType.STRING, "42"), "$odd": Typed(JmsType.INT, 1)}


def test_property_types_survive_stomp_headers() -> None:
    msg = JmsMessage(BodyType.TEXT, "x", DEST, properties=PROPS)
    headers = to_stomp_headers(msg)
    assert all(isinstance(v, str) for v in headers.values())
    assert headers["i"] == "-2147483648" and headers["flag"] == "false" and headers["d"] == "0.1"
    assert "str=" not in headers["nsjms_types"]                          # Strings are the default
    _, props = from_stomp_headers(headers)
    assert props == PROPS


def test_without_types_header_properties_are_strings() -> None:
    _, props = from_stomp_headers({"destination": "/queue/q", "n": "5", "JMSXDeliveryCount": "3"})
    assert props == {"n": Typed(JmsType.STRING, "5"), "JMSXDeliveryCount": Typed(JmsType.INT, 3)}


def test_non_finite_floats_use_java_spelling() -> None:
    props = {"a": Typed(JmsType.DOUBLE, math.inf), "b": Typed(JmsType.FLOAT, -math.inf),
             "c": Typed(JmsType.DOUBLE, math.nan)}
    headers = to_stomp_headers(JmsMessage(BodyType.TEXT, "", DEST, properties=props))
    assert (headers["a"], headers["b"], headers["c"]) == ("Infinity", "-Infinity", "NaN")
    _, back = from_stomp_headers(headers)
    assert back["a"].value == math.inf and math.isnan(float(back["c"].value))


def test_type_names_with_separators_are_escaped() -> None:
    props = {"a,b=c%": Typed(JmsType.INT, 1)}
    headers = to_stomp_headers(JmsMessage(BodyType.TEXT, "", DEST, properties=props))
    assert headers["nsjms_types"] == "a%2Cb%3Dc%25=int"
    assert from_stomp_headers(headers)[1] == props


def test_standard_headers_both_ways() -> None:
    msg = JmsMessage(BodyType.TEXT, "x", DEST, delivery_mode=DeliveryMode.NON_PERSISTENT, priority=7,
                     expiration=1000, delivery_time=5000, timestamp=900, correlation_id="c",
                     reply_to=Destination("topic", "r"), jms_type="Structured Event")
    headers = to_stomp_headers(msg, now_ms=1000)
    assert headers["persistent"] == "false" and headers["priority"] == "7" and headers["expires"] == "1000"
    assert headers["reply-to"] == "/topic/r" and headers["type"] == "Structured Event"
    assert headers["AMQ_SCHEDULED_DELAY"] == "4000" and headers["nsjms_delivery_time"] == "5000"
    std, props = from_stomp_headers(headers)
    assert props == {}
    assert (std.delivery_mode, std.priority, std.expiration, std.delivery_time, std.timestamp) == (
        DeliveryMode.NON_PERSISTENT, 7, 1000, 5000, 900)
    assert std.reply_to == Destination("topic", "r") and std.destination == DEST
    assert to_stomp_headers(JmsMessage(BodyType.TEXT, "x"))["persistent"] == "true"   # STOMP default is not


def test_activemq_message_frame_headers() -> None:
    headers = {"message-id": "ID:x-1", "destination": "/topic/t", "expires": "0", "priority": "4",
               "timestamp": "123", "redelivered": "true", "subscription": "s1", "ack": "a1", "color": "blue"}
    std, props = from_stomp_headers(headers)
    assert std.message_id == "ID:x-1" and std.redelivered and std.delivery_mode == DeliveryMode.NON_PERSISTENT
    assert props == {"color": Typed(JmsType.STRING, "blue")}


@pytest.mark.parametrize("name", ["priority", "content-length", "nsjms_types", "transformation"])
def test_property_colliding_with_a_frame_header_is_an_error(name: str) -> None:
    with pytest.raises(MappingError):
        to_stomp_headers(JmsMessage(BodyType.TEXT, "", DEST, properties={name: Typed(JmsType.STRING, "1")}))


@pytest.mark.parametrize("value", [Typed(JmsType.CHAR, "c"), Typed(JmsType.BYTES, b"x"),
                                   Typed(JmsType.INT, 2**31), Typed(JmsType.STRING, 3)])
def test_unsendable_property_is_an_error(value: Typed) -> None:
    with pytest.raises(MappingError):
        to_stomp_headers(JmsMessage(BodyType.TEXT, "", DEST, properties={"p": value}))


def test_malformed_received_values_are_errors() -> None:
    with pytest.raises(MappingError):
        from_stomp_headers({"n": "x", "nsjms_types": "n=int"})
    with pytest.raises(MappingError):
        from_stomp_headers({"n": "1", "nsjms_types": "n=char"})
    with pytest.raises(MappingError):
        from_stomp_headers({"destination": "q"})


# ------------------------------------------------------------------------------------------------ bodies
MAP_BODY = {"count": Typed(JmsType.INT, 42), "name": Typed(JmsType.STRING, "link-down"),
            "load": Typed(JmsType.DOUBLE, 0.5), "big": Typed(JmsType.LONG, 2**62), "c": Typed(JmsType.CHAR, "x"),
            "raw": Typed(JmsType.BYTES, b"\x00\xff"), "ok": Typed(JmsType.BOOLEAN, True),
            "nan": Typed(JmsType.FLOAT, math.inf)}


@pytest.mark.parametrize("body_type, body", [
    (BodyType.TEXT, "héllo\x00world"), (BodyType.BYTES, b"\x00\x01\xff"), (BodyType.MAP, MAP_BODY),
    (BodyType.STREAM, [Typed(JmsType.SHORT, 1), Typed(JmsType.STRING, "s"), Typed(JmsType.BYTES, b"b")]),
    (BodyType.OBJECT, b"\xac\xed\x00\x05"), (BodyType.MESSAGE, None), (BodyType.TEXT, "")])
def test_bodies_survive_a_stomp_frame(body_type: BodyType, body: object) -> None:
    msg = JmsMessage(body_type, body, DEST, properties={"p": Typed(JmsType.INT, 1)}, timestamp=5)
    frame = message_to_stomp(msg)
    assert isinstance(frame.body, bytes)
    assert message_from_stomp(frame.headers, frame.body) == msg


def test_map_frame_uses_activemq_transformation_without_content_length() -> None:
    frame = message_to_stomp(JmsMessage(BodyType.MAP, {"count": Typed(JmsType.INT, 42)}, DEST))
    assert frame.headers["transformation"] == "jms-map-json" and "content-length" not in frame.headers
    assert json.loads(frame.body) == {"map": {"entry": [{"string": "count", "int": 42}]}}


def test_text_and_bytes_frames_declare_their_type() -> None:
    text = message_to_stomp(JmsMessage(BodyType.TEXT, "é", DEST))
    assert text.headers["amq-msg-type"] == "text" and text.headers["content-length"] == "2"
    raw = message_to_stomp(JmsMessage(BodyType.BYTES, b"abc", DEST))
    assert raw.headers["amq-msg-type"] == "bytes"
    stream = message_to_stomp(JmsMessage(BodyType.STREAM, [], DEST))
    assert stream.headers["nsjms_body"] == "stream" and stream.headers["amq-msg-type"] == "bytes"


def test_activemq_map_json_shapes() -> None:
    doc = ('{"map":{"entry":[{"string":"count","int":42},{"string":["name","link-down"]},'
           '{"string":"load","double":0.5}]}}')
    assert map_from_json(doc) == {"count": Typed(JmsType.INT, 42), "name": Typed(JmsType.STRING, "link-down"),
                                  "load": Typed(JmsType.DOUBLE, 0.5)}
    assert map_from_json('{"map":{"entry":{"string":"n","long":"7"}}}') == {"n": Typed(JmsType.LONG, 7)}
    assert map_from_json('{"map":""}') == {}
    assert map_from_json(map_to_json(MAP_BODY)) == MAP_BODY


def test_received_activemq_frames() -> None:
    text = message_from_stomp({"destination": "/queue/q", "message-id": "ID:1"}, b"hi")
    assert (text.body_type, text.body) == (BodyType.TEXT, "hi")
    raw = message_from_stomp({"destination": "/queue/q", "content-length": "2"}, b"\x00\x01")
    assert (raw.body_type, raw.body) == (BodyType.BYTES, b"\x00\x01")
    mapped = message_from_stomp({"destination": "/queue/q", "transformation": "jms-map-json"},
                                b'{"map":{"entry":{"string":"a","short":3}}}')
    assert mapped.body == {"a": Typed(JmsType.SHORT, 3)} and "transformation" not in mapped.properties


@pytest.mark.parametrize("headers, body", [
    ({}, b"\xff\xfe"), ({"transformation": "jms-map-json"}, b"not json"),
    ({"transformation": "jms-map-json"}, b'{"map":{"entry":[{"string":"a","widget":1}]}}'),
    ({"nsjms_body": "stream"}, b'[{"int":"x"}]'), ({"nsjms_body": "teapot"}, b"")])
def test_malformed_frames_are_errors(headers: dict[str, str], body: bytes) -> None:
    with pytest.raises(MappingError):
        message_from_stomp(headers, body)


def test_unsendable_bodies_are_errors() -> None:
    with pytest.raises(MappingError):
        message_to_stomp(JmsMessage(BodyType.TEXT, "bad \udcff", DEST))
    with pytest.raises(MappingError):
        message_to_stomp(JmsMessage(BodyType.BYTES, "not bytes", DEST))
    with pytest.raises(MappingError):
        message_to_stomp(JmsMessage(BodyType.MAP, {"a": 1}, DEST))


def test_many_properties_fit_in_a_stomp_header_line() -> None:
    """A large manifest is packed (z: + base64 zlib) below ActiveMQ's 10 KiB header-line limit and round-trips."""
    import omniORB
    from omniORB import CORBA

    CORBA.ORB_init([], CORBA.ORB_ID)
    import CosNotification

    from router.jms.model import Destination
    from router.mapping import event_to_jms, jms_to_event
    from router.mapping.compare import event_equal
    from router.mapping.stomp_body import message_from_stomp, message_to_stomp

    fd = [CosNotification.Property(f"counter_{i:03d}", CORBA.Any(CORBA.TC_long, i)) for i in range(300)]
    header = CosNotification.EventHeader(
        CosNotification.FixedEventHeader(CosNotification.EventType("Telecom", "PM"), "report"), [])
    event = CosNotification.StructuredEvent(header, fd, CORBA.Any(CORBA.TC_string, "x"))
    frame = message_to_stomp(event_to_jms(event, Destination("queue", "pm"), now_ms=0))
    manifest = frame.headers["$nsjms_idl"]
    assert manifest.startswith("z:") and len(manifest) < 10 * 1024
    assert event_equal(jms_to_event(message_from_stomp(frame.headers, frame.body)), event)
    _ = omniORB


def test_a_corrupt_packed_manifest_is_a_mapping_error() -> None:
    import pytest

    from router.mapping.errors import MappingError
    from router.mapping.to_event import unpack_manifest

    for bad in ("z:not-base64!", "z:" + "QUJD"):
        with pytest.raises(MappingError):
            unpack_manifest(bad)
