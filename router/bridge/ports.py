"""The ports of the bridge core (router.bridge.core, router.bridge.jmsin): what the data paths need from the world.

The core moves events between a channel and a JMS destination and decides what happens to each one (forwarded,
dead-lettered with a reason, retried, held for the next start). It does so only through the small interfaces
below, so it runs the same against the CORBA adapters of ``router.bridge.flows`` (the node) and against the
in-memory twins of the unit tests (tests/unit/test_bridge_core*.py). Nothing here imports the ORB.

=====================  ====================================================  =======================================
port                   what it is                                            adapter in the node
=====================  ====================================================  =======================================
:class:`BridgeHost`    the bridge: started?, broker problems, channel gone,  ``bridge.BridgeImpl``
                       acknowledgements to an Ack proxy
:class:`BatchSource`   channel → JMS, pull style: the next events            ``flows.ProxyBatchSource`` (pull proxy)
:class:`ChannelSink`   JMS → channel, push style: hand events over           ``flows.ProxyChannelSink`` (push proxy)
:class:`LocalChannel`  JMS → channel, a Persistent channel in process        the proxy servant + ``local_round``
``Transport``          the broker connection (``router.jms.transport``)      ``router.jms.stomp`` (STOMP)
:class:`Inbox`         JMS → channel: received message ids, unique           ``t2in.PgInbox`` (``nsjms_inbox``)
:class:`Outbox`        channel → JMS in T2: one row per message sent, the    ``txout.PgOutbox`` (``nsjms_outbox``)
                       frame as sent (recovery re-sends it)
=====================  ====================================================  =======================================

Failures of the channel side reach the core as the :class:`ChannelError` tree below; an adapter translates its
foreign exceptions (CORBA system and user exceptions) into it in one place, and nothing else crosses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from router.jms.transport import Transport
from router.routing.errors import ForwardDeferred
from router.routing.registry import NodeRuntime

__all__ = ["BatchSource", "BridgeHost", "ChannelError", "ChannelFull", "ChannelGone", "ChannelSink",
           "ChannelUnavailable", "EventRefused", "ForwardDeferred", "Inbox", "LocalChannel", "Outbox", "Transport"]


# ----------------------------------------------------------------------------------------------------------
# The channel side's failures, as the core sees them
# ----------------------------------------------------------------------------------------------------------
class ChannelError(Exception):
    """A call to the channel failed; the subclass says what the core may conclude."""


class ChannelGone(ChannelError):
    """The proxy no longer exists or disconnected the bridge (``OBJECT_NOT_EXIST``, ``Disconnected``): stop."""


class ChannelFull(ChannelError):
    """The channel has no room now (``IMP_LIMIT``): wait and offer the same events again."""


class ChannelUnavailable(ChannelError):
    """Any other failure of the call (``TRANSIENT``, a database failure surfacing as ``UNKNOWN``, ...): retry."""


class EventRefused(ChannelError):
    """The channel refuses an event as it is and would refuse it again (``BAD_QOS``; ``IMP_LIMIT`` with
    ``MINOR_EVENT_TOO_LARGE``); ``reason`` is what the dead letter says."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ----------------------------------------------------------------------------------------------------------
# Ports
# ----------------------------------------------------------------------------------------------------------
class BridgeHost(Protocol):
    """What the data paths ask of their bridge."""

    id: int
    rt: NodeRuntime                              # the node runtime (``rt.t2``: the T2 coordinator, or None)

    def running(self) -> bool:
        """Started and not destroyed: a stopped bridge forwards nothing."""
        ...

    def note_broker_problem(self, exc: Exception) -> None:
        """A broker call failed: record it and wake the supervisor (never blocks)."""
        ...

    def channel_disconnected(self) -> None:
        """The channel disconnected the bridge's proxy (or it no longer exists)."""
        ...

    def acknowledge_channel(self, events: list[Any]) -> None:
        """NJI 2.6.2: acknowledge forwarded events to an Ack proxy (no-op otherwise); never raises."""
        ...

    def reconnect_source(self) -> None:
        """JMS → channel: the subscription failed; re-subscribe when the broker is back."""
        ...


class BatchSource(Protocol):
    """Channel → JMS, pull style: the channel's proxy supplier the bridge pulls from."""

    def pull(self) -> list[Any]:
        """The next events (possibly none; never blocks long). Raises :class:`ChannelGone` or another
        :class:`ChannelError`."""
        ...


class LocalChannel(Protocol):
    """JMS → channel into a Persistent channel of this process: one local unit of work per round."""

    def round(self, take: Callable[[Any, int, float], Any], max_n: int, timeout: float, *,
              ready: Callable[[float], bool] | None = None) -> None:
        """Run one round: ``ready(timeout)`` first, without a database connection (nothing to take: the round
        ends); then the channel takes events from ``take(conn, n, 0)`` in its own PostgreSQL transaction (``n``:
        at least ``max_n``, at most what it has room for). Without ``ready``, ``take`` waits up to ``timeout``.
        Raises :class:`ChannelGone`, :class:`ChannelFull` or :class:`EventRefused`."""
        ...


class ChannelSink(Protocol):
    """JMS → channel, push style: the channel's proxy consumer the bridge pushes into."""

    def push(self, events: Sequence[Any]) -> None:
        """Hand ``events`` over (one event, or a batch for a sequence proxy). Returns once the channel took them.
        Raises :class:`ChannelGone`, :class:`ChannelFull`, :class:`EventRefused` or :class:`ChannelUnavailable`."""
        ...

    def local(self) -> LocalChannel | None:
        """The channel in this process when it routes JMS → channel with the inbox (Persistent), else None.
        Raises :class:`ChannelGone`."""
        ...


class Inbox(Protocol):
    """JMS → channel: the ids of messages turned into events, unique per bridge (a redelivery is recognised)."""

    def claim(self, conn: Any, bridge_id: int, message_ids: Sequence[str], gtrid: str,
              sent_ms: Mapping[str, int | str] | None = None) -> set[str]:
        """Record ``message_ids`` in the unit of work ``conn`` (for transaction ``gtrid``); returns the ids that
        were NEW (the others are redeliveries of messages an earlier transaction turned into events).
        ``sent_ms``: each message's JMSTimestamp (the same on a redelivery; the PostgreSQL inbox's partition)."""
        ...

    def release(self, conn: Any, bridge_id: int, message_ids: Sequence[str]) -> None:
        """Forget ``message_ids`` (their events were dead-lettered instead) in the unit of work ``conn``."""
        ...


class Outbox(Protocol):
    """Channel → JMS in T2: the messages a transaction sends, kept until it ended so recovery can re-send them."""

    def insert(self, conn: Any, rows: Sequence[Any]) -> None:
        """Record ``rows`` (``router.routing.t2.transactions.OutboxRow``: the encoding exactly as sent, its codec and
        dedupe id) in the unit of work ``conn``, the T2's PostgreSQL branch. Must not commit; may be pipelined with the
        sends (its error surfaces when the caller's pipeline ends, before PREPARE)."""
        ...
