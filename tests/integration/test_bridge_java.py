"""The bridge against a real Java JMS client (ActiveMQ's OpenWire client, built by the tests from Debian's jars).

Channel → JMS: a CORBA supplier pushes structured events into a channel; bridges forward them to a queue and to a
topic (read by a *durable* Java subscriber, the channel being ConnectionReliability Persistent); the Java consumer
checks the JMS message class, body, JMSPriority (NJI Table 2-6 clamp), JMSDeliveryMode, JMSExpiration, JMSType and
the ``$`` properties (docs/mapping.md).

JMS → channel: the Java producer sends all five body types with headers and typed properties; a standard-stub
CORBA consumer checks the events NJI 2.4.1 prescribes. What STOMP cannot carry (Map without the ``jms-json``
profile, Stream, Object) must not become an empty event: it is refused to ``ActiveMQ.DLQ``, where the Java consumer
finds it intact, and the bridge counts it. Selectors given in ``factory_name`` filter at the broker; unmappable
input goes to ``nsjms.DLQ`` with the reason while later messages keep flowing.

The tests share one node (``module_server``): each makes its own channel, bridges and uniquely named destinations
and asserts only about those (a bridge's counters, its own queue's messages), never stops or restarts the node.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import stomp

from omniORB import CORBA

import CosNotification

from idl.generated import CosBridgeAdmin as BA

from bridgekit import JavaTool, bridge_factory, channel_ep, jms_ep
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
    utc_in,
    wait_until,
)

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0
EXPIRY_TOLERANCE_MS = 20_000
BROKER_DLQ = "ActiveMQ.DLQ"
TEXT = "text-{} \u00e9\u4e2d"


def _name(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


def _persistent_channel(factory: Any) -> tuple[Any, int]:
    qos = [prop("EventReliability", short(CosNotification.Persistent)),
           prop("ConnectionReliability", short(CosNotification.Persistent))]
    return factory.create_channel(qos, [])


def _consumer(channel: Any) -> StructuredPushConsumer:
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
    consumer = StructuredPushConsumer()
    connect_push_consumer(proxy, Form.STRUCTURED, consumer)
    return consumer


def _bridge_status(server: Any, bid: int) -> dict[str, Any]:
    """The bridge's counters from the node's ``status.json`` (rewritten every 2 s)."""
    data = json.loads((Path(server.state_dir) / "status.json").read_text())
    return next((b for b in data["bridges"] if b["id"] == bid), {})


def _wait_counter(server: Any, bid: int, key: str, value: int) -> int:
    wait_until(lambda: _bridge_status(server, bid).get(key, 0) >= value, 10, 0.5)
    return int(_bridge_status(server, bid).get(key, -1))


def _fd(ev: Any) -> dict[str, Any]:
    return {p.name: p.value.value() for p in ev.filterable_data}


def _ohf(ev: Any) -> dict[str, Any]:
    return {p.name: p.value.value() for p in ev.header.variable_header}


# ------------------------------------------------------------------------------------------- channel → JMS
def _octets(i: int) -> bytes:
    return bytes([i, 0, 255, 42])


def _outgoing() -> list[tuple[Any, dict[str, Any]]]:
    """(event, what the Java consumer must see) pairs; event i is named e<i>."""
    now_ms = int(time.time() * 1000)
    cases: list[tuple[Any, dict[str, Any]]] = []
    for i, (prio, want) in enumerate([(-5, 0), (0, 0), (4, 4), (9, 9), (100, 9)]):
        cases.append((make_event(i, priority=prio), {"JMSPriority": want, "JMSDeliveryMode": 2, "ohf": str(prio)}))
    cases.append((make_event(5, reliability=0), {"JMSDeliveryMode": 1, "JMSPriority": 4}))
    cases.append((make_event(6, reliability=1), {"JMSDeliveryMode": 2}))
    cases.append((make_event(7, timeout_s=300), {"expires": now_ms + 300_000}))
    cases.append((make_event(8, extra_header=[prop("StopTime", utc_in(600))]), {"expires": now_ms + 600_000}))
    octets = make_event(9)
    octets.remainder_of_body = CORBA.Any(CORBA._tc_OctetSeq, _octets(9))
    cases.append((octets, {"class": "ActiveMQBytesMessage", "body": base64.b64encode(_octets(9)).decode()}))
    as_map = make_event(10)
    as_map.remainder_of_body = CORBA.Any(CosNotification._tc_PropertySeq, [
        prop("count", CORBA.Any(CORBA.TC_long, 42)), prop("name", CORBA.Any(CORBA.TC_string, "link-down"))])
    cases.append((as_map, {"class": "ActiveMQMapMessage",
                           "body": {"count": {"type": "Integer", "value": "42"},
                                    "name": {"type": "String", "value": "link-down"}}}))
    return cases


def _check_outgoing(m: dict[str, Any], want: dict[str, Any], received_ms: int) -> None:
    props = m["properties"]
    name = props["$event_name"]["value"]
    i = int(name[1:])
    assert m["JMSType"] == "Structured Event", name
    assert (props["$domain_name"]["value"], props["$type_name"]["value"]) == ("nsjms.test", "Tick"), name
    assert props["$fd_n"]["value"] == str(i) and props["$fd_tag"]["value"] == f"t{i % 7}", name
    assert m["class"] == want.get("class", "ActiveMQTextMessage"), name
    if "body" in want:
        assert m["body"] == want["body"], name
    else:
        assert m["body"].startswith(f"payload-{i:06d}-") and m["body"].endswith(f"-end-{i}"), name
    assert m["JMSPriority"] == want.get("JMSPriority", 4), name        # no Priority header: JMS default 4
    assert m["JMSDeliveryMode"] == want.get("JMSDeliveryMode", 2), name  # absent EventReliability → PERSISTENT
    if "ohf" in want:
        assert props["$ohf_Priority"]["value"] == want["ohf"], "the full NS priority stays selectable"
    if "expires" in want:
        assert abs(m["JMSExpiration"] - want["expires"]) < EXPIRY_TOLERANCE_MS, (name, m["JMSExpiration"])
    else:
        assert m["JMSExpiration"] == 0, name
    assert abs(m["JMSTimestamp"] - received_ms) < EXPIRY_TOLERANCE_MS, name


def test_events_reach_java_on_a_queue_and_a_durable_topic(module_server: Any, client_orb: Any, shared_factory: Any,
                                                          java_tool: JavaTool) -> None:
    bf = bridge_factory(client_orb, module_server)
    channel, cid = _persistent_channel(shared_factory)
    queue, topic, client_id = _name("java.out.q"), _name("java.out.t"), _name("jmstool")
    java_tool.durable_async(client_id, topic, "sub", 0, 5).finish()     # registers the durable subscription
    for dest, kind in ((queue, BA.QUEUE), (topic, BA.TOPIC)):
        bridge, _ = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, dest, kind))
        bridge.start_bridge()
    cases = _outgoing()
    proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
    supplier = PushSupplierClient(proxy, Form.STRUCTURED)
    supplier.connect()
    supplier.push_all([ev for ev, _ in cases])
    sent_ms = int(time.time() * 1000)
    # the durable subscriber was offline while the events were routed: the broker kept them for it
    from_topic = java_tool.durable_async(client_id, topic, "sub", len(cases), TIMEOUT_S).finish()
    from_queue = java_tool.consume("queue", queue, len(cases), TIMEOUT_S)
    for label, got in (("queue", from_queue), ("durable topic", from_topic)):
        by_name = {m["properties"]["$event_name"]["value"]: m for m in got}
        assert sorted(by_name) == sorted(f"e{i}" for i in range(len(cases))), f"{label}: {sorted(by_name)}"
        assert len(got) == len(cases), f"{label}: duplicates"
        for i, (_, want) in enumerate(cases):
            _check_outgoing(by_name[f"e{i}"], want, sent_ms)


# ------------------------------------------------------------------------------------------- JMS → channel
def _drain(java_tool: JavaTool, queue: str) -> list[dict[str, Any]]:
    return java_tool.consume("queue", queue, 10_000, 2)


def _check_incoming(ev: Any, queue: str) -> int:
    """The NJI 2.4.1 event for JmsTool message i; returns i."""
    fixed, fd, ohf = ev.header.fixed_header, _fd(ev), _ohf(ev)
    i = int(fd["n"])
    assert (fixed.event_type.domain_name, fixed.event_name) == ("", queue)
    assert ohf["Priority"] == i % 10 and ohf["EventReliability"] == 1, ohf
    assert fd["JMSType"] == f"t{i}" and fd["JMSCorrelationID"] == f"c{i}", fd
    assert fd["JMSMessageID"].startswith("ID:") and fd["JMSRedelivered"] is False, fd
    assert fd["JMSDestination"] == f"/queue/{queue}" and isinstance(fd["JMSTimestamp"], int), fd
    # Java's typed properties arrive as Strings over STOMP (the producer sent no nsjms_types), in Java's format
    assert (fd["big"], fd["ratio"], fd["flag"], fd["label"]) == \
        (str(10_000_000_000 + i), f"{i + 0.5}", "true" if i % 2 == 0 else "false", f"item-{i}"), fd
    assert (fd["small"], fd["tiny"], fd["f"]) == (str(i % 1000), str(i % 100), "1.25"), fd
    return i


def _start_inbound(nsjms_server: Any, client_orb: Any, factory: Any, queue: str,
                   factory_name: str = "") -> tuple[StructuredPushConsumer, int]:
    bf = bridge_factory(client_orb, nsjms_server)
    channel, cid = _persistent_channel(factory)
    consumer = _consumer(channel)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue, factory_name=factory_name), channel_ep(BA.SINK, cid))
    bridge.start_bridge()
    return consumer, bid


def test_java_producer_all_five_types(module_server: Any, client_orb: Any, shared_factory: Any,
                                      java_tool: JavaTool) -> None:
    """Default profile: Text and Bytes become %TextMessage / %BytesMessage events; Map, Stream and Object arrive
    empty over STOMP, so they are refused to ActiveMQ.DLQ, intact, and never become empty events."""
    queue = _name("java.in.all")
    _drain(java_tool, BROKER_DLQ)
    consumer, bid = _start_inbound(module_server, client_orb, shared_factory, queue)
    java_tool.produce("queue", queue, 10, "text,bytes,map,stream,object")
    assert consumer.wait_for(4, TIMEOUT_S), f"{consumer.count()} events"
    assert _wait_counter(module_server, bid, "refused_to_broker_dlq", 6) == 6
    # every message is settled and acknowledged (4 forwarded + 6 refused = 10 produced): no more events can come,
    # and a duplicate would have counted as a fifth forward
    assert _wait_counter(module_server, bid, "forwarded", 4) == 4
    events = consumer.snapshot()
    assert len(events) == 4, [e.header.fixed_header.event_type.type_name for e in events]
    for ev in events:
        i = _check_incoming(ev, queue)
        type_name = ev.header.fixed_header.event_type.type_name
        body = ev.remainder_of_body
        if i % 5 == 0:
            assert type_name == "%TextMessage" and body.value() == TEXT.format(i)
        else:
            assert i % 5 == 1 and type_name == "%BytesMessage"
            assert body.typecode().equivalent(CORBA._tc_OctetSeq) and body.value() == bytes([i, 0, 255, 42])
    dead = _drain(java_tool, BROKER_DLQ)
    by_type = {m["JMSType"]: m for m in dead}
    assert sorted(by_type) == sorted(f"t{i}" for i in (2, 3, 4, 7, 8, 9)), sorted(by_type)
    for i in (2, 7):
        m = by_type[f"t{i}"]
        assert m["class"] == "ActiveMQMapMessage" and m["body"]["count"] == {"type": "Integer", "value": str(i)}
        assert m["body"]["load"] == {"type": "Double", "value": "0.5"} and m["body"]["name"]["value"] == "link-down"
    for i in (3, 8):
        m = by_type[f"t{i}"]
        assert m["class"] == "ActiveMQStreamMessage"
        assert [x["value"] for x in m["body"]] == [str(i), f"s{i}", "2.5"]
    for i in (4, 9):
        m = by_type[f"t{i}"]
        assert m["class"] == "ActiveMQObjectMessage" and m["body"] == f"Payload:{i}"
    for m in dead:
        assert m["properties"]["label"]["value"] == f"item-{m['JMSType'][1:]}"
        assert m["properties"]["n"]["type"] == "Integer", "the original, with its typed properties"


def test_jms_json_profile_maps_map_messages_typed(module_server: Any, client_orb: Any, shared_factory: Any,
                                                  java_tool: JavaTool) -> None:
    queue = _name("java.in.json")
    consumer, _ = _start_inbound(module_server, client_orb, shared_factory, queue, "jms-json")
    java_tool.produce("queue", queue, 6, "text,bytes,map")
    assert consumer.wait_for(6, TIMEOUT_S), f"{consumer.count()} events"
    by_id = {_check_incoming(ev, queue): ev for ev in consumer.snapshot()}
    assert sorted(by_id) == list(range(6))
    for i in (2, 5):
        ev = by_id[i]
        assert ev.header.fixed_header.event_type.type_name == "%MapMessage"
        body = ev.remainder_of_body
        assert body.typecode().equivalent(CosNotification._tc_PropertySeq)
        entries = {p.name: p.value for p in body.value()}
        kinds = {k: v.typecode().kind() for k, v in entries.items()}
        assert kinds == {"count": CORBA.tk_long, "name": CORBA.tk_string, "load": CORBA.tk_double,
                         "up": CORBA.tk_boolean, "when": CORBA.tk_longlong}, kinds
        values = {k: v.value() for k, v in entries.items()}
        assert values == {"count": i, "name": "link-down", "load": 0.5, "up": False, "when": 1_700_000_000_000}
    assert by_id[0].header.fixed_header.event_type.type_name == "%TextMessage"
    assert by_id[1].header.fixed_header.event_type.type_name == "%BytesMessage"


def test_selector_in_factory_name_filters_at_the_broker(module_server: Any, client_orb: Any, shared_factory: Any,
                                                        java_tool: JavaTool) -> None:
    queue = _name("java.in.sel")
    consumer, bid = _start_inbound(module_server, client_orb, shared_factory, queue, "default;selector=n >= 5")
    java_tool.produce("queue", queue, 10, "text")
    assert consumer.wait_for(5, TIMEOUT_S)
    assert _wait_counter(module_server, bid, "forwarded", 5) == 5   # the 5 selected ones forwarded and acknowledged
    assert sorted(_check_incoming(ev, queue) for ev in consumer.snapshot()) == [5, 6, 7, 8, 9]
    left = java_tool.consume("queue", queue, 10, 3)
    assert sorted(m["JMSType"] for m in left) == [f"t{i}" for i in range(5)], "unselected messages stay queued"


def _stomp_send(broker_url: str, queue: str, frames: list[tuple[dict[str, str], bytes]]) -> None:
    host, port = broker_url.removeprefix("stomp://").split(":")
    conn = stomp.Connection([(host, int(port))], auto_content_length=False)
    conn.connect(wait=True)
    try:
        for headers, body in frames:
            conn.send(f"/queue/{queue}", body, headers={"persistent": "true", **headers})
    finally:
        conn.disconnect()


def test_unmappable_message_goes_to_the_dead_letter_queue(module_server: Any, client_orb: Any, shared_factory: Any,
                                                          broker_url: str, java_tool: JavaTool) -> None:
    queue = _name("java.in.bad")
    consumer, bid = _start_inbound(module_server, client_orb, shared_factory, queue)
    bad = {"type": "Structured Event", "$nsjms_idl": "{not a manifest", "mark": "bad-1"}
    _stomp_send(broker_url, queue, [({"mark": "ok-1"}, b"first"), (bad, b"payload"), ({"mark": "ok-2"}, b"second")])
    assert consumer.wait_for(2, TIMEOUT_S), f"{consumer.count()} events"
    # all three settled and acknowledged: nothing more can come
    assert _wait_counter(module_server, bid, "forwarded", 2) == 2
    assert _wait_counter(module_server, bid, "dead_lettered", 1) == 1
    events = consumer.snapshot()
    assert [(e.remainder_of_body.value(), _fd(e)["mark"]) for e in events] == [("first", "ok-1"), ("second", "ok-2")]
    dead = java_tool.consume("queue", "nsjms.DLQ", 10, 5, f"nsjms_dlq_destination = '/queue/{queue}'")
    assert len(dead) == 1, dead
    props = dead[0]["properties"]
    assert "manifest" in props["nsjms_dlq_reason"]["value"], props["nsjms_dlq_reason"]
    assert props["nsjms_dlq_origin"]["value"] == "message"
    assert props["nsjms_dlq_message_id"]["value"].startswith("ID:")
    # the dead letter is the original as it arrived (a text message over STOMP): its kind, body, type and properties
    assert (dead[0]["class"], dead[0]["body"]) == ("ActiveMQTextMessage", "payload"), "the original body is kept"
    assert dead[0]["JMSType"] == "Structured Event" and props["mark"]["value"] == "bad-1", dead[0]
    assert dead[0]["JMSDeliveryMode"] == 2 and props["nsjms_dlq_delivery_mode"]["value"] == "PERSISTENT"
    assert _wait_counter(module_server, bid, "dead_lettered", 1) == 1
