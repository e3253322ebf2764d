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

A routing transaction (``router.channel.txdelivery``) ends its push at its durable decision and runs its phase two
on the proxy's completer thread afterwards. Its entries are then *held* (:meth:`Flight.hold`, released by
:meth:`Flight.settle` once phase two ended): a teardown waits for them too (bounded by what :meth:`Flight.hold`
asked), so it never deletes the proxy while a decided T2 is still committing. A held entry is never returned as
stuck: its T2 is decided COMMIT and its queue row leaves with the T2's PostgreSQL branch (in phase two, or by
recovery from the COMMIT record if phase two does not end), so recording it ``discarded`` would be false.

A destroy of an admin or a channel tears many proxies down, one after another (each deletes its stored rows). It
first stops them all (:func:`stop_pushing`): none begins a new push from then on, and their waits share one
deadline, the bound counted from that moment. So the destroy waits about one push timeout however many proxies
have a push in flight, not one per proxy (a proxy whose push timed out would otherwise push again while the
proxies before it were waited for, and the destroying client's own call timed out). If the destroy fails part-way
(a teardown's delete raises StoreError: the client gets TRANSIENT and may call again), the proxies it did not tear
down are re-opened (:func:`stopped_pushing`, :func:`reopen`): ``closing`` and the deadline cleared and their
delivery thread woken, so their queued events flow on meanwhile; the proxy whose teardown failed stays stopped
(its teardown is retried). Every proxy's deadline is cleared either way, so a retried destroy waits a fresh bound.
A push supplier's delivery thread idles while its proxy is ``closing`` (as while suspended): it never exits for it.

A delivery path that takes more entries from the queue during its push (the in-process batches of
``router.channel.localpush``, a T2's fill-up in ``router.channel.txdelivery``) marks them too (:meth:`Flight.add`),
drops the ones it settled (:meth:`Flight.drop`: delivered or put back) and raises the wait's bound to what its
path may take (:meth:`Flight.allow`): a teardown that stops waiting records every entry still in flight with
:data:`STUCK_REASON`, not only the ones the dispatcher handed over.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["STUCK_REASON", "Flight", "reopen", "stop_pushing", "stopped_pushing", "teardown_bound_s"]

T = TypeVar("T")

log = logging.getLogger("nsjms.channel")

#: The ledger's reason for entries whose push had not ended when the teardown stopped waiting for it.
STUCK_REASON = ("discarded: the proxy was destroyed while a push of this event was in flight and the push did not "
                "end in time; the consumer may have received it")


class Flight(Generic[T]):
    """At most one push in flight per proxy (its one delivery thread). Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._entries: list[T] = []
        self._thread: int | None = None
        self._bound = 0.0
        self._held: dict[int, tuple[list[T], float]] = {}     # token -> (entries of a decided T2, wait bound)
        self._tokens = 0

    def add(self, entries: list[T]) -> None:
        """Mark more ``entries`` in flight (taken from the queue by the push in flight, on its thread)."""
        if entries:
            with self._cond:
                if self._thread == threading.get_ident():
                    self._entries.extend(entries)

    def drop(self, entries: list[T]) -> None:
        """``entries`` are settled (delivered, or back in the queue): no longer in flight."""
        if entries:
            with self._cond:
                gone = {id(e) for e in entries}
                self._entries = [e for e in self._entries if id(e) not in gone]

    def allow(self, seconds: float) -> None:
        """A teardown waits up to ``seconds`` (at least) for the push in flight to end: its path may take longer
        than one CORBA call (several batches awaiting their COMMIT receipts)."""
        with self._cond:
            if self._thread == threading.get_ident():
                self._bound = max(self._bound, seconds)

    def begin(self, entries: list[T], closing: Callable[[], bool]) -> bool:
        """Mark ``entries``' push in flight; False (nothing marked) when ``closing()`` is already true."""
        with self._cond:
            if closing():
                return False
            self._entries, self._thread = list(entries), threading.get_ident()
            return True

    def hold(self, entries: list[T], seconds: float) -> int:
        """Keep ``entries`` (a decided T2's, its phase two running elsewhere) waited for by a teardown, up to
        ``seconds``, until :meth:`settle` with the returned token. They are never reported stuck."""
        with self._cond:
            self._tokens += 1
            self._held[self._tokens] = (list(entries), seconds)
            return self._tokens

    def settle(self, token: int) -> None:
        """The held entries' phase two ended (committed, or handed to recovery)."""
        with self._cond:
            self._held.pop(token, None)
            self._cond.notify_all()

    def holding(self) -> int:
        """Entries held for a phase two not ended yet."""
        with self._cond:
            return sum(len(e) for e, _ in self._held.values())

    def end(self) -> None:
        with self._cond:
            self._entries, self._thread, self._bound = [], None, 0.0
            self._cond.notify_all()

    def wait_ended(self, timeout_s: float) -> list[T]:
        """Wait up to ``timeout_s`` for the push in flight and the held phase twos to end (at once when there is
        none, or when the caller is the delivery thread itself), or longer when the push's path asked for more
        (:meth:`allow`, :meth:`hold`); returns the push's entries still in flight after that (held ones never:
        see the module docstring)."""
        start = time.monotonic()
        me = threading.get_ident()
        with self._cond:
            while (self._entries and self._thread != me) or self._held:
                bound = max([timeout_s, self._bound] + [s for _, s in self._held.values()])
                left = start + bound - time.monotonic()
                if left <= 0:
                    if self._held:
                        log.warning("a teardown stopped waiting after %g s for the phase two of %d decided routing "
                                    "transaction(s) (%d event(s)); recovery finishes them from their COMMIT "
                                    "records", bound, len(self._held), sum(len(e) for e, _ in self._held.values()))
                    return list(self._entries) if self._thread != me else []
                self._cond.wait(left)
            return []


def teardown_bound_s(rt: Any) -> float:
    """How long a teardown waits for a push in flight: the push's own call timeout and a margin (the bound
    ``PushSupplierMixin._delete_row`` applies)."""
    return float(getattr(rt, "push_timeout_ms", 10_000)) / 1000.0 + 2.0


def stop_pushing(proxies: Iterable[Any], rt: Any) -> None:
    """Before tearing several proxies down one after another: each stops beginning pushes now (``closing``), and
    their teardowns wait for the pushes in flight until one shared deadline (an earlier one a proxy already has
    is kept: the channel's destroy sets it for all its admins' proxies, then each admin's teardown calls this for
    its own; a destroy that failed cleared it, :func:`reopen`, so its retry gets a fresh one)."""
    deadline = time.monotonic() + teardown_bound_s(rt)
    for proxy in proxies:
        with proxy._lock:
            if proxy.destroyed:
                continue
            proxy.closing = True
            if getattr(proxy, "_teardown_deadline", None) is None:
                proxy._teardown_deadline = deadline


def reopen(proxies: Iterable[Any]) -> None:
    """A destroy failed part-way (:func:`stopped_pushing`): every proxy not destroyed loses its teardown deadline
    (a retried destroy waits a fresh bound), and each whose own teardown did not begin (its worker not stopped)
    is no longer ``closing`` and its delivery thread is woken (as ``resume_connection`` does): its queued events
    flow on until the destroy is retried."""
    for proxy in proxies:
        with proxy._lock:
            if proxy.destroyed:
                continue
            proxy._teardown_deadline = None
            if proxy.stop_event.is_set():       # its teardown began and failed: it stays stopped, retryable
                continue
            proxy.closing = False
        proxy._wake()


@contextlib.contextmanager
def stopped_pushing(proxies: Iterable[Any], rt: Any) -> Iterator[None]:
    """:func:`stop_pushing` for the body (the proxies' teardowns); if it raises, :func:`reopen` the proxies."""
    proxies = list(proxies)
    stop_pushing(proxies, rt)
    try:
        yield
    except BaseException:
        reopen(proxies)
        raise
