"""Recovery over in-memory twins: finish commits, re-send unknown broker branches, presumed abort, foreign xids,
heuristics, the operator view."""

from __future__ import annotations

import pytest
from psycopg import Xid

from xa.coordinator import Coordinator
from xa.errors import (
    BranchUnavailable,
    DecisionUnknown,
    HeuristicKind,
    HeuristicOutcome,
    LogDurabilityUnknown,
    LogWriteFailed,
    OutcomeUnknown,
    PrepareFailed,
    UsageError,
)
from xa.records import Commit, End, Heuristic, Participant, Progress, Rollback
from xa.recovery import RecoveryManager, SafeAction
from xa.states import State
from xa.testing import FakeClock, MemoryLog, MemoryManager
from xa.xid import FORMAT_ID, NodeId, branch_xid, new_gtrid

NODE = NodeId("n1")
GUARD = 60.0
QUEUE = Participant("channel-queue", "postgresql", "pg", False)
OUTBOX = Participant("outbox", "postgresql", "pg", False)
STOMP = Participant("stomp", "stomp-send", "broker", True)


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.db = MemoryManager("pg", self.clock)
        self.log = MemoryLog(NODE)
        self.resent: list[tuple[str, str]] = []
        self.resend_error: Exception | None = None
        self.busy: frozenset[str] = frozenset()
        self.rm = self.recovery(self.log)

    def recovery(self, log: MemoryLog) -> RecoveryManager:
        return RecoveryManager(NODE, log, [self.db], self._resend, self.clock, in_flight_guard=GUARD,
                               in_flight=lambda: self.busy)

    def _resend(self, gtrid: str, p: Participant) -> None:
        if self.resend_error is not None:
            raise self.resend_error
        self.resent.append((gtrid, p.name))

    def crashed_commit(self, *prepared: str) -> str:
        """A COMMIT record whose phase two never ran for the ``prepared`` branches."""
        gtrid = new_gtrid(NODE)
        self.log.append(Commit(gtrid, (QUEUE, OUTBOX, STOMP), None, self.clock.wall()), durable=True)
        for name in prepared:
            self.db.add_prepared(branch_xid(gtrid, name), [f"{name}-row"])
        return gtrid

    def undecided(self, node: NodeId = NODE) -> str:
        gtrid = new_gtrid(node)
        for name in ("channel-queue", "outbox"):
            self.db.add_prepared(branch_xid(gtrid, name), [f"{name}-row"])
        return gtrid


@pytest.fixture
def w() -> World:
    return World()


def test_finishes_a_logged_commit(w: World) -> None:
    gtrid = w.crashed_commit("channel-queue", "outbox")
    report = w.rm.run()
    assert sorted(report.committed) == [f"{gtrid}/channel-queue", f"{gtrid}/outbox"]
    assert sorted(w.db.committed) == ["channel-queue-row", "outbox-row"]
    assert w.resent == [(gtrid, "stomp")]
    assert report.ended == [gtrid] and w.log.live() == {}
    assert w.rm.run().ended == [] and w.resent == [(gtrid, "stomp")]  # idempotent


def test_resend_only_after_every_two_phase_branch_is_committed(w: World) -> None:
    calls: list[str] = w.db.calls
    w.crashed_commit("channel-queue", "outbox")
    orig = w._resend

    def resend(g: str, p: Participant) -> None:
        calls.append("resend")
        orig(g, p)

    w.rm.resend = resend
    w.rm.run()
    assert calls.index("resend") > max(i for i, c in enumerate(calls) if c.startswith("commit_branch"))


def test_branch_already_gone_counts_as_done(w: World) -> None:
    gtrid = w.crashed_commit("outbox")  # channel-queue committed before the crash
    report = w.rm.run()
    assert report.committed == [f"{gtrid}/outbox"] and report.ended == [gtrid]


def test_unreachable_manager_concludes_nothing(w: World) -> None:
    gtrid = w.crashed_commit("channel-queue", "outbox")
    w.db.fail["recover"] = BranchUnavailable("connection refused")
    report = w.rm.run()
    assert report.committed == [] and report.ended == [] and w.resent == []
    assert any("connection refused" in e for e in report.errors)
    assert gtrid in w.log.live()
    [entry] = w.rm.view()
    assert entry.action is SafeAction.RETRY
    del w.db.fail["recover"]
    assert w.rm.run().ended == [gtrid]


