"""The broker SEND branch of a channel → JMS routing transaction (T2, NJI 2.7.5.1): a one-phase ``xa`` participant.

STOMP has no prepare, so the broker is T2's single one-phase participant (docs/transactions.md):

* ``begin(xid)``: STOMP ``BEGIN`` on the bridge's transport (receipted). With ``background_begin=True`` the
  BEGIN is sent and its receipt awaited on a worker thread: the caller does its PostgreSQL work meanwhile (the
  BEGIN queues at the broker behind the previous T2's COMMIT on the same connection), and the first
  :meth:`SendBranch.send` or :meth:`SendBranch.send_many` (or ``prepare`` / ``rollback``) waits for it (a caller
  that has other work asks :meth:`SendBranch.begun` first); a failed BEGIN then raises there
  (:class:`~xa.errors.BranchUnavailable`, as from ``begin``);
* the caller's work: :meth:`SendBranch.send` each frame with ``transaction`` (or :meth:`SendBranch.send_many` a run
  of them: receipt-less, few socket writes); only the LAST frame of the batch asks for a receipt
  (:meth:`SendBranch.send` with ``last=True``): STOMP answers in order, so once that receipt is in, every ERROR
  frame for an earlier frame has arrived and is in the transport's transaction book;
* ``prepare()``: votes no (:class:`~xa.errors.PrepareFailed`) unless the last frame was receipted and the book has
  no problem for the transaction (an ERROR for one of its frames, its connection lost). It never commits. With
  ``background=True`` the last frame is sent and its receipt awaited on a worker thread and ``prepare()``
  waits for it: the coordinator prepares the PostgreSQL branches first, so their ``PREPARE TRANSACTION`` runs
  while the broker works through the batch (a refused last frame then fails ``prepare()`` with ``content``
  set, as any ERROR for a frame of the batch does); ``rollback()`` too waits for it before its ABORT, so the
  ABORT never overtakes the last SEND on the wire;
* ``commit()``: STOMP ``COMMIT`` (receipted), called only after the decision is durable. A missing receipt, a lost
  connection or an ERROR there is :class:`~xa.errors.OutcomeUnknown`, never "aborted": recovery re-sends the
  transaction's outbox rows with the same dedupe ids (``router.routing.t2.transactions.OutboxResender``);
* ``rollback()``: STOMP ``ABORT``; a transaction of a lost connection is already rolled back by the broker.

Transport errors are translated into ``xa`` errors here (the adapter's one boundary); the frames' own failures
(:meth:`send`) propagate as transport errors so that the bridge can tell a refused message from an outage.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence

from psycopg import Xid

from router.jms.refusal import RESOURCE_MARK, is_resource
from router.jms.transport import (
    BrokerUnavailable,
    Confirm,
    EncodedMessage,
    SendRefused,
    Transport,
    TransportError,
    UnconfirmedOutcome,
)
from router.routing.t2.transactions import SEND_MANAGER
from xa.errors import BranchUnavailable, OutcomeUnknown, PrepareFailed, UsageError

__all__ = ["SendBranch"]

log = logging.getLogger("nsjms.t2")


class SendBranch:
    """One STOMP transaction of one T2 on ``transport`` (see the module docstring)."""

    kind = "stomp-send"
    manager = SEND_MANAGER
    one_phase_only = True

    def __init__(self, transport: Transport, name: str = "broker", *,
                 on_problem: Callable[[Exception], None] | None = None, background_begin: bool = False) -> None:
        self.transport = transport
        self.name = name
        self.on_problem = on_problem     # told of a broker failure met by the background last frame (outage)
        self.tx: str | None = None
        self.xid: Xid | None = None
        self.sent = 0
        self.confirmed = True            # nothing sent yet: nothing to confirm
        self._last: _Background | None = None
        self._background_begin = background_begin
        self._begin: _Background | None = None

    def sort_key(self) -> str:
        return self.name

    def _gtrid(self) -> str | None:
        return self.xid.gtrid if self.xid is not None else None

    # -- protocol ---------------------------------------------------------------------------------------------
    def begin(self, xid: Xid) -> None:
        self.xid = xid
        if self._background_begin:
            self._begin = _Background(self._begin_now)
            return
        self._begin_now()

    def _begin_now(self) -> None:
        try:
            self.tx = self.transport.begin()
        except TransportError as exc:
            raise BranchUnavailable(f"STOMP BEGIN failed: {exc}", gtrid=self._gtrid(), branch=self.name) from exc

    def begun(self) -> bool:
        """True unless a background BEGIN is still waiting for its receipt (never blocks): a caller with other work
        to do sends later instead of waiting for it (:meth:`send` and :meth:`send_many` would)."""
        pending = self._begin
        return pending is None or pending.done()

    def _settle_begin(self) -> None:
        """Wait for a background BEGIN; its failure is raised here (BranchUnavailable)."""
        pending, self._begin = self._begin, None
        if pending is not None and (error := pending.wait()) is not None:
            raise error

    def _open_tx(self) -> str:
        """Before a frame: the BEGIN settled, the transaction begun and not closed by its last frame; returns its
        STOMP transaction id (``confirmed`` is false from here until a receipted last frame)."""
        self._settle_begin()
        if self.tx is None:
            raise UsageError(f"branch {self.name}: send before begin", gtrid=self._gtrid())
        if self._last is not None:
            raise UsageError(f"branch {self.name}: send after the last frame", gtrid=self._gtrid())
        self.confirmed = False
        return self.tx

    def send(self, destination: str, encoded: EncodedMessage, *, persistent: bool, last: bool,
             background: bool = False) -> None:
        """Send one frame in the transaction; ``last`` asks for the receipt that :meth:`prepare` needs. Transport
        errors propagate unchanged (:class:`~router.jms.transport.SendRefused`: the broker refused this frame).
        ``background`` (with ``last``): send it and wait for its receipt on a thread; :meth:`prepare` reports."""
        tx = self._open_tx()
        if last and background:
            self._last = _Background(lambda: self.transport.send_encoded(destination, encoded, persistent=persistent,
                                                                          transaction=tx, confirm=Confirm.CONFIRMED),
                                     self.sent)
            self.sent += 1
            return
        self.transport.send_encoded(destination, encoded, persistent=persistent, transaction=tx,
                                    confirm=Confirm.CONFIRMED if last else Confirm.PIPELINED)
        self.sent += 1
        self.confirmed = last

    def send_many(self, destination: str, messages: Sequence[tuple[EncodedMessage, bool]]) -> None:
        """Receipt-less frames ``(encoded, persistent)`` in the transaction, in order, before the last one: the
        frames and the transport's book exactly as that many :meth:`send` calls without ``last``, through the
        transport's ``send_encoded_many`` (the STOMP transport writes them with few socket writes; over TLS it hands
        each frame to stomp.py itself). Errors as :meth:`send`; :attr:`sent` counts the frames handed over (on a
        failure: the index of the first frame not known to be written)."""
        if not messages:
            return
        tx = self._open_tx()
        self.transport.send_encoded_many(destination, messages, transaction=tx)
        self.sent += len(messages)

    def _settle_last(self) -> None:
        """Wait for the background last frame; a failure becomes this branch's vote (see the module docstring)."""
        last, self._last = self._last, None
        if last is None:
            return
        error = last.wait()
        if error is None:
            self.confirmed = True
            return
        if isinstance(error, SendRefused):
            failed = PrepareFailed(f"branch {self.name}: broker refused message {last.index} of the batch: "
                                   f"{error.message or error.reason}", gtrid=self._gtrid(), branch=self.name)
            failed.content = True  # type: ignore[attr-defined]
            raise failed from error
        if isinstance(error, Exception) and self.on_problem is not None:
            try:
                self.on_problem(error)
            except Exception:
                log.exception("branch %s: the broker-problem callback failed", self.name)
        raise PrepareFailed(f"branch {self.name}: sending the last message of the batch failed: "
                            f"{type(error).__name__}: {error}", gtrid=self._gtrid(), branch=self.name) from error

    def prepare(self) -> None:
        try:
            self._settle_begin()
        except BranchUnavailable as exc:
            raise PrepareFailed(f"branch {self.name}: {exc}", gtrid=self._gtrid(), branch=self.name) from exc
        if self.tx is None:
            raise PrepareFailed(f"branch {self.name}: no STOMP transaction", gtrid=self._gtrid(), branch=self.name)
        self._settle_last()
        if not self.confirmed:
            raise PrepareFailed(f"branch {self.name}: the last frame of the batch was not receipted",
                                gtrid=self._gtrid(), branch=self.name)
        try:
            problem = self.transport.transaction_problem(self.tx)
            connected = self.transport.is_connected()
        except TransportError as exc:
            problem, connected = str(exc), False
        if problem:
            # an ERROR frame for a frame of the batch on a live connection: the broker refused the batch's content,
            # unless it refused for lack of a resource (a full store, usage limits: an outage, router.jms.refusal)
            resource = is_resource(problem)
            mark = f" ({RESOURCE_MARK}: an outage)" if resource and RESOURCE_MARK not in problem else ""
            failed = PrepareFailed(f"branch {self.name}: {problem}{mark}", gtrid=self._gtrid(), branch=self.name)
            failed.content = connected and not resource  # type: ignore[attr-defined]
            raise failed

    def commit(self) -> None:
        assert self.tx is not None
        try:
            self.transport.commit(self.tx)
        except TransportError as exc:    # UnconfirmedOutcome, lost connection, ERROR: the broker's outcome is unknown
            raise OutcomeUnknown(f"STOMP COMMIT of {self.tx}: {type(exc).__name__}: {exc}", gtrid=self._gtrid(),
                                 branch=self.name) from exc

    def rollback(self) -> None:
        if self._begin is not None:              # nor the BEGIN (a failed BEGIN leaves nothing to abort)
            self._begin.wait()
            self._begin = None
        if self._last is not None:               # the ABORT must not overtake the last SEND on the wire
            self._last.wait()
            self._last = None
        if self.tx is None:
            return
        tx, self.tx = self.tx, None
        try:
            self.transport.abort(tx)
        except BrokerUnavailable as exc:          # the broker rolled it back with the connection
            log.info("STOMP ABORT of %s not sent (%s): rolled back with its connection", tx, exc)
        except UnconfirmedOutcome as exc:
            raise BranchUnavailable(f"STOMP ABORT of {tx}: {exc}", gtrid=self._gtrid(), branch=self.name) from exc
        except TransportError as exc:
            log.info("STOMP ABORT of %s: %s (the transaction is not committed)", tx, exc)


