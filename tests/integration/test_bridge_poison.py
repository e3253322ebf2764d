"""Poison messages and events against a real ActiveMQ and a real node: one message or event that can never be
delivered must not stall the traffic behind it and must leave a trace an operator can read.

JMS → channel (each case: a good message, the poison one, a good message; the good ones become events, the poison
one is dead-lettered to ``nsjms.DLQ`` with a readable ``nsjms_dlq_reason`` and acknowledged, so nothing of it is left
on the source queue):

* a header holding a NUL byte (a STOMP producer can send one; ActiveMQ passes it through unescaped and the MESSAGE
  frame arrives split in two);
* a deeply nested ``$nsjms_idl`` type manifest (``RecursionError`` inside the mapping);
* a negative ``expires`` (a past JMSExpiration: expired);
* a body just under the node's event size limit whose event exceeds it (``node.max_event_bytes``, set to 1 MiB for
  these nodes: the channel would refuse the event with IMP_LIMIT), and a body above the limit (refused by the
  mapping before an event is built); the same limit makes the channel refuse a larger push (checked directly);
* a Java MapMessage over a plain STOMP subscription (refused to ``ActiveMQ.DLQ``; the record saying why goes to
  ``nsjms.DLQ``).

Channel → JMS: a destination the broker refuses to write to (ActiveMQ authorization on a broker of this test)
answers each SEND with an ERROR frame; the events are dead-lettered with the broker's reason instead of being
retried forever.

The JMS -> channel cases and the direct push share one node (``module_server``, started with the 1 MiB limit): each
has its own channel, bridge and queue and reads only those (``nsjms.DLQ`` through a selector on its queue).
"""

from __future__ import annotations

import base64
import json
import socket
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp

import CosNotification

from idl.generated import CosBridgeAdmin as BA
from router.node.services import EmbeddedActiveMQ

from bridgekit import JavaTool, bridge_factory, channel_ep, jms_ep
from conftest import NsjmsServer, running_rig
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

TIMEOUT_S = 30.0
PERSISTENT = CosNotification.Persistent
LIMIT = 1024 * 1024          # node.max_event_bytes of the nodes of this module


