"""The bridge's side of its channel: the proxy it obtained from the channel, connecting, suspending and releasing it,
acknowledging to an Ack proxy, and the QoS it reads from it (NJI 2.3, 2.6.2). A mixin of
``router.bridge.bridge.BridgeImpl``; the attributes below are the bridge's.

The channel is in this process: the proxy's *servant* is found through the channel factory (:meth:`_find_proxy`,
None when it or its channel is gone, no exception), and calls on the proxy *reference* go through
``router.corbacall`` (policy ``CHANNEL``: no timeout of their own, no retries), whose ``CallFailed`` is the one
failure this module handles.
"""

from __future__ import annotations

import logging
from typing import Any

from omniORB import CORBA

import CosNotification
import CosNotifyChannelAdmin

from idl.generated import CosBridgeAdmin as BA
from idl.generated import CosNotifyChannelAdminAck
from router.bridge.endpoints import EndpointSpec, Problem
from router.bridge.store import BridgeRow
from router.corbacall import CHANNEL, PROBE, CallFailed, call
from router.mapping import ChannelTimeSupport

__all__ = ["ChannelLink", "invalid"]

log = logging.getLogger("nsjms.bridge")

_TIMET = 10_000_000


def invalid(problems: list[Problem]) -> BA.InvalidExternalEndPoints:
    """``InvalidExternalEndPoints`` for ``problems`` (each logged)."""
    for p in problems:
        log.info("invalid bridge endpoint (%s): %s", p.code, p.reason)
    return BA.InvalidExternalEndPoints([BA.ExternalEndpointError(getattr(BA, p.role), getattr(BA, p.code))
                                        for p in problems])


