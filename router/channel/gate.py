"""A channel's entry gate for accepted events: a hand-over of the channel to another node (router/cluster/release.py)
closes it and waits for the routes in flight, so no event is stored for the channel here after its ownership moved.
Making an admin or a proxy and an Ack proxy's ``acknowledge`` pass the same gate (their rows must be written
before the next owner loads the channel, or not at all). A call refused at a closed gate is ``TRANSIENT``
(``COMPLETED_NO``: nothing was stored; asked again, the channel's new owner answers)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from omniORB import CORBA

__all__ = ["Gate"]


class Gate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._passing = 0
        self.closed = False

    @contextlib.contextmanager
    def passing(self) -> Iterator[None]:
        with self._cond:
            if self.closed:
                raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)
            self._passing += 1
        try:
            yield
        finally:
            with self._cond:
                self._passing -= 1
                if not self._passing:
                    self._cond.notify_all()

    def close(self, timeout_s: float) -> bool:
        """Refuse new routes and wait (at most ``timeout_s``) for those in flight; False if some still run."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self.closed = True
            while self._passing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True
