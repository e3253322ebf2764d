"""The broker side of a JMS → channel round: the frames that settle its deliveries (ACK, NACK, dead-letter SEND).

* :class:`AckBranch`: in a routing transaction (T2), the broker branch: one STOMP transaction holding the
  batch's frames, one-phase (STOMP has no prepare), committed only after the PostgreSQL branch committed;
* :class:`LocalAcks`: without a T2 (a local unit of work), the same frames written in order after the local
  transaction committed.

Both are filled by :class:`router.bridge.t2in.InboundT2` and give their deliveries back when the round rolls back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from psycopg import Xid

from router.bridge.txbranch import _Background
from router.jms.model import Destination, JmsMessage
from router.jms.refusal import is_resource
from router.jms.transport import (
    BrokerError,
    Confirm,
    Delivery,
    SendRefused,
    Transport,
    TransportError,
    resource_refusal,
)
from router.routing.t2.transactions import ACK_MANAGER
from xa.errors import BranchUnavailable, OutcomeUnknown, PrepareFailed, UsageError

__all__ = ["ACK_RUN", "AckBranch", "LocalAcks", "transport_book"]

log = logging.getLogger("nsjms.bridge")

#: Receipt-less ACKs of a T2's broker branch written together (one socket write); a run goes out when it is this
#: long, before any other frame, and before the last (receipted) frame.
ACK_RUN = 32


def transport_book(transport: Any) -> Any:
    """The transport's session book (both implementations keep one), or None for a stand-in without one."""
    try:
        return getattr(transport, "_book", None)
    except TransportError:
        return None


