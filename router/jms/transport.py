"""The broker transport contract: one interface, its exceptions, and the URL-scheme table that picks an implementation.

A transport moves :class:`~router.jms.model.JmsMessage` values (through a pluggable :class:`MessageCodec`) and raw
STOMP-style header dicts between nsjms and a JMS broker. Implementations: :mod:`router.jms.stomp` (stomp.py 9, for
ActiveMQ Classic and other STOMP 1.2 brokers) and :mod:`router.jms.memory` (an in-process twin for unit tests).

Exception tree (all picklable, all carrying their data)::

    TransportError
     ├── BrokerUnavailable      no usable connection; nothing was done (safe to retry after reconnect())
     ├── SendFailed             this message was definitely NOT accepted (.destination, .reason)
     │    ├── SendRefused       ... because the broker refused THIS message with an ERROR frame (.message, .body):
     │    │                     sending it again would be refused again (dead-letter it); a plain SendFailed is a
     │    │                     connection problem (retry after reconnect())
     │    └── BrokerFull        ... because the broker is out of a resource (full disk or store, usage limits,
     │                          quotas, producer flow control; router.jms.refusal): an OUTAGE, retry later, never
     │                          dead-letter for it (.message, .body, .resource)
     ├── ReceiptTimeout         the outcome is UNKNOWN: the frame left, no receipt came back (.operation)
     ├── BrokerError            the broker answered with an ERROR frame (.message, .body, .receipt_id; .resource:
     │                          the refusal is a resource outage, router.jms.refusal)
     └── ProtocolError
          ├── RemoteProtocolError   the broker sent something this client cannot make sense of
          └── LocalProtocolError    the caller misused the transport (unknown tx, double ack, use after close,
                                    a message the codec cannot encode, a malformed destination)

``ReceiptTimeout`` is neither a success nor a failure: a SEND may or may not be on the queue, a COMMIT may or may
not have happened. Callers must resolve it with their own means (the outbox and dedupe ids), never by assuming.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import tenacity

from router.jms.model import BodyType, DeliveryMode, Destination, JmsMessage, JmsType, Typed
from router.jms.refusal import RESOURCE_MARK, Refusal, classify, is_resource

__all__ = [
    "RECONNECT_POLICY",
    "AckMode",
    "BrokerError",
    "BrokerFull",
    "BrokerUnavailable",
    "ConnectionState",
    "Delivery",
    "EncodedMessage",
    "LocalProtocolError",
    "MessageCodec",
    "PendingReceipt",
    "ProtocolError",
    "ReceiptTimeout",
    "RemoteProtocolError",
    "RetryPolicy",
    "SendFailed",
    "SendRefused",
    "SimpleCodec",
    "Subscription",
    "Transport",
    "TransportError",
    "open_transport",
    "parse_destination",
    "redact_url",
    "refused_send",
    "register_scheme",
    "resource_refusal",
    "stomp_destination",
]

log = logging.getLogger("nsjms.transport")


# --------------------------------------------------------------------------------------------------- exceptions
class TransportError(Exception):
    """Base of every error raised by a transport."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else type(self).__name__


class BrokerUnavailable(TransportError):
    """There is no usable connection (never connected, lost, broker down). Nothing was done by this call."""


class SendFailed(TransportError):
    """The message to ``destination`` was definitely not accepted by the broker; resending is safe."""

    def __init__(self, reason: str, destination: str) -> None:
        super().__init__(reason, destination)
        self.reason = reason
        self.destination = destination

    def __str__(self) -> str:
        return f"send to {self.destination} failed: {self.reason}"


class SendRefused(SendFailed):
    """The broker answered this SEND with an ERROR frame (``message``, ``body``): it refuses the message itself
    (authorization, a header it cannot parse, a destination it refuses). Sending the same message again would be
    refused again; the connection may still be usable. A broker out of a resource raises :class:`BrokerFull`
    instead (:func:`refused_send`)."""

    def __init__(self, reason: str, destination: str, message: str = "", body: str = "") -> None:
        super().__init__(reason, destination)
        self.args = (reason, destination, message, body)
        self.message = message
        self.body = body

    @classmethod
    def from_error(cls, error: BrokerError, destination: str) -> SendRefused:
        return cls(str(error), destination, error.message, error.body)


