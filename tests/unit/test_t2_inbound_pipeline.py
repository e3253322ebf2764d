"""JMS → channel T2s are pipelined (issue 12, round 4): the channel's driver (router.channel.t2in.InboundT2Driver)
returns once a T2 is DECIDED and runs its phase two (COMMIT PREPARED, the broker's COMMIT of the acks) and the
publication of its events on the proxy's completer, while the next T2 begins. The events are still queued only
after their T2 completed, in the order of the decisions; at most one decided T2 waits in the completer; a local
round, or a channel bounded by MaxQueueLength, waits for phase two first.

In-memory stand-ins for the coordinator, the pool and the bridge: the ordering decisions are checked without I/O.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

import omniORB  # noqa: F401  (puts the COS stubs on the path)

import CosNotification

from router.channel import qos as Q
from router.channel import t2in as C
from router.channel.channel import RoutePlan
from xa.coordinator import BranchOutcome

WAIT_S = 10.0


class Txn:
    """A transaction whose phase two waits for ``gate`` (the broker's COMMIT receipt in flight)."""

    def __init__(self, n: int, log: list[tuple[str, int]], gate: threading.Event) -> None:
        self.n = n
        self.gtrid = f"g{n}"
        self.state = None
        self.timed_out = False
        self._log = log
        self._gate = gate

    def decide(self) -> None:
        self._log.append(("decide", self.n))

    def complete(self) -> Any:
        assert self._gate.wait(WAIT_S)
        self._log.append(("complete", self.n))
        return SimpleNamespace(branches=[SimpleNamespace(name="pg", outcome=BranchOutcome.COMMITTED)])

    def commit(self) -> Any:          # the driver before pipelining called this (phase one AND two in line)
        self.decide()
        return self.complete()

    def rollback(self, reason: str) -> None:
        self._log.append(("rollback", self.n))


class Db:
    def __init__(self) -> None:
        self.out = 0

    @contextlib.contextmanager
    def branch(self) -> Iterator[str]:
        self.out += 1
        try:
            yield "conn"
        finally:
            self.out -= 1

    unit_of_work = branch


class Target:
    def __init__(self, log: list[tuple[str, int]]) -> None:
        self.log = log
        self.rounds = 0

    def t2_ready(self) -> bool:
        return True

    def wait_first(self, timeout: float) -> bool:
        return True

    def take_in_t2(self, txn: Any, conn: Any, max_n: int, timeout: float) -> Any:
        self.rounds += 1
        return SimpleNamespace(received=1, events=[f"e{self.rounds}"])

    def take_local(self, conn: Any, max_n: int, timeout: float) -> Any:
        self.log.append(("local", 0))
        return SimpleNamespace(received=1, events=[], settle=lambda: None, abandon=lambda: None)


class Rig:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, admin_props: dict[str, Any] | None = None) -> None:
        self.log: list[tuple[str, int]] = []
        self.gate = threading.Event()
        self.db = Db()
        begun = iter(range(1, 100))
        coordinator = SimpleNamespace(begin=lambda timeout: Txn(next(begun), self.log, self.gate))
        rt = SimpleNamespace(db=self.db, t2=SimpleNamespace(coordinator=coordinator, enlist=lambda txn, b: None),
                             store=SimpleNamespace(ledger=None))
        self.published: list[Any] = []
        channel = SimpleNamespace(admin_props=admin_props or {}, qos={Q.ENABLE_TRANSACTION: True},
                                  queued_count=lambda: 0, store_in=lambda conn, plan: None,
                                  publish=self._publish)
        self.proxy = SimpleNamespace(rt=rt, channel=channel, qos={}, admin=SimpleNamespace(id=1, qos={}), oid="p1",
                                     room=lambda n: n, extra={})
        monkeypatch.setattr(C, "t2_branch", lambda ledger, conn, branch, gtrid: branch)
        monkeypatch.setattr(C, "PgBranch", lambda conn, name: SimpleNamespace(name=name))
        self.driver = C.InboundT2Driver(self.proxy, sequence=False)
        monkeypatch.setattr(self.driver, "_plan", lambda batch: SimpleNamespace(plans=list(batch.events)))
        self.target = Target(self.log)

    def _publish(self, plan: Any) -> None:
        self.log.append(("publish", int(plan.plans[0][1:]) if plan.plans else 0))
        self.published.extend(plan.plans)


def test_a_t2_round_returns_once_decided_and_phase_two_publishes_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch)
    try:
        assert rig.driver.round(rig.target, 0.0) == 1
        assert rig.log == [("decide", 1)], "phase two of T2 1 is not run by the round"
        assert rig.published == [], "nothing is queued in memory before its T2 completed"
        assert rig.driver.active, "a T2 in phase two is still in progress (TransactionActive)"
        assert rig.db.out == 1, "the branch's session is kept until its phase two is done"
        assert rig.driver.round(rig.target, 0.0) == 1
        assert rig.log == [("decide", 1), ("decide", 2)], "T2 2 is decided while T2 1 is in phase two"
    finally:
        rig.gate.set()
    assert rig.driver.drain(WAIT_S)
    assert rig.published == ["e1", "e2"]
    assert rig.log[2:] == [("complete", 1), ("publish", 1), ("complete", 2), ("publish", 2)]
    assert not rig.driver.active and rig.db.out == 0 and rig.driver.committed == 2


