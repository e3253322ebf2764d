"""The STOMP codec the bridge gives its transport: the mapping layer's typed-property and body conventions."""

from __future__ import annotations

from collections.abc import Mapping

from router.jms.model import JmsMessage
from router.jms.transport import EncodedMessage
from router.mapping.stomp_body import message_from_stomp, message_to_stomp

__all__ = ["MappingCodec"]


class MappingCodec:
    """Encodes with :func:`message_to_stomp` and decodes with :func:`message_from_stomp` (docs/mapping.md)."""

    def encode(self, message: JmsMessage) -> EncodedMessage:
        frame = message_to_stomp(message)
        return EncodedMessage(dict(frame.headers), bytes(frame.body))

    def decode(self, headers: Mapping[str, str], body: bytes) -> JmsMessage:
        return message_from_stomp(dict(headers), body)