class AckBranch:
    """The broker branch of a JMS → channel T2: one STOMP transaction holding the batch's ACKs (and NACKs and
    dead-letter SENDs). One-phase (STOMP has no prepare):

    * ``begin`` = STOMP BEGIN (receipted);
    * :meth:`ack` / :meth:`nack` / :meth:`send` put frames in it; each frame is written when the next one is
      added (receipt-less ACKs in runs of up to :data:`ACK_RUN`, one socket write each, issue 12 round 5; a run
      goes out before any other frame), the last one is held back for ``prepare``;
    * ``prepare`` = write the last frame WITH a receipt (the broker answers frames in order, so an ERROR for an
      earlier receipt-less frame has arrived by then) and check no frame of the transaction got an ERROR;
    * ``commit`` = STOMP COMMIT, after the decision is durable and the PostgreSQL branch committed. A lost receipt
      or connection is :class:`OutcomeUnknown`: the messages the broker did not take are redelivered and the
      inbox recognises them; ``on_unknown`` is told (a live connection must be renewed for that redelivery);
    * ``rollback`` = ABORT (a lost connection already rolled it back); ``on_rollback`` gets the branch (and so
      its deliveries) back.
    """

    kind = ACK_MANAGER
    manager = ACK_MANAGER
    one_phase_only = True

    def __init__(self, transport: Transport, deliveries: Sequence[Delivery] = (), *, name: str = "stomp-ack",
                 on_rollback: Callable[[AckBranch], None] | None = None,
                 on_commit: Callable[[], None] | None = None,
                 on_unknown: Callable[[BaseException], None] | None = None,
                 background_begin: bool = False) -> None:
        self.transport = transport
        self.name = name
        self.deliveries = list(deliveries)     # given back to on_rollback: the T2 took them from the subscription
        self.tx: str | None = None
        self.frames = 0
        self._gtrid: str | None = None
        self._last: Callable[[Confirm], None] | None = None
        self._last_ack: Delivery | None = None  # the delivery ``_last`` acknowledges, when it is an ACK
        self._acks: list[Delivery] = []          # receipt-less ACKs not yet written (a run, see ACK_RUN)
        self._on_rollback = on_rollback
        self._on_commit = on_commit
        self._on_unknown = on_unknown
        self._ended = False
        self.refused: str | None = None        # set when prepare found a frame the broker answered with ERROR
        self._background_begin = background_begin
        self._begin: _Background | None = None
        self._sealed: _Background | None = None  # the last frame, written by seal() and receipted in the background
        self.finished = threading.Event()       # set once commit() or rollback() returned or raised: nothing in flight

    def sort_key(self) -> str:
        return "~stomp-ack"

    # -- protocol -----------------------------------------------------------------------------------------
    def begin(self, xid: Xid) -> None:
        """STOMP BEGIN, receipted. ``background_begin``: the BEGIN is written and its receipt awaited on a worker
        thread (``router.bridge.txbranch``'s): the caller's inbox claims and mapping run meanwhile (with the
        previous T2's COMMIT in flight on the same connection, the broker answers the BEGIN only after it), and
        the first frame waits for it; a failed BEGIN is raised there, still as :class:`BranchUnavailable`."""
        self._gtrid = xid.gtrid
        if self._background_begin:
            self._begin = _Background(self._begin_now)
            return
        self._begin_now()

    def _begin_now(self) -> None:
        try:
            self.tx = self.transport.begin()
        except TransportError as exc:
            raise BranchUnavailable(f"STOMP BEGIN failed: {exc}", gtrid=self._gtrid, branch=self.name) from exc

    def _settle_begin(self) -> None:
        """Wait for a background BEGIN; its failure is raised here."""
        pending, self._begin = self._begin, None
        if pending is not None and (error := pending.wait()) is not None:
            raise error

    def seal(self) -> None:
        """No more frames: write the last one now WITH its receipt, awaited on a worker thread, so the broker works
        through the batch's frames while the PostgreSQL branch prepares (the coordinator prepares it first);
        :meth:`prepare` then only waits for that receipt. A frame added after this is a :class:`UsageError`."""
        self._settle_begin()
        last, self._last = self._last, None
        self._last_ack = None
        if last is not None and not self._ended:
            def write_rest() -> None:             # the pending run of ACKs, then the last frame
                self._write_acks()
                last(Confirm.CONFIRMED)

            self._sealed = _Background(write_rest)

    def prepare(self) -> None:
        self._settle_begin()
        last, self._last = self._last, None
        self._last_ack = None
        sealed, self._sealed = self._sealed, None
        try:
            if last is not None:
                self._write_acks()
                last(Confirm.CONFIRMED)
            if sealed is not None and (error := sealed.wait()) is not None:
                raise error
        except TransportError as exc:
            if isinstance(exc, BrokerError | SendRefused) and not resource_refusal(exc):
                self.refused = str(exc)           # a broker out of a resource refuses no frame in particular
            raise PrepareFailed(f"a frame of the STOMP transaction failed: {exc}", gtrid=self._gtrid,
                                branch=self.name) from exc
        problem = self._problem()
        if problem:
            if not is_resource(problem):
                self.refused = problem
            raise PrepareFailed(f"a frame of the STOMP transaction got an ERROR: {problem}", gtrid=self._gtrid,
                                branch=self.name)

    def commit(self) -> None:
        if self.tx is None:
            raise UsageError("commit of a STOMP ack branch that was never begun", gtrid=self._gtrid)
        self._ended = True
        try:
            try:
                self.transport.commit(self.tx)
            except TransportError as exc:
                if self._on_unknown is not None:
                    self._on_unknown(exc)
                raise OutcomeUnknown(f"STOMP COMMIT not confirmed ({type(exc).__name__}: {exc}); the broker "
                                     "redelivers what it did not take and the inbox recognises it",
                                     gtrid=self._gtrid, branch=self.name) from exc
            if self._on_commit is not None:
                self._on_commit()
        finally:
            self.finished.set()

    def rollback(self) -> None:
        if self._ended:
            return
        self._ended = True
        try:
            self._rollback()
        finally:
            self.finished.set()

    def _rollback(self) -> None:
        self._last, self._last_ack = None, None
        self._acks = []                          # never written: they stay un-acknowledged on the subscription
        try:
            self._settle_begin()                 # the ABORT goes after the BEGIN, for a transaction that began
        except Exception as exc:  # noqa: BLE001 — a BEGIN that failed began nothing: nothing to abort
            log.info("STOMP BEGIN of %s failed (%s): nothing to abort", self._gtrid, exc)
        sealed, self._sealed = self._sealed, None
        if sealed is not None:
            sealed.wait()                        # the ABORT goes after the sealed last frame, never before it
        if self.tx is not None:
            try:
                self.transport.abort(self.tx)
            except TransportError as exc:        # a lost connection rolled it back already
                log.info("ABORT of %s not confirmed (%s): the broker rolls it back with the connection", self.tx,
                         exc)
        if self._on_rollback is not None:
            self._on_rollback(self)

    # -- frames ---------------------------------------------------------------------------------------------
    def ack(self, delivery: Delivery) -> None:
        self._frame(lambda confirm: self.transport.ack(delivery, self.tx, confirm=confirm), ack=delivery)

    def nack(self, delivery: Delivery) -> None:
        self._frame(lambda confirm: self.transport.nack(delivery, self.tx, confirm=confirm))

    def send(self, destination: Destination, message: JmsMessage, before: Delivery | None = None) -> None:
        """A SEND in the transaction (a dead letter); ``before`` does not matter here: the frames are atomic."""
        self._frame(lambda confirm: self.transport.send(destination, message, transaction=self.tx,
                                                        confirm=confirm))

    def _frame(self, write: Callable[[Confirm], None], ack: Delivery | None = None) -> None:
        if not self._ended:
            self._settle_begin()
        if self.tx is None or self._ended or self._sealed is not None:
            raise UsageError("a frame for a STOMP ack branch that is not active", gtrid=self._gtrid)
        previous, self._last = self._last, write
        previous_ack, self._last_ack = self._last_ack, ack
        self.frames += 1
        if previous_ack is not None:             # a receipt-less ACK: joins the run
            self._acks.append(previous_ack)
            if len(self._acks) >= ACK_RUN:
                self._write_acks()
            return
        if previous is not None:
            self._write_acks()
            try:
                previous(Confirm.PIPELINED)
            except (BrokerError, SendRefused) as exc:   # the broker refused it (an ERROR frame)
                if not resource_refusal(exc):
                    self.refused = str(exc)
                raise

    def _write_acks(self) -> None:
        """Write the pending run of receipt-less ACKs (one socket write)."""
        acks, self._acks = self._acks, []
        if acks:
            self.transport.ack_many(acks, self.tx)

    def _problem(self) -> str | None:
        book = transport_book(self.transport)
        if book is None or self.tx is None:
            return None
        try:
            entry = book.get_tx(self.tx)
        except TransportError:
            return "the transaction is no longer known to the transport"
        if not book.is_live(entry):
            return "the connection that holds the transaction was lost"
        reason: str | None = entry.rollback_only
        return reason


