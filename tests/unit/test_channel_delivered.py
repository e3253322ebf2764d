"""Push delivery without one commit per delivered event (issue 12): the delivered-events journal.

The proxies are built as in ``test_channel_delivery`` (fake runtime, fake consumer, ``NullDatabase`` counting the
units of work). Waiting is on conditions with a deadline, never a sleep; nothing here is timed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_channel_delivery import Consumer, FakeStore, make_proxy, record, run_worker, stop, wait_for

from router.channel import proxies as P
from router.channel import pushsupplier
from router.channel.delivered import FLUSH_EVENTS, IDLE_FLUSH_EVENTS, DeliveredJournals, ProxyJournal, read_ids
from router.db.testing import NullDatabase
from router.routing.ledger import LedgerSettings, LedgerWriter


def _proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, consumer: Consumer) -> Any:
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, consumer, monkeypatch)
    proxy.rt.delivered = DeliveredJournals(tmp_path / "delivered")
    return proxy


def test_delivered_events_leave_the_store_in_batches_not_one_commit_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = Consumer()
    proxy = _proxy(tmp_path, monkeypatch, consumer)
    n = 2 * FLUSH_EVENTS + 10
    for i in range(1, n + 1):
        proxy.queue.put(record(i, db_id=1000 + i))
    t = run_worker(proxy)
    try:
        wait_for(lambda: len(consumer.got) == n, "every event delivered")
        wait_for(lambda: len(proxy.rt.store.deleted) == n, "every delivered row deleted")
    finally:
        stop(proxy, t)
    assert consumer.got == list(range(1, n + 1))
    assert sorted(proxy.rt.store.deleted) == [1000 + i for i in range(1, n + 1)]
    # One commit per delivered event before (n commits); now one per batch of delivered events.
    assert proxy.rt.db.committed < n // 10, f"{proxy.rt.db.committed} commits for {n} delivered events"
    journal = tmp_path / "delivered" / "0-0-1.ids"
    assert read_ids(journal) == []                   # every journaled id's row is deleted


def test_without_a_journal_each_delivery_commits_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = Consumer()
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, consumer, monkeypatch)
    for i in range(1, 6):
        proxy.queue.put(record(i, db_id=100 + i))
    t = run_worker(proxy)
    try:
        wait_for(lambda: len(proxy.rt.store.deleted) == 5, "every delivered row deleted")
    finally:
        stop(proxy, t)
    assert proxy.rt.db.committed == 5


def test_a_journal_that_cannot_be_written_deletes_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: ProxyJournal, ids: Any, delivered_at: float) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ProxyJournal, "record", refuse)
    consumer = Consumer()
    proxy = _proxy(tmp_path, monkeypatch, consumer)
    for i in range(1, 6):
        proxy.queue.put(record(i, db_id=100 + i))
    t = run_worker(proxy)
    try:
        wait_for(lambda: len(proxy.rt.store.deleted) == 5, "every delivered row deleted")
    finally:
        stop(proxy, t)
    assert consumer.got == [1, 2, 3, 4, 5]
    assert proxy.rt.db.committed == 5


def test_a_failed_push_deletes_the_pending_delivered_rows_first(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from omniORB import CORBA

    consumer = Consumer(lambda seqs: CORBA.TRANSIENT(0, CORBA.COMPLETED_NO) if seqs == [3] and consumer.calls == 3
                        else None)
    proxy = _proxy(tmp_path, monkeypatch, consumer)
    for i in range(1, 5):
        proxy.queue.put(record(i, db_id=100 + i))
    deleted_at_failure: list[list[int]] = []
    real = proxy._deliver

    def deliver(entries: list[Any]) -> Any:
        outcome = real(entries)
        if outcome is not P.Outcome.DELIVERED:
            deleted_at_failure.append(sorted(proxy.rt.store.deleted))
        return outcome

    monkeypatch.setattr(proxy, "_deliver", deliver)
    t = run_worker(proxy)
    try:
        wait_for(lambda: len(proxy.rt.store.deleted) == 4, "every delivered row deleted")
    finally:
        stop(proxy, t)
    assert consumer.got == [1, 2, 3, 4]
    assert deleted_at_failure == [[101, 102]]


def test_replay_deletes_the_rows_of_journaled_events_and_removes_the_journals(tmp_path: Path) -> None:
    journals = DeliveredJournals(tmp_path / "delivered")
    j = journals.open(3, 1, 7)
    j.record([11, 12, 13], 1000.0)
    j.close()
    with open(tmp_path / "delivered" / "3-1-7.ids", "ab") as f:
        f.write(b"14")                               # a torn last write: not a complete id
    store, db = _RecordingStore(), NullDatabase()
    assert journals.replay(db, store) == 3
    assert store.calls == [(3, 1, 7, [11, 12, 13])]
    assert db.committed == 1
    assert not list((tmp_path / "delivered").iterdir())
    assert journals.replay(db, store) == 0


def test_replay_with_no_journal_directory_does_nothing(tmp_path: Path) -> None:
    assert DeliveredJournals(tmp_path / "none").replay(NullDatabase(), _RecordingStore()) == 0


class _RecordingStore(FakeStore):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, int, int, list[int]]] = []

    def delete_deliveries(self, conn: object, cid: int, aid: int, pid: int, ids: list[int], **how: Any) -> None:
        self.calls.append((cid, aid, pid, list(ids)))
        super().delete_deliveries(conn, cid, aid, pid, ids, **how)


class _ProxyStore(FakeStore):
    """delete_proxy drops the proxy's remaining queue rows as ``discarded`` (as router.channel.store does)."""

    def __init__(self, queued: list[int]) -> None:
        super().__init__()
        self.queued = set(queued)

    def delete_deliveries(self, conn: object, cid: int, aid: int, pid: int, ids: list[int], **how: Any) -> None:
        gone = [i for i in ids if i in self.queued]
        self.queued -= set(gone)
        super().delete_deliveries(conn, cid, aid, pid, gone, **how)

    def delete_proxy(self, conn: object, cid: int, side: str, aid: int, pid: int) -> None:
        for i in sorted(self.queued):
            self.outcomes[i] = ("discarded", "its proxy supplier was destroyed")
        self.queued.clear()


