"""Proxy supplier delivery without services: injected failures, put-back, poison events, dead letters.

The proxies are built around a fake runtime and a fake consumer (no ORB calls: ``setClientCallTimeout`` is
stubbed), so each failure permutation is a fast test. Waiting is on conditions with a deadline, never a sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

import omniORB
from omniORB import CORBA

from router.channel import proxies as P
from router.channel.boundary import POISON_ATTEMPTS, Outcome
from router.channel.channel import EventChannelImpl
from router.channel.events import Event, Form
from router.channel.queue import FIFO_ORDER, ProxyQueue, Record
from router.db.testing import NullDatabase
from router.routing.ledger import LedgerWriter

DEADLINE_S = 20.0


def wait_for(cond: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


class FakeStore:
    ledger = LedgerWriter()

    def __init__(self) -> None:
        self.deleted: list[int] = []
        self.conns: list[tuple[int, object]] = []                # (event id, unit of work it was deleted in)
        self.outcomes: dict[int, tuple[str, str | None]] = {}   # event id → (ledger outcome, reason)

    def delete_deliveries(self, conn: object, cid: int, aid: int, pid: int, ids: list[int], **how: Any) -> None:
        self.conns.extend((i, conn) for i in ids)
        self.deleted.extend(ids)
        for i in ids:
            self.outcomes[i] = (str(how.get("outcome", "delivered")), how.get("reason"))


class FakeDeadLetters:
    """The dead-letter store: records each write with the connection (unit of work) it was made on."""

    def __init__(self) -> None:
        self.queued: list[tuple[object, int, dict[str, Any]]] = []    # (conn, event id, details)
        self.rows: list[tuple[object, Any]] = []                       # (conn, NewDeadLetter)
        self.refuse = 0                                                # fail this many writes first

    def _maybe_refuse(self) -> None:
        if self.refuse:
            self.refuse -= 1
            raise RuntimeError("injected: the dead-letter store is unavailable")

    def add_queued(self, conn: object, cid: int, aid: int, pid: int, eid: int, **details: Any) -> int:
        self._maybe_refuse()
        self.queued.append((conn, eid, details))
        return len(self.queued)

    def add(self, conn: object, row: Any) -> int:
        self._maybe_refuse()
        self.rows.append((conn, row))
        return len(self.rows)


class FakeRt:
    def __init__(self) -> None:
        self.store = FakeStore()
        self.dead_letters = FakeDeadLetters()
        self.db = NullDatabase()
        self.shutting_down = threading.Event()
        self.push_timeout_ms = 1000
        self.max_event_bytes = 0
        self.t2: Any = None                    # no routing transactions (router.channel.runtime.Runtime.t2)
        self._seq = 1000

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq


class Consumer:
    """Records what it receives; ``fail(event_seq_or_none)`` decides what to raise for one call."""

    def __init__(self, fail: Callable[[list[int]], BaseException | None] = lambda seqs: None) -> None:
        self.got: list[int] = []
        self.calls = 0
        self.fail = fail
        self.probe: BaseException | bool = False        # what _non_existent answers (or raises)

    def _non_existent(self) -> bool:
        if isinstance(self.probe, BaseException):
            raise self.probe
        return self.probe

    def _receive(self, seqs: list[int]) -> None:
        self.calls += 1
        exc = self.fail(seqs)
        if exc is not None:
            raise exc
        self.got.extend(seqs)

    def push_structured_event(self, ev: Any) -> None:
        self._receive([ev])

    def push_structured_events(self, evs: list[Any]) -> None:
        self._receive(list(evs))


def make_proxy(cls: type, consumer: Consumer, monkeypatch: pytest.MonkeyPatch, *, batch: int = 1) -> Any:
    monkeypatch.setattr(omniORB, "setClientCallTimeout", lambda obj, ms: None)
    proxy: Any = object.__new__(cls)
    proxy.rt = FakeRt()
    proxy.oid = "ch/0/C/0/1"
    proxy.id = 1
    proxy.admin = type("Admin", (), {"id": 0})()
    proxy.channel = type("Channel", (), {"id": 0})()
    proxy.form = "SEQUENCE" if "Sequence" in cls.__name__ else "STRUCTURED"
    proxy.qos = {"MaximumBatchSize": batch, "PacingInterval": 0}
    proxy.connected, proxy.suspended, proxy.destroyed = True, False, False
    proxy.stop_event = threading.Event()
    proxy.client = consumer
    proxy.client_ior = "IOR:fake"
    proxy.queue = ProxyQueue(FIFO_ORDER, 0, 0, proxy._dropped)
    proxy.dead_lettered, proxy.last_dead_letter, proxy.isolating = 0, None, 0
    if hasattr(cls, "_pull_lock"):
        pass
    return proxy


def _raising(exc: BaseException | None) -> Callable[[list[int]], BaseException | None]:
    return lambda seqs: exc


def record(seq: int, db_id: int | None = None) -> Record:
    # The event value is its seq: the fake consumer sees ints (convert passes STRUCTURED values through).
    return Record(seq, Event(Form.STRUCTURED, seq), 0, None, None, db_id is not None, db_id)


def run_worker(proxy: Any) -> threading.Thread:
    t = threading.Thread(target=proxy.supervised(proxy._push_loop), daemon=True)
    t.start()
    return t


def stop(proxy: Any, t: threading.Thread) -> None:
    proxy.stop_event.set()
    proxy.queue.wake()
    t.join(5)
    assert not t.is_alive()


# -- a failing worker puts back what it took -------------------------------------------------------------------
def test_non_corba_failure_in_a_push_loses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    failures = iter([RuntimeError("injected: bug in delivery")])
    consumer = Consumer(lambda seqs: next(failures, None))
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, consumer, monkeypatch)
    for i in range(1, 6):
        proxy.queue.put(record(i))
    t = run_worker(proxy)
    try:
        wait_for(lambda: len(consumer.got) == 5, "all five events after the injected failure")
    finally:
        stop(proxy, t)
    assert consumer.got == [1, 2, 3, 4, 5]        # before the fix, event 1 was taken and dropped
    assert len(proxy.queue) == 0


def test_non_corba_failure_in_conversion_is_retried_then_dead_lettered(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = Consumer()
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, consumer, monkeypatch)
    real_convert = proxy.convert

    def convert(entries: list[Any]) -> Any:
        if entries[0].record.seq == 2:
            raise ValueError("injected: event 2 cannot be converted")
        return real_convert(entries)

    monkeypatch.setattr(proxy, "convert", convert)
    for i in (1, 2, 3):
        proxy.queue.put(record(i, db_id=100 + i))
    t = run_worker(proxy)
    try:
        wait_for(lambda: consumer.got == [1, 3], "the events around the unconvertible one")
    finally:
        stop(proxy, t)
    assert proxy.dead_lettered == 1
    assert "seq=2" in proxy.last_dead_letter and "ValueError" in proxy.last_dead_letter
    assert sorted(proxy.rt.store.deleted) == [101, 102, 103]   # the dead letter left the store with a log line
    outcomes = proxy.rt.store.outcomes                         # and the ledger learns why each left
    assert outcomes[101] == outcomes[103] == ("delivered", None)
    assert outcomes[102][0] == "dead_letter" and "injected: event 2 cannot be converted" in str(outcomes[102][1])


def test_expired_and_discarded_entries_leave_the_store_with_their_ledger_outcome(
        monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, Consumer(), monkeypatch)
    gone = Record(1, Event(Form.STRUCTURED, 1), 0, time.time() - 1, None, True, 201)   # its deadline passed
    proxy.queue.put(gone)
    proxy.queue.put(record(2, db_id=202))
    assert [e.record.seq for e in proxy.queue.take(5)] == [2]
    proxy.queue.max_events = 1
    proxy.queue.put(record(3, db_id=203))
    proxy.queue.put(record(4, db_id=204))                      # the queue is full: the DiscardPolicy drops one
    outcomes = proxy.rt.store.outcomes
    assert outcomes[201][0] == "expired" and "deadline passed" in str(outcomes[201][1])
    assert [o for o, _ in outcomes.values()].count("discarded") == 1
    assert "MaxEventsPerConsumer" in str(next(r for o, r in outcomes.values() if o == "discarded"))


# -- poison events ------------------------------------------------------------------------------------------------
def test_poison_event_in_a_batch_is_isolated_and_dead_lettered(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(seqs: list[int]) -> BaseException | None:
        return CORBA.MARSHAL(0, CORBA.COMPLETED_NO) if 3 in seqs else None

    consumer = Consumer(fail)
    proxy = make_proxy(P.SequenceProxyPushSupplierImpl, consumer, monkeypatch, batch=3)
    for i in range(1, 7):
        proxy.queue.put(record(i))
    t = run_worker(proxy)
    try:
        wait_for(lambda: sorted(consumer.got) == [1, 2, 4, 5, 6], "every event but the poison one")
    finally:
        stop(proxy, t)
    assert consumer.got == [1, 2, 4, 5, 6]        # order kept
    assert proxy.dead_lettered == 1 and "MARSHAL" in proxy.last_dead_letter
    assert len(proxy.queue) == 0
    assert proxy.status_extra()["dead_lettered"] == 1


def test_poison_event_is_attempted_a_bounded_number_of_times(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[int] = []

    def fail(seqs: list[int]) -> BaseException | None:
        if seqs == [1]:
            attempts.append(1)
            failure: BaseException = CORBA.IMP_LIMIT(0, CORBA.COMPLETED_NO)
            return failure
        return None

    consumer = Consumer(fail)
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, consumer, monkeypatch)
    proxy.queue.put(record(1))
    proxy.queue.put(record(2))
    t = run_worker(proxy)
    try:
        wait_for(lambda: consumer.got == [2], "the event behind the poison one")
    finally:
        stop(proxy, t)
    assert len(attempts) == POISON_ATTEMPTS


def test_transient_failures_are_never_dead_lettered(monkeypatch: pytest.MonkeyPatch) -> None:
    failures = iter([CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)] * (POISON_ATTEMPTS + 2))
    consumer = Consumer(lambda seqs: next(failures, None))
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, consumer, monkeypatch)
    proxy.queue.put(record(1))
    t = run_worker(proxy)
    try:
        wait_for(lambda: consumer.got == [1], "delivery after the consumer came back")
    finally:
        stop(proxy, t)
    assert proxy.dead_lettered == 0


def test_attempt_classifies_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [(CORBA.MARSHAL(0, CORBA.COMPLETED_NO), Outcome.EVENT_FAILED),
             (CORBA.BAD_PARAM(0, CORBA.COMPLETED_NO), Outcome.EVENT_FAILED),
             (CORBA.COMM_FAILURE(0, CORBA.COMPLETED_MAYBE), Outcome.RETRY),
             (CORBA.TIMEOUT(0, CORBA.COMPLETED_MAYBE), Outcome.RETRY),
             (CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO), Outcome.GONE),
             (None, Outcome.DELIVERED)]
    for exc, expected in cases:
        proxy = make_proxy(P.StructuredProxyPushSupplierImpl, Consumer(_raising(exc)), monkeypatch)
        proxy.queue.put(record(1))
        outcome, _ = proxy._attempt(proxy.queue.take(1))
        assert outcome is expected, exc


def test_connection_closed_while_sending_counts_against_the_event_only_if_the_consumer_answers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    closed = CORBA.COMM_FAILURE(omniORB.COMM_FAILURE_MarshalArguments, CORBA.COMPLETED_NO)
    for probe, expected in [(False, Outcome.EVENT_FAILED), (True, Outcome.GONE),
                            (CORBA.TRANSIENT(0, CORBA.COMPLETED_NO), Outcome.RETRY)]:
        consumer = Consumer(lambda seqs: closed)
        consumer.probe = probe
        proxy = make_proxy(P.StructuredProxyPushSupplierImpl, consumer, monkeypatch)
        proxy.queue.put(record(1))
        outcome, _ = proxy._attempt(proxy.queue.take(1))
        assert outcome is expected, probe


# -- pull proxies ---------------------------------------------------------------------------------------------------
def make_pull(monkeypatch: pytest.MonkeyPatch) -> Any:
    proxy = make_proxy(P.StructuredProxyPullSupplierImpl, Consumer(), monkeypatch)
    proxy._unconfirmed, proxy._pull_lock, proxy._pulls_active = [], threading.Lock(), 0
    proxy.max_pull_wait = DEADLINE_S
    proxy.filters = None
    return proxy


def test_pull_reply_that_cannot_be_converted_is_not_confirmed_by_the_next_pull(
        monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = make_pull(monkeypatch)
    proxy.queue.put(record(1, db_id=11))
    proxy.queue.put(record(2, db_id=12))
    real_convert = proxy.convert
    broken = iter([ValueError("injected: conversion bug")])

    def convert(entries: list[Any]) -> Any:
        exc = next(broken, None)
        if exc is not None:
            raise exc
        return real_convert(entries)

    monkeypatch.setattr(proxy, "convert", convert)
    with pytest.raises(CORBA.TRANSIENT):
        proxy.try_pull_structured_event()
    assert proxy._unconfirmed == []
    assert proxy.try_pull_structured_event() == (1, True)   # before the fix event 1 was confirmed unseen: lost
    assert proxy.try_pull_structured_event() == (2, True)
    assert proxy.rt.store.deleted == [11]                    # confirmed by the pull after it, as before


# -- routing: a BestEffort copy is not dropped ------------------------------------------------------------------
def test_routing_queues_the_event_when_a_mapping_filter_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, Consumer(), monkeypatch)

    def broken(rec: Record) -> Record:
        raise RuntimeError("injected: mapping filter evaluation failed")

    monkeypatch.setattr(proxy, "_mapped", broken)
    EventChannelImpl._enqueue_one(proxy, record(7))        # a BestEffort copy (no stored row to come back from)
    assert [e.record.seq for e in proxy.queue.take(10)] == [7]


# -- the subscription/offer notifier survives a failing proxy ----------------------------------------------------
def test_sharing_notifier_survives_a_non_corba_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    from router.channel import sharing as SH

    monkeypatch.setattr(omniORB, "setClientCallTimeout", lambda obj, ms: None)

    class Rt:
        shutting_down = threading.Event()

        def spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
            t = threading.Thread(target=target, daemon=True)
            t.start()
            return t

    class Chan:
        id = 0
        rt = Rt()
        consumer_admins: ClassVar[dict[int, Any]] = {}
        supplier_admins: ClassVar[dict[int, Any]] = {}

    class Client:
        def __init__(self) -> None:
            self.changes: list[Any] = []

        def _is_a(self, repo_id: str) -> bool:
            return True

        def _unchecked_narrow(self, iface: Any) -> Any:
            return self

        def offer_change(self, add: Any, rem: Any) -> None:
            self.changes.append((add, rem))

    class BrokenProxy:
        oid = "broken"

        def client_ref(self) -> Any:
            raise RuntimeError("injected: not a CORBA failure")

    good_client = Client()

    class GoodProxy:
        oid = "good"

        def client_ref(self) -> Any:
            return good_client

    sharing = SH.Sharing(Chan())
    sharing._queue.put((BrokenProxy(), "offer", [], []))
    sharing._queue.put((GoodProxy(), "offer", ["t"], []))
    worker = Chan.rt.spawn("sharing", sharing._run)
    try:
        wait_for(lambda: good_client.changes == [(["t"], [])], "the notification behind the failing one")
        assert worker.is_alive()                  # before the fix the worker died at the first item
    finally:
        Chan.rt.shutting_down.set()
        worker.join(5)


def test_pull_during_a_database_outage_answers_transient_and_confirms_later(monkeypatch: pytest.MonkeyPatch) -> None:
    from router.channel.store import StoreUnavailable

    proxy = make_pull(monkeypatch)
    store = proxy.rt.store
    down = threading.Event()
    real_delete = store.delete_deliveries

    def delete(conn: object, cid: int, aid: int, pid: int, ids: list[int], **how: Any) -> None:
        if down.is_set():
            raise StoreUnavailable("injected: database down")
        real_delete(conn, cid, aid, pid, ids)

    store.delete_deliveries = delete
    for i in (1, 2):
        proxy.queue.put(record(i, db_id=10 + i))
    assert proxy.try_pull_structured_event() == (1, True)
    down.set()
    answer: list[Any] = []
    t = threading.Thread(target=lambda: answer.append(_call(proxy.try_pull_structured_event)), daemon=True)
    t.start()
    wait_for(lambda: bool(answer), "the pull to answer while the database is down")   # it used to block
    assert isinstance(answer[0], CORBA.TRANSIENT) and answer[0].completed == CORBA.COMPLETED_NO
    assert [e.record.seq for e in proxy._unconfirmed] == [1] and proxy._pulls_active == 0
    down.clear()
    assert proxy.try_pull_structured_event() == (2, True)
    assert store.deleted == [11]


def _call(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 — the test inspects it
        return exc


def test_pulled_event_above_the_size_limit_is_refused_alone_not_retried_forever() -> None:
    from router.channel.boundary import MINOR_EVENT_TOO_LARGE
    from router.channel.consumers import StructuredProxyPullConsumerImpl

    consumer: Any = object.__new__(StructuredProxyPullConsumerImpl)
    consumer.oid, consumer.rt, consumer.id = "ch/0/S/0/1", FakeRt(), 1
    consumer.channel, consumer.admin = type("Channel", (), {"id": 0})(), type("Admin", (), {"id": 0})()
    consumer.dead_lettered, consumer.last_dead_letter = 0, None
    routed: list[list[int]] = []

    def route(events: list[Any]) -> None:
        if any(ev.value == 2 for ev in events):
            raise CORBA.IMP_LIMIT(MINOR_EVENT_TOO_LARGE, CORBA.COMPLETED_NO)
        routed.append([ev.value for ev in events])

    consumer._route_acked = route
    batch = [Event(Form.ANY, i) for i in (1, 2, 3)]
    consumer.rt.dead_letters.refuse = 1                   # the dead-letter store is down at first: nothing is lost
    assert consumer._route_pulled(batch) == [Event(Form.ANY, 2), Event(Form.ANY, 3)]
    assert consumer.rt.dead_letters.rows == [] and consumer.dead_lettered == 0
    assert consumer._route_pulled(batch[1:]) == []        # settled: it used to be "channel full, retry" forever
    assert routed == [[1], [3]]
    [(_, row)] = consumer.rt.dead_letters.rows            # kept with its reason (it used to be a log line only)
    assert (row.side, row.channel_id, row.admin_id, row.proxy_id) == ("S", 0, 0, 1)
    assert "size limit" in row.reason and row.exception.startswith("IMP_LIMIT")
    assert consumer.dead_lettered == 1


def test_pulled_events_wait_while_the_channel_is_full() -> None:
    from router.channel.consumers import StructuredProxyPullConsumerImpl

    consumer: Any = object.__new__(StructuredProxyPullConsumerImpl)
    consumer.oid, consumer.rt = "ch/0/S/0/1", FakeRt()

    def full(events: list[Any]) -> None:
        raise CORBA.IMP_LIMIT(0, CORBA.COMPLETED_NO)       # MaxQueueLength with RejectNewEvents

    consumer._route_acked = full
    waiting = [Event(Form.ANY, 1)]
    assert consumer._route_pulled(waiting) == waiting


# -- pull confirmation: only replies that were built -----------------------------------------------------------
def test_a_concurrent_pull_never_confirms_a_reply_still_being_built(monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = make_pull(monkeypatch)
    for i in (1, 2, 3):
        proxy.queue.put(record(i, db_id=10 + i))
    building = threading.Event()
    release = threading.Event()
    real_convert = proxy.convert

    def slow_convert(entries: list[Any]) -> Any:
        if entries[0].record.seq == 1:          # pull A: its events are taken, its reply not yet built
            building.set()
            release.wait(DEADLINE_S)
        return real_convert(entries)

    monkeypatch.setattr(proxy, "convert", slow_convert)
    answer: list[Any] = []
    a = threading.Thread(target=lambda: answer.append(_call(proxy.try_pull_structured_event)), daemon=True)
    a.start()
    wait_for(building.is_set, "pull A to have taken event 1")
    assert proxy.try_pull_structured_event() == (2, True)     # pull B, concurrent with A
    assert proxy.rt.store.deleted == []         # before the fix B deleted event 1's row: A's reply was not sent
    release.set()
    a.join(DEADLINE_S)
    assert answer == [(1, True)]
    assert proxy.try_pull_structured_event() == (3, True)     # pull C started after A and B were built
    assert sorted(proxy.rt.store.deleted) == [11, 12]


def test_a_blocking_pull_answers_transient_before_the_client_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from router.channel.boundary import MINOR_PULL_WAIT_OVER

    proxy = make_pull(monkeypatch)
    proxy.max_pull_wait = 0.05                  # the client's call timeout would be longer
    answer: list[Any] = []
    t = threading.Thread(target=lambda: answer.append(_call(proxy.pull_structured_event)), daemon=True)
    t.start()
    wait_for(lambda: bool(answer), "the blocking pull to answer")   # before the fix it waited on, past any client
    exc = answer[0]
    assert isinstance(exc, CORBA.TRANSIENT), exc
    assert exc.minor == MINOR_PULL_WAIT_OVER and exc.completed == CORBA.COMPLETED_NO
    assert proxy._pulls_active == 0 and proxy._unconfirmed == []
    proxy.queue.put(record(1, db_id=11))        # an event arriving after the pull answered stays for the next one
    assert proxy.pull_structured_event() == 1
    assert proxy.rt.store.deleted == []
    assert proxy.try_pull_structured_event()[1] is False
    assert proxy.rt.store.deleted == [11]


def test_pulled_events_already_routed_are_not_routed_again_when_a_later_one_waits() -> None:
    from router.channel.boundary import MINOR_EVENT_TOO_LARGE
    from router.channel.consumers import StructuredProxyPullConsumerImpl

    consumer: Any = object.__new__(StructuredProxyPullConsumerImpl)
    consumer.oid, consumer.rt, consumer.id = "ch/0/S/0/1", FakeRt(), 1
    consumer.rt.max_event_bytes = 10
    consumer.channel = type("Channel", (), {"id": 0, "qos": {}, "admin_props": {}})()
    consumer.admin = type("Admin", (), {"id": 0, "qos": {}})()
    consumer.qos, consumer.extra = {}, {}
    consumer.stop_event = threading.Event()
    consumer.suspended = False
    routed: list[int] = []
    full = [True]

    def route(events: list[Any]) -> None:
        values = [ev.value for ev in events]
        if 2 in values:
            raise CORBA.IMP_LIMIT(MINOR_EVENT_TOO_LARGE, CORBA.COMPLETED_NO)
        if values == [3] and full[0]:
            full[0] = False                                 # the channel is full once, then has room
            raise CORBA.IMP_LIMIT(0, CORBA.COMPLETED_NO)
        routed.extend(values)
        if 3 in values:
            consumer.stop_event.set()

    pulls = iter([[Event(Form.ANY, i) for i in (1, 2, 3)]])
    consumer._route_acked = route
    consumer._channel_full = lambda: False
    consumer.client_ref = lambda: None
    consumer.pull_once = lambda supplier: next(pulls, [])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(omniORB, "setClientCallTimeout", lambda obj, ms: None)
        consumer._pull_loop()
    assert routed == [1, 3]                 # before the fix: [1, 1, 3] (the whole pulled list was routed again)


def test_a_pulled_event_the_channel_refuses_is_dead_lettered_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    from router.channel.boundary import MINOR_EVENT_TOO_LARGE
    from router.channel.consumers import SequenceProxyPullConsumerImpl

    consumer: Any = object.__new__(SequenceProxyPullConsumerImpl)
    consumer.oid, consumer.rt, consumer.id = "ch/0/S/0/1", FakeRt(), 1
    consumer.rt.max_event_bytes = 10
    consumer.channel, consumer.admin = type("Channel", (), {"id": 0})(), type("Admin", (), {"id": 0})()
    routed: list[int] = []

    def route(events: list[Any]) -> None:
        values = [ev.value for ev in events]
        if 2 in values:
            raise CORBA.BAD_QOS(0, CORBA.COMPLETED_NO)
        if 4 in values:
            raise CORBA.IMP_LIMIT(MINOR_EVENT_TOO_LARGE, CORBA.COMPLETED_NO)
        routed.extend(values)

    consumer._route_acked = route
    with caplog.at_level("ERROR", logger="nsjms.channel"):
        assert consumer._route_pulled([Event(Form.ANY, i) for i in (1, 2, 3, 4)]) == []
    assert routed == [1, 3]
    status = consumer.status_extra()                 # before the fix: only a log line, no dead-letter record
    assert status["dead_lettered"] == 2
    assert "IMP_LIMIT" in status["last_dead_letter"] and "size limit of 10 bytes" in status["last_dead_letter"]
    lines = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(lines) == 2 and all("DEAD-LETTERED" in line for line in lines)
    assert "BAD_QOS" in lines[0] and "QoS headers are unusable" in lines[0]


# -- teardown survives a store outage ---------------------------------------------------------------------------
class TeardownWorld:
    """Admin, runtime and store twins for a proxy's teardown; the store refuses ``down`` deletes first."""

    def __init__(self, proxy: Any, down: int) -> None:
        from router.channel.store import StoreUnavailable
        from router.channel.typesets import TypeSet

        world = self
        self.down, self.deleted, self.forgotten, self.deactivated = down, 0, False, False

        class Admin:
            id = 0

            def forget_proxy(self, pid: int) -> None:
                world.forgotten = True

        def delete_proxy(conn: Any, cid: int, side: str, aid: int, pid: int) -> None:
            if world.down:
                world.down -= 1
                raise StoreUnavailable("injected: database down")
            world.deleted += 1

        def deactivate(oid: str) -> None:
            world.deactivated = True

        proxy.admin, proxy.side, proxy.filters, proxy.types = Admin(), "C", None, TypeSet()
        proxy._lock = threading.RLock()
        proxy.rt.store.delete_proxy = delete_proxy
        proxy.rt.deactivate = deactivate