class BrokerFull(SendFailed):
    """The broker refused this SEND because it is out of a resource (``resource``: a full disk or store, its store,
    temp or memory usage limit, a quota, producer flow control; see :mod:`router.jms.refusal`). The message was not
    accepted and is not the problem: an outage. Keep it and send it again later; never dead-letter it for this (the
    dead-letter destination is on the same full store)."""

    def __init__(self, reason: str, destination: str, message: str = "", body: str = "", resource: str = "") -> None:
        super().__init__(reason, destination)
        self.args = (reason, destination, message, body, resource)
        self.message = message
        self.body = body
        self.resource = resource

    def __str__(self) -> str:
        return f"send to {self.destination} refused, {RESOURCE_MARK} ({self.resource}): {self.reason}"


def refused_send(error: BrokerError, destination: str) -> SendFailed:
    """The exception for a SEND the broker answered with ``error``: :class:`BrokerFull` for a resource refusal,
    else :class:`SendRefused` (the one decision, :func:`router.jms.refusal.classify`)."""
    verdict = classify(error.message, error.body)
    if verdict.refusal is Refusal.RESOURCE:
        return BrokerFull(str(error), destination, error.message, error.body, verdict.resource)
    return SendRefused.from_error(error, destination)


def resource_refusal(exc: BaseException) -> bool:
    """``exc`` is the broker's refusal for lack of a resource (:class:`BrokerFull`, or a :class:`BrokerError` whose
    texts classify so, e.g. a COMMIT refused on a full disk): an outage, never a reason to dead-letter."""
    return isinstance(exc, BrokerFull) or (isinstance(exc, BrokerError) and exc.resource)


class ReceiptTimeout(TransportError):
    """A frame was written but no receipt (nor ERROR) came back. The outcome is UNKNOWN, not a failure."""

    outcome = "unknown"

    def __init__(self, reason: str, operation: str) -> None:
        super().__init__(reason, operation)
        self.reason = reason
        self.operation = operation

    def __str__(self) -> str:
        return f"{self.operation}: outcome unknown ({self.reason})"


class BrokerError(TransportError):
    """The broker rejected a frame with an ERROR frame: ``message`` header, ``body`` text, ``receipt_id``."""

    def __init__(self, message: str, body: str = "", receipt_id: str | None = None) -> None:
        super().__init__(message, body, receipt_id)
        self.message = message
        self.body = body
        self.receipt_id = receipt_id

    def __str__(self) -> str:
        """``broker error: MESSAGE``; when the ``message`` header gives no reason (empty, or ending in ``:`` as
        ActiveMQ's do for some refusals), the first line of the body, which carries it."""
        message = self.message.strip()
        if not message or message.endswith(":"):
            first = next((line.strip() for line in self.body.splitlines() if line.strip()), "")
            message = f"{message} {first}".strip() if first else (message.rstrip(":") or "(no reason given)")
        return f"broker error: {message}"

    @property
    def resource(self) -> bool:
        """The broker refused for lack of a resource (an outage, not this frame's content: router.jms.refusal)."""
        return is_resource(self.message, self.body)


class ProtocolError(TransportError):
    """A protocol rule was broken, by the peer or by the caller."""


class RemoteProtocolError(ProtocolError):
    """The broker sent a frame this client cannot interpret."""


class LocalProtocolError(ProtocolError):
    """The caller misused the transport: unknown transaction, double ack, use after close, unencodable message."""


# --------------------------------------------------------------------------------------------------- value types
class ConnectionState(enum.StrEnum):
    DISCONNECTED = "disconnected"
    CONNECTED = "connected"
    CLOSED = "closed"


