"""The CORBA adapters of the bridge core: the servants a bridge connects to its channel's proxies, and the ports
(``router.bridge.ports``) over the proxy references the bridge uses (NJI 2.3, 2.4, 2.6).

The bridge is a *standard client of the channel* (NJI 2.3): its endpoint receiver/sender are CORBA servants of the
CosNotifyComm interfaces, connected to proxies it obtained from the channel, so every channel guarantee (persistent
queues, retries, ordering) applies to it unchanged. The servants only translate: a CORBA call becomes a call of the
core (``router.bridge.core``, ``router.bridge.jmsin``), and a CORBA exception of the channel becomes the core's
:class:`~router.bridge.ports.ChannelError` in one place, :func:`channel_call`. The behaviour (what is forwarded,
dead-lettered, retried) is described and decided in the core.

The core's names are re-exported here (``flows.ChannelToJms``, ``flows.DEFAULT_DLQ``, ...) for the callers that
import them from this module.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from omniORB import CORBA

import CosEventComm
import CosNotification
import CosNotifyComm__POA

from router.bridge import jmsin
from router.bridge.core import (
    BROKER_DLQ,
    DEFAULT_DLQ,
    MAX_EVENT_BYTES,
    ChannelPuller,
    ChannelToJms,
    DeadLetter,
    JmsToChannel,
    describe,
    untransportable,
)
from router.bridge.jmsin import PullSupply
from router.bridge.ports import (
    ChannelError,
    ChannelFull,
    ChannelGone,
    ChannelUnavailable,
    EventRefused,
    ForwardDeferred,
    LocalChannel,
)
from router.routing.faults import MINOR_EVENT_TOO_LARGE
from router.routing.ports import InboundRounds

__all__ = ["BROKER_DLQ", "DEFAULT_DLQ", "MAX_EVENT_BYTES", "ChannelToJms", "DeadLetter", "JmsToChannel",
           "ProxyBatchSource", "ProxyChannelSink", "PushSenderLoop", "channel_call", "channel_error",
           "untransportable"]

log = logging.getLogger("nsjms.bridge")

#: The reasons a dead letter gives for an event the channel refused (EventRefused).
REFUSED_QOS = "the channel rejected the event's QoS (BAD_QOS)"
REFUSED_TOO_LARGE = ("the channel refused the event as too large (IMP_LIMIT, MINOR_EVENT_TOO_LARGE): its size "
                     "limit is below this node's node.max_event_bytes")


# ----------------------------------------------------------------------------------------------------------
# The one boundary: CORBA exceptions of the channel side -> the core's ChannelError
# ----------------------------------------------------------------------------------------------------------
def channel_error(exc: BaseException) -> ChannelError | None:
    """The core's :class:`ChannelError` for a CORBA exception a channel proxy raised (pure); None for anything
    else (it is not the channel's answer: it propagates unchanged)."""
    if isinstance(exc, (CosEventComm.Disconnected, CORBA.OBJECT_NOT_EXIST)):
        return ChannelGone(describe(exc))
    if isinstance(exc, CORBA.BAD_QOS):
        return EventRefused(REFUSED_QOS)
    if isinstance(exc, CORBA.IMP_LIMIT):
        return EventRefused(REFUSED_TOO_LARGE) if exc.minor == MINOR_EVENT_TOO_LARGE else ChannelFull(describe(exc))
    if isinstance(exc, CORBA.Exception):      # TRANSIENT, a database failure surfacing as UNKNOWN, a user exception
        return ChannelUnavailable(describe(exc))
    return None


def channel_call(operation: Callable[..., Any], *args: Any) -> Any:
    """``operation(*args)`` on the channel side, its CORBA exceptions translated by :func:`channel_error`."""
    try:
        return operation(*args)
    except (CORBA.Exception, CosEventComm.Disconnected) as exc:
        error = channel_error(exc)
        if error is None:            # pragma: no cover - channel_error maps every CORBA exception
            raise
        raise error from exc


# ----------------------------------------------------------------------------------------------------------
# Ports over proxy references
# ----------------------------------------------------------------------------------------------------------
class ProxyBatchSource:
    """:class:`~router.bridge.ports.BatchSource` over a structured or sequence pull proxy supplier."""

    def __init__(self, proxy: Any, sequence: bool) -> None:
        self.proxy = proxy
        self.sequence = sequence

    def pull(self) -> list[Any]:
        if self.sequence:
            events, has = channel_call(self.proxy.try_pull_structured_events, 1000)
            return list(events) if has else []
        event, has = channel_call(self.proxy.try_pull_structured_event)
        return [event] if has else []


class _LocalProxy:
    """:class:`~router.bridge.ports.LocalChannel` over the channel's proxy consumer servant (same process), run
    by the channel's :class:`~router.routing.ports.InboundRounds` (the node's ``LocalEndpoints.inbound_rounds``)."""

    def __init__(self, servant: Any, rounds: InboundRounds) -> None:
        self.servant = servant
        self.rounds = rounds

    def round(self, take: Callable[[Any, int, float], Any], max_n: int, timeout: float, *,
              ready: Callable[[float], bool] | None = None) -> None:
        servant, rounds = self.servant, self.rounds
        if servant.destroyed:            # the proxy's own checks first
            raise ChannelGone("the proxy was destroyed")
        if not servant.connected:
            raise ChannelGone("the proxy is disconnected")
        n = rounds.room(servant, max(max_n, rounds.batch))
        channel_call(lambda: rounds.round(servant, take, n, timeout, ready=ready))


class ProxyChannelSink:
    """:class:`~router.bridge.ports.ChannelSink` over a structured or sequence push proxy consumer; ``local`` (the
    bridge's ``local_push_proxy``) gives the proxy servant when the channel routes in-process with the inbox."""

    def __init__(self, proxy: Any, sequence: bool, local: Callable[[], Any] | None = None,
                 rounds: Callable[[], InboundRounds | None] | None = None) -> None:
        self.proxy = proxy
        self.sequence = sequence
        self._local = local
        self._rounds = rounds

    def push(self, events: Sequence[Any]) -> None:
        if self.sequence:                # a sequence proxy has no push_structured_event: a single is a batch of one
            channel_call(self.proxy.push_structured_events, list(events))
            return
        for event in events:
            channel_call(self.proxy.push_structured_event, event)

    def local(self) -> LocalChannel | None:
        if self._local is None or self._rounds is None:
            return None
        servant = channel_call(self._local)
        if servant is None:
            return None
        rounds = self._rounds()          # the channel's side of the round; None: it offers none (push over CORBA)
        return _LocalProxy(servant, rounds) if rounds is not None else None


class PushSenderLoop(jmsin.PushSenderLoop):
    """:class:`router.bridge.jmsin.PushSenderLoop` pushing into ``proxy`` (a push proxy consumer reference)."""

    def __init__(self, flow: JmsToChannel, proxy: Any, sequence: bool, batch: Callable[[], int],
                 pacing_s: Callable[[], float], paced_receive: bool, stop: threading.Event) -> None:
        local = getattr(flow.bridge, "local_push_proxy", None)

        def rounds() -> InboundRounds | None:       # read when a round starts
            return flow.bridge.rt.endpoints.inbound_rounds

        super().__init__(flow, ProxyChannelSink(proxy, sequence, local, rounds), sequence, batch, pacing_s,
                         paced_receive, stop)


# ----------------------------------------------------------------------------------------------------------
# Channel -> JMS servants (endpoint receivers)
# ----------------------------------------------------------------------------------------------------------
class _PushReceiverMixin:
    """Endpoint receiver: the channel pushes to the bridge (:meth:`ChannelToJms.deliver`)."""

    def __init__(self, flow: ChannelToJms) -> None:
        self.flow = flow

    def offer_change(self, added: Any, removed: Any) -> None:
        return None

    def _forward(self, events: list[Any]) -> None:
        try:
            self.flow.deliver(events)
        except ForwardDeferred:
            raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO) from None


