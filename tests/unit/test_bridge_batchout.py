"""Channel → JMS to a bridge of this node, batched and pipelined (router.channel.localpush over
router.bridge.batchout.LocalBatches), over in-memory twins: a push proxy with a real ProxyQueue, a broker transport
that records every frame and answers each COMMIT only when its receipt is waited for.

What is checked: the queue is drained into one broker transaction per batch (structured: 100 events; sequence: the
proxy's MaximumBatchSize), SENDs and BEGIN without receipts, only the COMMIT receipted; the next batch is written
while the previous COMMIT's receipt is in flight, its COMMIT only after that receipt (at most two batches in
flight); events are delivered (journaled) only after their COMMIT's receipt; a message refused in the middle of a
batch is dead-lettered and the rest delivered in order; a failed COMMIT with a second batch in flight puts both
back in order and the retry delivers everything (at most duplicates); a stopped bridge and a consumer in another
process are pushed over CORBA instead.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from router.bridge.batchout import LocalBatches
from router.bridge.core import DEFAULT_DLQ, ChannelToJms, DeadLetter
from router.channel import localpush
from router.channel.boundary import Outcome
from router.channel.events import Event, Form
from router.channel.queue import ANY_ORDER, FIFO_ORDER, Entry, ProxyQueue, Record
from router.jms.model import BodyType, Destination, JmsMessage, JmsType, Typed
from router.jms.transport import (
    BrokerError,
    BrokerUnavailable,
    Confirm,
    EncodedMessage,
    SendRefused,
    UnconfirmedOutcome,
    refused_send,
)
from router.mapping.stomp_codec import StompCodec
from router.routing.registry import LocalEndpoint, LocalEndpoints

QUEUE = Destination("queue", "out")


# ------------------------------------------------------------------------------------------------ twins
class Pending:
    def __init__(self, broker: PipeBroker, tx: str, messages: list[tuple[str, JmsMessage]],
                 outcome: Exception | None, applied: bool) -> None:
        self.broker, self.tx, self.messages, self.outcome, self.applied = broker, tx, messages, outcome, applied
        self.waited = False

    def discard(self) -> None:
        assert not self.waited, "a receipt discarded after it was waited for"
        self.waited = True
        self.broker.frames.append(("DISCARD", self.tx))
        self.broker.in_flight.remove(self.tx)

    def wait(self) -> None:
        assert not self.waited, "a receipt waited for twice"
        self.waited = True
        b = self.broker
        b.frames.append(("RECEIPT", self.tx))
        b.in_flight.remove(self.tx)
        if any(m.body in b.refuse for _, m in self.messages):
            raise BrokerError(f"transaction {self.tx}: a frame in it failed: refused")
        if self.outcome is None or self.applied:
            b.stored += self.messages
        if self.outcome is not None:
            raise self.outcome


class PipeBroker:
    """The broker: each COMMIT is applied when its receipt is waited for; ``commit_outcomes`` are the scripted
    answers of the next COMMITs (None: confirmed); ``refuse`` bodies are refused (ERROR), in a transaction at its
    COMMIT, alone at once."""

    def __init__(self) -> None:
        self.frames: list[tuple[Any, ...]] = []
        self.stored: list[tuple[str, JmsMessage]] = []
        self.open: dict[str, list[tuple[str, JmsMessage]]] = {}
        self.in_flight: list[str] = []          # transactions begun and not yet answered (or aborted)
        self.max_in_flight = 0
        self.commit_outcomes: list[tuple[Exception | None, bool]] = []
        self.refuse: set[Any] = set()
        self.refuse_dest: set[str] = set()      # destinations that refuse every message sent alone (a DLQ)
        self._n = 0

    def encode(self, message: JmsMessage) -> EncodedMessage:
        """The node's encoding (the transport's codec): a refused message's dead letter carries its body."""
        return StompCodec().encode(message)

    def begin(self, confirm: Confirm = Confirm.CONFIRMED) -> str:
        assert confirm is Confirm.PIPELINED, "a batch's BEGIN goes without a confirmation (no round trip)"
        self._n += 1
        tx = f"tx{self._n}"
        self.frames.append(("BEGIN", tx))
        self.open[tx] = []
        self.in_flight.append(tx)
        self.max_in_flight = max(self.max_in_flight, len(self.in_flight))
        return tx

    def send(self, destination: Destination | str, message: JmsMessage, *, transaction: str | None = None,
             confirm: Confirm = Confirm.CONFIRMED, headers: Any = None) -> None:
        dest = destination.stomp() if isinstance(destination, Destination) else destination
        self.frames.append(("SEND", transaction, message.body, confirm))
        if transaction is not None:
            self.open[transaction].append((dest, message))
            return
        if message.body in self.refuse or dest in self.refuse_dest:
            raise SendRefused("ERROR", dest, "refused by policy")
        self.stored.append((dest, message))

    def commit_pipelined(self, transaction: str) -> Pending:
        self.frames.append(("COMMIT", transaction))
        outcome, applied = self.commit_outcomes.pop(0) if self.commit_outcomes else (None, False)
        return Pending(self, transaction, self.open.pop(transaction), outcome, applied)

    def abort(self, transaction: str) -> None:
        self.frames.append(("ABORT", transaction))
        self.open.pop(transaction)
        self.in_flight.remove(transaction)

    def bodies(self, destination: Destination = QUEUE) -> list[Any]:
        return [m.body for d, m in self.stored if d == destination.stomp()]