def test_failed_resend_is_retried_without_recommitting(w: World) -> None:
    gtrid = w.crashed_commit("channel-queue", "outbox")
    w.resend_error = ConnectionError("broker down")
    report = w.rm.run()
    assert len(report.committed) == 2 and report.ended == [] and report.errors
    progress = w.log.records[-1]
    assert isinstance(progress, Progress) and set(progress.done) == {"channel-queue", "outbox"}
    [entry] = w.rm.view()
    assert entry.action is SafeAction.RESEND and entry.pending == ("stomp",)
    w.resend_error = None
    calls_before = len(w.db.calls)
    assert w.rm.run().ended == [gtrid]
    assert not [c for c in w.db.calls[calls_before:] if c.startswith("commit_branch")]
    assert w.resent == [(gtrid, "stomp")]


def test_broker_known_done_is_not_resent(w: World) -> None:
    gtrid = w.crashed_commit("outbox")
    w.log.append(Progress(gtrid, ("channel-queue", "stomp"), ("outbox",), 1.0), durable=False)
    assert w.rm.run().ended == [gtrid]
    assert w.resent == []


def test_presumed_abort_respects_the_in_flight_guard(w: World) -> None:
    old = w.undecided()
    w.clock.advance(GUARD + 1)
    young = w.undecided()
    busy = w.undecided()
    w.busy = frozenset({busy})
    w.clock.advance(GUARD - 1)  # 'young' is GUARD-1 s old; 'busy' too, but it is in flight anyway
    report = w.rm.run()
    assert sorted(report.rolled_back) == [f"{old}/channel-queue", f"{old}/outbox"]
    assert {x.gtrid for x, _ in w.db.prepared.values()} == {young, busy}
    assert w.db.committed == []
    view = {d.gtrid: d for d in w.rm.view()}
    assert view[young].action is SafeAction.WAIT and view[busy].action is SafeAction.WAIT
    w.clock.advance(2)
    assert sorted(r.split("/")[0] for r in w.rm.run().rolled_back) == [young, young]


def test_foreign_xids_are_never_touched(w: World) -> None:
    other_node = w.undecided(NodeId("n2"))
    other_format = Xid.from_parts(4660, new_gtrid(NODE), "outbox")
    w.db.add_prepared(other_format)
    w.db.add_prepared(Xid.from_string("application-gid-42"))
    w.db.add_prepared(Xid.from_parts(FORMAT_ID, "not-ours", "x"))
    w.clock.advance(GUARD * 100)
    before = dict(w.db.prepared)
    report = w.rm.run()
    assert report.foreign == 5 and report.rolled_back == [] and report.committed == []
    assert w.db.prepared == before and other_node
    assert w.rm.view() == []


def test_logged_rollback_is_finished_without_waiting_for_the_guard(w: World) -> None:
    gtrid = new_gtrid(NODE)
    w.db.add_prepared(branch_xid(gtrid, "outbox"))
    w.log.append(Rollback(gtrid, (QUEUE, OUTBOX, STOMP), "prepare of stomp failed", 1.0), durable=False)
    [entry] = w.rm.view()
    assert entry.action is SafeAction.ROLLBACK and "prepare of stomp failed" in entry.reason
    report = w.rm.run()
    assert report.rolled_back == [f"{gtrid}/outbox"] and report.ended == [gtrid]


def test_heuristic_outcomes_stay_until_forgotten(w: World) -> None:
    gtrid = w.crashed_commit("outbox")
    w.log.append(Heuristic(gtrid, HeuristicKind.MIXED, "outbox", "operator:alice", "manual fix", 1.0),
                 durable=True)
    report = w.rm.run()
    assert report.heuristic == [gtrid] and report.committed == [] and report.ended == []
    assert w.resent == [(gtrid, "stomp")]  # the branches the heuristic did not settle are still finished
    with pytest.raises(UsageError, match="still prepared"):
        w.rm.forget(gtrid, "operator:bob")  # the heuristic branch itself is still prepared
    w.db.prepared.clear()  # the operator decides it by hand
    assert w.rm.run().ended == []  # stays until forgotten
    [entry] = w.rm.view()
    assert entry.action is SafeAction.FORGET and "operator:alice" in entry.reason
    w.rm.forget(gtrid, "operator:bob")
    end = w.log.records[-1]
    assert isinstance(end, End) and end.who == "operator:bob"
    assert gtrid not in w.log.live()


