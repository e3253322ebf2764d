"""The one error tree for "this batch could not be forwarded" between a channel and a bridge of the same node::

    ForwardError                 the bridge could not carry a batch the channel handed it in-process
    ├── ForwardDeferred          not now (stopped bridge, broker problem): the events stay in the channel, which
    │                            offers them again (channel PUSH → JMS without T2, ``LocalBatches``; the CORBA
    │                            push adapter answers ``TRANSIENT``)
    └── ForwardFailed            inside a T2 (``forward_in_t2`` / ``begin_in_t2``), after the bridge marked the T2
                                 rollback-only: ``content`` True when the batch itself is the problem (the broker
                                 refused a frame: the same batch fails the same way), else an outage (retry later)

Both are raised by the bridge and caught by the channel; neither side imports the other (bridge → routing ←
channel). A refused frame found at the broker branch's prepare carries the same ``content`` flag
(:func:`refused_content`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ForwardDeferred", "ForwardError", "ForwardFailed", "refused_content"]


class ForwardError(Exception):
    """The bridge could not carry a batch the channel handed it in-process; the subclass says what follows."""


class ForwardDeferred(ForwardError):
    """Channel → JMS: the events could not be forwarded now; they stay in the channel, which offers them again
    (the push adapter answers ``TRANSIENT``)."""


class ForwardFailed(ForwardError):
    """Raised by a participant's ``forward_in_t2`` (or ``begin_in_t2``) that could not carry the batch, after it
    marked the T2 rollback-only. ``content``: the batch itself is the problem (the broker refused a frame: the same
    batch fails the same way), else an outage (retry later)."""

    def __init__(self, reason: str, *, content: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.content = content

    def __reduce__(self) -> tuple[Any, ...]:
        return (_failed, (self.reason, self.content))


def _failed(reason: str, content: bool) -> ForwardFailed:
    return ForwardFailed(reason, content=content)


def refused_content(exc: BaseException) -> bool:
    """Whether a T2 failed because of its batch's content: a :class:`ForwardFailed` with ``content``, or an
    error of the broker branch's prepare marked ``content`` (a frame of the batch refused by the broker,
    ``router.bridge.txbranch``)."""
    return getattr(exc, "content", False) is True
