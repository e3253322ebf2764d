"""Bridge data paths (router.bridge.flows) and the bridge's transport callback, against recording fakes.

What is pinned here: a message the broker refuses (``SendRefused``, an ERROR frame) is dead-lettered instead of
stalling the bridge; any exception while mapping one message or event dead-letters that one (never escapes into the
receive loop); expired messages and events above the size limit are dead-lettered with a readable reason; a message
refused to the broker's DLQ leaves a record with its reason in the bridge's dead-letter destination; deliveries a
stopped push loop had received are kept for the next loop; one subscription however many threads ask at once; the
connection-state callback never blocks on the bridge's lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from router.bridge import flows as F
from router.jms.model import BodyType, Destination, JmsMessage, JmsType, Typed
from router.jms.transport import (
    BrokerError,
    BrokerUnavailable,
    Confirm,
    ConnectionState,
    Delivery,
    EncodedMessage,
    SendFailed,
    SendRefused,
)
from router.mapping.stomp_codec import StompCodec

QUEUE = Destination("queue", "out")


@dataclass
class FakeTransport:
    """Records sends/acks/nacks; ``refuse`` maps a destination name to the error its sends raise."""

    sent: list[tuple[str, JmsMessage]] = field(default_factory=list)
    acked: list[str] = field(default_factory=list)
    nacked: list[str] = field(default_factory=list)
    refuse: dict[str, Exception] = field(default_factory=dict)
    subscribes: int = 0

    pending: list[tuple[str, JmsMessage]] = field(default_factory=list)

    def encode(self, message: JmsMessage) -> EncodedMessage:
        """The node's encoding (the transport's codec): a refused message's dead letter carries its body."""
        return StompCodec().encode(message)

    def send(self, destination: Destination | str, message: JmsMessage, *, transaction: str | None = None,
             confirm: Confirm = Confirm.CONFIRMED, headers: Any = None) -> None:
        dest = destination.stomp() if isinstance(destination, Destination) else destination
        if dest in self.refuse:
            raise self.refuse[dest]
        (self.pending if transaction else self.sent).append((dest, message))

    def begin(self, confirm: Confirm = Confirm.CONFIRMED) -> str:
        return "tx-1"

    def commit(self, transaction: str) -> None:
        self.sent += self.pending
        self.pending = []

    def abort(self, transaction: str) -> None:
        self.pending = []

    def ack(self, delivery: Delivery, transaction: str | None = None, *, confirm: Confirm = Confirm.CONFIRMED) -> None:
        self.acked.append(delivery.message_id)

    def ack_many(self, deliveries: list[Delivery], transaction: str | None = None) -> None:
        for delivery in deliveries:
            self.ack(delivery, transaction, confirm=Confirm.PIPELINED)

    def nack(self, delivery: Delivery, transaction: str | None = None, *, confirm: Confirm = Confirm.CONFIRMED) -> None:
        self.nacked.append(delivery.message_id)

    def dead_letters(self) -> list[JmsMessage]:
        return [m for d, m in self.sent if d == F.DEFAULT_DLQ.stomp()]


class FakeBridge:
    id = 7

    def __init__(self) -> None:
        self.problems: list[Exception] = []

    def transaction_events(self) -> int:
        return 0

    def transaction_deadline(self) -> float:
        return 0.0

    def running(self) -> bool:
        return True

    def note_broker_problem(self, exc: Exception) -> None:
        self.problems.append(exc)

    def acknowledge_channel(self, events: Any) -> None:
        return None


def _delivery(mid: str, message: JmsMessage | None = None, body: bytes = b"hello",
              headers: dict[str, str] | None = None, decode_error: str | None = None,
              body_lost: bool = False) -> Delivery:
    headers = {"content-length": "5"} if headers is None else headers
    return Delivery(message=message or JmsMessage(BodyType.TEXT, "hello"), headers=headers,
                    body=body, subscription="sub-1", ack_id=f"ack-{mid}", message_id=mid, destination="/queue/in",
                    redelivered=False, decode_error=decode_error, body_lost=body_lost)


def _reason(message: JmsMessage) -> str:
    return str(message.properties["nsjms_dlq_reason"].value)