class ChannelLink:
    """The channel side of one bridge."""

    id: int
    factory: Any
    row: BridgeRow
    channel_spec: EndpointSpec
    to_jms_direction: bool
    endpoint_ref: Any
    proxy: Any
    channel_ack: Any
    channel_ok: bool
    times: ChannelTimeSupport
    _times_read: tuple[object, object] | None = None     # the proxy QoS values `times` was made from

    def _kind(self) -> str:
        raise NotImplementedError

    def _register_ledger_route(self) -> None:
        raise NotImplementedError

    def _time_support(self) -> ChannelTimeSupport:
        """StopTimeSupported/StartTimeSupported of the bridge's proxy consumer, read for each message from the QoS
        the channel checks the event against (its ``get_qos``), so a ``set_qos`` takes effect at once; the last
        value read when the proxy cannot be reached (the channel refuses the event then anyway)."""
        servant = self._find_proxy()
        if servant is None:
            return self.times
        qos = servant.qos
        values = (qos.get(CosNotification.StopTimeSupported), qos.get(CosNotification.StartTimeSupported))
        if values != self._times_read:       # per message: rebuilt only when the proxy's values changed
            self.times = ChannelTimeSupport.from_qos({CosNotification.StopTimeSupported: values[0],
                                                      CosNotification.StartTimeSupported: values[1]})
            self._times_read = values
        return self.times

    def _proxy_qos(self, name: str, default: int) -> int:
        """QoS ``name`` as the bridge's proxy sees it: the proxy's own, else its admin's, else the channel's (the
        bridge's admin and proxy inherit from the channel; sequence-only properties live on admins/channels)."""
        servant = self._find_proxy()
        if servant is None:
            return default
        channel = self.factory.channels.channels.get(self.channel_spec.channel_id)
        for holder in (servant, getattr(servant, "admin", None), channel):
            qos = getattr(holder, "qos", None)
            if isinstance(qos, dict) and name in qos:
                return int(qos[name])
        return default

    def _pacing_s(self) -> float:
        """PacingInterval (TimeT) of the bridge's proxy in seconds; 0 = no pacing."""
        return self._proxy_qos(CosNotification.PacingInterval, 0) / _TIMET

    def _batch_size(self) -> int:
        """MaximumBatchSize of the bridge's proxy (sequence endpoints)."""
        return max(1, self._proxy_qos(CosNotification.MaximumBatchSize, 1))

    def _channel(self) -> Any:
        channel = self.factory.channels.channels.get(self.channel_spec.channel_id)
        if channel is None:
            raise invalid([Problem(self.channel_spec.role, "INVALID_CHANNELID",
                                    f"channel {self.channel_spec.channel_id} no longer exists")])
        return channel

    def attach_channel(self) -> None:
        """Obtain the proxy on a new admin of the channel (NJI 2.3 steps 1-2); not connected until start."""
        channel = self._channel()
        kind = getattr(CosNotifyChannelAdmin, f"{self._kind()}_EVENT")
        if self.to_jms_direction:
            admin, aid = channel.new_for_consumers(CosNotifyChannelAdmin.AND_OP)
            obtain = (admin.obtain_notification_push_supplier if self.channel_spec.style == "PUSH"
                      else admin.obtain_notification_pull_supplier)
        else:
            admin, aid = channel.new_for_suppliers(CosNotifyChannelAdmin.AND_OP)
            obtain = (admin.obtain_notification_push_consumer if self.channel_spec.style == "PUSH"
                      else admin.obtain_notification_pull_consumer)
        _proxy, pid = obtain(kind)
        with self.factory.rt.db.unit_of_work() as conn:
            self.factory.store.set_proxy(conn, self.id, aid, pid)
        self.row = BridgeRow(self.row.id, self.row.source, self.row.sink, self.row.state, self.row.channel_id,
                             aid, pid, self.row.settings)
        self._register_ledger_route()

    def _find_proxy(self) -> Any | None:
        """The channel's proxy servant for this bridge (same process), or None when it or its channel is gone."""
        channel = self.factory.channels.channels.get(self.channel_spec.channel_id)
        if channel is None:
            return None
        admins = channel.consumer_admins if self.to_jms_direction else channel.supplier_admins
        admin = admins.get(self.row.admin_id)
        return admin.proxies.get(self.row.proxy_id) if admin is not None else None

    def _proxy_servant(self) -> Any:
        """The channel's proxy servant for this bridge (same process). Raises ``InvalidExternalEndPoints`` when
        the channel is gone, ``OBJECT_NOT_EXIST`` when the proxy is."""
        self._channel()
        proxy = self._find_proxy()
        if proxy is None:
            raise CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO)
        return proxy

    def _proxy_ref(self) -> Any:
        servant = self._proxy_servant()
        iface = _PROXY_IFACES[(self.to_jms_direction, self.channel_spec.style, self._kind())]
        return servant.ref._narrow(iface)

    def _connection_persistent(self) -> bool:
        return persistent(self._channel())

    def _connect_channel(self) -> None:
        servant = self._proxy_servant()
        proxy = self._proxy_ref()
        self.proxy = proxy
        if self.to_jms_direction:        # before connecting: the channel may push at once
            self.channel_ack = self._ack_proxy(proxy)
        if servant.connected:
            self._resume_proxy_now(servant, proxy)
        else:
            connect = _CONNECT_OPS[(self.to_jms_direction, self.channel_spec.style, self._kind())]
            getattr(proxy, connect)(self.endpoint_ref)
        self.channel_ok = True

    def repoint_stored_proxy(self) -> None:
        """A bridge this node took over from another (router/cluster/takeover.py), before its channel is loaded: the
        stored client of its channel proxy is the old node's endpoint reference; it becomes this node's, so the
        restored proxy delivers to (or pulls from) this bridge, in-process and in T2 where enabled."""
        if self.row.admin_id is None or self.row.proxy_id is None:
            return
        side = "C" if self.to_jms_direction else "S"
        with self.factory.rt.db.unit_of_work() as conn:
            conn.execute("UPDATE nsjms_proxy SET client_ior = %s WHERE channel_id = %s AND side = %s "
                         "AND admin_id = %s AND id = %s AND client_ior IS NOT NULL",
                         (self.factory.rt.ior(self.endpoint_ref), self.row.channel_id, side, self.row.admin_id,
                          self.row.proxy_id))

    def _resume_proxy_now(self, servant: Any, proxy: Any) -> None:
        """At start: resume a suspended (stopped bridge) or Ack-stopped proxy (one ``resume_connection`` clears
        both)."""
        stopped = getattr(getattr(servant, "ack", None), "stopped", "")
        if stopped or getattr(servant, "suspended", False):
            proxy.resume_connection()

    def _ack_proxy(self, proxy: Any) -> Any:
        """``proxy`` as its ``CosNotifyChannelAdminAck`` interface when the channel made it an Ack proxy (its
        DeliveryReliability was Acknowledgment when it was created, docs/ack.md); None otherwise."""
        iface = _ACK_IFACES[(self.channel_spec.style, self._kind())]
        try:
            if not call(proxy, "_is_a", iface._NP_RepositoryId, policy=PROBE):
                return None
            return call(proxy, "_narrow", iface, policy=PROBE)
        except CallFailed as exc:
            log.warning("bridge %d: cannot tell whether its proxy acknowledges (%s)", self.id, exc)
            return None

    def acknowledge_channel(self, events: list[Any]) -> None:
        """NJI 2.6.2: as the channel's consumer, acknowledge events (by their SequenceNumber) once the broker
        confirmed them (or they were dead-lettered). A failed acknowledge only makes the channel resend the events:
        at-least-once, like a lost receipt."""
        ack = self.channel_ack
        if ack is None:
            return
        sns = [sn for sn in (_sequence_number(ev) for ev in events) if sn is not None]
        if not sns:
            return
        try:
            call(ack, "acknowledge", sns, policy=CHANNEL)
        except CallFailed as exc:
            log.warning("bridge %d: acknowledging %d event(s) to the channel failed (%s); they will be resent",
                        self.id, len(sns), exc)

    def _suspend_channel(self) -> None:
        """stop_bridge: suspend the proxy (its channel gone: nothing to do; already inactive: fine)."""
        servant = self._find_proxy()
        if servant is None:
            if self.factory.channels.channels.get(self.channel_spec.channel_id) is not None:
                log.warning("bridge %d: could not suspend its proxy: it no longer exists", self.id)
            return
        if not servant.connected or servant.suspended or not hasattr(self.proxy, "suspend_connection"):
            return
        try:
            call(self.proxy, "suspend_connection", policy=CHANNEL,
                 expected=(CosNotifyChannelAdmin.ConnectionAlreadyInactive, CosNotifyChannelAdmin.NotConnected))
        except (CosNotifyChannelAdmin.ConnectionAlreadyInactive, CosNotifyChannelAdmin.NotConnected):
            pass
        except CallFailed as exc:
            log.warning("bridge %d: could not suspend its proxy: %s", self.id, exc)

    def local_push_proxy(self) -> Any:
        """JMS → channel, push configuration: the channel's proxy consumer servant when the channel is Persistent
        (the push loop then routes in-process with the inbox, ``PushSenderLoop._round_local``); None otherwise
        (BestEffort: the push over the ORB as before). The channel gone: OBJECT_NOT_EXIST."""
        try:
            if not self._connection_persistent():
                return None
            return self._proxy_servant()
        except BA.InvalidExternalEndPoints:
            raise CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO) from None

    def _release_channel(self) -> None:
        """Disconnect and destroy the proxy and the admin the bridge made (NJI 2.3 destroy)."""
        try:
            channel = self._channel()
        except BA.InvalidExternalEndPoints:
            return
        admins = channel.consumer_admins if self.to_jms_direction else channel.supplier_admins
        admin = admins.get(self.row.admin_id) if self.row.admin_id is not None else None
        if admin is not None:
            try:
                call(admin, "destroy", policy=CHANNEL)
            except CallFailed as exc:
                log.warning("bridge %d: releasing its admin: %s", self.id, exc)


