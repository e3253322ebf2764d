"""CosBridgeAdmin BridgeFactory and Bridge servants (NJI 2.2, 2.3, 3.1), plus the project's ManagedBridge.

A bridge joins one event channel of this node and one JMS destination, in one direction. Creating it validates the
endpoints (NJI Table 2-1) and obtains the proxy it needs on a new admin of the channel; ``start_bridge`` connects
(or resumes) both sides; ``stop_bridge`` suspends them; ``destroy`` disconnects and releases both. Bridges and
their state are stored in PostgreSQL and come back in their last state after a restart: the receiver/sender
servants live in the persistent POA under stable ids (``br/<id>/recv``, ``br/<id>/send``), so the channel's stored
reference to them stays valid.

Bridge state: ``get_status`` reports the administrative state, ``started`` from ``start_bridge`` until
``stop_bridge`` (so it never contradicts ``BridgeAlreadyStarted`` / ``BridgeInactive``). Whether a started bridge
is Active (NJI 2.3: the AND of the proxy connection and the JMS connection) is in ``status()``: ``active``,
``broker`` (connected / disconnected) and ``channel_connected``, with ``last_error`` saying why.

Threads: the transport's connection-state callback runs on the transport's dispatcher thread and only records the
state and wakes the bridge's *supervisor* thread (CONVENTIONS item 8); the supervisor reconnects the broker with no
limit on the outage's length (each attempt is bounded by the transport's reconnect policy, the next one follows),
re-subscribes, and resumes the bridge's proxy if the channel stopped or suspended it meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from omniORB import CORBA

import CosNotification
import CosNotifyChannelAdmin

from idl.generated import CosBridgeAdmin as BA
from idl.generated import CosBridgeAdmin__POA, NsjmsAdmin, NsjmsAdmin__POA
from router.bridge import flows as F
from router.bridge.batchout import LocalBatches
from router.bridge.brokerlink import BrokerLink, LazyTransport
from router.bridge.channellink import ChannelLink
from router.bridge.channellink import invalid as _invalid
from router.bridge.channellink import persistent as _persistent
from router.bridge.endpoints import EndpointSpec, check_pair, from_idl, to_idl
from router.bridge.store import BridgeRow, BridgeStore
from router.bridge.supervisor import Supervised
from router.bridge.txmgmt import TransactionMgmtMixin
from router.bridge.txout import OutboundT2
from router.cluster.forward import cluster_ids
from router.jms.codec import SimpleCodec
from router.jms.model import Destination
from router.jms.transport import ConnectionState, MessageCodec, Transport, TransportError
from router.mapping import ChannelTimeSupport, map_message
from router.quotas import check_bridges
from router.routing.faults import store_boundary
from router.routing.ledger import Direction, Route
from router.routing.registry import LocalEndpoint

__all__ = ["BRIDGE_FACTORY_KEY", "BridgeFactoryImpl", "BridgeImpl", "BrokerSettings"]

log = logging.getLogger("nsjms.bridge")

BRIDGE_FACTORY_KEY = "BridgeFactory"
_TIMET = 10_000_000


@dataclass(frozen=True)
class BrokerSettings:
    url: str
    login: str = ""
    passcode: str = field(default="", repr=False)
    dead_letter: Destination = F.DEFAULT_DLQ
    max_event_bytes: int = F.MAX_EVENT_BYTES      # node.max_event_bytes: larger JMS → channel events (and bodies)
                                                  # are dead-lettered (flows.py)
    amq_dupl_id: bool = False                     # T2 sends carry the dedupe id as _AMQ_DUPL_ID too (Artemis drops
                                                  # duplicates by it; ActiveMQ Classic ignores it: off)
    #: the one encoding of the bridges' messages (checked against the broker's limits while mapping, written to the
    #: outbox, given to the bridges' transports): the node gives router.mapping.stomp_codec.StompCodec
    codec: MessageCodec = field(default_factory=SimpleCodec)
    #: heart-beats of a topic source's connection, both ways (the node: its cluster lease's expiry_s / 2, at most
    #: 10 s; router.bridge.brokerlink, docs/cluster.md)
    sub_heartbeat_ms: int = 10_000


class BridgeFactoryImpl(CosBridgeAdmin__POA.BridgeFactory):
    """The node's BridgeFactory (object key ``BridgeFactory``)."""

    def __init__(self, channel_factory: Any, store: BridgeStore, broker: BrokerSettings,
                 open_transport: Callable[..., Transport], node_id: str = "node1") -> None:
        self.node_id = node_id
        self.channels = channel_factory
        self.rt = channel_factory.rt
        self.store = store
        self.broker = broker
        self.open_transport = open_transport
        self._lock = threading.RLock()
        self.bridges: dict[int, BridgeImpl] = {}
        self.ref: Any = None
        self.shutdown_event = threading.Event()     # node shutdown: interrupts broker reconnects

    def activate(self) -> Any:
        self.rt.ins_poa.activate_object_with_id(BRIDGE_FACTORY_KEY.encode(), self)
        self.ref = self.rt.ins_poa.id_to_reference(BRIDGE_FACTORY_KEY.encode())
        return self.ref

    def restore(self, only: Collection[int] | None = None) -> list[int]:
        """Re-create stored bridges (``only``: those ids, the bridges this node owns in a cluster); their servants
        must be active before the channel's dispatchers run. Returns the ids re-created (those not already here)."""
        with self.rt.db.unit_of_work() as conn:
            rows = self.store.load(conn)
        made = []
        for row in rows:
            if (only is not None and row.id not in only) or row.id in self.bridges:
                continue
            bridge = BridgeImpl(self, row)
            self.bridges[row.id] = bridge
            made.append(row.id)
        log.info("restored %d bridge(s)", len(made))
        return made

    def resume(self, only: Collection[int] | None = None) -> None:
        """After the POAs are active: restart the bridges that were started (``only``: of those ids)."""
        for bridge in list(self.bridges.values()):
            if bridge.row.state == "started" and (only is None or bridge.id in only):
                bridge.resume_after_restart()

    def shutdown(self) -> None:
        self.shutdown_event.set()
        for bridge in list(self.bridges.values()):
            bridge.halt()

    def _channel_exists(self, cid: int) -> bool:
        return cid in self.channels.channels

    def _channel_persistent(self, cid: int) -> bool:
        channel = self.channels.channels.get(cid)
        return channel is not None and _persistent(channel)

    # -- IDL ----------------------------------------------------------------------------------------------
    def create_bridge(self, source: Any, sink: Any) -> tuple[Any, int]:
        src, snk = from_idl(source), from_idl(sink)
        problems = check_pair(src, snk, self._channel_exists, self._channel_persistent)
        if problems:
            raise _invalid(problems)
        channel_spec = snk if src.is_jms else src
        with self._lock:
            check_bridges(self.rt.limits, len(self.bridges))
            with self.rt.db.unit_of_work() as conn:
                bid = self.store.next_id(conn)
                row = BridgeRow(bid, src.to_json(), snk.to_json(), "created", int(channel_spec.channel_id or 0),
                                None, None, {})
                self.store.insert(conn, row)
                if self.rt.owner is not None:       # a cluster member owns what it creates (docs/cluster.md)
                    self.rt.owner.assign(conn, "bridge", bid)
            bridge = BridgeImpl(self, row)
            self.bridges[bid] = bridge
        try:
            bridge.attach_channel()
        except CosNotifyChannelAdmin.AdminLimitExceeded as exc:  # the channel's or the node's proxy limit
            bridge.destroy()
            log.warning("bridge not created: its channel proxy is refused (%s)", exc.admin_property_err.name)
            raise CORBA.IMP_LIMIT(0, CORBA.COMPLETED_NO) from None
        except Exception:
            bridge.destroy()
            raise
        log.info("bridge %d created: %s -> %s", bid, src.describe(), snk.describe())
        return bridge.ref, bid

    def get_bridge_with_id(self, id: int) -> Any:  # noqa: A002
        bridge = self.bridges.get(id)
        if bridge is None:          # run by another node of the cluster: forwarded (router/cluster/forward.py)
            ref = self.rt.forwarder.reference_for(self.rt.poa, f"br/{id}", BA.Bridge._NP_RepositoryId)
            if ref is None:
                raise BA.BridgeNotFound()
            return ref
        return bridge.ref

    def get_all_bridges(self) -> list[int]:
        """Every bridge of the cluster, not only this node's (router/cluster/forward.py, ``cluster_ids``)."""

        return cluster_ids(self.rt.db, "bridge", list(self.bridges))

    def forget(self, bid: int) -> None:
        with self._lock:
            self.bridges.pop(bid, None)

    def status(self) -> list[dict[str, Any]]:
        return [b.status() for b in sorted(self.bridges.values(), key=lambda b: b.id)]


