"""A full broker store against a real ActiveMQ and a real node (issue 31, "a full broker store deletes accepted
events"): a resource refusal is an outage, never a refusal of the events.

The broker of this test has a tiny store (``<storeUsage limit="4 mb">``, KahaDB journal files of 1 MB, cleaned up
every second) and ``sendFailIfNoSpace="true"``, so once an independent stomp.py producer has filled it with a
filler queue, every persistent SEND is answered at once with ``ERROR javax.jms.ResourceAllocationException:
Persistent store is Full, …`` (the dead letter's too). Events pushed by a standard CORBA supplier into a Persistent
channel with a channel → JMS bridge (with and without T2) must then: stay in the channel (their ``nsjms_queue`` rows
all there), not be dead-lettered (nothing on ``nsjms.DLQ``), and the bridge's status must say why; once the filler
queue is consumed (space freed) every event arrives at an independent stomp.py consumer: 0 lost.

Before the fix the refusals were taken as refusals of the events: without T2 each was dead-lettered (or, the
dead letter refused too, retried), with T2 the events were isolated one per T2 and after 3 tries their rows deleted.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import stomp

import CosNotification

from idl.generated import CosBridgeAdmin as BA
from router.channel.boundary import POISON_ATTEMPTS
from router.node.services import EmbeddedActiveMQ

from bridgekit import (
    bridge_factory,
    bridge_status,
    channel_ep,
    jms_ep,
    managed_bridge,
    node_status,
    persistent_channel,
    pg_scalar,
    structured_supplier,
)
from conftest import ClientOrb, NsjmsServer, free_port, own_broker
from stdclients import make_event, wait_until

pytestmark = pytest.mark.integration

EVENTS = 20
TIMEOUT_S = 90.0
FILLER_BYTES = 64 * 1024

#: A store that fills after a few MB, refuses at once (no blocking), and gives space back within seconds.
SYSTEM_USAGE = """        <systemUsage>
            <systemUsage sendFailIfNoSpace="true">
                <memoryUsage><memoryUsage limit="64 mb"/></memoryUsage>
                <storeUsage><storeUsage limit="4 mb"/></storeUsage>
                <tempUsage><tempUsage limit="64 mb"/></tempUsage>
            </systemUsage>
        </systemUsage>
"""


class FullStoreBroker(EmbeddedActiveMQ):
    """The node's broker configuration with a 4 MB store limit, ``sendFailIfNoSpace`` and small journal files."""

    def _instance_xml(self) -> str:
        xml = super()._instance_xml()
        kahadb = '<kahaDB directory="${activemq.base}/data/kahadb"/>'
        assert kahadb in xml, "the embedded broker's kahaDB element changed: adapt this fixture"
        xml = xml.replace(kahadb, '<kahaDB directory="${activemq.base}/data/kahadb" journalMaxFileLength="1mb" '
                                  'checkpointInterval="500" cleanupInterval="500"/>', 1)
        return xml.replace("        <transportConnectors>", SYSTEM_USAGE + "        <transportConnectors>", 1)


@pytest.fixture(scope="module")
def full_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedActiveMQ]:
    """One broker for the module (each test fills its store, then frees it)."""
    with own_broker(tmp_path_factory.mktemp("full-amq"), FullStoreBroker) as broker:
        yield broker


@dataclass
class Node:
    server: NsjmsServer
    factory: Any
    bf: Any
    broker: EmbeddedActiveMQ


@pytest.fixture
def full_rig(tmp_path: Path, fresh_db: str, client_orb: ClientOrb, full_broker: EmbeddedActiveMQ) -> Iterator[Node]:
    """A node of its own (database ``fresh_db``) on the module's full-store broker."""
    state = tmp_path / "state"
    state.mkdir()
    server = NsjmsServer(state_dir=state, pg_dsn=fresh_db, broker_url=full_broker.url, port=free_port())
    try:
        server.start()
        yield Node(server, client_orb.factory(server.ior()), bridge_factory(client_orb, server), full_broker)
    finally:
        server.stop()


