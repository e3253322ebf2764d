"""Waiting for the broker's answers: a caller's :class:`Waiter` for the receipt (or ERROR) of one frame, a COMMIT
written without waiting (:class:`PendingCommit`), and the stop condition of the reconnect loop
(:class:`EitherEvent`)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stomp.utils import Frame

from router.jms.errors import BrokerError, BrokerUnavailable, UnconfirmedOutcome
from router.jms.stomp.inbound import broker_error

if TYPE_CHECKING:
    from router.jms.session import TxEntry
    from router.jms.stomp.connection import StompConnection

__all__ = ["EitherEvent", "PendingCommit", "Waiter"]


@dataclass
class Waiter:
    """One caller waiting for the answer to a receipted frame (or for CONNECTED)."""

    operation: str
    epoch: int
    loss_is_failure: bool          # True: a lost connection means "not done"; False: the outcome is unknown
    answers: queue.Queue[tuple[str, Frame | None]] = field(default_factory=lambda: queue.Queue(maxsize=1))
    on_answer: Callable[[], None] | None = None     # run on the dispatcher thread when the answer arrives

    def wait(self, timeout: float) -> Frame:
        try:
            kind, frame = self.answers.get(timeout=timeout)
        except queue.Empty:
            raise UnconfirmedOutcome(f"no receipt within {timeout:g} s", self.operation) from None
        if kind == "error" and frame is not None:
            raise broker_error(frame)
        if kind == "lost":
            if self.loss_is_failure:
                raise BrokerUnavailable(f"{self.operation}: connection lost before the broker answered")
            raise UnconfirmedOutcome("connection lost before the receipt", self.operation)
        assert frame is not None
        return frame


class EitherEvent:
    """``is_set``/``wait`` over the caller's shutdown event and the transport's own close event."""

    def __init__(self, *events: threading.Event) -> None:
        self._events = events

    def is_set(self) -> bool:
        return any(e.is_set() for e in self._events)

    def wait(self, timeout: float | None = None) -> bool:
        step = 0.05 if timeout is None else min(0.05, timeout)
        remaining = timeout
        while not self.is_set() and (remaining is None or remaining > 0):
            self._events[0].wait(step)
            remaining = None if remaining is None else remaining - step
        return self.is_set()


class PendingCommit:
    """A COMMIT written by ``StompTransport.commit_pipelined``, its receipt not awaited yet."""

    def __init__(self, transport: StompConnection, transaction: str, entry: TxEntry) -> None:
        self._transport = transport
        self.transaction = transaction
        self._entry = entry
        self.rid: str | None = None
        self._problem: tuple[str | None] | None = None     # the transaction's problem when the answer arrived

    def answered(self) -> None:
        """On the dispatcher thread, as the COMMIT's answer arrives: the transaction leaves the book then, so an
        ERROR for a frame written after the COMMIT (another transaction's, pipelined) cannot mark it."""
        self._problem = (self._entry.rollback_only,)
        self._transport._book.discard_tx(self.transaction)

    def discard(self) -> None:
        """Never wait (the caller is unwinding): the receipt's waiter and the transaction leave the books at once;
        the COMMIT's outcome stays unknown, and its answer, when it comes, is dropped."""
        t = self._transport
        if self.rid is not None:
            t._waiters.pop(self.rid, None)
        t._book.discard_tx(self.transaction)

    def wait(self) -> None:
        """Wait for the COMMIT's receipt (:class:`UnconfirmedOutcome`: the outcome is unknown; :class:`BrokerError`:
        refused, or a frame in the transaction failed)."""
        t = self._transport
        try:
            if self.rid is not None:
                t._wait(self.rid, t._receipt_timeout)
        except BrokerError as exc:
            # ActiveMQ refuses the COMMIT of a transaction whose frame it refused with its own words ("COMMIT FAILED:
            # Transaction marked rollback only"): the refused frame's reason says why (a full store: an outage)
            problem = self._problem[0] if self._problem is not None else self._entry.rollback_only
            if problem and problem not in exc.message:
                raise BrokerError(f"{exc.message} (a frame in the transaction failed: {problem})", exc.body,
                                  exc.receipt_id) from exc
            raise
        finally:
            t._book.discard_tx(self.transaction)
        problem = self._problem[0] if self._problem is not None else self._entry.rollback_only
        if problem:
            raise BrokerError(f"transaction {self.transaction}: a frame in it failed before the COMMIT was "
                              f"confirmed ({problem}); the broker committed it without that frame")
