"""A consumer whose code set cannot carry an event's text gets it narrowed, never dead-lettered (issue 31).

The consumers here behave as omniORB does for an ISO-8859-1 consumer: a push whose value holds a ``string`` with a
character above U+00FF fails with ``DATA_CONVERSION`` ``COMPLETED_NO``. Plain push and acknowledged push proxies
then narrow that consumer's text (``router/mapping/text.py``) and push again: every event arrives, with its text.
"""

from __future__ import annotations

from typing import Any

import pytest
import test_ack_resend as ackkit
from test_channel_delivery import make_proxy, run_worker, stop, wait_for

import omniORB
from omniORB import CORBA, tcInternal

import CosNotification as N

from router.channel import proxies as P
from router.channel.boundary import POISON_ATTEMPTS
from router.channel.events import Event, Form
from router.channel.queue import Record
from router.mapping.text import LATIN1


def _strings(value: Any, found: list[str]) -> None:
    """Every IDL ``string`` (not ``wstring``) text inside a StructuredEvent, as omniORB would marshal it."""
    d = getattr(getattr(value, "_t", None), "_d", None)
    if isinstance(value, CORBA.Any):
        if isinstance(d, tuple) and d[0] == tcInternal.tv_string:
            found.append(value._v)
        elif d == tcInternal.tv_any:
            _strings(value._v, found)
        return
    if isinstance(value, N.StructuredEvent):
        t = value.header.fixed_header
        found += [t.event_type.domain_name, t.event_type.type_name, t.event_name]
        for p in [*value.header.variable_header, *value.filterable_data]:
            found.append(p.name)
            _strings(p.value, found)
        _strings(value.remainder_of_body, found)


def latin1_only(ev: Any) -> BaseException | None:
    found: list[str] = []
    _strings(ev, found)
    if any(max(map(ord, s), default=0) > LATIN1 for s in found):
        return CORBA.DATA_CONVERSION(omniORB.DATA_CONVERSION_CannotMapChar, CORBA.COMPLETED_NO)
    return None


def event(i: int, text: str) -> Any:
    header = N.EventHeader(N.FixedEventHeader(N.EventType("D", "T"), f"e{i}"), [])
    return N.StructuredEvent(header, [N.Property("n", CORBA.Any(CORBA.TC_long, i)),
                                      N.Property("s", CORBA.Any(CORBA.TC_string, text))],
                             CORBA.Any(CORBA.TC_string, text))


TEXTS = ["café", "5 €", "中文", "😀", "plain"]


class Latin1Consumer:
    def __init__(self, completed: Any = CORBA.COMPLETED_NO) -> None:
        self.got: list[Any] = []
        self.refused = 0
        self.completed = completed

    def _non_existent(self) -> bool:
        return False

    def push_structured_event(self, ev: Any) -> None:
        exc = latin1_only(ev)
        if exc is not None:
            self.refused += 1
            raise CORBA.DATA_CONVERSION(exc.minor, self.completed)
        self.got.append(ev)


def test_push_proxy_narrows_and_delivers_every_event(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = Latin1Consumer()
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, consumer, monkeypatch)  # type: ignore[arg-type]
    for i, text in enumerate(TEXTS):
        proxy.queue.put(Record(i, Event(Form.STRUCTURED, event(i, text)), 0, None, None, False))
    t = run_worker(proxy)
    try:
        wait_for(lambda: len(consumer.got) == len(TEXTS), "every event")
    finally:
        stop(proxy, t)
    assert proxy.dead_lettered == 0, proxy.last_dead_letter
    assert consumer.refused == 1, "one refusal teaches the proxy; later events go narrowed at once"
    for i, ev in enumerate(consumer.got):
        fd = {p.name: p.value for p in ev.filterable_data}
        assert fd["n"].value() == i and fd["s"].value() == TEXTS[i] and ev.remainder_of_body.value() == TEXTS[i]


def test_a_refusal_the_consumer_may_have_run_is_not_narrowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``COMPLETED_MAYBE``: the consumer may have received the event, so it is not re-sent at once; the usual
    poison handling applies (attempts, then the dead letter)."""
    consumer = Latin1Consumer(CORBA.COMPLETED_MAYBE)
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, consumer, monkeypatch)  # type: ignore[arg-type]
    proxy.queue.put(Record(1, Event(Form.STRUCTURED, event(1, "5 €")), 0, None, None, False))
    t = run_worker(proxy)
    try:
        wait_for(lambda: proxy.dead_lettered == 1, "the dead letter")
    finally:
        stop(proxy, t)
    assert consumer.refused == POISON_ATTEMPTS and proxy.text_limit is None


def test_acknowledged_push_proxy_narrows(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = Latin1Consumer()
    clock = ackkit.Clock()
    proxy = ackkit.make_proxy(monkeypatch, consumer, clock)  # type: ignore[arg-type]
    for i, text in enumerate(TEXTS):
        rec = Record(i, Event(Form.STRUCTURED, event(i, text)), 0, None, None, False)
        rec.hold()
        proxy.queue.put(rec)
    for _ in TEXTS:
        proxy._tick(None)
    assert len(consumer.got) == len(TEXTS) and proxy.dead_lettered == 0
    assert [ev.remainder_of_body.value() for ev in consumer.got] == TEXTS


class _OwnConversionError(Latin1Consumer):
    """A consumer whose own servant raises DATA_CONVERSION (minor 0) for every event: not a code set it lacks."""

    def push_structured_event(self, ev: Any) -> None:
        self.refused += 1
        raise CORBA.DATA_CONVERSION(0, CORBA.COMPLETED_NO)


def test_a_data_conversion_that_is_not_cannot_map_char_never_narrows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review finding: any DATA_CONVERSION COMPLETED_NO narrowed the proxy's text for good, so a consumer able to
    read Latin-1 received \\u escapes after its servant raised DATA_CONVERSION once. Only the ORB's CannotMapChar
    narrows; this one is an ordinary failed attempt."""
    consumer = _OwnConversionError()
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, consumer, monkeypatch)  # type: ignore[arg-type]
    proxy.queue.put(Record(1, Event(Form.STRUCTURED, event(1, "café")), 0, None, None, False))
    t = run_worker(proxy)
    try:
        wait_for(lambda: proxy.dead_lettered == 1, "the dead letter")
    finally:
        stop(proxy, t)
    assert consumer.refused == POISON_ATTEMPTS and proxy.text_limit is None
