"""The broker SEND branch of a channel → JMS routing transaction (T2, NJI 2.7.5.1): a one-phase ``xa`` participant.

STOMP has no prepare, so the broker is T2's single one-phase participant (docs/transactions.md):

* ``begin(xid)``: STOMP ``BEGIN`` on the bridge's transport (receipted);
* the caller's work: :meth:`SendBranch.send` each frame with ``transaction``; only the LAST frame of the batch asks
  for a receipt (:meth:`SendBranch.send` with ``last=True``): STOMP answers in order, so once that receipt is in,
  every ERROR frame for an earlier frame has arrived and is in the transport's transaction book;
* ``prepare()``: votes no (:class:`~xa.errors.PrepareFailed`) unless the last frame was receipted and the book has
  no problem for the transaction (an ERROR for one of its frames, its connection lost). It never commits;
* ``commit()``: STOMP ``COMMIT`` (receipted), called only after the decision is durable. A missing receipt, a lost
  connection or an ERROR there is :class:`~xa.errors.OutcomeUnknown`, never "aborted": recovery re-sends the
  transaction's outbox rows with the same dedupe ids (``router.t2.OutboxResender``);
* ``rollback()``: STOMP ``ABORT``; a transaction of a lost connection is already rolled back by the broker.

Transport errors are translated into ``xa`` errors here (the adapter's one boundary); the frames' own failures
(:meth:`send`) propagate as transport errors so that the bridge can tell a refused message from an outage.
"""

from __future__ import annotations

import logging

from psycopg import Xid

from router.jms.transport import (
    BrokerUnavailable,
    EncodedMessage,
    ReceiptTimeout,
    Transport,
    TransportError,
)
from router.t2 import SEND_MANAGER
from xa.errors import BranchUnavailable, OutcomeUnknown, PrepareFailed, UsageError

__all__ = ["SendBranch"]

log = logging.getLogger("nsjms.t2")


class SendBranch:
    """One STOMP transaction of one T2 on ``transport`` (see the module docstring)."""

    kind = "stomp-send"
    manager = SEND_MANAGER
    one_phase_only = True

    def __init__(self, transport: Transport, name: str = "broker") -> None:
        self.transport = transport
        self.name = name
        self.tx: str | None = None
        self.xid: Xid | None = None
        self.sent = 0
        self.confirmed = True            # nothing sent yet: nothing to confirm

    def sort_key(self) -> str:
        return self.name

    def _gtrid(self) -> str | None:
        return self.xid.gtrid if self.xid is not None else None

    # -- protocol ---------------------------------------------------------------------------------------------
    def begin(self, xid: Xid) -> None:
        self.xid = xid
        try:
            self.tx = self.transport.begin()
        except TransportError as exc:
            raise BranchUnavailable(f"STOMP BEGIN failed: {exc}", gtrid=xid.gtrid, branch=self.name) from exc

    def send(self, destination: str, encoded: EncodedMessage, *, persistent: bool, last: bool) -> None:
        """Send one frame in the transaction; ``last`` asks for the receipt that :meth:`prepare` needs. Transport
        errors propagate unchanged (:class:`~router.jms.transport.SendRefused`: the broker refused this frame)."""
        if self.tx is None:
            raise UsageError(f"branch {self.name}: send before begin", gtrid=self._gtrid())
        self.confirmed = False
        self.transport.send_encoded(destination, encoded, persistent=persistent, transaction=self.tx, receipt=last)
        self.sent += 1
        self.confirmed = last

    def prepare(self) -> None:
        if self.tx is None:
            raise PrepareFailed(f"branch {self.name}: no STOMP transaction", gtrid=self._gtrid(), branch=self.name)
        if not self.confirmed:
            raise PrepareFailed(f"branch {self.name}: the last frame of the batch was not receipted",
                                gtrid=self._gtrid(), branch=self.name)
        try:
            problem = self.transport.transaction_problem(self.tx)
            connected = self.transport.is_connected()
        except TransportError as exc:
            problem, connected = str(exc), False
        if problem:
            failed = PrepareFailed(f"branch {self.name}: {problem}", gtrid=self._gtrid(), branch=self.name)
            # an ERROR frame for a frame of the batch on a live connection: the broker refused the batch's content
            failed.content = connected  # type: ignore[attr-defined]
            raise failed

    def commit(self) -> None:
        assert self.tx is not None
        try:
            self.transport.commit(self.tx)
        except TransportError as exc:    # ReceiptTimeout, lost connection, ERROR: the broker's outcome is unknown
            raise OutcomeUnknown(f"STOMP COMMIT of {self.tx}: {type(exc).__name__}: {exc}", gtrid=self._gtrid(),
                                 branch=self.name) from exc

    def rollback(self) -> None:
        if self.tx is None:
            return
        tx, self.tx = self.tx, None
        try:
            self.transport.abort(tx)
        except BrokerUnavailable as exc:          # the broker rolled it back with the connection
            log.info("STOMP ABORT of %s not sent (%s): rolled back with its connection", tx, exc)
        except ReceiptTimeout as exc:
            raise BranchUnavailable(f"STOMP ABORT of {tx}: {exc}", gtrid=self._gtrid(), branch=self.name) from exc
        except TransportError as exc:
            log.info("STOMP ABORT of %s: %s (the transaction is not committed)", tx, exc)