class AckMode(enum.StrEnum):
    AUTO = "auto"
    CLIENT = "client"                       # cumulative, like JMS CLIENT_ACKNOWLEDGE
    CLIENT_INDIVIDUAL = "client-individual"


@dataclass(frozen=True)
class Delivery:
    """One received message. ``headers``/``body`` are the raw frame; ``message`` is the codec's decoding."""

    message: JmsMessage
    headers: Mapping[str, str]
    body: bytes
    subscription: str
    ack_id: str
    message_id: str
    destination: str
    redelivered: bool
    epoch: int = field(default=0, compare=False)   # which connection delivered it; acks need the same one
    decode_error: str | None = None   # the codec could not decode the frame: ``message`` is a raw BytesMessage


@dataclass(frozen=True)
class EncodedMessage:
    """A message as STOMP headers plus body bytes (``content-length`` present means a JMS BytesMessage)."""

    headers: dict[str, str]
    body: bytes


class MessageCodec(Protocol):
    """Turns :class:`JmsMessage` values into STOMP headers + body and back (the mapping layer provides richer ones)."""

    def encode(self, message: JmsMessage) -> EncodedMessage:
        """Headers and body for ``message``; raise :class:`LocalProtocolError` for what cannot be carried."""
        ...

    def decode(self, headers: Mapping[str, str], body: bytes) -> JmsMessage:
        """The message for a received MESSAGE frame; must not raise for unknown headers."""
        ...


@runtime_checkable
class Subscription(Protocol):
    """A consumer on one destination; deliveries arrive in a local queue fed by the transport."""

    id: str
    destination: str
    ack_mode: AckMode

    def receive(self, timeout: float | None = None) -> Delivery | None:
        """The next delivery, or ``None`` after ``timeout`` s. Raises :class:`BrokerUnavailable` while disconnected
        (deliveries that still need an ack from a lost connection are dropped: the broker redelivers them) and
        :class:`LocalProtocolError` after unsubscribe/close."""
        ...


class PendingReceipt(Protocol):
    """A receipted frame written without waiting (:meth:`Transport.commit_nowait`)."""

    def wait(self) -> None:
        """Wait for the answer; raises as the waiting operation would have."""
        ...

    def discard(self) -> None:
        """Instead of ``wait``: never wait for the answer (its outcome stays unknown); frees what waiting holds."""
        ...