def test_forget_refuses_a_transaction_without_heuristics(w: World) -> None:
    gtrid = w.crashed_commit("outbox")
    with pytest.raises(UsageError):
        w.rm.forget(gtrid, "operator")


def test_heuristic_from_a_branch_is_recorded(w: World) -> None:
    gtrid = w.crashed_commit("outbox")
    w.db.fail["commit_branch"] = HeuristicOutcome("rolled back by hand", kind=HeuristicKind.ROLLBACK)
    report = w.rm.run()
    assert report.heuristic == [gtrid] and w.resent == []
    [(heuristic, durable)] = [(r, d) for r, d in zip(w.log.records, w.log.durable, strict=True)
                              if isinstance(r, Heuristic)]
    assert heuristic.kind is HeuristicKind.ROLLBACK and heuristic.branch == "outbox" and durable
    [entry] = w.rm.view()  # the broker branch of the logged COMMIT is still to be finished
    assert entry.action is SafeAction.RESEND and entry.pending == ("outbox", "stomp")
    assert entry.status == "heuristic-rollback"
    w.rm.run()
    assert w.resent == [(gtrid, "stomp")]


def test_view_commit_logged_with_prepared_branches(w: World) -> None:
    gtrid = w.crashed_commit("outbox")
    [entry] = w.rm.view()
    assert (entry.gtrid, entry.status, entry.action) == (gtrid, "commit-logged", SafeAction.COMMIT)
    assert "outbox" in entry.reason


def test_in_flight_logged_transaction_is_left_alone(w: World) -> None:
    gtrid = w.crashed_commit("outbox")
    w.busy = frozenset({gtrid})
    report = w.rm.run()
    assert report.waiting == [gtrid] and report.committed == [] and w.resent == []


def test_poisoned_log_stops_recovery(w: World) -> None:
    w.log.failed = True
    with pytest.raises(LogDurabilityUnknown):
        w.rm.run()


def test_log_of_another_node() -> None:
    with pytest.raises(UsageError):
        RecoveryManager(NODE, MemoryLog(NodeId("n2")), [], lambda g, p: None, FakeClock())


# ------------------------------------------------------------------------ with the coordinator
def test_commit_pending_then_recovery(w: World) -> None:
    coord = Coordinator(NODE, w.log, w.clock)
    broker = MemoryManager("broker", w.clock)
    t = coord.begin(30)
    for b in (w.db.branch("outbox"), broker.branch("stomp", one_phase=True,
                                                   fail={"commit": OutcomeUnknown("no receipt")})):
        t.enlist(b)
    assert t.commit().state is State.COMMIT_PENDING
    w.busy = coord.in_flight()
    report = w.rm.run()
    assert w.resent == [(t.gtrid, "stomp")] and report.ended == [t.gtrid]
    assert report.committed == []  # the outbox branch was committed by the coordinator


@pytest.mark.parametrize("on_disk", [True, False], ids=["record-on-disk", "record-lost"])
def test_decision_unknown_is_resolved_from_what_the_disk_holds(w: World, on_disk: bool) -> None:
    coord = Coordinator(NODE, w.log, w.clock)
    t = coord.begin(30)
    for name in ("channel-queue", "outbox"):
        t.enlist(w.db.branch(name))
    w.log.fail_after_write("Commit", LogDurabilityUnknown("fsync failed"))
    with pytest.raises(DecisionUnknown):
        t.commit()
    restarted = w.log.reopened(keep_unsynced=on_disk)  # the node restarts and reads its log back
    rm = w.recovery(restarted)
    w.clock.advance(GUARD + 1)
    report = rm.run()
    if on_disk:
        assert len(report.committed) == 2 and report.ended == [t.gtrid]
    else:
        assert len(report.rolled_back) == 2 and report.committed == []
    assert w.db.prepared == {}