class Bridge:
    id = 7

    def __init__(self) -> None:
        self.started = True
        self.problems: list[Exception] = []
        self.rt = SimpleNamespace(t2=None)

    def running(self) -> bool:
        return self.started

    def note_broker_problem(self, exc: Exception) -> None:
        self.problems.append(exc)

    def acknowledge_channel(self, events: list[Any]) -> None:
        return None

    def channel_disconnected(self) -> None:
        raise AssertionError("not expected")

    def reconnect_source(self) -> None:
        raise AssertionError("not expected")


class Proxy:
    """A push proxy supplier: a real ProxyQueue; records what was delivered (journaled), in order."""

    oid = "1/2/3"
    id = 3
    channel = SimpleNamespace(id=1)
    admin = SimpleNamespace(id=2)
    client_ior = "IOR:bridge"
    suspended = False
    connected = True
    destroyed = False
    failing: str | None = None
    failed_attempts = 0
    acknowledging = False
    closing = False
    push_flight = None
    local_batches_cache = None

    def __init__(self, servant: Any, form: str = "STRUCTURED", max_batch: int = 1) -> None:
        self.form = form
        self.max_batch = max_batch
        self.queue = ProxyQueue(FIFO_ORDER, ANY_ORDER, 0, on_drop=lambda e, r: None)
        self.stop_event = threading.Event()
        endpoints = LocalEndpoints(lambda ref: servant)      # the servant behind every client reference
        if getattr(servant, "local_batches", None) is not None:     # a bridge endpoint: it registered its port
            endpoints.add(servant, LocalEndpoint(batches=servant.local_batches))
        self.rt = SimpleNamespace(shutting_down=threading.Event(), max_event_bytes=0, endpoints=endpoints,
                                  store=SimpleNamespace(ledger=SimpleNamespace(run_id="r1")))
        self.delivered: list[Any] = []
        self.delivery_calls: list[list[Any]] = []
        self.content_failures: list[list[Any]] = []
        self._seq = 0
        self.flush_due = False                      # the journal's pending deletes are due after each delivery
        self.frames: list[tuple[Any, ...]] | None = None     # where a flush is recorded (the broker's frames)

    def put(self, *values: Any, stored: bool = True) -> None:
        for v in values:
            self._seq += 1
            self.queue.put(Record(self._seq, Event(Form.STRUCTURED, v), 0, None, None, stored,
                                  db_id=self._seq if stored else None))

    def client_ref(self) -> Any:
        return object()

    def batch_size(self) -> int:
        return self.max_batch if self.form == "SEQUENCE" else 1

    def ready_count(self, since: float | None) -> tuple[int, float | None]:
        return min(self.queue.peek_count(), self.batch_size()), None

    def batch_limit(self, n: int) -> int:
        return n

    def delivered_one_batch(self) -> None:
        return None

    def delivered_entries(self, entries: list[Entry], *, defer_flush: bool = False) -> bool:
        """As the real proxy's: with ``flush_due`` the pending deletes are due after each delivery; they are
        flushed at once unless ``defer_flush`` (then True is returned and the caller flushes)."""
        values = [e.record.event.value for e in entries]
        self.delivery_calls.append(values)
        self.delivered += values
        if self.flush_due:
            if defer_flush:
                return True
            self.flush_delivered()
        return False

    def flush_delivered(self) -> None:
        if self.frames is not None:
            self.frames.append(("FLUSH",))

    def content_failed(self, entries: list[Entry], exc: BaseException) -> None:
        """The proxy's poison handling, shortened: the event that cannot be converted is dead-lettered at once,
        the others of its batch go back to the queue."""
        self.content_failures.append([e.record.event.value for e in entries])
        self.queue.requeue([e for e in entries if e.record.event.value != "unconvertible"])

    def run(self) -> list[Outcome]:
        """The dispatcher loop, until the queue is empty (what ``_push_until_stopped`` does)."""
        outcomes: list[Outcome] = []
        for _ in range(100):
            n, _ = self.ready_count(None) if self.form == "SEQUENCE" else (1, None)
            entries = self.queue.take(n)
            if not entries:
                return outcomes
            target = localpush.target(self)
            assert target is not None
            outcomes.append(localpush.deliver(self, target, entries))
        raise AssertionError("the queue never drained")


