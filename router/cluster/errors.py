"""The cluster package's exceptions (tree in :mod:`router.cluster`)."""

from __future__ import annotations

__all__ = ["ClusterError", "Fenced", "NodeLive", "NotExpired"]


class ClusterError(RuntimeError):
    """A membership operation could not be done; nothing of it was committed."""

    def __init__(self, message: str, node_id: str) -> None:
        super().__init__(message)
        self.node_id = node_id

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.node_id))


class Fenced(ClusterError):
    """This node's epoch is not the live one any more (its work was taken over, or it left): it must stop acting on
    what it owned and rejoin as a new member."""


class NodeLive(ClusterError):
    """The node id holds a live lease: another process runs with this id, or its lease has not expired yet."""


class NotExpired(ClusterError):
    """A takeover was refused: the node's lease has not expired (it may be alive)."""