@runtime_checkable
class Transport(Protocol):
    """A connection to a JMS broker. Thread-safe: sends, acks and receives may run on different threads."""

    url: str

    def connect(self, *, retry: bool = False) -> None:
        """Open the connection (once, or under the reconnect policy when ``retry``); :class:`BrokerUnavailable`."""
        ...

    def reconnect(self) -> None:
        """Drop the connection if any, connect under the reconnect policy, re-subscribe every subscription.
        Open transactions and un-acked deliveries of the old connection are gone (the broker rolled them back)."""
        ...

    def renew(self) -> None:
        """Replace the live connection on purpose (not a loss: the state callback hears nothing of the old one):
        close it cleanly (the broker takes its transactions' state and un-acked deliveries back, and redelivers
        those first), connect and re-subscribe as :meth:`reconnect` does. Deliveries of the old connection are
        gone, so no transaction of it may still be open. For state a broker keeps per connection that only a new
        connection clears (ActiveMQ's STOMP transacted acks, ``router.bridge.t2in.RENEW_AFTER``)."""
        ...

    def close(self) -> None:
        """Disconnect; un-acked deliveries are redelivered by the broker. Idempotent."""
        ...

    def is_connected(self) -> bool: ...

    def send(self, destination: Destination | str, message: JmsMessage, *, transaction: str | None = None,
             receipt: bool = True, headers: Mapping[str, str] | None = None) -> None:
        """Send one message (``persistent`` always explicit). With ``receipt`` wait for the broker's receipt.
        Raises :class:`SendFailed` (definitely not sent) or :class:`ReceiptTimeout` (unknown)."""
        ...

    def send_encoded(self, destination: Destination | str, encoded: EncodedMessage, *, persistent: bool,
                     transaction: str | None = None, receipt: bool = True) -> None:
        """Send a frame already encoded (headers + body, e.g. an outbox row re-sent by recovery), with the same
        errors as :meth:`send`."""
        ...

    def begin(self) -> str:
        """Start a broker transaction (receipted: a BEGIN the broker refuses raises here); returns its id."""
        ...

    def begin_nowait(self) -> str:
        """Start a broker transaction without awaiting the BEGIN's receipt (STOMP: no receipt asked); returns its
        id. A BEGIN the broker refused shows up at the COMMIT (or in :meth:`transaction_problem` after a receipted
        frame) as a failed frame of the transaction: only for callers that then resend its messages one by one."""
        ...

    def transaction_problem(self, transaction: str) -> str | None:
        """Why ``transaction`` could not commit every frame sent in it (an ERROR frame for one of them, a lost
        connection, not open), or None. Call it after a receipted frame: every earlier answer has arrived then."""
        ...

    def commit(self, transaction: str) -> None:
        """Commit (receipted). :class:`ReceiptTimeout` means the commit may or may not have happened."""
        ...

    def commit_nowait(self, transaction: str) -> PendingReceipt:
        """Write the COMMIT and return without waiting for its receipt; the result's ``wait`` does (and raises
        what :meth:`commit` raises). Other frames may be written meanwhile; call ``wait`` once."""
        ...

    def abort(self, transaction: str) -> None:
        """Roll back (receipted); a transaction of a lost connection is already rolled back: no error."""
        ...

    def subscribe(self, destination: Destination | str, *, selector: str | None = None,
                  ack: AckMode | str = AckMode.CLIENT_INDIVIDUAL, durable_name: str | None = None,
                  prefetch: int = 100, transformation: str | None = None) -> Subscription:
        """Start consuming (receipted). A bad selector gives :class:`BrokerError`."""
        ...

    def unsubscribe(self, subscription: Subscription, *, remove_durable: bool = False) -> None:
        """Stop consuming; un-acked deliveries go back to the broker. ``remove_durable`` deletes a durable one."""
        ...

    def ack(self, delivery: Delivery, transaction: str | None = None, *, receipt: bool = True) -> None:
        """Acknowledge (in ``transaction`` if given). Acking twice is a :class:`LocalProtocolError`."""
        ...

    def ack_many(self, deliveries: Sequence[Delivery], transaction: str | None = None) -> None:
        """Receipt-less ACKs of ``deliveries`` in order (in ``transaction`` if given), as that many
        ``ack(d, transaction, receipt=False)`` calls (STOMP: written together). A delivery that cannot be acked
        (already acked, of a lost connection) raises once those before it are acked."""
        ...

    def nack(self, delivery: Delivery, transaction: str | None = None, *, receipt: bool = True) -> None:
        """Reject: ActiveMQ moves the message to its dead-letter queue (``ActiveMQ.DLQ``)."""
        ...


StateCallback = Callable[[ConnectionState], None]


# --------------------------------------------------------------------------------------------------- destinations
_KINDS = ("queue", "topic", "temp-queue", "temp-topic")


def stomp_destination(destination: Destination | str) -> str:
    """``/queue/x`` style name; raises :class:`LocalProtocolError` for anything else."""
    text = destination.stomp() if isinstance(destination, Destination) else destination
    parse_destination(text)
    return text


def parse_destination(text: str) -> Destination:
    """``/queue/a.b`` → ``Destination("queue", "a.b")``."""
    _, _, rest = text.partition("/")
    kind, sep, name = rest.partition("/")
    if not text.startswith("/") or not sep or not name or kind not in _KINDS:
        raise LocalProtocolError(f"not a STOMP destination (want /queue/NAME or /topic/NAME): {text!r}")
    return Destination(kind, name)