@pytest.fixture(scope="module", autouse=True)
def _small_event_limit() -> Iterator[None]:
    """Every node of this module starts with ``NSJMS_NODE_MAX_EVENT_BYTES`` = 1 MiB (the servers inherit the
    environment): the one limit feeds the channel, the ORB, the bridge and the mapping. Module-scoped and autouse, so
    it is set before the module's shared node (``module_server``) starts."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NSJMS_NODE_MAX_EVENT_BYTES", str(LIMIT))
        yield


def _name(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


@pytest.fixture
def bf(module_server: NsjmsServer, client_orb: Any) -> Any:
    return bridge_factory(client_orb, module_server)


def _persistent_channel(factory: Any) -> tuple[Any, int]:
    qos = [prop("EventReliability", short(PERSISTENT)), prop("ConnectionReliability", short(PERSISTENT))]
    return factory.create_channel(qos, [])


def _consumer(channel: Any) -> StructuredPushConsumer:
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
    consumer = StructuredPushConsumer()
    connect_push_consumer(proxy, Form.STRUCTURED, consumer)
    return consumer


def _host_port(broker_url: str) -> tuple[str, int]:
    host, port = broker_url.removeprefix("stomp://").split(":")
    return host, int(port)


def _send_raw(broker_url: str, frames: list[bytes]) -> None:
    """Write SEND frames byte for byte (stomp.py cannot be told to put a NUL in a header), each with a receipt."""
    with socket.create_connection(_host_port(broker_url), timeout=10) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        _read_until(sock, b"CONNECTED")
        for i, frame in enumerate(frames):
            head, _, body = frame.partition(b"\n\n")
            sock.sendall(head + f"\nreceipt:r{i}".encode() + b"\n\n" + body + b"\x00")
            _read_until(sock, f"receipt-id:r{i}".encode())
        sock.sendall(b"DISCONNECT\n\n\x00")


def _read_until(sock: socket.socket, marker: bytes) -> None:
    got = b""
    while marker not in got:
        chunk = sock.recv(65536)
        assert chunk, f"the broker closed the connection before {marker!r}: {got[-500:]!r}"
        assert not got.startswith(b"ERROR"), got[:500]
        got += chunk


def _send(queue: str, mark: str, body: bytes, extra: bytes = b"") -> bytes:
    return (f"SEND\ndestination:/queue/{queue}\npersistent:true\nmark:{mark}\n".encode() + extra
            + f"content-length:{len(body)}".encode() + b"\n\n" + body)


def _deep_manifest(depth: int = 100_000) -> str:
    """A packed manifest whose type descriptor nests ``depth`` levels (a few hundred bytes once compressed)."""
    desc = "[" * depth + "]" * depth
    text = '{"v":1,"ohf":[],"fd":[["x",' + desc + ',["x"]]],"body":{"k":"none"}}'
    return "z:" + base64.b64encode(zlib.compress(text.encode(), 9)).decode()


def _poison(case: str, queue: str, broker_url: str, java_tool: JavaTool) -> None:
    """Send the poison message of ``case`` to ``queue``."""
    if case == "map-body":
        java_tool.produce("queue", queue, 1, "map")
        return
    if case == "nul-header":
        frame = _send(queue, "poison", b"poison", b"note:a\x00b\n")
    elif case == "deep-manifest":
        frame = _send(queue, "poison", b"poison", f"type:Structured Event\n$nsjms_idl:{_deep_manifest()}\n".encode())
    elif case == "negative-expires":
        frame = _send(queue, "poison", b"poison", b"expires:-5\n")
    elif case == "oversized-event":
        frame = _send(queue, "poison", b"x" * (LIMIT - 16))       # the body fits; the event around it does not
    elif case == "oversized-body":
        frame = _send(queue, "poison", b"x" * (3 * LIMIT))
    else:
        raise AssertionError(case)
    _send_raw(broker_url, [frame])


REASONS = {"nul-header": "NUL byte", "deep-manifest": "unmappable JMS message", "negative-expires": "expired",
           "oversized-event": f"event size limit is {LIMIT} bytes",
           "oversized-body": f"exceeds the limit of {LIMIT} bytes", "map-body": "Map/Stream/Object"}


@pytest.mark.parametrize("case", sorted(REASONS))
def test_a_poison_message_is_dead_lettered_and_the_good_ones_flow(module_server: NsjmsServer, bf: Any,
                                                                  shared_factory: Any, broker_url: str,
                                                                  java_tool: JavaTool,
                                                                  case: str) -> None:
    queue = _name(f"poison.{case}")
    channel, cid = _persistent_channel(shared_factory)
    consumer = _consumer(channel)
    bridge, _ = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid))
    bridge.start_bridge()
    _send_raw(broker_url, [_send(queue, "ok-1", b"first")])
    _poison(case, queue, broker_url, java_tool)
    _send_raw(broker_url, [_send(queue, "ok-2", b"second")])

    assert consumer.wait_for(2, TIMEOUT_S), f"{consumer.count()} events: the poison message stalled the bridge"
    marks = [{p.name: p.value.value() for p in ev.filterable_data}.get("mark") for ev in consumer.snapshot()]
    assert marks[:2] == ["ok-1", "ok-2"], marks
    dead = java_tool.consume("queue", "nsjms.DLQ", 1, TIMEOUT_S, f"nsjms_dlq_destination = '/queue/{queue}'")
    assert len(dead) == 1, f"no dead letter for the poison message ({case})"
    props = {k: v["value"] for k, v in dead[0]["properties"].items()}
    assert REASONS[case] in props["nsjms_dlq_reason"], props["nsjms_dlq_reason"]
    assert props["nsjms_dlq_message_id"].startswith("ID:"), props
    bridge.destroy()
    left = java_tool.consume("queue", queue, 1, 2)
    assert left == [], f"the poison message is still on {queue} (never acknowledged): {left}"
    assert consumer.count() == 2, "the poison message became an event"


def test_the_channel_refuses_a_push_above_the_node_limit(module_server: NsjmsServer, shared_factory: Any) -> None:
    """The same ``node.max_event_bytes`` is the channel's limit: a direct push above it is refused (IMP_LIMIT),
    one below it is delivered."""
    from omniORB import CORBA

    channel, _ = _persistent_channel(shared_factory)
    consumer = _consumer(channel)
    proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
    supplier = PushSupplierClient(proxy, Form.STRUCTURED)
    supplier.connect()
    big = make_event(1)
    big.remainder_of_body = CORBA.Any(CORBA.TC_string, "x" * (LIMIT + 1))
    with pytest.raises(CORBA.IMP_LIMIT):
        supplier.push_one(big)
    fits = make_event(2)
    fits.remainder_of_body = CORBA.Any(CORBA.TC_string, "x" * (LIMIT // 2))
    supplier.push_one(fits)
    assert consumer.wait_for(1, TIMEOUT_S)
    assert [ev.header.fixed_header.event_name for ev in consumer.snapshot()] == ["e2"]


# --------------------------------------------------------------------------------------- channel -> JMS
REFUSING_PLUGINS = """
        <plugins>
            <simpleAuthenticationPlugin anonymousAccessAllowed="true">
                <users><authenticationUser username="owner" password="owner-secret" groups="owners"/></users>
            </simpleAuthenticationPlugin>
            <authorizationPlugin>
                <map>
                    <authorizationMap>
                        <authorizationEntries>
                            <authorizationEntry queue="refused.>" read="owners" write="owners" admin="owners"/>
                            <authorizationEntry queue="nsjms.>" read="anonymous" write="anonymous" admin="anonymous"/>
                            <authorizationEntry queue="ActiveMQ.>" read="anonymous" write="anonymous"
                                                admin="anonymous"/>
                            <authorizationEntry topic="ActiveMQ.Advisory.>" read="anonymous" write="anonymous"
                                                admin="anonymous"/>
                        </authorizationEntries>
                    </authorizationMap>
                </map>
            </authorizationPlugin>
        </plugins>