def to_jms(event: Any, destination: Destination) -> JmsMessage:
    if event == "unmappable":
        from router.mapping.errors import MappingError

        raise MappingError("no mapping for this one", "body")
    return JmsMessage(BodyType.TEXT, event, destination=destination)


def make(form: str = "STRUCTURED", max_batch: int = 1) -> tuple[PipeBroker, Bridge, Proxy]:
    broker, bridge = PipeBroker(), Bridge()
    transport: Any = broker
    flow = ChannelToJms(bridge, QUEUE, transport, to_jms, DeadLetter(lambda: transport, bridge.id),
                        lambda ev: str(ev).encode())
    servant = SimpleNamespace(local_batches=LocalBatches(flow))
    return broker, bridge, Proxy(servant, form, max_batch)


def events(n: int, prefix: str = "e") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def transactions(broker: PipeBroker) -> list[list[Any]]:
    """The SENDs of each transaction, by transaction, in BEGIN order."""
    txs: dict[str, list[Any]] = {}
    for f in broker.frames:
        if f[0] == "BEGIN":
            txs[f[1]] = []
        elif f[0] == "SEND" and f[1] is not None:
            txs[f[1]].append(f[2])
    return list(txs.values())


# ------------------------------------------------------------------------------------------------ tests
def test_a_structured_backlog_goes_in_transactions_of_100_with_receipts_only_on_commit() -> None:
    broker, _, proxy = make()
    proxy.put(*events(250))
    assert proxy.run() == [Outcome.DELIVERED]
    assert broker.bodies() == events(250)
    assert [len(t) for t in transactions(broker)] == [100, 100, 50]
    assert all(f[3] is Confirm.PIPELINED for f in broker.frames if f[0] == "SEND")   # no receipt per message
    assert proxy.delivered == events(250)
    assert [len(c) for c in proxy.delivery_calls] == [100, 100, 50]


def test_the_next_batch_is_written_while_the_commit_receipt_is_in_flight_and_committed_after_it() -> None:
    broker, _, proxy = make()
    proxy.put(*events(300))
    proxy.run()
    f = broker.frames
    for k in (1, 2):
        this, nxt = f"tx{k}", f"tx{k + 1}"
        assert f.index(("COMMIT", this)) < f.index(("BEGIN", nxt)) < f.index(("RECEIPT", this))  # pipelined
        assert f.index(("RECEIPT", this)) < f.index(("COMMIT", nxt))        # never committed before the earlier
    assert broker.max_in_flight == localpush.IN_FLIGHT == 2
    assert broker.bodies() == events(300)


