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
from router.channel.delivered import FLUSH_EVENTS, DeliveredJournals, ProxyJournal, read_ids
from router.db.testing import NullDatabase


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
    def refuse(self: ProxyJournal, ids: Any) -> None:
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
    j.record([11, 12, 13])
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
    monkeypatch.setattr(P, "FLUSH_EVENTS", 10**6)
    monkeypatch.setattr(P, "FLUSH_AGE", 10**6)
    proxy._flush_delivered = lambda **kw: None        # only the teardown may delete: the thread keeps them pending
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
    j.record([7])
    _short_write_then(fail_truncate, monkeypatch)
    with pytest.raises(OSError):
        j.record([1234])
    assert j.unusable is fail_truncate
    try:
        j.record([5678])
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
    good = b"%d %08x\n" % (42, __import__("zlib").crc32(b"42"))
    (directory / "1-0-2.ids").write_bytes(b"125678 " + good[3:] + good + b"99\n" + b"43 00000000\n")
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
