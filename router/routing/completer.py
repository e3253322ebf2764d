"""The phase-two thread of one T2 client (a proxy): decided T2s complete in the order they were decided.

:class:`~router.routing.runner.T2Runner` hands a decided T2's phase two to one of these, so its client goes on
with the next T2 meanwhile (pipelining, docs/transactions.md "Pipelining"). Moved here from
``router.channel.txdelivery`` (issue 24): both directions use it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

__all__ = ["Completer"]

log = logging.getLogger("nsjms.routing")


class Completer:
    """Phase two of one proxy's decided T2s, in the order they were decided, on one thread of its own.

    The depth is bounded by :meth:`wait_for_room`, which the proxy calls before it begins a T2: it waits until at
    most one T2 is still in the completer, so a proxy holds at most TWO T2s at any moment (one in phase two and
    one in phase one, or one in phase two and one decided waiting for it): two pooled sessions and two prepared
    PostgreSQL transactions per T2 proxy (docs/transactions.md "Depth"). :meth:`submit` therefore never waits
    behind more than the one T2 the thread runs. The thread is started on demand and ends when idle. Phase two of
    T2 *n* always ends (its broker COMMIT receipted or given up) before phase two of T2 *n+1* starts: the broker
    commits the proxy's batches in the order it took them."""

    DEPTH = 1            # T2s in the completer (phase two, or decided and waiting for it) when a new one may begin
    IDLE_S = 2.0

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.Queue[Callable[[], None]] = queue.Queue(maxsize=1)
        self._cond = threading.Condition()
        self._pending = 0
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        with self._cond:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        self._jobs.put(job)

    def wait_for_room(self) -> None:
        """Wait until at most :attr:`DEPTH` T2s are in the completer (see the class docstring); bounded by the
        phase two of the oldest one (its broker COMMIT's receipt timeout)."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending <= self.DEPTH)

    def pending(self) -> int:
        with self._cond:
            return self._pending

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every submitted T2 finished its phase two; False if ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)

    def _run(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._cond:
                    if self._pending == 0:
                        self._thread = None
                        return
                continue
            try:
                job()
            except BaseException:  # the thread must outlive any job, or drain() would never end
                log.exception("%s: a phase-two job failed", self.name)
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()