def test_a_decision_logged_during_the_scan_prevents_presumed_abort(w: World) -> None:
    """A transaction that logs COMMIT while recovery scans is not rolled back (re-check after the scan)."""
    gtrid = w.undecided()
    w.clock.advance(GUARD + 1)
    real_recover = w.db.recover

    def recover_then_decide() -> list[Xid]:
        found = list(real_recover())
        w.log.append(Commit(gtrid, (QUEUE, OUTBOX), None, w.clock.wall()), durable=True)
        return found

    w.db.recover = recover_then_decide  # type: ignore[method-assign]
    report = w.rm.run()
    assert report.rolled_back == [] and len(w.db.prepared) == 2
    assert sorted(report.waiting) == [f"{gtrid}/channel-queue", f"{gtrid}/outbox"]


def test_a_transaction_that_started_during_the_scan_is_not_aborted(w: World) -> None:
    gtrid = w.undecided()
    w.clock.advance(GUARD + 1)
    real_recover = w.db.recover

    def recover_then_busy() -> list[Xid]:
        found = list(real_recover())
        w.busy = frozenset({gtrid})
        return found

    w.db.recover = recover_then_busy  # type: ignore[method-assign]
    assert w.rm.run().rolled_back == [] and len(w.db.prepared) == 2


# ---------------------------------------------------------------------------------- operator decisions
def test_operator_rollback_of_an_undecided_transaction_is_ordinary(w: World) -> None:
    gtrid = w.undecided()  # young: run() would wait, the operator need not
    report = w.rm.resolve(gtrid, SafeAction.ROLLBACK, "operator:alice", "stuck after a node swap")
    assert len(report.rolled_back) == 2 and report.heuristic == []
    assert w.db.prepared == {} and w.log.records == []


def test_operator_commit_without_a_decision_is_a_heuristic(w: World) -> None:
    gtrid = w.undecided()
    with pytest.raises(UsageError, match="heuristic decision"):
        w.rm.resolve(gtrid, SafeAction.COMMIT, "operator:alice", "needed")
    assert w.log.records == [] and len(w.db.prepared) == 2, "refused without heuristic=True: nothing done"
    report = w.rm.resolve(gtrid, SafeAction.COMMIT, "operator:alice", "the data is needed", heuristic=True,
                          one_phase=(STOMP,))
    assert len(report.committed) == 2 and report.heuristic == [gtrid]
    decision, heuristic = w.log.records[:2]
    assert isinstance(decision, Commit) and [p.name for p in decision.participants] == [
        "channel-queue", "outbox", "stomp"]
    assert isinstance(heuristic, Heuristic) and heuristic.kind is HeuristicKind.COMMIT
    assert (heuristic.who, heuristic.why) == ("operator:alice", "the data is needed")
    assert w.log.durable[1] and w.db.calls.index("commit_branch channel-queue") > 0
    assert w.resent == [(gtrid, "stomp")], "the outbox rows are re-sent once the branches are committed"
    [entry] = w.rm.view()
    assert entry.action is SafeAction.FORGET
    w.rm.forget(gtrid, "operator:alice")
    assert w.rm.view() == []


def test_operator_commit_whose_resend_fails_is_resent_by_recovery_and_not_forgotten_before(w: World) -> None:
    gtrid = w.undecided()
    w.resend_error = OSError("broker down")
    report = w.rm.resolve(gtrid, SafeAction.COMMIT, "ops", "needed", heuristic=True, one_phase=(STOMP,))
    assert len(report.committed) == 2 and report.errors and w.resent == []
    [entry] = w.rm.view()
    assert (entry.status, entry.action) == ("heuristic-commit", SafeAction.RESEND)
    with pytest.raises(UsageError, match="not finished"):
        w.rm.forget(gtrid, "ops")
    w.resend_error = None
    again = w.rm.resolve(gtrid, SafeAction.COMMIT, "ops", "again")   # finishes it as recovery would
    assert w.resent == [(gtrid, "stomp")] and again.committed == [] and again.heuristic == [gtrid]
    assert [r.branch for r in w.log.records if isinstance(r, Heuristic)] == ["(operator decision)"]
    report = w.rm.run()
    assert w.resent == [(gtrid, "stomp")] and report.committed == [] and report.heuristic == [gtrid]
    [entry] = w.rm.view()
    assert entry.action is SafeAction.FORGET


