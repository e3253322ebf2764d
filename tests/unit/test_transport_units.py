"""Pieces of the transport contract that need no broker: URL table, exceptions, default codec, retry policy,
selectors and fault injection of the twin."""

from __future__ import annotations

import pickle
import threading

import pytest

from router.jms.codec import SimpleCodec, body_lost, frame_delivery
from router.jms.memory.broker import MemoryBroker
from router.jms.memory.matcher import compile_selector
from router.jms.memory.transport import MemoryTransport
from router.jms.model import BodyType, DeliveryMode, Destination, JmsMessage, JmsType, Typed
from router.jms.stomp.link import parse_stomp_url
from router.jms.stomp.transport import StompTransport
from router.jms.transport import (
    BrokerError,
    BrokerUnavailable,
    LocalProtocolError,
    RemoteProtocolError,
    SendFailed,
    Transport,
    TransportError,
    UnconfirmedOutcome,
    open_transport,
    parse_destination,
    redact_url,
    register_scheme,
)


def test_scheme_table() -> None:
    assert isinstance(open_transport("stomp://127.0.0.1:61613"), StompTransport)
    assert isinstance(open_transport("stomp+ssl://127.0.0.1:61614"), StompTransport)
    assert isinstance(open_transport("memory://units-table"), MemoryTransport)
    with pytest.raises(LocalProtocolError):
        open_transport("amqp://127.0.0.1:5672")
    MemoryBroker.forget("units-table")


def test_register_scheme() -> None:
    made: list[str] = []

    def factory(url: str, **opts: object) -> Transport:
        made.append(url)
        return MemoryTransport("memory://units-reg")
    register_scheme("fake", factory)
    assert isinstance(open_transport("fake://x"), MemoryTransport) and made == ["fake://x"]


def test_stomp_url_forms() -> None:
    assert parse_stomp_url("stomp://a:1,b:2") == ([("a", 1), ("b", 2)], False)
    assert parse_stomp_url("stomp+ssl://[::1]:61614") == ([("::1", 61614)], True)
    for bad in ("stomp://nohost", "stomp://h:port", "http://h:1"):
        with pytest.raises(LocalProtocolError):
            parse_stomp_url(bad)
    assert redact_url("stomp://u:p@h:1/x") == "stomp://h:1/x"


@pytest.mark.parametrize("exc", [
    BrokerUnavailable("down"), SendFailed("refused", "/queue/q"), UnconfirmedOutcome("no receipt", "commit"),
    BrokerError("bad", "trace", "r-1"), RemoteProtocolError("junk"), LocalProtocolError("misuse")])
def test_exceptions_pickle_and_carry_data(exc: TransportError) -> None:
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc) and back.args == exc.args and str(back) == str(exc)
    assert isinstance(back, TransportError)


def test_an_unconfirmed_outcome_is_neither_failure_nor_success() -> None:
    exc = UnconfirmedOutcome("x", "send")
    assert exc.outcome == "unknown" and not isinstance(exc, (SendFailed, BrokerUnavailable, BrokerError))


def test_destinations() -> None:
    assert parse_destination("/topic/a.b") == Destination("topic", "a.b")
    for bad in ("queue/x", "/queue/", "/exchange/x", ""):
        with pytest.raises(LocalProtocolError):
            parse_destination(bad)


def test_codec_encodes_jms_headers_and_string_properties() -> None:
    codec = SimpleCodec(clock_ms=lambda: 1_000)
    msg = JmsMessage(BodyType.TEXT, "é", priority=9, expiration=5_000, delivery_time=3_500, correlation_id="c",
                     jms_type="t", reply_to=Destination("topic", "r"),
                     properties={"a": Typed(JmsType.STRING, "1")})
    enc = codec.encode(msg)
    assert enc.body == "é".encode()
    assert enc.headers == {"priority": "9", "expires": "5000", "AMQ_SCHEDULED_DELAY": "2500", "correlation-id": "c",
                           "type": "t", "reply-to": "/topic/r", "a": "1"}
    assert "content-length" not in enc.headers                       # → ActiveMQ TextMessage
    assert codec.encode(JmsMessage(BodyType.BYTES, b"\x00\x01")).headers["content-length"] == "2"