class StructuredPushReceiver(_PushReceiverMixin, CosNotifyComm__POA.StructuredPushConsumer):
    def push_structured_event(self, notification: Any) -> None:
        self._forward([notification])

    def disconnect_structured_push_consumer(self) -> None:
        self.flow.bridge.channel_disconnected()


class SequencePushReceiver(_PushReceiverMixin, CosNotifyComm__POA.SequencePushConsumer):
    def push_structured_events(self, notifications: list[Any]) -> None:
        self._forward(list(notifications))

    def disconnect_sequence_push_consumer(self) -> None:
        self.flow.bridge.channel_disconnected()



class _PullReceiverBase:
    """Endpoint receiver pulling from the channel: a :class:`ChannelPuller` over the bridge's pull proxy. The
    puller (with the batch it could not send yet) lives as long as this servant, across stop/start."""

    def __init__(self, flow: ChannelToJms, proxy: Any, pacing_s: Callable[[], float], stop: threading.Event) -> None:
        self.flow = flow
        self.puller = ChannelPuller(flow, None, pacing_s, stop)
        if proxy is not None:
            self.attach(proxy, stop)

    def attach(self, proxy: Any, stop: threading.Event) -> None:
        """Before a start: the proxy reference to pull from and the worker's stop event."""
        self.puller.source = ProxyBatchSource(proxy, isinstance(self, SequencePullReceiver))
        self.puller.stop = stop

    @property
    def pending(self) -> list[Any]:
        return self.puller.pending

    def run(self) -> None:
        self.puller.run()


