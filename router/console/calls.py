"""The node calls one console request makes: CORBA operations on the node's objects, counted per thread.

The console's list pages call the node through the CLI's functions; what they cost the node is mostly the number of
operations they make (``bench/console_bench.py`` reads it from the ``X-Nsjms-Node-Calls`` header of each answer, a
figure that stays the same on a busy machine, unlike a time). :class:`Counted` wraps an object reference: every
operation called through it adds one to the calling thread's count (``_narrow`` is not an operation), and a reference
it returns is wrapped too. Only the read paths use it (lists and item pages); actions call the references unwrapped.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["Counted", "reset", "taken"]

_local = threading.local()


def reset() -> None:
    _local.count = 0


def taken() -> int:
    """Operations counted on this thread since :func:`reset`."""
    return int(getattr(_local, "count", 0))


def _wrap(value: Any) -> Any:
    from omniORB import CORBA

    if isinstance(value, CORBA.Object):
        return Counted(value)
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    return value


class Counted:
    """``ref`` with its operations counted (see the module docstring)."""

    __slots__ = ("_ref",)

    def __init__(self, ref: Any) -> None:
        self._ref = ref

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._ref, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if name != "_narrow":
                _local.count = taken() + 1
            return _wrap(attr(*args, **kwargs))
        return call