@pytest.mark.parametrize("msg", [
    JmsMessage(BodyType.MAP, {}), JmsMessage(BodyType.STREAM, []), JmsMessage(BodyType.OBJECT, b""),
    JmsMessage(BodyType.TEXT, "x", properties={"n": Typed(JmsType.INT, 1)}),
    JmsMessage(BodyType.TEXT, "x", properties={"destination": Typed(JmsType.STRING, "/queue/evil")}),
    JmsMessage(BodyType.TEXT, b"bytes-as-text")])
def test_codec_refuses_what_it_cannot_carry(msg: JmsMessage) -> None:
    with pytest.raises(LocalProtocolError):
        SimpleCodec().encode(msg)


def test_codec_decodes() -> None:
    m = SimpleCodec().decode({"message-id": "ID:1", "persistent": "true", "priority": "2", "redelivered": "true",
                              "destination": "/queue/q", "x": "y", "content-length": "3"}, b"abc")
    assert (m.body_type, m.body, m.delivery_mode, m.priority, m.redelivered) == (
        BodyType.BYTES, b"abc", DeliveryMode.PERSISTENT, 2, True)
    assert m.properties == {"x": Typed(JmsType.STRING, "y")} and m.destination == Destination("queue", "q")
    assert SimpleCodec().decode({"priority": "junk"}, b"t").priority == 4


@pytest.mark.parametrize(("selector", "expected"), [
    ("color = 'red'", True), ("color <> 'red'", False), ("color IN ('a', 'red')", True),
    ("color NOT IN ('red')", False), ("color LIKE 'r_d'", True), ("color LIKE 'x!%' ESCAPE '!'", False),
    ("missing IS NULL", True), ("color IS NOT NULL", True), ("missing = 'x'", False), ("NOT (missing = 'x')", False),
    ("w > 2500", True), ("w BETWEEN 1 AND 10", False), ("w NOT BETWEEN 1 AND 10", True), ("flag = TRUE", True),
    ("JMSPriority >= 7 AND JMSDeliveryMode = 'PERSISTENT'", True), ("color = 'red' OR missing = 'x'", True),
    ("(color = 'blue' OR w = 3000) AND NOT color = 'blue'", True), ("w = 'abc' OR w > 'x' = 1", None)])
def test_twin_selectors(selector: str, expected: bool | None) -> None:
    headers = {"color": "red", "w": "3000", "flag": "true", "priority": "7", "persistent": "true"}
    if expected is None:
        with pytest.raises(ValueError):
            compile_selector(selector)
        return
    assert bool(compile_selector(selector)(headers)) is expected


def test_twin_fault_injection() -> None:
    broker = MemoryBroker("units-faults")
    t = open_transport("memory://units-faults", broker=broker)
    t.connect()
    q = Destination("queue", "f")
    broker.inject_fault("send", UnconfirmedOutcome("lost receipt", "send"), applied=True)
    with pytest.raises(UnconfirmedOutcome):
        t.send(q, JmsMessage(BodyType.TEXT, "landed"))
    assert [m.body for m in broker.queues["/queue/f"]] == [b"landed"]
    broker.inject_fault("send", BrokerUnavailable("cut"))
    with pytest.raises(SendFailed):
        t.send(q, JmsMessage(BodyType.TEXT, "lost"))
    assert not t.is_connected() and len(broker.queues["/queue/f"]) == 1
    t.reconnect()
    tx = t.begin()
    t.send(q, JmsMessage(BodyType.TEXT, "in tx"), transaction=tx)
    broker.inject_fault("commit", UnconfirmedOutcome("lost receipt", "commit"), applied=True)
    with pytest.raises(UnconfirmedOutcome):
        t.commit(tx)
    assert len(broker.queues["/queue/f"]) == 2
    t.close()


