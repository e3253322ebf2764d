"""Recovery of many transactions at once: one batch per manager (commits of logged COMMITs and presumed-abort
rollbacks together), one re-send call for many transactions, and the deferred re-send of a start pass."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from psycopg import Xid

from xa.errors import BranchNotFound, BranchUnavailable, HeuristicKind, HeuristicOutcome, XAError
from xa.records import Commit, Participant, Progress
from xa.recovery import RecoveryManager
from xa.resource import BatchManager
from xa.testing import FakeClock, MemoryLog, MemoryManager
from xa.xid import NodeId, branch_xid, new_gtrid

NODE = NodeId("n1")
GUARD = 60.0
PG = Participant("pg", "postgresql", "pg", False)
STOMP = Participant("stomp", "stomp-send", "broker", True)


class BatchMemoryManager(MemoryManager):
    """A MemoryManager that also finishes many branches in one call (and records each batch)."""

    def __init__(self, key: str, clock: FakeClock) -> None:
        super().__init__(key, clock)
        self.batches: list[list[tuple[str, str]]] = []
        self.errors: dict[str, XAError] = {}  # gtrid -> error returned for its operation

    def finish_branches(self, ops: Sequence[tuple[str, Xid]]) -> list[XAError | None]:
        self.batches.append([(step, xid.gtrid) for step, xid in ops])
        out: list[XAError | None] = []
        for step, xid in ops:
            if xid.gtrid in self.errors:
                out.append(self.errors[xid.gtrid])
                continue
            try:
                self.commit_branch(xid) if step == "commit" else self.rollback_branch(xid)
            except XAError as exc:
                out.append(exc)
            else:
                out.append(None)
        return out


class Resender:
    def __init__(self) -> None:
        self.single: list[str] = []
        self.calls: list[list[str]] = []
        self.fail: dict[str, Exception] = {}
        self.fail_all: Exception | None = None

    def __call__(self, gtrid: str, p: Participant) -> None:
        self.single.append(gtrid)

    def many(self, items: Sequence[tuple[str, Participant]]) -> list[Exception | None]:
        if self.fail_all is not None:
            raise self.fail_all
        self.calls.append([g for g, _ in items])
        return [self.fail.get(g) for g, _ in items]


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.db = BatchMemoryManager("pg", self.clock)
        self.log = MemoryLog(NODE)
        self.resender = Resender()
        self.rm = RecoveryManager(NODE, self.log, [self.db], self.resender, self.clock, in_flight_guard=GUARD)

    def committed(self) -> str:
        gtrid = new_gtrid(NODE)
        self.log.append(Commit(gtrid, (PG, STOMP), None, self.clock.wall()), durable=True)
        self.db.add_prepared(branch_xid(gtrid, "pg"), [f"{gtrid}-row"])
        return gtrid

    def undecided(self) -> str:
        gtrid = new_gtrid(NODE)
        self.db.add_prepared(branch_xid(gtrid, "pg"), [f"{gtrid}-row"])
        return gtrid


@pytest.fixture
def w() -> World:
    return World()


def test_the_memory_twin_is_a_batch_manager(w: World) -> None:
    assert isinstance(w.db, BatchManager)
    assert not isinstance(MemoryManager("x"), BatchManager)


def test_commits_and_presumed_aborts_go_in_one_batch_and_resends_in_one_call(w: World) -> None:
    decided = [w.committed() for _ in range(5)]
    undecided = [w.undecided() for _ in range(4)]
    w.clock.advance(GUARD + 1)
    report = w.rm.run()
    [batch] = w.db.batches
    assert sorted(g for s, g in batch if s == "commit") == sorted(decided)
    assert sorted(g for s, g in batch if s == "rollback") == sorted(undecided)
    assert sorted(report.committed) == sorted(f"{g}/pg" for g in decided)
    assert sorted(report.rolled_back) == sorted(f"{g}/pg" for g in undecided)
    assert [sorted(c) for c in w.resender.calls] == [sorted(decided)] and w.resender.single == []
    assert sorted(report.ended) == sorted(decided) and w.log.live() == {}
    assert w.db.prepared == {}


def test_per_branch_results_of_a_batch(w: World) -> None:
    gone, down, heur, fine = (w.committed() for _ in range(4))
    w.db.errors[gone] = BranchNotFound("gone")
    w.db.errors[down] = BranchUnavailable("connection lost")
    w.db.errors[heur] = HeuristicOutcome("decided alone", kind=HeuristicKind.ROLLBACK)
    report = w.rm.run()
    assert report.committed == [f"{fine}/pg"]
    assert any(down in e and "connection lost" in e for e in report.errors)
    assert heur in report.heuristic
    # gone and fine are done and re-sent; down waits (no re-send before its branch is committed)
    assert sorted(w.resender.calls[0]) == sorted([gone, fine])
    assert sorted(report.ended) == sorted([gone, fine])
    assert set(w.log.live()) == {down, heur}
    del w.db.errors[down]
    again = w.rm.run()
    assert again.committed == [f"{down}/pg"] and down in again.ended


def test_a_failed_resend_fails_only_its_transactions(w: World) -> None:
    a, b = w.committed(), w.committed()
    w.resender.fail[a] = ConnectionError("broker went away")
    report = w.rm.run()
    assert report.resent == [f"{b}/stomp"] and report.ended == [b]
    assert any(a in e and "broker went away" in e for e in report.errors)
    progress = w.log.records[-2] if isinstance(w.log.records[-2], Progress) else w.log.records[-1]
    assert isinstance(progress, Progress) and progress.gtrid == a and progress.done == ("pg",)
    del w.resender.fail[a]
    assert w.rm.run().ended == [a]


def test_a_resend_call_that_raises_fails_every_transaction_of_it(w: World) -> None:
    a, b = w.committed(), w.committed()
    w.resender.fail_all = ConnectionError("no broker")
    report = w.rm.run()
    assert report.ended == [] and len([e for e in report.errors if "no broker" in e]) == 2
    w.resender.fail_all = None
    assert sorted(w.rm.run().ended) == sorted([a, b])


def test_a_pass_without_resend_defers_them_to_the_next_pass(w: World) -> None:
    a, b = w.committed(), w.committed()
    u = w.undecided()
    w.clock.advance(GUARD + 1)
    report = w.rm.run(resend=False)
    assert sorted(report.deferred) == sorted([f"{a}/stomp", f"{b}/stomp"])
    assert report.rolled_back == [f"{u}/pg"] and len(report.committed) == 2
    assert report.ended == [] and w.resender.calls == [] and report.errors == []
    assert set(w.log.live()) == {a, b}, "deferred transactions stay in the log until their re-send"
    assert all(isinstance(r, Progress) for r in w.log.records[-2:])
    report = w.rm.run()
    assert sorted(report.ended) == sorted([a, b]) and report.committed == []
    assert [sorted(c) for c in w.resender.calls] == [sorted([a, b])]
