"""Failure behaviour of the bridge: the broker killed and restarted mid-stream (both directions), the node SIGKILLed
mid-stream. Every event/message is counted at the far end by content id.

Each broker test runs its own ActiveMQ (:class:`router.node.services.EmbeddedActiveMQ` on free ports, own state dir) and
a node started with that broker's URL; the broker is SIGKILLed (no clean shutdown) and started again on the same
directory and ports, so what it had confirmed is still in its store.

The rules asserted, and why duplicates can happen at all (the *unknown-outcome window*):

* **0 lost**: every id reaches the far end.
* **Channel → JMS, broker killed**: an event leaves the channel only after the broker's RECEIPT for the COMMIT of
  the STOMP transaction carrying it. The channel hands its queue to the bridge of the same node in batches of at
  most :data:`~router.channel.localpush.STRUCTURED_BATCH` events, one transaction each, and writes a batch's
  COMMIT only after the previous one's receipt (issue 12): the one COMMIT in flight when the broker dies has an
  unknown outcome (it may have been stored without its receipt coming back), and that batch goes back to the
  queue and is sent again, so at most **one batch** of duplicates per outage.
* **JMS → channel, broker killed**: the bridge acks a message after the channel accepted its event and remembers
  the message ids it forwarded. Acks lost with the broker make the broker deliver those messages again after its
  restart (without a reliable ``redelivered`` flag); the bridge recognises them by message id, so **0**
  duplicates reach the channel.
* **Node SIGKILLed, channel → JMS**: a batch the broker committed whose events the killed channel had not yet
  journaled as delivered (the receipt of its COMMIT in flight, or just arrived) is sent again after the restart;
  the next batch's COMMIT is written only after that journal write, so that is at most one batch. Add the
  supplier's own in-flight push (it may have been stored before the kill; it is pushed again after the restart,
  as in the channel crash test): at most **one batch + 1** duplicates.
"""

from __future__ import annotations

import collections
import json
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from omniORB import CORBA

import CosNotification

from idl.generated import CosBridgeAdmin as BA
from idl.generated import NsjmsAdmin
from router.channel.localpush import STRUCTURED_BATCH

from bridgekit import channel_ep, inbox_count, jms_ep, pg_scalar, reconnect_client
from conftest import Rig
from stdclients import (
    Form,
    PushSupplierClient,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    make_event,
    obtain_proxy_consumer,
    obtain_proxy_supplier,
    prop,
    short,
    wait_until,
)

pytestmark = pytest.mark.integration

N = 600
KILL_AT = 150
TIMEOUT_S = 90.0
BATCH = STRUCTURED_BATCH  # events per STOMP transaction from the channel to its bridge, at most
NODE_KILL_DUPS = BATCH + 1  # see the module docstring
PERSISTENT = CosNotification.Persistent


def _persistent_channel(factory: Any) -> tuple[Any, int]:
    qos = [prop("EventReliability", short(PERSISTENT)), prop("ConnectionReliability", short(PERSISTENT))]
    return factory.create_channel(qos, [])


def _status(bridge: Any) -> Any:
    return bridge._narrow(NsjmsAdmin.ManagedBridge).get_status()


@dataclass
class Supplier:
    """Pushes events 0..N-1 one by one (a little paced), recording which pushes returned OK."""

    client: PushSupplierClient
    pace_s: float = 0.0
    accepted: list[int] = field(default_factory=list)
    in_flight: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, ids: range) -> None:
        for i in ids:
            try:
                self.client.push_one(make_event(i, reliability=PERSISTENT))
            except CORBA.SystemException:
                self.in_flight = i
                return
            with self.lock:
                self.accepted.append(i)
            if self.pace_s:
                time.sleep(self.pace_s)

    def count(self) -> int:
        with self.lock:
            return len(self.accepted)


def _supplier(channel: Any, pace_s: float) -> Supplier:
    proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
    client = PushSupplierClient(proxy, Form.STRUCTURED)
    client.connect()
    return Supplier(client, pace_s)


def _ids_from_java(messages: list[dict[str, Any]]) -> collections.Counter[int]:
    return collections.Counter(int(m["properties"]["$event_name"]["value"][1:]) for m in messages)


def _assert_counts(counts: collections.Counter[int], max_dups: int, what: str) -> int:
    lost = sorted(set(range(N)) - set(counts))
    assert not lost, f"{what}: lost {len(lost)}, e.g. {lost[:10]}"
    assert set(counts) <= set(range(N)), f"{what}: unknown ids"
    dups = sum(c - 1 for c in counts.values())
    assert dups <= max_dups, f"{what}: {dups} duplicates, more than the unknown-outcome window allows ({max_dups})"
    return dups


