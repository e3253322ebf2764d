"""A stand-in for :class:`router.db.Database` in unit tests whose store is an in-memory twin.

``unit_of_work()`` yields a placeholder connection the twin ignores and counts the units opened, committed and
rolled back (an exception inside the block), so a test can check where the caller's transaction boundaries are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["NullDatabase"]


class NullDatabase:
    def __init__(self) -> None:
        self.opened = 0
        self.committed = 0
        self.rolled_back = 0

    @contextmanager
    def unit_of_work(self, timeout: float | None = None) -> Iterator[object]:
        self.opened += 1
        try:
            yield object()
        except BaseException:
            self.rolled_back += 1
            raise
        self.committed += 1
