"""What the delivery variants see of a channel proxy: typed protocols instead of ``proxy: Any`` (issue 24).

The module-level steps of the channel's delivery variants take the proxy servant they work for:

* :mod:`router.channel.txdelivery` (channel PUSH → JMS in a routing transaction) and :mod:`router.channel.localpush`
  (channel PUSH → JMS in local batches) drive a push proxy supplier: :class:`PushDelivering`;
* their EnableTransaction checks also read pull and acknowledging proxy suppliers: :class:`SupplierView`;
* :mod:`router.channel.t2in` (JMS → channel PULL, in a T2 or a local unit of work) drives a pull proxy consumer:
  :class:`InboundProxy` (its QoS checks read any proxy consumer: :class:`ProxyView`);
* :mod:`router.channel.ackin` (a CosNotifyCommAck supplier's acknowledgements): :class:`AckingConsumer`;
* :mod:`router.channel.sharing` (subscription and offer changes) reads any proxy: :class:`ProxyView`;
* :mod:`router.channel.admins` (the load-time EnableTransaction rule) reads a proxy of either side:
  :class:`LoadedProxy`; the channel queues an event on a proxy supplier through :class:`QueueTarget`.

Each protocol names exactly what those modules use, by public names; the proxy classes
(``router.channel.proxybase``, ``pushsupplier``, ``delivery``, ``consumers``) provide them. The proxy's channel is
seen through :class:`ProxyChannel`, its node through the channel's :class:`~router.channel.runtime.Runtime`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from router.channel.channel import RoutePlan
    from router.channel.events import Event
    from router.channel.inflight import Flight
    from router.channel.queue import Entry, ProxyQueue, Record
    from router.channel.runtime import Runtime
    from router.channel.txdelivery import T2State
    from router.routing.completer import Completer
    from router.routing.ports import OutboundBatches

__all__ = ["AckingConsumer", "ConsumerView", "HandOffProxy", "InboundProxy", "LoadedProxy", "ProxyAdmin",
           "ProxyChannel", "ProxyView", "PushDelivering", "QueueTarget", "SupplierView"]


class ProxyChannel(Protocol):
    """The proxy's event channel (``router.channel.channel.EventChannelImpl``) as the delivery variants use it."""

    @property
    def id(self) -> int: ...

    @property
    def admin_props(self) -> dict[str, Any]: ...

    @property
    def qos(self) -> dict[str, Any]: ...

    def queued_count(self) -> int:
        """Events queued in the channel (MaxQueueLength's measure)."""
        ...

    def connections_persistent(self) -> bool:
        """ConnectionReliability is Persistent: a JMS → channel pull without T2 stores its events."""
        ...

    def plan_in(self, source: Any, events: Sequence[Event]) -> RoutePlan:
        """Targets of ``events`` from proxy consumer ``source`` (no I/O)."""
        ...

    def store_in(self, conn: Any, plan: RoutePlan) -> None:
        """Store the plan's persistent events in the caller's unit of work (or T2 branch) ``conn``."""
        ...

    def publish(self, plan: RoutePlan) -> None:
        """Queue the plan's events in memory, once what stored them committed."""
        ...


class ProxyAdmin(Protocol):
    """The proxy's admin object."""

    @property
    def id(self) -> int: ...

    @property
    def qos(self) -> dict[str, Any]: ...


class ProxyView(Protocol):
    """Any proxy, as the EnableTransaction checks read it (its QoS, its node, its connected client)."""

    @property
    def oid(self) -> str: ...

    @property
    def id(self) -> int: ...

    @property
    def rt(self) -> Runtime: ...

    @property
    def channel(self) -> ProxyChannel: ...

    @property
    def admin(self) -> ProxyAdmin: ...

    @property
    def qos(self) -> dict[str, Any]: ...

    @property
    def extra(self) -> dict[str, Any]: ...

    @property
    def form(self) -> str:
        """``ANY``, ``STRUCTURED`` or ``SEQUENCE``."""
        ...

    @property
    def style(self) -> str:
        """``PUSH`` or ``PULL``."""
        ...

    @property
    def connected(self) -> bool: ...

    @property
    def client_ior(self) -> str | None:
        """The connected client's stringified IOR (None: no client)."""
        ...

    def client_ref(self) -> Any:
        """The connected client's object reference (None: no client)."""
        ...


class SupplierView(ProxyView, Protocol):
    """A proxy supplier (push or pull, acknowledging or not), as the channel → JMS T2 checks and status read it."""

    #: an acknowledging proxy supplier (DeliveryReliability=Acknowledgment, router.channel.ack): its own delivery
    acknowledging: bool
    #: the T2 bookkeeping (router.channel.txdelivery), made on first use
    t2_state: T2State | None
    #: the phase-two thread of its T2s, made on first use
    t2_completer: Completer | None

    def batch_size(self) -> int:
        """Events per push (a sequence proxy's MaximumBatchSize, else 1)."""
        ...


