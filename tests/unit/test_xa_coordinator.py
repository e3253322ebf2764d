"""Every failure permutation of the coordinator, over in-memory twins (no I/O, no sleeping)."""

from __future__ import annotations

from pathlib import Path

import pytest

from xa.coordinator import BranchOutcome, Coordinator, Transaction
from xa.errors import (
    BranchNotFound,
    BranchUnavailable,
    DecisionUnknown,
    DuplicateBranch,
    HeuristicKind,
    HeuristicOutcome,
    IllegalTransition,
    LogDurabilityUnknown,
    LogWriteFailed,
    OutcomeUnknown,
    PrepareFailed,
    TransactionRolledBack,
    TransactionTimeout,
    UsageError,
)
from xa.records import Commit, Heuristic, Progress, Rollback
from xa.states import State
from xa.testing import FakeClock, Injection, MemoryLog, MemoryManager, MemoryResource
from xa.xid import NodeId, parse_gtrid

NODE = NodeId("n1")


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.db = MemoryManager("pg", self.clock)
        self.broker = MemoryManager("broker", self.clock, calls=self.db.calls)
        self.log = MemoryLog(NODE, calls=self.db.calls)
        self.coord = Coordinator(NODE, self.log, self.clock)

    def txn(self, timeout: float | None = None, *, fail: dict[str, dict[str, Injection]] | None = None,
            applies: bool = False) -> tuple[Transaction, list[MemoryResource]]:
        fail = fail or {}
        t = self.coord.begin(timeout)
        # enlisted out of order on purpose: the protocol order comes from the sort keys
        branches = [self.broker.branch("stomp", one_phase=True, fail=fail.get("stomp"), applies=applies),
                    self.db.branch("outbox", fail=fail.get("outbox")),
                    self.db.branch("channel-queue", fail=fail.get("channel-queue"))]
        for b in branches:
            t.enlist(b)
            b.write(f"{b.name}-data")
        return t, branches

    def prepared(self) -> set[str]:
        return {x.bqual or "" for x, _ in self.db.prepared.values()}


@pytest.fixture
def w() -> World:
    return World()


def test_happy_path_order_and_records(w: World) -> None:
    t, _branches = w.txn(timeout=30)
    outcome = t.commit()
    assert outcome.state is State.COMMITTED and t.state is State.COMMITTED
    assert [b.outcome for b in outcome.branches] == [BranchOutcome.COMMITTED] * 3
    steps = [c for c in w.db.calls if not c.startswith(("begin", "write"))]
    assert steps == ["prepare channel-queue", "prepare outbox", "prepare stomp", "log Commit durable",
                     "commit channel-queue", "commit outbox", "commit stomp", "log End"]
    assert sorted(w.db.committed) == ["channel-queue-data", "outbox-data"]
    assert w.broker.committed == ["stomp-data"]
    record = w.log.records[0]
    assert isinstance(record, Commit) and record.gtrid == t.gtrid
    assert [(p.name, p.one_phase) for p in record.participants] == [
        ("channel-queue", False), ("outbox", False), ("stomp", True)]
    assert record.deadline == pytest.approx(w.clock.wall() + 30)
    assert w.coord.in_flight() == frozenset()
    parsed = parse_gtrid(t.gtrid)
    assert parsed is not None and parsed.node == "n1"


def test_branch_xids_are_per_participant(w: World) -> None:
    t, branches = w.txn()
    xids = {b.name: b.xid for b in branches}
    assert {x.gtrid for x in xids.values() if x} == {t.gtrid}
    assert {n: x.bqual for n, x in xids.items() if x} == {n: n for n in xids}


@pytest.mark.parametrize("failing", ["channel-queue", "outbox", "stomp"])
def test_prepare_fails_for_participant_i(w: World, failing: str) -> None:
    boom = PrepareFailed("vote no", branch=failing)
    t, branches = w.txn(fail={failing: {"prepare": boom}})
    with pytest.raises(PrepareFailed) as info:
        t.commit()
    assert info.value is boom  # the ORIGINAL error
    assert boom.gtrid == t.gtrid  # filled in by the coordinator when the participant did not know it
    assert t.state is State.ROLLED_BACK
    assert all(b.steps[-1] == "rollback" for b in branches)
    assert w.prepared() == set() and w.db.committed == [] and w.broker.committed == []
    assert "Commit" not in w.log.kinds()
    assert w.coord.in_flight() == frozenset()