def test_events_arriving_one_by_one_wait_for_the_commit_in_flight_and_go_in_one_transaction() -> None:
    """Group commit (issue 27): with less than a full batch queued, nothing is written behind a COMMIT in flight;
    once its receipt is in, everything queued meanwhile goes in ONE transaction (before: the one event queued when
    the COMMIT was written went alone, the later ones in a third transaction)."""
    broker, _, proxy = make()
    real_commit, real_wait = broker.commit_pipelined, Pending.wait
    arrivals = {"tx1": ("a1",), "tx1-wait": ("a2", "a3", "a4")}

    def commit_pipelined(transaction: str) -> Pending:
        pending = real_commit(transaction)
        proxy.put(*arrivals.pop(transaction, ()))              # queued while the COMMIT is on its way
        return pending

    def wait(self: Pending) -> None:
        proxy.put(*arrivals.pop(f"{self.tx}-wait", ()))        # queued while its receipt is awaited
        real_wait(self)

    broker.commit_pipelined = commit_pipelined  # type: ignore[method-assign]
    Pending.wait = wait  # type: ignore[method-assign]
    try:
        proxy.put("e0")
        assert proxy.run() == [Outcome.DELIVERED]
    finally:
        Pending.wait = real_wait  # type: ignore[method-assign]
    assert transactions(broker) == [["e0"], ["a1", "a2", "a3", "a4"]]
    f = broker.frames
    assert f.index(("RECEIPT", "tx1")) < f.index(("BEGIN", "tx2"))      # written after the receipt, not behind it
    assert broker.bodies() == proxy.delivered == ["e0", "a1", "a2", "a3", "a4"]


def test_the_delivered_rows_delete_runs_while_the_next_commit_receipt_is_in_flight() -> None:
    broker, _, proxy = make()
    proxy.flush_due, proxy.frames = True, broker.frames
    proxy.put(*events(300))
    assert proxy.run() == [Outcome.DELIVERED]
    f = broker.frames
    flushes = [i for i, frame in enumerate(f) if frame == ("FLUSH",)]
    assert len(flushes) == 3
    for k in (1, 2):       # batch k's delete waits for batch k+1's COMMIT, and runs before its receipt is awaited
        assert f.index(("RECEIPT", f"tx{k}")) < f.index(("COMMIT", f"tx{k + 1}")) < flushes[k - 1] \
            < f.index(("RECEIPT", f"tx{k + 1}"))
    assert f.index(("RECEIPT", "tx3")) < flushes[2]                      # the last batch: nothing to wait for
    assert broker.bodies() == proxy.delivered == events(300)


def test_events_are_delivered_only_after_their_commit_receipt() -> None:
    broker, _, proxy = make()
    seen: list[tuple[int, int]] = []
    real = Pending.wait

    def wait(self: Pending) -> None:
        seen.append((len(proxy.delivered), len(broker.stored)))
        real(self)

    Pending.wait = wait  # type: ignore[method-assign]
    try:
        proxy.put(*events(150))
        proxy.run()
    finally:
        Pending.wait = real  # type: ignore[method-assign]
    assert seen == [(0, 0), (100, 100)]          # nothing journaled for a batch before its receipt
    assert proxy.delivered == events(150)


def test_a_sequence_proxy_batches_by_its_maximum_batch_size() -> None:
    broker, _, proxy = make("SEQUENCE", max_batch=30)
    proxy.put(*events(70))
    proxy.run()
    assert [len(t) for t in transactions(broker)] == [30, 30, 10]
    assert broker.bodies() == events(70)


def test_a_message_refused_in_the_middle_of_a_batch_is_dead_lettered_and_the_rest_delivered_in_order() -> None:
    broker, _, proxy = make()
    broker.refuse.add("e42")
    proxy.put(*events(250))
    proxy.run()
    expected = [e for e in events(250) if e != "e42"]
    assert broker.bodies() == expected                                     # in order, nothing lost
    dead = [m for d, m in broker.stored if d == DEFAULT_DLQ.stomp()]
    assert len(dead) == 1 and "refused" in str(dead[0].properties["nsjms_dlq_reason"].value)
    assert proxy.delivered == events(250)                                  # every event left the queue once
    assert ("ABORT", "tx2") in broker.frames                               # the batch written behind it
    assert broker.open == {} and broker.in_flight == []


def test_an_unmappable_event_is_dead_lettered_and_its_batch_flows() -> None:
    broker, _, proxy = make()
    proxy.put("a", "unmappable", "b")
    proxy.run()
    assert broker.bodies() == ["a", "b"]
    assert len([1 for d, _ in broker.stored if d == DEFAULT_DLQ.stomp()]) == 1
    assert proxy.delivered == ["a", "unmappable", "b"]


@pytest.mark.parametrize("failure, applied", [
    (UnconfirmedOutcome("connection lost before the receipt", "commit"), True),
    (UnconfirmedOutcome("no receipt within 30 s", "commit"), False),
    (BrokerUnavailable("commit: the frame could not be written"), False)])