def test_operator_rollback_of_a_logged_commit_is_a_heuristic_logged_first(w: World) -> None:
    gtrid = w.crashed_commit("outbox")  # channel-queue already committed: the outcome is mixed
    order: list[str] = []
    w.log.calls = order
    w.db.calls = order
    w.rm.resolve(gtrid, SafeAction.ROLLBACK, "operator:bob", "broker lost the messages")
    assert order.index("log Heuristic durable") < order.index("rollback_branch outbox")
    kinds = [r.kind for r in w.log.records if isinstance(r, Heuristic)]
    assert kinds == [HeuristicKind.MIXED]  # channel-queue is gone: it may have committed
    assert w.db.prepared == {} and w.db.committed == []


def test_operator_commit_of_a_logged_commit_is_ordinary(w: World) -> None:
    gtrid = w.crashed_commit("channel-queue", "outbox")
    report = w.rm.resolve(gtrid, SafeAction.COMMIT, "operator", "finish it now")
    assert report.ended == [gtrid] and report.heuristic == [] and w.resent == [(gtrid, "stomp")]


def test_operator_misuse(w: World) -> None:
    with pytest.raises(UsageError):
        w.rm.resolve(new_gtrid(NODE), SafeAction.ROLLBACK, "op", "why")  # nothing to resolve
    gtrid = w.undecided()
    with pytest.raises(UsageError):
        w.rm.resolve(gtrid, SafeAction.RESEND, "op", "why")
    with pytest.raises(UsageError):
        w.rm.resolve(gtrid, SafeAction.COMMIT, "op", " ")
    w.busy = frozenset({gtrid})
    with pytest.raises(UsageError):
        w.rm.resolve(gtrid, SafeAction.COMMIT, "op", "why")


def test_render_lists_every_entry() -> None:
    from xa.recovery import InDoubt, render

    text = render([InDoubt("n1:" + "a" * 24, "undecided", ("outbox",), 75.4, SafeAction.ROLLBACK,
                           "no COMMIT logged: presumed abort")])
    head, row = text.splitlines()
    assert head.split()[:5] == ["GTRID", "STATUS", "AGE", "PENDING", "ACTION"]
    assert row.split()[:5] == ["n1:" + "a" * 24, "undecided", "75s", "outbox", "rollback"]
    assert row.endswith("no COMMIT logged: presumed abort")


def test_operator_rollback_of_a_logged_commit_before_any_branch_committed(w: World) -> None:
    gtrid = w.crashed_commit("channel-queue", "outbox")
    w.rm.resolve(gtrid, SafeAction.ROLLBACK, "operator:bob", "wrong destination")
    kinds = [r.kind for r in w.log.records if isinstance(r, Heuristic)]
    assert kinds == [HeuristicKind.ROLLBACK] and w.db.prepared == {}


# ------------------------------------------------------------------------- review regressions (ab12)
def test_a_heuristic_branch_does_not_stop_the_rest_of_a_logged_commit() -> None:
    """t_forget.py: a COMMIT-logged transaction with a heuristic branch still has its other branches committed
    and re-sent; the view lists them; forget refuses until nothing is prepared or unfinished; presumed abort
    never rolls back a branch of it."""
    clock = FakeClock()
    log = MemoryLog(NODE)
    pg, broker = MemoryManager("pg", clock), MemoryManager("broker", clock)
    coord = Coordinator(NODE, log, clock)
    t = coord.begin()
    a = pg.branch("a", fail={"commit": HeuristicOutcome("rolled back on its own", kind=HeuristicKind.ROLLBACK)})
    b = pg.branch("b", fail={"commit": BranchUnavailable("connection lost")})
    stomp = broker.branch("stomp", one_phase=True, fail={"commit": OutcomeUnknown("no receipt")})
    for r in (a, b, stomp):
        t.enlist(r)
    b.write("outbox-row")
    stomp.write("msg")
    assert t.commit().state is State.HEURISTIC_ROLLBACK
    resent: list[str] = []
    rm = RecoveryManager(NODE, log, [pg], lambda g, p: resent.append(p.name), clock, in_flight_guard=GUARD,
                         in_flight=coord.in_flight)
    clock.advance(3600)
    [entry] = rm.view()
    assert set(entry.pending) == {"a", "b", "stomp"} and entry.action is SafeAction.COMMIT
    with pytest.raises(UsageError):
        rm.forget(t.gtrid, "operator:alice")
    report = rm.run()
    assert report.committed == [f"{t.gtrid}/b"] and report.rolled_back == [] and report.heuristic == [t.gtrid]
    assert pg.committed == ["outbox-row"] and resent == ["stomp"]
    assert report.ended == [] and t.gtrid in log.live()
    with pytest.raises(UsageError, match="a are still prepared"):  # the twin keeps the heuristic branch
        rm.forget(t.gtrid, "operator:alice")
    assert a.xid is not None
    pg.prepared.pop(str(a.xid))  # the operator settles it by hand
    [entry] = rm.view()
    assert entry.action is SafeAction.FORGET and entry.pending == ("a",)
    rm.forget(t.gtrid, "operator:alice")
    clock.advance(3600)
    again = rm.run()
    assert again.rolled_back == [] and again.committed == [] and resent == ["stomp"]


