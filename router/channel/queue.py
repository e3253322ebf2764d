"""Per-consumer event queues: ordering, discarding, timing (NS 2.5.5, digest §5.3).

A :class:`Record` is one event held by the channel; every proxy supplier that must deliver it holds an
:class:`Entry` for it in its :class:`ProxyQueue`. The record counts the queues holding it, so the channel knows
when an event is fully delivered (and can delete its stored copy) and how many events it holds (MaxQueueLength).

Queues are ordered by OrderPolicy, FIFO within equal keys. Entries with a future StartTime wait in a side heap
until due. Expired entries (Timeout / StopTime) are dropped when they reach the head. All methods are
thread-safe; ``cond`` is signalled when something may have become deliverable.
"""

from __future__ import annotations

import bisect
import heapq
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from router.channel.events import Event

__all__ = [
    "ANY_ORDER",
    "DEADLINE_ORDER",
    "FIFO_ORDER",
    "LIFO_ORDER",
    "PRIORITY_ORDER",
    "Entry",
    "ProxyQueue",
    "Record",
    "order_key",
]

ANY_ORDER, FIFO_ORDER, PRIORITY_ORDER, DEADLINE_ORDER, LIFO_ORDER = 0, 1, 2, 3, 4
_NO_DEADLINE = float("inf")


@dataclass(eq=False)
class Record:
    """One event held by the channel (shared by the entries of every queue that must deliver it)."""

    seq: int                      # channel-wide arrival order
    event: Event
    priority: int
    deadline: float | None        # unix seconds; None = never expires
    start_at: float | None        # unix seconds; None = deliverable at once
    persistent: bool
    db_id: int | None = None      # row id when stored
    size: int = 0                 # CDR-encoded size in bytes (0 = not measured)
    holders: int = 0              # number of queues holding an entry for this record
    on_released: Callable[[Record], None] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self) -> None:
        with self.lock:
            self.holders += 1

    def release(self) -> None:
        with self.lock:
            self.holders -= 1
            done = self.holders == 0
        if done and self.on_released is not None:
            self.on_released(self)

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline


@dataclass(eq=False)
class Entry:
    """A record queued for one proxy supplier."""

    record: Record
    key: tuple[float, ...]
    failures: int = 0             # event-specific delivery failures of this entry (poison detection)

    def __lt__(self, other: Entry) -> bool:
        return self.key < other.key


def order_key(policy: int, record: Record) -> tuple[float, ...]:
    """Sort key of a record under an OrderPolicy (lower sorts first)."""
    if policy == FIFO_ORDER:
        return (record.seq,)
    if policy == DEADLINE_ORDER:
        return (record.deadline if record.deadline is not None else _NO_DEADLINE, record.seq)
    # AnyOrder is served as PriorityOrder with FIFO within a priority (the channel's documented default).
    return (-record.priority, record.seq)