class PushDelivering(SupplierView, Protocol):
    """A push proxy supplier as its delivery variants drive it (``router.channel.pushsupplier.PushSupplierMixin``):
    its queue, its push in flight, its state and the outcomes of a batch."""

    queue: ProxyQueue
    #: the push in flight (router.channel.inflight), which a teardown waits for; None for a proxy built bare
    push_flight: Flight[Entry] | None
    #: entries still to be delivered one at a time after a batch failed on its content
    isolating: int
    #: why the last delivery failed (``nsjms status``), None while it succeeds
    failing: str | None
    failed_attempts: int
    #: (client IOR, the bridge's outbound batches port found for it) (router.channel.localpush)
    local_batches_cache: tuple[str, OutboundBatches | None] | None

    @property
    def stop_event(self) -> threading.Event: ...

    @property
    def suspended(self) -> bool: ...

    @property
    def destroyed(self) -> bool: ...

    @property
    def closing(self) -> bool: ...

    def ready_count(self, since: float | None) -> tuple[int, float | None]:
        """How many entries to take now, and when the current partial batch started (sequence pacing)."""
        ...

    def batch_limit(self, n: int) -> int:
        """The batch size to take now: 1 while isolating."""
        ...

    def delivered_one_batch(self) -> None: ...

    def delivered_entries(self, entries: list[Entry], *, defer_flush: bool = False) -> bool:
        """The consumer took ``entries``: journal them (their rows are deleted with later deliveries')."""
        ...

    def flush_delivered(self, *, closing: bool = False) -> None:
        """Delete the delivered entries' rows now."""
        ...

    def content_failed(self, entries: list[Entry], exc: BaseException) -> None:
        """The batch failed because of what it holds: isolate it, or count a poison attempt of its only entry."""
        ...

    def dead_letter_entry(self, entry: Entry, reason: str, *, readable: str | None = None) -> None:
        """Move ``entry`` to the channel's dead-letter store."""
        ...


class InboundProxy(ProxyView, Protocol):
    """A pull proxy consumer as JMS → channel rounds drive it (``router.channel.consumers.PullConsumerMixin``)."""

    def room(self, wanted: int) -> int:
        """How many events a round may take now (MaxQueueLength), at most ``wanted``."""
        ...


class AckingConsumer(ProxyView, Protocol):
    """A proxy consumer as its inbound acknowledgement reads it (``router.channel.ackin.InboundAck``)."""

    @property
    def kind(self) -> str:
        """``PUSH_STRUCTURED``, ``PULL_SEQUENCE``, ...: which Ack supplier interface its client may have."""
        ...

    def save_extra(self, **items: Any) -> None:
        """Merge ``items`` into the proxy's stored ``extra`` (the SequenceNumbers seen)."""
        ...


class LoadedProxy(ProxyView, Protocol):
    """A proxy of either side as the admin checks it when it is loaded (``router.channel.admins``)."""

    @property
    def side(self) -> str:
        """``C``: a proxy supplier (it delivers to a consumer: a :class:`SupplierView`); ``S``: a proxy consumer."""
        ...


class ConsumerView(ProxyView, Protocol):
    """A proxy consumer as the channel routes what it was given (``EventChannelImpl.route`` / ``plan_in``)."""

    def admits(self, event: Event) -> bool:
        """This proxy's filters, combined with its admin's, pass ``event`` (NS 2.3)."""
        ...


class QueueTarget(Protocol):
    """A proxy supplier as the channel queues an event on it (``EventChannelImpl._enqueue_one``) and names it in
    the event's stored queue rows."""

    @property
    def oid(self) -> str: ...

    @property
    def id(self) -> int: ...

    @property
    def admin(self) -> ProxyAdmin: ...

    def enqueue(self, record: Record) -> None:
        """Queue ``record`` (and store its queue row when persistent)."""
        ...


class HandOffProxy(Protocol):
    """Any proxy as the hand-off of its channel to another node stops it (``router.cluster.release``: that package
    sits below the channel's and takes the proxies structurally; ``router.channel.proxybase.ProxyBase`` provides
    this, checked there)."""

    @property
    def oid(self) -> str: ...

    def stop_for_handoff(self) -> None:
        """Stop after the push, pull or routing transaction in flight; connection changes are refused ``TRANSIENT``
        from now on; the stored rows stay for the next owner."""
        ...

    def drain_inbound(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) for the phase two of its inbound routing transactions; True: none runs."""
        ...

    def delete_delivered_rows(self) -> bool:
        """One attempt to delete the rows of events it delivered whose delete failed; True: none is left."""
        ...
