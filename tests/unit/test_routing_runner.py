"""The one T2 runner (router.routing.runner) over the in-memory xa pieces: a coordinator on a MemoryLog, branches of
MemoryManagers, a stand-in for the pooled session. Each outcome (committed, deferred, rolled back, in doubt), the
order of the calls, and that the session goes back to the pool exactly once whatever happens."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from router.routing.completer import Completer
from router.routing.runner import Abandon, Outcome, RunHooks, RunResult, T2Runner
from xa.coordinator import Coordinator, Transaction
from xa.coordinator import Outcome as XaOutcome
from xa.errors import BranchUnavailable, DecisionUnknown, PrepareFailed, TransactionRolledBack
from xa.resource import Resource
from xa.states import State
from xa.testing import FakeClock, MemoryLog, MemoryManager
from xa.xid import NodeId

NODE = NodeId("n1")


class StoreError(Exception):
    """What the session's boundary translates a statement error into (router.db's)."""


class Sessions:
    """Database.branch() stand-in: counts checkouts and returns, records how each ended; ``translate`` re-raises
    a failure as :class:`StoreError` (as Database.branch does for a psycopg error)."""

    def __init__(self, *, fail_checkout: BaseException | None = None, translate: bool = False) -> None:
        self.out = 0
        self.ended: list[str] = []
        self.fail_checkout = fail_checkout
        self.translate = translate

    @contextlib.contextmanager
    def branch(self) -> Iterator[Any]:
        if self.fail_checkout is not None:
            raise self.fail_checkout
        self.out += 1
        try:
            yield f"conn{self.out}"
        except BaseException as exc:
            self.ended.append(f"failed: {type(exc).__name__}")
            if self.translate and isinstance(exc, ValueError):
                raise StoreError(f"translated: {exc}") from exc
            raise
        else:
            self.ended.append("returned")


class T2:
    """router.routing.t2.transactions.NodeTransactions as the runner sees it."""

    def __init__(self) -> None:
        self.log = MemoryLog(NODE)
        self.coordinator = Coordinator(NODE, self.log, FakeClock())
        self.enlisted: list[str] = []

    def enlist(self, txn: Transaction, resource: Resource) -> Any:
        self.enlisted.append(resource.name)
        return txn.enlist(resource)


class Hooks(RunHooks[str]):
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.outcome: XaOutcome | None = None
        self.error: Exception | None = None
        self.done = threading.Event()

    def started(self, txn: Transaction) -> None:
        self.calls.append("started")

    def decided(self, txn: Transaction, value: str) -> None:
        self.calls.append(f"decided {value} {txn.state.name}")

    def before_phase_two(self, txn: Transaction) -> None:
        self.calls.append("before_phase_two")

    def completed(self, txn: Transaction, value: str, outcome: XaOutcome | None, error: Exception | None) -> None:
        self.calls.append(f"completed {value}")
        self.outcome, self.error = outcome, error

    def settled(self, txn: Transaction) -> None:
        self.calls.append("settled")
        self.done.set()


def _work(pg: MemoryManager, broker: MemoryManager, t2: T2, *, fail: dict[str, Any] | None = None,
          raise_in_work: BaseException | None = None) -> Any:
    def work(txn: Transaction, conn: Any) -> str:
        branch = pg.branch("pg")
        t2.enlist(txn, branch)
        branch.write(f"row via {conn}")
        stomp = broker.branch("stomp", one_phase=True, fail=fail or {})
        t2.enlist(txn, stomp)
        stomp.write("SEND")
        if raise_in_work is not None:
            raise raise_in_work
        return "result"
    return work


@pytest.fixture()
def pieces() -> tuple[T2, MemoryManager, MemoryManager]:
    clock = FakeClock()
    return T2(), MemoryManager("pg", clock), MemoryManager("broker", clock)


def test_committed_inline_without_a_completer(pieces: tuple[T2, MemoryManager, MemoryManager]) -> None:
    t2, pg, broker = pieces
    sessions, hooks = Sessions(), Hooks()
    run = T2Runner(t2, sessions).run(_work(pg, broker, t2), hooks, timeout=None)
    assert run.outcome is Outcome.COMMITTED and run.value == "result" and run.error is None
    assert run.txn is not None and run.txn.state is State.COMMITTED
    assert pg.committed == ["row via conn1"] and broker.committed == ["SEND"]
    assert t2.log.kinds() == ["Commit", "End"]
    assert hooks.calls == ["started", "decided result COMMITTING", "before_phase_two", "completed result", "settled"]
    assert hooks.outcome is not None and hooks.error is None
    assert sessions.ended == ["returned"]


def test_deferred_phase_two_runs_on_the_completer_after_the_decision(
        pieces: tuple[T2, MemoryManager, MemoryManager]) -> None:
    t2, pg, broker = pieces
    sessions, hooks = Sessions(), Hooks()
    gate = threading.Event()
    completer = Completer("t2-runner-test")
    completer.submit(gate.wait)                  # the completer is busy with an earlier T2's phase two
    run = T2Runner(t2, sessions).run(_work(pg, broker, t2), hooks, timeout=30, completer=completer)
    assert run.outcome is Outcome.DEFERRED and run.value == "result"
    assert run.txn is not None and run.txn.state is State.COMMITTING      # decided, nothing committed yet
    assert pg.committed == [] and sessions.ended == [] and hooks.calls == ["started", "decided result COMMITTING"]
    gate.set()
    assert completer.drain(30)
    assert hooks.done.is_set() and run.txn.state is State.COMMITTED
    assert pg.committed == ["row via conn1"] and broker.committed == ["SEND"] and sessions.ended == ["returned"]
    assert hooks.calls[2:] == ["before_phase_two", "completed result", "settled"]


def test_a_failed_phase_two_is_reported_to_the_hooks_and_the_session_still_returns(
        pieces: tuple[T2, MemoryManager, MemoryManager], monkeypatch: pytest.MonkeyPatch) -> None:
    t2, pg, broker = pieces
    sessions, hooks = Sessions(), Hooks()
    def complete(self: Transaction) -> XaOutcome:      # a failure outside a branch's outcome
        self._hand_to_recovery(RuntimeError("log gone"))
        raise RuntimeError("log gone")

    monkeypatch.setattr(Transaction, "complete", complete)
    run = T2Runner(t2, sessions).run(_work(pg, broker, t2), hooks)
    assert run.outcome is Outcome.COMMITTED
    assert hooks.outcome is None and isinstance(hooks.error, RuntimeError)
    assert sessions.ended == ["returned"] and hooks.calls[-1] == "settled"


def test_a_failure_in_the_work_rolls_back_and_is_reported_translated(
        pieces: tuple[T2, MemoryManager, MemoryManager]) -> None:
    t2, pg, broker = pieces
    sessions, hooks = Sessions(translate=True), Hooks()
    run = T2Runner(t2, sessions).run(_work(pg, broker, t2, raise_in_work=ValueError("bad row")), hooks)
    assert run.outcome is Outcome.ROLLED_BACK
    assert isinstance(run.error, StoreError) and isinstance(run.cause, ValueError)   # raised: the translated one
    assert run.reason == "ValueError: bad row"
    assert run.txn is not None and run.txn.state is State.ROLLED_BACK and run.txn.rollback_reason == run.reason
    assert pg.committed == [] and broker.committed == [] and pg.prepared == {}
    assert sessions.ended == ["failed: ValueError"]          # rolled back while the session was still ours
    assert hooks.calls == ["started"]


def test_a_branch_that_cannot_prepare_rolls_back_with_the_coordinators_reason(
        pieces: tuple[T2, MemoryManager, MemoryManager]) -> None:
    t2, pg, broker = pieces
    sessions = Sessions()
    run: RunResult[str] = T2Runner(t2, sessions).run(
        _work(pg, broker, t2, fail={"prepare": PrepareFailed("refused frame")}))
    assert run.outcome is Outcome.ROLLED_BACK and isinstance(run.error, PrepareFailed)
    assert run.txn is not None and run.txn.state is State.ROLLED_BACK
    assert pg.prepared == {} and pg.committed == [] and sessions.ended == ["failed: PrepareFailed"]


def test_rollback_only_set_by_the_participant(pieces: tuple[T2, MemoryManager, MemoryManager]) -> None:
    t2, pg, broker = pieces

    def work(txn: Transaction, conn: Any) -> str:
        _work(pg, broker, t2)(txn, conn)
        txn.set_rollback_only("the bridge forces rollback")
        return "x"

    run = T2Runner(t2, Sessions()).run(work)
    assert run.outcome is Outcome.ROLLED_BACK and isinstance(run.error, TransactionRolledBack)
    assert run.reason == "the bridge forces rollback"


def test_in_doubt_when_the_commit_record_may_or_may_not_be_durable(
        pieces: tuple[T2, MemoryManager, MemoryManager]) -> None:
    t2, pg, broker = pieces
    t2.log.fail["Commit"] = OSError("fsync failed")
    sessions, hooks = Sessions(), Hooks()
    run = T2Runner(t2, sessions).run(_work(pg, broker, t2), hooks)
    assert run.outcome is Outcome.IN_DOUBT and isinstance(run.error, DecisionUnknown)
    assert run.txn is not None and run.txn.state not in (State.ROLLED_BACK, State.ROLLING_BACK)
    assert len(pg.prepared) == 1                              # left prepared: recovery decides
    assert sessions.ended == ["failed: DecisionUnknown"] and hooks.calls == ["started"]


def test_abandon_rolls_back_quietly(pieces: tuple[T2, MemoryManager, MemoryManager]) -> None:
    t2, pg, _ = pieces
    sessions = Sessions()

    def work(txn: Transaction, conn: Any) -> str:
        t2.enlist(txn, pg.branch("pg"))
        raise Abandon("nothing received")

    run = T2Runner(t2, sessions).run(work)
    assert run.outcome is Outcome.ROLLED_BACK and run.error is None and run.reason == "nothing received"
    assert run.txn is not None and run.txn.state is State.ROLLED_BACK and sessions.ended == ["returned"]


def test_a_session_that_cannot_be_checked_out(pieces: tuple[T2, MemoryManager, MemoryManager]) -> None:
    t2, pg, broker = pieces
    hooks = Hooks()
    run = T2Runner(t2, Sessions(fail_checkout=BranchUnavailable("pool empty"))).run(_work(pg, broker, t2), hooks)
    assert run.outcome is Outcome.ROLLED_BACK and isinstance(run.error, BranchUnavailable)
    assert run.txn is not None and run.txn.state is State.ROLLED_BACK and hooks.calls == ["started"]
    assert t2.coordinator.in_flight() == frozenset()


def test_a_t2_that_cannot_begin_reports_no_transaction() -> None:
    class Refusing(T2):
        def __init__(self) -> None:
            super().__init__()
            self.coordinator = self                       # type: ignore[assignment]

        def begin(self, timeout: float | None = None) -> Transaction:
            raise RuntimeError("log refuses")

    hooks = Hooks()
    run = T2Runner(Refusing(), Sessions()).run(lambda txn, conn: "x", hooks)
    assert run.outcome is Outcome.ROLLED_BACK and run.txn is None and run.gtrid is None
    assert isinstance(run.error, RuntimeError) and hooks.calls == []


def test_an_interrupt_is_cleaned_up_then_left_to_the_caller(pieces: tuple[T2, MemoryManager, MemoryManager]) -> None:
    t2, pg, broker = pieces
    sessions = Sessions()
    run = T2Runner(t2, sessions).run(_work(pg, broker, t2, raise_in_work=KeyboardInterrupt()))
    assert run.outcome is Outcome.ROLLED_BACK and run.txn is not None and run.txn.state is State.ROLLED_BACK
    assert sessions.ended == ["failed: KeyboardInterrupt"] and pg.prepared == {}
    with pytest.raises(KeyboardInterrupt):
        run.reraise_interrupt()