def test_forget_refuses_while_a_manager_does_not_answer(w: World) -> None:
    gtrid = w.crashed_commit()
    w.log.append(Heuristic(gtrid, HeuristicKind.MIXED, "*", "operator:alice", "by hand", 1.0), durable=True)
    w.db.fail["recover"] = BranchUnavailable("down")
    with pytest.raises(UsageError, match="did not answer"):
        w.rm.forget(gtrid, "operator:bob")
    del w.db.fail["recover"]
    w.rm.forget(gtrid, "operator:bob")
    assert gtrid not in w.log.live()


@pytest.mark.parametrize("lost", ["Heuristic", "Progress"])
def test_a_heuristic_during_rollback_leaves_no_branch_prepared(lost: str) -> None:
    """t_orphan.py: a rollback with a heuristic branch and a branch left behind, one of the two records lost
    (failed write, or a crash between them): recovery still rolls back what is left (no decision logged:
    presumed abort) and the view shows the entry instead of failing."""
    clock = FakeClock()
    log = MemoryLog(NODE)
    pg = MemoryManager("pg", clock)
    coord = Coordinator(NODE, log, clock)
    t = coord.begin()
    t.enlist(pg.branch("a", fail={"rollback": HeuristicOutcome("committed on its own", kind=HeuristicKind.COMMIT)}))
    t.enlist(pg.branch("b", fail={"rollback": BranchUnavailable("connection lost")}))
    t.enlist(pg.branch("c", fail={"prepare": PrepareFailed("no")}))
    log.fail[lost] = LogWriteFailed("disk full")
    with pytest.raises(PrepareFailed):
        t.commit()
    assert lost not in log.kinds() and len(pg.prepared) == 2
    rm = RecoveryManager(NODE, log, [pg], lambda g, p: None, clock, in_flight_guard=GUARD,
                         in_flight=coord.in_flight)
    [entry] = rm.view()
    assert entry.action is SafeAction.WAIT  # younger than the guard
    clock.advance(3600)
    [entry] = rm.view()
    assert entry.action is SafeAction.ROLLBACK and set(entry.pending) >= {"a", "b"}
    report = rm.run()
    assert pg.prepared == {} and sorted(report.rolled_back) == [f"{t.gtrid}/a", f"{t.gtrid}/b"]
    if lost == "Heuristic":  # nothing explains the entry any more: ended
        assert report.ended == [t.gtrid] and rm.view() == []
    else:  # the heuristic stays until an operator forgets it
        [entry] = rm.view()
        assert entry.status == "heuristic-commit" and entry.action is SafeAction.FORGET
        rm.forget(t.gtrid, "operator:alice")
        assert rm.view() == []


def test_view_is_total_for_any_log_entry(w: World) -> None:
    gtrid = new_gtrid(NODE)
    w.log.append(Progress(gtrid, ("outbox",), ("stomp",), 1.0), durable=False)  # decision record lost
    [entry] = w.rm.view()
    assert entry.action is SafeAction.COMMIT and "no decision logged" in entry.reason
    w.db.add_prepared(branch_xid(gtrid, "channel-queue"), ["row"])
    w.clock.advance(3600)
    report = w.rm.run()
    assert report.rolled_back == [] and report.waiting == [gtrid]  # partly committed: never presumed abort
