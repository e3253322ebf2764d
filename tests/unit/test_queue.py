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


# -- dispatch cost does not grow with the queue (issue 12) ----------------------------------------------------------
class CountingRecord(Record):
    """A record that counts reads of the fields dispatch may look at (deadline, start time, size, priority)."""

    reads = 0
    _COUNTED = frozenset({"deadline", "start_at", "size", "priority"})

    def __getattribute__(self, name: str) -> object:
        if name in CountingRecord._COUNTED:
            CountingRecord.reads += 1
        return super().__getattribute__(name)


def counting(seq: int, deadline: float | None = None, start_at: float | None = None) -> Record:
    return CountingRecord(seq, Event(Form.ANY, seq), 0, deadline, start_at, False)


def test_take_and_peek_count_do_not_scan_a_big_queue() -> None:
    """10,000 queued entries, a third with a (future) deadline and a third not due yet: each dispatch step reads a
    few records, not the queue. Before, peek_count and take read every record's deadline on every call."""
    clock = Clock()
    q = ProxyQueue(FIFO_ORDER, ANY_ORDER, 0, Drops(), clock=clock)
    n = 10_000
    for i in range(n):
        kind = i % 3
        q.put(counting(i, deadline=clock.now + 3600 if kind == 1 else None,
                       start_at=clock.now + 3600 if kind == 2 else None))
    CountingRecord.reads = 0
    taken: list[Entry] = []
    for _ in range(100):
        assert q.peek_count() == 2 * n // 3 + 1 - len(taken)
        taken += q.take(1)
    assert len(taken) == 100
    assert CountingRecord.reads <= 100 * 4, CountingRecord.reads       # before: about 100 * 2 * 10,000


def test_only_due_entries_are_touched_when_some_expire() -> None:
    clock = Clock()
    drops = Drops()
    q = ProxyQueue(FIFO_ORDER, ANY_ORDER, 0, drops, clock=clock)
    for i in range(5_000):
        q.put(counting(i, deadline=clock.now + (1 if i % 500 == 0 else 3600)))
    CountingRecord.reads = 0
    clock.now += 1
    assert q.peek_count() == 5_000 - 10          # the ten due ones left the count at once
    assert q.take(0) == []                       # ... and are handed over by the next take
    assert sorted(seq for seq, why in drops.items if why == "expired") == list(range(0, 5_000, 500))
    assert CountingRecord.reads <= 50, CountingRecord.reads
    assert len(q) == 4_990


def test_counts_follow_start_times_expiry_take_and_requeue_with_the_injected_clock() -> None:
    clock = Clock()
    drops = Drops()
    q = ProxyQueue(PRIORITY_ORDER, ANY_ORDER, 0, drops, clock=clock)
    q.put(rec(1, priority=1))
    q.put(rec(2, priority=5, start_at=clock.now + 10))
    q.put(rec(3, priority=3, deadline=clock.now + 5, start_at=clock.now + 2))
    q.put(rec(4, priority=0, deadline=clock.now + 20))
    assert (q.peek_count(), len(q), q.next_due()) == (2, 4, clock.now + 2)
    clock.now += 2
    assert q.peek_count() == 3
    batch = q.take(2)
    assert seqs(batch) == [3, 1] and q.peek_count() == 1
    q.requeue(batch)
    q.requeue(batch)                             # twice: still queued once
    assert q.peek_count() == 3 and len(q) == 4
    clock.now += 3                               # 3's deadline
    assert q.peek_count() == 2 and drops.items == []
    clock.now += 5                               # 2 becomes due
    assert seqs(q.take(10)) == [2, 1, 4]
    assert drops.items == [(3, "expired")]
    assert (q.peek_count(), len(q), q.next_due()) == (0, 0, None)


def test_heaps_stay_bounded_when_entries_are_delivered_and_discarded() -> None:
    """Lazy removal must not keep stale heap items for ever (a leak proportional to traffic)."""
    clock = Clock()
    q = ProxyQueue(FIFO_ORDER, ANY_ORDER, 0, Drops(), clock=clock)
    for i in range(20_000):
        q.put(rec(i, deadline=clock.now + 3600))
        for e in q.take(1):
            e.record.release()
    assert len(q) == 0
    assert len(q._deadlines) <= 2 * 0 + 64 + 1 and len(q._ready) <= 64 + 1
    for i in range(1_000):
        q.put(rec(i))
    for i in range(0, 1_000, 2):
        assert q.remove_record(rec(i))
    assert len(q._ready) <= 2 * 500 + 64 + 1
    assert seqs(q.take(1_000)) == list(range(1, 1_000, 2))
