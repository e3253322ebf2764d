"""MaxQueueLength admission (NS 2.5.7) in the channel's routing, without services.

The channel is built around a fake runtime whose store can be told to fail, so the order "store the new event,
then discard to make room" is checked directly: a push the store refused must leave the queued events as they were.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from omniORB import CORBA

import CosNotification

from router.channel.channel import EventChannelImpl
from router.channel.events import Event, Form
from router.channel.groupcommit import GroupCommit
from router.channel.queue import FIFO_ORDER, Entry, ProxyQueue, Record
from router.channel.store import NewEvent, StoreUnavailable
from router.db.testing import NullDatabase


class FailingStore:
    """The store twin: ``insert_events`` fails while ``down`` is set, else hands out row ids."""

    def __init__(self) -> None:
        self.down = False
        self.inserted: list[NewEvent] = []
        self.reaped: list[int] = []

    def insert_events(self, conn: object, cid: int, rows: list[NewEvent], **_: object) -> list[int]:
        if self.down:
            raise StoreUnavailable("injected: the database is unreachable")
        self.inserted.extend(rows)
        return [100 + len(self.inserted) - len(rows) + i for i in range(len(rows))]

    def reap_later(self, db_id: int) -> None:
        self.reaped.append(db_id)


class FakeRt:
    def __init__(self) -> None:
        self.store = FailingStore()
        self.db = NullDatabase()
        self.max_event_bytes = 0
        self._seq = 0
        self.accept_commits = GroupCommit(self.db, self.store)

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq


class FakeProxy:
    """A proxy supplier that queues everything it is given."""

    def __init__(self) -> None:
        self.id = 1
        self.oid = "ch/0/C/0/1"
        self.admin = type("Admin", (), {"id": 0})()
        self.dropped: list[tuple[list[int], str]] = []
        self.queue = ProxyQueue(FIFO_ORDER, 0, 0, self._on_drop)

    def _on_drop(self, entries: list[Entry], reason: str) -> None:
        self.dropped.append(([e.record.seq for e in entries], reason))
        for e in entries:
            e.record.release()

    def enqueue(self, rec: Record) -> None:
        rec.hold()
        self.queue.put(rec)

    def queued(self) -> list[int]:
        return [e.record.seq for e in self.queue.take(0x7FFF)]


class Source:
    oid = "ch/0/S/0/1"

    @staticmethod
    def admits(event: Any) -> bool:
        return True


def make_channel(limit: int, proxy: FakeProxy) -> Any:
    ch: Any = object.__new__(EventChannelImpl)
    ch.id, ch.rt, ch.destroyed = 0, FakeRt(), False
    ch.qos = {CosNotification.DiscardPolicy: CosNotification.FifoOrder,
              CosNotification.ConnectionReliability: CosNotification.Persistent}
    ch.admin_props = {CosNotification.MaxQueueLength: limit, CosNotification.RejectNewEvents: False}
    ch.records, ch._records_lock = {}, threading.Lock()
    ch.consumer_admins = {0: type("Admin", (), {"proxies": {1: proxy}, "targets_for": lambda self, ev: [proxy]})()}

    def sizes_checked(events: Sequence[Event]) -> list[tuple[int, bytes | None]]:
        return [(3, b"cdr") for _ in events]

    def make_record(source: Any, ev: Event, now: float) -> Record:
        return Record(ch.rt.next_seq(), ev, 0, None, None, True, on_released=ch.released)

    ch._sizes_checked, ch._make_record = sizes_checked, make_record
    return ch


def test_a_full_channel_discards_only_after_the_new_event_is_stored() -> None:
    proxy = FakeProxy()
    ch = make_channel(limit=2, proxy=proxy)
    ch.route(Source(), [Event(Form.STRUCTURED, "a"), Event(Form.STRUCTURED, "b")])
    ch.rt.store.down = True
    with pytest.raises((StoreUnavailable, CORBA.TRANSIENT)):
        ch.route(Source(), [Event(Form.STRUCTURED, "c")])
    assert proxy.dropped == [], "nothing is discarded to make room for an event that was never stored"
    assert sorted(ch.records) == [1, 2]
    assert proxy.queued() == [1, 2]


def test_a_full_channel_discards_the_policy_victim_once_the_new_event_is_stored() -> None:
    proxy = FakeProxy()
    ch = make_channel(limit=2, proxy=proxy)
    ch.route(Source(), [Event(Form.STRUCTURED, "a"), Event(Form.STRUCTURED, "b")])
    ch.route(Source(), [Event(Form.STRUCTURED, "c")])
    assert proxy.dropped == [([1], "DiscardPolicy")]           # FifoOrder: the oldest queued event
    assert [row.seq for row in ch.rt.store.inserted] == [1, 2, 3]
    assert proxy.queued() == [2, 3]
