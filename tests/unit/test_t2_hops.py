"""router.routing.ledger.T2HopRecorder: the decision and broker-commit times of T2s, driven by the real coordinator over
the in-memory twins (xa.testing), and the one UPDATE that fills them into the T2's terminal ledger rows."""

from __future__ import annotations

from typing import Any

from psycopg import Xid

from router.routing.ledger import T2HopRecorder
from xa.coordinator import Coordinator
from xa.errors import OutcomeUnknown
from xa.observer import Phase
from xa.records import Commit, LiveTxn, Participant
from xa.states import State
from xa.testing import FakeClock, MemoryLog, MemoryManager
from xa.xid import NodeId

NODE = NodeId("n1")


class Tick:
    """A wall clock that moves 1 s per reading, so every stamp is distinct and ordered."""

    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


class Spy:
    """The telemetry observer: must still hear every call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *a: self.calls.append(name)


class Broker:
    """A one-phase broker branch of a given kind (stomp-send: channel → JMS; stomp-ack: JMS → channel)."""

    one_phase_only = True
    manager = "stomp-send"

    def __init__(self, kind: str, fail_commit: bool = False) -> None:
        self.kind, self.name, self.fail_commit = kind, "broker", fail_commit

    def sort_key(self) -> str:
        return "~broker"

    def begin(self, xid: Xid) -> None:
        pass

    def prepare(self) -> None:
        pass

    def commit(self) -> None:
        if self.fail_commit:
            raise OutcomeUnknown("receipt lost")

    def rollback(self) -> None:
        pass


def rig() -> tuple[Coordinator, MemoryManager, T2HopRecorder, Spy]:
    spy = Spy()
    hops = T2HopRecorder(spy, clock=Tick())  # type: ignore[arg-type]
    return Coordinator(NODE, MemoryLog(NODE), FakeClock(), observer=hops), MemoryManager("postgresql"), hops, spy


def test_a_committed_t2_gets_its_decision_then_its_broker_commit() -> None:
    coord, pg, hops, spy = rig()
    txn = coord.begin(10)
    txn.enlist(pg.branch("pg"))
    txn.enlist(Broker("stomp-send"))
    txn.commit()
    got = hops.take()
    h = got[txn.gtrid]
    assert h.decided_at is not None and h.broker_committed_at is not None and h.decided_at < h.broker_committed_at
    assert h.acks is False
    assert {"begun", "decided", "ended", "phase_started", "phase_ended"} <= set(spy.calls), "telemetry still hears"
    assert hops.take() == {}, "taken once"


def test_the_ack_transaction_of_a_jms_to_channel_t2_marks_its_commit_as_the_acknowledgement() -> None:
    coord, pg, hops, _ = rig()
    txn = coord.begin(10)
    txn.enlist(pg.branch("pg"))
    txn.enlist(Broker("stomp-ack"))
    txn.commit()
    assert hops.take()[txn.gtrid].acks is True


def test_a_rolled_back_t2_records_nothing() -> None:
    coord, pg, hops, _ = rig()
    txn = coord.begin(10)
    txn.enlist(pg.branch("pg"))
    txn.rollback("no")
    assert hops.take() == {} and hops.pending() == 0


def test_a_lost_broker_receipt_leaves_the_decision_only_until_recovery_re_sends() -> None:
    coord, pg, hops, _ = rig()
    txn = coord.begin(10)
    txn.enlist(pg.branch("pg"))
    txn.enlist(Broker("stomp-send", fail_commit=True))
    assert txn.commit().state is State.COMMIT_PENDING
    assert hops.take(keep={txn.gtrid}) == {}, "still in the log: kept for later"
    decided = hops.take()[txn.gtrid]
    assert decided.decided_at is not None and decided.broker_committed_at is None
    hops.give_back({txn.gtrid: decided})
    # recovery re-sends it and ends it: the re-send's commit time fills the broker hop, the decision time stays
    live = {txn.gtrid: LiveTxn(txn.gtrid, commit=Commit(txn.gtrid, (Participant("broker", "stomp-send", "stomp-send",
                                                                                  True),), None, 5.0))}
    hops.recovered(live, [txn.gtrid], {txn.gtrid: 99_999.0})
    h = hops.take()[txn.gtrid]
    assert (h.decided_at, h.broker_committed_at) == (decided.decided_at, 99_999.0)


def test_recovery_of_a_crashed_t2_takes_the_commit_record_time_and_never_invents_an_ack() -> None:
    hops = T2HopRecorder(clock=Tick())
    send = Participant("broker", "stomp-send", "stomp-send", True)
    ack = Participant("stomp-ack", "stomp-ack", "stomp-ack", True)
    live = {"g-out": LiveTxn("g-out", commit=Commit("g-out", (send,), None, 7.0)),
            "g-in": LiveTxn("g-in", commit=Commit("g-in", (ack,), None, 8.0)),
            "g-undecided": LiveTxn("g-undecided")}
    hops.recovered(live, ["g-out", "g-in", "g-undecided", "g-unknown"], {"g-out": 9.0, "g-in": 9.5})
    got = hops.take()
    assert set(got) == {"g-out", "g-in"}
    assert (got["g-out"].decided_at, got["g-out"].broker_committed_at) == (7.0, 9.0)
    assert (got["g-in"].decided_at, got["g-in"].broker_committed_at) == (8.0, None)


class Conn:
    def __init__(self) -> None:
        self.params: Any = None

    def execute(self, query: Any, params: Any) -> Any:
        self.params = params
        return type("Cur", (), {"rowcount": 3})()


def test_write_is_one_statement_for_every_t2() -> None:
    hops = T2HopRecorder(clock=Tick())
    hops.decided("g1", "commit", "")
    hops.phase_started("g1", Phase.COMMIT, "broker", "stomp-send")
    hops.phase_ended("g1", Phase.COMMIT, "broker", "COMMITTED", "")
    hops.ended("g1", State.COMMITTED, False, 0.1)
    hops.decided("g2", "commit", "")
    hops.ended("g2", State.COMMITTED, False, 0.1)
    conn = Conn()
    assert hops.write(conn, hops.take()) == 3 and hops.rows_updated == 3  # type: ignore[arg-type]
    gtrids, decided, committed, acks = conn.params
    assert sorted(gtrids) == ["g1", "g2"] and all(d is not None for d in decided)
    assert dict(zip(gtrids, committed, strict=True))["g2"] is None and acks == [False, False]