# --------------------------------------------------------------------------------------------------- default codec
#: Headers with a STOMP or JMS-header meaning; never application properties.
RESERVED_HEADERS = frozenset({
    "destination", "message-id", "subscription", "ack", "receipt", "receipt-id", "transaction", "content-length",
    "content-type", "expires", "priority", "persistent", "timestamp", "redelivered", "correlation-id", "reply-to",
    "type", "id", "selector", "AMQ_SCHEDULED_DELAY",
})


class SimpleCodec:
    """TEXT/BYTES/empty bodies, String properties and the STOMP-mapped JMS headers (digest §13.4).

    Other body types and non-String properties are refused with :class:`LocalProtocolError`: supply the mapping
    layer's codec for those.
    """

    def __init__(self, clock_ms: Callable[[], int] | None = None) -> None:
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))

    def encode(self, message: JmsMessage) -> EncodedMessage:
        headers = self._jms_headers(message)
        for name, value in message.properties.items():
            headers[name] = self._property(name, value)
        body, is_bytes = self._body(message)
        if is_bytes:
            headers["content-length"] = str(len(body))
        return EncodedMessage(headers, body)

    def decode(self, headers: Mapping[str, str], body: bytes) -> JmsMessage:
        is_bytes = "content-length" in headers
        props = {k: Typed(JmsType.STRING, v) for k, v in headers.items() if k not in RESERVED_HEADERS}
        reply = headers.get("reply-to")
        return JmsMessage(
            body_type=BodyType.BYTES if is_bytes else BodyType.TEXT,
            body=bytes(body) if is_bytes else body.decode("utf-8", errors="replace"),
            destination=_maybe_destination(headers.get("destination")),
            delivery_mode=(DeliveryMode.PERSISTENT if headers.get("persistent") == "true"
                           else DeliveryMode.NON_PERSISTENT),
            priority=_int(headers.get("priority"), 4), expiration=_int(headers.get("expires"), 0),
            timestamp=_int(headers.get("timestamp"), 0), message_id=headers.get("message-id"),
            correlation_id=headers.get("correlation-id"), reply_to=_maybe_destination(reply),
            jms_type=headers.get("type"), redelivered=headers.get("redelivered") == "true", properties=props)

    def _jms_headers(self, message: JmsMessage) -> dict[str, str]:
        headers = {"priority": str(message.priority)}
        if message.expiration:
            headers["expires"] = str(message.expiration)
        delay = message.delivery_time - self._clock_ms() if message.delivery_time else 0
        if delay > 0:
            headers["AMQ_SCHEDULED_DELAY"] = str(delay)
        optional = {"correlation-id": message.correlation_id, "type": message.jms_type,
                    "reply-to": message.reply_to.stomp() if message.reply_to else None}
        headers.update({k: v for k, v in optional.items() if v is not None})
        return headers

    @staticmethod
    def _property(name: str, value: Typed) -> str:
        if name in RESERVED_HEADERS or not name:
            raise LocalProtocolError(f"property name {name!r} clashes with a STOMP header")
        if value.type is not JmsType.STRING or not isinstance(value.value, str):
            raise LocalProtocolError(f"SimpleCodec carries String properties only; {name!r} is {value.type}")
        return value.value

    @staticmethod
    def _body(message: JmsMessage) -> tuple[bytes, bool]:
        kind, body = message.body_type, message.body
        if kind is BodyType.TEXT and isinstance(body, str):
            return body.encode("utf-8"), False
        if kind is BodyType.BYTES and isinstance(body, (bytes, bytearray)):
            return bytes(body), True
        if kind is BodyType.MESSAGE:
            return b"", False
        raise LocalProtocolError(f"SimpleCodec cannot carry a {kind} body of type {type(body).__name__}")


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def _maybe_destination(text: str | None) -> Destination | None:
    if not text:
        return None
    try:
        return parse_destination(text)
    except LocalProtocolError:
        return None


