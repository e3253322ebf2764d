"""Offered / subscribed event-type sets (NS 2.6, 3.3.1-2): a reference-counted multiset of (domain, type).

``change(added, removed)`` validates every name first (``InvalidEventType`` for a syntactically invalid one) and
then applies both lists atomically. Names may be exact, contain ``*`` wildcards, or be ``%ALL``.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any

import CosNotification
import CosNotifyComm

__all__ = ["TypeSet", "valid_name"]

_NAME = re.compile(r"^[A-Za-z0-9_%*.:\-/ ]*$")


def valid_name(name: str) -> bool:
    """A domain or type name as the channel accepts it (printable, no control characters)."""
    return isinstance(name, str) and len(name) <= 256 and bool(_NAME.fullmatch(name))


class TypeSet:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()

    def change(self, added: Iterable[Any], removed: Iterable[Any]) -> tuple[list[Any], list[Any]]:
        """Apply a change; returns the types that appeared and disappeared in the aggregate."""
        added, removed = list(added), list(removed)
        for et in added + removed:
            if not (valid_name(et.domain_name) and valid_name(et.type_name)):
                raise CosNotifyComm.InvalidEventType(et)
        appeared, gone = [], []
        with self._lock:
            for et in added:
                key = (et.domain_name, et.type_name)
                if self._counts[key] == 0:
                    appeared.append(et)
                self._counts[key] += 1
            for et in removed:
                key = (et.domain_name, et.type_name)
                if self._counts[key] > 0:
                    self._counts[key] -= 1
                    if self._counts[key] == 0:
                        del self._counts[key]
                        gone.append(et)
        return appeared, gone

    def types(self) -> list[Any]:
        with self._lock:
            return [CosNotification.EventType(d, t) for d, t in sorted(self._counts)]
