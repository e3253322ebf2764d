"""The bridge's second broker connection for channel → JMS T2s (``BridgeImpl._t2_transport``, used on every other
T2 by router.bridge.txout ``_pick``) when the broker refuses it: the T2s use the first connection, the second is
tried again at most every ``T2_ALT_RETRY_S`` (each failed attempt logged once with its reason, never the
credentials), and opening it never holds the lock the first connection's users take. A transport factory twin
that refuses (or blocks until released); a fake clock; no sleeps.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

from router.bridge import bridge as B
from router.bridge import brokerlink
from router.jms.transport import BrokerUnavailable

SECRET = "s3cret-passcode"


class Twin:
    """A broker connection: ``connect`` blocks on ``gate`` when one is given, or raises ``refuse``."""

    def __init__(self, name: str, refuse: Exception | None = None, gate: threading.Event | None = None,
                 entered: threading.Event | None = None) -> None:
        self.name, self.refuse, self.gate, self.entered = name, refuse, gate, entered
        self.closed = False

    def connect(self, retry: bool = True) -> None:
        if self.entered is not None:
            self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(30), "the test never released the connect"
        if self.refuse is not None:
            raise self.refuse

    def is_connected(self) -> bool:
        return not self.closed

    def close(self) -> None:
        self.closed = True


class Factory:
    """``open_transport``: the next connection is made by ``make`` (refusing by default); counts the opens."""

    def __init__(self) -> None:
        self.broker = B.BrokerSettings("stomp://127.0.0.1:1", login="bridge-user", passcode=SECRET)
        self.node_id = "node1"
        self.shutdown_event = threading.Event()
        self.opens: list[str] = []
        self.make: Callable[[], Twin] = lambda: Twin(
            "t2b", refuse=BrokerUnavailable("the broker refused the connection: too many"))

    def open_transport(self, url: str, **kw: Any) -> Twin:
        self.opens.append(kw["client_id"])
        return self.make()


def _bridge(factory: Factory, main: Twin) -> Any:
    bridge: Any = object.__new__(B.BridgeImpl)
    bridge.id, bridge.factory, bridge.transport = 4, factory, main
    bridge.stop_event, bridge._transport_lock, bridge._t2_alt = threading.Event(), threading.Lock(), None
    bridge._t2_alt_warned = False                # what __init__ set before the back-off (kept for the before-run)
    return bridge


def test_a_refused_second_connection_is_retried_at_most_every_back_off_period(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    clock = {"now": 1000.0}
    monkeypatch.setattr(brokerlink, "_now", lambda: clock["now"])
    factory, main = Factory(), Twin("main")
    bridge = _bridge(factory, main)
    with caplog.at_level(logging.WARNING, logger="nsjms.bridge"):
        for _ in range(5):                                  # five T2s at once: one open, all on the first one
            assert bridge._t2_transport() is main
        assert factory.opens == ["nsjms-node1-bridge-4-t2b"]
        clock["now"] += brokerlink.T2_ALT_RETRY_S - 0.5
        assert bridge._t2_transport() is main and len(factory.opens) == 1
        clock["now"] += 1.0                                 # the back-off period is over: tried (and logged) again
        assert bridge._t2_transport() is main and bridge._t2_transport() is main
        assert len(factory.opens) == 2
    failures = [r.getMessage() for r in caplog.records if "no second broker connection" in r.getMessage()]
    assert len(failures) == 2, "each failed attempt is logged, at most once per back-off period"
    assert all("too many" in m for m in failures), "with the reason"
    assert SECRET not in caplog.text
    clock["now"] += brokerlink.T2_ALT_RETRY_S + 1.0                  # the broker takes it now
    alt = Twin("t2b")
    factory.make = lambda: alt
    assert bridge._t2_transport() is alt and bridge._t2_transport() is alt
    assert len(factory.opens) == 3


def test_opening_the_second_connection_never_holds_the_first_connections_lock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(brokerlink, "_now", lambda: 1000.0)
    factory, main = Factory(), Twin("main")
    gate, entered = threading.Event(), threading.Event()
    factory.make = lambda: Twin("t2b", refuse=BrokerUnavailable("refused"), gate=gate, entered=entered)
    bridge = _bridge(factory, main)
    got: list[Any] = []
    opener = threading.Thread(target=lambda: got.append(bridge._t2_transport()), daemon=True)
    opener.start()
    try:
        assert entered.wait(30), "the second connection's connect began"
        # the first connection's users are not blocked by the open in progress (before the fix the lock was held
        # through open_transport + connect, here until the gate opens)
        assert bridge._transport_lock.acquire(timeout=10), "the open held the transport lock"
        bridge._transport_lock.release()
        assert bridge._transport() is main
        assert bridge._t2_transport() is main, "a T2 meanwhile uses the first connection, no second open"
        assert len(factory.opens) == 1
    finally:
        gate.set()
        opener.join(30)
    assert not opener.is_alive() and got == [main]


def test_a_second_connection_opened_while_the_bridge_stopped_is_closed_not_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(brokerlink, "_now", lambda: 1000.0)
    factory, main = Factory(), Twin("main")
    bridge = _bridge(factory, main)
    alt = Twin("t2b")

    def make() -> Twin:
        bridge.stop_event.set()                             # halt / stop while the connection is being opened
        return alt

    factory.make = make
    assert bridge._t2_transport() is main
    assert alt.closed and bridge._t2_alt is None


def test_any_failure_to_open_the_second_connection_leaves_it_closed_and_retried_later(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Not only a TransportError: an open that fails otherwise (here no thread for its dispatcher) must not leave
    the 'opening' flag set forever (the second connection was then never tried again) nor the half-made
    connection open."""
    clock = {"now": 1000.0}
    monkeypatch.setattr(brokerlink, "_now", lambda: clock["now"])
    factory, main = Factory(), Twin("main")
    made: list[Twin] = []

    def failing() -> Twin:
        made.append(Twin("t2b", refuse=RuntimeError("can't start new thread")))
        return made[-1]

    factory.make = failing
    bridge = _bridge(factory, main)
    assert bridge._t2_transport() is main
    assert made[0].closed, "the half-made connection is closed"
    clock["now"] += brokerlink.T2_ALT_RETRY_S + 1.0
    alt = Twin("t2b")
    factory.make = lambda: alt
    assert bridge._t2_transport() is alt, "tried again after the back-off period"
    assert len(factory.opens) == 2