# --------------------------------------------------------------------------------------------------- retry policy
@dataclass(frozen=True)
class RetryPolicy:
    """A named, bounded, jittered retry policy, interruptible by a shutdown event (tenacity underneath)."""

    name: str
    max_attempts: int
    max_total_s: float
    initial_wait_s: float
    max_wait_s: float

    def retrying(self, shutdown: threading.Event, *,
                 retry_on: tuple[type[BaseException], ...] = (BrokerUnavailable,)) -> tenacity.Retrying:
        """A ``tenacity.Retrying``: stops after ``max_attempts``, ``max_total_s`` or when ``shutdown`` is set;
        sleeps on ``shutdown.wait`` so setting it ends the wait at once; re-raises the last error."""
        def sleep(seconds: float) -> None:
            shutdown.wait(seconds)

        return tenacity.Retrying(
            stop=(tenacity.stop_after_attempt(self.max_attempts) | tenacity.stop_after_delay(self.max_total_s)
                  | tenacity.stop_when_event_set(shutdown)),
            wait=tenacity.wait_random_exponential(multiplier=self.initial_wait_s, max=self.max_wait_s),
            retry=tenacity.retry_if_exception_type(retry_on),
            sleep=sleep, reraise=True, before_sleep=self._log_retry)

    def _log_retry(self, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("retry policy %s: attempt %d failed (%s); retrying", self.name, state.attempt_number, exc)


#: Reconnecting to the broker: up to 12 attempts within 60 s, waits 0.2 s .. 5 s with full jitter.
RECONNECT_POLICY = RetryPolicy("transport.reconnect", max_attempts=12, max_total_s=60.0,
                               initial_wait_s=0.2, max_wait_s=5.0)


# --------------------------------------------------------------------------------------------------- bookkeeping
@dataclass
class _Tx:
    epoch: int
    acks: list[Delivery] = field(default_factory=list)
    rollback_only: str | None = None
    unreceipted: int = 0        # receipt-less frames written in it (the BEGIN of ``begin_nowait`` included)
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
        self._txs: dict[str, _Tx] = {}
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
            self._txs[tx] = _Tx(epoch)

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

    def get_tx(self, tx: str) -> _Tx:
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

    def end_tx(self, tx: str) -> _Tx:
        """Forget ``tx``; returns its record. Unknown → :class:`LocalProtocolError`."""
        with self.lock:
            self.check_open()
            entry = self._txs.pop(tx, None)
            if entry is None:
                raise LocalProtocolError(f"unknown transaction {tx!r} (never begun, or already ended)")
            return entry

    def is_live(self, entry: _Tx) -> bool:
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

    def restore(self, entry: _Tx) -> None:
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


# --------------------------------------------------------------------------------------------------- URL table
TransportFactory = Callable[..., Transport]


def _stomp_factory(url: str, **opts: Any) -> Transport:
    from router.jms.stomp import StompTransport
    return StompTransport(url, **opts)


def _memory_factory(url: str, **opts: Any) -> Transport:
    from router.jms.memory import MemoryTransport
    return MemoryTransport(url, **opts)


_SCHEMES: dict[str, TransportFactory] = {
    "stomp": _stomp_factory,
    "stomp+ssl": _stomp_factory,
    "memory": _memory_factory,
}


def register_scheme(scheme: str, factory: TransportFactory) -> None:
    """Add or replace the implementation for a URL scheme (e.g. a test double)."""
    _SCHEMES[scheme] = factory


def open_transport(url: str, **opts: Any) -> Transport:
    """A transport for ``url`` (not yet connected), picked by scheme: ``stomp://``, ``stomp+ssl://``, ``memory://``.

    Options are the implementation's keyword arguments (``username``, ``password``, ``client_id``, ``codec``,
    ``on_state``, ``shutdown``, ``receipt_timeout``, ...; see docs/transport.md).
    """
    scheme = urlsplit(url).scheme
    factory = _SCHEMES.get(scheme)
    if factory is None:
        raise LocalProtocolError(f"unsupported transport URL scheme {scheme!r} (known: {sorted(_SCHEMES)})")
    return factory(url, **opts)


def redact_url(url: str) -> str:
    """``url`` without any user-info part (credentials are never logged)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=host).geturl()
