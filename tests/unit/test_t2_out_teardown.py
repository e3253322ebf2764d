"""A teardown during a decided channel → JMS T2's phase two (router.channel.txdelivery, router.channel.inflight,
router.bridge.txout): the proxy's destroy and the node's stop wait (bounded) for the proxy's completer, so they
never delete the proxy or close the broker connection under a committing T2; what does not end in time is left to
recovery with its COMMIT record, never reported discarded. Twins only (test_t2_out's rig)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from router.channel import txdelivery as TX
from router.channel.boundary import Outcome
from router.channel.inflight import Flight
from tests.unit.test_t2_out import FakeConn, GatedCommit, Rig


class TeardownStore:
    """The store as a proxy's teardown uses it, recording when the proxy's rows were deleted."""

    def __init__(self, inner: Any, order: list[str]) -> None:
        self.inner, self.order = inner, order
        self.ledger = inner.ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def delete_proxy(self, conn: Any, cid: int, side: str, aid: int, pid: int) -> None:
        self.order.append("proxy deleted")


class Db:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def branch(self) -> Any:
        return self.inner.branch()

    @contextmanager
    def unit_of_work(self) -> Iterator[FakeConn]:
        yield self.inner.conn


def test_a_proxy_teardown_waits_for_the_phase_two_of_a_decided_t2(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy is destroyed while its decided T2's broker COMMIT is held: the teardown deletes the proxy's rows
    only after that phase two ended (before the fix it deleted them at once, under the committing T2)."""
    rig = Rig(monkeypatch, events=2)
    order: list[str] = []
    gated = GatedCommit(rig)
    inner_commit = gated.inner

    def commit_and_note(transaction: str) -> None:
        inner_commit(transaction)
        order.append("broker committed")

    gated.inner = commit_and_note
    proxy = rig.proxy
    proxy.push_flight = Flight()
    proxy.rt.store = TeardownStore(proxy.rt.store, order)
    proxy.rt.db = Db(proxy.rt.db)
    proxy.rt.shutting_down = threading.Event()
    rig.put(1, 2)
    assert proxy._deliver(proxy.queue.take(2)) is Outcome.DELIVERED       # decided; phase two held at COMMIT
    assert gated.entered.wait(10)
    assert proxy.push_flight.holding() == 2
    teardown = threading.Thread(target=proxy._delete_row, args=(False,))
    teardown.start()
    teardown.join(0.5)               # the gate is closed: with the fix the teardown cannot have finished
    gated.gate.set()
    teardown.join(30)
    assert not teardown.is_alive()
    assert order == ["broker committed", "proxy deleted"]
    assert proxy._stuck == (), "a decided T2's entries are never recorded as stuck (discarded)"
    assert TX.state(proxy).committed == 1 and proxy.push_flight.holding() == 0
    assert rig.t2.log.live() == {}