def test_a_failed_commit_with_a_second_batch_in_flight_puts_both_back_in_order(failure: Exception,
                                                                               applied: bool) -> None:
    broker, bridge, proxy = make()
    broker.commit_outcomes = [(failure, applied)]
    proxy.put(*events(250))
    first = localpush.deliver(proxy, localpush.target(proxy), proxy.queue.take(1))
    assert first is Outcome.RETRY
    assert proxy.delivered == [] and proxy.failing and bridge.problems
    assert ("ABORT", "tx2") in broker.frames                  # written behind the failed one: never committed
    assert [e.record.event.value for e in proxy.queue.take(1000)] == events(250)   # back, in order
    proxy.put()                                               # (nothing new)


def test_the_retry_after_a_failed_commit_delivers_everything_in_order_at_most_twice() -> None:
    broker, _, proxy = make()
    broker.commit_outcomes = [(UnconfirmedOutcome("connection lost before the receipt", "commit"), True)]
    proxy.put(*events(250))
    outcomes = proxy.run()
    assert outcomes[0] is Outcome.RETRY and outcomes[-1] is Outcome.DELIVERED
    got = broker.bodies()
    assert got == events(100) + events(250)                   # the applied first batch again: duplicates only
    assert proxy.delivered == events(250)


def test_a_broker_error_on_a_commit_resends_that_batch_one_by_one_and_puts_the_next_back() -> None:
    broker, _, proxy = make()
    broker.commit_outcomes = [(BrokerError("commit refused"), False)]
    proxy.put(*events(250))
    proxy.run()
    assert broker.bodies() == events(250)
    sends_alone = [f[2] for f in broker.frames if f[0] == "SEND" and f[1] is None]
    assert sends_alone == events(100)                         # the per-message fallback, receipted
    assert all(f[3] is Confirm.CONFIRMED for f in broker.frames if f[0] == "SEND" and f[1] is None)


def test_a_stopped_bridge_or_a_remote_consumer_is_pushed_over_corba() -> None:
    _, bridge, proxy = make()
    bridge.started = False
    assert localpush.target(proxy) is None                   # the CORBA push answers TRANSIENT / OBJECT_NOT_EXIST
    remote = Proxy(None)
    assert localpush.target(remote) is None
    plain = Proxy(SimpleNamespace())                          # a servant of this node that is not a bridge
    assert localpush.target(plain) is None


def test_a_bridge_stopped_between_batches_keeps_the_rest_queued() -> None:
    broker, bridge, proxy = make()
    proxy.put(*events(250))
    real = Pending.wait

    def wait(self: Pending) -> None:
        real(self)
        bridge.started = False

    Pending.wait = wait  # type: ignore[method-assign]
    try:
        outcome = localpush.deliver(proxy, localpush.target(proxy), proxy.queue.take(1))
    finally:
        Pending.wait = real  # type: ignore[method-assign]
    assert outcome is Outcome.RETRY
    assert proxy.delivered == events(200)                   # the batch whose COMMIT was out is settled, not resent
    assert [e.record.event.value for e in proxy.queue.take(1000)] == events(250)[200:]
    assert broker.open == {} and broker.in_flight == []


def test_an_event_the_channel_cannot_convert_goes_to_poison_handling_after_the_batches_in_flight(
        monkeypatch: pytest.MonkeyPatch) -> None:
    broker, _, proxy = make()
    from router.channel.events import as_structured as real

    def convert(event: Event) -> Any:
        if event.value == "unconvertible":
            raise ValueError("cannot convert")
        return real(event)

    monkeypatch.setattr(localpush, "as_structured", convert)
    values = events(250)
    values[150] = "unconvertible"
    proxy.put(*values)
    outcomes = proxy.run()
    assert Outcome.EVENT_FAILED in outcomes
    assert proxy.content_failures[0] == values[100:200]        # the batch that held it, not sent
    expected = [v for v in values if v != "unconvertible"]
    assert broker.bodies() == expected and proxy.delivered == expected       # in order, nothing else lost


def sent_alone(broker: PipeBroker) -> list[Any]:
    return [f[2] for f in broker.frames if f[0] == "SEND" and f[1] is None]


