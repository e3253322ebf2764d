"""Pull delivery of a proxy supplier (split from :mod:`router.channel.proxies`): ``pull*`` and ``try_pull*``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from omniORB import CORBA

import CosEventComm

from router.channel import txdelivery
from router.channel.boundary import MINOR_PULL_WAIT_OVER
from router.channel.proxybase import _IDLE_WAIT, _MAX_PULL_WAIT, ProxySupplierBase
from router.channel.queue import Entry
from router.channel.store import ProxyRow, StoreError

__all__ = ["PullSupplierMixin"]


class PullSupplierMixin(ProxySupplierBase):
    """Pull delivery: the consumer calls ``pull*`` (blocking) or ``try_pull*``.

    A pulled event leaves the in-memory queue at once, but its stored row stays until a later pull confirms it: a
    pull confirms only the entries of pulls whose reply had been built before it started (a request that arrives
    after a reply was built shows that reply went out). A crash in between therefore redelivers the last pulled
    events after the restart instead of losing them: pull delivery of persistent events is at-least-once, with at
    most one pull's worth of duplicates per consumer and crash.

    A blocking pull waits at most :attr:`max_pull_wait` seconds (shorter than the ORBs' client call timeouts), then
    answers ``TRANSIENT`` (``COMPLETED_NO``, nothing taken) and the client pulls again: a pull the client abandoned
    never takes an event whose reply nobody reads.
    """

    max_pull_wait = _MAX_PULL_WAIT

    def __init__(self, admin: Any, row: ProxyRow) -> None:
        super().__init__(admin, row)
        self._unconfirmed: list[Entry] = []     # handed out by pulls whose reply was built; the next pull confirms
        self._pull_lock = threading.Lock()
        self._pulls_ended = threading.Condition(self._pull_lock)   # a teardown waits for the pulls in progress
        self._pulls_active = 0

    def _begin_pull(self) -> None:
        """Confirm what the pulls finished before this one handed out (their replies were built, and this request
        comes after them); the entries of pulls still in progress are not in ``_unconfirmed`` yet."""
        with self._pull_lock:
            done, self._unconfirmed = self._unconfirmed, []
            self._pulls_active += 1
        if not done:
            return
        try:
            self._finish(done, wait=False)      # never block a client's pull on the database
        except StoreError:
            with self._pull_lock:               # still unconfirmed: the next pull tries again
                self._unconfirmed = done + self._unconfirmed
                self._pulls_active -= 1
                self._pull_ended()
            raise                               # TRANSIENT at the servant boundary: the client pulls again

    def _end_pull(self, handed: list[Entry]) -> None:
        """The pull's reply is built: from now on its entries may be confirmed by the next pull."""
        with self._pull_lock:
            self._pulls_active -= 1
            self._pull_ended()
            if not self.destroyed:
                self._unconfirmed.extend(handed)
                handed = []
        for e in handed:                        # the proxy went away meanwhile: its rows are gone with it
            e.record.release()

    _pulls_ended: threading.Condition | None = None    # per proxy (__init__); None for proxies built bare in tests

    def _pull_ended(self) -> None:
        """Under ``_pull_lock``: wake a teardown waiting for the pulls in progress."""
        if self._pulls_ended is not None:
            self._pulls_ended.notify_all()

    def _delete_row(self, retry: bool) -> None:
        """The teardown's delete: the pulls in progress end first (a blocking one sees the proxy disconnected at
        once; bounded by the pull's own limit), so what they hand out is among the entries handed out."""
        if self._pulls_ended is not None:
            with self._pull_lock:
                self._pulls_ended.wait_for(lambda: self._pulls_active == 0, self.max_pull_wait + 2.0)
        super()._delete_row(retry)

    def _deliveries_before_delete(self, conn: Any) -> None:
        """Entries handed out by pulls whose reply was built are recorded ``delivered``, not ``discarded`` with the
        proxy's queued events: the teardown comes after those replies went out, which is what a next pull would
        have taken as their confirmation (the class docstring)."""
        with self._pull_lock:
            handed = list(self._unconfirmed)
        ids = [e.record.db_id for e in handed if e.record.db_id is not None]
        if ids:
            self.rt.store.delete_deliveries(conn, self.channel.id, self.admin.id, self.id, ids)

    def _release_resources(self) -> None:
        with self._pull_lock:
            pending, self._unconfirmed = self._unconfirmed, []
        for e in pending:
            e.record.release()
        super()._release_resources()

    def _check_pullable(self) -> None:
        self._check_alive()
        self._check_open()       # not while its channel is handed over (TRANSIENT: the retry reaches the new owner)
        if not self.connected:
            raise CosEventComm.Disconnected()

    def _blocking_take(self, want: Callable[[], int]) -> list[Entry]:
        """Begin a pull and wait for entries. The pull stays in progress (its entries cannot be confirmed) until
        :meth:`_end_pull`, once its reply is built; on an exception it ends here, having taken nothing."""
        self._begin_pull()
        try:
            return self._blocking_wait(want)
        except BaseException:
            self._end_pull([])
            raise

    def _blocking_wait(self, want: Callable[[], int]) -> list[Entry]:
        started = time.time()
        give_up = time.monotonic() + self.max_pull_wait
        while True:
            self._check_pullable()
            if self.rt.shutting_down.is_set():
                raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)
            if not self.suspended:
                n = want()
                count = self.queue.peek_count()
                pacing = self.pacing()
                if count >= n or (count and time.time() - started >= pacing):
                    entries: list[Entry] = self.queue.take(self.batch_limit(n), self.rt.max_event_bytes)
                    if entries:
                        return entries
            left = give_up - time.monotonic()
            if left <= 0:                       # answer before the client's call timeout abandons the pull
                raise CORBA.TRANSIENT(MINOR_PULL_WAIT_OVER, CORBA.COMPLETED_NO)
            self.queue.wait(min(_IDLE_WAIT, left))

    def _try_take(self, n: int) -> list[Entry]:
        """Begin a pull and take what is there (see :meth:`_blocking_take`)."""
        self._begin_pull()
        try:
            self._check_pullable()
            if self.suspended:
                return []
            taken: list[Entry] = self.queue.take(self.batch_limit(n), self.rt.max_event_bytes)
            return taken
        except BaseException:
            self._end_pull([])
            raise

    def _serve(self, entries: list[Entry]) -> tuple[Any, bool]:
        """Build the reply to a pull begun by ``_blocking_take``/``_try_take`` and end that pull."""
        handed: list[Entry] = []
        try:
            if not entries:
                return self.empty_value(), False
            value = self._hand_out(entries)
            handed = entries
            return value, True
        finally:
            self._end_pull(handed)

    def _pull(self, want: Callable[[], int]) -> Any:
        return self._serve(self._blocking_take(want))[0]

    def _try_pull(self, n: int) -> tuple[Any, bool]:
        return self._serve(self._try_take(n))

    def _hand_out(self, entries: list[Entry]) -> Any:
        """The reply to a pull. If converting the entries fails, they are handled as a content failure (never
        counted as handed out); the consumer gets TRANSIENT and pulls again."""
        try:
            value = self.convert(entries)
        except Exception as exc:
            self.content_failed(entries, exc)
            raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO) from exc
        self.delivered_one_batch()
        return value

    def start(self) -> None:
        """Nothing runs (the client pulls); says once if its EnableTransaction cannot be honoured."""

        if self.connected and not self.destroyed:
            txdelivery.warn_unavailable(self)
        super().start()

    def status_extra(self) -> dict[str, Any]:

        return {**self.dead_letter_status(), **txdelivery.unavailable(self)}

    def _limit(self, max_number: int) -> int:
        size = self.batch_size()
        return size if max_number <= 0 else min(max_number, size)
