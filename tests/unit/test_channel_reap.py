"""The reaper deletes fully delivered events in one batch per unit of work and keeps them when it fails."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from router.channel.runtime import Runtime
from router.channel.store import Store
from router.db import StoreUnavailable
from router.db.testing import NullDatabase


class RecordingStore(Store):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[int]] = []
        self.down = False

    def delete_events(self, conn: object, event_ids: Iterable[int]) -> None:
        if self.down:
            raise StoreUnavailable("injected: database down")
        self.batches.append(list(event_ids))


def runtime() -> tuple[Runtime, RecordingStore, NullDatabase]:
    rt = Runtime.__new__(Runtime)        # no ORB needed for the reaper
    store, db = RecordingStore(), NullDatabase()
    rt.store, rt.db = store, db          # type: ignore[assignment]
    return rt, store, db


def test_delivered_events_are_deleted_in_one_statement_in_one_unit_of_work() -> None:
    rt, store, db = runtime()
    for eid in (3, 1, 2):
        store.reap_later(eid)
    assert rt.reap() == 3
    assert store.batches == [[3, 1, 2]] and (db.opened, db.committed) == (1, 1)
    assert rt.reap() == 0 and db.opened == 1          # nothing queued: no unit of work


def test_a_failed_unit_of_work_keeps_the_events_for_the_next_round() -> None:
    rt, store, db = runtime()
    store.reap_later(7)
    store.down = True
    with pytest.raises(StoreUnavailable):
        rt.reap()
    assert db.rolled_back == 1
    store.down = False
    store.reap_later(8)
    assert rt.reap() == 2 and store.batches == [[7, 8]]