class ProxyQueue:
    """The ordered queue of one proxy supplier."""

    def __init__(self, order_policy: int, discard_policy: int, max_events: int,
                 on_drop: Callable[[list[Entry], str], None], *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock                   # unix seconds; injected by tests
        self.order_policy = order_policy
        self.discard_policy = discard_policy
        self.max_events = max_events          # MaxEventsPerConsumer, 0 = unlimited
        self._on_drop = on_drop               # called (outside the lock) with dropped entries and the reason
        self._items: list[Entry] = []         # sorted by key
        self._delayed: list[tuple[float, int, Entry]] = []   # (start_at, seq, entry) heap
        self.cond = threading.Condition()
        self.closed = False

    # -- adding -----------------------------------------------------------------------------------------
    def put(self, record: Record) -> None:
        """Queue a record; applies MaxEventsPerConsumer with the DiscardPolicy."""
        record.hold()
        entry = Entry(record, order_key(self.order_policy, record))
        with self.cond:
            closed = self.closed
            if not closed:
                if record.start_at is not None and record.start_at > self._clock():
                    heapq.heappush(self._delayed, (record.start_at, record.seq, entry))
                else:
                    bisect.insort(self._items, entry)
                dropped = self._enforce_limit()
                self.cond.notify_all()
        if closed:
            self._on_drop([entry], "proxy closed")
        elif dropped:
            self._on_drop(dropped, "MaxEventsPerConsumer")

    def _enforce_limit(self) -> list[Entry]:
        dropped: list[Entry] = []
        while self.max_events and len(self) > self.max_events:
            dropped.append(self._remove_victim())
        return dropped

    def _all(self) -> list[Entry]:
        return self._items + [e for _, _, e in self._delayed]

    def _remove_victim(self) -> Entry:
        victim = choose_victim(self.discard_policy, self._all())
        self._remove(victim)
        return victim

    def _remove(self, entry: Entry) -> None:
        i = bisect.bisect_left(self._items, entry)
        while i < len(self._items):
            if self._items[i] is entry:
                del self._items[i]
                return
            i += 1
        for j, (_, _, e) in enumerate(self._delayed):
            if e is entry:
                self._delayed.pop(j)
                heapq.heapify(self._delayed)
                return
        raise KeyError("entry not queued")

    def remove_record(self, record: Record) -> bool:
        """Drop this proxy's entry for a record (channel-level discard). True if one was queued."""
        with self.cond:
            for entry in self._all():
                if entry.record.seq == record.seq:     # also a mapping-filter view of the record
                    self._remove(entry)
                    break
            else:
                return False
        self._on_drop([entry], "DiscardPolicy")
        return True

    # -- taking -----------------------------------------------------------------------------------------
    def _promote_due(self, now: float) -> None:
        while self._delayed and self._delayed[0][0] <= now:
            _, _, entry = heapq.heappop(self._delayed)
            bisect.insort(self._items, entry)

    def _drop_expired(self, now: float) -> list[Entry]:
        expired = [e for e in self._items if e.record.expired(now)]
        expired += [e for _, _, e in self._delayed if e.record.expired(now)]
        for e in expired:
            self._remove(e)
        return expired

    def take(self, max_n: int, max_bytes: int = 0) -> list[Entry]:
        """Remove and return up to ``max_n`` deliverable entries (head first). Never blocks.

        With ``max_bytes``, the batch stops before the entry that would take its total size above it (the head
        entry is always taken, whatever its size). If handing expired entries over fails, the batch is put back
        before the error propagates: nothing taken is lost."""
        now = self._clock()
        with self.cond:
            self._promote_due(now)
            expired = self._drop_expired(now)
            n = _fitting(self._items, max_n, max_bytes)
            batch, self._items = self._items[:n], self._items[n:]
        if expired:
            try:
                self._on_drop(expired, "expired")
            except BaseException:
                self.requeue(batch)
                raise
        return batch

    def peek_count(self) -> int:
        """Number of entries deliverable now (due and not expired)."""
        now = self._clock()
        with self.cond:
            self._promote_due(now)
            return sum(1 for e in self._items if not e.record.expired(now))

    def next_due(self) -> float | None:
        """Unix time at which a delayed entry becomes due, if any."""
        with self.cond:
            return self._delayed[0][0] if self._delayed else None

    def requeue(self, entries: list[Entry]) -> None:
        """Put back entries whose delivery failed (they keep their place in the order). A closed queue (its
        proxy went away meanwhile) drops them instead, so their records are released."""
        with self.cond:
            closed = self.closed
            if not closed:
                for entry in entries:
                    bisect.insort(self._items, entry)
                self.cond.notify_all()
        if closed and entries:
            self._on_drop(entries, "proxy closed")

    def wait(self, timeout: float) -> None:
        with self.cond:
            if not self.closed:
                self.cond.wait(timeout)

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def close(self) -> list[Entry]:
        """Close the queue and return everything still in it (the caller releases the records)."""
        with self.cond:
            self.closed = True
            rest = self._all()
            self._items, self._delayed = [], []
            self.cond.notify_all()
        return rest

    def __len__(self) -> int:
        return len(self._items) + len(self._delayed)


def _fitting(items: list[Entry], max_n: int, max_bytes: int) -> int:
    """How many head entries make a batch of at most ``max_n`` entries and ``max_bytes`` bytes (at least one)."""
    n = min(max_n, len(items))
    if not max_bytes or n <= 1:
        return n
    total = 0
    for i in range(n):
        total += items[i].record.size
        if i and total > max_bytes:
            return i
    return n


def choose_victim(policy: int, entries: list[Entry]) -> Entry:
    """The entry a DiscardPolicy drops first (NS 2.5.5 "Discard Policy")."""
    if policy == LIFO_ORDER:
        return max(entries, key=lambda e: e.record.seq)
    if policy == PRIORITY_ORDER:
        return min(entries, key=lambda e: (e.record.priority, -e.record.seq))
    if policy == DEADLINE_ORDER:
        return min(entries, key=lambda e: (e.record.deadline if e.record.deadline is not None
                                           else _NO_DEADLINE, e.record.seq))
    # FifoOrder and AnyOrder: the oldest goes first.
    return min(entries, key=lambda e: e.record.seq)
