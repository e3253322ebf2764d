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

The events that cross are CosNotification structured events: omniORB's classes have no types, so they are
:data:`CorbaEvent` (``Any``, named). The rest is typed: a T2's (or local unit of work's) PostgreSQL connection is
:data:`Conn`, a batch is the port's own batch type, what a T2 carried is :class:`Forwarded`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

if TYPE_CHECKING:
    import psycopg

    from router.jms.transport import PendingConfirmation
    from xa.coordinator import Transaction

__all__ = ["Conn", "CorbaEvent", "Forwarded", "InboundBatch", "InboundRounds", "InboundSource", "OutboundBatch",
           "OutboundBatches", "OutboundParticipant", "RoundTarget", "TakeLocal"]

#: A CosNotification structured event (omniORB's generated class: untyped, hence ``Any``).
CorbaEvent: TypeAlias = Any
#: The PostgreSQL connection of a T2's branch or of a local unit of work (psycopg's row type is not narrowed).
Conn: TypeAlias = "psycopg.Connection[Any]"


@dataclass(frozen=True)
class Forwarded:
    """What one channel → JMS T2 carried: messages for the destination, dead letters, and the gtrid."""

    gtrid: str
    sent: int
    dead_lettered: int


# ------------------------------------------------------------------------------------------ channel → JMS
class OutboundBatch(Protocol):
    """One batch of :class:`OutboundBatches` in flight."""

    #: the broker transaction's COMMIT, written and not yet confirmed; None before :meth:`commit`
    pending: PendingConfirmation | None
    #: indexes of the batch's events the bridge handled already (dead-lettered, or confirmed one by one)
    handled: set[int]


class OutboundBatches(Protocol):
    """Channel PUSH → JMS without a T2: the channel's dispatcher hands whole batches to the bridge, pipelined
    (``router.channel.localpush``). Every method raises :class:`~router.routing.errors.ForwardDeferred` when the
    events could not be forwarded now; they then stay in the channel."""

    def running(self) -> bool:
        """The bridge forwards (started, not destroyed); else the channel pushes over CORBA, which refuses."""
        ...

    def batch(self, events: Sequence[CorbaEvent], ids: Sequence[str] | None = None) -> OutboundBatch:
        """A new batch of structured events (an :class:`OutboundBatch`); nothing is sent yet. ``ids``: each event's
        dedupe id (``nsjms_dedupe_id``), the same every time the channel offers that event to this bridge."""
        ...

    def start(self, batch: OutboundBatch) -> None:
        """Map the batch and write BEGIN and its SENDs (not the COMMIT)."""
        ...

    def commit(self, batch: OutboundBatch) -> None:
        """Write the batch's COMMIT; its receipt is awaited by :meth:`settle`."""
        ...

    def settle(self, batch: OutboundBatch) -> bool:
        """Await the COMMIT's receipt: True when the broker took the whole batch, False when it refused part of
        it (the bridge sent the rest message by message and dead-lettered what it refused)."""
        ...

    def abort(self, batch: OutboundBatch) -> None:
        """Abandon a batch whose COMMIT was not written (never raises)."""
        ...


class OutboundParticipant(Protocol):
    """Channel PUSH → JMS in a routing transaction: the bridge as the T2's transactional object (NJI 2.7.4).
    Failures raise :class:`~router.routing.errors.ForwardFailed` after marking the T2 rollback-only."""

    def begin_in_t2(self, txn: Transaction) -> None:
        """Enlist the broker branch now, before the channel's own work on the T2's PostgreSQL branch."""
        ...

    def forward_in_t2(self, txn: Transaction, conn: Conn, events: Sequence[CorbaEvent], *,
                      dead_letter_reason: str | None = None) -> Forwarded:
        """Carry ``events`` in ``txn`` (outbox rows on ``conn``, the broker's SENDs); with ``dead_letter_reason``
        every event goes to the dead-letter destination instead. Returns what :meth:`ended` is given back."""
        ...

    def ended(self, gtrid: str, result: Forwarded | None, committed: bool, reason: str = "") -> None:
        """The T2 ended (committed, rolled back, or handed to recovery); ``result`` None unless committed."""
        ...


# ------------------------------------------------------------------------------------------ JMS → channel
class InboundBatch(Protocol):
    """What one round took from JMS (``router.bridge.t2in.InBatch``)."""

    events: list[CorbaEvent]
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

    def take_in_t2(self, txn: Transaction, conn: Conn, max_n: int, timeout: float) -> InboundBatch:
        """Up to ``max_n`` deliveries inside ``txn`` (inbox rows and the ack branch on ``conn``): an
        :class:`InboundBatch`."""
        ...

    def take_local(self, conn: Conn, max_n: int, timeout: float) -> InboundBatch:
        """Up to ``max_n`` deliveries in the channel's local transaction on ``conn``: an :class:`InboundBatch`."""
        ...


class RoundTarget(Protocol):
    """The channel's proxy consumer servant a bridge's local rounds go into, as the bridge sees it (the channel reads
    it as its own ``router.channel.proxyport.InboundProxy``)."""

    @property
    def oid(self) -> str: ...

    @property
    def connected(self) -> bool: ...

    @property
    def destroyed(self) -> bool: ...


#: What a local round takes from the bridge (``InboundSource.take_local``).
TakeLocal = Callable[[Conn, int, float], InboundBatch]


class InboundRounds(Protocol):
    """JMS → channel PUSH into a Persistent channel of this node: the channel side of the bridge's local rounds
    (the bridge holds the proxy consumer servant; the channel runs the round on it)."""

    #: deliveries a round takes at least (when the proxy has room)
    batch: int

    def room(self, proxy: RoundTarget, wanted: int) -> int:
        """How many events ``proxy`` (the channel's proxy consumer servant) has room for, at most ``wanted``."""
        ...

    def round(self, proxy: RoundTarget, take: TakeLocal, max_n: int, timeout: float, *,
              ready: Callable[[float], bool] | None = None) -> int:
        """One local round into ``proxy``'s channel (``router.channel.t2in.local_round``)."""
        ...
