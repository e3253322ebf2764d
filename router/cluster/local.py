"""The seam through which a node's channel factory and bridge factory record the owner of what they create
(:class:`OwnerRecorder`), and the node's implementation over its membership (:class:`LocalOwner`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import psycopg

from router.cluster.errors import Fenced
from router.cluster.handoff import place_new
from router.cluster.ownership import assign_new

__all__ = ["LocalOwner", "OwnerRecorder"]


class OwnerRecorder(Protocol):
    """Records, in the creating transaction, that this node owns a new channel or bridge; raises
    :class:`~router.cluster.errors.Fenced` (the transaction then rolls back) when this node was fenced."""

    def assign(self, conn: psycopg.Connection[Any], kind: str, object_id: int) -> None: ...


class LocalOwner:
    """:class:`OwnerRecorder` of a node: the owner is this node at its current epoch (``epoch()``, None before it
    joined or once fenced). ``placement`` ``"least-loaded"``: a new channel is also handed to the live member owning
    the fewest objects when that is another node (a hand-off request in the creating transaction, carried out at
    this node's next renewal period, router/cluster/handoff.py); ``"creator"``: it stays here."""

    def __init__(self, node_id: str, epoch: Callable[[], int | None], placement: str = "creator") -> None:
        self.node_id = node_id
        self._epoch = epoch
        self.placement = placement

    def assign(self, conn: psycopg.Connection[Any], kind: str, object_id: int) -> None:
        epoch = self._epoch()
        if epoch is None:
            raise Fenced(f"node {self.node_id!r} is not a live member: {kind} {object_id} not created", self.node_id)
        assign_new(conn, kind, object_id, self.node_id, epoch)
        if kind == "channel" and self.placement == "least-loaded":
            place_new(conn, object_id, self.node_id, epoch)
