"""The broker side of one bridge (split from :mod:`router.bridge.bridge`): its connections, its subscription, and
its messages encoded through the node's codec.

* the first connection (:meth:`BrokerLink._transport`), opened on first use so a bridge can start while the broker
  is down (the flows hold a :class:`LazyTransport`);
* the second connection of channel → JMS routing transactions (:meth:`BrokerLink._t2_transport`, ``-t2b``: the
  broker takes T2 *n+1*'s frames while it commits T2 *n* on the first);
* the JMS source's subscription (:meth:`BrokerLink._subscribe`; a topic source of a Persistent channel is durable,
  NJI Table 2-3);
* the channel → JMS mapping with the broker's limits (:meth:`BrokerLink._to_jms`, :meth:`BrokerLink._to_jms_frame`):
  the message is encoded and checked by ``BrokerSettings.codec`` (a :class:`~router.jms.transport.MessageCodec`;
  the node gives the STOMP one, ``router.mapping.stomp_codec``), so the bridge names no wire format.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from idl.generated import CosBridgeAdmin as BA
from router.bridge.endpoints import EndpointSpec, parse_factory
from router.bridge.store import BridgeRow
from router.bridge.txout import OutboundT2
from router.jms.model import Destination, JmsMessage
from router.jms.retry import RetryPolicy
from router.jms.transport import AckMode, ConnectionState, EncodedMessage, MessageCodec, Subscription, Transport
from router.mapping import event_to_jms

__all__ = ["DEFAULT_PREFETCH", "SUBSCRIBER_RECONNECT", "T2_ALT_RETRY_S", "T2_STOP_WAIT_S", "BrokerLink",
           "LazyTransport", "subscriber_heartbeat_ms"]

log = logging.getLogger("nsjms.bridge")

# A JMS source's prefetch (``settings["prefetch"]`` overrides it): three rounds' worth of the inbound loop
# (router.channel.t2in.LOCAL_BATCH, 100), so the broker keeps sending while a round stores and commits; with 100 the
# broker waited for the round's acks and the next round found only what had arrived since (issue 12: bench/paths.py
# from_jms 0.11-0.15 PG transactions per event and ratio 0.17-0.19 to the raw consume, against 0.07-0.12 and 0.30-0.34).
DEFAULT_PREFETCH = 300
#: How long a node stop or a bridge destroy waits for the bridge's routing transactions in progress (a decided
#: one's phase two: COMMIT PREPARED, the broker's COMMIT receipt) before it closes the broker connections.
T2_STOP_WAIT_S = 15.0
#: After the broker refused the bridge's second connection (``-t2b``), how long its T2s use the first one before
#: the second is tried again (and the next failure logged).
T2_ALT_RETRY_S = 30.0
#: Reconnecting a topic source's connection (:meth:`BrokerLink._subscriber_options`): the transport's attempts and
#: total time, waits of at most 1 s (not 5 s): while a paused owner's connection still holds the durable
#: subscription's client id the connect is refused, and the survivor retries until the broker dropped it.
SUBSCRIBER_RECONNECT = RetryPolicy("transport.reconnect.subscriber", max_attempts=60, max_total_s=60.0,
                                   initial_wait_s=0.2, max_wait_s=1.0)


def subscriber_heartbeat_ms(expiry_s: float) -> int:
    """A topic source's STOMP heart-beat (both ways) for a cluster lease of ``expiry_s``: half of it, at most the
    transport's 10 s, at least 1 s. The broker then drops a paused owner's connection within about 1.5 heart-beats,
    so the survivor that took the bridge over after ``expiry_s`` finds the durable subscription's client id free."""
    return int(max(1_000, min(10_000, expiry_s * 500)))


def _now() -> float:
    return time.monotonic()


