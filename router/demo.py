"""Visible demo traffic for the quick start: a CORBA supplier and consumer on a running node.

It talks to the node only through its published ``endpoints.json`` and the standard OMG stubs, as any client
would: it creates (or reuses) a channel with persistent QoS, connects a structured push consumer that prints what
it receives, and pushes telecom-style alarm events at a steady rate.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable

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
            out(f"  <- received {ev.header.fixed_header.event_name:>10}  severity={fields.get('severity')}"
                f"  object={fields.get('managedObject')}")

        def disconnect_structured_push_consumer(self) -> None:
            out("  consumer disconnected by the channel")

        def offer_change(self, added: Any, removed: Any) -> None:
            pass

    return Printer()


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
    supplier_proxy, _ = channel._get_default_consumer_admin().obtain_notification_push_supplier(
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
        try:
            channel.destroy()
        except CORBA.Exception:
            pass
        orb.destroy()
    received = int(type(printer).count)
    out(f"demo: pushed {n}, received {received}")
    return received