def test_at_most_one_decided_t2_waits_in_the_completer(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch)
    rig.driver.round(rig.target, 0.0)
    rig.driver.round(rig.target, 0.0)
    third = threading.Thread(target=rig.driver.round, args=(rig.target, 0.0), daemon=True)
    third.start()
    third.join(0.3)                      # not a timing assertion: T2 3 must not have begun while the gate is shut
    assert ("decide", 3) not in rig.log and rig.db.out == 2
    rig.gate.set()
    third.join(WAIT_S)
    assert rig.driver.drain(WAIT_S)
    assert rig.published == ["e1", "e2", "e3"]


def test_a_local_round_waits_for_the_phase_two_of_decided_t2s(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch)
    rig.driver.round(rig.target, 0.0)
    releaser = threading.Timer(0.2, rig.gate.set)
    releaser.start()
    rig.driver.round_local(rig.target, 0.0)
    releaser.join()
    assert rig.log.index(("publish", 1)) < rig.log.index(("local", 0)), \
        "the local round's events go after the decided T2's"


def test_a_bounded_channel_plans_after_the_previous_t2_was_published(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, {CosNotification.MaxQueueLength: 10})
    rig.driver.round(rig.target, 0.0)
    releaser = threading.Timer(0.2, rig.gate.set)
    releaser.start()
    rig.driver.round(rig.target, 0.0)
    releaser.join()
    assert rig.log.index(("publish", 1)) < rig.log.index(("decide", 2)), \
        "its admission (MaxQueueLength) counts the previous T2's events"
    assert rig.driver.drain(WAIT_S)


# ----------------------------------------------------------------------- one CDR encoding per inbound event
@pytest.fixture(scope="module")
def orb() -> Any:
    from omniORB import CORBA

    return CORBA.ORB_init(["test", "-ORBnativeCharCodeSet", "UTF-8"], CORBA.ORB_ID)  # as the node


def _structured(type_name: str = "t", body: str = "x" * 100) -> Any:
    from omniORB import CORBA

    N = CosNotification
    return N.StructuredEvent(N.EventHeader(N.FixedEventHeader(N.EventType("d", type_name), "n"), []), [],
                             CORBA.Any(CORBA.TC_string, body))


def test_the_bridges_encoding_is_the_channels_and_is_stored_as_it_is(orb: Any) -> None:
    """The bridge encodes each event to check its size (``event_encoded``); the plan takes those bytes as the
    stored body, so ``store_in`` does not encode the event a second time; they are the channel's own encoding."""
    from router.bridge.bridge import _event_bytes
    from router.channel.events import Form, decode, encode, normalise_structured
    from router.channel.queue import Record

    ev = _structured()
    body = _event_bytes(ev)
    events = [normalise_structured(ev)]
    ours = encode(events[0])      # equal but for the encapsulation's padding octets, which CDR leaves undefined
    assert len(ours) == len(body) and repr(decode(Form.STRUCTURED, body)) == repr(decode(Form.STRUCTURED, ours))
    rec = Record(1, events[0], 4, None, None, True, on_released=lambda r: None)
    plan = C._with_bodies(RoutePlan([(rec, [])]), events, SimpleNamespace(bodies=[body]))
    assert plan.bodies == {1: body} and rec.size == len(body)


def test_an_any_wrapped_event_and_a_body_the_channel_made_are_not_replaced() -> None:
    from router.channel.events import Form, normalise_structured
    from router.channel.queue import Record

    wrapped = _structured(type_name="%ANY")
    plain = _structured()
    events = [normalise_structured(wrapped), normalise_structured(plain)]
    assert events[0].form is Form.ANY
    recs = [Record(i, ev, 4, None, None, True, on_released=lambda r: None) for i, ev in enumerate(events)]
    plan = RoutePlan([(r, []) for r in recs], bodies={1: b"the channel's own"})
    C._with_bodies(plan, events, SimpleNamespace(bodies=[b"bridge 0", b"bridge 1"]))
    assert plan.bodies == {1: b"the channel's own"}


def test_event_encoded_keeps_the_bytes_it_measured() -> None:
    from router.bridge.core import JmsToChannel
    from tests.unit.test_bridge_core import TwinBridge, TwinTransport, delivery

    flow = JmsToChannel(TwinBridge(), TwinTransport(), lambda m: ("event", m.body), None,  # type: ignore[arg-type]
                        lambda: None, event_bytes=lambda ev: str(ev).encode(), max_event_bytes=100)
    assert flow.event_encoded(delivery("m1")) == (("event", "hello"), b"('event', 'hello')", None)
    event, body, problem = flow.event_encoded(delivery("m2", "y" * 200))
    assert event is None and body is None and problem is not None and "size limit" in problem
