"""JMS → channel rounds wait for JMS WITHOUT a pooled PostgreSQL connection (review finding: each idle inbound
bridge on a Persistent channel held one of the pool's connections almost all the time, starving the node).

The channel's driver (router.channel.t2in.InboundT2Driver), the push loop's local round (router.bridge.jmsin) and
the bridge's receiver (router.bridge.t2in.InboundT2.wait) over in-memory stand-ins: the decision "open a unit of
work / begin a T2 only once a message is there" is checked without a database.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from router.bridge.jmsin import PushSenderLoop
from router.channel import t2in as C
from tests.unit.test_bridge_core import TwinInbox, TwinSink, TwinTransport, delivery, in_flow


class Db:
    """The node's pool: counts the connections checked out and whether one is out now."""

    def __init__(self) -> None:
        self.opened = 0
        self.out = False

    @contextlib.contextmanager
    def unit_of_work(self) -> Iterator[str]:
        self.opened += 1
        self.out = True
        try:
            yield "conn"
        finally:
            self.out = False

    branch = unit_of_work


class Target:
    """The bridge's pull sender: ``pending`` messages; records with what wait each call ran and whether a pooled
    connection was out while it waited."""

    def __init__(self, db: Db, pending: int) -> None:
        self.db = db
        self.pending = pending
        self.waits_with_connection: list[float] = []

    def t2_ready(self) -> bool:
        return True

    def wait_first(self, timeout: float) -> bool:
        if self.db.out:
            self.waits_with_connection.append(timeout)
        return self.pending > 0

    def take_local(self, conn: Any, max_n: int, timeout: float) -> Any:
        if timeout > 0:
            self.waits_with_connection.append(timeout)
        n, self.pending = self.pending, 0
        return SimpleNamespace(received=n, events=[], settle=lambda: None, abandon=lambda: None)

    def take_in_t2(self, txn: Any, conn: Any, max_n: int, timeout: float) -> Any:
        return self.take_local(conn, max_n, timeout)


def proxy(db: Db, *, t2: bool) -> Any:
    begun: list[Any] = []
    coordinator = SimpleNamespace(begin=lambda timeout: begun.append(timeout) or SimpleNamespace(
        gtrid="g", state=None, rollback=lambda reason: None, timed_out=False))
    rt = SimpleNamespace(db=db, t2=SimpleNamespace(coordinator=coordinator, enlist=lambda txn, branch: None))
    channel = SimpleNamespace(admin_props={}, qos={C.Q.ENABLE_TRANSACTION: t2}, publish=lambda plan: None,
                              queued_count=lambda: 0)
    return SimpleNamespace(rt=rt, channel=channel, qos={}, admin=SimpleNamespace(id=1, qos={}), oid="p1",
                           room=lambda n: n, begun=begun, extra={})


def test_an_idle_local_round_checks_out_no_connection() -> None:
    db = Db()
    target = Target(db, pending=0)
    driver = C.InboundT2Driver(proxy(db, t2=False), sequence=False)
    assert driver.round_local(target, 0.2) == 0
    assert db.opened == 0 and target.waits_with_connection == []


def test_a_local_round_with_a_message_takes_it_without_waiting_inside_its_unit_of_work() -> None:
    db = Db()
    target = Target(db, pending=3)
    driver = C.InboundT2Driver(proxy(db, t2=False), sequence=False)
    assert driver.round_local(target, 0.2) == 3
    assert db.opened == 1 and target.waits_with_connection == []


def test_an_idle_t2_round_begins_no_transaction_and_checks_out_no_connection() -> None:
    db = Db()
    target = Target(db, pending=0)
    p = proxy(db, t2=True)
    driver = C.InboundT2Driver(p, sequence=False)
    assert driver.round(target, 0.2) == 0
    assert db.opened == 0 and p.begun == [] and target.waits_with_connection == []