def test_a_refused_batch_whose_dead_letter_is_refused_too_keeps_only_the_rest_queued() -> None:
    """e50 is refused in a batch of 100 and its dead letter is refused too: e0..e49 went to the broker one by one
    before that. They are delivered (journaled) and only e50.. go back; the retries do not send e0..e49 again.
    (Before: the whole batch went back and every retry re-sent e0..e49: unbounded duplicates.)"""
    broker, _, proxy = make()
    broker.refuse.add("e50")
    broker.refuse_dest.add(DEFAULT_DLQ.stomp())
    proxy.put(*events(150))
    for _ in range(3):
        assert localpush.deliver(proxy, localpush.target(proxy), proxy.queue.take(1)) is Outcome.RETRY
    assert proxy.delivered == events(50)
    assert broker.bodies() == events(50)                              # each once
    assert sent_alone(broker).count("e0") == 1 and sent_alone(broker).count("e49") == 1
    assert proxy.failed_attempts == 3                                  # no progress after the first: backoff grows
    broker.refuse_dest.clear()                                         # the DLQ takes it now
    assert proxy.run()[-1] is Outcome.DELIVERED
    assert broker.bodies() == [e for e in events(150) if e != "e50"]  # in order, each once
    dead = [m for d, m in broker.stored if d == DEFAULT_DLQ.stomp()]
    assert len(dead) == 1 and "refused" in str(dead[0].properties["nsjms_dlq_reason"].value)
    assert proxy.delivered == events(150)


def test_an_event_dead_lettered_by_the_mapping_is_not_dead_lettered_again_when_its_batch_is_put_back() -> None:
    """The second batch is mapped (its unmappable event dead-lettered) while the first COMMIT is in flight; that
    COMMIT fails, both batches go back. The dead letter was the event's delivery: the retry does not send another.
    (Before: the event went back with its batch and was dead-lettered on every retry.)"""
    broker, _, proxy = make()
    broker.commit_outcomes = [(UnconfirmedOutcome("no receipt within 30 s", "commit"), False)]
    values = events(250)
    values[150] = "unmappable"
    proxy.put(*values)
    outcomes = proxy.run()
    assert outcomes[0] is Outcome.RETRY and outcomes[-1] is Outcome.DELIVERED
    assert len([1 for d, _ in broker.stored if d == DEFAULT_DLQ.stomp()]) == 1
    assert broker.bodies() == [v for v in values if v != "unmappable"]
    assert sorted(proxy.delivered) == sorted(values)                  # every event left the queue once


def test_a_dead_letter_refused_while_mapping_keeps_the_events_dead_lettered_before_it_delivered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two unmappable events in one batch, the second's dead letter refused: the first one's dead letter stands
    (it is not sent again on the retry), the batch's other events stay queued."""
    broker, bridge, proxy = make()
    real = ChannelToJms._dead_letter
    calls: list[bytes] = []

    def dead_letter(self: ChannelToJms, body: bytes, reason: str) -> None:
        calls.append(body)
        if len(calls) == 2:
            raise SendRefused("ERROR", DEFAULT_DLQ.stomp(), "dlq refused")
        real(self, body, reason)

    monkeypatch.setattr(ChannelToJms, "_dead_letter", dead_letter)
    proxy.put("a", "unmappable", "b", "unmappable", "c")
    assert localpush.deliver(proxy, localpush.target(proxy), proxy.queue.take(1)) is Outcome.RETRY
    assert proxy.delivered == ["unmappable"]
    assert len([1 for d, _ in broker.stored if d == DEFAULT_DLQ.stomp()]) == 1      # the first one's
    assert [e.record.event.value for e in proxy.queue.take(1000)] == ["a", "b", "unmappable", "c"]
    assert bridge.problems


def test_unwinding_with_a_commit_in_flight_drops_its_receipt_waiter(monkeypatch: pytest.MonkeyPatch) -> None:
    """A BaseException (shutdown) while the first batch's COMMIT receipt is in flight: nothing more is waited for,
    but that receipt's waiter is released (before: it stayed in the transport's waiters forever) and every event
    goes back to the queue."""
    broker, _, proxy = make()
    from router.channel.events import as_structured as real

    def convert(event: Event) -> Any:
        if event.value == "e100":
            raise KeyboardInterrupt
        return real(event)

    monkeypatch.setattr(localpush, "as_structured", convert)
    proxy.put(*events(250))               # a backlog: the second batch is converted while tx1's COMMIT is out
    with pytest.raises(KeyboardInterrupt):
        localpush.deliver(proxy, localpush.target(proxy), proxy.queue.take(1))
    assert ("COMMIT", "tx1") in broker.frames and ("DISCARD", "tx1") in broker.frames
    assert broker.in_flight == []
    assert [e.record.event.value for e in proxy.queue.take(1000)] == events(250)


