"""A pulled event the channel refuses is kept in the dead-letter store ONCE, even when the COMMIT that stored it lost
its answer (review finding 11).

A pull proxy consumer dead-letters an event the channel refuses (unusable QoS headers, above the size limit) in a
unit of work of its own. When that unit's COMMIT answer is lost (``StoreUnavailable(in_doubt=True)``: the row may be
stored), the proxy keeps the event and tries again. Before: each try took a new sequence number, so the dedupe id
(``p<run>/s<seq>/...``) differed and ``ON CONFLICT (dedupe_id) DO NOTHING`` could not recognise the row the first
try had committed: the dead letter was stored twice (an operator retrying both routed the event twice).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

from omniORB import CORBA

from router.channel import consumers as C
from router.channel.deadletters import NewDeadLetter
from router.channel.events import normalise_any
from router.db import StoreUnavailable


class Store:
    """``nsjms_dead_letter`` as far as ``add`` goes: unique dedupe ids (ON CONFLICT DO NOTHING)."""

    def __init__(self) -> None:
        self.rows: dict[str, NewDeadLetter] = {}

    def add(self, conn: Any, dl: NewDeadLetter) -> int | None:
        if dl.dedupe_id in self.rows:
            return None
        self.rows[dl.dedupe_id] = dl
        return len(self.rows)


class Db:
    """Units of work whose first ``lost`` COMMITs commit and then lose their answer."""

    def __init__(self, lost: int) -> None:
        self.lost = lost

    @contextlib.contextmanager
    def unit_of_work(self) -> Iterator[object]:
        yield object()
        if self.lost:
            self.lost -= 1
            raise StoreUnavailable("connection lost during COMMIT", in_doubt=True)


class Ledger:
    run_id = "run1"


class Rt:
    def __init__(self, lost: int) -> None:
        self.db = Db(lost)
        self.dead_letters = Store()
        self.store = type("S", (), {"ledger": Ledger()})()
        self._seqs = itertools.count(1)

    def next_seq(self) -> int:
        return next(self._seqs)


def _proxy(lost: int) -> Any:
    proxy: Any = object.__new__(C.StructuredProxyPullConsumerImpl)
    proxy.rt = Rt(lost)
    proxy.oid, proxy.id = "ch/0/S/0/1", 1
    proxy.admin = type("Admin", (), {"id": 0})()
    proxy.channel = type("Channel", (), {"id": 0})()
    proxy.dead_lettered, proxy.last_dead_letter = 0, None
    return proxy


def test_a_refused_pulled_event_is_stored_once_when_the_commit_answer_was_lost() -> None:
    proxy = _proxy(lost=1)
    event = normalise_any(CORBA.Any(CORBA.TC_string, "too big"))
    exc = CORBA.IMP_LIMIT(0, CORBA.COMPLETED_NO)
    assert not proxy._refused(event, exc, "above the size limit")     # in doubt: kept, tried again
    assert proxy._refused(event, exc, "above the size limit")         # the retry finds its row
    assert len(proxy.rt.dead_letters.rows) == 1, list(proxy.rt.dead_letters.rows)   # before: 2
    assert proxy.dead_lettered == 1


def test_distinct_refused_events_keep_distinct_dead_letters() -> None:
    proxy = _proxy(lost=0)
    exc = CORBA.BAD_QOS(0, CORBA.COMPLETED_NO)
    for text in ("a", "a", "b"):                                      # equal content is still another event
        assert proxy._refused(normalise_any(CORBA.Any(CORBA.TC_string, text)), exc, "unusable QoS")
    assert len(proxy.rt.dead_letters.rows) == 3
