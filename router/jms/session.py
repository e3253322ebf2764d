"""Client-side session state shared by the transports (STOMP and the in-memory twin), so misuse fails the same way
on each: :class:`SessionBook` (connection epochs, open transactions, receipts, un-acked deliveries) and
:class:`QueueSubscription` (a subscription whose deliveries come through a local queue)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Self

from router.jms.errors import BrokerUnavailable, LocalProtocolError, TransportError
from router.jms.model import DeliveryMode, Destination, JmsMessage
from router.jms.transport import AckMode, Confirm, Delivery, EncodedMessage, MessageCodec, stomp_destination

__all__ = ["QueueSubscription", "SessionBook", "SubscriptionSpec", "TransportBase", "TxEntry"]


@dataclass
class TxEntry:
    """One open transaction in a :class:`SessionBook`."""

    epoch: int
    acks: list[Delivery] = field(default_factory=list)
    rollback_only: str | None = None
    unreceipted: int = 0        # receipt-less frames written in it (a pipelined BEGIN included)
    answered: int = 0           # how many of them STOMP has answered (a later receipted frame of it was answered)


class SessionBook:
    """Client-side session state shared by the implementations, so misuse fails the same way on each.

    Tracks: closed flag, connection epoch (one per successful connect), open transactions and un-acked
    deliveries. All methods are thread-safe and raise :class:`LocalProtocolError` on misuse and
    :class:`BrokerUnavailable` for state that belonged to a lost connection.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.closed = False
        self.epoch = 0
        self.connected = False
        self._txs: dict[str, TxEntry] = {}
        self._receipted: dict[str, tuple[str, int]] = {}     # receipt id -> (transaction, its unreceipted count)
        self._pending: dict[str, Delivery] = {}
        self._modes: dict[str, AckMode] = {}

    def check_open(self) -> None:
        if self.closed:
            raise LocalProtocolError("the transport is closed")

    def check_connected(self) -> int:
        """The current epoch; :class:`BrokerUnavailable` when not connected."""
        with self.lock:
            self.check_open()
            if not self.connected:
                raise BrokerUnavailable("not connected to the broker")
            return self.epoch

    def connected_as(self, epoch: int) -> None:
        with self.lock:
            self.epoch, self.connected = epoch, True

    def lost(self, epoch: int) -> bool:
        """Mark ``epoch`` lost; True when it was the live connection. Its transactions and deliveries die."""
        with self.lock:
            if epoch != self.epoch or not self.connected:
                return False
            self.connected = False
            self._pending.clear()
            self._receipted.clear()
            return True

    # -- transactions
    def add_tx(self, tx: str, epoch: int) -> None:
        with self.lock:
            self._txs[tx] = TxEntry(epoch)

    def use_tx(self, tx: str | None) -> None:
        """Check ``tx`` may carry a frame now (None passes)."""
        if tx is None:
            return
        with self.lock:
            self.check_open()
            entry = self._txs.get(tx)
            if entry is None:
                raise LocalProtocolError(f"unknown transaction {tx!r} (never begun, or already ended)")
            if entry.epoch != self.epoch or not self.connected:
                raise BrokerUnavailable(f"transaction {tx} was lost with its connection (the broker rolled it back)")

    def get_tx(self, tx: str) -> TxEntry:
        """The record of ``tx``, kept in the book. Unknown → :class:`LocalProtocolError`."""
        with self.lock:
            self.check_open()
            entry = self._txs.get(tx)
            if entry is None:
                raise LocalProtocolError(f"unknown transaction {tx!r} (never begun, or already ended)")
            return entry

    def discard_tx(self, tx: str) -> None:
        """Forget ``tx`` if it is still in the book."""
        with self.lock:
            self._txs.pop(tx, None)

    def end_tx(self, tx: str) -> TxEntry:
        """Forget ``tx``; returns its record. Unknown → :class:`LocalProtocolError`."""
        with self.lock:
            self.check_open()
            entry = self._txs.pop(tx, None)
            if entry is None:
                raise LocalProtocolError(f"unknown transaction {tx!r} (never begun, or already ended)")
            return entry

    def is_live(self, entry: TxEntry) -> bool:
        with self.lock:
            return entry.epoch == self.epoch and self.connected

    def tx_problem(self, tx: str) -> str | None:
        """Why ``tx`` cannot commit everything sent in it: a frame in it got an ERROR, its connection was lost, or
        it is not open; None when every frame so far is fine (as far as the answers received tell)."""
        with self.lock:
            entry = self._txs.get(tx)
            if entry is None:
                return f"transaction {tx} is not open"
            if entry.epoch != self.epoch or not self.connected:
                return f"transaction {tx} was lost with its connection (the broker rolled it back)"
            return entry.rollback_only

    def mark_rollback_only(self, reason: str) -> None:
        """Mark every open transaction rollback-only (a transport that cannot tell which one lost a frame)."""
        with self.lock:
            for entry in self._txs.values():
                entry.rollback_only = entry.rollback_only or reason

    def frame_written(self, tx: str | None, receipt: str | None) -> None:
        """A frame of ``tx`` goes out (None: not in a transaction): receipt-less, it is unanswered until a later
        receipted frame of ``tx`` is answered (STOMP answers a connection's frames in order)."""
        if tx is None:
            return
        with self.lock:
            entry = self._txs.get(tx)
            if entry is None:
                return
            if receipt is None:
                entry.unreceipted += 1
            else:
                self._receipted[receipt] = (tx, entry.unreceipted)

    def frame_answered(self, receipt: str) -> None:
        """The broker answered the receipted frame ``receipt`` (RECEIPT or ERROR): every receipt-less frame its
        transaction wrote before it has been processed too."""
        with self.lock:
            known = self._receipted.pop(receipt, None)
            entry = self._txs.get(known[0]) if known is not None else None
            if entry is not None and known is not None:
                entry.answered = max(entry.answered, known[1])

    def frame_refused(self, reason: str, receipt: str | None) -> None:
        """An ERROR frame that no caller waits for. With the receipt id of a transaction's frame (its caller gave
        up waiting) it marks that transaction; without one it marks only the transactions that have receipt-less
        frames the broker has not answered yet: the ERROR is about one of those (or about a frame outside any
        transaction). A transaction whose frames are all answered (a decided T2 whose COMMIT is not written yet,
        or written) is never marked by another transaction's refused frame."""
        with self.lock:
            known = self._receipted.pop(receipt, None) if receipt else None
            if known is not None:
                entries = [e for e in [self._txs.get(known[0])] if e is not None]
            else:
                entries = [e for e in self._txs.values() if e.unreceipted > e.answered]
            for entry in entries:
                entry.rollback_only = entry.rollback_only or reason

    # -- deliveries
    def set_mode(self, subscription: str, mode: AckMode) -> None:
        with self.lock:
            self._modes[subscription] = mode

    def pending(self, delivery: Delivery) -> bool:
        """Whether ``delivery`` can still be acknowledged: it is un-acked in the book (an ACK claimed it in a
        transaction whose ABORT never got its answer is not: the book cannot give it back, see ``restore``)."""
        with self.lock:
            return delivery.ack_id in self._pending

    def delivered(self, delivery: Delivery) -> None:
        with self.lock:
            if self._modes.get(delivery.subscription, AckMode.AUTO) is not AckMode.AUTO:
                self._pending[delivery.ack_id] = delivery

    def take_for_ack(self, delivery: Delivery, tx: str | None) -> None:
        """Claim ``delivery`` for one ACK/NACK; a second claim is a :class:`LocalProtocolError`."""
        with self.lock:
            self.check_open()
            self.use_tx(tx)
            if delivery.epoch != self.epoch or not self.connected:
                raise BrokerUnavailable("this delivery came on a lost connection; the broker will redeliver it")
            mode = self._modes.get(delivery.subscription)
            if mode is None or mode is AckMode.AUTO:
                raise LocalProtocolError(f"subscription {delivery.subscription} does not take acks ({mode})")
            if delivery.ack_id not in self._pending:
                raise LocalProtocolError(f"delivery {delivery.message_id} was already acknowledged or is unknown")
            if mode is AckMode.CLIENT:
                self._drop_earlier(delivery)
            else:
                del self._pending[delivery.ack_id]
            if tx is not None:
                self._txs[tx].acks.append(delivery)

    def _drop_earlier(self, delivery: Delivery) -> None:
        for ack_id, other in list(self._pending.items()):
            if other.subscription == delivery.subscription:
                del self._pending[ack_id]
            if ack_id == delivery.ack_id:
                break

    def restore(self, entry: TxEntry) -> None:
        """After ABORT the broker expects the transaction's acked deliveries to be acked again."""
        with self.lock:
            if self.is_live(entry):
                for delivery in entry.acks:
                    self._pending[delivery.ack_id] = delivery

    def forget_subscription(self, subscription: str) -> None:
        with self.lock:
            self._modes.pop(subscription, None)
            for ack_id in [a for a, d in self._pending.items() if d.subscription == subscription]:
                del self._pending[ack_id]

    def close(self) -> bool:
        """Mark closed; False when it already was."""
        with self.lock:
            if self.closed:
                return False
            self.closed, self.connected = True, False
            self._txs.clear()
            self._pending.clear()
            return True


