"""Text every consumer's code set can carry (issue 31; CORBA 3 §13.10 code set negotiation; NJI 2.4.1).

An IDL ``string`` travels in the transmission code set (TCS-C) the two ORBs negotiate from the server's native and
conversion code sets. A standard omniORB(py) consumer's native char code set is ISO-8859-1, and omniORB as a client
picks the server's native set whenever it can convert to it, so the node (native UTF-8) sends such a consumer its
strings in ISO-8859-1: a ``€``, CJK text or an emoji in a ``string`` fails with ``DATA_CONVERSION``
(``CannotMapChar``, ``COMPLETED_NO``) before anything leaves the node. A ``wstring`` travels in the wide code set
(UTF-16 for omniORB and most ORBs) and carries every Unicode character to every consumer.

Two rules follow, both here as pure functions:

* **JMS -> event** (:func:`text_any`): a JMS ``String`` becomes an IDL ``string`` when every character is in
  ISO-8859-1 (the code set every ORB can take: GIOP's default), else a ``wstring``. The standard Java-to-IDL mapping
  that NJI 2.4.1 names maps ``java.lang.String`` to ``wstring`` (CORBA ``WStringValue``): a ``wstring`` is the exact
  counterpart of a Java string, the ``string`` for Latin-1 text keeps what NS clients and filters expect.
* **Channel -> consumer** (:func:`narrow_event`): when a push fails with ``DATA_CONVERSION`` ``COMPLETED_NO``, the
  proxy sends that consumer, from then on, events whose text fits a narrower set: first ISO-8859-1
  (:data:`LATIN1`), then ASCII (:data:`ASCII`). A ``string`` held by an ``any`` (a property value, the body) whose
  text does not fit becomes a ``wstring`` with the same text (nothing lost); a ``string`` that cannot change type
  (a name, the fixed header, a struct member) is :func:`escape`\\ d Java-style (``\\u20ac``; a backslash doubles).
  Values inside unions, and ``char`` values, are left as they are.
"""

from __future__ import annotations

from typing import Any

from omniORB import CORBA, tcInternal

__all__ = ["ASCII", "LATIN1", "escape", "fits", "narrow_event", "next_limit", "text_any"]

#: Code point limits of the narrowing steps: ISO-8859-1 (GIOP's default char code set), then ASCII.
LATIN1 = 0xFF
ASCII = 0x7F

_T = tcInternal
_STRING, _WSTRING, _ALIAS, _STRUCT = _T.tv_string, _T.tv_wstring, _T.tv_alias, _T.tv_struct
_SEQUENCE, _ARRAY, _ANY = _T.tv_sequence, _T.tv_array, _T.tv_any
_MAX_DEPTH = 600          # above the channel's MAX_EVENT_DEPTH: deeper values are left as they are


def fits(text: str, limit: int = LATIN1) -> bool:
    """True when every character of ``text`` is at most ``limit``."""
    return text.isascii() or (limit >= LATIN1 and max(map(ord, text)) <= limit)


def text_any(text: str) -> Any:
    """A JMS String as an Any: ``string`` when it fits ISO-8859-1, else ``wstring`` (see the module docstring)."""
    return CORBA.Any(CORBA.TC_string if fits(text) else CORBA.TC_wstring, text)


def escape(text: str, limit: int = LATIN1) -> str:
    """``text`` with every character above ``limit`` written ``\\uXXXX`` (UTF-16 code units, as Java writes them:
    an emoji is two escapes) and every backslash doubled; ``text`` itself when it fits."""
    if fits(text, limit):
        return text
    out: list[str] = []
    for ch in text:
        code = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif code <= limit:
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
    return "".join(out)


def next_limit(limit: int | None) -> int | None:
    """The next narrowing step after ``limit`` (None: text as it is), or None when there is none left."""
    if limit is None:
        return LATIN1
    if limit > ASCII:
        return ASCII
    return None


def narrow_event(value: Any, form: str, limit: int) -> Any:
    """A push value (``form`` ``ANY``: an Any; ``STRUCTURED``: a StructuredEvent; ``SEQUENCE``: a list of them)
    whose text fits ``limit``; the same objects where nothing needed to change. Never raises for a value the ORB
    could marshal: a shape it does not know (or one nested deeper than the channel accepts) is left as it is."""
    import CosNotification

    try:
        if form == "ANY":
            return _any(value, limit, 0)
        desc = CosNotification._tc_StructuredEvent._d
        if form == "STRUCTURED":
            return _value(desc, value, limit, 0)
        return [_value(desc, ev, limit, 0) for ev in value]
    except (AttributeError, TypeError, ValueError, RecursionError):
        return value


def _any(a: Any, limit: int, depth: int) -> Any:
    if not isinstance(a, CORBA.Any) or depth > _MAX_DEPTH:
        return a
    d = a._t._d
    base = d
    while isinstance(base, tuple) and base[0] == _ALIAS:
        base = base[3]
    if isinstance(base, tuple) and base[0] == _STRING:
        text = a._v
        return a if not isinstance(text, str) or fits(text, limit) else CORBA.Any(CORBA.TC_wstring, text)
    new = _value(d, a._v, limit, depth + 1)
    return a if new is a._v else CORBA.Any(a._t, new)


def _value(d: Any, v: Any, limit: int, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        return v
    if isinstance(d, int):
        return _any(v, limit, depth + 1) if d == _ANY else v
    kind = d[0]
    if kind == _STRING:
        return escape(v, limit) if isinstance(v, str) else v
    if kind == _ALIAS:
        return _value(d[3], v, limit, depth + 1)
    if kind == _STRUCT:
        members = [getattr(v, d[i]) for i in range(4, len(d), 2)]
        new = [_value(d[i + 1], m, limit, depth + 1) for i, m in zip(range(4, len(d), 2), members, strict=True)]
        if all(n is m for n, m in zip(new, members, strict=True)):
            return v
        return d[1](*new)
    if kind in (_SEQUENCE, _ARRAY):
        elem = d[1]
        if isinstance(elem, int) and elem != _ANY:
            return v                                    # octets, chars, numbers: no string inside
        items = list(v)
        new_items = [_value(elem, item, limit, depth + 1) for item in items]
        if all(n is m for n, m in zip(new_items, items, strict=True)):
            return v
        return new_items
    return v                                            # wstring, enum, union, objref, ...: left as it is