def test_prepare_fails_and_a_rollback_fails_too(w: World) -> None:
    boom = PrepareFailed("vote no")
    t, _ = w.txn(fail={"stomp": {"prepare": boom}, "outbox": {"rollback": BranchUnavailable("gone")}})
    with pytest.raises(PrepareFailed) as info:
        t.commit()
    assert info.value is boom
    assert any("rollback of branch outbox also failed" in n for n in info.value.__notes__)
    assert w.prepared() == {"outbox"}  # left for recovery
    rollback = w.log.records[-1]
    assert isinstance(rollback, Rollback) and rollback.gtrid == t.gtrid and "stomp failed to prepare" in rollback.reason
    assert t.state is State.ROLLED_BACK


def test_unexpected_exception_in_prepare_is_reraised(w: World) -> None:
    t, _ = w.txn(fail={"outbox": {"prepare": RuntimeError("bug")}})
    with pytest.raises(RuntimeError, match="bug"):
        t.commit()
    assert w.prepared() == set()


def test_decision_write_fails_cleanly(w: World) -> None:
    w.log.fail["Commit"] = LogWriteFailed("disk full")
    t, branches = w.txn()
    with pytest.raises(LogWriteFailed):
        t.commit()
    assert t.state is State.ROLLED_BACK
    assert w.prepared() == set() and all(b.steps[-1] == "rollback" for b in branches)


def test_decision_write_outcome_unknown_leaves_branches_prepared(w: World) -> None:
    w.log.fail_after_write("Commit", LogDurabilityUnknown("fsync failed"))
    t, branches = w.txn()
    with pytest.raises(DecisionUnknown) as info:
        t.commit()
    assert info.value.gtrid == t.gtrid
    assert t.state is State.IN_DOUBT
    assert w.prepared() == {"channel-queue", "outbox"}
    assert all(b.steps[-1] == "prepare" for b in branches)  # neither committed nor rolled back
    assert w.coord.in_flight() == frozenset()  # recovery's business now


def test_commit_fails_after_the_decision(w: World) -> None:
    t, _ = w.txn(fail={"outbox": {"commit": BranchUnavailable("connection lost")}})
    outcome = t.commit()
    assert outcome.state is State.COMMIT_PENDING
    by = {b.name: b.outcome for b in outcome.branches}
    assert by == {"channel-queue": BranchOutcome.COMMITTED, "outbox": BranchOutcome.UNKNOWN,
                  "stomp": BranchOutcome.COMMITTED}
    progress = w.log.records[-1]
    assert isinstance(progress, Progress)
    assert progress.done == ("channel-queue", "stomp") and progress.unknown == ("outbox",)
    assert w.prepared() == {"outbox"}
    assert outcome.resend == ()


def test_a_phase_two_that_raises_hands_the_transaction_to_recovery(w: World) -> None:
    """complete() raising past its contract (here a log that fails with a non-LogError at END) leaves the
    transaction COMMIT_PENDING and out of in_flight(): recovery finishes it from its COMMIT record now (before: it
    stayed COMMITTING in the coordinator, so recovery kept away from it until a restart)."""
    t, _ = w.txn()
    t.decide()
    w.log.fail["End"] = RuntimeError("the log broke (injected)")
    with pytest.raises(RuntimeError, match="injected"):
        t.complete()
    assert t.state is State.COMMIT_PENDING
    assert t.gtrid not in w.coord.in_flight()
    assert t.gtrid in w.log.live()                      # COMMIT record, no END: recovery's to finish


@pytest.mark.parametrize("applies", [True, False], ids=["receipt-lost", "commit-lost"])
def test_one_phase_outcome_unknown(w: World, applies: bool) -> None:
    t, _ = w.txn(fail={"stomp": {"commit": OutcomeUnknown("no receipt", branch="stomp")}}, applies=applies)
    outcome = t.commit()
    assert outcome.state is State.COMMIT_PENDING
    assert outcome.resend == ("stomp",)
    assert sorted(w.db.committed) == ["channel-queue-data", "outbox-data"]
    assert w.broker.committed == (["stomp-data"] if applies else [])
    progress = w.log.records[-1]
    assert isinstance(progress, Progress) and progress.unknown == ("stomp",)
    assert "End" not in w.log.kinds()  # stays in the log for recovery's re-send


