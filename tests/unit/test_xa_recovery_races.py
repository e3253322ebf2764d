"""Recovery running while the coordinator decides: deterministic interleavings through injected hooks.

A transaction begins, logs COMMIT and blocks inside phase two (in the broker's commit) exactly when recovery
reaches one of its reads (the log, the in-flight set, the log again, the scan). Recovery must leave it alone:
no re-send, no commit, no END while the coordinator drives it (t_race.py, t_race2.py)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import pytest
from psycopg import Xid

from xa.coordinator import Coordinator, Outcome
from xa.errors import OutcomeUnknown
from xa.records import LiveTxn, Record
from xa.recovery import RecoveryManager, SafeAction
from xa.states import State
from xa.testing import FakeClock, MemoryLog, MemoryManager
from xa.xid import NodeId

NODE = NodeId("n1")
WAIT = 30.0  # a safety net against a hung test, never a timing assumption


class Race:
    """A coordinator and a recovery manager sharing one log; ``trigger`` names the recovery step at which a
    new transaction starts, logs COMMIT and blocks in the broker's commit until :meth:`release`."""

    def __init__(self, trigger: str, *, broker_fails: bool, release_at: str = "") -> None:
        self.clock = FakeClock()
        self.log = MemoryLog(NODE)
        self.pg = MemoryManager("pg", self.clock)
        self.broker = MemoryManager("broker", self.clock)
        self.coord = Coordinator(NODE, self.log, self.clock)
        self.trigger, self.broker_fails, self.release_at = trigger, broker_fails, release_at
        self.calls: dict[str, int] = {}
        self.in_commit, self.released = threading.Event(), threading.Event()
        self.outcome: list[Outcome] = []
        self.thread: threading.Thread | None = None
        self.resent: list[tuple[str, str]] = []
        real_recover = self.pg.recover

        def recover() -> Sequence[Xid]:
            self._step("scan")
            return real_recover()

        self.pg.recover = recover  # type: ignore[method-assign]
        self.rm = RecoveryManager(NODE, self, [self.pg], lambda g, p: self.resent.append((g, p.name)),
                                  self.clock, in_flight=self._in_flight)

    # the RecoveryLog seen by recovery: the shared log with a hook on every read
    @property
    def node(self) -> NodeId:
        return NODE

    def append(self, record: Record, *, durable: bool) -> None:
        self.log.append(record, durable=durable)

    def live(self) -> Mapping[str, LiveTxn]:
        self._step("live")
        return self.log.live()

    def _in_flight(self) -> frozenset[str]:
        self._step("in_flight")
        return self.coord.in_flight()

    def _step(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if f"{name}#{self.calls[name]}" == self.trigger and self.thread is None:
            self.thread = threading.Thread(target=self._drive)
            self.thread.start()
            assert self.in_commit.wait(WAIT), "the transaction never reached phase two"
        if f"{name}#{self.calls[name]}" == self.release_at:
            self.release()

    def _drive(self) -> None:
        t = self.coord.begin()
        outbox = self.pg.branch("outbox")
        t.enlist(outbox)
        outbox.write("row")

        def block() -> None:
            self.in_commit.set()
            assert self.released.wait(WAIT)
            if self.broker_fails:
                raise OutcomeUnknown("no receipt")

        stomp = self.broker.branch("stomp", one_phase=True, fail={"commit": block})
        t.enlist(stomp)
        stomp.write("msg")
        self.outcome.append(t.commit())

    def release(self) -> Outcome:
        self.released.set()
        assert self.thread is not None
        self.thread.join(WAIT)
        assert not self.thread.is_alive()
        [outcome] = self.outcome
        return outcome


TRIGGERS = ["live#1", "in_flight#1", "live#2", "scan#1"]


@pytest.mark.parametrize("broker_fails", [False, True], ids=["broker-ok", "broker-unknown"])
@pytest.mark.parametrize("trigger", TRIGGERS)
def test_recovery_never_acts_on_a_transaction_in_phase_two(trigger: str, broker_fails: bool) -> None:
    race = Race(trigger, broker_fails=broker_fails)
    race.clock.advance(3600)  # presumed abort is due for anything undecided
    report = race.rm.run()
    assert race.thread is not None, f"recovery never reached {trigger}"
    assert race.resent == [] and report.ended == [] and report.committed == [] and report.rolled_back == []
    outcome = race.release()
    if broker_fails:
        assert outcome.state is State.COMMIT_PENDING and race.broker.committed == []
        again = race.rm.run()  # handed off: now recovery finishes it, once
        assert race.resent == [(outcome.gtrid, "stomp")] and again.ended == [outcome.gtrid]
    else:
        assert outcome.state is State.COMMITTED and race.broker.committed == ["msg"]
        assert race.rm.run().ended == [] and race.resent == []
    assert race.pg.committed == ["row"]
    assert race.log.kinds().count("End") == 1 and race.log.live() == {}


@pytest.mark.parametrize("broker_fails", [False, True], ids=["broker-ok", "broker-unknown"])
def test_a_transaction_handed_off_between_the_reads(broker_fails: bool) -> None:
    """COMMIT in the first log read, the coordinator finishes (END, or PROGRESS and hand-off) before the
    in-flight read: a finished transaction is not finished again (no second send); a handed-off one is
    finished by recovery exactly once."""
    race = Race("live#1", broker_fails=broker_fails, release_at="in_flight#1")
    report = race.rm.run()
    [outcome] = race.outcome
    if broker_fails:
        assert outcome.state is State.COMMIT_PENDING
        assert race.resent == [(outcome.gtrid, "stomp")] and report.ended == [outcome.gtrid]
        assert race.broker.committed == []
    else:
        assert outcome.state is State.COMMITTED
        assert race.resent == [] and report.ended == [] and race.broker.committed == ["msg"]
    assert race.pg.committed == ["row"] and race.log.live() == {}


@pytest.mark.parametrize("trigger", TRIGGERS)
def test_the_view_never_recommends_acting_on_a_transaction_in_phase_two(trigger: str) -> None:
    race = Race(trigger, broker_fails=True)
    race.clock.advance(3600)
    entries = race.rm.view()  # empty when the whole decision happened after the log reads
    assert race.thread is not None, f"the view never reached {trigger}"
    assert [e.action for e in entries] in ([], [SafeAction.WAIT]), entries
    outcome = race.release()
    [entry] = race.rm.view()  # handed off now: recovery's business
    assert entry.gtrid == outcome.gtrid and entry.action is SafeAction.RESEND
