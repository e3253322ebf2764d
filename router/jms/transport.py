"""The broker transport contract: one interface, the values crossing it, and the URL-scheme table that picks an
implementation.

A transport moves :class:`~router.jms.model.JmsMessage` values between nsjms and a JMS broker, encoded at its one
boundary by a pluggable :class:`MessageCodec` into an :class:`EncodedMessage` (the codec's named string fields and
body bytes: for STOMP the frame's headers and body). Above ``router.jms`` nothing builds or reads a wire format:
the bridge hands the transport a ``JmsMessage``, or an ``EncodedMessage`` the same codec made (checked against the
broker's limits with :meth:`MessageCodec.check`, stamped with dedupe ids as string properties, stored in the outbox
and re-sent by recovery). Implementations: :mod:`router.jms.stomp` (stomp.py 9, for
ActiveMQ Classic and other STOMP 1.2 brokers) and :mod:`router.jms.memory` (an in-process twin for unit tests).
What they share beside this interface: :mod:`router.jms.session` (client-side session state, so misuse fails the
same way on each), :mod:`router.jms.retry` (the reconnect policy), :mod:`router.jms.codec` (the default codec).

The exceptions a transport raises are part of this contract; they are defined in :mod:`router.jms.errors` (the tree
is drawn there) and exported here with the interface.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from router.jms.errors import (
    BrokerError,
    BrokerFull,
    BrokerUnavailable,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    SendFailed,
    SendRefused,
    TransportError,
    UnconfirmedOutcome,
    refused_send,
    resource_refusal,
)
from router.jms.model import Destination, JmsMessage

__all__ = [
    "AckMode",
    "BrokerError",
    "BrokerFull",
    "BrokerUnavailable",
    "Confirm",
    "ConnectionState",
    "Delivery",
    "EncodedMessage",
    "LocalProtocolError",
    "MessageCodec",
    "PendingConfirmation",
    "ProtocolError",
    "RemoteProtocolError",
    "SendFailed",
    "SendRefused",
    "StateCallback",
    "Subscription",
    "Transport",
    "TransportError",
    "TransportFactory",
    "UnconfirmedOutcome",
    "open_transport",
    "parse_destination",
    "redact_url",
    "refused_send",
    "register_scheme",
    "resource_refusal",
    "stomp_destination",
]


# --------------------------------------------------------------------------------------------------- value types
class ConnectionState(enum.StrEnum):
    DISCONNECTED = "disconnected"
    CONNECTED = "connected"
    CLOSED = "closed"


class Confirm(enum.Enum):
    """How long a write to the broker holds its caller (the durability point of a send, an ack, a BEGIN).

    ``CONFIRMED``: until the broker confirmed the operation (or refused it: the error is raised by the call), so
    whatever the caller does next may rely on it. ``PIPELINED``: only until it is written; the broker's refusal
    shows up later, in order: at the next confirmed operation of the same transaction
    (:meth:`Transport.transaction_problem`, the COMMIT), else on the connection. How an implementation gets the
    confirmation is its own: the STOMP adapter asks for a receipt (``router.jms.stomp``); OpenWire would set
    ``responseRequired``, AMQP 1.0 wait for the settled disposition."""

    CONFIRMED = "confirmed"
    PIPELINED = "pipelined"


class AckMode(enum.StrEnum):
    AUTO = "auto"
    CLIENT = "client"                       # cumulative, like JMS CLIENT_ACKNOWLEDGE
    CLIENT_INDIVIDUAL = "client-individual"


@dataclass(frozen=True)
class Delivery:
    """One received message: the codec's decoding (``message``), the body bytes as received (``body``: the dead
    letter of a message the codec could not decode carries them) and what the broker said about this delivery, in
    typed fields the transport fills (callers read these, never a wire header).

    ``headers`` are the received wire fields as they came (STOMP: the MESSAGE frame's headers), kept for
    diagnostics and tests; nothing above ``router.jms`` reads them, and a protocol without named wire fields may
    leave them empty."""

    message: JmsMessage
    headers: Mapping[str, str]
    body: bytes
    subscription: str                 # the subscription (consumer) that received it
    ack_id: str                       # what an ack or nack of this delivery names
    message_id: str                   # JMSMessageID, as the broker gave it
    destination: str                  # where it was sent, ``/queue/NAME`` or ``/topic/NAME``
    redelivered: bool                 # JMSRedelivered
    epoch: int = field(default=0, compare=False)   # which connection delivered it; acks need the same one
    decode_error: str | None = None   # the codec could not decode it: ``message`` is a raw BytesMessage
    timestamp_ms: int = 0             # JMSTimestamp as the broker gave it (ms since the epoch; 0: none)
    dedupe_id: str | None = None      # its ``nsjms_dedupe_id`` String property (a message nsjms sent), if any
    body_lost: bool = False           # the protocol could not carry its body: an empty body nothing marks (over
    #                                   STOMP a Java Map/Stream/Object message arrives so, not to be told from an
    #                                   empty TextMessage)


@dataclass(frozen=True)
class EncodedMessage:
    """A message in its codec's wire form: ``headers``, named string fields (a JMS String property is one, by its
    name: the bridge stamps dedupe ids there), and ``body`` bytes. The STOMP codecs: the frame's headers and body
    (``content-length`` present means a JMS BytesMessage)."""

    headers: dict[str, str]
    body: bytes


class MessageCodec(Protocol):
    """Turns :class:`JmsMessage` values into an :class:`EncodedMessage` and back: the wire format of a transport
    (:class:`~router.jms.codec.SimpleCodec` by default; the node gives its STOMP transports the mapping layer's
    ``router.mapping.stomp_codec.StompCodec``)."""

    #: which encoding this is (what an outbox row would record to be re-sent with the same codec)
    name: str

    def encode(self, message: JmsMessage) -> EncodedMessage:
        """Headers and body for ``message``; raise :class:`LocalProtocolError` for what cannot be carried."""
        ...

    def decode(self, headers: Mapping[str, str], body: bytes) -> JmsMessage:
        """The message for a received MESSAGE frame; must not raise for unknown headers."""
        ...

    def check(self, encoded: EncodedMessage) -> None:
        """Raise when the broker would refuse ``encoded`` for its wire limits (header count or size, number
        formats): the codec's own error, which its callers treat as a failure of the message (the mapping's
        ``MappingError``: the bridge dead-letters it). A codec whose wire has no such limits checks nothing."""
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


class PendingConfirmation(Protocol):
    """An operation written to the broker whose confirmation the caller has not awaited yet
    (:meth:`Transport.commit_pipelined`)."""

    def wait(self) -> None:
        """Wait for the broker's confirmation; raises as the confirmed operation would have."""
        ...

    def discard(self) -> None:
        """Instead of ``wait``: never wait for the answer (its outcome stays unknown); frees what waiting holds."""
        ...


