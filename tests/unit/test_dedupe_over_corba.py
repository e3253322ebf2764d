"""Channel -> JMS over CORBA without T2 (an acknowledging push proxy, a pull endpoint): the event carries its
dedupe id to the bridge, which sends it as the JMS property ``nsjms_dedupe_id`` (issue 31, router.channel.dedupe).

What is checked: a proxy supplier whose ledger route names a bridge of this node converts each event (structured,
and each of a sequence) with ``nsjms_dedupe_id`` = the channel's id of the obligation in its variable header, the
same on every conversion of the same entry (a re-send); a proxy of a plain CORBA consumer converts the event
unchanged; the bridge core maps a stamped event to exactly the message of the unstamped one plus that property.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from test_channel_delivery import FakeRt, make_proxy

from omniORB import CORBA

import CosNotification as N

from router.bridge.core import ChannelToJms, DeadLetter
from router.channel import proxies as P
from router.channel.events import Event, Form
from router.channel.queue import Entry, Record
from router.jms.model import Destination, JmsMessage
from router.mapping.to_jms import event_to_jms
from router.routing.ledger import Direction, LedgerWriter, Route

QUEUE = Destination("queue", "out")


def event(i: int) -> Any:
    header = N.EventHeader(N.FixedEventHeader(N.EventType("D", "T"), f"e{i}"),
                           [N.Property("Priority", CORBA.Any(CORBA.TC_short, 5))])
    return N.StructuredEvent(header, [N.Property("n", CORBA.Any(CORBA.TC_long, i))],
                             CORBA.Any(CORBA.TC_string, f"body {i}"))


def entries(*stored: bool) -> list[Entry]:
    return [Entry(Record(10 + i, Event(Form.STRUCTURED, event(i)), 0, None, None, s, 100 + i if s else None), ())
            for i, s in enumerate(stored)]


def proxy(cls: type, monkeypatch: pytest.MonkeyPatch, *, bridge: bool) -> Any:
    p = make_proxy(cls, SimpleNamespace(), monkeypatch)
    p.rt = FakeRt()
    p.rt.store = SimpleNamespace(ledger=LedgerWriter())       # its own routes (FakeStore's ledger is shared)
    p.channel, p.admin, p.id, p.text_limit = SimpleNamespace(id=4), SimpleNamespace(id=5), 6, None
    if bridge:
        p.rt.store.ledger.set_route(4, "C", 5, 6, Route(Direction.CHANNEL_TO_JMS, 9, "queue/out"))
    return p


def ids_of(value: Any) -> list[str | None]:
    events = value if isinstance(value, list) else [value]
    return [next((p.value.value() for p in ev.header.variable_header if p.name == "nsjms_dedupe_id"), None)
            for ev in events]


def test_a_proxy_feeding_a_bridge_converts_each_event_with_its_dedupe_id_the_same_every_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    p = proxy(P.SequenceProxyPushSupplierImpl, monkeypatch, bridge=True)
    p.rt.store.ledger.run_id = "r7"
    batch = entries(True, False, True)
    first, again = p.convert(batch), p.convert(batch)
    assert ids_of(first) == ["e100/c4/a5/p6", "br7/s11/c4/a5/p6", "e102/c4/a5/p6"] == ids_of(again)
    s = proxy(P.StructuredProxyPushSupplierImpl, monkeypatch, bridge=True)
    assert ids_of(s.convert(entries(True))) == ["e100/c4/a5/p6"]
    assert [len(ev.header.variable_header) for ev in first] == [2, 2, 2]      # Priority kept, one id added


def test_a_proxy_of_a_plain_consumer_converts_the_event_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    p = proxy(P.StructuredProxyPushSupplierImpl, monkeypatch, bridge=False)
    batch = entries(True)
    assert p.convert(batch) is batch[0].record.event.value


def test_the_bridge_sends_a_stamped_event_as_its_message_plus_the_dedupe_id_property(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[JmsMessage] = []
    transport: Any = SimpleNamespace(send=lambda dest, msg, **kw: sent.append(msg))
    bridge: Any = SimpleNamespace(id=9, running=lambda: True, acknowledge_channel=lambda evs: None)
    flow = ChannelToJms(bridge, QUEUE, transport, lambda ev, dest: event_to_jms(ev, dest, now_ms=1000),
                        DeadLetter(lambda: transport, 9), lambda ev: b"")
    p = proxy(P.StructuredProxyPushSupplierImpl, monkeypatch, bridge=True)
    flow.forward([p.convert(entries(True))])
    plain = event_to_jms(event(0), QUEUE, now_ms=1000)
    assert sent[0].properties["nsjms_dedupe_id"].value == "e100/c4/a5/p6"
    assert {k: v for k, v in sent[0].properties.items() if k != "nsjms_dedupe_id"} == dict(plain.properties)
    assert sent[0].body == plain.body