# --------------------------------------------------------------------------------------------------- subscription
@dataclass(frozen=True)
class SubscriptionSpec:
    """What a SUBSCRIBE asked for; kept to re-subscribe after a reconnect."""

    destination: str
    selector: str | None
    ack: AckMode
    durable_name: str | None
    prefetch: int
    transformation: str | None

    @classmethod
    def checked(cls, destination: Destination | str, selector: str | None, ack: AckMode | str,
                durable_name: str | None, prefetch: int, transformation: str | None, *,
                client_id: str | None) -> SubscriptionSpec:
        """The spec of a ``Transport.subscribe`` call, or :class:`LocalProtocolError` for a malformed destination,
        an unknown ack mode, a durable subscription without a topic or a client id, a prefetch below 1 (the same
        misuse refused the same way by every transport)."""
        dest = stomp_destination(destination)
        try:
            mode = AckMode(ack)
        except ValueError:
            raise LocalProtocolError(f"unknown ack mode {ack!r}") from None
        if durable_name is not None and (not client_id or not dest.startswith("/topic/")):
            raise LocalProtocolError("a durable subscription needs a topic and a client_id on the transport")
        if prefetch < 1:
            raise LocalProtocolError(f"prefetch must be >= 1, got {prefetch}")
        return cls(dest, selector, mode, durable_name, prefetch, transformation)


