"""A JMS → channel bridge resuming after a node restart while its channel's pull thread already pulls from it.

After a restart the channel restores its pull proxy before the bridges resume, so the proxy's pull thread may
subscribe the bridge's flow (``JmsToChannel.ensure_subscribed``: the subscribe lock, then the bridge's transport)
while ``BridgeImpl._start`` (the bridge's lock held) opens the transport and then subscribes. With both orders on
the bridge's lock the node never got ready (the issue 8 crash loop under CI load: "bridge 0/1 started", then
nothing). The interleaving is forced here with events, no sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from router.bridge import bridge as B
from router.bridge import brokerlink
from router.bridge import flows as F
from router.bridge.store import BridgeRow
from router.jms.transport import ConnectionState

WAIT_S = 10.0


class _Transport:
    def __init__(self) -> None:
        self.subscribes = 0

    def connect(self, retry: bool = True) -> None:
        pass

    def is_connected(self) -> bool:
        return True

    def subscribe(self, *args: Any, **kwargs: Any) -> str:
        self.subscribes += 1
        return "subscription"


class _Db:
    @contextmanager
    def unit_of_work(self) -> Iterator[None]:
        yield None


def _bridge(open_transport: Any) -> B.BridgeImpl:
    bridge = B.BridgeImpl.__new__(B.BridgeImpl)
    bridge.id, bridge.destroyed, bridge.started = 2, False, False
    bridge._lock = threading.RLock()
    bridge._transport_lock = threading.Lock()
    bridge.transport = None
    bridge.row = BridgeRow(2, {}, {}, "stopped", 1, None, None, {})
    bridge.broker_state = ConnectionState.DISCONNECTED
    bridge.source = bridge.sink = None                              # type: ignore[assignment]
    store = type("Store", (), {"set_state": staticmethod(lambda conn, bid, state: None)})()
    broker = B.BrokerSettings("stomp://127.0.0.1:1")
    bridge.factory = type("Factory", (), {"rt": type("Rt", (), {"db": _Db()})(), "store": store, "broker": broker,
                                          "node_id": "node1", "shutdown_event": threading.Event(),
                                          "open_transport": staticmethod(open_transport),
                                          "_channel_exists": None, "_channel_persistent": None})()
    bridge._channel = lambda: None                                  # type: ignore[method-assign]
    bridge._connect_channel = lambda: None                          # type: ignore[method-assign]
    bridge._start_workers = lambda: None                            # type: ignore[method-assign]
    bridge._ensure_supervisor = lambda: None                        # type: ignore[method-assign]
    return bridge


def test_start_and_a_pull_thread_subscribing_at_once_do_not_deadlock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(B, "check_pair", lambda *args: [])
    pull_subscribing = threading.Event()     # the pull thread holds the flow's subscribe lock
    start_holds_lock = threading.Event()     # _start holds the bridge's lock (it is opening the transport)
    transport = _Transport()

    def open_transport(*args: Any, **kwargs: Any) -> _Transport:
        start_holds_lock.set()
        return transport

    bridge = _bridge(open_transport)

    def subscribe() -> Any:                  # BridgeImpl._subscribe: the bridge's transport, then SUBSCRIBE
        pull_subscribing.set()
        assert start_holds_lock.wait(WAIT_S)
        return bridge._transport().subscribe(None)  # type: ignore[arg-type]

    bridge.flow_in = F.JmsToChannel(bridge, brokerlink.LazyTransport(bridge), lambda m: m, None,  # type: ignore[arg-type]
                                    subscribe)
    puller = threading.Thread(target=bridge.flow_in.ensure_subscribed, daemon=True)
    puller.start()
    assert pull_subscribing.wait(WAIT_S)
    starter = threading.Thread(target=bridge._start, daemon=True)
    starter.start()
    starter.join(WAIT_S)
    puller.join(WAIT_S)
    assert not starter.is_alive() and not puller.is_alive(), \
        "deadlock: _start waits for the subscribe lock, the pull thread for the bridge's lock"
    assert bridge.started and transport.subscribes == 1 and bridge.flow_in.subscription == "subscription"