def test_a_teardown_that_stops_waiting_leaves_the_t2_to_recovery_and_reports_nothing_discarded(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Past its bound the teardown goes on; the held entries are not returned as stuck (their T2 is decided
    COMMIT: recovery finishes it from the COMMIT record, which stays in the log until phase two ends)."""
    rig = Rig(monkeypatch, events=2)
    gated = GatedCommit(rig)
    proxy = rig.proxy
    proxy.push_flight = Flight()
    monkeypatch.setattr(TX, "PHASE_TWO_WAIT_S", 0.0)
    rig.put(1, 2)
    assert proxy._deliver(proxy.queue.take(2)) is Outcome.DELIVERED
    assert gated.entered.wait(10)
    assert proxy.push_flight.wait_ended(0.0) == []
    assert "recovery finishes them" in caplog.text
    decided = [g for g, t in rig.t2.log.live().items() if t.commit is not None]
    assert len(decided) == 1, "the COMMIT record stays live for recovery"
    gated.gate.set()
    assert TX.drain(proxy, 10)
    assert proxy.push_flight.holding() == 0 and rig.t2.log.live() == {}


# ------------------------------------------------------------------------------------------------ node stop
def _bridge(rig: Rig) -> Any:
    """A BridgeImpl as its halt (the node's stop) uses it, over the rig's participant and memory transport."""
    from router.bridge.bridge import BridgeImpl

    bridge: Any = object.__new__(BridgeImpl)
    bridge.id, bridge.stop_event, bridge.transport = 3, threading.Event(), rig.transport
    bridge.t2_out, bridge._transport_lock, bridge._t2_alt = rig.out, threading.Lock(), None
    return bridge


def test_a_node_stop_waits_for_a_decided_t2s_phase_two_before_closing_the_broker_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The node stops (BridgeFactoryImpl.shutdown: each bridge's halt) while a decided T2's broker COMMIT is
    held: the bridge closes its connection only after that COMMIT, so the T2 commits at the broker and ENDs.
    Before the fix the connection closed under the COMMIT: the T2 ended COMMIT_PENDING and recovery re-sent it
    at the next start (a duplicate whenever the broker had committed)."""
    rig = Rig(monkeypatch, events=2)
    gated = GatedCommit(rig)
    bridge = _bridge(rig)
    rig.put(1, 2)
    assert rig.proxy._deliver(rig.proxy.queue.take(2)) is Outcome.DELIVERED
    assert gated.entered.wait(10)
    halt = threading.Thread(target=bridge.halt)
    halt.start()
    halt.join(0.5)                   # the gate is closed: with the fix the halt cannot have closed anything yet
    gated.gate.set()
    halt.join(30)
    assert not halt.is_alive() and TX.drain(rig.proxy, 10)
    assert rig.bodies("out") == ["event 1", "event 2"]
    st = TX.state(rig.proxy)
    assert (st.committed, st.phase_two_failed) == (1, 0)
    assert rig.t2.log.live() == {}, "ENDed: nothing for recovery to re-send"
    assert not rig.transport.is_connected(), "the halt closed the connection afterwards"


def test_a_stopping_bridge_admits_no_new_t2(monkeypatch: pytest.MonkeyPatch) -> None:
    """After quiesce a new T2 is refused as an outage: rolled back, its events stay queued, nothing counts
    against them."""
    rig = Rig(monkeypatch, events=2)
    assert rig.out.quiesce(0.0)
    rig.put(1, 2)
    assert rig.proxy._deliver(rig.proxy.queue.take(2)) is Outcome.RETRY
    assert "stopping" in TX.state(rig.proxy).last_rollback
    assert [e.record.seq for e in rig.proxy.queue.take(5)] == [1, 2]
    assert rig.bodies("out") == []


# --------------------------------------------------------------------------------------- two connections
def test_consecutive_t2s_alternate_between_the_two_connections_and_commit_in_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """T2 1 goes out on the second connection, T2 2 on the first: T2 2's BEGIN and SENDs reach the broker while
    T2 1's COMMIT is held on the other connection, and the broker still commits T2 1's batch first."""
    from router.jms.memory.transport import MemoryTransport
    from router.mapping.stomp_codec import StompCodec

    rig = Rig(monkeypatch, events=2)
    alt = MemoryTransport(broker=rig.broker, codec=StompCodec())
    alt.connect()
    order: list[str] = []
    hold = threading.Event()
    entered = threading.Event()
    inner_commit = alt.commit

    def held_commit(transaction: str) -> None:
        entered.set()
        assert hold.wait(10)
        inner_commit(transaction)
        order.append("T2 1 committed")

    alt.commit = held_commit                  # type: ignore[method-assign]
    inner_begin = rig.transport.begin

    def noted_begin() -> str:
        order.append("T2 2 began on the first connection")
        return inner_begin()

    rig.transport.begin = noted_begin         # type: ignore[method-assign]
    rig.out.alt_transport = lambda: alt
    rig.put(1, 2, 3, 4)
    assert rig.proxy._deliver(rig.proxy.queue.take(2)) is Outcome.DELIVERED     # T2 1, on the second connection
    assert entered.wait(10)
    assert rig.proxy._deliver(rig.proxy.queue.take(2)) is Outcome.DELIVERED     # T2 2 decided meanwhile
    assert order == ["T2 2 began on the first connection"]
    hold.set()
    assert TX.drain(rig.proxy, 10)
    assert order == ["T2 2 began on the first connection", "T2 1 committed"]
    assert rig.bodies("out") == ["event 1", "event 2", "event 3", "event 4"]
    assert TX.state(rig.proxy).committed == 2 and rig.t2.log.live() == {}
