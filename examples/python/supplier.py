#!/usr/bin/env python3
"""A structured push supplier for any OMG Notification Service channel (omniORBpy, standard COS stubs only).

    python supplier.py [--factory REF | --factory-file PATH] [--channel ID] [--count N] [--text TEXT] [-ORB...]

It resolves the ``CosNotifyChannelAdmin::EventChannelFactory`` from a stringified reference (``--factory``: a
``corbaloc::`` URL or an ``IOR:`` string; default ``corbaloc::127.0.0.1:2809/NotifyEventChannelFactory``) or from a
file holding an IOR (``--factory-file``), uses channel ``--channel`` (or creates a channel when none is given),
connects a structured proxy push consumer of the channel's default supplier admin and pushes ``--count`` events.
It prints ``channel ID`` and then one ``pushed ...`` line per event, in the format the consumer prints. Exit code 0
when every event was pushed, 1 otherwise. Arguments starting with ``-ORB`` go to the ORB.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import omniORB  # noqa: F401  (puts omniORB's precompiled COS stubs on sys.path)
from omniORB import CORBA

import CosNotification
import CosNotifyChannelAdmin

DEFAULT_FACTORY = "corbaloc::127.0.0.1:2809/NotifyEventChannelFactory"
DOMAIN, TYPE = "nsjms.example", "ExampleEvent"


def make_event(seq: int, text: str) -> Any:
    """Event *seq*: fixed header, one variable header field, two filterable fields, a string body."""
    fixed = CosNotification.FixedEventHeader(CosNotification.EventType(DOMAIN, TYPE), f"example-{seq}")
    variable = [CosNotification.Property(CosNotification.Priority, CORBA.Any(CORBA.TC_short, 0))]
    fields = [CosNotification.Property("seq", CORBA.Any(CORBA.TC_long, seq)),
              CosNotification.Property("text", CORBA.Any(CORBA.TC_string, text))]
    body = CORBA.Any(CORBA.TC_string, f"{text} #{seq}")
    return CosNotification.StructuredEvent(CosNotification.EventHeader(fixed, variable), fields, body)


def describe(event: Any) -> str:
    """One line per event; the consumer prints the same line for the same event."""
    fixed = event.header.fixed_header
    fields = {p.name: p.value.value() for p in event.filterable_data}
    return (f"{fixed.event_name} {fixed.event_type.domain_name}/{fixed.event_type.type_name}"
            f" seq={fields.get('seq')} text={fields.get('text')} body={event.remainder_of_body.value()}")


def resolve_factory(orb: Any, ref: str | None, ref_file: str | None) -> Any:
    if ref_file is not None:
        with open(ref_file, encoding="ascii") as f:
            ref = f.read().strip()
    factory = orb.string_to_object(ref or DEFAULT_FACTORY)._narrow(CosNotifyChannelAdmin.EventChannelFactory)
    if factory is None:
        raise SystemExit(f"supplier: {ref or ref_file} is not a CosNotifyChannelAdmin::EventChannelFactory")
    return factory


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Push N structured events into a Notification Service channel.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--factory", help=f"corbaloc URL or IOR of the factory (default {DEFAULT_FACTORY})")
    where.add_argument("--factory-file", help="file holding the factory's IOR")
    p.add_argument("--channel", type=int, help="channel id to use (default: create a new channel)")
    p.add_argument("--count", type=int, default=10, help="events to push (default 10)")
    p.add_argument("--text", default="hello", help="text carried by every event (default 'hello')")
    return p.parse_args(argv)


def main() -> int:
    argv = [sys.argv[0], "-ORBclientCallTimeOutPeriod", "30000", *sys.argv[1:]]  # a bounded wait for every call
    orb = CORBA.ORB_init(argv, CORBA.ORB_ID)  # takes the -ORB options (and their values) out of argv
    args = parse(argv[1:])
    try:
        factory = resolve_factory(orb, args.factory, args.factory_file)
        if args.channel is None:
            channel, cid = factory.create_channel([], [])          # default QoS and admin properties
        else:
            channel, cid = factory.get_event_channel(args.channel), args.channel
        print(f"channel {cid}", flush=True)
        proxy, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(
            CosNotifyChannelAdmin.STRUCTURED_EVENT)
        proxy = proxy._narrow(CosNotifyChannelAdmin.StructuredProxyPushConsumer)
        # A nil supplier reference is allowed for a push supplier: the channel then never calls us back
        # (no subscription_change, no disconnect_structured_push_supplier), so this process needs no POA.
        proxy.connect_structured_push_supplier(None)
        for seq in range(args.count):
            event = make_event(seq, args.text)
            proxy.push_structured_event(event)
            print(f"pushed {describe(event)}", flush=True)
        proxy.disconnect_structured_push_consumer()
        return 0
    except CosNotifyChannelAdmin.ChannelNotFound:
        print(f"supplier: channel {args.channel} does not exist", file=sys.stderr)
        return 1
    except CORBA.Exception as exc:
        print(f"supplier: CORBA error {exc!r}", file=sys.stderr)
        return 1
    finally:
        orb.destroy()


if __name__ == "__main__":
    sys.exit(main())
