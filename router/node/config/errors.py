"""The configuration's one exception (see :mod:`router.node.config`)."""

from __future__ import annotations

from typing import Any

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the key and the source of the bad value."""

    def __init__(self, message: str, key: str = "", source: str = "") -> None:
        super().__init__(message)
        self.key = key
        self.source = source

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.key, self.source))