def test_twin_client_id_in_use_and_broker_down() -> None:
    broker = MemoryBroker("units-cid")
    a = MemoryTransport("memory://", broker=broker, client_id="c")
    a.connect()
    with pytest.raises(BrokerError):
        MemoryTransport("memory://", broker=broker, client_id="c").connect()
    broker.stop()
    assert not a.is_connected()
    with pytest.raises(BrokerUnavailable):
        a.connect()
    broker.start()
    a.connect()
    assert a.is_connected()


def test_receive_wakes_up_when_the_connection_is_lost() -> None:
    broker = MemoryBroker("units-wake")
    t = MemoryTransport("memory://", broker=broker)
    t.connect()
    sub = t.subscribe("/queue/w")
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            sub.receive(30)
        except BrokerUnavailable as exc:
            errors.append(exc)
    thread = threading.Thread(target=consume)
    thread.start()
    threading.Timer(0.1, broker.restart).start()
    thread.join(5)
    assert not thread.is_alive() and len(errors) == 1


def test_undecodable_frame_is_handed_on_marked_not_dropped() -> None:
    """A frame the codec rejects still reaches the consumer (raw body, ``decode_error``) so it can be settled."""
    from router.jms.model import BodyType, JmsMessage

    class Picky(SimpleCodec):
        def decode(self, headers, body):  # type: ignore[override]
            if body == b"poison":
                raise ValueError("cannot decode")
            return super().decode(headers, body)

    t = open_transport("memory://units-decode", codec=Picky())
    t.connect()
    try:
        sub = t.subscribe("/queue/decode")
        t.send("/queue/decode", JmsMessage(BodyType.BYTES, b"poison"))
        t.send("/queue/decode", JmsMessage(BodyType.BYTES, b"fine"))
        bad, good = sub.receive(2.0), sub.receive(2.0)
        assert bad is not None and good is not None
        assert bad.decode_error is not None and "cannot decode" in bad.decode_error
        assert bad.message.body == b"poison" and bad.message.body_type is BodyType.BYTES
        assert good.decode_error is None and good.message.body == b"fine"
        t.ack(bad)
        t.ack(good)
    finally:
        t.close()


@pytest.mark.parametrize("headers, body, lost", [
    ({}, b"", True),                                          # a Java Map/Stream/Object message over STOMP
    ({"content-length": "0"}, b"", False),                    # an empty BytesMessage
    ({"nsjms_body": "none"}, b"", False),                     # the mapping codec's body kind
    ({"$nsjms_idl": "IDL:x:1.0"}, b"", False),                # an IDL-typed event
    ({"transformation": "jms-map-json"}, b"", False),         # a MapMessage as JSON
    ({}, b"x", False),                                        # a body
])
def test_a_body_is_lost_only_when_empty_and_unmarked(headers: dict[str, str], body: bytes, lost: bool) -> None:
    assert body_lost(headers, body) is lost
    d = frame_delivery(JmsMessage(BodyType.TEXT, ""), {"destination": "/queue/q", **headers}, body,
                       subscription="s", ack_id="a", message_id="m", epoch=1, decode_error=None)
    assert d.body_lost is lost


def test_a_frame_delivery_reads_its_broker_fields_once() -> None:
    """The typed fields of a received STOMP frame (issue 24): what callers read instead of headers."""
    headers = {"destination": "/topic/t", "redelivered": "true", "timestamp": "1700000000123",
               "nsjms_dedupe_id": "e1/c1/a2/p3", "content-length": "1"}
    d = frame_delivery(JmsMessage(BodyType.BYTES, b"x"), headers, b"x", subscription="sub-1", ack_id="ack-1",
                       message_id="ID:1", epoch=3, decode_error=None)
    assert (d.destination, d.redelivered, d.timestamp_ms, d.dedupe_id) == ("/topic/t", True, 1700000000123,
                                                                           "e1/c1/a2/p3")
    assert (d.subscription, d.ack_id, d.message_id, d.epoch) == ("sub-1", "ack-1", "ID:1", 3)
    for bad in ("", "soon", "12.5"):
        assert frame_delivery(JmsMessage(BodyType.BYTES, b"x"), {"timestamp": bad}, b"x", subscription="s",
                              ack_id="a", message_id="m", epoch=1, decode_error=None).timestamp_ms == 0