def test_a_teardown_that_stops_waiting_records_every_entry_of_the_batches_in_flight(monkeypatch: Any) -> None:
    """The dispatcher marks in flight only the entries it hands over; localpush takes more (the rest of a batch,
    the batch written behind). A teardown that stops waiting must get all of them (recorded with STUCK_REASON:
    the broker may still commit them), and waits as long as the batches in flight may take their receipts."""
    from router.channel.inflight import Flight

    entered, gate = threading.Event(), threading.Event()

    class SlowPending(Pending):
        def wait(self) -> None:
            entered.set()
            gate.wait(30)
            super().wait()

    class SlowBroker(PipeBroker):
        def commit_pipelined(self, transaction: str) -> Pending:
            p = super().commit_pipelined(transaction)
            return SlowPending(self, p.tx, p.messages, p.outcome, p.applied)

    broker = SlowBroker()
    bridge = Bridge()
    transport: Any = broker
    flow = ChannelToJms(bridge, QUEUE, transport, to_jms, DeadLetter(lambda: transport, bridge.id),
                        lambda ev: str(ev).encode())
    proxy: Any = Proxy(SimpleNamespace(local_batches=LocalBatches(flow)))
    proxy.closing = False
    proxy.push_flight = flight = Flight[Entry]()
    proxy.put(*events(250))
    monkeypatch.setattr(localpush, "RECEIPT_TIMEOUT_S", 0.01, raising=False)

    def dispatch() -> None:
        entries = proxy.queue.take(1)
        assert flight.begin(entries, lambda: proxy.closing)
        try:
            localpush.deliver(proxy, localpush.target(proxy), entries)
        finally:
            flight.end()

    worker = threading.Thread(target=dispatch)
    worker.start()
    try:
        assert entered.wait(30)                              # batch 1's COMMIT awaited, batch 2 written behind it
        proxy.closing = True
        stuck = [e.record.event.value for e in flight.wait_ended(0.0)]
        assert stuck == events(200)                          # both batches, not only the one the dispatcher passed
        assert proxy.delivered == []
    finally:
        gate.set()
        worker.join(30)
    assert proxy.delivered == events(200)                    # the broker committed both; nothing more taken
    assert [e.record.event.value for e in proxy.queue.take(1000)] == events(250)[200:]


_FULL = ("Persistent store is Full, 100% of 1048576. Stopping producer (ID:h-1:1:1:1) to prevent flooding "
         "queue://out. See http://activemq.apache.org/producer-flow-control.html for more info (blocking for: 0s)")


class FullBroker(PipeBroker):
    """A broker whose store for ``out`` is full: its COMMITs are refused (the SENDs in them got the ERROR) and a
    message sent alone to ``out`` gets the same resource refusal; the dead-letter queue still has room (a
    per-destination limit), so only the classification keeps the events out of it."""

    full = True

    def send(self, destination: Destination | str, message: JmsMessage, *, transaction: str | None = None,
             confirm: Confirm = Confirm.CONFIRMED, headers: Any = None) -> None:
        dest = destination.stomp() if isinstance(destination, Destination) else destination
        if self.full and transaction is None and dest == QUEUE.stomp():
            self.frames.append(("SEND", transaction, message.body, confirm))
            raise refused_send(BrokerError(_FULL, "javax.jms.ResourceAllocationException: " + _FULL), dest)
        super().send(destination, message, transaction=transaction, confirm=confirm, headers=headers)


def test_a_full_broker_store_defers_the_batch_and_dead_letters_nothing() -> None:
    """Issue 31: a resource refusal is an outage: the batch goes back to the queue in order, nothing is sent one
    by one nor dead-lettered; once the store has room everything is delivered."""
    broker = FullBroker()
    bridge = Bridge()
    transport: Any = broker
    flow = ChannelToJms(bridge, QUEUE, transport, to_jms, DeadLetter(lambda: transport, bridge.id),
                        lambda ev: str(ev).encode())
    proxy = Proxy(SimpleNamespace(local_batches=LocalBatches(flow)))
    broker.commit_outcomes = [(BrokerError(f"transaction tx1: a frame in it failed before the COMMIT was confirmed "
                                           f"({_FULL}); the broker committed it without that frame"), False)]
    proxy.put(*events(150))
    assert localpush.deliver(proxy, localpush.target(proxy), proxy.queue.take(1)) is Outcome.RETRY
    assert broker.bodies(DEFAULT_DLQ) == [] and flow.dead_letter.count == 0 and proxy.delivered == []
    assert not [f for f in broker.frames if f[0] == "SEND" and f[1] is None], "nothing sent one by one"
    assert "broker out of resources" in str(bridge.problems[-1]) or "Persistent store is Full" in str(
        bridge.problems[-1])
    assert [e.record.event.value for e in proxy.queue._all()] == events(150)
    broker.full = False
    assert proxy.run()[-1] is Outcome.DELIVERED
    assert broker.bodies() == events(150) and proxy.delivered == events(150) and broker.bodies(DEFAULT_DLQ) == []