class BrokerLink:
    """The broker side of one bridge (mixed into ``BridgeImpl``)."""

    id: int
    factory: Any
    row: BridgeRow
    jms_spec: EndpointSpec
    destination: Destination
    flow_in: Any
    stop_event: threading.Event
    broker_state: ConnectionState
    transport: Transport | None
    t2_out: OutboundT2 | None
    _transport_lock: threading.Lock
    _t2_alt: Transport | None
    _t2_alt_opening = False          # a caller is opening the second connection (_t2_transport), outside the lock
    _t2_alt_retry_at = 0.0           # _now() before which a refused second connection is not tried again

    # of the other parts of the bridge (declared, not defined: a definition here would hide theirs in the MRO)
    _on_broker_state: Callable[[ConnectionState], None]       # router.bridge.supervisor.Supervised
    _connection_persistent: Callable[[], bool]                  # router.bridge.channellink.ChannelLink
    _save_settings: Callable[..., None]                         # router.bridge.bridge.BridgeImpl

    # -- mapping -----------------------------------------------------------------------------------------------
    @property
    def codec(self) -> MessageCodec:
        """The node's message codec (``BrokerSettings.codec``): the one encoding of the bridge's messages."""
        codec: MessageCodec = self.factory.broker.codec
        return codec

    def _to_jms(self, event: Any, destination: Destination) -> JmsMessage:
        """Map, and check the message can be encoded for the broker (an encoding failure is a mapping failure)."""
        msg = event_to_jms(event, destination, now_ms=int(time.time() * 1000))
        codec = self.codec
        codec.check(codec.encode(msg))
        return msg

    def _to_jms_frame(self, event: Any, destination: Destination) -> tuple[JmsMessage, EncodedMessage]:
        """:meth:`_to_jms` and the encoding it checked, made once (the codec's ``encode``): the T2 and local batch
        paths send that encoding instead of encoding the message a second time."""
        msg = event_to_jms(event, destination, now_ms=int(time.time() * 1000))
        codec = self.codec
        encoded = codec.encode(msg)
        codec.check(encoded)
        return msg, encoded

    # -- connections -------------------------------------------------------------------------------------------
    def _transport(self) -> Transport:
        with self._transport_lock:
            if self.transport is None:
                b = self.factory.broker
                self.transport = self.factory.open_transport(
                    b.url, username=b.login or None, password=b.passcode or None,
                    client_id=self._client_id(), on_state=self._on_broker_state,
                    shutdown=self.factory.shutdown_event, **self._subscriber_options())
                self.transport.connect(retry=False)
                self.broker_state = ConnectionState.CONNECTED
            return self.transport

    def _subscriber_options(self) -> dict[str, Any]:
        """A topic source's connection (a durable subscription of a Persistent channel holds the client id the
        bridge's next owner needs, :meth:`_client_id`): heart-beats both ways every ``BrokerSettings.sub_heartbeat_ms``
        (the node derives it from its cluster lease: ``expiry_s / 2``, at most 10 s), so that the broker drops a
        paused owner's connection, and with it the client id, about one and a half heart-beats after the pause
        (ActiveMQ's STOMP inactivity monitor: the client's heart-beat times its grace period); and a reconnect
        backoff of at most :data:`SUBSCRIBER_RECONNECT`'s 1 s while the id is refused, so a survivor resumes the
        subscription within a second of the broker dropping it. Other connections keep the transport's defaults."""
        destination = getattr(self, "destination", None)     # (a bridge built part-way, as some tests do: none)
        if destination is None or destination.kind != "topic" or getattr(self, "flow_in", None) is None:
            return {}
        beat = int(getattr(self.factory.broker, "sub_heartbeat_ms", 10_000))
        return {"heartbeats": (beat, beat), "reconnect_policy": SUBSCRIBER_RECONNECT}

    def _client_id(self) -> str:
        """The JMS client id of the bridge's first connection. A durable subscription is the pair (client id,
        subscription name) on the broker, so the client id it was made under is stored with the bridge (beside
        ``durable_name``, :meth:`_subscribe`) and every later connection uses it, on whichever node: a survivor
        that takes the bridge over resumes the dead node's subscription and gets what was published meanwhile
        (named after the survivor, it made a new subscription, and the old one kept those messages forever).
        While another connection still holds that id (a paused owner, until the broker drops it for its missed
        heart-beats) the connect is refused and retried. A bridge without a durable subscription uses a per-node
        id."""
        stored = self.row.settings.get("durable_client_id")
        return str(stored) if stored else f"nsjms-{self.factory.node_id}-bridge-{self.id}"

    def _t2_transport(self) -> Transport:
        """The bridge's second broker connection, for every other channel → JMS T2 (router.bridge.txout: the broker
        then takes T2 *n+1*'s frames while it commits T2 *n* on the first). Opened on first use and again after it
        was lost; while it cannot be opened the T2 goes on the first connection. A failed open is tried again
        only after :data:`T2_ALT_RETRY_S` (each failure logged once, with the reason), by one caller at a time and
        outside ``_transport_lock`` (the first connection's users never wait for it)."""
        with self._transport_lock:
            alt, lost = self._t2_alt, None
            if alt is not None and not alt.is_connected():
                self._t2_alt, lost, alt = None, alt, None
            stop = self.stop_event
            attempt = (alt is None and not stop.is_set() and not self._t2_alt_opening
                       and _now() >= self._t2_alt_retry_at)
            if attempt:
                self._t2_alt_opening = True
        if lost is not None:
            lost.close()
        if attempt:
            alt = self._open_t2_alt(stop)
        return alt if alt is not None else self._transport()

    def _open_t2_alt(self, stop: threading.Event) -> Transport | None:
        """Open the second connection (the caller set ``_t2_alt_opening``); None when it cannot be opened now."""
        b = self.factory.broker
        alt: Transport | None = None
        try:
            alt = self.factory.open_transport(
                b.url, username=b.login or None, password=b.passcode or None,
                client_id=f"nsjms-{self.factory.node_id}-bridge-{self.id}-t2b",
                shutdown=self.factory.shutdown_event)
            alt.connect(retry=False)
        except Exception as exc:  # noqa: BLE001 - any failure (not only TransportError: e.g. no thread for its
            # dispatcher) leaves the optional second connection closed and retried later, never the flag stuck
            with self._transport_lock:
                self._t2_alt_opening = False
                self._t2_alt_retry_at = _now() + T2_ALT_RETRY_S
            log.warning("bridge %d: no second broker connection for routing transactions (%s: %s); they use the "
                        "first one; tried again in %g s", self.id, type(exc).__name__, exc, T2_ALT_RETRY_S)
            if alt is not None:
                with contextlib.suppress(Exception):
                    alt.close()
            return None
        with self._transport_lock:
            self._t2_alt_opening = False
            kept = not stop.is_set()          # the bridge stopped meanwhile (_close_t2_out ran): not kept
            if kept:
                self._t2_alt = alt
        if not kept:
            alt.close()
            return None
        return alt

    def _close_t2_out(self) -> None:
        """Before the broker connections close: the bridge's T2s in progress end first (bounded; what is left is
        recovery's), then the second connection closes."""
        if self.t2_out is not None and not self.t2_out.quiesce(T2_STOP_WAIT_S):
            log.warning("bridge %d: routing transactions still in progress after %g s; closing its broker "
                        "connections anyway (recovery finishes them)", self.id, T2_STOP_WAIT_S)
        with self._transport_lock:
            alt, self._t2_alt = self._t2_alt, None
        if alt is not None:
            alt.close()

    # -- subscription ------------------------------------------------------------------------------------------
    def _subscribe(self) -> Subscription:
        durable = self._durable_name()
        transport = self._transport()
        if durable is not None and (self.row.settings.get("durable_name") != durable
                                    or not self.row.settings.get("durable_client_id")):
            # destroy needs the name even once the channel is gone; a survivor needs the client id (_client_id)
            self._save_settings(durable_name=durable, durable_client_id=self._client_id())
        profile = parse_factory(self.jms_spec.factory_name, check_selector_syntax=False)
        return transport.subscribe(self.destination, selector=profile.selector,
                                           ack=AckMode.CLIENT_INDIVIDUAL, durable_name=durable,
                                           prefetch=int(self.row.settings.get("prefetch", DEFAULT_PREFETCH)),
                                           transformation=profile.transformation)

    def _durable_name(self) -> str | None:
        """NJI Table 2-3: a topic source of a Persistent channel is a durable subscription. Its name is stored in
        the bridge's settings when it subscribes: once the channel is gone, the stored name is the answer (so
        destroy still removes it from the broker)."""
        stored = self.row.settings.get("durable_name")
        try:
            durable = self.destination.kind == "topic" and self.flow_in is not None and self._connection_persistent()
        except BA.InvalidExternalEndPoints:          # the channel is gone: only the stored name tells
            return str(stored) if stored else None
        return f"nsjms-bridge-{self.id}" if durable else None


class LazyTransport:
    """Defers to the bridge's transport, opening it on first use (so a bridge can start while the broker is down)."""

    def __init__(self, bridge: BrokerLink) -> None:
        self._bridge = bridge

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bridge._transport(), name)
