"""A topic source's broker connection carries heart-beats derived from the cluster lease (router.bridge.brokerlink,
docs/cluster.md "JMS side across nodes"): a paused owner's connection holds the durable subscription's client id
until the broker drops it for its missed heart-beats, so with the transport's 10 s (and its 5 s reconnect backoff)
a survivor resumed the subscription 26-29 s after the pause with a 4 s lease. Now: heart-beats of expiry_s / 2
(1 s .. 10 s) both ways, and reconnects at most 1 s apart, on that connection only."""

from __future__ import annotations

import threading
from typing import Any

from router.bridge import bridge as B
from router.bridge import brokerlink
from router.jms.model import Destination
from router.jms.retry import RECONNECT_POLICY


class _Twin:
    def connect(self, retry: bool = True) -> None:
        return None


class _Factory:
    def __init__(self, beat_ms: int) -> None:
        self.broker = B.BrokerSettings("stomp://127.0.0.1:1", sub_heartbeat_ms=beat_ms)
        self.node_id = "node1"
        self.shutdown_event = threading.Event()
        self.opened: list[dict[str, Any]] = []

    def open_transport(self, url: str, **kw: Any) -> _Twin:
        self.opened.append(kw)
        return _Twin()


def _bridge(factory: _Factory, destination: Destination, flow_in: Any) -> Any:
    bridge: Any = object.__new__(B.BridgeImpl)
    bridge.id, bridge.factory, bridge.transport = 4, factory, None
    bridge.destination, bridge.flow_in = destination, flow_in
    bridge.row = type("Row", (), {"settings": {}})()
    bridge._transport_lock = threading.Lock()
    bridge._on_broker_state = lambda state: None
    return bridge


def test_the_heart_beat_is_half_the_lease_expiry_within_the_transport_bounds() -> None:
    assert brokerlink.subscriber_heartbeat_ms(4) == 2_000        # the tests' lease
    assert brokerlink.subscriber_heartbeat_ms(20) == 10_000      # the default lease: the transport's default
    assert brokerlink.subscriber_heartbeat_ms(600) == 10_000
    assert brokerlink.subscriber_heartbeat_ms(1) == 1_000


def test_a_topic_source_connects_with_the_lease_heart_beat_and_a_short_reconnect_backoff() -> None:
    factory = _Factory(2_000)
    _bridge(factory, Destination("topic", "t"), flow_in=object())._transport()
    (opts,) = factory.opened
    assert opts["heartbeats"] == (2_000, 2_000)
    policy = opts["reconnect_policy"]
    assert policy is brokerlink.SUBSCRIBER_RECONNECT and policy.max_wait_s <= 1.0 < RECONNECT_POLICY.max_wait_s
    assert policy.max_total_s >= RECONNECT_POLICY.max_total_s, "as long a retry as the transport's"


def test_other_connections_keep_the_transport_defaults() -> None:
    for destination, flow_in in ((Destination("queue", "q"), object()), (Destination("topic", "t"), None)):
        factory = _Factory(2_000)
        _bridge(factory, destination, flow_in)._transport()
        (opts,) = factory.opened
        assert "heartbeats" not in opts and "reconnect_policy" not in opts
