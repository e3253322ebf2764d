"""GroupCommit (accepted persistent events): leader/follower, one unit of work per group, errors shared.

The tests of grouping run with one commit slot (``max_inflight=1``: a push arriving during a commit waits for it);
the two-slot default (the next group commits on a second connection while one commits) has its own tests.

Twins for the database and the store; concurrency is arranged with a gate (the first commit blocks until the
followers have queued), so no test depends on timing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from router.channel.groupcommit import GroupCommit
from router.channel.store import NewEvent
from router.db.database import FenceToken
from router.db.errors import StoreUnavailable, WriteFenced

DEADLINE_S = 20.0


def wait_for(cond: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.002)
    raise AssertionError(f"timed out waiting for {what}")


class Db:
    def __init__(self) -> None:
        self.units = 0
        self.fail_commit: list[BaseException | None] = []     # per unit of work, in order

    @contextmanager
    def unit_of_work(self, timeout: float | None = None) -> Iterator[object]:
        self.units += 1
        failure = self.fail_commit.pop(0) if self.fail_commit else None
        yield object()
        if failure is not None:
            raise failure


class Store:
    def __init__(self) -> None:
        self.calls: list[tuple[int, list[int]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def insert_events(self, conn: object, cid: int, rows: Any, **_: object) -> list[int]:
        self.entered.set()
        assert self.gate.wait(DEADLINE_S)
        self.calls.append((cid, [r.seq for r in rows]))
        return [cid * 1000 + r.seq for r in rows]


def rows(*seqs: int) -> list[NewEvent]:
    return [NewEvent(s, 1, b"x", 0, None, None, [(0, 1)]) for s in seqs]


def test_a_lone_push_commits_at_once_in_its_own_unit_of_work() -> None:
    db, store = Db(), Store()
    gc = GroupCommit(db, store)
    assert gc.insert(1, rows(1, 2)) == [1001, 1002]
    assert db.units == 1 and store.calls == [(1, [1, 2])] and gc.commits == 1


class Pusher(threading.Thread):
    def __init__(self, gc: GroupCommit, cid: int, seqs: list[int]) -> None:
        super().__init__(daemon=True)
        self.gc, self.cid, self.seqs = gc, cid, seqs
        self.ids: list[int] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.ids = self.gc.insert(self.cid, rows(*self.seqs))
        except BaseException as exc:  # noqa: BLE001 — the test inspects it
            self.error = exc


def _leader_blocked(gc: GroupCommit, store: Store) -> Pusher:
    store.gate.clear()
    leader = Pusher(gc, 1, [1])
    leader.start()
    assert store.entered.wait(DEADLINE_S)
    return leader


def test_pushes_arriving_during_a_commit_share_the_next_one() -> None:
    db, store = Db(), Store()
    gc = GroupCommit(db, store, max_inflight=1)
    leader = _leader_blocked(gc, store)
    followers = [Pusher(gc, 1 + i % 2, [10 + i]) for i in range(6)]     # two channels
    for f in followers:
        f.start()
    wait_for(lambda: len(gc._pending) == 6, "six pushes queued behind the commit in progress")
    store.gate.set()
    for t in [leader, *followers]:
        t.join(DEADLINE_S)
        assert not t.is_alive() and t.error is None
    assert db.units == 2, "seven pushes, two commits"                  # before: one commit per push
    assert sorted(cid for cid, _ in store.calls[1:]) == [1, 2], "one statement per channel in the group"
    for f in followers:
        assert f.ids == [f.cid * 1000 + f.seqs[0]]
    assert leader.ids == [1001]


def test_every_push_of_a_failed_group_gets_the_same_store_error() -> None:
    db, store = Db(), Store()
    gc = GroupCommit(db, store, max_inflight=1)
    leader = _leader_blocked(gc, store)
    followers = [Pusher(gc, 1, [10 + i]) for i in range(4)]
    for f in followers:
        f.start()
    wait_for(lambda: len(gc._pending) == 4, "four pushes queued")
    broken = StoreUnavailable("injected: connection lost during COMMIT", in_doubt=True)
    db.fail_commit = [broken]                     # the leader's unit of work is already open: the group's fails
    store.gate.set()
    for t in [leader, *followers]:
        t.join(DEADLINE_S)
    assert leader.error is None and leader.ids == [1001]
    assert all(f.error is broken for f in followers), [f.error for f in followers]
    assert all(f.ids is None for f in followers)
    assert gc.insert(1, rows(99)) == [1099], "the committer works on after a failed group"


def test_a_group_is_bounded_and_every_push_is_committed() -> None:
    db, store = Db(), Store()
    gc = GroupCommit(db, store, max_events=3, max_inflight=1)
    leader = _leader_blocked(gc, store)
    followers = [Pusher(gc, 1, [10 + 2 * i, 11 + 2 * i]) for i in range(4)]   # 8 events, 2 per push
    for f in followers:
        f.start()
    wait_for(lambda: len(gc._pending) == 4, "four pushes queued")
    store.gate.set()
    for t in [leader, *followers]:
        t.join(DEADLINE_S)
        assert not t.is_alive() and t.error is None
    assert all(len(seqs) <= 3 for _, seqs in store.calls), store.calls
    assert sorted(s for _, seqs in store.calls for s in seqs) == [1, *range(10, 18)]
    assert db.units == 1 + 4                      # groups of one 2-event push each (a second would exceed 3)


def test_an_error_that_is_not_a_store_error_reaches_every_member_too() -> None:
    db, store = Db(), Store()
    gc = GroupCommit(db, store)
    db.fail_commit = [RuntimeError("injected bug")]
    with pytest.raises(RuntimeError):
        gc.insert(1, rows(1))
    assert gc.insert(1, rows(2)) == [1002]


class StatementDb(Db):
    """A database twin that also has ``statement()`` (an autocommit connection for one statement)."""

    def __init__(self) -> None:
        super().__init__()
        self.statements = 0

    @contextmanager
    def statement(self, timeout: float | None = None) -> Iterator[object]:
        self.statements += 1
        failure = self.fail_commit.pop(0) if self.fail_commit else None
        yield object()
        if failure is not None:
            raise failure


class OneStatementStore(Store):
    def __init__(self, multi: set[int] | None = None) -> None:
        super().__init__()
        self.multi = multi or set()                   # channels whose events need more than one statement

    def one_statement(self, cid: int, events: Any) -> bool:
        return cid not in self.multi


def test_a_one_channel_one_statement_group_is_written_without_begin_and_commit() -> None:
    db, store = StatementDb(), OneStatementStore()
    gc = GroupCommit(db, store, one_statement=True)
    assert gc.insert(1, rows(1, 2)) == [1001, 1002]
    assert (db.statements, db.units, gc.statements, gc.commits) == (1, 0, 1, 1)


def test_a_group_of_two_channels_or_of_several_statements_is_a_unit_of_work() -> None:
    db, store = StatementDb(), OneStatementStore(multi={3})
    gc = GroupCommit(db, store, one_statement=True, max_inflight=1)
    assert gc.insert(3, rows(1)) == [3001]                     # the store needs two statements for channel 3
    assert (db.statements, db.units) == (0, 1)
    leader = _leader_blocked(gc, store)                        # channel 1: one statement
    followers = [Pusher(gc, 1 + i % 2, [10 + i]) for i in range(2)]     # channels 1 and 2 in one group
    for f in followers:
        f.start()
    wait_for(lambda: len(gc._pending) == 2, "two pushes queued")
    store.gate.set()
    for t in [leader, *followers]:
        t.join(DEADLINE_S)
        assert not t.is_alive() and t.error is None
    assert (db.statements, db.units) == (1, 2), "the lone leader's group: a statement; the two-channel group: not"


def test_without_one_statement_every_group_is_a_unit_of_work() -> None:
    db, store = StatementDb(), OneStatementStore()
    gc = GroupCommit(db, store)
    gc.insert(1, rows(1))
    assert (db.statements, db.units) == (0, 1)


def test_a_failed_statement_fails_its_push_and_the_committer_goes_on() -> None:
    db, store = StatementDb(), OneStatementStore()
    gc = GroupCommit(db, store, one_statement=True)
    broken = StoreUnavailable("injected: connection lost during the statement", in_doubt=True)
    db.fail_commit = [broken]
    with pytest.raises(StoreUnavailable) as info:
        gc.insert(1, rows(1))
    assert info.value is broken
    assert gc.insert(1, rows(2)) == [1002]


class RaisingStore(OneStatementStore):
    """``one_statement`` fails once, for the group after the first (a bug or an error of the store's check)."""

    def __init__(self) -> None:
        super().__init__()
        self.checks = 0
        self.failure = RuntimeError("injected: one_statement failed")

    def one_statement(self, cid: int, events: Any) -> bool:
        self.checks += 1
        if self.checks == 2:
            raise self.failure
        return True


def test_a_failure_deciding_the_group_s_kind_reaches_every_member_and_nobody_hangs_or_spins() -> None:
    db, store = StatementDb(), RaisingStore()
    gc = GroupCommit(db, store, one_statement=True, max_inflight=1)
    leader = _leader_blocked(gc, store)
    followers = [Pusher(gc, 1, [10 + i]) for i in range(3)]
    for f in followers:
        f.start()
    wait_for(lambda: len(gc._pending) == 3, "three pushes queued")
    store.gate.set()
    for t in [leader, *followers]:
        t.join(DEADLINE_S)
        assert not t.is_alive(), "a follower of the failed group hangs or spins as a leader of empty groups"
    assert leader.error is None and leader.ids == [1001]
    assert all(f.error is store.failure for f in followers), [f.error for f in followers]
    assert (db.statements, db.units, gc.commits) == (1, 0, 1), "no empty group was committed"
    assert gc.insert(1, rows(99)) == [1099], "the committer works on"


class GatedStore(Store):
    """Each insert_events blocks on its own gate (in call order), so two commits can be held in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: list[threading.Event] = []
        self.inside = 0
        self.most_inside = 0
        self._lock = threading.Lock()

    def insert_events(self, conn: object, cid: int, rows: Any, **_: object) -> list[int]:
        with self._lock:
            gate = threading.Event()
            self.gates.append(gate)
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            assert gate.wait(DEADLINE_S)
            with self._lock:
                self.calls.append((cid, [r.seq for r in rows]))
            return [cid * 1000 + r.seq for r in rows]
        finally:
            with self._lock:
                self.inside -= 1


def test_two_groups_commit_at_once_and_later_pushes_share_the_next_free_slot() -> None:
    db, store = Db(), GatedStore()
    gc = GroupCommit(db, store)                               # default: two commit slots
    first = Pusher(gc, 1, [1])
    first.start()
    wait_for(lambda: len(store.gates) == 1, "the first group committing")
    second = Pusher(gc, 1, [2])
    second.start()
    wait_for(lambda: len(store.gates) == 2, "a second group committing while the first one does (a free slot)")
    followers = [Pusher(gc, 1, [10 + i]) for i in range(5)]
    for f in followers:
        f.start()
    wait_for(lambda: len(gc._pending) == 5, "five pushes queued: both slots busy")
    assert len(store.gates) == 2, "no third commit while two are in flight"
    store.gates[0].set()                                      # the first group ends: one slot frees
    first.join(DEADLINE_S)
    assert first.ids == [1001] and second.ids is None, "the second push returns only once its own commit ended"
    wait_for(lambda: len(store.gates) == 3, "the queued pushes committing as one group in the freed slot")
    store.gates[2].set()
    for f in followers:
        f.join(DEADLINE_S)
        assert not f.is_alive() and f.error is None and f.ids == [1000 + f.seqs[0]]
    assert second.is_alive(), "the second push is still waiting for its own commit"
    store.gates[1].set()
    second.join(DEADLINE_S)
    assert second.ids == [1002] and second.error is None
    assert db.units == 3 and gc.commits == 3 and store.most_inside == 2


def test_with_two_slots_a_failed_group_fails_only_its_own_members() -> None:
    db, store = Db(), GatedStore()
    broken = StoreUnavailable("injected: connection lost during COMMIT", in_doubt=True)
    db.fail_commit = [None, broken]                           # the second unit of work fails at its commit
    gc = GroupCommit(db, store)
    first = Pusher(gc, 1, [1])
    first.start()
    wait_for(lambda: len(store.gates) == 1, "the first group committing")
    second = Pusher(gc, 1, [2])
    second.start()
    wait_for(lambda: len(store.gates) == 2, "the second group committing")
    followers = [Pusher(gc, 1, [10 + i]) for i in range(2)]
    for f in followers:
        f.start()
    wait_for(lambda: len(gc._pending) == 2, "two pushes queued")
    store.gates[1].set()                                      # the second group fails first
    second.join(DEADLINE_S)
    assert second.error is broken and second.ids is None
    wait_for(lambda: len(store.gates) == 3, "the queued pushes committing in the slot the failed group freed")
    store.gates[2].set()
    store.gates[0].set()
    for t in [first, *followers]:
        t.join(DEADLINE_S)
        assert not t.is_alive() and t.error is None and t.ids == [1000 + t.seqs[0]]
    assert gc.commits == 2 and gc.events == 3


def test_many_pushers_on_two_slots_all_return_with_their_own_ids() -> None:
    db, store = Db(), Store()
    gc = GroupCommit(db, store)
    pushers = [Pusher(gc, 1 + i % 3, [100 + i]) for i in range(40)]
    for p in pushers:
        p.start()
    for p in pushers:
        p.join(DEADLINE_S)
        assert not p.is_alive() and p.error is None and p.ids == [p.cid * 1000 + p.seqs[0]]
    assert gc.events == 40 and gc.commits == db.units


def test_a_push_still_queued_behind_a_stuck_commit_gives_up_and_is_never_stored_later() -> None:
    """Issue 31 (silent network cut): pushes queued behind a commit that does not end used to wait for ever and
    were stored once it ended, long after their suppliers had given up (and retried: duplicates). Now a queued
    push withdraws its events at ``max_wait`` (StoreUnavailable: TRANSIENT, COMPLETED_NO) and no group takes them."""
    db, store = Db(), Store()
    gc = GroupCommit(db, store, max_inflight=1, max_wait=0.3)
    leader = _leader_blocked(gc, store)                  # the commit in progress does not end (the network is cut)
    followers = [Pusher(gc, 1, [10 + i]) for i in range(3)]
    for f in followers:
        f.start()
    for f in followers:
        f.join(DEADLINE_S)
        assert not f.is_alive(), "a queued push must not wait for the stuck commit"
        assert isinstance(f.error, StoreUnavailable) and not f.error.in_doubt
    assert gc._pending == [] and gc.withdrawn == 3
    store.gate.set()                                     # the network returns: the stuck commit ends
    leader.join(DEADLINE_S)
    assert leader.error is None and leader.ids == [1001]
    later = Pusher(gc, 1, [99])
    later.run()
    assert later.ids == [1099]
    assert [seqs for _, seqs in store.calls] == [[1], [99]], "the abandoned pushes were stored later"


def test_a_push_woken_to_lead_after_its_deadline_still_hands_the_lead_on() -> None:
    """A withdrawn push that had been woken to lead passes the lead to the next queued push (nobody hangs)."""
    db, store = Db(), Store()
    gc = GroupCommit(db, store, max_inflight=1, max_wait=0.3)
    leader = _leader_blocked(gc, store)
    first = Pusher(gc, 1, [10])
    first.start()
    wait_for(lambda: len(gc._pending) == 1, "the first follower queued")
    first.join(DEADLINE_S)
    assert isinstance(first.error, StoreUnavailable)
    gc._max_wait = 60.0
    second = Pusher(gc, 1, [20])
    second.start()
    wait_for(lambda: len(gc._pending) == 1, "the second follower queued")
    store.gate.set()
    for t in (leader, second):
        t.join(DEADLINE_S)
        assert not t.is_alive() and t.error is None
    assert second.ids == [1020]


class FencedDb(Db):
    """A database with the node's statement fence: ``fenced`` says whether the node's own token is gone."""

    def __init__(self) -> None:
        super().__init__()
        self.fenced = False
        self.refusals: list[WriteFenced] = []
        self.statement_fence = self

    def token(self) -> FenceToken:
        if self.fenced:
            raise WriteFenced("injected: this node was fenced")
        return FenceToken("na", 1)

    def refused(self, exc: WriteFenced) -> None:
        self.refusals.append(exc)


class MovedStore(Store):
    """Channel 2 moved to another node: its statement's fence check refuses it (nothing written)."""

    def insert_events(self, conn: object, cid: int, rows: Any, **kw: object) -> list[int]:
        assert isinstance(kw.get("fence"), FenceToken), "every statement carries the node's token"
        if cid == 2:
            self.entered.set()
            raise WriteFenced("injected: channel 2 is owned by another node")
        return super().insert_events(conn, cid, rows)


def _group_of_two_channels(db: FencedDb, *, fence_at_group: bool = False
                           ) -> tuple[Pusher, Pusher, Pusher, MovedStore]:
    store = MovedStore()
    gc = GroupCommit(db, store, max_inflight=1)
    leader = _leader_blocked(gc, store)                                  # channel 1, alone
    one, two = Pusher(gc, 1, [10]), Pusher(gc, 2, [20])
    one.start()
    two.start()
    wait_for(lambda: len(gc._pending) == 2, "two pushes of two channels queued: the next group")
    db.fenced = fence_at_group                                           # the node's lease lost meanwhile?
    store.gate.set()
    for t in (leader, one, two):
        t.join(DEADLINE_S)
        assert not t.is_alive()
    assert leader.error is None and leader.ids == [1001]
    return one, two, leader, store


def test_a_channel_that_moved_fails_only_its_own_pushes_not_the_other_channels_of_the_group() -> None:
    db = FencedDb()
    one, two, _, store = _group_of_two_channels(db)
    assert one.error is None and one.ids == [1010], f"channel 1 is still ours: stored ({one.error!r})"
    assert isinstance(two.error, WriteFenced) and two.ids is None
    assert (1, [10]) in store.calls and not any(cid == 2 for cid, _ in store.calls)
    assert len(db.refusals) == 2, "the group's refusal and channel 2's own"


def test_a_fenced_node_s_refused_group_fails_every_push_and_is_not_written_again() -> None:
    db = FencedDb()
    one, two, _, store = _group_of_two_channels(db, fence_at_group=True)
    assert isinstance(one.error, WriteFenced) and isinstance(two.error, WriteFenced)
    assert store.calls == [(1, [1])], "only the lone leader's (before the fence); nothing of the group"
