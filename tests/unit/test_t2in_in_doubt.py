"""A JMS -> channel local round (no T2) whose COMMIT broke (StoreUnavailable.in_doubt): the events are queued once
the store shows they were committed, without a node restart; nothing is queued when they were not (issue 31's
pattern, found in the local round: before, committed events stayed unqueued until the next start)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from router.channel import t2in as C
from router.channel.channel import RoutePlan
from router.db.errors import StoreUnavailable


class Conn:
    def __init__(self, committed: bool) -> None:
        self.committed = committed

    def execute(self, query: str, params: Any = None) -> Any:
        assert "nsjms_event" in query
        return SimpleNamespace(fetchone=lambda: (2 if self.committed else 0,))


class Db:
    """The first unit of work (the round) fails at COMMIT, in doubt; the next ones answer whether it committed,
    after ``unreachable`` failures (the database still away)."""

    def __init__(self, committed: bool, unreachable: int = 0) -> None:
        self.committed, self.unreachable, self.units = committed, unreachable, 0

    @contextlib.contextmanager
    def unit_of_work(self) -> Iterator[Conn]:
        self.units += 1
        if self.units == 1:
            yield Conn(self.committed)
            raise StoreUnavailable("database connection failed during commit", in_doubt=True)
        if self.unreachable:
            self.unreachable -= 1
            raise StoreUnavailable("no database connection within 5 s")
        yield Conn(self.committed)


def rig(db: Db) -> tuple[Any, list[RoutePlan]]:
    published: list[RoutePlan] = []

    def store_in(conn: Any, plan: RoutePlan) -> None:
        for n, (rec, _) in enumerate(plan.plans):
            rec.db_id = 100 + n

    def publish(plan: RoutePlan) -> None:
        published.append(plan)

    channel = SimpleNamespace(store_in=store_in, publish=publish)
    proxy = SimpleNamespace(rt=SimpleNamespace(db=db, shutting_down=threading.Event()), channel=channel, oid="p1")
    return proxy, published


def batch() -> Any:
    return SimpleNamespace(received=2, events=["e1", "e2"], settle=lambda: None, abandon=lambda: None)


@pytest.mark.parametrize("committed", [True, False])
def test_an_in_doubt_local_round_queues_its_events_only_if_they_were_committed(
        monkeypatch: pytest.MonkeyPatch, committed: bool) -> None:
    db = Db(committed, unreachable=2)
    proxy, published = rig(db)
    plan = RoutePlan(plans=[(cast(Any, SimpleNamespace(db_id=None)), []), (cast(Any, SimpleNamespace(db_id=None)), [])])
    monkeypatch.setattr(C, "plan_events", lambda p, b: plan)
    threads: list[threading.Thread] = []
    real = C.resolve_in_doubt

    def resolving(p: Any, pl: RoutePlan) -> threading.Thread:
        threads.append(real(p, pl))
        return threads[-1]

    monkeypatch.setattr(C, "resolve_in_doubt", resolving)
    with pytest.raises(StoreUnavailable):
        C.local_round(proxy, lambda conn, n, w: batch(), 10, 0.0)
    assert len(threads) == 1
    threads[0].join(30)
    assert not threads[0].is_alive()
    assert db.units == 4, "asked again while the database was unreachable"
    assert published == ([plan] if committed else [])