def test_local_round_without_ready_keeps_its_old_contract() -> None:
    db = Db()
    target = Target(db, pending=1)
    assert C.local_round(proxy(db, t2=False), target.take_local, 10, 0.0) == 1 and db.opened == 1


# ------------------------------------------------------------------------------- the bridge's receiver and push loop
def test_the_receiver_waits_for_the_first_delivery_and_keeps_it_for_the_round() -> None:
    transport, inbox = TwinTransport(), TwinInbox()
    flow = in_flow(transport, [], inbox=inbox)
    assert flow.inbound().wait(0.0) is False
    flow.subscription.deliveries.append(delivery("m1", "a"))     # type: ignore[union-attr]
    assert flow.inbound().wait(0.0) is True
    assert flow.inbound().wait(0.0) is True                      # still there, not received twice
    batch = flow.inbound().take_local("conn", 10, 0.0)
    assert batch.events == [("event", "a")]
    batch.settle()
    assert transport.acked == ["m1"] and inbox.ids == {"m1"}


def test_the_push_loops_local_round_asks_ready_before_it_takes() -> None:
    transport, inbox = TwinTransport(), TwinInbox()
    flow = in_flow(transport, [], inbox=inbox)
    calls: list[str] = []

    class Local:
        def round(self, take: Callable[[Any, int, float], Any], max_n: int, timeout: float, *,
                  ready: Callable[[float], bool] | None = None) -> None:
            calls.append("ready" if ready is not None else "no ready")
            if ready is not None and not ready(0.0):
                return
            calls.append("take")
            take("conn", max_n, 0.0).settle()

    loop = PushSenderLoop(flow, TwinSink(local=Local()), False, lambda: 1, lambda: 0.0, True, threading.Event())
    loop._round()
    assert calls == ["ready"]
    flow.subscription.deliveries.append(delivery("m1", "a"))     # type: ignore[union-attr]
    loop._round()
    assert calls == ["ready", "ready", "take"] and transport.acked == ["m1"]


# ----------------------------------------------- disable_transaction while the round waits for JMS (review finding)
class DisabledWhileWaiting(Target):
    """The bridge's ``disable_transaction`` is applied (the proxy's own EnableTransaction written FALSE) while the
    driver waits for the first message; the message then arrives."""

    def __init__(self, db: Db, p: Any) -> None:
        super().__init__(db, pending=1)
        self.p = p

    def wait_first(self, timeout: float) -> bool:
        self.p.qos[C.Q.ENABLE_TRANSACTION] = False
        return super().wait_first(timeout)


def test_a_disable_applied_while_the_t2_round_waits_makes_it_a_local_round() -> None:
    """Before: the round read EnableTransaction before it waited, so a disable applied then (the driver not yet
    active: the disable returned success) was followed by a T2 with the old settings. Now the settings are read once
    the message is there: no T2 begins, and the held delivery is taken by a local unit of work."""
    db = Db()
    p = proxy(db, t2=True)
    target = DisabledWhileWaiting(db, p)
    driver = C.InboundT2Driver(p, sequence=False)
    assert driver.round(target, 0.2) == 1
    assert p.begun == [], "no T2 with the stale settings"
    assert db.opened == 1 and target.pending == 0 and not driver.active


def test_the_round_is_active_when_it_reads_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A disable applied after the round read its settings finds it active (txmgmt reads ``active`` after its
    write, and reports TransactionActive: the disable takes effect when the T2 ends)."""
    db = Db()
    p = proxy(db, t2=True)
    seen: list[bool] = []
    driver = C.InboundT2Driver(p, sequence=False)
    real = C.t2_settings

    def settings(proxy: Any, *, sequence: bool) -> Any:
        seen.append(driver.active)
        return real(proxy, sequence=sequence)

    monkeypatch.setattr(C, "t2_settings", settings)
    monkeypatch.setattr(driver, "_round", lambda rt, settings, target, wait_s: 1)   # the T2 itself: not here
    assert driver.round(Target(db, pending=1), 0.2) == 1
    assert seen == [True] and not driver.active
