"""The transport contract, run here against the in-memory twin and in tests/integration/test_stomp_contract.py
against a real ActiveMQ. Subclasses provide three fixtures:

``make``      ``make(**opts) -> Transport``: a connected transport on the broker under test (closed after the test)
``outage``    ``(make, restart)``: a factory for a broker the test may restart, and ``restart()`` itself
``quiet``     seconds to wait before concluding that nothing will arrive
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from router.jms.memory.broker import MemoryBroker
from router.jms.model import BodyType, DeliveryMode, Destination, JmsMessage, JmsType, Typed
from router.jms.transport import (
    AckMode,
    BrokerError,
    BrokerUnavailable,
    Confirm,
    ConnectionState,
    Delivery,
    EncodedMessage,
    LocalProtocolError,
    SendFailed,
    Transport,
    open_transport,
)

Make = Callable[..., Transport]


def text(body: str, **props: str) -> JmsMessage:
    return JmsMessage(BodyType.TEXT, body, properties={k: Typed(JmsType.STRING, v) for k, v in props.items()})


def queue_name() -> Destination:
    return Destination("queue", f"nsjms.test.{uuid.uuid4().hex[:10]}")


def drain(sub: Any, quiet: float, limit: int = 1000) -> list[Delivery]:
    out: list[Delivery] = []
    while len(out) < limit and (d := sub.receive(quiet)) is not None:
        out.append(d)
    return out


def receive_with_reconnect(transport: Transport, sub: Any, timeout: float) -> Delivery | None:
    """Receive, reconnecting once if the connection turns out to be lost."""
    try:
        return sub.receive(timeout)  # type: ignore[no-any-return]
    except BrokerUnavailable:
        transport.reconnect()
        return sub.receive(timeout)  # type: ignore[no-any-return]


class TransportContract:
    quiet: float = 0.2

    # ---------------------------------------------------------------------------------------------- basics
    def test_persistent_text_send_and_receive(self, make: Make) -> None:
        t = make()
        q = queue_name()
        sub = t.subscribe(q)
        t.send(q, text("hello", color="red", **{"$origin": "ns"}))
        d = sub.receive(10)
        assert d is not None
        assert d.message.body_type is BodyType.TEXT and d.message.body == "hello"
        assert d.message.delivery_mode is DeliveryMode.PERSISTENT and d.headers["persistent"] == "true"
        assert d.message.properties["color"] == Typed(JmsType.STRING, "red")
        assert d.message.properties["$origin"].value == "ns"
        assert d.destination == q.stomp() and not d.redelivered and d.message.message_id == d.message_id
        t.ack(d)

    def test_non_persistent_is_sent_explicitly(self, make: Make) -> None:
        t = make()
        q = queue_name()
        sub = t.subscribe(q, ack="auto")
        t.send(q, JmsMessage(BodyType.TEXT, "np", delivery_mode=DeliveryMode.NON_PERSISTENT, priority=7,
                             correlation_id="c-1", jms_type="alarm", reply_to=Destination("queue", "replies")))
        d = sub.receive(10)
        assert d is not None and d.headers.get("persistent", "false") == "false"
        m = d.message
        assert (m.delivery_mode, m.priority, m.correlation_id, m.jms_type) == (
            DeliveryMode.NON_PERSISTENT, 7, "c-1", "alarm")
        assert m.reply_to == Destination("queue", "replies")

    def test_bytes_body_round_trip(self, make: Make) -> None:
        t = make()
        q = queue_name()
        sub = t.subscribe(q)
        payload = bytes(range(256)) + b"\x00tail"
        t.send(q, JmsMessage(BodyType.BYTES, payload))
        d = sub.receive(10)
        assert d is not None and d.message.body_type is BodyType.BYTES and d.message.body == payload
        t.ack(d)

    def test_order_within_one_destination(self, make: Make) -> None:
        t = make()
        q = queue_name()
        for i in range(20):
            t.send(q, text(str(i)), confirm=Confirm.CONFIRMED if i == 19 else Confirm.PIPELINED)
        sub = t.subscribe(q, ack="auto")
        assert [d.message.body for d in drain(sub, 2.0, limit=20)] == [str(i) for i in range(20)]

    # ---------------------------------------------------------------------------------------------- typed deliveries
    def test_a_delivery_carries_what_the_broker_said_as_typed_fields(self, make: Make) -> None:
        """message id, ack id, subscription, destination, JMSTimestamp and the dedupe id are read by the
        transport, so no caller reads a wire header (issue 24)."""
        t = make()
        q = queue_name()
        sub = t.subscribe(q)
        t.send(q, text("stamped", nsjms_dedupe_id="e1/c1/a2/p3"))
        t.send(q, text("plain"))
        stamped, plain = drain(sub, 2.0, limit=2)
        assert stamped.dedupe_id == "e1/c1/a2/p3" and plain.dedupe_id is None
        assert stamped.timestamp_ms > 0 and stamped.timestamp_ms == stamped.message.timestamp
        assert stamped.message_id == stamped.message.message_id and stamped.ack_id and stamped.subscription == sub.id
        assert stamped.destination == q.stomp() and not stamped.redelivered
        assert not stamped.body_lost and stamped.decode_error is None
        t.ack_many([stamped, plain])

    def test_an_empty_body_nothing_marks_is_flagged_lost(self, make: Make) -> None:
        """An empty frame without a body kind (over STOMP: how a Java Map/Stream/Object message arrives) is
        ``body_lost``; an empty BytesMessage (``content-length: 0``) is not."""
        t = make()
        q = queue_name()
        sub = t.subscribe(q)
        t.send_encoded(q, EncodedMessage({}, b""), persistent=True)
        t.send(q, JmsMessage(BodyType.BYTES, b""))
        lost, kept = drain(sub, 2.0, limit=2)
        assert lost.body_lost and not kept.body_lost and kept.message.body_type is BodyType.BYTES
        t.ack_many([lost, kept])

    # ---------------------------------------------------------------------------------------------- transactions
    def test_a_pipelined_transaction_is_committed_once_its_confirmation_is_awaited(self, make: Make) -> None:
        """begin, sends and commit without a round trip each (``Confirm.PIPELINED``, ``commit_pipelined``); the
        pending confirmation's ``wait`` is the durability point."""
        t = make()
        q = queue_name()
        sub = t.subscribe(q)
        tx = t.begin(Confirm.PIPELINED)
        for i in range(3):
            t.send(q, text(f"p{i}"), transaction=tx, confirm=Confirm.PIPELINED)
        pending = t.commit_pipelined(tx)
        pending.wait()
        got = drain(sub, 2.0, limit=3)
        assert [d.message.body for d in got] == ["p0", "p1", "p2"]
        tx2 = t.begin(Confirm.PIPELINED)
        for d in got:
            t.ack(d, tx2, confirm=Confirm.PIPELINED)
        t.commit(tx2)
        assert sub.receive(self.quiet) is None, "acked in a committed transaction: nothing comes back"

    def test_a_discarded_pending_commit_leaves_the_transport_usable(self, make: Make) -> None:
        """``discard`` instead of ``wait``: the commit's outcome stays unknown (its message may or may not come);
        the transport goes on (a confirmed send after it arrives)."""
        t = make()
        q = queue_name()
        sub = t.subscribe(q, ack="auto")
        tx = t.begin(Confirm.PIPELINED)
        t.send(q, text("maybe"), transaction=tx, confirm=Confirm.PIPELINED)
        t.commit_pipelined(tx).discard()
        t.send(q, text("after"))
        bodies = [d.message.body for d in drain(sub, 2.0, limit=2)]
        assert bodies[-1:] == ["after"] and set(bodies) <= {"maybe", "after"}, bodies

    def test_commit_delivers_and_abort_does_not(self, make: Make) -> None:
        t = make()
        q = queue_name()
        sub = t.subscribe(q)
        tx = t.begin()
        t.send(q, text("in-tx"), transaction=tx, confirm=Confirm.PIPELINED)
        t.send(q, text("in-tx-2"), transaction=tx)
        assert sub.receive(self.quiet) is None
        t.commit(tx)
        got = drain(sub, 2.0, limit=2)
        assert [d.message.body for d in got] == ["in-tx", "in-tx-2"]
        tx2 = t.begin()
        t.send(q, text("aborted"), transaction=tx2)
        t.abort(tx2)
        assert sub.receive(self.quiet) is None

    def test_many_encoded_messages_go_in_order_in_one_transaction(self, make: Make) -> None:
        """``send_encoded_many`` (the port's batch write): that many pipelined sends in the transaction, in order,
        each with its own persistence; nothing arrives before the COMMIT, nothing after an ABORT. (ActiveMQ keeps the
        order among messages of one persistence; it may hand the persistent ones of a transaction out first.)"""
        t = make()
        q = queue_name()
        sub = t.subscribe(q)
        tx = t.begin(Confirm.PIPELINED)
        t.send_encoded_many(q, [(t.encode(text(f"m{i}")), i % 2 == 0) for i in range(5)], transaction=tx)
        assert sub.receive(self.quiet) is None
        t.commit(tx)
        got = drain(sub, 2.0, limit=5)
        modes = {d.message.body: d.message.delivery_mode for d in got}
        assert modes == {f"m{i}": DeliveryMode.PERSISTENT if i % 2 == 0 else DeliveryMode.NON_PERSISTENT
                         for i in range(5)}
        for mode in DeliveryMode:
            assert [d.message.body for d in got if d.message.delivery_mode is mode] == [
                f"m{i}" for i in range(5) if modes[f"m{i}"] is mode], "in order"
        t.ack_many(got)
        tx2 = t.begin()
        t.send_encoded_many(q, [(t.encode(text("aborted")), True), (t.encode(text("aborted 2")), False)],
                            transaction=tx2)
        t.abort(tx2)
        assert sub.receive(self.quiet) is None

    def test_acks_in_an_aborted_transaction_must_be_acked_again(self, make: Make) -> None:
        t = make()
        q = queue_name()
        t.send(q, text("m"))
        sub = t.subscribe(q)
        d = sub.receive(10)
        assert d is not None
        tx = t.begin()
        t.ack(d, tx)
        with pytest.raises(LocalProtocolError):
            t.ack(d)                                  # claimed by the transaction
        t.abort(tx)
        t.ack(d)                                      # the abort gave it back
        t.close()
        t2 = make()
        assert t2.subscribe(q).receive(self.quiet) is None

    def test_ack_in_committed_transaction(self, make: Make) -> None:
        t = make()
        q = queue_name()
        t.send(q, text("m"))
        sub = t.subscribe(q)
        d = sub.receive(10)
        assert d is not None
        tx = t.begin()
        t.ack(d, tx)
        t.commit(tx)
        t.close()
        assert make().subscribe(q).receive(self.quiet) is None

    # ---------------------------------------------------------------------------------------------- acks
    def test_ack_many_acks_in_order_and_stops_at_a_delivery_it_cannot_ack(self, make: Make) -> None:
        t = make()
        q = queue_name()
        for i in range(5):
            t.send(q, text(f"m{i}"), confirm=Confirm.CONFIRMED if i == 4 else Confirm.PIPELINED)
        sub = t.subscribe(q)
        got = drain(sub, 2.0, limit=5)
        assert [d.message.body for d in got] == [f"m{i}" for i in range(5)]
        t.ack(got[1])
        with pytest.raises(LocalProtocolError):
            t.ack_many(got[:3])                       # m0 acked, then m1 (acked already) refused; m2 not reached
        t.ack_many(got[2:4])
        with pytest.raises(LocalProtocolError):
            t.ack(got[0])                             # ack_many did ack m0
        t.close()
        again = drain(make().subscribe(q), 2.0, limit=5)
        assert [d.message.body for d in again] == ["m4"]          # only the one never acked comes back

    def test_ack_many_in_a_transaction_takes_effect_on_commit(self, make: Make) -> None:
        t = make()
        q = queue_name()
        for i in range(3):
            t.send(q, text(f"m{i}"), confirm=Confirm.CONFIRMED if i == 2 else Confirm.PIPELINED)
        got = drain(t.subscribe(q), 2.0, limit=3)
        tx = t.begin()
        t.ack_many(got, tx)
        t.abort(tx)                                   # the abort gives them back: acked again, now committed
        tx = t.begin()
        t.ack_many(got, tx)
        t.commit(tx)
        t.close()
        assert make().subscribe(q).receive(self.quiet) is None

    def test_unacked_is_redelivered_after_disconnect(self, make: Make) -> None:
        q = queue_name()
        t1 = make()
        t1.send(q, text("one"))
        t1.send(q, text("two"))
        sub1 = t1.subscribe(q)
        first, second = sub1.receive(10), sub1.receive(10)
        assert first is not None and second is not None
        t1.ack(second)                                # client-individual: only "two" is acknowledged
        t1.close()
        t2 = make()
        sub2 = t2.subscribe(q)
        again = sub2.receive(10)
        assert again is not None and again.message.body == "one" and again.redelivered
        assert again.message.redelivered
        t2.ack(again)
        assert sub2.receive(self.quiet) is None

    def test_renew_redelivers_the_unacked_first_and_is_not_a_loss(self, make: Make) -> None:
        """A planned renewal (issue 31): the old connection's un-acked deliveries come back first, in order, on the
        same subscription object; its deliveries can no longer be acked; the state callback hears no DISCONNECTED."""
        states: list[ConnectionState] = []
        q = queue_name()
        t = make(on_state=states.append)
        for body in ("one", "two", "three"):
            t.send(q, text(body))
        sub = t.subscribe(q)
        first = sub.receive(10)
        assert first is not None and first.message.body == "one"
        t.ack(first)
        old = sub.receive(10)
        assert old is not None and old.message.body == "two"
        t.renew()
        assert t.is_connected()
        with pytest.raises(BrokerUnavailable):
            t.ack(old)                                 # a delivery of the renewed connection
        got = drain(sub, self.quiet * 10)
        assert [d.message.body for d in got] == ["two", "three"]
        assert got[0].redelivered
        t.ack_many(got)
        t.close()
        assert ConnectionState.DISCONNECTED not in states
        assert make().subscribe(q).receive(self.quiet) is None

    def test_unsubscribe_returns_unacked(self, make: Make) -> None:
        t = make()
        q = queue_name()
        t.send(q, text("x"))
        sub = t.subscribe(q)
        assert sub.receive(10) is not None
        t.unsubscribe(sub)
        with pytest.raises(LocalProtocolError):
            sub.receive(0.01)
        d = t.subscribe(q).receive(10)
        assert d is not None and d.message.body == "x" and d.redelivered

    def test_nack_is_not_redelivered(self, make: Make) -> None:
        t = make()
        q = queue_name()
        t.send(q, text("poison"))
        sub = t.subscribe(q)
        d = sub.receive(10)
        assert d is not None
        t.nack(d)
        t.close()
        assert make().subscribe(q).receive(self.quiet) is None

    def test_prefetch_limits_unacked_deliveries(self, make: Make) -> None:
        t = make()
        q = queue_name()
        for i in range(3):
            t.send(q, text(str(i)))
        sub = t.subscribe(q, prefetch=1)
        d0 = sub.receive(10)
        assert d0 is not None and sub.receive(self.quiet) is None
        t.ack(d0)
        d1 = sub.receive(10)
        assert d1 is not None and d1.message.body == "1"

    # ---------------------------------------------------------------------------------------------- misuse
    def test_misuse_fails_loudly(self, make: Make) -> None:
        t = make()
        q = queue_name()
        t.send(q, text("m"))
        sub = t.subscribe(q)
        d = sub.receive(10)
        assert d is not None
        t.ack(d)
        with pytest.raises(LocalProtocolError):
            t.ack(d)                                  # double ack
        with pytest.raises(LocalProtocolError):
            t.commit("tx-never-begun")
        with pytest.raises(LocalProtocolError):
            t.send(q, text("x"), transaction="tx-never-begun")
        with pytest.raises(LocalProtocolError):
            t.send("queue-without-slash", text("x"))
        with pytest.raises(LocalProtocolError):
            t.send(q, JmsMessage(BodyType.MAP, {"a": Typed(JmsType.INT, 1)}))  # the default codec refuses
        with pytest.raises(LocalProtocolError):
            t.subscribe(Destination("topic", "t"), durable_name="d")  # no client id
        t.close()
        t.close()                                     # idempotent
        with pytest.raises(LocalProtocolError):
            t.send(q, text("after close"))
        with pytest.raises(LocalProtocolError):
            sub.receive(0.01)

    def test_auto_ack_deliveries_cannot_be_acked(self, make: Make) -> None:
        t = make()
        q = queue_name()
        t.send(q, text("m"))
        d = t.subscribe(q, ack=AckMode.AUTO).receive(10)
        assert d is not None
        with pytest.raises(LocalProtocolError):
            t.ack(d)

    # ---------------------------------------------------------------------------------------------- ERROR frames
    def test_bad_selector_is_a_broker_error_and_the_connection_survives(self, make: Make) -> None:
        t = make()
        q = queue_name()
        with pytest.raises(BrokerError) as info:
            t.subscribe(q, selector="color = = 'red'")
        assert "InvalidSelector" in info.value.message + info.value.body
        with pytest.raises(BrokerError):
            t.subscribe(q, selector="weight > '2500'")   # ordering needs numbers in ActiveMQ's grammar
        t.send(q, text("still fine"))
        d = t.subscribe(q).receive(10)
        assert d is not None and d.message.body == "still fine"

    # ---------------------------------------------------------------------------------------------- selectors
    def test_selector_on_string_properties(self, make: Make) -> None:
        t = make()
        q = queue_name()
        for color, weight in (("red", "3000"), ("blue", "3000"), ("red", "10")):
            t.send(q, text(f"{color}-{weight}", color=color, weight=weight))
        red = t.subscribe(q, selector="color = 'red' AND weight IN ('3000', '42')", ack="auto")
        assert [d.message.body for d in drain(red, 1.0)] == ["red-3000"]
        # Properties are Strings over STOMP, but ActiveMQ converts a numeric String for a numeric comparison
        # (verified on 5.17; the digest's §13.4 expects no match). The twin does the same.
        numeric = t.subscribe(q, selector="weight > 2500", ack="auto")
        assert [d.message.body for d in drain(numeric, 1.0)] == ["blue-3000"]
        like = t.subscribe(q, selector="(color LIKE 'r_d' OR color IS NULL) AND NOT (weight = '3000')", ack="auto")
        assert [d.message.body for d in drain(like, 1.0)] == ["red-10"]

    # ---------------------------------------------------------------------------------------------- topics
    def test_topic_fan_out_and_durable_subscription(self, make: Make) -> None:
        topic = Destination("topic", f"nsjms.t.{uuid.uuid4().hex[:8]}")
        client = f"nsjms-c-{uuid.uuid4().hex[:8]}"
        t = make(client_id=client)
        durable = t.subscribe(topic, durable_name="d1")
        plain = t.subscribe(topic, ack="auto")
        t.send(topic, text("first"))
        d = durable.receive(10)
        assert d is not None and d.message.body == "first"
        t.ack(d)
        p = plain.receive(10)
        assert p is not None and p.message.body == "first"
        t.close()
        other = make()
        other.send(topic, text("while away"))
        back = make(client_id=client)
        again = back.subscribe(topic, durable_name="d1")
        got = again.receive(10)
        assert got is not None and got.message.body == "while away"
        back.ack(got)
        back.unsubscribe(again, remove_durable=True)

    # ---------------------------------------------------------------------------------------------- outages
    def test_broker_restart_loses_nothing_confirmed(self, outage: tuple[Make, Callable[[], None]]) -> None:
        make, restart = outage
        states: list[ConnectionState] = []
        q = queue_name()
        producer, consumer = make(), make(on_state=states.append)
        for i in range(10):
            producer.send(q, text(str(i)))            # receipted: confirmed
        sub = consumer.subscribe(q, prefetch=5)
        seen = {d.message.body for d in drain(sub, 1.0, limit=3)}   # received, never acked
        tx = consumer.begin()
        consumer.send(q, text("tx-lost"), transaction=tx)
        restart()
        with pytest.raises(BrokerUnavailable):
            _wait_unavailable(sub)
        with pytest.raises(BrokerUnavailable):
            consumer.commit(tx)                       # the broker rolled it back with the connection
        consumer.reconnect()
        got: dict[str, Delivery] = {}
        while len(got) < 10 and (d := receive_with_reconnect(consumer, sub, 10.0)) is not None:
            got[str(d.message.body)] = d
            consumer.ack(d)
        assert sub.receive(self.quiet) is None         # and "tx-lost" never arrives
        assert sorted(got, key=int) == [str(i) for i in range(10)]
        assert seen <= set(got)      # JMSRedelivered is not reliable across a broker restart (JMS 3.4.7)
        assert ConnectionState.DISCONNECTED in states and states[-1] is ConnectionState.CONNECTED
        producer.reconnect()
        producer.send(q, text("after"))
        d = sub.receive(10)
        assert d is not None and d.message.body == "after"

    def test_commit_pipelined_of_a_transaction_lost_with_its_connection_raises_at_once(
            self, outage: tuple[Make, Callable[[], None]]) -> None:
        """commit_pipelined's checks before the COMMIT raise at once, not at wait() (the twin used to defer them)."""
        make, restart = outage
        t = make()
        q = queue_name()
        sub = t.subscribe(q)
        tx = t.begin()
        t.send(q, text("tx-lost"), transaction=tx)
        restart()
        with pytest.raises(BrokerUnavailable):
            _wait_unavailable(sub)
        with pytest.raises(BrokerUnavailable):
            t.commit_pipelined(tx)                       # raised here: there is nothing to wait() for
        t.reconnect()
        assert sub.receive(self.quiet) is None         # and "tx-lost" never arrives

    def test_send_on_a_lost_connection_fails_then_reconnect_works(
            self, outage: tuple[Make, Callable[[], None]]) -> None:
        make, restart = outage
        t = make()
        restart()
        with pytest.raises(SendFailed) as info:
            _send_until_unavailable(t)
        assert info.value.destination.startswith("/queue/")
        assert isinstance(info.value.__cause__, BrokerUnavailable)
        t.reconnect()
        assert t.is_connected()


