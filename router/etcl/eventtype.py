"""Event type filtering of a constraint's ``event_types`` list (NS 2.3, 2.6.6).

``*`` matches zero or more characters anywhere in a domain or type name (a plain substring
algorithm, no regular expressions). An empty list, a ``{"", ""}`` entry, and a ``%ALL`` type name with
domain ``""`` or ``"*"`` match every event; ``%ALL`` with another domain matches every type of that
domain.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["event_type_matches", "wildcard_match"]


def wildcard_match(pattern: str, text: str) -> bool:
    """True if ``text`` matches ``pattern`` where ``*`` stands for any run of characters."""
    parts = pattern.split("*")
    if len(parts) == 1:
        return pattern == text
    first, last = parts[0], parts[-1]
    if len(text) < len(first) + len(last) or not text.startswith(first) or not text.endswith(last):
        return False
    pos, end = len(first), len(text) - len(last)
    for part in parts[1:-1]:
        found = text.find(part, pos, end)
        if found < 0:
            return False
        pos = found + len(part)
    return True


def _entry_matches(pattern: Any, domain: str, type_name: str) -> bool:
    p_domain, p_type = str(pattern.domain_name), str(pattern.type_name)
    if p_domain == "" and p_type == "":
        return True
    if p_type == "%ALL":
        return p_domain == "" or wildcard_match(p_domain, domain)
    return wildcard_match(p_domain, domain) and wildcard_match(p_type, type_name)


def event_type_matches(patterns: Iterable[Any], domain: str, type_name: str) -> bool:
    """Whether an event of ``(domain, type_name)`` passes a list of ``CosNotification._EventType``."""
    entries = list(patterns)
    return not entries or any(_entry_matches(p, domain, type_name) for p in entries)