def _active(rig: Rig) -> bool | None:
    """The only bridge's ``active`` flag in the node's ``status.json`` (None until it is listed)."""
    try:
        data = json.loads((rig.server.state_dir / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    bridges = data.get("bridges", [])
    return bool(bridges[0]["active"]) if bridges else None


def _broker_outage(rig: Rig, bridge: Any, progress: Any) -> None:
    """Kill the broker once ``progress() >= KILL_AT``; check Inactive while down, restart, check Active. The
    administrative state (``get_status``) stays ``started`` throughout."""
    assert wait_until(lambda: progress() >= KILL_AT, TIMEOUT_S), f"no progress: {progress()}"
    rig.kill_broker()
    assert progress() < N, "the kill did not land mid-stream"
    assert wait_until(lambda: _active(rig) is False, 30), "Inactive while the broker is down"
    assert _status(bridge) == NsjmsAdmin.started
    rig.broker.start()
    assert wait_until(lambda: _active(rig) is True, 90), "Active again after the restart"


def test_broker_restart_channel_to_jms(rig: Rig) -> None:
    channel, cid = _persistent_channel(rig.factory)
    queue = "faults.out"
    bridge, _ = rig.bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, queue))
    bridge.start_bridge()
    supplier = _supplier(channel, 0.01)
    pushing = threading.Thread(target=supplier.run, args=(range(N),), daemon=True)
    pushing.start()
    _broker_outage(rig, bridge, supplier.count)
    pushing.join(TIMEOUT_S)
    assert supplier.in_flight is None and supplier.count() == N, "the channel accepts events while the broker is away"
    got = rig.java.consume("queue", queue, 2 * N, 20)
    dups = _assert_counts(_ids_from_java(got), BATCH, "channel -> JMS across a broker restart")
    print(f"channel -> JMS, broker killed: {len(got)} messages for {N} events, {dups} duplicate(s)")


def test_broker_restart_jms_to_channel(rig: Rig) -> None:
    channel, cid = _persistent_channel(rig.factory)
    queue = "faults.in"
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
    consumer = StructuredPushConsumer()
    connect_push_consumer(proxy, Form.STRUCTURED, consumer)
    rig.java.produce("queue", queue, N, "text")
    bridge, bid = rig.bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid))
    bridge.start_bridge()
    _broker_outage(rig, bridge, consumer.count)
    assert consumer.wait_for(N, TIMEOUT_S), f"{consumer.count()} of {N}"
    # no more can come: every message is in the inbox (a redelivery is acknowledged without an event) and the
    # channel holds nothing more for the consumer
    dsn = rig.server.pg_dsn
    assert wait_until(lambda: inbox_count(dsn, bid) >= N
                      and pg_scalar(dsn, "SELECT count(*) FROM nsjms_queue WHERE channel_id = %s", cid) == 0,
                      TIMEOUT_S), (inbox_count(dsn, bid), consumer.count())
    counts = collections.Counter(int({p.name: p.value.value() for p in ev.filterable_data}["n"])
                                 for ev in consumer.snapshot())
    dups = _assert_counts(counts, 0, "JMS -> channel across a broker restart")
    print(f"JMS -> channel, broker killed: {sum(counts.values())} events for {N} messages, {dups} duplicate(s)")


def test_node_sigkill_channel_to_jms(rig: Rig) -> None:
    channel, cid = _persistent_channel(rig.factory)
    queue = "faults.node"
    bridge, _ = rig.bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, queue))
    bridge.start_bridge()
    supplier = _supplier(channel, 0.0)
    pushing = threading.Thread(target=supplier.run, args=(range(N),), daemon=True)
    pushing.start()
    assert wait_until(lambda: supplier.count() >= KILL_AT, TIMEOUT_S)
    rig.server.kill(signal.SIGKILL)
    pushing.join(30)
    assert supplier.count() < N, "the kill did not land mid-stream"
    rig.server.restart()
    reconnect_client(supplier.client.proxy, bridge)
    rest = sorted(set(range(N)) - set(supplier.accepted))
    for i in rest:                             # the supplier re-pushes what was not confirmed, same proxy reference
        supplier.client.push_one(make_event(i, reliability=PERSISTENT))
    assert wait_until(lambda: _active(rig) is True, 30), "the bridge resumes after the restart"
    got = rig.java.consume("queue", queue, 2 * N, 20)
    dups = _assert_counts(_ids_from_java(got), NODE_KILL_DUPS, "channel -> JMS across a node SIGKILL")
    print(f"channel -> JMS, node killed: {len(got)} messages for {N} events, {dups} duplicate(s)")
