"""Idle JMS → channel bridges do not starve the node's PostgreSQL pool (review finding on ``local_round``).

A node with a pool of 2 connections (``NSJMS_POSTGRES_POOL_SIZE=2``) runs more idle inbound bridges into
Persistent channels than it has connections, in both styles that route in-process (the bridge pushes into the
channel's proxy: the push loop's local round; the channel's pull proxy pulls from the bridge: the driver's local
round) and one with EnableTransaction (a T2 round). Before the fix each idle round held a pooled connection while
it waited for JMS, so the pool was always checked out by bridges that had nothing to store. Now other persistent
traffic flows as it does without them: every event a supplier pushes reaches its consumer, no pooled checkout
ever times out, and the bridges still forward what arrives later. Conditions are polled; nothing is timed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idl.generated import CosBridgeAdmin as BA

from bridgekit import (
    bridge_factory,
    channel_ep,
    jms_ep,
    node_status,
    persistent_channel,
    stomp_produce,
    structured_consumer,
    t2_channel,
    unique_name,
)
from conftest import NsjmsServer, started_node
from stdclients import Form, PushSupplierClient, Style, make_event, obtain_proxy_consumer, wait_until

pytestmark = pytest.mark.integration

POOL = 2
EVENTS = 40
WAIT_S = 120.0
IDLE_WAIT_S = 30.0        # many status snapshots (one each 2 s)


@pytest.fixture
def small_pool_node(tmp_path: Path, fresh_db: str, broker_url: str,
                    monkeypatch: pytest.MonkeyPatch) -> Iterator[NsjmsServer]:
    monkeypatch.setenv("NSJMS_POSTGRES_POOL_SIZE", str(POOL))
    with started_node(tmp_path / "state", fresh_db, broker_url) as server:
        yield server


def _store(server: NsjmsServer) -> dict[str, Any]:
    return dict(node_status(server).get("store") or {})


def _nobody_waits(server: NsjmsServer) -> Callable[[], bool]:
    """True once a status snapshot written after this call shows no caller waiting for a pooled connection."""
    start = int(_store(server).get("pool_checkouts", -1))

    def check() -> bool:
        store = _store(server)
        return int(store.get("pool_checkouts", -1)) > start and store.get("pool_waiting") == 0

    return check


def test_idle_inbound_bridges_leave_the_pool_to_other_persistent_traffic(small_pool_node: NsjmsServer,
                                                                         client_orb: Any) -> None:
    server = small_pool_node
    factory = client_orb.factory(server.ior())
    bf = bridge_factory(client_orb, server)
    bridges: list[tuple[Any, str, Any]] = []        # (bridge, queue, consumer of its channel)
    for style in (BA.PUSH, BA.PULL, BA.PUSH, BA.PULL, BA.PUSH):
        channel, cid = persistent_channel(factory)
        queue = unique_name("idle.in")
        bridge, _ = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, style, BA.STRUCTURED_EVENT))
        bridges.append((bridge, queue, structured_consumer(channel)))
    channel, cid = t2_channel(factory, events=1)     # a T2 round (EnableTransaction TRUE, pull)
    queue = unique_name("idle.in.t2")
    bridge, _ = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, BA.PULL, BA.STRUCTURED_EVENT))
    bridges.append((bridge, queue, structured_consumer(channel)))
    assert len(bridges) > POOL
    try:
        for bridge, _, _ in bridges:
            bridge.start_bridge()
        # every bridge routes one message: their loops run (and are idle from now on)
        for _, queue, _ in bridges:
            stomp_produce(server.broker_url, queue, range(1))
        for _, queue, consumer in bridges:
            assert consumer.wait_for(1, WAIT_S), f"bridge from {queue} did not forward"

        # idle: no caller queues for a connection (before the fix, the idle rounds always had the pool checked out
        # and the others queued behind them: a status snapshot never saw an empty queue)
        assert wait_until(_nobody_waits(server), IDLE_WAIT_S), _store(server)

        # other persistent traffic: a supplier and a consumer on a Persistent channel of the same node
        channel, _ = persistent_channel(factory)
        consumer = structured_consumer(channel)
        proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
        supplier = PushSupplierClient(proxy, Form.STRUCTURED)
        supplier.connect()
        supplier.push_all([make_event(i) for i in range(EVENTS)])       # each push returns once it is durable
        assert consumer.wait_for(EVENTS, WAIT_S), f"{consumer.count()} of {EVENTS} delivered"
        # an admin operation needs the pool too
        factory.create_channel([], [])

        # the node's pool never made a caller give up: status.json written after the traffic says so
        before = int(_store(server).get("pool_checkouts", -1))
        assert wait_until(lambda: int(_store(server).get("pool_checkouts", -1)) > before, WAIT_S)
        store = _store(server)
        assert store["pool_timeouts"] == 0, store

        # the idle bridges still forward what arrives now
        for _, queue, _ in bridges:
            stomp_produce(server.broker_url, queue, range(1, 2))
        for _, queue, consumer in bridges:
            assert consumer.wait_for(2, WAIT_S), f"bridge from {queue}: {consumer.count()} of 2"
    finally:
        for bridge, _, _ in bridges:
            bridge.destroy()
