"""The port an operator's tools use to look into a broker destination and settle one of its messages (the broker's
dead-letter queues, :mod:`router.deadletter.broker`): broker-neutral types and the :class:`DestinationBrowser` protocol.

The STOMP implementation is :class:`router.jms.stomp.browse.StompBrowser`. Every implementation raises only the
exceptions of :mod:`router.jms.errors` (:class:`~router.jms.errors.BrokerUnavailable` when the broker cannot be
reached, :class:`~router.jms.errors.BrokerError` when it refuses a frame, :class:`~router.jms.errors.UnconfirmedOutcome`
when the outcome of a settlement is unknown, :class:`~router.jms.errors.LocalProtocolError` for a malformed request)
and :class:`MessageHeld`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from router.jms.errors import TransportError

__all__ = ["Browse", "BrowsedMessage", "DestinationBrowser", "MessageHeld", "OutgoingCopy", "id_selector"]


@dataclass(frozen=True)
class BrowsedMessage:
    """One message as the broker shows it: its destination (``/queue/NAME``), id, headers (the broker's, every
    property as text) and body bytes."""

    destination: str
    message_id: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True)
class Browse:
    """The messages of a destination in the broker's order; ``complete``: the broker said it showed them all
    (False: the caller's ``limit`` was reached first)."""

    messages: list[BrowsedMessage]
    complete: bool


@dataclass(frozen=True)
class OutgoingCopy:
    """A message to send in the same transaction as a settlement: destination (``/queue/NAME`` or
    ``/topic/NAME``), headers (application properties and JMS headers, as text), body."""

    destination: str
    headers: Mapping[str, str]
    body: bytes


class MessageHeld(TransportError):
    """The message is on the destination but was not delivered to this settlement within its wait (another
    consumer holds it, or the broker has not paged it in): nothing was done."""


class DestinationBrowser(Protocol):
    """What :mod:`router.deadletter.broker` needs of a broker (see the module docstring)."""

    def browse(self, destination: str, *, selector: str | None = None, limit: int = 1000) -> Browse:
        """Copies of the messages on ``destination`` (``/queue/NAME``), none consumed or locked; at most
        ``limit``; ``selector``: a JMS message selector."""
        ...

    def settle(self, destination: str, message_id: str,
               copy: Callable[[BrowsedMessage], OutgoingCopy] | None = None, *,
               wait_s: float = 10.0) -> BrowsedMessage | None:
        """Consume the message ``message_id`` of ``destination`` and, with ``copy``, send ``copy(message)`` in the
        SAME broker transaction (both or neither); returns the message, or None when the destination has no such
        message. ``copy`` may raise: then nothing is done and its exception propagates. :class:`MessageHeld` when
        the message is there but not delivered within ``wait_s``; :class:`~router.jms.errors.UnconfirmedOutcome` when
        the commit's outcome is unknown."""
        ...


def id_selector(message_id: str) -> str:
    """The JMS selector naming one message id (a quote in the id doubled, as a selector's string literal wants)."""
    return "JMSMessageID = '" + message_id.replace("'", "''") + "'"