def test_any_one_phase_commit_failure_is_unknown_never_aborted(w: World) -> None:
    t, _ = w.txn(fail={"stomp": {"commit": ConnectionResetError("peer reset")}})
    outcome = t.commit()
    assert outcome.state is State.COMMIT_PENDING and outcome.resend == ("stomp",)


def test_branch_already_gone_at_commit_counts_as_done(w: World) -> None:
    t, _ = w.txn(fail={"outbox": {"commit": BranchNotFound("gone")}})
    assert t.commit().state is State.COMMITTED


def test_heuristic_rollback_at_commit_is_recorded(w: World) -> None:
    bad = HeuristicOutcome("operator rolled it back", branch="outbox", kind=HeuristicKind.ROLLBACK)
    t, _ = w.txn(fail={"outbox": {"commit": bad}})
    outcome = t.commit()
    assert outcome.state is State.HEURISTIC_MIXED  # the other branches committed
    assert w.log.kinds() == ["Commit", "Heuristic", "Progress"]  # the heuristic is durable first
    heuristic = w.log.records[1]
    assert isinstance(heuristic, Heuristic) and heuristic.branch == "outbox"
    assert heuristic.kind is HeuristicKind.ROLLBACK and heuristic.who == "participant:outbox"
    assert w.log.durable[1] is True


def test_heuristic_rollback_of_the_only_branch(w: World) -> None:
    t = w.coord.begin()
    t.enlist(w.db.branch("q", fail={"commit": HeuristicOutcome("x", kind=HeuristicKind.ROLLBACK)}))
    assert t.commit().state is State.HEURISTIC_ROLLBACK


def test_heuristic_commit_during_rollback(w: World) -> None:
    t = w.coord.begin()
    t.enlist(w.db.branch("q", fail={"rollback": HeuristicOutcome("x", kind=HeuristicKind.COMMIT)}))
    assert t.rollback().state is State.HEURISTIC_COMMIT


# ------------------------------------------------------------------------------------------ timeout
def test_timeout_before_commit(w: World) -> None:
    t, branches = w.txn(timeout=5)
    w.clock.advance(5)
    with pytest.raises(TransactionTimeout) as info:
        t.commit()
    assert info.value.gtrid == t.gtrid
    assert t.state is State.ROLLED_BACK and t.timed_out
    assert all(b.steps == ["begin", "rollback"] for b in branches)
    assert "Commit" not in w.log.kinds()


def test_timeout_during_phase_one(w: World) -> None:
    t, branches = w.txn(timeout=5, fail={"channel-queue": {"prepare": lambda: w.clock.advance(6)}})
    with pytest.raises(TransactionTimeout):
        t.commit()
    assert [b.steps for b in branches if b.name == "outbox"] == [["begin", "rollback"]]
    assert w.prepared() == set() and "Commit" not in w.log.kinds()


def test_no_commit_logged_past_the_deadline(w: World) -> None:
    """The deadline passes while the LAST participant prepares: the decision is not written."""
    t, _ = w.txn(timeout=5, fail={"stomp": {"prepare": lambda: w.clock.advance(5)}})
    with pytest.raises(TransactionTimeout):
        t.commit()
    assert "Commit" not in w.log.kinds() and w.prepared() == set()


def test_deadline_no_longer_applies_after_the_decision(w: World) -> None:
    t, _ = w.txn(timeout=5, fail={"channel-queue": {"commit": lambda: w.clock.advance(60)}})
    assert t.commit().state is State.COMMITTED and not t.timed_out


def test_zero_timeout_means_no_deadline(w: World) -> None:
    t, _ = w.txn(timeout=0)
    w.clock.advance(10**6)
    assert t.deadline is None and t.commit().state is State.COMMITTED