def test_a_disconnect_that_failed_on_the_store_is_finished_by_the_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, Consumer(), monkeypatch)
    world = TeardownWorld(proxy, down=1)
    proxy.queue.put(record(1, db_id=11))
    with pytest.raises(CORBA.TRANSIENT) as refused:
        proxy.disconnect_structured_push_supplier()
    assert refused.value.completed == CORBA.COMPLETED_NO
    assert not proxy.destroyed and not proxy.connected and not world.forgotten and not world.deactivated
    assert proxy.wants(Event(Form.ANY, 0)) is False        # stopped: nothing more is queued or pushed to it
    proxy.disconnect_structured_push_supplier()            # the client's retry
    assert world.deleted == 1                               # before the fix the retry saw `destroyed` and did nothing
    assert proxy.destroyed and world.forgotten and world.deactivated


def test_a_consumer_found_gone_is_deleted_once_the_store_is_back(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = Consumer(_raising(CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO)))
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, consumer, monkeypatch)
    world = TeardownWorld(proxy, down=2)
    proxy.queue.put(record(1, db_id=11))
    t = run_worker(proxy)
    wait_for(lambda: world.deactivated, "the gone consumer's proxy to be deleted and deactivated")
    t.join(DEADLINE_S)
    assert world.deleted == 1 and world.forgotten and proxy.destroyed   # before the fix: row kept, proxy a zombie