class StructuredPullReceiver(_PullReceiverBase, CosNotifyComm__POA.StructuredPullConsumer):
    def disconnect_structured_pull_consumer(self) -> None:
        self.flow.bridge.channel_disconnected()

    def offer_change(self, added: Any, removed: Any) -> None:
        return None


class SequencePullReceiver(_PullReceiverBase, CosNotifyComm__POA.SequencePullConsumer):
    def disconnect_sequence_pull_consumer(self) -> None:
        self.flow.bridge.channel_disconnected()

    def offer_change(self, added: Any, removed: Any) -> None:
        return None


# ----------------------------------------------------------------------------------------------------------
# JMS -> channel servants (endpoint senders)
# ----------------------------------------------------------------------------------------------------------
class _PullSenderBase(PullSupply):
    """The channel's pull proxy consumer pulls from this servant (:class:`router.bridge.jmsin.PullSupply`)."""

    def _take(self, n: int, timeout: float) -> list[Any]:
        return self.take(n, timeout)

    def subscription_change(self, added: Any, removed: Any) -> None:
        return None


class StructuredPullSender(_PullSenderBase, CosNotifyComm__POA.StructuredPullSupplier):
    def pull_structured_event(self) -> Any:
        while True:
            events = self._take(1, 1.0)
            if events:
                return events[0]

    def try_pull_structured_event(self) -> tuple[Any, bool]:
        events = self._take(1, 0.0)
        if events:
            return events[0], True
        return _empty_event(), False

    def disconnect_structured_pull_supplier(self) -> None:
        self.flow.bridge.channel_disconnected()


class SequencePullSender(_PullSenderBase, CosNotifyComm__POA.SequencePullSupplier):
    def pull_structured_events(self, max_number: int) -> list[Any]:
        while True:
            events = self._take(max(1, max_number), 1.0)
            if events:
                return events

    def try_pull_structured_events(self, max_number: int) -> tuple[list[Any], bool]:
        events = self._take(max(1, max_number), 0.0)
        return events, bool(events)

    def disconnect_sequence_pull_supplier(self) -> None:
        self.flow.bridge.channel_disconnected()


class _SenderMixin:
    """What the bridge connects to its proxy consumer (so the channel can tell it about disconnection)."""

    def __init__(self, on_disconnect: Callable[[], None]) -> None:
        self._on_disconnect = on_disconnect

    def subscription_change(self, added: Any, removed: Any) -> None:
        return None


class PushSenderServant(_SenderMixin, CosNotifyComm__POA.StructuredPushSupplier):
    def disconnect_structured_push_supplier(self) -> None:
        self._on_disconnect()


class SequencePushSenderServant(_SenderMixin, CosNotifyComm__POA.SequencePushSupplier):
    def disconnect_sequence_push_supplier(self) -> None:
        self._on_disconnect()



def _empty_event() -> Any:
    header = CosNotification.EventHeader(CosNotification.FixedEventHeader(CosNotification.EventType("", ""), ""), [])
    return CosNotification.StructuredEvent(header, [], CORBA.Any(CORBA.TC_null, None))