def persistent(channel: Any) -> bool:
    return bool(int(channel.qos.get(CosNotification.ConnectionReliability, 0)) == CosNotification.Persistent)


def _sequence_number(event: Any) -> int | None:
    """The ``SequenceNumber`` an Ack proxy put in an event's variable header (per event, or on a batch's first)."""
    for p in event.header.variable_header:
        if p.name == "SequenceNumber":
            try:
                value = p.value.value()
            except CORBA.Exception:
                return None
            return value if isinstance(value, int) else None
    return None


_PROXY_IFACES = {
    (True, "PUSH", "STRUCTURED"): CosNotifyChannelAdmin.StructuredProxyPushSupplier,
    (True, "PUSH", "SEQUENCE"): CosNotifyChannelAdmin.SequenceProxyPushSupplier,
    (True, "PULL", "STRUCTURED"): CosNotifyChannelAdmin.StructuredProxyPullSupplier,
    (True, "PULL", "SEQUENCE"): CosNotifyChannelAdmin.SequenceProxyPullSupplier,
    (False, "PUSH", "STRUCTURED"): CosNotifyChannelAdmin.StructuredProxyPushConsumer,
    (False, "PUSH", "SEQUENCE"): CosNotifyChannelAdmin.SequenceProxyPushConsumer,
    (False, "PULL", "STRUCTURED"): CosNotifyChannelAdmin.StructuredProxyPullConsumer,
    (False, "PULL", "SEQUENCE"): CosNotifyChannelAdmin.SequenceProxyPullConsumer,
}


_ACK_IFACES = {
    ("PUSH", "STRUCTURED"): CosNotifyChannelAdminAck.StructuredProxyPushSupplierAck,
    ("PUSH", "SEQUENCE"): CosNotifyChannelAdminAck.SequenceProxyPushSupplierAck,
    ("PULL", "STRUCTURED"): CosNotifyChannelAdminAck.StructuredProxyPullSupplierAck,
    ("PULL", "SEQUENCE"): CosNotifyChannelAdminAck.SequenceProxyPullSupplierAck,
}


_CONNECT_OPS = {
    (True, "PUSH", "STRUCTURED"): "connect_structured_push_consumer",
    (True, "PUSH", "SEQUENCE"): "connect_sequence_push_consumer",
    (True, "PULL", "STRUCTURED"): "connect_structured_pull_consumer",
    (True, "PULL", "SEQUENCE"): "connect_sequence_pull_consumer",
    (False, "PUSH", "STRUCTURED"): "connect_structured_push_supplier",
    (False, "PUSH", "SEQUENCE"): "connect_sequence_push_supplier",
    (False, "PULL", "STRUCTURED"): "connect_structured_pull_supplier",
    (False, "PULL", "SEQUENCE"): "connect_sequence_pull_supplier",
}
