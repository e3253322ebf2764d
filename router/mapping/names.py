"""JMS property names produced by the NS -> JMS mapping, and the reserved ``$`` names.

Every produced name starts with ``$`` (a legal Java identifier start), so it can be neither a JMS selector keyword
(``NULL``, ``AND``, ...) nor a reserved ``JMS*`` name:

* fixed header: ``$domain_name``, ``$type_name``, ``$event_name`` (NJI 2.4.2, with its ``$domain_type`` typo fixed);
* variable header entry ``n``: ``$ohf_<n>``; filterable data entry ``n``: ``$fd_<n>``;
* a flattened struct member path ``a.b``: ``<base>__a__b`` (double underscore; ``.`` is illegal in JMS names);
* any character outside ``[A-Za-z0-9_$]`` becomes ``_``; a name already taken gets ``_2``, ``_3``, ... appended.

The exact original names and IDL types are kept in the ``$nsjms_idl`` manifest, so sanitising need not be
reversible.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "BODY_ENCODING",
    "DOMAIN_NAME",
    "EVENT_NAME",
    "MANIFEST",
    "SECTION_PREFIX",
    "STRUCTURED_EVENT",
    "TYPE_NAME",
    "NameAllocator",
    "is_identifier",
    "sanitise",
]

DOMAIN_NAME = "$domain_name"
TYPE_NAME = "$type_name"
EVENT_NAME = "$event_name"
BODY_ENCODING = "$body_encoding"
MANIFEST = "$nsjms_idl"
SECTION_PREFIX = {"ohf": "$ohf_", "fd": "$fd_"}
#: JMSType of a message made from a StructuredEvent (NJI 2.4.2).
STRUCTURED_EVENT = "Structured Event"

_ILLEGAL = re.compile(r"[^A-Za-z0-9_$]")
_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_KEYWORDS = frozenset({"NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE"})


def sanitise(text: str) -> str:
    """``text`` with every character that is not ASCII ``[A-Za-z0-9_$]`` replaced by ``_``."""
    return _ILLEGAL.sub("_", text)


def is_identifier(name: str) -> bool:
    """A portable JMS property name (ASCII subset of the Java identifier rules, no keyword, no ``JMS`` prefix)."""
    return bool(_IDENTIFIER.fullmatch(name)) and name.upper() not in _KEYWORDS and not name.startswith("JMS")


#: The sanitised name wanted for (section, entry name, member path), remembered across events (issue 12: the same
#: event types come again and again); emptied when it holds :data:`_WANTED_MAX` names.
_WANTED: dict[tuple[str, str, tuple[str, ...]], str] = {}
_WANTED_MAX = 8192


class NameAllocator:
    """Hands out unique property names, deterministically in call order."""

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self._taken = set(taken)

    def allocate(self, section: str, name: str, path: tuple[str, ...] = ()) -> str:
        key = (section, name, path)
        wanted = _WANTED.get(key)
        if wanted is None:
            wanted = SECTION_PREFIX[section] + "__".join(sanitise(part) for part in (name, *path))
            if len(_WANTED) >= _WANTED_MAX:
                _WANTED.clear()
            _WANTED[key] = wanted
        candidate, n = wanted, 1
        while candidate in self._taken:
            n += 1
            candidate = f"{wanted}_{n}"
        self._taken.add(candidate)
        return candidate