def test_a_channel_destroy_that_failed_on_the_store_is_finished_by_the_retry() -> None:
    from router.channel.store import StoreUnavailable

    done: list[str] = []
    down = [1]

    class Admin:
        oid = "ch/0/C/0"

        def teardown(self, *, deactivate: bool = True) -> None:
            done.append("admin teardown")

    class Store:
        def delete_channel(self, conn: Any, cid: int) -> None:
            if down[0]:
                down[0] -= 1
                raise StoreUnavailable("injected: database down")
            done.append("deleted")

    channel: Any = object.__new__(EventChannelImpl)
    channel.id, channel.oid, channel._lock, channel.destroyed = 0, "ch/0", threading.RLock(), False
    channel.consumer_admins, channel.supplier_admins = {0: Admin()}, {}
    channel.rt = type("Rt", (), {"store": Store(), "db": NullDatabase(),
                                 "deactivate": lambda self, oid: done.append(f"deactivate {oid}")})()
    channel.factory = type("Factory", (), {"forget": lambda self, cid: done.append("forgotten")})()
    with pytest.raises(CORBA.TRANSIENT):
        channel.destroy()
    assert channel.destroyed and done == ["admin teardown"]        # stopped, still stored and active
    channel.destroy()                                               # the client's retry
    assert done == ["admin teardown", "admin teardown", "deleted", "deactivate ch/0/C/0", "forgotten",
                    "deactivate ch/0"]                              # before the fix the retry returned at once


