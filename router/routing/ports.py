"""The in-process link between a channel and a bridge of the same node, as typed ports.

Both sides depend on these protocols, never on each other (bridge → routing ← channel). The channel finds the
ports of a bridge endpoint through the node's :class:`~router.routing.registry.LocalEndpoints`; the bridge
registers them when it activates its endpoint servant and removes them when it is destroyed.

* :class:`OutboundBatches`: channel PUSH → JMS, local batches without a T2 (issue 12);
  ``router.bridge.batchout.LocalBatches``.
* :class:`OutboundParticipant`: channel PUSH → JMS in a T2 (NJI 2.7.3.1); ``router.bridge.txout.OutboundT2``.
* :class:`InboundSource`: JMS → channel PULL, in a T2 or a local unit of work; the pull senders of
  ``router.bridge.flows`` (``router.bridge.jmsin.PullSupply``).
* :class:`InboundRounds`: JMS → channel PUSH into a Persistent channel (local rounds with the inbox), the one port
  the channel offers the bridge; ``router.channel.t2in.LocalRounds``.

The batch values that cross (events, a T2's connection) stay ``Any`` here: the events are CosNotification
structured events (omniORB classes without types), the connection is the T2 branch's psycopg connection.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from xa.coordinator import Transaction

__all__ = ["InboundBatch", "InboundRounds", "InboundSource", "OutboundBatch", "OutboundBatches",
           "OutboundParticipant"]


# ------------------------------------------------------------------------------------------ channel → JMS
class OutboundBatch(Protocol):
    """One batch of :class:`OutboundBatches` in flight."""

    #: the STOMP transaction whose COMMIT is written and not yet receipted; None before :meth:`commit`
    pending: Any
    #: indexes of the batch's events the bridge handled already (dead-lettered, or confirmed one by one)
    handled: set[int]


class OutboundBatches(Protocol):
    """Channel PUSH → JMS without a T2: the channel's dispatcher hands whole batches to the bridge, pipelined
    (``router.channel.localpush``). Every method raises :class:`~router.routing.errors.ForwardDeferred` when the
    events could not be forwarded now; they then stay in the channel."""

    def running(self) -> bool:
        """The bridge forwards (started, not destroyed); else the channel pushes over CORBA, which refuses."""
        ...

    def batch(self, events: Sequence[Any], ids: Sequence[str] | None = None) -> Any:
        """A new batch of structured events (an :class:`OutboundBatch`); nothing is sent yet. ``ids``: each event's
        dedupe id (``nsjms_dedupe_id``), the same every time the channel offers that event to this bridge."""
        ...

    def start(self, batch: Any) -> None:
        """Map the batch and write BEGIN and its SENDs (not the COMMIT)."""
        ...

    def commit(self, batch: Any) -> None:
        """Write the batch's COMMIT; its receipt is awaited by :meth:`settle`."""
        ...

    def settle(self, batch: Any) -> bool:
        """Await the COMMIT's receipt: True when the broker took the whole batch, False when it refused part of
        it (the bridge sent the rest message by message and dead-lettered what it refused)."""
        ...

    def abort(self, batch: Any) -> None:
        """Abandon a batch whose COMMIT was not written (never raises)."""
        ...


class OutboundParticipant(Protocol):
    """Channel PUSH → JMS in a routing transaction: the bridge as the T2's transactional object (NJI 2.7.4).
    Failures raise :class:`~router.routing.errors.ForwardFailed` after marking the T2 rollback-only."""

    def begin_in_t2(self, txn: Transaction) -> None:
        """Enlist the broker branch now, before the channel's own work on the T2's PostgreSQL branch."""
        ...

    def forward_in_t2(self, txn: Transaction, conn: Any, events: Sequence[Any], *,
                      dead_letter_reason: str | None = None) -> Any:
        """Carry ``events`` in ``txn`` (outbox rows on ``conn``, the broker's SENDs); with ``dead_letter_reason``
        every event goes to the dead-letter destination instead. Returns what :meth:`ended` is given back."""
        ...

    def ended(self, gtrid: str, result: Any, committed: bool, reason: str = "") -> None:
        """The T2 ended (committed, rolled back, or handed to recovery); ``result`` None unless committed."""
        ...


# ------------------------------------------------------------------------------------------ JMS → channel
class InboundBatch(Protocol):
    """What one round took from JMS (``router.bridge.t2in.InBatch``)."""

    events: list[Any]
    bodies: list[bytes | None]
    received: int

    def reject(self, index: int, reason: str) -> None:
        """The channel refuses event ``index`` (BAD_QOS, too large): dead-letter its message in the same round."""
        ...

    def seal(self) -> None:
        """T2 round: every frame of the batch is in; the broker branch writes its last frame now."""
        ...

    def settle(self) -> None:
        """Local round: the channel's transaction committed; write the acks."""
        ...

    def abandon(self) -> None:
        """Local round: the channel's transaction failed; the deliveries are taken again next round."""
        ...


class InboundSource(Protocol):
    """JMS → channel PULL: the bridge's pull sender the channel's pull proxy consumer takes from in-process."""

    def t2_ready(self) -> bool:
        """Whether a round can take anything now (the bridge is started)."""
        ...

    def wait_first(self, timeout: float) -> bool:
        """Whether a round has something to take, waiting up to ``timeout`` s without a database connection."""
        ...

    def take_in_t2(self, txn: Transaction, conn: Any, max_n: int, timeout: float) -> Any:
        """Up to ``max_n`` deliveries inside ``txn`` (inbox rows and the ack branch on ``conn``): an
        :class:`InboundBatch`."""
        ...

    def take_local(self, conn: Any, max_n: int, timeout: float) -> Any:
        """Up to ``max_n`` deliveries in the channel's local transaction on ``conn``: an :class:`InboundBatch`."""
        ...


class InboundRounds(Protocol):
    """JMS → channel PUSH into a Persistent channel of this node: the channel side of the bridge's local rounds
    (the bridge holds the proxy consumer servant; the channel runs the round on it)."""

    #: deliveries a round takes at least (when the proxy has room)
    batch: int

    def room(self, proxy: Any, wanted: int) -> int:
        """How many events ``proxy`` (the channel's proxy consumer servant) has room for, at most ``wanted``."""
        ...

    def round(self, proxy: Any, take: Callable[[Any, int, float], Any], max_n: int, timeout: float, *,
              ready: Callable[[float], bool] | None = None) -> int:
        """One local round into ``proxy``'s channel (``router.channel.t2in.local_round``)."""
        ...
