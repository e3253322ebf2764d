"""Per-consumer event queues: ordering, discarding, timing (NS 2.5.5, digest §5.3).

A :class:`Record` is one event held by the channel; every proxy supplier that must deliver it holds an
:class:`Entry` for it in its :class:`ProxyQueue`. The record counts the queues holding it, so the channel knows
when an event is fully delivered (and can delete its stored copy) and how many events it holds (MaxQueueLength).

Queues are ordered by OrderPolicy, FIFO within equal keys. Entries with a future StartTime wait in a side heap
until due. Expired entries (Timeout / StopTime) leave the queue when their deadline comes (a deadline heap: only due
entries are touched) and are handed over as dropped by the next take. Time is read from an injected clock. All
methods are thread-safe; ``cond`` is signalled when something may have become deliverable.
"""

from __future__ import annotations

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
    delivered_at: float | None = None   # unix time the consumer's call returned (its ledger acknowledged_at)

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


_READY, _DELAYED = 1, 2          # where a live entry is (ProxyQueue._where)
_COMPACT_SLACK = 64              # stale heap items tolerated beyond the live ones before a heap is rebuilt


class ProxyQueue:
    """The ordered queue of one proxy supplier.

    Dispatch costs O(k log n) for k entries taken, due or expired, never a scan of the queue: deliverable entries
    sit in a heap by order key, entries with a future StartTime in a heap by start time, and every queued entry
    with a deadline in a heap by deadline. Counts are kept, not recomputed. Removals (taken, expired, discarded)
    are lazy: ``_where`` says which entries are live and where, and heap items of entries no longer there are
    skipped when they surface; a heap holding more than twice its live items (plus a slack) is rebuilt, which is
    amortised O(1) per removal. Only the discard paths (``MaxEventsPerConsumer`` victim, channel-level
    ``remove_record``) and :meth:`close` look at every entry.
    """

    def __init__(self, order_policy: int, discard_policy: int, max_events: int,
                 on_drop: Callable[[list[Entry], str], None], *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock                   # unix seconds; injected by tests
        self.order_policy = order_policy
        self.discard_policy = discard_policy
        self.max_events = max_events          # MaxEventsPerConsumer, 0 = unlimited
        self._on_drop = on_drop               # called (outside the lock) with dropped entries and the reason
        self._ready: list[Entry] = []         # heap by key (lazy: may hold entries no longer ready)
        self._delayed: list[tuple[float, int, Entry]] = []     # heap by start time (lazy)
        self._deadlines: list[tuple[float, int, Entry]] = []   # heap by deadline of queued entries (lazy)
        self._where: dict[Entry, int] = {}    # every live entry: _READY or _DELAYED
        self._n_ready = 0                     # live entries in _ready
        self._expired: list[Entry] = []       # found expired (e.g. by peek_count), handed over by the next take
        self.cond = threading.Condition()
        self.closed = False
        self._parked = 0                      # waiters that no new entry can help (:meth:`park`)

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
                    self._where[entry] = _DELAYED
                else:
                    self._add_ready(entry)
                if record.deadline is not None:
                    heapq.heappush(self._deadlines, (record.deadline, record.seq, entry))
                dropped = self._enforce_limit()
                if not self._parked:              # a parked dispatcher cannot act on it: no wake-up (issue 27)
                    self.cond.notify_all()
        if closed:
            self._on_drop([entry], "proxy closed")
        elif dropped:
            self._on_drop(dropped, "MaxEventsPerConsumer")

    def _add_ready(self, entry: Entry) -> None:
        heapq.heappush(self._ready, entry)
        self._where[entry] = _READY
        self._n_ready += 1

    def _enforce_limit(self) -> list[Entry]:
        dropped: list[Entry] = []
        while self.max_events and len(self._where) > self.max_events:
            dropped.append(self._remove_victim())
        return dropped

    def _all(self) -> list[Entry]:
        return sorted(self._where, key=lambda e: e.key)

    def _remove_victim(self) -> Entry:
        victim = choose_victim(self.discard_policy, list(self._where))
        self._remove(victim)
        return victim

    def _remove(self, entry: Entry) -> None:
        """Make a live entry not live (its heap items become stale)."""
        where = self._where.pop(entry, None)
        if where is None:
            raise KeyError("entry not queued")
        if where == _READY:
            self._n_ready -= 1
        self._compact()

    def _compact(self) -> None:
        live_delayed = len(self._where) - self._n_ready
        if len(self._ready) > 2 * self._n_ready + _COMPACT_SLACK:
            self._ready = _unique([e for e in self._ready if self._where.get(e) == _READY])
            heapq.heapify(self._ready)
        if len(self._delayed) > 2 * live_delayed + _COMPACT_SLACK:
            self._delayed = [t for t in self._delayed if self._where.get(t[2]) == _DELAYED]
            heapq.heapify(self._delayed)
        if len(self._deadlines) > 2 * len(self._where) + _COMPACT_SLACK:
            self._deadlines = [(e.record.deadline, e.record.seq, e) for e in self._where
                               if e.record.deadline is not None]
            heapq.heapify(self._deadlines)

    def remove_record(self, record: Record) -> bool:
        """Drop this proxy's entry for a record (channel-level discard). True if one was queued."""
        with self.cond:
            for entry in self._where:
                if entry.record.seq == record.seq:     # also a mapping-filter view of the record
                    self._remove(entry)
                    break
            else:
                return False
        self._on_drop([entry], "DiscardPolicy")
        return True

    # -- taking -----------------------------------------------------------------------------------------
    def _promote_due(self, now: float) -> None:
        delayed = self._delayed
        while delayed and delayed[0][0] <= now:
            _, _, entry = heapq.heappop(delayed)
            if self._where.get(entry) == _DELAYED:
                self._n_ready += 1
                self._where[entry] = _READY
                heapq.heappush(self._ready, entry)

    def _expire_due(self, now: float) -> None:
        """Move the entries whose deadline has come out of the queue, into ``_expired``."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, _, entry = heapq.heappop(deadlines)
            where = self._where.pop(entry, None)
            if where is not None:
                if where == _READY:
                    self._n_ready -= 1
                self._expired.append(entry)
        if self._expired:
            self._compact()

    def _pop_ready(self, max_n: int, max_bytes: int) -> list[Entry]:
        """Up to ``max_n`` head entries, stopping before the one that would take the batch above ``max_bytes``
        (the first is always taken)."""
        batch: list[Entry] = []
        total = 0
        ready = self._ready
        while len(batch) < max_n and ready:
            head = ready[0]
            if self._where.get(head) != _READY:
                heapq.heappop(ready)                     # stale: taken, expired or discarded meanwhile
                continue
            size = head.record.size
            if batch and max_bytes and total + size > max_bytes:
                break
            heapq.heappop(ready)
            del self._where[head]
            self._n_ready -= 1
            batch.append(head)
            total += size
        if batch:
            self._compact()                              # the deadline items of taken entries are now stale
        return batch

    def take(self, max_n: int, max_bytes: int = 0) -> list[Entry]:
        """Remove and return up to ``max_n`` deliverable entries (head first). Never blocks.

        With ``max_bytes``, the batch stops before the entry that would take its total size above it (the head
        entry is always taken, whatever its size). Expired entries are handed over (``on_drop``, "expired"); if
        that fails, the batch is put back before the error propagates: nothing taken is lost (the expired entries
        have left the queue; the records they hold stay held, so their stored rows are not deleted)."""
        now = self._clock()
        with self.cond:
            self._promote_due(now)
            self._expire_due(now)
            expired, self._expired = self._expired, []
            batch = self._pop_ready(max_n, max_bytes)
        if expired:
            try:
                self._on_drop(expired, "expired")
            except BaseException:
                self.requeue(batch)
                raise
        return batch

    def peek_count(self) -> int:
        """Number of entries deliverable now (due and not expired). Entries found expired leave the count at once
        and are handed over by the next :meth:`take`."""
        now = self._clock()
        with self.cond:
            self._promote_due(now)
            self._expire_due(now)
            return self._n_ready

    def next_due(self) -> float | None:
        """Unix time at which a delayed entry becomes due, if any."""
        with self.cond:
            delayed = self._delayed
            while delayed and self._where.get(delayed[0][2]) != _DELAYED:
                heapq.heappop(delayed)
            return delayed[0][0] if delayed else None

    def requeue(self, entries: list[Entry]) -> None:
        """Put back entries whose delivery failed (they keep their place in the order). A closed queue (its
        proxy went away meanwhile) drops them instead, so their records are released."""
        with self.cond:
            closed = self.closed
            if not closed:
                for entry in entries:
                    if entry in self._where:
                        continue                        # already queued: never twice
                    self._add_ready(entry)
                    deadline = entry.record.deadline
                    if deadline is not None:
                        heapq.heappush(self._deadlines, (deadline, entry.record.seq, entry))
                self.cond.notify_all()
        if closed and entries:
            self._on_drop(entries, "proxy closed")

    def wait(self, timeout: float) -> None:
        with self.cond:
            if not self.closed:
                self.cond.wait(timeout)

    def park(self, timeout: float) -> None:
        """:meth:`wait` for a dispatcher that cannot deliver whatever arrives (its proxy is suspended, not
        connected or closing): a new entry does not wake it (issue 27: ~57 us per enqueue went into waking a
        suspended proxy's dispatcher for nothing); :meth:`wake`, :meth:`close` or ``timeout`` end the wait, so
        whoever changes that state must :meth:`wake` it (resume, teardown and a failed destroy's re-open do; a
        worker starts only once its proxy is connected)."""
        with self.cond:
            if not self.closed:
                self._parked += 1
                try:
                    self.cond.wait(timeout)
                finally:
                    self._parked -= 1

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def close(self) -> list[Entry]:
        """Close the queue and return everything still in it (the caller releases the records)."""
        with self.cond:
            self.closed = True
            rest = self._all() + self._expired
            self._ready, self._delayed, self._deadlines, self._expired = [], [], [], []
            self._where.clear()
            self._n_ready = 0
            self.cond.notify_all()
        return rest

    def __len__(self) -> int:
        """Entries held: queued (due or not) and expired ones not handed over yet."""
        return len(self._where) + len(self._expired)


def _unique(entries: list[Entry]) -> list[Entry]:
    seen: set[int] = set()
    out: list[Entry] = []
    for e in entries:
        if id(e) not in seen:
            seen.add(id(e))
            out.append(e)
    return out


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