def test_expire_marks_overdue_transactions(w: World) -> None:
    t, branches = w.txn(timeout=5)
    late = w.coord.begin(100)
    assert w.coord.expire() == []
    w.clock.advance(6)
    assert w.coord.expire() == [t.gtrid]
    assert t.state is State.ROLLBACK_ONLY and late.state is State.ACTIVE
    assert all(b.steps == ["begin"] for b in branches)  # no I/O from the expiring thread
    with pytest.raises(TransactionTimeout):
        t.commit()
    assert all(b.steps == ["begin", "rollback"] for b in branches)


def test_enlist_after_the_deadline(w: World) -> None:
    t, branches = w.txn(timeout=5)
    w.clock.advance(5)
    with pytest.raises(TransactionTimeout):
        t.enlist(w.db.branch("late"))
    assert all(b.steps[-1] == "rollback" for b in branches)


# ------------------------------------------------------------------------------------ rollback-only
def test_rollback_only(w: World) -> None:
    t, branches = w.txn()
    t.set_rollback_only("the bridge could not map event 3")
    t.set_rollback_only("second reason is ignored")
    with pytest.raises(TransactionRolledBack) as info:
        t.commit()
    assert info.value.reason == "the bridge could not map event 3"
    assert not isinstance(info.value, TransactionTimeout)
    assert all(b.steps == ["begin", "rollback"] for b in branches)
    assert w.log.records == []


def test_rollback_only_set_while_preparing(w: World) -> None:
    t: list[Transaction] = []
    tx, _branches = w.txn(fail={"outbox": {"prepare": lambda: t[0].set_rollback_only("late veto")}})
    t.append(tx)
    with pytest.raises(TransactionRolledBack, match="late veto"):
        tx.commit()
    assert w.prepared() == set() and "Commit" not in w.log.kinds()


def test_rollback_only_with_an_empty_reason_set_while_preparing(w: World) -> None:
    """t_empty_reason.py: the mark is a flag; an empty reason must not make it ignored."""
    t: list[Transaction] = []
    tx, _branches = w.txn(fail={"outbox": {"prepare": lambda: t[0].set_rollback_only("")}})
    t.append(tx)
    with pytest.raises(TransactionRolledBack):
        tx.commit()
    assert w.prepared() == set() and "Commit" not in w.log.kinds()
    assert w.db.committed == [] and w.broker.committed == [] and tx.rollback_reason


def test_heuristic_during_rollback_is_durable_before_progress(w: World) -> None:
    """t_orphan.py: a crash (or failure) after the PROGRESS and before the HEURISTIC must not leave a
    PROGRESS-only entry: the HEURISTIC comes first, and if it cannot be written the PROGRESS still explains
    nothing that recovery cannot handle (no decision: presumed abort)."""
    t = w.coord.begin()
    t.enlist(w.db.branch("a", fail={"rollback": HeuristicOutcome("committed on its own", kind=HeuristicKind.COMMIT)}))
    t.enlist(w.db.branch("b", fail={"rollback": BranchUnavailable("connection lost")}))
    t.enlist(w.db.branch("c", fail={"prepare": PrepareFailed("no")}))
    with pytest.raises(PrepareFailed):
        t.commit()
    assert w.log.kinds() == ["Heuristic", "Progress"]
    assert w.log.durable == [True, False]


def test_rollback_only_too_late_after_the_decision(w: World) -> None:
    t, _ = w.txn()
    t.commit()
    with pytest.raises(IllegalTransition):
        t.set_rollback_only("too late")


def test_explicit_rollback_then_commit_is_misuse(w: World) -> None:
    t, _branches = w.txn()
    outcome = t.rollback()
    assert outcome.state is State.ROLLED_BACK
    assert all(b.outcome is BranchOutcome.ROLLED_BACK for b in outcome.branches)
    with pytest.raises(IllegalTransition):
        t.commit()
    with pytest.raises(IllegalTransition):
        t.enlist(w.db.branch("x"))


# ------------------------------------------------------------------------------------------- misuse
def test_duplicate_branch(w: World) -> None:
    t = w.coord.begin()
    t.enlist(w.db.branch("q"))
    with pytest.raises(DuplicateBranch):
        t.enlist(w.db.branch("q"))


