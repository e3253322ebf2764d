"""``router.deadletter.ops`` without services: where a retry goes, what is refused (and kept), the operator log.

The store and the channel are fakes that record what was called on which unit of work (``NullDatabase``'s units
of work are distinct objects), so "in one transaction" is an identity check.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from omniORB import CORBA

from router.channel.channel import RoutePlan
from router.channel.deadletters import DeadLetter
from router.channel.events import Event, Form
from router.db.testing import NullDatabase
from router.deadletter import ops as ops_module
from router.deadletter.ops import DeadLetterOps, Refused
from router.routing.t2.ops import AUDIT_FILE


def _dl(**kw: Any) -> DeadLetter:
    base: dict[str, Any] = dict(id=9, dedupe_id="e1/c7/a0/p2", channel_id=7, side="C", admin_id=0, proxy_id=2,
                                event_id=1, seq=5, form=1, body=b"body", priority=3, deadline=None, start_at=None,
                                persistent=True, event_name="d/t/n", reason="r", exception="e", attempts=3,
                                received_at=0.0, dead_at=1.0)
    base.update(kw)
    return DeadLetter(**base)


class FakeStore:
    def __init__(self, *rows: DeadLetter) -> None:
        self.rows = {r.id: r for r in rows}
        self.calls: list[tuple[str, object]] = []     # (what, conn)
        self.destroyed: set[tuple[int, int]] = set()  # proxies whose row is gone (a destroy committed)

    def get(self, conn: object, dl_id: int, *, lock: bool = False) -> DeadLetter | None:
        self.calls.append(("get-locked" if lock else "get", conn))
        return self.rows.get(dl_id)

    def proxy_stored(self, conn: object, cid: int, aid: int, pid: int) -> bool:
        self.calls.append(("proxy-locked", conn))
        return (aid, pid) not in self.destroyed

    def delete(self, conn: object, dl_id: int) -> bool:
        self.calls.append(("delete", conn))
        return self.rows.pop(dl_id, None) is not None


class FakeProxy:
    destroyed = False

    def __init__(self, aid: int, pid: int, wants: bool = True) -> None:
        self.admin = type("Admin", (), {"id": aid})()
        self.id, self.want = pid, wants


class FakeAdmin:
    def __init__(self, *proxies: FakeProxy) -> None:
        self.proxies = {p.id: p for p in proxies}

    def targets_for(self, event: Event) -> list[FakeProxy]:
        return [p for p in self.proxies.values() if p.want]


class FakeChannel:
    destroyed = False
    id = 7

    def __init__(self, store: FakeStore, consumers: dict[int, FakeAdmin], suppliers: dict[int, Any] | None = None
                 ) -> None:
        self.store, self.consumer_admins, self.supplier_admins = store, consumers, suppliers or {}
        self.qos: dict[str, Any] = {}
        self.published: list[RoutePlan] = []
        self.plan_in_error: BaseException | None = None

    def released(self, rec: Any) -> None:
        pass

    def store_in(self, conn: object, plan: RoutePlan) -> None:
        self.store.calls.append(("store_in", conn))
        for rec, _ in plan.plans:
            rec.db_id = 555

    def publish(self, plan: RoutePlan) -> None:
        self.published.append(plan)

    def plan_in(self, source: Any, events: list[Event]) -> RoutePlan:
        if self.plan_in_error is not None:
            raise self.plan_in_error
        from router.channel.queue import Record

        rec = Record(77, events[0], 0, None, None, True)
        return RoutePlan([(rec, [FakeProxy(0, 4)])], {}, 0, source, 0.0)


def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *rows: DeadLetter, consumers: dict[int, FakeAdmin]
         ) -> tuple[DeadLetterOps, FakeStore, FakeChannel]:
    monkeypatch.setattr(ops_module, "decode", lambda form, body: Event(Form.STRUCTURED, body))
    store = FakeStore(*rows)
    channel = FakeChannel(store, consumers)
    factory = type("Factory", (), {"channels": {7: channel}})()
    seqs = iter(range(100, 200))
    ops = DeadLetterOps("n1", tmp_path, NullDatabase(), store, factory, next_seq=lambda: next(seqs))  # type: ignore[arg-type]
    return ops, store, channel


def log(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / AUDIT_FILE).read_text().splitlines()]


def test_a_retry_goes_back_into_its_proxy_in_the_transaction_that_removes_it(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    ops, store, channel = make(tmp_path, monkeypatch, _dl(), consumers={0: FakeAdmin(FakeProxy(0, 2), FakeProxy(0, 3))})
    result = ops.retry(9, "alice")
    assert result["target"] == "proxy" and result["proxies"] == ["0/2"] and result["event_id"] == 555
    whats = [w for w, _ in store.calls]
    assert whats == ["get-locked", "proxy-locked", "store_in", "delete"]
    assert len({id(c) for _, c in store.calls}) == 1               # one unit of work
    [plan] = channel.published                                     # queued in memory after the commit
    rec, targets = plan.plans[0]
    assert (rec.seq, rec.priority, rec.persistent, plan.bodies) == (100, 3, True, {100: b"body"})
    assert [(t.admin.id, t.id) for t in targets] == [(0, 2)]       # not the other consumer of the channel
    [entry] = log(tmp_path)
    assert (entry["action"], entry["target"], entry["who"]) == ("deadletter retry", "9", "alice")
    assert entry["result"]["retried"] is True


def test_with_its_proxy_gone_the_channel_routes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ops, _, _ = make(tmp_path, monkeypatch, _dl(), consumers={0: FakeAdmin(FakeProxy(0, 5)),
                                                             1: FakeAdmin(FakeProxy(1, 6, wants=False))})
    result = ops.retry(9, "alice")
    assert result["target"] == "channel" and result["proxies"] == ["0/5"]


def test_a_proxy_whose_row_is_gone_is_not_retried_into(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    closing = FakeProxy(0, 2, wants=False)                         # its teardown stopped it (not connected) ...
    ops, store, _ = make(tmp_path, monkeypatch, _dl(), consumers={0: FakeAdmin(closing, FakeProxy(0, 3))})
    store.destroyed.add((0, 2))                                    # ... and deleted its row; still in memory
    result = ops.retry(9, "alice")
    assert result["target"] == "channel" and result["proxies"] == ["0/3"]


def test_a_retry_nobody_wants_is_refused_and_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ops, store, channel = make(tmp_path, monkeypatch, _dl(), consumers={0: FakeAdmin(FakeProxy(0, 5, wants=False))})
    with pytest.raises(Refused, match="no consumer of channel 7 wants it"):
        ops.retry(9, "alice")
    assert 9 in store.rows and not channel.published
    assert [w for w, _ in store.calls] == ["get-locked"]
    assert log(tmp_path)[0]["result"].startswith("refused: dead letter 9: no consumer")


def test_a_refused_pulled_event_passes_the_channels_checks_again(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    ops, store, channel = make(tmp_path, monkeypatch, _dl(side="S"), consumers={})
    channel.plan_in_error = CORBA.BAD_QOS(0, CORBA.COMPLETED_NO)
    with pytest.raises(Refused, match="refuses it again"):
        ops.retry(9, "bob")
    assert 9 in store.rows
    channel.plan_in_error = None
    assert ops.retry(9, "bob")["proxies"] == ["0/4"]
    assert 9 not in store.rows


def test_unknown_ids_and_a_gone_channel_are_refused_and_logged(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    ops, store, channel = make(tmp_path, monkeypatch, _dl(), consumers={})
    with pytest.raises(Refused, match="no dead letter 8"):
        ops.retry(8, "carol")
    with pytest.raises(Refused, match="no dead letter 8"):
        ops.discard(8, "carol", "x")
    channel.destroyed = True
    with pytest.raises(Refused, match="channel 7 no longer exists"):
        ops.retry(9, "carol")
    assert [e["action"] for e in log(tmp_path)] == ["deadletter retry", "deadletter discard", "deadletter retry"]
    assert 9 in store.rows


def test_discard_removes_it_and_logs_who_and_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ops, store, channel = make(tmp_path, monkeypatch, _dl(), consumers={})
    result = ops.discard(9, "dave", "garbage text")
    assert result == {"id": 9, "discarded": True, "channel": 7, "event": "d/t/n", "dedupe_id": "e1/c7/a0/p2"}
    assert store.rows == {} and not channel.published
    [entry] = log(tmp_path)
    assert (entry["who"], entry["why"], entry["action"]) == ("dave", "garbage text", "deadletter discard")


class _LostCommitAnswer(NullDatabase):
    """A unit of work whose COMMIT answer is lost: the transaction committed, the caller gets in_doubt."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = 1

    def unit_of_work(self) -> Any:
        import contextlib

        from router.db import StoreUnavailable

        inner = super().unit_of_work()
        db = self

        @contextlib.contextmanager
        def uow() -> Any:
            with inner as conn:
                yield conn
            if db.broken:
                db.broken -= 1
                raise StoreUnavailable("connection lost during COMMIT", in_doubt=True)

        return uow()


def test_a_retry_whose_commit_answer_was_lost_queues_the_event_when_it_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review finding: a retry whose COMMIT answer was lost (StoreUnavailable in_doubt) had removed the dead letter
    and stored the event, yet never queued it (a second retry found no dead letter): stuck until a restart."""
    ops, _, channel = make(tmp_path, monkeypatch, _dl(), consumers={0: FakeAdmin(FakeProxy(0, 2))})
    ops.db = _LostCommitAnswer()
    monkeypatch.setattr(ops, "_committed", lambda plan: True)      # the event's row is there
    result = ops.retry(9, "alice")
    assert result["retried"] is True and len(channel.published) == 1


def test_a_retry_whose_commit_answer_was_lost_and_did_not_commit_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from router.db import StoreUnavailable

    ops, _, channel = make(tmp_path, monkeypatch, _dl(), consumers={0: FakeAdmin(FakeProxy(0, 2))})
    ops.db = _LostCommitAnswer()
    monkeypatch.setattr(ops, "_committed", lambda plan: False)
    with pytest.raises(StoreUnavailable):
        ops.retry(9, "alice")
    assert channel.published == []
