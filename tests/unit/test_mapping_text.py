"""Text every consumer's code set can carry (``router/mapping/text.py``, issue 31).

JMS Strings become ``string`` only when they fit ISO-8859-1, else ``wstring``; the channel's narrowing of a push
value keeps every text (an Any's ``string`` becomes a ``wstring``; a name or fixed-header text is ``\\u``-escaped)
and leaves what needs no change as the same objects.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import omniORB
from omniORB import CORBA, tcInternal

import CosNotification as N

from router.jms.model import BodyType, Destination, JmsMessage, JmsType, Typed
from router.mapping.text import ASCII, LATIN1, escape, fits, narrow_event, next_limit, text_any
from router.mapping.to_event import jms_to_event


@pytest.fixture(autouse=True, scope="module")
def orb() -> Any:
    return CORBA.ORB_init(["test", "-ORBnativeCharCodeSet", "UTF-8"], CORBA.ORB_ID)


def kind(a: Any) -> Any:
    return a.typecode().kind()


def test_text_any_picks_string_only_for_latin1() -> None:
    assert kind(text_any("café")) == CORBA.tk_string
    for text in ("5 €", "中文", "😀", "ok \ufffd"):
        a = text_any(text)
        assert (kind(a), a.value()) == (CORBA.tk_wstring, text)


def test_foreign_jms_message_strings() -> None:
    msg = JmsMessage(BodyType.TEXT, "price 5 € 中文", Destination("queue", "q"), message_id="ID:1",
                     properties={"currency": Typed(JmsType.STRING, "€"), "city": Typed(JmsType.STRING, "café")})
    ev = jms_to_event(msg, now_ms=1)
    fd = {p.name: p.value for p in ev.filterable_data}
    assert (kind(fd["currency"]), fd["currency"].value()) == (CORBA.tk_wstring, "€")
    assert (kind(fd["city"]), fd["city"].value()) == (CORBA.tk_string, "café")
    assert (kind(ev.remainder_of_body), ev.remainder_of_body.value()) == (CORBA.tk_wstring, "price 5 € 中文")


def test_escape() -> None:
    assert escape("café") == "café"
    assert escape("café", ASCII) == "caf\\u00e9"
    assert escape("a\\b €") == "a\\\\b \\u20ac"
    assert escape("😀") == "\\ud83d\\ude00"                  # UTF-16 code units, as Java writes them
    assert escape("a\\b") == "a\\b"                           # untouched when it fits


@given(st.text())
def test_escaped_text_fits(text: str) -> None:
    for limit in (LATIN1, ASCII):
        assert fits(escape(text, limit), limit)


def test_next_limit() -> None:
    assert (next_limit(None), next_limit(LATIN1), next_limit(ASCII)) == (LATIN1, ASCII, None)


def _event(domain: str, text: str) -> Any:
    header = N.EventHeader(N.FixedEventHeader(N.EventType(domain, "T"), "e"),
                           [N.Property("Priority", CORBA.Any(CORBA.TC_short, 1))])
    nested = CORBA.Any(CORBA.TC_any, CORBA.Any(CORBA.TC_string, text))
    props = CORBA.Any(N._tc_PropertySeq, [N.Property("k" + text[-1], CORBA.Any(CORBA.TC_string, text))])
    seq = CORBA.Any(tcInternal.createSequenceTC(0, CORBA.TC_string), [text, "x"])
    return N.StructuredEvent(header, [N.Property("s", CORBA.Any(CORBA.TC_string, text)),
                                      N.Property("n", nested), N.Property("map", props), N.Property("seq", seq)],
                             CORBA.Any(CORBA.TC_string, text))


def test_narrowing_keeps_the_text_of_anys_and_escapes_names() -> None:
    ev = _event("Domäne€", "5 € 中文")
    out = narrow_event(ev, "STRUCTURED", LATIN1)
    assert out.header.fixed_header.event_type.domain_name == "Domäne\\u20ac"
    fd = {p.name: p.value for p in out.filterable_data}
    assert (kind(fd["s"]), fd["s"].value()) == (CORBA.tk_wstring, "5 € 中文")
    assert kind(fd["n"]) == CORBA.tk_any and kind(fd["n"].value()) == CORBA.tk_wstring
    inner = fd["map"].value()[0]
    assert inner.name == "k\\u6587" and (kind(inner.value), inner.value.value()) == (CORBA.tk_wstring, "5 € 中文")
    assert fd["seq"].value() == ["5 \\u20ac \\u4e2d\\u6587", "x"]              # a sequence<string>: escaped
    assert (kind(out.remainder_of_body), out.remainder_of_body.value()) == (CORBA.tk_wstring, "5 € 中文")
    omniORB.cdrMarshal(N._tc_StructuredEvent, out)                           # still a valid event
    assert ev.header.fixed_header.event_type.domain_name == "Domäne€", "the stored event is not changed"


def test_narrowing_to_ascii_and_nothing_to_change() -> None:
    ev = _event("D", "café")
    assert narrow_event(ev, "STRUCTURED", LATIN1) is ev                       # fits: the same object
    out = narrow_event(ev, "STRUCTURED", ASCII)
    assert kind(out.remainder_of_body) == CORBA.tk_wstring and out.remainder_of_body.value() == "café"
    batch = narrow_event([ev, _event("D", "x")], "SEQUENCE", ASCII)
    assert len(batch) == 2 and kind(batch[0].remainder_of_body) == CORBA.tk_wstring
    a = narrow_event(CORBA.Any(CORBA.TC_string, "€"), "ANY", LATIN1)
    assert (kind(a), a.value()) == (CORBA.tk_wstring, "€")