def test_begin_failure_makes_the_transaction_rollback_only(w: World) -> None:
    t = w.coord.begin()
    ok = w.db.branch("a")
    t.enlist(ok)
    with pytest.raises(BranchUnavailable) as info:
        t.enlist(w.db.branch("b", fail={"begin": BranchUnavailable("down")}))
    assert info.value.gtrid == t.gtrid
    assert t.state is State.ROLLBACK_ONLY
    with pytest.raises(TransactionRolledBack, match="could not begin"):
        t.commit()
    assert ok.steps == ["begin", "rollback"]


def test_log_of_another_node() -> None:
    with pytest.raises(UsageError):
        Coordinator(NODE, MemoryLog(NodeId("n2")), FakeClock())


def test_negative_timeout() -> None:
    with pytest.raises(UsageError):
        Coordinator(NODE, MemoryLog(NODE), FakeClock()).begin(-1)


def test_end_write_failure_does_not_undo_the_commit(w: World) -> None:
    w.log.fail["End"] = LogWriteFailed("disk full")
    t, _ = w.txn()
    assert t.commit().state is State.COMMITTED


def test_in_flight_tracks_undecided_transactions(w: World) -> None:
    t, _ = w.txn()
    assert w.coord.in_flight() == {t.gtrid}
    t.commit()
    assert w.coord.in_flight() == frozenset()


def test_twin_fails_loudly_on_protocol_misuse(w: World) -> None:
    b = w.db.branch("q")
    with pytest.raises(UsageError):
        b.commit()
    with pytest.raises(UsageError):
        b.write("x")


def test_with_the_file_log_the_decision_is_synced_before_phase_two(tmp_path: Path) -> None:
    from xa.log import FileLog, FileOps

    clock = FakeClock()
    db = MemoryManager("pg", clock)

    class Ops(FileOps):
        def sync(self, fd: int) -> None:
            db.calls.append("fdatasync")
            super().sync(fd)

    log = FileLog(tmp_path, NODE, ops=Ops())
    try:
        t = Coordinator(NODE, log, clock).begin(30)
        t.enlist(db.branch("a"))
        t.enlist(db.branch("b"))
        db.calls.clear()
        assert t.commit().state is State.COMMITTED
        assert db.calls == ["prepare a", "prepare b", "fdatasync", "commit a", "commit b"]
        assert log.live() == {}
    finally:
        log.close()


# ------------------------------------------------------------------------------- decide / complete (pipelining)
def test_decide_then_complete_from_another_thread(w: World) -> None:
    """decide() ends with the decision durable and nothing committed; complete() (here from another thread, as
    the channel's pipelined T2 delivery does) runs phase two exactly as commit() would."""
    import threading

    t, _branches = w.txn(timeout=30)
    t.decide()
    assert t.state is State.COMMITTING
    assert w.db.committed == [] and w.broker.committed == []
    assert t.gtrid in w.coord.in_flight(), "recovery leaves a decided, uncompleted transaction alone"
    assert [c for c in w.db.calls if not c.startswith(("begin", "write"))][-1] == "log Commit durable"
    w.clock.advance(100)                              # the deadline no longer applies after the decision
    outcomes = []
    worker = threading.Thread(target=lambda: outcomes.append(t.complete()))
    worker.start()
    worker.join()
    assert outcomes[0].state is State.COMMITTED
    steps = [c for c in w.db.calls if not c.startswith(("begin", "write"))]
    assert steps == ["prepare channel-queue", "prepare outbox", "prepare stomp", "log Commit durable",
                     "commit channel-queue", "commit outbox", "commit stomp", "log End"]
    assert w.coord.in_flight() == frozenset()


def test_complete_needs_a_decided_transaction(w: World) -> None:
    t, _branches = w.txn()
    with pytest.raises(IllegalTransition):
        t.complete()                                  # not decided: nothing is committed
    assert w.db.committed == [] and t.state is State.ACTIVE
    t.decide()
    t.complete()
    with pytest.raises(IllegalTransition):
        t.complete()                                  # twice: refused, phase two ran once
    assert sorted(w.db.committed) == ["channel-queue-data", "outbox-data"]


def test_decide_failure_rolls_back_like_commit(w: World) -> None:
    t, _branches = w.txn(fail={"outbox": {"prepare": PrepareFailed("no")}})
    with pytest.raises(PrepareFailed):
        t.decide()
    assert t.state is State.ROLLED_BACK and w.prepared() == set()
    with pytest.raises(IllegalTransition):
        t.complete()