def test_an_admin_destroy_that_failed_on_the_store_is_finished_by_the_retry() -> None:
    from router.channel.admins import ConsumerAdminImpl
    from router.channel.store import StoreUnavailable

    done: list[str] = []
    down = [1]

    class Store:
        def delete_admin(self, conn: Any, cid: int, side: str, aid: int) -> None:
            if down[0]:
                down[0] -= 1
                raise StoreUnavailable("injected: database down")
            done.append("deleted")

    admin: Any = object.__new__(ConsumerAdminImpl)
    admin.id, admin.side, admin.es_style, admin.oid = 1, "C", False, "ch/0/C/1"
    admin._lock, admin.destroyed, admin.proxies = threading.RLock(), False, {}
    admin.channel = type("Channel", (), {"id": 0, "consumer_admins": {1: admin}, "supplier_admins": {}})()
    admin.rt = type("Rt", (), {"store": Store(), "db": NullDatabase(),
                               "deactivate": lambda self, oid: done.append(f"deactivate {oid}")})()
    with pytest.raises(CORBA.TRANSIENT):
        admin.destroy()
    assert done == []                            # before the fix it was deactivated: the retry met OBJECT_NOT_EXIST
    admin.destroy()
    assert done == ["deleted", "deactivate ch/0/C/1"] and admin.channel.consumer_admins == {}


def test_a_pull_proxy_shows_its_dead_letters_in_status(monkeypatch: pytest.MonkeyPatch) -> None:
    from router.channel.boundary import POISON_ATTEMPTS

    proxy = make_pull(monkeypatch)
    proxy.queue.put(record(1, db_id=11))

    def convert(entries: list[Any]) -> Any:
        raise ValueError("injected: cannot convert")

    monkeypatch.setattr(proxy, "convert", convert)
    for _ in range(POISON_ATTEMPTS):
        with pytest.raises(CORBA.TRANSIENT):
            proxy.try_pull_structured_event()
    status = proxy.status_extra()               # before the fix a pull proxy had no status_extra at all
    assert status["dead_lettered"] == 1 and "injected: cannot convert" in status["last_dead_letter"]
    assert proxy.rt.store.deleted == [11]
