"""The :class:`~router.jms.transport.Transport` over STOMP 1.2 (stomp.py 9), for ActiveMQ Classic and other STOMP
brokers: SEND (one frame, or many in one socket write), BEGIN/COMMIT/ABORT, SUBSCRIBE/UNSUBSCRIBE and ACK/NACK as
frames on a :class:`~router.jms.stomp.connection.StompConnection` (its lifecycle, receipts and dispatcher)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

import stomp

from router.jms.errors import (
    BrokerError,
    BrokerUnavailable,
    LocalProtocolError,
    SendFailed,
    TransportError,
    refused_send,
)
from router.jms.model import Destination
from router.jms.session import QueueSubscription
from router.jms.stomp.connection import StompConnection
from router.jms.stomp.link import LINK_ERRORS, write_chunked
from router.jms.stomp.receipts import PendingCommit
from router.jms.stomp.sendframe import FrameTemplates, encode_ack_frame, encode_send_frame
from router.jms.transport import Confirm, Delivery, EncodedMessage, Subscription, stomp_destination

__all__ = ["StompTransport"]

log = logging.getLogger("nsjms.transport.stomp")


class StompTransport(StompConnection):
    """:class:`~router.jms.transport.Transport` over STOMP 1.2 with stomp.py 9 (see :mod:`router.jms.stomp`)."""

    # ------------------------------------------------------------------------------------------- sending
    def send_encoded(self, destination: Destination | str, encoded: EncodedMessage, *, persistent: bool,
                     transaction: str | None = None, confirm: Confirm = Confirm.CONFIRMED) -> None:
        """A confirmed SEND asks for a receipt and waits for it; a pipelined one asks for none."""
        dest = stomp_destination(destination)
        frame_headers = dict(encoded.headers)
        frame_headers["persistent"] = "true" if persistent else "false"
        if transaction is not None:
            frame_headers["transaction"] = transaction
        body = encoded.body

        def write(conn: stomp.Connection12, headers: dict[str, str]) -> None:
            if conn.transport.blocking:         # plain TCP: the frame's bytes, written as stomp.py would
                headers["destination"] = dest
                conn.transport.send(encode_send_frame(headers, body))
            else:                               # TLS: stomp.py's I/O thread writes (non-blocking socket)
                conn.send(dest, body, headers=headers)

        try:
            self._book.use_tx(transaction)
            self._transmit("send", write, frame_headers, receipt=_receipted(confirm),
                           loss_is_failure=transaction is not None,
                           tx=transaction)
        except BrokerError as exc:
            raise refused_send(exc, dest) from exc
        except BrokerUnavailable as exc:
            raise SendFailed(str(exc), dest) from exc

    def send_encoded_many(self, destination: Destination | str, messages: Sequence[tuple[EncodedMessage, bool]], *,
                          transaction: str) -> None:
        """Receipt-less SENDs of ``(encoded, persistent)`` in ``transaction``: the frames and the book exactly as
        that many ``send_encoded(..., transaction=transaction, confirm=Confirm.PIPELINED)`` calls, written with one
        socket write per ``link.WRITE_CHUNK`` bytes (issue 12, round 4). Same errors as :meth:`send_encoded`; frames of
        a failed call may have been written (the caller aborts the transaction, as after a failed SEND)."""
        dest = stomp_destination(destination)
        try:
            self._book.use_tx(transaction)
            with self._book.lock:
                self._book.check_connected()
                conn = self._conn
                for _ in messages:
                    self._book.frame_written(transaction, None)
            assert conn is not None
            try:
                if conn.transport.blocking:
                    self._write_frames(conn, dest, messages, transaction, self._frames)
                else:
                    for encoded, persistent in messages:
                        headers = {**encoded.headers, "persistent": "true" if persistent else "false",
                                   "transaction": transaction}
                        conn.send(dest, encoded.body, headers=headers)
            except LINK_ERRORS as exc:
                raise BrokerUnavailable(f"send: the frame could not be written: {exc}") from exc
        except BrokerError as exc:
            raise refused_send(exc, dest) from exc
        except BrokerUnavailable as exc:
            raise SendFailed(str(exc), dest) from exc

    @staticmethod
    def _write_frames(conn: stomp.Connection12, dest: str, messages: Sequence[tuple[EncodedMessage, bool]],
                      transaction: str, frames: FrameTemplates) -> None:
        encode = frames.encode
        write_chunked(conn, (encode({**encoded.headers, "persistent": "true" if persistent else "false",
                                      "transaction": transaction, "destination": dest}, encoded.body)
                              for encoded, persistent in messages))

    def begin(self, confirm: Confirm = Confirm.CONFIRMED) -> str:
        """Confirmed: a receipted BEGIN; one the broker refuses raises here (:class:`BrokerError`), at the
        transaction's start, so a routing transaction (T2) branch tells a refused BEGIN (an outage) from a refused
        message. Pipelined: :meth:`_begin_pipelined`."""
        if confirm is Confirm.PIPELINED:
            return self._begin_pipelined()
        tx = f"tx-{uuid.uuid4().hex}"
        epoch = self._transmit("begin", lambda c, h: c.begin(tx, headers=h), {}, receipt=True,
                               loss_is_failure=True)
        self._book.add_tx(tx, epoch)
        return tx

    def _begin_pipelined(self) -> str:
        """BEGIN without a receipt (issue 12: no round trip per batch). The transaction is in the book before
        its frame is written, so an ERROR answering the BEGIN (it has no receipt id) marks it rollback-only: a
        failed BEGIN shows up at the COMMIT (or :meth:`transaction_problem`), which then raises, not telling it
        from a refused SEND. Only for callers that resend a refused transaction one message at a time."""
        tx = f"tx-{uuid.uuid4().hex}"
        self._book.add_tx(tx, self._book.check_connected())
        try:
            self._transmit("begin", lambda c, h: c.begin(tx, headers=h), {}, receipt=False, loss_is_failure=True,
                           tx=tx)
        except BaseException:
            self._book.discard_tx(tx)
            raise
        return tx

    def transaction_problem(self, transaction: str) -> str | None:
        return self._book.tx_problem(transaction)

    def commit(self, transaction: str) -> None:
        """The transaction stays in the book until the COMMIT's receipt: an ERROR for an earlier receipt-less frame
        that arrives meanwhile still marks it, and the commit then raises :class:`BrokerError` (ActiveMQ refuses
        such a COMMIT itself; a broker that accepts it has committed the transaction without that frame)."""
        self.commit_pipelined(transaction).wait()

    def commit_pipelined(self, transaction: str) -> PendingCommit:
        """Write the COMMIT (receipted) and return without waiting: :meth:`PendingCommit.wait` waits for its
        receipt and raises what :meth:`commit` raises. The caller may write other frames meanwhile (pipelining);
        it must call ``wait`` once. A transaction already known to be lost or rollback-only raises here."""
        entry = self._book.get_tx(transaction)
        try:
            if not self._book.is_live(entry):
                raise BrokerUnavailable(f"transaction {transaction} was lost with its connection (rolled back)")
            if entry.rollback_only:
                self._abort_frame(transaction)
                raise BrokerError(f"transaction {transaction} rolled back: a frame in it failed: "
                                  f"{entry.rollback_only}")
            pending = PendingCommit(self, transaction, entry)
            _, pending.rid = self._write("commit", lambda c, h: c.commit(transaction, headers=h), {}, receipt=True,
                                         loss_is_failure=False, on_answer=pending.answered, tx=transaction)
        except BaseException:
            self._book.discard_tx(transaction)
            raise
        return pending

    def abort(self, transaction: str) -> None:
        entry = self._book.end_tx(transaction)
        if self._book.is_live(entry) and self._abort_frame(transaction):
            self._book.restore(entry)

    def _abort_frame(self, transaction: str) -> bool:
        """True when the broker confirmed the ABORT; a lost connection has rolled back anyway."""
        try:
            self._transmit("abort", lambda c, h: c.abort(transaction, headers=h), {}, receipt=True,
                           loss_is_failure=True, tx=transaction)
            return True
        except BrokerUnavailable as exc:
            log.info("ABORT of %s not sent (%s): the broker rolls it back with the connection", transaction, exc)
            return False

    # ------------------------------------------------------------------------------------------- consuming
    def _open_subscription(self, sub: QueueSubscription) -> None:
        self._subscribe_once(sub)

    def _subscribe_once(self, sub: QueueSubscription) -> None:
        """At most one SUBSCRIBE per subscription and connection: ``subscribe()`` on one thread and the re-subscribe
        of ``reconnect()`` on another may both reach a new subscription; a second SUBSCRIBE would make the broker
        dispatch (prefetch) to a consumer whose messages nobody reads."""
        with self._sub_lock:
            if self._book.connected and self._sub_epochs.get(sub.id) == self._book.epoch:
                return
            self._sub_epochs[sub.id] = self._subscribe_frame(sub)

    def _subscribe_frame(self, sub: QueueSubscription) -> int:
        spec = sub.spec
        headers = {"activemq.prefetchSize": str(spec.prefetch)}
        optional = {"selector": spec.selector, "activemq.subscriptionName": spec.durable_name,
                    "transformation": spec.transformation}
        headers.update({k: v for k, v in optional.items() if v is not None})
        return self._transmit("subscribe", lambda c, h: c.subscribe(spec.destination, sub.id, ack=spec.ack.value,
                                                                    headers=h), headers, receipt=True,
                              loss_is_failure=True)

    def _resubscribe(self) -> None:
        for sub in list(self._subs.values()):
            self._subscribe_once(sub)

    def unsubscribe(self, subscription: Subscription, *, remove_durable: bool = False) -> None:
        self._book.check_open()
        sub = self._subs.pop(subscription.id, None)
        if sub is None:
            raise LocalProtocolError(f"unknown subscription {subscription.id!r} (already unsubscribed?)")
        sub.active = False
        self._book.forget_subscription(sub.id)
        self._sub_epochs.pop(sub.id, None)
        sub.wake()
        try:
            self._unsubscribe_frame(sub.id, {})
            if remove_durable and sub.spec.durable_name:   # ActiveMQ removes a durable only once it is inactive
                self._unsubscribe_frame(sub.id, {"activemq.subscriptionName": sub.spec.durable_name})
        except BrokerUnavailable:
            if remove_durable:
                raise
            log.debug("UNSUBSCRIBE %s not sent: the connection is gone, and the subscription with it", sub.id)

    def _unsubscribe_frame(self, sub_id: str, headers: dict[str, str]) -> None:
        self._transmit("unsubscribe", lambda c, h: c.unsubscribe(sub_id, headers=h), headers, receipt=True,
                       loss_is_failure=True)

    def ack(self, delivery: Delivery, transaction: str | None = None, *,
            confirm: Confirm = Confirm.CONFIRMED) -> None:
        self._book.take_for_ack(delivery, transaction)
        self._transmit("ack", lambda c, h: c.ack(delivery.ack_id, transaction=transaction,
                                                 receipt=h.get("receipt")), {}, receipt=_receipted(confirm),
                       loss_is_failure=transaction is not None)

    def ack_many(self, deliveries: Sequence[Delivery], transaction: str | None = None) -> None:
        """Receipt-less ACKs of ``deliveries``, in order (in ``transaction`` when given): the book and the frames
        exactly as that many ``ack(d, transaction, confirm=Confirm.PIPELINED)`` calls, written with one socket write per
        ``link.WRITE_CHUNK`` bytes instead of one stomp.py frame and write each (issue 12, round 5). A delivery the
        book refuses (one of a lost connection, one already acknowledged) raises once the frames of those before
        it were written, as the one-by-one calls would; a failed write raises :class:`BrokerUnavailable` (the
        broker redelivers what it did not take)."""
        taken: list[Delivery] = []
        failure: TransportError | None = None
        for delivery in deliveries:
            try:
                self._book.take_for_ack(delivery, transaction)
            except TransportError as exc:
                failure = exc
                break
            taken.append(delivery)
        if taken:
            self._write_acks(taken, transaction)
        if failure is not None:
            raise failure

    def _write_acks(self, deliveries: Sequence[Delivery], transaction: str | None) -> None:
        with self._book.lock:
            self._book.check_connected()
            conn = self._conn
        assert conn is not None
        try:
            if not conn.transport.blocking:
                for delivery in deliveries:
                    conn.ack(delivery.ack_id, transaction=transaction)
                return
            write_chunked(conn, (encode_ack_frame(delivery.ack_id, transaction) for delivery in deliveries))
        except LINK_ERRORS as exc:
            raise BrokerUnavailable(f"ack: the frames could not be written: {exc}") from exc

    def nack(self, delivery: Delivery, transaction: str | None = None, *,
             confirm: Confirm = Confirm.CONFIRMED) -> None:
        self._book.take_for_ack(delivery, transaction)
        self._transmit("nack", lambda c, h: c.nack(delivery.ack_id, transaction=transaction,
                                                   receipt=h.get("receipt")), {}, receipt=_receipted(confirm),
                       loss_is_failure=transaction is not None, tx=transaction)


def _receipted(confirm: Confirm) -> bool:
    """How STOMP confirms an operation: the frame asks for a receipt, and the caller waits for it."""
    return confirm is Confirm.CONFIRMED
