"""The mapping layer's exception tree.

::

    Exception
     └── MappingError(reason, field)         anything that cannot be mapped NS <-> JMS without loss or guessing
          └── MessageExpired(expiration, now_ms)   a JMS message whose JMSExpiration had passed when it was mapped

A mapping never drops data silently and never produces an empty body in place of one it could not map: it raises
:class:`MappingError`, naming the field (``"remainder_of_body"``, ``"Priority"``, ``"property:$fd_x"``, ...) so the
bridge can mark its routing transaction rollback-only and report the event or message. Decoding a JMS message
(STOMP headers, bodies, manifests, CDR) raises nothing else, whatever the input.

:class:`MessageExpired` is a :class:`MappingError`, so a caller that only knows the base class dead-letters an
expired message with its reason; a caller that tells them apart can record it as expired instead.
"""

from __future__ import annotations

__all__ = ["MappingError", "MessageExpired"]


class MappingError(Exception):
    """An event or message (or part of one) that cannot be mapped.

    ``reason`` says why in plain words; ``field`` names the offending part. Picklable (both travel in ``args``).
    """

    def __init__(self, reason: str, field: str) -> None:
        super().__init__(reason, field)
        self.reason = reason
        self.field = field

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


class MessageExpired(MappingError):
    """The message expired before it could become an event (JMS 3.4.9: an expired message is not delivered).

    ``expiration`` is the deadline in ms since the Unix epoch (JMSExpiration, or the StopTime of an event made by
    nsjms); ``now_ms`` the time of the mapping. A negative JMSExpiration is a time before 1970: expired.
    """

    def __init__(self, expiration: int, now_ms: int, field: str = "JMSExpiration") -> None:
        super().__init__(f"expired at {expiration} ms, {now_ms - expiration} ms before it was mapped", field)
        self.args = (expiration, now_ms, field)
        self.expiration = expiration
        self.now_ms = now_ms

    def __reduce__(self) -> tuple[type[MessageExpired], tuple[int, int, str]]:
        return MessageExpired, (self.expiration, self.now_ms, self.field)
