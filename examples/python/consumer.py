#!/usr/bin/env python3
"""A structured push consumer for any OMG Notification Service channel (omniORBpy, standard COS stubs only).

    python consumer.py [--factory REF | --factory-file PATH] [--channel ID] [--count N] [--timeout S] [-ORB...]

It resolves the ``CosNotifyChannelAdmin::EventChannelFactory`` like the supplier does, uses channel ``--channel``
(or creates a channel when none is given), connects a structured push consumer servant to a proxy of the channel's
default consumer admin and prints ``ready channel=ID``. Then it prints one ``received ...`` line per event the
channel pushes, and exits 0 after ``--count`` events (0: run until Ctrl-C) or 1 when ``--timeout`` seconds pass
first. The channel calls this process back, so its ORB listens: on 127.0.0.1 unless an ``-ORBendPoint`` is given
(for a node on another host, e.g. ``-ORBendPoint giop:tcp:myhost.example:``).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

import omniORB  # noqa: F401  (puts omniORB's precompiled COS stubs on sys.path)
from omniORB import CORBA

import CosNotifyChannelAdmin
import CosNotifyComm__POA

DEFAULT_FACTORY = "corbaloc::127.0.0.1:2809/NotifyEventChannelFactory"


def describe(event: Any) -> str:
    """One line per event; the supplier prints the same line for the same event."""
    fixed = event.header.fixed_header
    fields = {p.name: p.value.value() for p in event.filterable_data}
    return (f"{fixed.event_name} {fixed.event_type.domain_name}/{fixed.event_type.type_name}"
            f" seq={fields.get('seq')} text={fields.get('text')} body={event.remainder_of_body.value()}")


class Printer(CosNotifyComm__POA.StructuredPushConsumer):  # type: ignore[misc]  # untyped skeleton
    """Prints every event. The ORB calls it on its own threads: only print and count here."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.received = 0
        self.disconnected = False

    def push_structured_event(self, notification: Any) -> None:
        line = describe(notification)
        with self.changed:
            print(f"received {line}", flush=True)
            self.received += 1
            self.changed.notify_all()

    def offer_change(self, added: Any, removed: Any) -> None:
        pass  # the event types suppliers offer changed; this consumer takes everything

    def disconnect_structured_push_consumer(self) -> None:
        with self.changed:
            self.disconnected = True
            self.changed.notify_all()

    def wait(self, count: int, timeout: float) -> bool:
        """True once ``count`` events arrived (``count`` 0: never); False on timeout or when disconnected."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not self.disconnected and (count == 0 or self.received < count):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 1.0))
            return not self.disconnected


def resolve_factory(orb: Any, ref: str | None, ref_file: str | None) -> Any:
    if ref_file is not None:
        with open(ref_file, encoding="ascii") as f:
            ref = f.read().strip()
    factory = orb.string_to_object(ref or DEFAULT_FACTORY)._narrow(CosNotifyChannelAdmin.EventChannelFactory)
    if factory is None:
        raise SystemExit(f"consumer: {ref or ref_file} is not a CosNotifyChannelAdmin::EventChannelFactory")
    return factory


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Print the structured events a Notification Service channel pushes.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--factory", help=f"corbaloc URL or IOR of the factory (default {DEFAULT_FACTORY})")
    where.add_argument("--factory-file", help="file holding the factory's IOR")
    p.add_argument("--channel", type=int, help="channel id to use (default: create a new channel)")
    p.add_argument("--count", type=int, default=10, help="exit after this many events (default 10; 0: never)")
    p.add_argument("--timeout", type=float, default=60.0, help="give up after this many seconds (default 60)")
    return p.parse_args(argv)


def main() -> int:
    argv = [sys.argv[0], "-ORBclientCallTimeOutPeriod", "30000", *sys.argv[1:]]
    if "-ORBendPoint" not in argv:
        argv += ["-ORBendPoint", "giop:tcp:127.0.0.1:"]  # loopback by default: the node calls us here
    orb = CORBA.ORB_init(argv, CORBA.ORB_ID)  # takes the -ORB options (and their values) out of argv
    args = parse(argv[1:])
    poa = orb.resolve_initial_references("RootPOA")
    poa._get_the_POAManager().activate()
    printer = Printer()
    try:
        factory = resolve_factory(orb, args.factory, args.factory_file)
        if args.channel is None:
            channel, cid = factory.create_channel([], [])          # default QoS and admin properties
        else:
            channel, cid = factory.get_event_channel(args.channel), args.channel
        proxy, _ = channel._get_default_consumer_admin().obtain_notification_push_supplier(
            CosNotifyChannelAdmin.STRUCTURED_EVENT)
        proxy = proxy._narrow(CosNotifyChannelAdmin.StructuredProxyPushSupplier)
        proxy.connect_structured_push_consumer(printer._this())
        print(f"ready channel={cid}", flush=True)
        try:
            complete = printer.wait(args.count, args.timeout if args.count else float("inf"))
        except KeyboardInterrupt:
            complete = True
        if not printer.disconnected:
            proxy.disconnect_structured_push_supplier()
        print(f"done: received {printer.received} of {args.count or 'unlimited'}", flush=True)
        return 0 if complete else 1
    except CosNotifyChannelAdmin.ChannelNotFound:
        print(f"consumer: channel {args.channel} does not exist", file=sys.stderr)
        return 1
    except CORBA.Exception as exc:
        print(f"consumer: CORBA error {exc!r}", file=sys.stderr)
        return 1
    finally:
        orb.destroy()


if __name__ == "__main__":
    sys.exit(main())