def test_a_destroyed_proxy_records_its_pending_delivered_events_as_delivered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review defect: teardown deleted the proxy's queue rows as ``discarded`` while up to FLUSH_EVENTS
    delivered events waited for their batch delete; and the destroyed proxy's journal file stayed."""
    consumer = Consumer()
    proxy = _proxy(tmp_path, monkeypatch, consumer)
    proxy.side = "C"
    proxy.rt.store = _ProxyStore([101, 102, 103, 104])
    proxy.rt.deactivate = lambda oid: None
    proxy.admin.forget_proxy = lambda pid: None
    proxy.filters, proxy.types = [], P.TypeSet()
    proxy._lock = __import__("threading").RLock()
    proxy.closing = False
    for i in range(1, 4):
        proxy.queue.put(record(i, db_id=100 + i))
    monkeypatch.setattr(pushsupplier, "FLUSH_EVENTS", 10**6)
    monkeypatch.setattr(pushsupplier, "FLUSH_AGE", 10**6)
    proxy.flush_delivered = lambda **kw: None        # only the teardown may delete: the thread keeps them pending
    t = run_worker(proxy)
    try:
        wait_for(lambda: len(proxy._pending or []) == 3, "three deliveries pending their batch delete")
        proxy.teardown(notify_client=False)
    finally:
        stop(proxy, t)
    assert consumer.got == [1, 2, 3]
    assert {i: o for i, (o, _) in proxy.rt.store.outcomes.items()} == {
        101: "delivered", 102: "delivered", 103: "delivered", 104: "discarded"}
    assert not (tmp_path / "delivered" / "0-0-1.ids").exists()


