"""The push a proxy supplier has in flight, so a teardown (the proxy, its admin or its channel destroyed) records
what the consumer got as it happened.

A push proxy supplier's delivery thread takes entries from the queue and pushes them to the consumer; a teardown
on another thread deletes the proxy's stored rows, and the rows still queued are recorded ``discarded``. Entries
whose push is in flight then are neither queued nor delivered yet: deleted as ``discarded``, an event the consumer
received would look dropped in the ledger (review finding). So the delivery thread marks a push in flight
(:meth:`Flight.begin`, refused once the proxy is closing: nothing is pushed after a teardown began) and the teardown
waits for it to end (:meth:`Flight.wait_ended`, bounded by the push's own call timeout): a push that returned OK
has put its entries with the delivered ones, which the teardown records ``delivered``; a failed one has put them
back in the queue, recorded ``discarded`` with the proxy's other rows (the consumer did not take them). A push still
running after the bound is recorded with :data:`STUCK_REASON`, never silently.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["STUCK_REASON", "Flight"]

T = TypeVar("T")

#: The ledger's reason for entries whose push had not ended when the teardown stopped waiting for it.
STUCK_REASON = ("discarded: the proxy was destroyed while a push of this event was in flight and the push did not "
                "end in time; the consumer may have received it")


class Flight(Generic[T]):
    """At most one push in flight per proxy (its one delivery thread). Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._entries: list[T] = []
        self._thread: int | None = None

    def begin(self, entries: list[T], closing: Callable[[], bool]) -> bool:
        """Mark ``entries``' push in flight; False (nothing marked) when ``closing()`` is already true."""
        with self._cond:
            if closing():
                return False
            self._entries, self._thread = list(entries), threading.get_ident()
            return True

    def end(self) -> None:
        with self._cond:
            self._entries, self._thread = [], None
            self._cond.notify_all()

    def wait_ended(self, timeout_s: float) -> list[T]:
        """Wait up to ``timeout_s`` for the push in flight to end (at once when there is none, or when the caller
        is the delivery thread itself); returns the entries of a push still in flight after that."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._entries and self._thread != threading.get_ident():
                left = deadline - time.monotonic()
                if left <= 0:
                    return list(self._entries)
                self._cond.wait(left)
            return []