"""


class RefusingBroker(EmbeddedActiveMQ):
    """A broker of this test whose authorization refuses anonymous writes to ``refused.*`` queues."""

    def _instance_xml(self) -> str:
        xml = super()._instance_xml()
        assert "<plugins>" not in xml, "the embedded broker config has plugins already: merge them here"
        return xml.replace("</broker>", REFUSING_PLUGINS + "    </broker>", 1)


@pytest.fixture
def refusing_node(tmp_path: Path, fresh_db: str, client_orb: Any, java_tool: JavaTool
                  ) -> Iterator[tuple[NsjmsServer, JavaTool]]:
    with running_rig(tmp_path, fresh_db, client_orb, java_tool, RefusingBroker) as rig:
        yield rig.server, rig.java


def test_events_the_broker_refuses_are_dead_lettered_not_retried_forever(
        refusing_node: tuple[NsjmsServer, JavaTool], client_orb: Any) -> None:
    """ActiveMQ answers each SEND to ``refused.out`` with an ERROR frame (not authorized). The bridge used to catch
    the wrong exception type, answer TRANSIENT and have the channel push the first event again forever."""
    server, java = refusing_node
    factory = client_orb.factory(server.ior())
    bf = bridge_factory(client_orb, server)
    channel, cid = _persistent_channel(factory)
    bridge, bid = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, "refused.out"))
    bridge.start_bridge()
    proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
    supplier = PushSupplierClient(proxy, Form.STRUCTURED)
    supplier.connect()
    for i in range(3):
        supplier.push_one(make_event(i, reliability=PERSISTENT))
    dead = java.consume("queue", "nsjms.DLQ", 3, TIMEOUT_S, f"nsjms_dlq_bridge = '{bid}'")
    assert len(dead) == 3, f"{len(dead)} of 3 refused events dead-lettered"
    for m in dead:
        reason = m["properties"]["nsjms_dlq_reason"]["value"]
        assert "broker refused the message" in reason and "not authorized" in reason, reason
        assert m["properties"]["nsjms_dlq_origin"]["value"] == "event"
    assert wait_until(lambda: _status(server, bid).get("dead_lettered", 0) == 3, 10), _status(server, bid)


def _status(server: NsjmsServer, bid: int) -> dict[str, Any]:
    try:
        data = json.loads((server.state_dir / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return dict(next((b for b in data.get("bridges", []) if b["id"] == bid), {}))


_ = (time, stomp)