def _short_write_then(fail_truncate: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    """os.write writes 2 bytes of the next record, then fails (ENOSPC); ftruncate fails too if asked."""
    import os

    real_write, real_truncate = os.write, os.ftruncate
    state = {"short": True}

    def short_write(fd: int, data: Any) -> int:
        if state["short"]:
            state["short"] = False
            real_write(fd, bytes(data[:2]))
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    def truncate(fd: int, size: int) -> None:
        if fail_truncate:
            raise OSError(5, "Input/output error")
        real_truncate(fd, size)

    monkeypatch.setattr(os, "write", short_write)
    monkeypatch.setattr(os, "ftruncate", truncate)
    return state


@pytest.mark.parametrize("fail_truncate", [False, True])
def test_a_torn_journal_write_never_names_an_undelivered_event(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               fail_truncate: bool) -> None:
    """Review defect: a short write left "12" at the end; the next append made "125678" and replay deleted the
    row of event 125678, never delivered."""
    journals = DeliveredJournals(tmp_path / "delivered")
    j = journals.open(1, 0, 1)
    j.record([7], 1000.0)
    _short_write_then(fail_truncate, monkeypatch)
    with pytest.raises(OSError):
        j.record([1234], 1000.0)
    assert j.unusable is fail_truncate
    try:
        j.record([5678], 1000.0)
    except OSError:
        assert fail_truncate                           # unusable: the proxy commits each delivery instead
    j.close()
    store = _RecordingStore()
    journals.replay(NullDatabase(), store)
    named = [i for call in store.calls for i in call[3]]
    assert 125678 not in named and 1234 not in named
    assert named == ([7] if fail_truncate else [7, 5678])


def test_replay_skips_malformed_lines(tmp_path: Path) -> None:
    directory = tmp_path / "delivered"
    directory.mkdir()
    good = b"42 1000 %08x\n" % __import__("zlib").crc32(b"42 1000")
    (directory / "1-0-2.ids").write_bytes(b"125678 " + good[3:] + good + b"99\n" + b"43 1000 00000000\n")
    store = _RecordingStore()
    DeliveredJournals(directory).replay(NullDatabase(), store)
    assert store.calls == [(1, 0, 2, [42])]


def test_a_journal_that_cannot_be_cut_back_is_no_longer_used(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = Consumer()
    proxy = _proxy(tmp_path, monkeypatch, consumer)
    proxy.queue.put(record(1, db_id=101))
    t = run_worker(proxy)
    try:
        wait_for(lambda: len(consumer.got) == 1, "first delivery")
        wait_for(lambda: len(proxy.rt.store.deleted) == 1, "first row deleted (the queue emptied)")
        _short_write_then(True, monkeypatch)
        for i in range(2, 5):
            proxy.queue.put(record(i, db_id=100 + i))
        wait_for(lambda: len(proxy.rt.store.deleted) == 4, "every delivered row deleted")
    finally:
        stop(proxy, t)
    assert proxy._journal_off
    assert consumer.got == [1, 2, 3, 4]


class _HowStore(FakeStore):
    def __init__(self) -> None:
        super().__init__()
        self.hows: list[dict[str, Any]] = []

    def delete_deliveries(self, conn: object, cid: int, aid: int, pid: int, ids: list[int], **how: Any) -> None:
        self.hows.append({"ids": list(ids), **how})
        super().delete_deliveries(conn, cid, aid, pid, ids, **how)


def test_each_delivered_event_keeps_its_own_delivery_time_for_the_ledger(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review defect: acknowledged_at was the batch delete's time (up to FLUSH_AGE late), not the delivery's."""
    import time

    calls: list[tuple[float, float]] = []
    consumer = Consumer()
    real = consumer._receive

    def receive(seqs: list[int]) -> None:
        before = time.time()
        real(seqs)
        calls.append((before, time.time()))

    consumer._receive = receive  # type: ignore[method-assign]
    proxy = _proxy(tmp_path, monkeypatch, consumer)
    proxy.rt.store = _HowStore()
    for i in range(1, 4):
        proxy.queue.put(record(i, db_id=100 + i))
    t = run_worker(proxy)
    try:
        wait_for(lambda: len(proxy.rt.store.deleted) == 3, "every delivered row deleted")
    finally:
        stop(proxy, t)
    acked = {i: at for how in proxy.rt.store.hows for i, at in (how.get("acknowledged_at") or {}).items()}
    assert sorted(acked) == [101, 102, 103]
    for n in (1, 2):                                    # delivered after its call returned, before the next call
        assert calls[n - 1][1] <= acked[100 + n] <= calls[n][0]
    entries = read_entries_of(tmp_path)
    assert entries == []                                 # deleted: the journal is empty


def read_entries_of(tmp_path: Path) -> list[Any]:
    from router.channel.delivered import read_entries

    return read_entries(tmp_path / "delivered" / "0-0-1.ids")


def test_replay_gives_the_journaled_delivery_times(tmp_path: Path) -> None:
    journals = DeliveredJournals(tmp_path / "delivered")
    j = journals.open(3, 1, 7)
    j.record([11], 1000.5)
    j.record([12], 2000.25)
    j.close()
    store = _HowStore()
    journals.replay(NullDatabase(), store)
    assert store.hows[0]["acknowledged_at"] == {11: 1000.5, 12: 2000.25}


def test_a_delivered_best_effort_event_the_ledger_records_gets_its_row_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review defect: BestEffort events have no queue row to journal; their ledger rows waited for the batch
    delete, so a crash lost them and the audit (``ledger.best_effort``) counted delivered events as lost."""
    import threading

    release = threading.Event()

    def hold_event_2(seqs: list[int]) -> None:
        if seqs == [2]:
            release.wait(10)                             # its push is in flight until released

    consumer = Consumer(hold_event_2)
    proxy = _proxy(tmp_path, monkeypatch, consumer)
    proxy.rt.store = _HowStore()
    proxy.rt.store.ledger = LedgerWriter(LedgerSettings(best_effort=True))
    proxy.channel.volatile_accepted_at = lambda seq: 500.0 if seq == 1 else None
    monkeypatch.setattr(pushsupplier, "FLUSH_AGE", 10**6)
    proxy.queue.put(record(1))                           # BestEffort, recorded by the ledger
    proxy.queue.put(record(2, db_id=102))                # its push blocks until released
    t = run_worker(proxy)
    try:
        wait_for(lambda: any(how.get("best_effort") for how in proxy.rt.store.hows),
                 "the BestEffort event's delivered row written while the next push is in flight")
        release.set()
        wait_for(lambda: len(proxy.rt.store.deleted) == 1, "the persistent row deleted")
    finally:
        release.set()
        stop(proxy, t)
    how = next(h for h in proxy.rt.store.hows if h.get("best_effort"))
    assert how["best_effort"] == [(1, 500.0)]
    assert set(how["best_effort_acknowledged_at"]) == {1}


def _trickle(proxy: Any, consumer: Consumer, ids: range) -> None:
    """One event at a time, each once the previous was delivered: the queue is empty between them."""
    for i in ids:
        proxy.queue.put(record(i, db_id=1000 + i))
        wait_for(lambda i=i: i in consumer.got, f"event {i} delivered")  # type: ignore[misc]


def test_an_idle_queue_does_not_cost_a_delete_commit_per_delivered_event(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (round 7): the pending deletes ran whenever the queue had nothing more to deliver, so events that
    arrive one by one and are delivered at once (a lightly loaded bridge) cost one delete commit each. Now an idle
    queue flushes only from IDLE_FLUSH_EVENTS pending on (or once the oldest waited IDLE_FLUSH_AGE, here out of
    reach)."""
    monkeypatch.setattr(pushsupplier, "IDLE_FLUSH_AGE", 3600.0)
    monkeypatch.setattr(pushsupplier, "FLUSH_AGE", 10**6)     # nor the 1 s age of a busy queue
    consumer = Consumer()
    proxy = _proxy(tmp_path, monkeypatch, consumer)
    t = run_worker(proxy)
    try:
        _trickle(proxy, consumer, range(1, IDLE_FLUSH_EVENTS))
        assert proxy.rt.db.committed == 0, "deleted while fewer than IDLE_FLUSH_EVENTS were pending"
        assert proxy.rt.store.deleted == []
        _trickle(proxy, consumer, range(IDLE_FLUSH_EVENTS, IDLE_FLUSH_EVENTS + 1))
        wait_for(lambda: len(proxy.rt.store.deleted) == IDLE_FLUSH_EVENTS, "the pending rows deleted at idle")
        assert proxy.rt.db.committed == 1
    finally:
        stop(proxy, t)


def test_an_idle_queue_deletes_a_few_pending_rows_once_the_oldest_waited_idle_flush_age(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing more arrives: the few delivered rows still go once the oldest waited IDLE_FLUSH_AGE, the dispatcher
    woken by that deadline alone (no further traffic, and its ordinary idle wait out of reach)."""
    monkeypatch.setattr(pushsupplier, "IDLE_FLUSH_AGE", 0.05)
    monkeypatch.setattr(pushsupplier, "_IDLE_WAIT", 3600.0)   # only the IDLE_FLUSH_AGE timer can wake it
    consumer = Consumer()
    proxy = _proxy(tmp_path, monkeypatch, consumer)
    t = run_worker(proxy)
    try:
        _trickle(proxy, consumer, range(1, 4))
        wait_for(lambda: sorted(proxy.rt.store.deleted) == [1001, 1002, 1003], "the three rows deleted")
    finally:
        stop(proxy, t)
    assert read_ids(tmp_path / "delivered" / "0-0-1.ids") == []
