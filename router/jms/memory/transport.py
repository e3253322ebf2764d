"""The :class:`~router.jms.transport.Transport` of the in-memory twin, on a
:class:`~router.jms.memory.broker.MemoryBroker` (see :mod:`router.jms.memory`)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from router.jms.codec import SimpleCodec, frame_delivery
from router.jms.errors import (
    BrokerError,
    BrokerUnavailable,
    LocalProtocolError,
    SendFailed,
    TransportError,
    refused_send,
)
from router.jms.memory.broker import MemoryBroker
from router.jms.model import BodyType, Destination, JmsMessage
from router.jms.retry import RECONNECT_POLICY, RetryPolicy
from router.jms.session import QueueSubscription, SessionBook, TransportBase, TxEntry
from router.jms.transport import (
    Confirm,
    ConnectionState,
    Delivery,
    EncodedMessage,
    MessageCodec,
    StateCallback,
    Subscription,
    stomp_destination,
)

__all__ = ["MemoryTransport"]

_RIDS = itertools.count(1)      # receipt ids of the twin's answered frames (SessionBook.frame_answered)


# --------------------------------------------------------------------------------------------------- transport
@dataclass
class _TxOps:
    ops: list[Callable[[], None]] = field(default_factory=list)
    entry: TxEntry | None = None  # the transaction's SessionBook record (its rollback_only refuses the COMMIT)


class _Done:
    """:class:`~router.jms.transport.PendingConfirmation` of the twin: the outcome is known when it is made."""

    def __init__(self, error: TransportError | None) -> None:
        self._error = error

    def wait(self) -> None:
        if self._error is not None:
            raise self._error

    def discard(self) -> None:
        return None


class MemoryTransport(TransportBase):
    """:class:`~router.jms.transport.Transport` on a :class:`MemoryBroker` (``memory://NAME`` or ``broker=``)."""

    def __init__(self, url: str = "memory://", *, broker: MemoryBroker | None = None, client_id: str | None = None,
                 codec: MessageCodec | None = None, on_state: StateCallback | None = None,
                 shutdown: threading.Event | None = None, reconnect_policy: RetryPolicy = RECONNECT_POLICY,
                 **_ignored: object) -> None:
        parts = urlsplit(url)
        if parts.scheme != "memory":
            raise LocalProtocolError(f"not a memory URL: {url!r}")
        self.url = url
        self.broker = broker or MemoryBroker.named(parts.netloc or parts.path.strip("/"))
        self.client_id = client_id
        self._codec: MessageCodec = codec or SimpleCodec()
        self._on_state = on_state
        self._shutdown = shutdown or threading.Event()
        self._policy = reconnect_policy
        self._book = SessionBook()
        self._epochs = itertools.count(1)
        self._sub_ids = itertools.count(1)
        self._subs: dict[str, QueueSubscription] = {}
        self._txs: dict[str, _TxOps] = {}
        self.renewals = 0

    # -- connection
    def connect(self, *, retry: bool = False) -> None:
        if retry:
            self.reconnect()
            return
        self._book.check_open()
        self._drop_connection()
        self.broker.connect(self, self.client_id)
        self._book.connected_as(next(self._epochs))
        self._notify(ConnectionState.CONNECTED)

    def reconnect(self) -> None:
        self._book.check_open()
        for attempt in self._policy.retrying(self._shutdown):
            with attempt:
                self.connect()
                for sub in list(self._subs.values()):
                    self.broker.subscribe(self, sub.id, sub.spec)

    def renew(self) -> None:
        """The old connection ends as a clean close (its un-acked deliveries go back to the broker), the state
        callback hears only of the new one."""
        self._book.check_open()
        if self._book.connected:
            self.broker.disconnect(self)
            self._book.lost(self._book.epoch)
            self._txs.clear()
            for sub in self._subs.values():
                sub.wake()
        self.reconnect()
        self.renewals += 1

    def close(self) -> None:
        if self._book.closed:
            return
        self.broker.disconnect(self)
        self._book.close()
        for sub in self._subs.values():
            sub.active = False
            sub.wake()
        self._notify(ConnectionState.CLOSED)

    def _drop_connection(self) -> None:
        if self._book.connected:
            self.broker.disconnect(self)
            self._broker_lost()

    def _broker_lost(self) -> None:
        """Called by the broker when it drops this connection."""
        if self._book.lost(self._book.epoch):
            self._txs.clear()
            for sub in self._subs.values():
                sub.wake()
            self._notify(ConnectionState.DISCONNECTED)

    def _notify(self, state: ConnectionState) -> None:
        if self._on_state is not None:
            self._on_state(state)

    def _deliver(self, sub_id: str, headers: dict[str, str], body: bytes) -> None:
        """Called by the broker (under its lock): queue a delivery for the subscription."""
        sub = self._subs.get(sub_id)
        if sub is None:
            return
        try:
            message, problem = self._codec.decode(headers, body), None
        except Exception as exc:  # noqa: BLE001 — same contract as the STOMP transport: hand it on, marked
            message, problem = JmsMessage(BodyType.BYTES, body), f"{type(exc).__name__}: {exc}"
        sub.feed(frame_delivery(message, headers, body, subscription=sub_id, ack_id=headers["ack"],
                                message_id=headers["message-id"], epoch=self._book.epoch, decode_error=problem))

    def _run(self, operation: str, action: Callable[[], None], *, transaction: str | None = None) -> None:
        """Apply ``action`` now, or at COMMIT when in ``transaction``; an injected fault is raised here."""
        self._book.check_connected()
        fault = self.broker.take_fault(operation)
        if fault is None or fault[1]:
            if transaction is not None:
                self._txs[transaction].ops.append(action)
            else:
                action()
        if fault is not None:
            if isinstance(fault[0], BrokerUnavailable):
                self._drop_connection()
            raise fault[0]

    # -- sending and transactions
    def send_encoded(self, destination: Destination | str, encoded: EncodedMessage, *, persistent: bool,
                     transaction: str | None = None, confirm: Confirm = Confirm.CONFIRMED) -> None:
        dest = stomp_destination(destination)
        frame = dict(encoded.headers)
        frame["persistent"] = "true" if persistent else "false"
        try:
            self._book.use_tx(transaction)
            self._run("send", lambda: self.broker.send(dest, dict(frame), encoded.body), transaction=transaction)
            self._answered_in_order(transaction, confirm is Confirm.CONFIRMED)
        except BrokerError as exc:
            raise refused_send(exc, dest) from exc
        except BrokerUnavailable as exc:
            raise SendFailed(str(exc), dest) from exc

    def send_encoded_many(self, destination: Destination | str, messages: Sequence[tuple[EncodedMessage, bool]], *,
                          transaction: str) -> None:
        """As that many pipelined :meth:`send_encoded` calls in ``transaction``, in order (the twin has no socket
        writes to join); the first that fails raises, those before it are sent."""
        for encoded, persistent in messages:
            self.send_encoded(destination, encoded, persistent=persistent, transaction=transaction,
                              confirm=Confirm.PIPELINED)

    def _answered_in_order(self, transaction: str | None, confirmed: bool) -> None:
        """The twin answers a confirmed operation at once; a pipelined one stays unanswered in the book until a
        later confirmed one of its transaction (as STOMP's in-order answers, ``SessionBook.frame_refused``)."""
        rid = f"r-{next(_RIDS)}" if confirmed else None
        self._book.frame_written(transaction, rid)
        if rid is not None:
            self._book.frame_answered(rid)

    def begin(self, confirm: Confirm = Confirm.CONFIRMED) -> str:
        """The twin's BEGIN has no round trip either way: ``confirm`` changes nothing (an injected fault raises
        here)."""
        tx = f"tx-{next(self._epochs)}-{id(self):x}"
        self._run("begin", lambda: None)
        self._book.add_tx(tx, self._book.epoch)
        self._txs[tx] = _TxOps(entry=self._book.get_tx(tx))
        return tx

    def transaction_problem(self, transaction: str) -> str | None:
        return self._book.tx_problem(transaction)

    def commit(self, transaction: str) -> None:
        self.commit_pipelined(transaction).wait()

    def commit_pipelined(self, transaction: str) -> _Done:
        """As on STOMP, the checks before the COMMIT raise at once (a transaction lost with its connection, no
        connection); the twin then commits at once and ``wait`` raises the COMMIT's own outcome (an injected
        fault)."""
        entry = self._book.end_tx(transaction)
        ops = self._txs.pop(transaction, _TxOps())
        if not self._book.is_live(entry):
            raise BrokerUnavailable(f"transaction {transaction} was lost with its connection (rolled back)")
        self._book.check_connected()
        try:
            self._run("commit", lambda: self._apply(ops))
        except TransportError as exc:
            return _Done(exc)
        return _Done(None)

    def _apply(self, ops: _TxOps) -> None:
        problem = ops.entry.rollback_only if ops.entry is not None else None
        if problem:                      # as the STOMP transport: no COMMIT of a transaction missing a frame
            raise BrokerError(f"a frame in the transaction failed: {problem}; rolled back")
        with self.broker.lock:
            for op in ops.ops:
                op()

    def abort(self, transaction: str) -> None:
        entry = self._book.end_tx(transaction)
        self._txs.pop(transaction, None)
        if self._book.is_live(entry):
            self._run("abort", lambda: None)
            self._book.restore(entry)

    # -- consuming
    def _open_subscription(self, sub: QueueSubscription) -> None:
        self._run("subscribe", lambda: self.broker.subscribe(self, sub.id, sub.spec))

    def unsubscribe(self, subscription: Subscription, *, remove_durable: bool = False) -> None:
        self._book.check_open()
        sub = self._subs.pop(subscription.id, None)
        if sub is None:
            raise LocalProtocolError(f"unknown subscription {subscription.id!r} (already unsubscribed?)")
        sub.active = False
        self._book.forget_subscription(sub.id)
        sub.wake()
        if self._book.connected:
            self.broker.unsubscribe(self, sub.id, remove_durable=remove_durable)
        elif remove_durable:
            raise BrokerUnavailable("not connected: cannot remove the durable subscription")

    def ack(self, delivery: Delivery, transaction: str | None = None, *,
            confirm: Confirm = Confirm.CONFIRMED) -> None:
        self._settle("ack", delivery, transaction, nack=False)

    def ack_many(self, deliveries: Sequence[Delivery], transaction: str | None = None) -> None:
        """Pipelined acks of ``deliveries`` in order, as ``StompTransport.ack_many`` (one call each here)."""
        for delivery in deliveries:
            self.ack(delivery, transaction, confirm=Confirm.PIPELINED)

    def nack(self, delivery: Delivery, transaction: str | None = None, *,
             confirm: Confirm = Confirm.CONFIRMED) -> None:
        self._settle("nack", delivery, transaction, nack=True)

    def _settle(self, operation: str, delivery: Delivery, transaction: str | None, *, nack: bool) -> None:
        self._book.take_for_ack(delivery, transaction)
        self._run(operation, lambda: self.broker.settle(self, delivery.subscription, delivery.ack_id, nack=nack),
                  transaction=transaction)
