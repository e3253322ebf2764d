"""Event forms inside the channel: normalisation, translation (NS Table 2-2) and serialisation.

The channel holds every event in one of two canonical forms:

* ``ANY``: an untyped event, a ``CORBA.Any`` that does *not* hold a StructuredEvent;
* ``STRUCTURED``: a ``CosNotification.StructuredEvent`` whose ``type_name`` is not ``%ANY``.

:func:`normalise_any` and :func:`normalise_structured` apply the anti-double-wrapping rule of NS 2.1.4 on the way
in; :func:`as_any` and :func:`as_structured` translate on the way out. No function here modifies an event
(NS 2.2): translation builds new objects around the original values.

Serialisation uses CDR encapsulations (``omniORB.cdrMarshal``), which needs an initialised ORB.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import omniORB
from omniORB import CORBA

import CosNotification

__all__ = [
    "ANY_TYPE_NAME",
    "Event",
    "Form",
    "as_any",
    "as_structured",
    "decode",
    "describe_event",
    "encode",
    "jms_message_id",
    "normalise_any",
    "normalise_structured",
]

ANY_TYPE_NAME = "%ANY"
_NULL_ANY = CORBA.Any(CORBA.TC_null, None)


class Form(enum.IntEnum):
    """Canonical form of a stored event (the integer is the value stored in PostgreSQL)."""

    ANY = 0
    STRUCTURED = 1


@dataclass(frozen=True)
class Event:
    """An event as the channel holds it: its canonical form and the original value."""

    form: Form
    value: object  # CORBA.Any for ANY, CosNotification.StructuredEvent for STRUCTURED

    @property
    def structured(self) -> CosNotification.StructuredEvent:
        return as_structured(self)

    @property
    def any(self) -> CORBA.Any:
        return as_any(self)


def _is_structured_tc(tc: CORBA.TypeCode) -> bool:
    try:
        return bool(tc.equivalent(CosNotification._tc_StructuredEvent))
    except CORBA.Exception:
        return False


def normalise_any(value: CORBA.Any) -> Event:
    """An Any pushed by a supplier: unpack a StructuredEvent inside it (NS 2.1.4)."""
    if _is_structured_tc(value.typecode()):
        return normalise_structured(value.value())
    return Event(Form.ANY, value)


def normalise_structured(event: CosNotification.StructuredEvent) -> Event:
    """A StructuredEvent from a supplier: a ``%ANY`` wrapper gives back the original Any (NS 2.1.4)."""
    if event.header.fixed_header.event_type.type_name == ANY_TYPE_NAME:
        body = event.remainder_of_body
        if isinstance(body, CORBA.Any):
            return Event(Form.ANY, body)
    return Event(Form.STRUCTURED, event)


def as_structured(event: Event) -> CosNotification.StructuredEvent:
    """Structured view of an event: an Any goes in ``remainder_of_body`` with ``type_name="%ANY"``."""
    if event.form is Form.STRUCTURED:
        return event.value
    header = CosNotification.EventHeader(
        CosNotification.FixedEventHeader(CosNotification.EventType("", ANY_TYPE_NAME), ""), []
    )
    return CosNotification.StructuredEvent(header, [], event.value)


def as_any(event: Event) -> CORBA.Any:
    """Any view of an event: a StructuredEvent travels inside an Any with its own TypeCode."""
    if event.form is Form.ANY:
        return event.value
    return CORBA.Any(CosNotification._tc_StructuredEvent, event.value)


def encode(event: Event) -> bytes:
    """CDR encapsulation of the event's canonical value."""
    if event.form is Form.STRUCTURED:
        return bytes(omniORB.cdrMarshal(CosNotification._tc_StructuredEvent, event.value))
    return bytes(omniORB.cdrMarshal(CORBA.TC_any, event.value))


def decode(form: int, data: bytes) -> Event:
    """Inverse of :func:`encode`."""
    f = Form(form)
    if f is Form.STRUCTURED:
        return Event(f, omniORB.cdrUnmarshal(CosNotification._tc_StructuredEvent, bytes(data)))
    return Event(f, omniORB.cdrUnmarshal(CORBA.TC_any, bytes(data)))


def null_any() -> CORBA.Any:
    """A fresh ``tk_null`` Any (for empty remainders)."""
    return _NULL_ANY


def describe_event(event: Event) -> str:
    """``domain/type/name`` of a structured event (for log lines and status), or "an untyped event"."""
    if event.form is Form.STRUCTURED:
        try:
            fixed = event.value.header.fixed_header  # type: ignore[attr-defined]
            return f"{fixed.event_type.domain_name}/{fixed.event_type.type_name}/{fixed.event_name}"
        except AttributeError:
            return "a structured event"
    return "an untyped event"


def jms_message_id(event: Event) -> str | None:
    """The JMS message id a JMS → channel bridge's mapping put in a structured event's filterable data
    (``JMSMessageID``: the ledger's inbound rows, ``router.channel.channel``), or None."""
    if event.form is not Form.STRUCTURED:
        return None
    for prop in event.structured.filterable_data:
        if prop.name == "JMSMessageID":
            value = prop.value.value()
            return value if isinstance(value, str) else None
    return None