# ------------------------------------------------------------------------------------------------ dedupe ids
def _ids(broker: PipeBroker) -> list[tuple[Any, str]]:
    """(body, nsjms_dedupe_id) of each message the broker stored on the bridge's destination."""
    return [(m.body, str(m.properties["nsjms_dedupe_id"].value)) for d, m in broker.stored if d == QUEUE.stomp()]


def test_a_batch_sent_again_after_a_lost_commit_receipt_carries_its_original_dedupe_ids() -> None:
    """Issue 31: without T2 a batch whose COMMIT receipt was lost is sent again; every copy carries the channel's id
    of its event for this proxy (the ledger's ``e<event>/c<channel>/a<admin>/p<proxy>``), so a JMS consumer drops
    the duplicates; a BestEffort event's id is its run's and seq's."""
    broker, _, proxy = make()
    broker.commit_outcomes = [(UnconfirmedOutcome("connection lost before the receipt", "commit"), True)]
    proxy.put(*events(150))
    proxy.put("volatile", stored=False)
    proxy.run()
    got = _ids(broker)
    assert [b for b, _ in got] == events(100) + events(150) + ["volatile"]      # the first batch twice
    expected = {f"e{i}": f"e{i + 1}/c1/a2/p3" for i in range(150)} | {"volatile": "br1/s151/c1/a2/p3"}
    assert all(did == expected[body] for body, did in got), [x for x in got if x[1] != expected[x[0]]][:3]


def test_a_batch_resent_one_by_one_and_a_frame_of_the_mapping_carry_the_dedupe_ids() -> None:
    """The one-by-one resend after a refused COMMIT (encoded again from the message) and the frames a bridge maps
    and encodes at once (``to_frame``) carry the same ids as the batch's SENDs."""
    class FrameBroker(PipeBroker):
        def send_encoded(self, destination: Destination, encoded: EncodedMessage, *, transaction: str | None,
                         confirm: Confirm, persistent: bool) -> None:
            props = {k: Typed(JmsType.STRING, v) for k, v in encoded.headers.items()}
            self.send(destination, JmsMessage(BodyType.TEXT, encoded.body.decode(), properties=props),
                      transaction=transaction, confirm=confirm)

        def send_encoded_many(self, destination: Destination, messages: Any, *, transaction: str) -> None:
            for encoded, persistent in messages:
                self.send_encoded(destination, encoded, transaction=transaction, confirm=Confirm.PIPELINED,
                                  persistent=persistent)

    broker, bridge = FrameBroker(), Bridge()
    transport: Any = broker
    flow = ChannelToJms(bridge, QUEUE, transport, to_jms, DeadLetter(lambda: transport, bridge.id),
                        lambda ev: str(ev).encode())
    frames: list[EncodedMessage] = []

    def to_frame(event: Any, destination: Destination) -> tuple[JmsMessage, EncodedMessage]:
        frames.append(EncodedMessage({"$event_name": str(event)}, str(event).encode()))
        return to_jms(event, destination), frames[-1]

    proxy = Proxy(SimpleNamespace(local_batches=LocalBatches(flow, to_frame)))
    broker.commit_outcomes = [(BrokerError("commit refused"), False)]
    proxy.put(*events(3))
    localpush.deliver(proxy, localpush.target(proxy), proxy.queue.take(1))
    assert [f.headers["nsjms_dedupe_id"] for f in frames] == ["e1/c1/a2/p3", "e2/c1/a2/p3", "e3/c1/a2/p3"]
    assert _ids(broker) == [("e0", "e1/c1/a2/p3"), ("e1", "e2/c1/a2/p3"), ("e2", "e3/c1/a2/p3")]