class BridgeImpl(ChannelLink, BrokerLink, TransactionMgmtMixin, Supervised, NsjmsAdmin__POA.ManagedBridge):
    """One bridge: endpoints, connections (its broker side: router.bridge.brokerlink), the data path thread(s),
    state."""

    def __init__(self, factory: BridgeFactoryImpl, row: BridgeRow) -> None:
        self.factory = factory
        self.rt = factory.rt
        self.row = row
        self.id = row.id
        self.source = EndpointSpec.from_json(row.source)
        self.sink = EndpointSpec.from_json(row.sink)
        self.to_jms_direction = not self.source.is_jms
        self.channel_spec = self.source if self.to_jms_direction else self.sink
        self.jms_spec = self.sink if self.to_jms_direction else self.source
        self.destination = Destination((self.jms_spec.destination_type or "QUEUE").lower(),
                                       self.jms_spec.destination_name or "")
        self._lock = threading.RLock()
        # Opening the broker connection has a lock of its own, never ``_lock``: a channel's pull thread opens it
        # from inside the flow's subscribe lock (``JmsToChannel.ensure_subscribed``), while ``_start`` takes the
        # subscribe lock with ``_lock`` held; both orders on ``_lock`` deadlocked a node's start (issue 8 crash loop).
        # Order: ``_lock`` -> the flow's subscribe lock -> ``_transport_lock``; nothing waits while holding the last.
        self._transport_lock = threading.Lock()
        self.started = row.state == "started"
        self.destroyed = False
        self.channel_ok = False
        self.broker_state = ConnectionState.DISCONNECTED
        self.last_error = ""
        self._row_deleted = False
        self.stop_event = threading.Event()
        self.transport: Transport | None = None
        self._t2_alt: Transport | None = None   # the second connection of channel → JMS T2s (_t2_transport)
        self.proxy: Any = None
        self.channel_ack: Any = None     # the proxy as an Ack proxy (NJI 2.6.2), when the channel made it one
        self.dead_letter = F.DeadLetter(self._transport, self.id, factory.broker.dead_letter,
                                        fits=lambda msg: self.codec.check(self.codec.encode(msg)))
        self.flow_out: F.ChannelToJms | None = None
        self.flow_in: F.JmsToChannel | None = None
        self._wake = threading.Event()          # set by callbacks and failures: the supervisor has work
        self._supervising = False
        self._warned_best_effort = False
        self.times = ChannelTimeSupport()      # what the proxy consumer accepts per event (_time_support)
        self.tx_events = int(row.settings.get("tx_events", 0))
        self.tx_timeout = int(row.settings.get("tx_timeout", 0))
        self.oid = f"br/{self.id}"
        self.ref = self.rt.activate(self.oid, self)
        self._local_ports = LocalEndpoint()        # the endpoint's in-process ports (router.routing)
        self.endpoint_servant = self._make_endpoint_servant()
        self.rt.endpoints.add(self.endpoint_servant, self._local_ports)
        self.endpoint_ref = self.rt.activate(self._endpoint_oid(), self.endpoint_servant)
        self._t2_ior: str | None = None
        self.t2_out: OutboundT2 | None = self._make_t2_out()
        self._register_t2()
        self._register_ledger_route()

    # -- construction --------------------------------------------------------------------------------------
    def _register_ledger_route(self) -> None:
        """Tell the ledger which channel proxy is this bridge's, so the channel's ledger rows for it carry the
        bridge, its destination and the direction (router/routing/ledger.py)."""

        if self.row.admin_id is None or self.row.proxy_id is None:
            return
        direction = Direction.CHANNEL_TO_JMS if self.to_jms_direction else Direction.JMS_TO_CHANNEL
        self.rt.store.ledger.set_route(self.row.channel_id, "C" if self.to_jms_direction else "S", self.row.admin_id,
                                       self.row.proxy_id, Route(direction, self.id,
                                                                f"{self.destination.kind}/{self.destination.name}"))

    def _endpoint_oid(self) -> str:
        return f"{self.oid}/{'recv' if self.to_jms_direction else 'send'}"

    def _kind(self) -> str:
        return "SEQUENCE" if self.channel_spec.type == "SEQUENCE_EVENT" else "STRUCTURED"

    def _make_endpoint_servant(self) -> Any:
        seq = self._kind() == "SEQUENCE"
        if self.to_jms_direction:
            self.flow_out = F.ChannelToJms(self, self.destination, LazyTransport(self), self._to_jms,
                                           self.dead_letter, _event_bytes)
            if self.channel_spec.style == "PUSH":

                receiver = (F.SequencePushReceiver if seq else F.StructuredPushReceiver)(self.flow_out)
                self._local_ports = LocalEndpoint(batches=LocalBatches(self.flow_out, self._to_jms_frame))
                return receiver
            cls = F.SequencePullReceiver if seq else F.StructuredPullReceiver
            return cls(self.flow_out, None, self._pacing_s, self.stop_event)
        self.flow_in = F.JmsToChannel(self, LazyTransport(self), self._to_event, self.dead_letter, self._subscribe,
                                      event_bytes=_event_bytes,
                                      max_event_bytes=self.factory.broker.max_event_bytes)
        if self.channel_spec.style == "PUSH":
            cls2 = F.SequencePushSenderServant if seq else F.PushSenderServant
            return cls2(self.channel_disconnected)
        sender = (F.SequencePullSender if seq else F.StructuredPullSender)(self.flow_in)
        self._local_ports = LocalEndpoint(inbound=sender)     # the channel's pull proxy of this node takes from it
        return sender

    def _make_t2_out(self) -> OutboundT2 | None:
        """The bridge as an in-process T2 participant of its proxy (channel PUSH → JMS on a node with T2, NJI
        2.7.2), registered by its endpoint receiver's IOR; None for the other combinations."""
        t2 = getattr(self.rt, "t2", None)
        if t2 is None or not self.to_jms_direction or self.channel_spec.style != "PUSH":
            return None
        out = OutboundT2(self.id, self.destination, self._transport, self.codec, self._to_jms, _event_bytes,
                         self.factory.broker.dead_letter, t2.enlist, self.running, self.note_broker_problem,
                         amq_dupl_id=self.factory.broker.amq_dupl_id, to_frame=self._to_jms_frame,
                         alt_transport=self._t2_transport)
        out.on_idle = self._t2_idle
        out.draining = lambda: self._disable_pending
        self._t2_ior = self.rt.ior(self.endpoint_ref)
        t2.register_local(self._t2_ior, out)
        self.rt.endpoints.update(self.endpoint_servant, t2=out)
        return out

    def _to_event(self, msg: Any) -> Any:
        """NJI 2.4.1 mapping; into a BestEffort channel the EventReliability header is left out, because the
        channel would refuse Persistent events (NS 2.5.5.1) and JMS producers send PERSISTENT by default. Such a
        bridge is at-most-once across a node crash; docs/bridge.md says so, and the first occurrence is logged.
        StopTime/StartTime are kept only when the proxy consumer supports them (:meth:`_time_support`)."""
        mapped = map_message(msg, times=self._time_support(), max_body_bytes=self.factory.broker.max_event_bytes)
        for note in mapped.notes:
            log.info("bridge %d: message %s: %s", self.id, msg.message_id, note)
        event = mapped.event
        if self._connection_persistent():
            return event
        header = event.header.variable_header
        kept = [p for p in header if p.name != CosNotification.EventReliability]
        if len(kept) != len(header):
            if not self._warned_best_effort:
                self._warned_best_effort = True
                log.warning("bridge %d: channel %s is BestEffort; persistent JMS messages become BestEffort events",
                            self.id, self.channel_spec.channel_id)
            event.header.variable_header = kept
        return event

    # -- running -------------------------------------------------------------------------------------------
    def running(self) -> bool:
        return self.started and not self.destroyed

    def _start_workers(self) -> None:
        # A fresh event per start: a worker of the previous start that is still finishing a call keeps its own
        # (set) event and exits, instead of being revived next to the new one.
        self.stop_event = threading.Event()
        if self.to_jms_direction:
            if self.channel_spec.style == "PULL":
                self.endpoint_servant.attach(self.proxy, self.stop_event)
                self.rt.spawn(f"bridge-{self.id}-pull", self.endpoint_servant.run)
            return
        if self.channel_spec.style == "PUSH":
            assert self.flow_in is not None
            loop = F.PushSenderLoop(self.flow_in, self.proxy, self._kind() == "SEQUENCE", self._batch_size,
                                    self._pacing_s, self.jms_spec.style == "PULL", self.stop_event)
            self.rt.spawn(f"bridge-{self.id}-recv", loop.run)

    def _start(self) -> None:
        with self._lock:
            if self.destroyed:
                raise CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO)
            if self.started:
                raise BA.BridgeAlreadyStarted()
            self._channel()
            problems = check_pair(self.source, self.sink, self.factory._channel_exists,
                                  self.factory._channel_persistent)
            if problems:                 # the channel's ConnectionReliability may have changed (NJI Table 2-3)
                raise _invalid(problems)
            try:
                self._transport()
                if self.flow_in is not None:
                    self.flow_in.ensure_subscribed()
            except TransportError as exc:
                self.note_broker_problem(exc)
                log.warning("bridge %d: starting while the broker is unavailable (%s); will retry", self.id, exc)
            self._connect_channel()
            with self.factory.rt.db.unit_of_work() as conn:     # first: a store failure leaves it not started
                self.factory.store.set_state(conn, self.id, "started")
            self.started = True
            self._start_workers()
            self._ensure_supervisor()
        log.info("bridge %d started", self.id)

    def _stop(self) -> None:
        with self._lock:
            if not self.started or self.destroyed:
                raise BA.BridgeInactive()
            with self.factory.rt.db.unit_of_work() as conn:     # first: a store failure leaves it started
                self.factory.store.set_state(conn, self.id, "stopped")
            self.started = False
            self.stop_event.set()
            self._suspend_channel()
            # The JMS subscription stays (JMS Connection.stop, NJI 2.3): a topic keeps collecting for the bridge;
            # nothing is dispatched or acknowledged until start_bridge.
        log.info("bridge %d stopped", self.id)

    def _release_subscription(self) -> None:
        """destroy: end the JMS subscription; a durable one (topic source on a Persistent channel) is removed from
        the broker (STOMP UNSUBSCRIBE with ``activemq.subscriptionName``), so the broker stops keeping messages for
        it. A durable subscription the bridge holds no live handle for (after a restart while stopped) is
        re-attached first so that it can be removed."""
        flow = self.flow_in
        if flow is None:
            return
        durable = self._durable_name()
        try:
            if flow.subscription is None and durable is not None:
                flow.subscription = self._subscribe()
            if flow.subscription is not None and self.transport is not None:
                self.transport.unsubscribe(flow.subscription, remove_durable=durable is not None)
        except TransportError as exc:
            log.warning("bridge %d: could not release its JMS subscription%s: %s", self.id,
                        f" (durable {durable!r} stays on the broker)" if durable else "", exc)
        flow.subscription = None

    def resume_after_restart(self) -> None:
        self.started = False
        try:
            self._start()
        except Exception:
            log.exception("bridge %d could not resume after restart", self.id)
            self.last_error = "could not resume after restart"

    def halt(self) -> None:
        """Node shutdown: stop threads and close the broker connection, keep the stored state."""
        self.stop_event.set()
        self._close_t2_out()
        if self.transport is not None:
            self.transport.close()

    def channel_disconnected(self) -> None:
        self.channel_ok = False
        if self.destroyed:
            return
        self.last_error = "channel: proxy disconnected"
        log.warning("bridge %d: the channel disconnected its proxy", self.id)

    # -- transactions: which configurations run in T2 -------------------------------------------------------
    def supports_transaction(self) -> bool:
        """Whether this bridge's direction and styles can run in the routing transaction T2 (NJI 2.7.2): the
        channel PUSHES to a channel → JMS bridge, the channel PULLS from a JMS → channel bridge."""
        return self.channel_spec.style == ("PUSH" if self.to_jms_direction else "PULL")

    def _register_t2(self) -> None:
        """JMS → channel pull sender: an in-process T2 participant of the node, found by its IOR by the channel's
        pull proxy (router.channel.t2in)."""
        if self.rt.t2 is not None and not self.to_jms_direction and self.channel_spec.style == "PULL":
            self._t2_ior = self.rt.ior(self.endpoint_ref)
            self.rt.t2.register_local(self._t2_ior, self.endpoint_servant)

    # -- settings -----------------------------------------------------------------------------------------
    def _save_settings(self, **extra: Any) -> None:
        settings = {**self.row.settings, "tx_events": self.tx_events, "tx_timeout": self.tx_timeout, **extra}
        with self.factory.rt.db.unit_of_work() as conn:
            self.factory.store.set_settings(conn, self.id, settings)
        self.row = BridgeRow(self.row.id, self.row.source, self.row.sink, self.row.state, self.row.channel_id,
                             self.row.admin_id, self.row.proxy_id, settings)

    # -- IDL -----------------------------------------------------------------------------------------------
    def _get_end_point_receiver(self) -> Any:
        return to_idl(self.source)

    def _get_end_point_sender(self) -> Any:
        return to_idl(self.sink)

    def _get_receiver_ref(self) -> Any:
        kind = {"PUSH": "PUSH_CONS", "PULL": "PULL_CONS"}[self.channel_spec.style]
        if self.to_jms_direction:
            disc = getattr(NsjmsAdmin, f"{self._kind()}_{kind}")
            return NsjmsAdmin.EndpointReceiver(disc, self.endpoint_ref)
        disc = NsjmsAdmin.MESSAGE_LISTENER if self.jms_spec.style == "PUSH" else NsjmsAdmin.MESSAGE_CONSUMER
        return NsjmsAdmin.EndpointReceiver(disc, None)

    def _get_sender_ref(self) -> Any:
        if self.to_jms_direction:
            return NsjmsAdmin.EndpointSender(NsjmsAdmin.MESSAGE_PRODUCER, None)
        kind = {"PUSH": "PUSH_SUPL", "PULL": "PULL_SUPL"}[self.channel_spec.style]
        return NsjmsAdmin.EndpointSender(getattr(NsjmsAdmin, f"{self._kind()}_{kind}"), self.endpoint_ref)

    def start_bridge(self) -> None:
        self._start()

    def stop_bridge(self) -> None:
        self._stop()

    def start(self) -> None:
        self._start()

    def stop(self) -> None:
        self._stop()

    def get_status(self) -> Any:
        """The administrative state (see the module docstring); ``status()`` tells whether it is Active."""
        return NsjmsAdmin.started if self.running() else NsjmsAdmin.stopped

    def active(self) -> bool:
        """NJI 2.3: the AND of the proxy connection and the JMS connection, while started."""
        return self.inactive_reason() is None

    def destroy(self) -> None:
        with self._lock:
            if self.destroyed:
                if not self._row_deleted:        # a store failure ended the first destroy: finish it
                    self._forget()
                return
            self.destroyed = True
            self.started = False
            self.stop_event.set()
        self._wake.set()                 # the supervisor sees ``destroyed`` and ends
        durable = self._durable_name()
        self._release_channel()
        if durable is not None and self.transport is None:
            try:
                self._transport()
            except TransportError as exc:
                log.warning("bridge %d: broker unavailable at destroy: %s", self.id, exc)
        if self.transport is not None and self.transport.is_connected():
            self._release_subscription()
        elif durable is not None:
            log.warning("bridge %d: broker unavailable at destroy: durable subscription %r stays on the broker",
                        self.id, durable)
        self._close_t2_out()
        if self.transport is not None:
            self.transport.close()
        self._forget()

    def _forget(self) -> None:
        """The end of destroy: the row, then the servants (a store failure reaches the client; destroy again)."""
        with self.factory.rt.db.unit_of_work() as conn:
            self.factory.store.delete(conn, self.id)
        self._row_deleted = True
        self.factory.forget(self.id)
        if self._t2_ior is not None and getattr(self.rt, "t2", None) is not None:
            self.rt.t2.unregister_local(self._t2_ior)
        self.rt.endpoints.remove(self.endpoint_servant)
        self.rt.deactivate(self._endpoint_oid())
        self.rt.deactivate(self.oid)
        log.info("bridge %d destroyed", self.id)

    def inactive_reason(self) -> str | None:
        """Why the bridge is not Active (NJI 2.3), first cause first; None when it is Active. One of
        ``channel gone`` (its channel was destroyed: it cannot work again), ``stopped`` (administratively),
        ``broker down`` (the JMS connection is lost; the bridge reconnects), ``subscription refused`` (the broker
        answers the bridge's SUBSCRIBE with an ERROR frame: ``last_error`` says why; retried with back-off) and
        ``channel not connected``."""
        if self.factory.channels.channels.get(self.channel_spec.channel_id) is None:
            return "channel gone"
        if not self.running():
            return "stopped"
        transport = self.transport
        if transport is None or not transport.is_connected():
            return "broker down"
        if self.flow_in is not None and self.flow_in.subscription_refused:
            return "subscription refused"
        if not self.channel_ok:
            return "channel not connected"
        return None

    def status(self) -> dict[str, Any]:
        """The node snapshot's row: ``state`` (``active``/``inactive``, NJI 2.3), ``started`` (administrative),
        ``channel_id`` and ``reason`` (:meth:`inactive_reason`, None when active); counters. ``router.cli.bridge
        .bridge_state`` renders it for ``bridge list`` and ``status``."""
        reason = self.inactive_reason()
        return {
            "id": self.id,
            "source": self.source.describe(),
            "sink": self.sink.describe(),
            "state": "active" if reason is None else "inactive",
            "reason": reason,
            "started": self.running(),
            "channel_id": self.channel_spec.channel_id,
            "active": reason is None,
            "channel_connected": self.channel_ok,
            "broker": self.broker_state.value,
            "forwarded": (self.flow_out.forwarded if self.flow_out else 0)
                         + (self.flow_in.forwarded if self.flow_in else 0)
                         + (self.t2_out.forwarded if self.t2_out else 0),
            "duplicates_suppressed": self.flow_in.duplicates if self.flow_in else 0,
            "dead_lettered": self.dead_letter.count + (self.t2_out.dead_lettered if self.t2_out else 0),
            "refused_to_broker_dlq": self.flow_in.refused if self.flow_in else 0,
            **self.transaction_status(),
            "last_error": self.dead_letter.problem or self.last_error,
        }


def _event_bytes(event: Any) -> bytes:
    import omniORB

    return bytes(omniORB.cdrMarshal(CosNotification._tc_StructuredEvent, event))


# A database failure in any IDL operation reaches the client as TRANSIENT / PERSIST_STORE, never UNKNOWN.
store_boundary(BridgeFactoryImpl, BridgeImpl)
