"""The dedupe id an event carries to a channel → JMS bridge over CORBA (``router.channel.dedupe``, issue 31).

The channel appends it to the event's variable header as ``nsjms_dedupe_id`` (:func:`stamped`); the bridge takes
it out before mapping (:func:`taken`) and sends it as the JMS property of the same name. The module imports no
ORB (the bridge core is ORB-free): :func:`stamped` loads it when called, :func:`taken` reads attributes only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["DEDUPE_HEADER", "stamped", "taken"]

#: The variable-header entry that carries the id to a bridge over CORBA, and the JMS property that carries it on
#: (``router.bridge.txout.DEDUPE_PROPERTY`` in routing transactions).
DEDUPE_HEADER = "nsjms_dedupe_id"


def _with(event: Any, dedupe_id: str) -> Any:
    from omniORB import CORBA

    import CosNotification

    header = event.header
    variable = [p for p in header.variable_header if p.name != DEDUPE_HEADER]
    variable.append(CosNotification.Property(DEDUPE_HEADER, CORBA.Any(CORBA.TC_string, dedupe_id)))
    return CosNotification.StructuredEvent(CosNotification.EventHeader(header.fixed_header, variable),
                                           event.filterable_data, event.remainder_of_body)


def stamped(value: Any, ids: Sequence[str]) -> Any:
    """A structured event (or a sequence of them) with ``ids`` in their variable headers, as copies."""
    if isinstance(value, list):
        return [_with(ev, did) for ev, did in zip(value, ids, strict=True)]
    return _with(value, ids[0])


def taken(event: Any) -> tuple[Any, str | None]:
    """``event`` without its ``nsjms_dedupe_id`` variable-header entry, and that id (None, and ``event`` itself,
    when it has none or it is not a string)."""
    header = getattr(event, "header", None)
    variable = getattr(header, "variable_header", None)
    if header is None or not variable:
        return event, None
    found: str | None = None
    rest = []
    for p in variable:
        if p.name == DEDUPE_HEADER and found is None:
            try:
                value = p.value.value()
            except Exception:  # noqa: BLE001 — not an Any holding a value: not ours, left in place
                value = None
            if isinstance(value, str):
                found = value
                continue
        rest.append(p)
    if found is None:
        return event, None
    return (type(event)(type(header)(header.fixed_header, rest), event.filterable_data, event.remainder_of_body),
            found)
