"""The mapping layer's one exception.

::

    Exception
     └── MappingError(reason, field)   anything that cannot be mapped NS <-> JMS without loss or guessing

A mapping never drops data silently and never produces an empty body in place of one it could not map: it raises
:class:`MappingError`, naming the field (``"remainder_of_body"``, ``"Priority"``, ``"property:$fd_x"``, ...) so the
bridge can mark its routing transaction rollback-only and report the event or message.
"""

from __future__ import annotations

__all__ = ["MappingError"]


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