_WAKE = object()


class QueueSubscription:
    """A :class:`Subscription` whose deliveries come through a local queue (fed by the transport's own thread)."""

    def __init__(self, sub_id: str, spec: SubscriptionSpec, book: SessionBook) -> None:
        self.id = sub_id
        self.spec = spec
        self.destination = spec.destination
        self.ack_mode = spec.ack
        self.active = True
        self._book = book
        self._queue: queue.Queue[object] = queue.Queue()

    def feed(self, delivery: Delivery) -> None:
        """Called by the transport's dispatcher: record the delivery as un-acked and queue it."""
        self._book.delivered(delivery)
        self._queue.put(delivery)

    def wake(self) -> None:
        """Unblock a waiting :meth:`receive` (connection lost, unsubscribed, closed)."""
        self._queue.put(_WAKE)

    def receive(self, timeout: float | None = None) -> Delivery | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._check_usable()
            item = self._next(deadline)
            if item is None:
                return None
            if isinstance(item, Delivery) and self._fresh(item):
                return item

    def _next(self, deadline: float | None) -> object | None:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return self._queue.get(timeout=remaining)
        except queue.Empty:
            return None

    def _check_usable(self) -> None:
        self._book.check_open()
        if not self.active:
            raise LocalProtocolError(f"subscription {self.id} was unsubscribed")
        if not self._book.connected and self._queue.empty():
            raise BrokerUnavailable("not connected to the broker")

    def _fresh(self, delivery: Delivery) -> bool:
        """Deliveries needing an ack are only usable on the connection that delivered them."""
        return self.ack_mode is AckMode.AUTO or (delivery.epoch == self._book.epoch and self._book.connected)


class TransportBase:
    """What both transports (STOMP and the in-memory twin) do the same way over their :class:`SessionBook` and
    codec: the context manager, ``is_connected``, ``send`` (encode, then the transport's own ``send_encoded``) and
    ``subscribe`` (check, book, then the transport's own ``_open_subscription``)."""

    _book: SessionBook
    _codec: MessageCodec
    client_id: str | None
    _subs: dict[str, QueueSubscription]
    _sub_ids: Iterator[int]

    def connect(self, *, retry: bool = False) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def send_encoded(self, destination: Destination | str, encoded: EncodedMessage, *, persistent: bool,
                     transaction: str | None = None, confirm: Confirm = Confirm.CONFIRMED) -> None:
        raise NotImplementedError

    def _open_subscription(self, sub: QueueSubscription) -> None:
        """Ask the broker for ``sub``'s deliveries (confirmed); raise :class:`TransportError` when it refuses."""
        raise NotImplementedError

    def subscribe(self, destination: Destination | str, *, selector: str | None = None,
                  ack: AckMode | str = AckMode.CLIENT_INDIVIDUAL, durable_name: str | None = None,
                  prefetch: int = 100, transformation: str | None = None) -> QueueSubscription:
        spec = SubscriptionSpec.checked(destination, selector, ack, durable_name, prefetch, transformation,
                                        client_id=self.client_id)
        sub = QueueSubscription(f"sub-{next(self._sub_ids)}", spec, self._book)
        self._book.check_connected()
        self._book.set_mode(sub.id, spec.ack)
        self._subs[sub.id] = sub
        try:
            self._open_subscription(sub)
        except TransportError:
            self._subs.pop(sub.id, None)
            self._book.forget_subscription(sub.id)
            raise
        return sub

    def __enter__(self) -> Self:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def is_connected(self) -> bool:
        return self._book.connected and not self._book.closed

    @property
    def codec(self) -> MessageCodec:
        return self._codec

    def encode(self, message: JmsMessage) -> EncodedMessage:
        return self._codec.encode(message)

    def send(self, destination: Destination | str, message: JmsMessage, *, transaction: str | None = None,
             confirm: Confirm = Confirm.CONFIRMED, headers: Mapping[str, str] | None = None) -> None:
        encoded = self._codec.encode(message)
        if headers:
            encoded = EncodedMessage({**encoded.headers, **headers}, encoded.body)
        self.send_encoded(destination, encoded, persistent=message.delivery_mode is DeliveryMode.PERSISTENT,
                          transaction=transaction, confirm=confirm)
