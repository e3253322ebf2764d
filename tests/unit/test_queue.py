"""ProxyQueue: ordering, discard policies, start/stop times, reference counting of records."""

from __future__ import annotations

import time

import pytest

from router.channel.events import Event, Form
from router.channel.queue import (
    ANY_ORDER,
    DEADLINE_ORDER,
    FIFO_ORDER,
    LIFO_ORDER,
    PRIORITY_ORDER,
    Entry,
    ProxyQueue,
    Record,
)


def rec(seq: int, priority: int = 0, deadline: float | None = None, start_at: float | None = None) -> Record:
    return Record(seq, Event(Form.ANY, seq), priority, deadline, start_at, False)


class Drops:
    def __init__(self) -> None:
        self.items: list[tuple[int, str]] = []

    def __call__(self, entries: list[Entry], reason: str) -> None:
        for e in entries:
            self.items.append((e.record.seq, reason))
            e.record.release()


def seqs(entries: list[Entry]) -> list[int]:
    return [e.record.seq for e in entries]


def make(order: int = FIFO_ORDER, discard: int = ANY_ORDER, max_events: int = 0) -> tuple[ProxyQueue, Drops]:
    drops = Drops()
    return ProxyQueue(order, discard, max_events, drops), drops


def test_fifo_order() -> None:
    q, _ = make(FIFO_ORDER)
    for i, p in enumerate([0, 5, -3, 5]):
        q.put(rec(i, p))
    assert seqs(q.take(10)) == [0, 1, 2, 3]


def test_priority_order_is_fifo_within_a_priority() -> None:
    q, _ = make(PRIORITY_ORDER)
    for i, p in enumerate([0, 5, -3, 5, 0]):
        q.put(rec(i, p))
    assert seqs(q.take(10)) == [1, 3, 0, 4, 2]


def test_any_order_is_served_as_priority() -> None:
    q, _ = make(ANY_ORDER)
    q.put(rec(1, 0))
    q.put(rec(2, 9))
    assert seqs(q.take(10)) == [2, 1]


def test_deadline_order_soonest_first_and_no_deadline_last() -> None:
    now = time.time()
    q, _ = make(DEADLINE_ORDER)
    q.put(rec(1, deadline=None))
    q.put(rec(2, deadline=now + 50))
    q.put(rec(3, deadline=now + 10))
    assert seqs(q.take(10)) == [3, 2, 1]


@pytest.mark.parametrize("policy,expected_dropped", [
    (FIFO_ORDER, 0), (ANY_ORDER, 0), (LIFO_ORDER, 3), (PRIORITY_ORDER, 2), (DEADLINE_ORDER, 1),
])
def test_discard_policies(policy: int, expected_dropped: int) -> None:
    now = time.time()
    q, drops = make(FIFO_ORDER, policy, max_events=3)
    q.put(rec(0, priority=5, deadline=now + 100))
    q.put(rec(1, priority=5, deadline=now + 5))
    q.put(rec(2, priority=-1, deadline=now + 100))
    q.put(rec(3, priority=5, deadline=None))
    assert drops.items == [(expected_dropped, "MaxEventsPerConsumer")]
    assert sorted(seqs(q.take(10))) == sorted({0, 1, 2, 3} - {expected_dropped})


def test_expired_entries_are_dropped_not_delivered() -> None:
    q, drops = make()
    q.put(rec(1, deadline=time.time() - 1))
    q.put(rec(2))
    assert seqs(q.take(10)) == [2]
    assert drops.items == [(1, "expired")]


class Clock:
    """An injected clock: time moves only when the test says so."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_start_time_delays_delivery() -> None:
    clock = Clock()
    q = ProxyQueue(FIFO_ORDER, ANY_ORDER, 0, Drops(), clock=clock)
    q.put(rec(1, start_at=clock.now + 0.3))
    q.put(rec(2))
    assert seqs(q.take(10)) == [2]
    assert q.peek_count() == 0
    assert q.next_due() == clock.now + 0.3
    clock.now += 0.299
    assert q.take(10) == [] and q.peek_count() == 0
    clock.now += 0.001                     # exactly due
    assert q.peek_count() == 1
    assert seqs(q.take(10)) == [1]


def test_expiry_follows_the_injected_clock() -> None:
    clock = Clock()
    drops = Drops()
    q = ProxyQueue(FIFO_ORDER, ANY_ORDER, 0, drops, clock=clock)
    q.put(rec(1, deadline=clock.now + 5))
    assert q.peek_count() == 1
    clock.now += 5
    assert q.take(10) == [] and drops.items == [(1, "expired")]


def test_take_bounds_the_batch_by_bytes_but_always_takes_the_head() -> None:
    q, _ = make(FIFO_ORDER)
    for i, size in enumerate([700, 200, 200, 50]):
        r = rec(i)
        r.size = size
        q.put(r)
    assert seqs(q.take(10, max_bytes=1000)) == [0, 1]      # 900 bytes; the next would make 1100
    assert seqs(q.take(10, max_bytes=100)) == [2]          # the head alone is above the budget: taken anyway
    assert seqs(q.take(10, max_bytes=100)) == [3]


def test_take_puts_the_batch_back_when_handing_over_expired_entries_fails() -> None:
    def failing_drop(entries: list[Entry], reason: str) -> None:
        raise RuntimeError("injected: the drop callback failed")

    clock = Clock()
    q = ProxyQueue(FIFO_ORDER, ANY_ORDER, 0, failing_drop, clock=clock)
    q.put(rec(1, deadline=clock.now + 1))
    q.put(rec(2))
    q.put(rec(3))
    clock.now += 1
    with pytest.raises(RuntimeError):
        q.take(10)
    assert seqs(q.take(10)) == [2, 3]       # before the fix the batch taken before the failure was lost


def test_requeue_keeps_order() -> None:
    q, _ = make(FIFO_ORDER)
    for i in range(5):
        q.put(rec(i))
    head = q.take(2)
    q.requeue(head)
    assert seqs(q.take(10)) == [0, 1, 2, 3, 4]


def test_record_released_when_last_queue_lets_go() -> None:
    released: list[Record] = []
    r = Record(1, Event(Form.ANY, 1), 0, None, None, False, on_released=released.append)
    a, _ = make()
    b, _ = make()
    a.put(r)
    b.put(r)
    for e in a.take(1):
        e.record.release()
    assert released == []
    for e in b.take(1):
        e.record.release()
    assert released == [r]


def test_remove_record_and_close() -> None:
    q, drops = make()
    r1, r2 = rec(1), rec(2)
    q.put(r1)
    q.put(r2)
    assert q.remove_record(r1) is True
    assert q.remove_record(r1) is False
    assert drops.items == [(1, "DiscardPolicy")]
    rest = q.close()
    assert seqs(rest) == [2]
    q.put(rec(3))          # a closed queue drops what arrives
    assert (3, "proxy closed") in drops.items


def test_requeue_into_a_closed_queue_releases_the_records() -> None:
    released: list[Record] = []
    q, drops = make()
    r = Record(1, Event(Form.ANY, 1), 0, None, None, False, on_released=released.append)
    q.put(r)
    in_flight = q.take(1)
    assert q.close() == []
    q.requeue(in_flight)                 # the push failed after the proxy went away
    assert drops.items == [(1, "proxy closed")] and released == [r]
