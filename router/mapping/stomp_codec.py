"""The STOMP codec: a :class:`~router.jms.model.JmsMessage` as an ActiveMQ Classic STOMP frame and back.

The one :class:`~router.jms.transport.MessageCodec` the node gives its STOMP transports (``router.node.server``, ``nsjms
txn``): :func:`~router.mapping.stomp_body.message_to_stomp` / :func:`~router.mapping.stomp_body.message_from_stomp`
(the typed-property and body conventions of docs/mapping.md) and ActiveMQ's limits on a SEND frame
(:func:`~router.mapping.stomp_limits.check_stomp_limits`, :meth:`StompCodec.check`). The bridge and the routing layer
never name it: they see the :class:`~router.jms.transport.MessageCodec` port (``BrokerSettings.codec``) and the
transport's own ``encode``.
"""

from __future__ import annotations

from collections.abc import Mapping

from router.jms.codec import SimpleCodec
from router.jms.model import JmsMessage
from router.jms.transport import EncodedMessage, MessageCodec
from router.mapping.stomp_body import message_from_stomp, message_to_stomp
from router.mapping.stomp_limits import check_stomp_limits

__all__ = ["STOMP_CODEC", "StompCodec", "node_codecs"]

#: The codec's name (``MessageCodec.name``): what an outbox row's encoding would be recorded as.
STOMP_CODEC = "stomp-activemq"


class StompCodec:
    """Encodes with :func:`message_to_stomp`, decodes with :func:`message_from_stomp` (docs/mapping.md) and checks
    ActiveMQ Classic's limits on a SEND frame (:func:`check_stomp_limits`: a frame the broker would refuse is a
    mapping failure, dead-lettered with the reason)."""

    name = STOMP_CODEC

    def encode(self, message: JmsMessage) -> EncodedMessage:
        frame = message_to_stomp(message)
        return EncodedMessage(dict(frame.headers), bytes(frame.body))

    def decode(self, headers: Mapping[str, str], body: bytes) -> JmsMessage:
        return message_from_stomp(dict(headers), body)

    def check(self, encoded: EncodedMessage) -> None:
        check_stomp_limits(encoded.headers)


def node_codecs() -> tuple[MessageCodec, ...]:
    """Every codec a node has, by ``MessageCodec.name``: what its outbox re-sender can read a row with
    (``router.routing.t2.transactions.OutboxResender``; a row of any other codec is dead-lettered with the reason)."""
    return (StompCodec(), SimpleCodec())