class Collector(stomp.ConnectionListener):  # type: ignore[misc]
    """An independent stomp.py client: every MESSAGE and ERROR frame it gets, by destination."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages: list[Any] = []
        self.errors: list[str] = []
        self.receipts: set[str] = set()

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.messages.append(frame)

    def on_error(self, frame: Any) -> None:
        with self.lock:
            self.errors.append(frame.headers.get("message", ""))

    def on_receipt(self, frame: Any) -> None:
        with self.lock:
            self.receipts.add(frame.headers.get("receipt-id", ""))

    def names(self, destination: str) -> list[str]:
        with self.lock:
            return [m.headers.get("$event_name", "") for m in self.messages
                    if m.headers.get("destination") == destination]


def _connect(url: str) -> tuple[stomp.Connection12, Collector]:
    host, port = url.removeprefix("stomp://").split(":")
    conn = stomp.Connection12([(host, int(port))], auto_decode=False)
    listener = Collector()
    conn.set_listener("c", listener)
    conn.connect(wait=True)
    return conn, listener


def _fill(url: str, queue: str) -> int:
    """Send persistent filler messages (receipted, one at a time) until the broker refuses one for its full store;
    how many it took."""
    conn, got = _connect(url)
    body = b"x" * FILLER_BYTES
    try:
        for i in range(2000):
            rid = f"fill-{i}"
            conn.send(f"/queue/{queue}", body, headers={"persistent": "true", "receipt": rid})
            assert wait_until(lambda rid=rid: rid in got.receipts or bool(got.errors), 30), "no answer to a SEND"
            if got.errors:
                assert "Persistent store is Full" in got.errors[0], got.errors
                return i
        raise AssertionError("the store never filled")
    finally:
        conn.disconnect()


def _drain(url: str, queue: str, expected: int) -> None:
    """Consume the filler queue (auto ack): the broker's store gets its space back."""
    conn, got = _connect(url)
    try:
        conn.subscribe(f"/queue/{queue}", id="drain", ack="auto")
        assert wait_until(lambda: len(got.messages) >= expected, TIMEOUT_S), f"{len(got.messages)} of {expected}"
    finally:
        conn.disconnect()


def _log(rig: Node) -> str:
    return rig.server.stderr_path.read_text(errors="replace")[-6000:]


def _queued(dsn: str, cid: int) -> int:
    return int(pg_scalar(dsn, "SELECT count(*) FROM nsjms_queue WHERE channel_id = %s", cid))


@pytest.mark.parametrize("t2", [False, True], ids=["batches", "t2"])
def test_a_full_store_is_an_outage_nothing_dead_lettered_nothing_deleted_nothing_lost(
        full_rig: Node, fresh_db: str, t2: bool) -> None:
    rig = full_rig
    url = rig.broker.url
    out, filler = f"full.out.{uuid.uuid4().hex[:8]}", f"full.filler.{uuid.uuid4().hex[:8]}"
    counter, seen = _connect(url)                     # the independent consumer, on the bridge's queue and the DLQs
    filled = 0
    try:
        for i, dest in enumerate((f"/queue/{out}", "/queue/nsjms.DLQ", "/queue/ActiveMQ.DLQ")):
            counter.subscribe(dest, id=f"count-{i}", ack="auto")
        filled = _fill(url, filler)
        assert filled > 10, f"the store filled after {filled} messages"

        channel, cid = persistent_channel(rig.factory)
        bridge, bid = rig.bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, out))
        if t2:
            managed_bridge(bridge).enable_transaction(5, 0)
        bridge.start_bridge()
        supplier = structured_supplier(channel)
        for i in range(EVENTS):
            supplier.push_one(make_event(i, reliability=CosNotification.Persistent))

        # the proxy keeps trying (T2s roll back / batches go back): past the attempts after which the old code gave
        # up on an event (POISON_ATTEMPTS), nothing may have left the channel
        def attempts() -> int:
            counts = [int(p.get("attempts", 0)) for ch in node_status(rig.server).get("channels", [])
                      if ch.get("id") == cid for p in ch.get("proxy_suppliers", [])]
            assert _queued(fresh_db, cid) == EVENTS, "events left the channel while the store was full"
            return max(counts, default=0)

        assert wait_until(lambda: attempts() >= 2 * POISON_ATTEMPTS + 2, TIMEOUT_S, interval=0.2), \
            node_status(rig.server).get("channels")

        def refused() -> bool:
            return "broker out of resources" in str(bridge_status(rig.server, bid).get("last_error") or "")

        assert wait_until(refused, TIMEOUT_S), \
            f"the bridge's status never said the broker is out of resources: {bridge_status(rig.server, bid)}\n" \
            f"{_log(rig)}"
        assert seen.names("/queue/nsjms.DLQ") == [] and seen.names("/queue/ActiveMQ.DLQ") == []
        assert seen.names(f"/queue/{out}") == []
        status = bridge_status(rig.server, bid)
        assert status.get("dead_lettered") == 0, status

        _drain(url, filler, filled)                   # space back: the events go out
        filled = 0
        want = sorted(f"e{i}" for i in range(EVENTS))
        assert wait_until(lambda: sorted(set(seen.names(f"/queue/{out}"))) == want, TIMEOUT_S), \
            sorted(set(seen.names(f"/queue/{out}")))
        assert wait_until(lambda: _queued(fresh_db, cid) == 0, TIMEOUT_S)
        assert seen.names("/queue/nsjms.DLQ") == [] and seen.names("/queue/ActiveMQ.DLQ") == []
    finally:
        counter.disconnect()
        if filled:                                    # failed while full: free the module's broker for the next test
            _drain(url, filler, filled)