@runtime_checkable
class Transport(Protocol):
    """A connection to a JMS broker. Thread-safe: sends, acks and receives may run on different threads."""

    url: str

    @property
    def codec(self) -> MessageCodec:
        """The codec this transport encodes and decodes with (what :meth:`encode` and :meth:`send` use; an outbox
        row its ``name`` names is re-sent as stored)."""
        ...

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
             confirm: Confirm = Confirm.CONFIRMED, headers: Mapping[str, str] | None = None) -> None:
        """Send one message (``persistent`` always explicit), returning once ``confirm`` says. Raises
        :class:`SendFailed` (definitely not sent) or :class:`UnconfirmedOutcome` (no confirmation came: unknown)."""
        ...

    def encode(self, message: JmsMessage) -> EncodedMessage:
        """``message`` as this transport's codec encodes it (what :meth:`send` would write), without sending."""
        ...

    def send_encoded(self, destination: Destination | str, encoded: EncodedMessage, *, persistent: bool,
                     transaction: str | None = None, confirm: Confirm = Confirm.CONFIRMED) -> None:
        """Send a message already encoded (headers + body, e.g. an outbox row re-sent by recovery), with the same
        errors as :meth:`send`."""
        ...

    def send_encoded_many(self, destination: Destination | str, messages: Sequence[tuple[EncodedMessage, bool]], *,
                          transaction: str) -> None:
        """Send ``messages``, each ``(encoded, persistent)``, in ``transaction``, in order, unconfirmed: the frames
        and the session's book exactly as that many ``send_encoded(..., transaction=transaction,
        confirm=Confirm.PIPELINED)`` calls, which an implementation may write together (STOMP: one socket write per
        256 KiB over plain TCP). Same errors as :meth:`send_encoded`; messages of a failed call may have been
        written (the caller aborts the transaction, as after a failed send)."""
        ...

    def begin(self, confirm: Confirm = Confirm.CONFIRMED) -> str:
        """Start a broker transaction; returns its id. ``CONFIRMED``: a BEGIN the broker refuses raises here.
        ``PIPELINED`` (no round trip): a refused BEGIN shows up at the COMMIT (or in :meth:`transaction_problem`
        after a confirmed operation) as a failed operation of the transaction: only for callers that then resend
        its messages one by one."""
        ...

    def transaction_problem(self, transaction: str) -> str | None:
        """Why ``transaction`` could not commit every frame sent in it (an ERROR frame for one of them, a lost
        connection, not open), or None. Call it after a confirmed operation of it: every earlier answer has arrived
        then."""
        ...

    def commit(self, transaction: str) -> None:
        """Commit and wait for the broker's confirmation. :class:`UnconfirmedOutcome`: the commit may or may not have
        happened."""
        ...

    def commit_pipelined(self, transaction: str) -> PendingConfirmation:
        """Write the commit and return without waiting for its confirmation; the result's ``wait`` does (and raises
        what :meth:`commit` raises). Other operations may be written meanwhile; call ``wait`` once."""
        ...

    def abort(self, transaction: str) -> None:
        """Roll back (confirmed); a transaction of a lost connection is already rolled back: no error."""
        ...

    def subscribe(self, destination: Destination | str, *, selector: str | None = None,
                  ack: AckMode | str = AckMode.CLIENT_INDIVIDUAL, durable_name: str | None = None,
                  prefetch: int = 100, transformation: str | None = None) -> Subscription:
        """Start consuming (confirmed). A bad selector gives :class:`BrokerError`."""
        ...

    def unsubscribe(self, subscription: Subscription, *, remove_durable: bool = False) -> None:
        """Stop consuming; un-acked deliveries go back to the broker. ``remove_durable`` deletes a durable one."""
        ...

    def ack(self, delivery: Delivery, transaction: str | None = None, *,
            confirm: Confirm = Confirm.CONFIRMED) -> None:
        """Acknowledge (in ``transaction`` if given). Acking twice is a :class:`LocalProtocolError`."""
        ...

    def ack_many(self, deliveries: Sequence[Delivery], transaction: str | None = None) -> None:
        """Pipelined acks of ``deliveries`` in order (in ``transaction`` if given), as that many
        ``ack(d, transaction, confirm=Confirm.PIPELINED)`` calls (STOMP: written together). A delivery that cannot
        be acked (already acked, of a lost connection) raises once those before it are acked."""
        ...

    def nack(self, delivery: Delivery, transaction: str | None = None, *,
             confirm: Confirm = Confirm.CONFIRMED) -> None:
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


# --------------------------------------------------------------------------------------------------- URL table
TransportFactory = Callable[..., Transport]


def _stomp_factory(url: str, **opts: Any) -> Transport:
    from router.jms.stomp.transport import StompTransport
    return StompTransport(url, **opts)


def _memory_factory(url: str, **opts: Any) -> Transport:
    from router.jms.memory.transport import MemoryTransport
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
