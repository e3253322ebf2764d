"""The broker transport's exceptions: what a :class:`~router.jms.transport.Transport` raises, for every
implementation alike (part of the seam; :mod:`router.jms.transport` exports them with the interface).

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
     ├── UnconfirmedOutcome         the outcome is UNKNOWN: the operation left, no confirmation came back (.operation)
     ├── BrokerError            the broker answered with an ERROR frame (.message, .body, .receipt_id; .resource:
     │                          the refusal is a resource outage, router.jms.refusal)
     └── ProtocolError
          ├── RemoteProtocolError   the broker sent something this client cannot make sense of
          └── LocalProtocolError    the caller misused the transport (unknown tx, double ack, use after close,
                                    a message the codec cannot encode, a malformed destination)

``UnconfirmedOutcome`` is neither a success nor a failure: a SEND may or may not be on the queue, a COMMIT may or may
not have happened. Callers must resolve it with their own means (the outbox and dedupe ids), never by assuming.
"""

from __future__ import annotations

from router.jms.refusal import RESOURCE_MARK, Refusal, classify, is_resource

__all__ = [
    "BrokerError",
    "BrokerFull",
    "BrokerUnavailable",
    "LocalProtocolError",
    "ProtocolError",
    "RemoteProtocolError",
    "SendFailed",
    "SendRefused",
    "TransportError",
    "UnconfirmedOutcome",
    "refused_send",
    "resource_refusal",
]


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


class UnconfirmedOutcome(TransportError):
    """An operation was written but no confirmation (nor refusal) came back: over STOMP no receipt (nor ERROR)
    within the receipt timeout, or the connection was lost first. The outcome is UNKNOWN, not a failure."""

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
