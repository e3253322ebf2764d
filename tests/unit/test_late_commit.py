"""router.routing.t2.latecommit: what recovery or an operator commits reaches the channels unless a driver owns the
T2."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from psycopg import Xid

from router.routing.t2.latecommit import LateCommitManager, LateCommits
from xa.errors import BranchUnavailable, ResourceError


class FakeManager:
    key = "postgresql"

    def __init__(self) -> None:
        self.done: list[tuple[str, str]] = []

    def recover(self) -> Sequence[Xid]:
        return []

    def commit_branch(self, xid: Xid) -> None:
        self.done.append(("commit", xid.gtrid))

    def rollback_branch(self, xid: Xid) -> None:
        self.done.append(("rollback", xid.gtrid))

    def finish_branches(self, ops: Sequence[tuple[str, Xid]]) -> list[ResourceError | None]:
        for step, xid in ops:
            self.done.append((step, xid.gtrid))
        return [None] * len(ops)

    def close(self) -> None:
        pass


def xid(gtrid: str) -> Xid:
    return Xid.from_parts(0x6E736A31, gtrid, "pg")


def ids_of(table: dict[str, str]) -> Callable[[Sequence[str]], dict[str, str]]:
    def lookup(gids: Sequence[str]) -> dict[str, str]:
        return {g: table[Xid.from_string(g).gtrid] for g in gids if Xid.from_string(g).gtrid in table}
    return lookup


def test_commits_before_attach_are_handed_over_and_owned_ones_never() -> None:
    late, sunk = LateCommits(), list[list[str]]()
    inner = FakeManager()
    mgr = LateCommitManager(inner, late, ids_of({"n:a": "101", "n:b": "102", "n:c": "103"}))
    late.own("n:b")                      # a driver queues its own T2's events
    mgr.commit_branch(xid("n:a"))
    assert mgr.finish_branches([("commit", xid("n:b")), ("rollback", xid("n:x"))]) == [None, None]
    late.attach(lambda ids: sunk.append(list(ids)) or len(ids))
    assert sunk == [["101"]]
    late.disown("n:b")
    mgr.finish_branches([("commit", xid("n:c"))])
    assert sunk == [["101"], ["103"]]
    assert inner.done == [("commit", "n:a"), ("commit", "n:b"), ("rollback", "n:x"), ("commit", "n:c")]


def test_ids_unreadable_commit_nothing_and_rollbacks_go_on() -> None:
    def broken(gids: Sequence[str]) -> dict[str, str]:
        raise OSError("database unreachable")

    late, inner = LateCommits(), FakeManager()
    mgr = LateCommitManager(inner, late, broken)
    results = mgr.finish_branches([("commit", xid("n:a")), ("rollback", xid("n:b"))])
    assert isinstance(results[0], BranchUnavailable) and results[1] is None
    assert inner.done == [("rollback", "n:b")], "a commit whose events could not be found waits for the next pass"
    try:
        mgr.commit_branch(xid("n:a"))
    except BranchUnavailable:
        pass
    else:
        raise AssertionError("commit_branch went on without the transaction id")
    assert inner.done == [("rollback", "n:b")]


# --------------------------------------------------------------------- the channel side (router.channel.late)
def test_a_late_event_is_queued_once_per_proxy_and_never_when_the_channel_holds_it() -> None:
    import itertools
    import threading
    from types import SimpleNamespace

    from omniORB import CORBA

    from router.channel.events import Event, Form, encode
    from router.channel.late import _queue
    from router.channel.queue import Record
    from router.channel.store import QueuedRow

    CORBA.ORB_init(["test"], CORBA.ORB_ID)
    body = encode(Event(Form.ANY, CORBA.Any(CORBA.TC_long, 7)))
    got: dict[int, list[int]] = {1: [], 2: []}
    proxies = {pid: SimpleNamespace(enqueue=lambda rec, pid=pid: got[pid].append(rec.db_id)) for pid in got}
    seqs = itertools.count(100)
    released: list[int] = []
    held = Record(5, Event(Form.ANY, CORBA.Any(CORBA.TC_long, 1)), 0, None, None, True, 50)
    records = {5: held}

    def release(rec: Record) -> None:     # as EventChannelImpl.released: the channel forgets it
        released.append(rec.db_id)
        records.pop(rec.seq)

    channel = SimpleNamespace(
        id=3, records=records, _records_lock=threading.Lock(), rt=SimpleNamespace(next_seq=lambda: next(seqs)),
        consumer_admins={0: SimpleNamespace(proxies=proxies)}, released=release,
        _enqueue_one=lambda proxy, rec: (rec.hold(), proxy.enqueue(rec)))

    def row(pid: int, eid: int) -> QueuedRow:
        return QueuedRow(0, pid, eid, 1, int(Form.ANY), body, 0, None, None)

    rows = [row(1, 50), row(1, 51), row(2, 51), row(9, 52)]   # 50 held already; 52's proxy is gone
    assert _queue(channel, rows) == 1, "51 (on both proxies); 50 is held, 52 has no proxy"
    assert got == {1: [51], 2: [51]}
    assert released == [52], "an event no proxy took is released (its rows reaped)"
    assert sorted(r.db_id for r in channel.records.values()) == [50, 51]
    assert _queue(channel, rows[:3]) == 0, "queued once: a second hand-over finds it held"
    assert got == {1: [51], 2: [51]}


def test_a_commit_whose_answer_was_lost_is_still_handed_over() -> None:
    """The connection dropped during COMMIT PREPARED after PostgreSQL committed: the next pass no longer sees the
    branch, so the hand-over must not wait for a success (an id that did not commit finds no rows)."""
    class LostAnswer(FakeManager):
        def commit_branch(self, xid: Xid) -> None:
            super().commit_branch(xid)
            raise BranchUnavailable("server closed the connection unexpectedly", gtrid=xid.gtrid)

        def finish_branches(self, ops: Sequence[tuple[str, Xid]]) -> list[ResourceError | None]:
            super().finish_branches(ops)
            return [BranchUnavailable("connection lost", gtrid=x.gtrid) for _, x in ops]

    late, sunk = LateCommits(), list[list[str]]()
    late.attach(lambda ids: sunk.append(list(ids)) or len(ids))
    mgr = LateCommitManager(LostAnswer(), late, ids_of({"n:a": "101", "n:b": "102"}))
    try:
        mgr.commit_branch(xid("n:a"))
    except BranchUnavailable:
        pass
    else:
        raise AssertionError("the commit's error was swallowed")
    assert sunk == [["101"]]
    results = mgr.finish_branches([("commit", xid("n:b"))])
    assert isinstance(results[0], BranchUnavailable), "the error is still reported (recovery retries)"
    assert sunk == [["101"], ["102"]]


def test_commits_before_the_restore_began_are_not_handed_over_again() -> None:
    """Restore loads every committed queue row and its dispatchers run at once: an event committed before it began
    may be delivered and released before the hand-over; handing its id over would queue it again (a duplicate)."""
    late, sunk = LateCommits(), list[list[str]]()
    mgr = LateCommitManager(FakeManager(), late, ids_of({"n:a": "101", "n:b": "102"}))
    mgr.commit_branch(xid("n:a"))        # the first recovery pass, before restore
    late.restoring()
    mgr.commit_branch(xid("n:b"))        # during the restore: maybe after its snapshot
    late.attach(lambda ids: sunk.append(list(ids)) or len(ids))
    assert sunk == [["102"]]


def test_the_hand_over_reads_only_the_loaded_channels_and_nothing_when_none() -> None:
    from collections.abc import Iterator
    from contextlib import contextmanager
    from types import SimpleNamespace

    from router.channel.late import queue_committed

    calls: list[tuple[str, Any]] = []

    @contextmanager
    def unit_of_work() -> Iterator[Any]:
        yield SimpleNamespace(execute=lambda sql, params: (calls.append((sql, params)),
                                                           SimpleNamespace(fetchall=lambda: []))[1])

    factory = SimpleNamespace(channels={}, rt=SimpleNamespace(db=SimpleNamespace(unit_of_work=unit_of_work)))
    assert queue_committed(factory, ["101"]) == 0
    assert calls == [], "no channel loaded: no scan of nsjms_queue"
    factory.channels = {4: SimpleNamespace(destroyed=False), 5: SimpleNamespace(destroyed=True)}
    assert queue_committed(factory, ["101"]) == 0
    assert len(calls) == 1 and "channel_id = ANY" in calls[0][0] and calls[0][1][0] == [4]


def test_a_fenced_nodes_recovery_hands_its_commits_over_in_one_call(monkeypatch: Any) -> None:
    """recover_fenced finishes the dead node's branches in one finish_branches call, so the hand-over (one scan of
    nsjms_queue under recovery_lock) runs once per pass, not once per branch; BranchNotFound counts as finished."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from router.cluster import decisions
    from xa.errors import BranchNotFound
    from xa.xid import NodeId, branch_xid, new_gtrid

    dead = NodeId("dead")
    g1, g2, g3, g4 = (new_gtrid(dead) for _ in range(4))
    monkeypatch.setattr(decisions.M, "check", lambda conn, node, epoch: None)
    monkeypatch.setattr(decisions, "decisions_of", lambda conn, node: {g1: [], g2: [], g4: []})

    @contextmanager
    def unit_of_work() -> Any:
        yield SimpleNamespace(execute=lambda sql, params: SimpleNamespace(fetchone=lambda: ("fenced",)))

    class Inner(FakeManager):
        def recover(self) -> Sequence[Xid]:
            return [branch_xid(g, "pg") for g in (g1, g2, g3, g4)]

        def finish_branches(self, ops: Sequence[tuple[str, Xid]]) -> list[ResourceError | None]:
            super().finish_branches(ops)
            return [BranchNotFound("gone", gtrid=x.gtrid) if x.gtrid == g4 else None for _, x in ops]

    late, sunk = LateCommits(), list[list[str]]()
    late.attach(lambda ids: sunk.append(sorted(ids)) or len(ids))
    ids = {g1: "101", g2: "102", g4: "104"}
    report = decisions.recover_fenced(SimpleNamespace(unit_of_work=unit_of_work), "dead", "me", 1,
                                      LateCommitManager(Inner(), late, ids_of(ids)), lambda g, p: None, "jms")
    assert sunk == [["101", "102", "104"]], "one hand-over for the pass"
    assert sorted(report.committed) == sorted([g1, g2, g4]) and report.rolled_back == [g3] and not report.errors