class LocalAcks:
    """The frames of a NON-transactional round (no EnableTransaction, the channel in this process): the inbox claims
    and the events go in one local PostgreSQL transaction; these frames (ACKs, dead-letter SENDs, NACKs) are
    written in order only after it committed (:meth:`settle`). A frame that fails then leaves its message
    un-acknowledged: the next round reconnects first, the broker redelivers, and the inbox recognises it."""

    def __init__(self, transport: Transport, deliveries: Sequence[Delivery], *,
                 on_rollback: Callable[[LocalAcks], None], on_commit: Callable[[], None],
                 on_failed: Callable[[BaseException, bool], None]) -> None:
        self.transport = transport
        self.deliveries = list(deliveries)
        self.refused: str | None = None
        # (kind, the delivery it settles or None, the dead letter of a "send"), in the order they are written
        self._frames: list[tuple[str, Delivery | None, tuple[Destination, JmsMessage] | None]] = []
        self._on_rollback = on_rollback
        self._on_commit = on_commit
        self._on_failed = on_failed
        self._ended = False

    def ack(self, delivery: Delivery) -> None:
        self._frames.append(("ack", delivery, None))

    def nack(self, delivery: Delivery) -> None:
        self._frames.append(("nack", delivery, None))

    def send(self, destination: Destination, message: JmsMessage, before: Delivery | None = None) -> None:
        """A dead letter; ``before``: written before that delivery's ack (a dead letter must be stored before its
        original is acknowledged: these frames are not atomic)."""
        at = next((i for i, (_, d, _) in enumerate(self._frames)
                   if before is not None and d is not None and d.message_id == before.message_id), len(self._frames))
        self._frames.insert(at, ("send", None, (destination, message)))

    def settle(self) -> None:
        """After the local transaction committed: write the frames, in order; consecutive ACKs (receipt-less) go
        out together (``ack_many``: one socket write, issue 12 round 5). Never raises (see the class docstring)."""
        self._ended = True
        acks: list[Delivery] = []
        try:
            for kind, delivery, letter in self._frames:
                if kind == "ack" and delivery is not None:
                    acks.append(delivery)
                    continue
                self._write_acks(acks)
                acks = []
                if kind == "nack" and delivery is not None:
                    self.transport.nack(delivery, confirm=Confirm.CONFIRMED)
                elif letter is not None:
                    self.transport.send(letter[0], letter[1], confirm=Confirm.CONFIRMED)
            self._write_acks(acks)
        except TransportError as exc:
            self._on_failed(exc, isinstance(exc, SendRefused | BrokerError) and not resource_refusal(exc))
            return
        self._on_commit()

    def _write_acks(self, deliveries: list[Delivery]) -> None:
        if deliveries:
            self.transport.ack_many(deliveries)

    def rollback(self) -> None:
        """The local transaction did not commit: nothing was written; the deliveries go back."""
        if not self._ended:
            self._ended = True
            self._on_rollback(self)