def _wait_unavailable(sub: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sub.receive(0.5)
    raise AssertionError("the transport did not notice the lost connection")


def _send_until_unavailable(t: Transport, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        t.send(queue_name(), text("probe"))
        time.sleep(0.1)
    raise AssertionError("sends kept succeeding after the broker restart")


# --------------------------------------------------------------------------------------------------- the twin
class TestMemoryContract(TransportContract):
    quiet = 0.05

    @pytest.fixture
    def make(self) -> Iterator[Make]:
        name = f"contract-{uuid.uuid4().hex}"
        opened: list[Transport] = []

        def factory(**opts: Any) -> Transport:
            t = open_transport(f"memory://{name}", **opts)
            t.connect()
            opened.append(t)
            return t
        yield factory
        for t in opened:
            t.close()
        MemoryBroker.forget(name)

    @pytest.fixture
    def outage(self, make: Make) -> tuple[Make, Callable[[], None]]:
        probe = make()
        broker = probe.broker  # type: ignore[attr-defined]
        probe.close()
        return make, broker.restart


def test_reconnect_policy_is_bounded_and_interruptible() -> None:
    broker = MemoryBroker("down")
    broker.stop()
    shutdown = threading.Event()
    t = open_transport("memory://down", broker=broker, shutdown=shutdown)
    threading.Timer(0.3, shutdown.set).start()
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable):
        t.reconnect()
    assert time.monotonic() - started < 3.0