def _jms_flow(transport: FakeTransport, to_event: Any = lambda m: ("event", m.body), **kw: Any) -> F.JmsToChannel:
    dlq = F.DeadLetter(lambda: transport, 7)  # type: ignore[arg-type,return-value]
    return F.JmsToChannel(FakeBridge(), transport, to_event, dlq, lambda: None, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ channel -> JMS
def _out_flow(transport: FakeTransport, to_jms: Any = None) -> F.ChannelToJms:
    dlq = F.DeadLetter(lambda: transport, 7)  # type: ignore[arg-type,return-value]
    to_jms = to_jms or (lambda ev, dest: JmsMessage(BodyType.TEXT, str(ev)))
    return F.ChannelToJms(FakeBridge(), QUEUE, transport, to_jms, dlq, lambda ev: str(ev).encode())  # type: ignore[arg-type]


def test_a_message_the_broker_refuses_is_dead_lettered_not_retried() -> None:
    """The STOMP transport reports an ERROR frame answering a SEND as SendRefused (a SendFailed); the bridge used to
    catch BrokerError only, so the push failed with TRANSIENT and the channel retried the event forever."""
    transport = FakeTransport(refuse={QUEUE.stomp(): SendRefused(
        "send to /queue/out failed: broker error: not authorized", QUEUE.stomp(),
        "User anonymous is not authorized to write to: queue://out", "SecurityException")})
    flow = _out_flow(transport)
    flow.forward(["ev-1"])
    [dead] = transport.dead_letters()
    assert "refused" in _reason(dead) and "not authorized to write" in _reason(dead)


def test_a_connection_failure_is_not_dead_lettered() -> None:
    transport = FakeTransport(refuse={QUEUE.stomp(): SendFailed("not connected", QUEUE.stomp())})
    flow = _out_flow(transport)
    with pytest.raises(SendFailed):
        flow.forward(["ev-1"])
    assert transport.dead_letters() == []


def test_a_refused_message_in_a_batch_is_dead_lettered_the_rest_sent() -> None:
    class TxTransport(FakeTransport):
        def commit(self, transaction: str) -> None:
            raise BrokerError("transaction tx-1 rolled back: a frame in it failed")

        def send(self, destination: Any, message: JmsMessage, *, transaction: str | None = None,
                 confirm: Confirm = Confirm.CONFIRMED, headers: Any = None) -> None:
            if transaction is None and message.body == "bad":
                raise SendRefused("refused", QUEUE.stomp(), "bad header")
            super().send(destination, message, transaction=transaction, confirm=confirm)

    transport = TxTransport()
    flow = _out_flow(transport)
    flow.forward(["good", "bad", "also-good"])
    plain = [m.body for d, m in transport.sent if d == QUEUE.stomp()]
    assert plain.count("good") >= 1 and plain.count("also-good") >= 1
    assert [_reason(m) for m in transport.dead_letters()] == ["broker refused the message: bad header"]


def test_any_exception_while_mapping_an_event_dead_letters_it() -> None:
    def to_jms(ev: Any, dest: Destination) -> JmsMessage:
        if ev == "poison":
            raise RecursionError("maximum recursion depth exceeded")
        return JmsMessage(BodyType.TEXT, ev)

    transport = FakeTransport()
    _out_flow(transport, to_jms).forward(["a", "poison", "b"])
    assert [m.body for d, m in transport.sent if d == QUEUE.stomp()] == ["a", "b"]
    [dead] = transport.dead_letters()
    assert "RecursionError" in _reason(dead)


# ------------------------------------------------------------------------------------------------ JMS -> channel
def test_any_exception_while_mapping_a_message_dead_letters_and_acks_it() -> None:
    def to_event(msg: JmsMessage) -> Any:
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")

    transport = FakeTransport()
    flow = _jms_flow(transport, to_event)
    assert flow.map(_delivery("m-1")) is None
    assert transport.acked == ["m-1"]
    [dead] = transport.dead_letters()
    assert "RecursionError" in _reason(dead) and dead.properties["nsjms_dlq_message_id"].value == "m-1"


def test_an_expired_message_is_dead_lettered_with_the_reason() -> None:
    transport = FakeTransport()
    flow = _jms_flow(transport, clock_ms=lambda: 1_000_000)
    for mid, expiration in (("neg", -5), ("past", 999_999)):
        assert flow.map(_delivery(mid, JmsMessage(BodyType.TEXT, "x", expiration=expiration))) is None
    assert flow.map(_delivery("never", JmsMessage(BodyType.TEXT, "x", expiration=0))) is not None
    assert flow.map(_delivery("future", JmsMessage(BodyType.TEXT, "x", expiration=1_000_001))) is not None
    assert transport.acked == ["neg", "past"]
    assert all(_reason(m).startswith("expired") for m in transport.dead_letters())


def test_an_event_above_the_size_limit_is_dead_lettered() -> None:
    transport = FakeTransport()
    flow = _jms_flow(transport, lambda m: m.body, event_size=len, max_event_bytes=10)
    assert flow.map(_delivery("small", JmsMessage(BodyType.TEXT, "x" * 10))) == "x" * 10
    assert flow.map(_delivery("big", JmsMessage(BodyType.TEXT, "x" * 11))) is None
    [dead] = transport.dead_letters()
    assert "11 bytes" in _reason(dead) and "limit is 10 bytes" in _reason(dead)
    assert transport.acked == ["big"]


def test_a_split_frame_is_dead_lettered_with_the_reason() -> None:
    transport = FakeTransport()
    flow = _jms_flow(transport)
    assert flow.map(_delivery("nul", decode_error="a STOMP header of this message holds a NUL byte")) is None
    assert transport.acked == ["nul"] and "NUL byte" in _reason(transport.dead_letters()[0])


def test_a_message_refused_to_the_broker_dlq_leaves_a_readable_record() -> None:
    transport = FakeTransport()
    flow = _jms_flow(transport)
    # a Java MapMessage over plain STOMP: the transport flags its body lost (router.jms.codec.body_lost)
    assert flow.map(_delivery("map-1", body=b"", headers={}, body_lost=True)) is None
    assert transport.nacked == ["map-1"] and transport.acked == []
    [record] = transport.dead_letters()
    props = {k: v.value for k, v in record.properties.items()}
    assert props["nsjms_dlq_message_id"] == "map-1" and props["nsjms_dlq_moved_to"] == "ActiveMQ.DLQ"
    assert props["nsjms_dlq_origin"] == "refused" and "Map/Stream/Object" in str(props["nsjms_dlq_reason"])


def test_a_dead_letter_the_broker_refuses_makes_the_message_nacked_not_stuck() -> None:
    transport = FakeTransport(refuse={F.DEFAULT_DLQ.stomp(): SendRefused("refused", "/queue/nsjms.DLQ", "denied")})
    flow = _jms_flow(transport, lambda m: (_ for _ in ()).throw(ValueError("bad")))
    assert flow.map(_delivery("m-1")) is None
    assert transport.nacked == ["m-1"] and transport.acked == []


def test_one_subscription_however_many_threads_ask() -> None:
    calls: list[int] = []

    def subscribe() -> object:
        calls.append(1)
        time.sleep(0.05)         # widen the window in which a second caller would subscribe again
        return object()

    dlq = F.DeadLetter(lambda: FakeTransport(), 7)  # type: ignore[arg-type,return-value]
    flow = F.JmsToChannel(FakeBridge(), FakeTransport(), lambda m: m, dlq, subscribe)  # type: ignore[arg-type]
    threads = [threading.Thread(target=flow.ensure_subscribed) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1


# ------------------------------------------------------------------------------------------------ push loop
class FakeProxy:
    def __init__(self, stop: threading.Event) -> None:
        self.pushed: list[Any] = []
        self.stop = stop

    def push_structured_event(self, event: Any) -> None:
        self.pushed.append(event)


class ScriptedSubscription:
    def __init__(self, deliveries: list[Delivery]) -> None:
        self.deliveries = deliveries

    def receive(self, timeout: float | None = None) -> Delivery | None:
        return self.deliveries.pop(0) if self.deliveries else None


def test_deliveries_received_when_the_loop_stops_are_pushed_by_the_next_loop() -> None:
    """stop_bridge keeps the subscription, so a received, un-pushed delivery must not be forgotten."""
    transport = FakeTransport()
    flow = _jms_flow(transport)
    flow.subscription = ScriptedSubscription([_delivery("m-1")])
    stop = threading.Event()

    class StoppingProxy(FakeProxy):
        def push_structured_event(self, event: Any) -> None:
            self.stop.set()                               # stop_bridge arrives during the push ...
            raise F.CORBA.TRANSIENT(0, F.CORBA.COMPLETED_NO)  # ... which the channel did not take

    loop = F.PushSenderLoop(flow, StoppingProxy(stop), False, lambda: 1, lambda: 0.0, False, stop)
    loop._round()
    assert transport.acked == [] and [d.message_id for d, _ in flow.held] == ["m-1"]
    stop2 = threading.Event()
    proxy = FakeProxy(stop2)
    F.PushSenderLoop(flow, proxy, False, lambda: 1, lambda: 0.0, False, stop2)._round()
    assert proxy.pushed == [("event", "hello")] and transport.acked == ["m-1"] and flow.held == []


# ------------------------------------------------------------------------------------------------ callback
def test_the_connection_state_callback_never_waits_for_the_bridge_lock() -> None:
    """The STOMP dispatcher thread runs the callback; it used to take the bridge's lock (to spawn a reconnect), a
    deadlock with a thread holding that lock while it waits on the transport (CONVENTIONS item 8)."""
    from router.bridge.bridge import BridgeImpl

    bridge = BridgeImpl.__new__(BridgeImpl)
    bridge.id, bridge.destroyed, bridge.started = 3, False, True
    bridge._lock = threading.RLock()
    bridge._wake = threading.Event()
    bridge.broker_state = ConnectionState.CONNECTED
    bridge.transport = None
    bridge.factory = type("Factory", (), {"shutdown_event": threading.Event()})()
    bridge.rt = type("Rt", (), {"spawn": staticmethod(lambda name, fn: None)})()
    bridge._reconnecting = False    # what the old callback path used

    holding, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        with bridge._lock:
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold_lock, daemon=True)
    holder.start()
    assert holding.wait(10)
    callback = threading.Thread(target=bridge._on_broker_state, args=(ConnectionState.DISCONNECTED,), daemon=True)
    callback.start()
    callback.join(10)
    returned = not callback.is_alive()
    release.set()
    holder.join(10)
    assert returned, "the callback blocked on the bridge's lock"
    assert bridge.broker_state is ConnectionState.DISCONNECTED and bridge._wake.is_set()


def test_broker_unavailable_is_a_transport_error_not_a_refusal() -> None:
    """The bridge tells 'refused: dead-letter it' from 'connection: retry' by type alone."""
    assert not issubclass(BrokerUnavailable, SendRefused) and issubclass(SendRefused, SendFailed)
    exc = SendRefused.from_error(BrokerError("denied", "trace"), "/queue/q")
    assert (exc.message, exc.body, exc.destination) == ("denied", "trace", "/queue/q")
    assert Typed(JmsType.STRING, "x").value == "x"


@pytest.mark.parametrize(("name", "value", "ok"), [
    ("JMSXGroupSeq", "3", True), ("JMSXGroupSeq", "abc", False), ("JMSXGroupSeq", str(2**31), False),
    ("AMQ_SCHEDULED_PERIOD", "1.5", False), ("AMQ_SCHEDULED_REPEAT", "-2", True), ("$fd_x", "abc", True)])
def test_headers_activemq_parses_as_numbers_are_checked_before_sending(name: str, value: str, ok: bool) -> None:
    """ActiveMQ closes the connection (no ERROR frame) on such a SEND: the event must be a mapping failure
    (dead-lettered), not an endless unknown-outcome retry."""
    from router.mapping.errors import MappingError
    from router.mapping.stomp_limits import check_stomp_limits

    if ok:
        check_stomp_limits({name: value})
    else:
        with pytest.raises(MappingError, match=name):
            check_stomp_limits({name: value})


@pytest.mark.parametrize(("value", "ok"), [
    ("a" * 10_000, True),                       # 10,002 bytes with the name "x" and the colon
    ("a" * 10_238, True),                       # exactly 10 KiB: accepted
    ("a" * 10_239, False),
    ("\U0001d11e" * 2_559, True),               # 4 UTF-8 bytes each: 10,236 + 2
    ("\U0001d11e" * 2_560, False),              # 10,240 + 2
    (":" * 5_119, True),                        # escaped to two bytes each: 10,238 + 2
    (":" * 5_120, False),
    ("\u20ac" * 2_558, True)])                  # 3 bytes each: well under the limit, counted exactly
def test_a_header_line_over_10_kib_is_a_mapping_failure(value: str, ok: bool) -> None:
    """The header-line check counts UTF-8 bytes after STOMP escaping; its shortcut (a line that cannot reach the
    limit even at 4 bytes a character is not counted) never lets a longer line through."""
    from router.mapping.errors import MappingError
    from router.mapping.stomp_limits import check_stomp_limits

    if ok:
        check_stomp_limits({"x": value})
    else:
        with pytest.raises(MappingError, match="header line"):
            check_stomp_limits({"x": value})


def test_pacing_and_batch_size_come_from_the_bridges_proxy() -> None:
    """PacingInterval used to be always 0 (read from a setting nothing set) and MaximumBatchSize came from the
    channel: both are now the bridge's proxy's QoS (its own, else its admin's, else the channel's)."""
    import CosNotification

    from router.bridge.bridge import BridgeImpl
    from router.bridge.endpoints import EndpointSpec

    def holder(qos: dict[str, int]) -> Any:
        return type("Holder", (), {"qos": qos})()

    admin = holder({CosNotification.PacingInterval: 2_000_000})           # 0.2 s in TimeT units
    servant = holder({CosNotification.MaximumBatchSize: 25})
    servant.admin = admin
    channel = holder({CosNotification.MaximumBatchSize: 1, CosNotification.PacingInterval: 0})
    bridge = BridgeImpl.__new__(BridgeImpl)
    bridge.channel_spec = EndpointSpec("SINK", "SEQUENCE_EVENT", "PUSH", channel_id=4)
    bridge.factory = type("Factory", (), {"channels": type("Channels", (), {"channels": {4: channel}})()})()
    bridge._find_proxy = lambda: servant  # type: ignore[method-assign]
    assert bridge._batch_size() == 25 and bridge._pacing_s() == 0.2
    servant.qos[CosNotification.PacingInterval] = 5_000_000                 # changed while running: read each time
    assert bridge._pacing_s() == 0.5


def test_events_pulled_before_a_transport_failure_are_handed_to_the_channel() -> None:
    """The channel pulls a batch; the second receive fails (connection lost): the first message is already in the
    bridge's hand-over list (acked at the next pull), so it must be returned, not dropped."""
    transport = FakeTransport()
    flow = _jms_flow(transport)

    class Failing:
        def __init__(self) -> None:
            self.calls = 0

        def receive(self, timeout: float | None = None) -> Delivery | None:
            self.calls += 1
            if self.calls > 1:
                raise BrokerUnavailable("connection lost")
            return _delivery("m-1")

    flow.subscription = Failing()
    sender = F.SequencePullSender(flow)
    events, has = sender.try_pull_structured_events(10)
    assert has and events == [("event", "hello")]
    sender.try_pull_structured_events(10)            # the next pull confirms it
    assert transport.acked == ["m-1"]


def test_a_refused_record_the_broker_dlq_refuses_too_still_nacks_the_message(caplog: Any) -> None:
    """refuse(): a broker that refuses writes to nsjms.DLQ must not leave the message un-NACKed (ActiveMQ would
    never redeliver it while the connection lives); the refusal is in the status and logged at ERROR."""
    transport = FakeTransport(refuse={F.DEFAULT_DLQ.stomp(): SendRefused("refused", "/queue/nsjms.DLQ", "denied")})
    flow = _jms_flow(transport)
    with caplog.at_level("ERROR", logger="nsjms.bridge"):
        assert flow.map(_delivery("map-1", body=b"", headers={}, body_lost=True)) is None
    assert transport.nacked == ["map-1"] and transport.acked == []
    problem = flow.dead_letter.problem
    assert problem.startswith("dead-letter destination refused") and "denied" in problem
    assert any("map-1" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")


def test_an_event_both_destination_and_dlq_refuse_stays_in_the_channel_and_is_reported_once(caplog: Any) -> None:
    """Channel -> JMS: the destination and the DLQ refuse: TRANSIENT (the event stays queued, nothing lost), the
    status says why, and the ERROR line is logged once per event, not once per retry."""
    from omniORB import CORBA

    transport = FakeTransport(refuse={QUEUE.stomp(): SendRefused("refused", QUEUE.stomp(), "not authorized"),
                                      F.DEFAULT_DLQ.stomp(): SendRefused("refused", "/queue/nsjms.DLQ", "denied")})
    flow = _out_flow(transport)
    receiver = F.StructuredPushReceiver(flow)
    with caplog.at_level("ERROR", logger="nsjms.bridge"):
        for _ in range(3):
            with pytest.raises(CORBA.TRANSIENT):
                receiver._forward(["event-1"])
    errors = [r for r in caplog.records if r.levelname == "ERROR" and "dead letter" in r.getMessage()]
    assert len(errors) == 1 and "not authorized" in errors[0].getMessage()
    assert flow.dead_letter.problem.startswith("dead-letter destination refused")
    del transport.refuse[F.DEFAULT_DLQ.stomp()]
    receiver._forward(["event-1"])                  # the DLQ accepts again: dead-lettered, the status clears
    assert len(transport.dead_letters()) == 1 and flow.dead_letter.problem == ""


@pytest.mark.parametrize("sequence", [False, True])
def test_an_event_the_channel_finds_too_large_is_dead_lettered_not_retried_forever(sequence: bool) -> None:
    """IMP_LIMIT with MINOR_EVENT_TOO_LARGE is not "channel full": the same event would be refused forever (only
    when limits diverge). It is dead-lettered with the reason; the rest of a batch flows on."""
    from router.channel.boundary import MINOR_EVENT_TOO_LARGE

    transport = FakeTransport()
    flow = _jms_flow(transport)
    flow.subscription = ScriptedSubscription([_delivery("small-1"), _delivery("big", body=b"big"),
                                              _delivery("small-2")])
    stop = threading.Event()

    class LimitProxy(FakeProxy):
        calls = 0

        def push_structured_event(self, event: Any) -> None:
            self.calls += 1
            if self.calls > 20:
                self.stop.set()                            # the old code retried forever: end the test
            if event == ("event", "big"):
                raise F.CORBA.IMP_LIMIT(MINOR_EVENT_TOO_LARGE, F.CORBA.COMPLETED_NO)
            self.pushed.append(event)

        def push_structured_events(self, events: list[Any]) -> None:
            self.calls += 1
            if self.calls > 20:
                self.stop.set()
            if ("event", "big") in events:
                raise F.CORBA.IMP_LIMIT(MINOR_EVENT_TOO_LARGE, F.CORBA.COMPLETED_NO)
            self.pushed.extend(events)

    flow.to_event = lambda m: ("event", "big" if m.body == "big" else m.body)
    flow.subscription.deliveries[1] = _delivery("big", message=JmsMessage(BodyType.TEXT, "big"))
    proxy = LimitProxy(stop)
    loop = F.PushSenderLoop(flow, proxy, sequence, lambda: 3, lambda: 0.0, False, stop)
    for _ in range(3 if not sequence else 1):
        loop._round()
    assert not stop.is_set(), "retried the too-large event"
    assert proxy.pushed == [("event", "hello"), ("event", "hello")]
    assert sorted(transport.acked) == ["big", "small-1", "small-2"]
    [dead] = transport.dead_letters()
    assert "too large" in _reason(dead) or "size limit" in _reason(dead)


def test_a_delivery_a_failed_local_round_kept_is_pushed_when_the_channel_is_no_longer_local() -> None:
    """A local round receives its first message before its unit of work (``InboundT2.wait``) and keeps it in
    ``t2in.held`` when that unit fails (pool timeout, database outage). If the bridge then pushes to a channel
    that is not local (BestEffort, another process), the push loop forwards and acks that delivery first: the
    broker never redelivers it while the consumer lives."""
    transport = FakeTransport()
    flow = _jms_flow(transport)
    flow.subscription = ScriptedSubscription([_delivery("m-2")])
    flow.inbound().held.append(_delivery("m-1"))          # what the failed local round left behind
    stop = threading.Event()
    proxy = FakeProxy(stop)
    loop = F.PushSenderLoop(flow, proxy, False, lambda: 1, lambda: 0.0, False, stop)
    loop._round()
    loop._round()
    assert transport.acked == ["m-1", "m-2"] and len(proxy.pushed) == 2
    assert flow.inbound().held == [] and flow.held == []
