"""The acknowledgement resend scheduler (NJI 4.2.7) driven by a fake clock, without services.

An Ack push proxy supplier is built around a fake runtime and a fake consumer (no ORB calls), its clock is a
variable the test sets, and each pass of the scheduler is one call of ``_tick``: "nothing is resent before the
RetryInterval", "Retries resends, then the connection stops" and "an acknowledged event is never resent" are
checked at exact clock readings, with no waiting at all.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import pytest

import omniORB
from omniORB import CORBA

import CosNotification

from router.channel import qos as Q
from router.channel.ack import AckState, StructuredProxyPushSupplierAckImpl, sequence_number_of
from router.channel.events import Event, Form
from router.channel.queue import FIFO_ORDER, ProxyQueue, Record
from router.db.testing import NullDatabase
from router.routing.ledger import LedgerWriter

INTERVAL_S = 10.0
RETRIES = 2


class FakeStore:
    ledger = LedgerWriter()

    def delete_deliveries(self, conn: object, cid: int, aid: int, pid: int, ids: list[int], **how: Any) -> None:
        pass


class FakeRt:
    def __init__(self) -> None:
        self.store = FakeStore()
        self.db = NullDatabase()
        self.shutting_down = threading.Event()
        self.push_timeout_ms = 1000
        self.max_event_bytes = 0


class Consumer:
    """Records the SequenceNumber of every push; raises ``fail`` instead while it is set."""

    def __init__(self) -> None:
        self.sns: list[int | None] = []
        self.fail: BaseException | None = None

    def push_structured_event(self, ev: Any) -> None:
        if self.fail is not None:
            raise self.fail
        self.sns.append(sequence_number_of(ev))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_proxy(monkeypatch: pytest.MonkeyPatch, consumer: Consumer, clock: Clock) -> Any:
    monkeypatch.setattr(omniORB, "setClientCallTimeout", lambda obj, ms: None)
    proxy: Any = object.__new__(StructuredProxyPushSupplierAckImpl)
    proxy.rt = FakeRt()
    proxy.oid, proxy.id = "ch/0/C/0/1", 1
    proxy.admin = type("Admin", (), {"id": 0})()
    proxy.channel = type("Channel", (), {"id": 0})()
    proxy.form = "STRUCTURED"
    proxy.qos = {"MaximumBatchSize": 1, "PacingInterval": 0, Q.DELIVERY_RELIABILITY: Q.ACK_ACKNOWLEDGMENT,
                 Q.RETRIES: RETRIES, Q.RETRY_INTERVAL: int(INTERVAL_S * 10_000_000)}
    proxy.connected, proxy.suspended, proxy.destroyed = True, False, False
    proxy.stop_event = threading.Event()
    proxy.client, proxy.client_ior = consumer, "IOR:fake"
    proxy.queue = ProxyQueue(FIFO_ORDER, 0, 0, proxy._dropped)
    proxy.queue.wait = lambda timeout: None            # a pass never blocks: the test moves the clock
    proxy.dead_lettered, proxy.last_dead_letter, proxy.isolating = 0, None, 0
    proxy.ack, proxy._tls, proxy._clock = AckState(), threading.local(), clock
    proxy.save_extra = lambda **kw: None
    return proxy


def event(i: int) -> Event:
    header = CosNotification.EventHeader(
        CosNotification.FixedEventHeader(CosNotification.EventType("test", "t"), f"e{i}"), [])
    return Event(Form.STRUCTURED, CosNotification.StructuredEvent(header, [], CORBA.Any(CORBA.TC_long, i)))


def queue_events(proxy: Any, n: int) -> None:
    for i in range(n):
        rec = Record(i, event(i), 0, None, None, False)
        rec.hold()
        proxy.queue.put(rec)


def tick_at(proxy: Any, clock: Clock, t: float) -> None:
    clock.now = t
    proxy._tick(None)
    assert proxy.ack.checked_at == t


def test_unacknowledged_event_is_resent_each_interval_then_the_connection_stops(
        monkeypatch: pytest.MonkeyPatch) -> None:
    consumer, clock = Consumer(), Clock()
    proxy = make_proxy(monkeypatch, consumer, clock)
    queue_events(proxy, 1)
    t0 = clock.now
    tick_at(proxy, clock, t0)
    assert consumer.sns == [0]
    tick_at(proxy, clock, t0 + INTERVAL_S - 0.001)
    assert consumer.sns == [0], "nothing is resent before RetryInterval"
    assert proxy.status_extra()["next_resend_at"] == t0 + INTERVAL_S
    for k in range(1, RETRIES + 1):
        tick_at(proxy, clock, t0 + k * INTERVAL_S)
        assert consumer.sns == [0] * (1 + k), f"resend {k} under the same SequenceNumber"
        assert proxy.status_extra()["resends"] == k
    tick_at(proxy, clock, t0 + (RETRIES + 1) * INTERVAL_S)
    assert proxy.ack.stopped == f"no acknowledgement after {RETRIES} retries"
    for t in (t0 + (RETRIES + 2) * INTERVAL_S, t0 + 100 * INTERVAL_S):
        tick_at(proxy, clock, t)
    extra = proxy.status_extra()
    assert consumer.sns == [0] * (1 + RETRIES), "a stopped connection sends nothing, however long it waits"
    assert extra["resends"] == RETRIES and extra["in_flight"] == 1 and extra["next_resend_at"] is None
    assert "STOPPED" in extra


def test_acknowledged_events_are_never_resent(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer, clock = Consumer(), Clock()
    proxy = make_proxy(monkeypatch, consumer, clock)
    queue_events(proxy, 3)
    t0 = clock.now
    for _ in range(3):
        tick_at(proxy, clock, t0)
    assert consumer.sns == [0, 1, 2]
    proxy.acknowledge([0, 2])
    tick_at(proxy, clock, t0 + INTERVAL_S)
    assert consumer.sns == [0, 1, 2, 1], "only the unacknowledged number is resent"
    proxy.acknowledge([1])
    for k in range(2, 50):
        tick_at(proxy, clock, t0 + k * INTERVAL_S)
    extra = proxy.status_extra()
    assert consumer.sns == [0, 1, 2, 1]
    assert extra["in_flight"] == 0 and extra["resends"] == 1 and extra["next_resend_at"] is None
    assert extra["retries_used"] == 0, "an acknowledgement resets the retry count"
    assert not proxy.ack.stopped


def test_resume_connection_resends_in_flight_events_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer, clock = Consumer(), Clock()
    proxy = make_proxy(monkeypatch, consumer, clock)
    queue_events(proxy, 1)
    t0 = clock.now
    for k in range(RETRIES + 2):
        tick_at(proxy, clock, t0 + k * INTERVAL_S)
    assert proxy.ack.stopped and consumer.sns == [0] * (1 + RETRIES)
    proxy.rt.connection_status = None
    proxy.resume_connection()
    tick_at(proxy, clock, t0 + (RETRIES + 2) * INTERVAL_S)        # due at once, not after another interval
    assert consumer.sns == [0] * (2 + RETRIES)
    assert not proxy.ack.stopped and proxy.status_extra()["retries_used"] == 0


# -- inbound: the seen numbers cannot be saved after the events were committed ------------------------------------
def test_routed_events_are_answered_as_routed_when_the_seen_numbers_cannot_be_saved(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from router.channel import ackin as A  # InboundAck's module (router.channel.ack re-exports it)
    from router.channel.store import StoreUnavailable

    spawned: list[str] = []

    class Proxy:
        oid = "ch/0/S/0/1"
        extra: ClassVar[dict[str, Any]] = {}
        rt = type("Rt", (), {"spawn": lambda self, name, fn: spawned.append(name)})()

        def save_extra(self, **items: Any) -> None:
            raise StoreUnavailable("injected: database down after the events' commit")

    inbound = A.InboundAck(Proxy())
    inbound._ack_ref = object()                 # a CosNotifyCommAck supplier
    monkeypatch.setattr(A, "sequence_number_of", lambda value: 7)
    routed: list[list[Any]] = []
    events = [Event(Form.STRUCTURED, "e7")]
    inbound.accept(events, routed.append)       # before the fix: StoreUnavailable → TRANSIENT, though committed
    assert routed == [events] and spawned == ["ack-ch/0/S/0/1"]
    inbound.accept(events, routed.append)       # the supplier's resend is still recognised
    assert routed == [events] and len(spawned) == 2