class _Workers:
    """Daemon threads that wait for receipts on behalf of T2 branches: started on demand, reused while busy, and
    each ends after ``IDLE_S`` without work (a thread start per T2 costs a GIL handoff on a loaded node)."""

    IDLE_S = 5.0

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0                   # workers waiting for a job and not yet promised one

    def run(self, job: Callable[[], None]) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1          # promised to this job
        self._jobs.put(job)
        if spawn:
            threading.Thread(target=self._loop, name="t2-receipt", daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:   # not promised to a job: end
                        self._idle -= 1
                        return
                continue                 # promised: the job is on its way
            job()                        # never raises (_Background._run)
            with self._lock:
                self._idle += 1


_WORKERS = _Workers()


class _Background:
    """A receipted frame (the BEGIN, or the batch's last SEND) sent and its receipt awaited on a worker thread;
    ``index``: the frame's place in the batch."""

    def __init__(self, call: Callable[[], None], index: int = -1) -> None:
        self.index = index
        self.error: BaseException | None = None
        self._done = threading.Event()
        _WORKERS.run(lambda: self._run(call))

    def _run(self, call: Callable[[], None]) -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 — handed to the T2's thread at prepare / rollback
            self.error = exc
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> BaseException | None:
        """The frame's failure, None once receipted (bounded by the transport's receipt timeout)."""
        self._done.wait()
        return self.error
