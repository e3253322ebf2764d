"""Visible demo traffic for the quick start: CORBA → channel → JMS queue → channel → CORBA, through two bridges.

It talks to the node only through its published ``endpoints.json`` and OMG IDL stubs (omniORB's COS stubs and the
interworking spec's ``CosBridgeAdmin``), as any client would:

1. channel *A* (persistent QoS) with a structured push supplier: telecom-style alarm events;
2. bridge 1: channel A → ActiveMQ queue ``nsjms.demo.alarms`` (JMS messages a Java application could consume);
3. bridge 2: that queue → channel *B*;
4. a structured push consumer on channel B prints what arrives, JMS headers included.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["run_demo"]


def _event(n: int) -> Any:
    from omniORB import CORBA

    import CosNotification

    severity = ("minor", "major", "critical")[n % 3]
    header = CosNotification.EventHeader(
        CosNotification.FixedEventHeader(CosNotification.EventType("Telecom", "CommunicationsAlarm"), f"alarm-{n}"),
        [CosNotification.Property("Priority", CORBA.Any(CORBA.TC_short, n % 3))],
    )
    body = [CosNotification.Property("seq", CORBA.Any(CORBA.TC_long, n)),
            CosNotification.Property("severity", CORBA.Any(CORBA.TC_string, severity)),
            CosNotification.Property("managedObject", CORBA.Any(CORBA.TC_string, f"cell-{n % 7}"))]
    return CosNotification.StructuredEvent(header, body, CORBA.Any(CORBA.TC_string, f"link down on cell-{n % 7}"))


def _printer_servant(out: Callable[[str], None]) -> Any:
    import CosNotifyComm__POA

    class Printer(CosNotifyComm__POA.StructuredPushConsumer):
        count = 0

        def push_structured_event(self, ev: Any) -> None:
            fields = {p.name: p.value.value() for p in ev.filterable_data}
            Printer.count += 1
            fixed = ev.header.fixed_header
            via = f" via JMS {fields['JMSDestination']}" if "JMSDestination" in fields else ""
            out(f"  <- received {fixed.event_name:>10}  {fixed.event_type.domain_name}/{fixed.event_type.type_name}"
                f"  severity={fields.get('severity')}  object={fields.get('managedObject')}{via}")

        def disconnect_structured_push_consumer(self) -> None:
            out("  consumer disconnected by the channel")

        def offer_change(self, added: Any, removed: Any) -> None:
            pass

    return Printer()


def _via_jms(orb: Any, endpoints: dict[str, Any], factory: Any, channel: Any, cid: int, qos: list[Any],
             out: Callable[[str], None]) -> tuple[Any, list[Any]]:
    """Two bridges through an ActiveMQ queue; returns the channel to consume from and the bridges."""
    if not endpoints.get("bridge_factory"):
        return channel, []
    from idl.generated import CosBridgeAdmin as BA

    bf = orb.string_to_object(endpoints["bridge_factory"]["corbaloc"])._narrow(BA.BridgeFactory)
    target, tid = factory.create_channel(qos, [])
    queue = BA.JMSDestination(BA.QUEUE, "nsjms.demo.alarms", "")

    def channel_ep(role: Any, chan_id: int) -> Any:
        return BA.ExternalEndpoint(role, BA.ExternalEndpointConnector(BA.STRUCTURED_EVENT, chan_id), BA.PUSH,
                                   BA.STRUCTURED_EVENT)

    def jms_ep(role: Any) -> Any:
        return BA.ExternalEndpoint(role, BA.ExternalEndpointConnector(destination=queue), BA.PUSH, BA.JMS_MESSAGE)

    out_bridge, b1 = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK))
    in_bridge, b2 = bf.create_bridge(jms_ep(BA.SOURCE), channel_ep(BA.SINK, tid))
    out_bridge.start_bridge()
    in_bridge.start_bridge()
    out(f"demo: bridge {b1}: channel {cid} -> JMS queue nsjms.demo.alarms; bridge {b2}: that queue -> channel {tid}")
    return target, [out_bridge, in_bridge]


def run_demo(state_dir: Path, *, rate: float = 2.0, count: int = 0, stop: threading.Event | None = None,
             out: Callable[[str], None] = print) -> int:
    """Push ``count`` events (0 = until stopped) at ``rate`` per second; returns how many were received."""
    from omniORB import CORBA

    import CosNotification
    import CosNotifyChannelAdmin

    stop = stop or threading.Event()
    endpoints = json.loads((state_dir / "endpoints.json").read_text())
    orb = CORBA.ORB_init(["demo", "-ORBendPoint", "giop:tcp:127.0.0.1:"], CORBA.ORB_ID)
    poa = orb.resolve_initial_references("RootPOA")
    poa._get_the_POAManager().activate()
    factory = orb.string_to_object(endpoints["event_channel_factory"]["corbaloc"])._narrow(
        CosNotifyChannelAdmin.EventChannelFactory)
    persistent = [CosNotification.Property(CosNotification.ConnectionReliability,
                                           CORBA.Any(CORBA.TC_short, CosNotification.Persistent)),
                  CosNotification.Property(CosNotification.EventReliability,
                                           CORBA.Any(CORBA.TC_short, CosNotification.Persistent))]
    channel, cid = factory.create_channel(persistent, [])
    out(f"demo: channel {cid} created at {endpoints['event_channel_factory']['corbaloc']}")
    printer = _printer_servant(out)
    target, bridges = _via_jms(orb, endpoints, factory, channel, cid, persistent, out)
    supplier_proxy, _ = target._get_default_consumer_admin().obtain_notification_push_supplier(
        CosNotifyChannelAdmin.STRUCTURED_EVENT)
    supplier_proxy = supplier_proxy._narrow(CosNotifyChannelAdmin.StructuredProxyPushSupplier)
    supplier_proxy.connect_structured_push_consumer(printer._this())
    consumer_proxy, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(
        CosNotifyChannelAdmin.STRUCTURED_EVENT)
    consumer_proxy = consumer_proxy._narrow(CosNotifyChannelAdmin.StructuredProxyPushConsumer)
    consumer_proxy.connect_structured_push_supplier(None)
    n = 0
    try:
        while not stop.is_set() and (count == 0 or n < count):
            consumer_proxy.push_structured_event(_event(n))
            out(f"  -> pushed   alarm-{n}")
            n += 1
            stop.wait(1.0 / rate)
        deadline = time.time() + 10
        while type(printer).count < n and time.time() < deadline:
            time.sleep(0.05)
    finally:
        for obj in [*bridges, channel, target]:
            try:
                obj.destroy()
            except CORBA.Exception:
                pass
        orb.destroy()
    received = int(type(printer).count)
    out(f"demo: pushed {n}, received {received}")
    return received
