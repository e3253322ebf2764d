"""ConsumerAdmin and SupplierAdmin servants (NS 3.4.15, 3.4.16).

An admin creates and owns proxies of one side of the channel; its QoS is copied into each proxy at creation,
its forwarding filters are shared live by its proxies (NS 2.1.2-2.1.3). Event-Service-style admins
(``for_consumers``/``for_suppliers``) and proxies (``obtain_push_supplier`` etc.) have internal ids but are not
listed or resolvable by id (NS 3.4.15).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, cast

from omniORB import CORBA

import CosNotification
import CosNotifyChannelAdmin
import CosNotifyChannelAdmin__POA
import CosNotifyComm

from router.channel import qos as Q
from router.channel import txdelivery
from router.channel.ack import ack_class_for
from router.channel.boundary import store_boundary
from router.channel.common import (
    FilterMixin,
    FilterSet,
    QoSMixin,
    group_passes,
    ids_of,
    ior_or_none,
    mapping_filter_from_ior,
)
from router.channel.events import Event
from router.channel.inflight import stopped_pushing
from router.channel.proxies import proxy_class
from router.channel.proxyport import LoadedProxy, SupplierView
from router.channel.runtime import admin_oid
from router.channel.sharing import sharing_of
from router.channel.store import AdminRow, ProxyRow
from router.channel.txdelivery import OWN_ENABLE_TRANSACTION, never_transactional
from router.channel.typesets import TypeSet
from router.quotas import check_proxies

__all__ = ["ConsumerAdminImpl", "SupplierAdminImpl"]

log = logging.getLogger("nsjms.channel")

_CLIENT_TYPES = {
    CosNotifyChannelAdmin.ANY_EVENT: "ANY",
    CosNotifyChannelAdmin.STRUCTURED_EVENT: "STRUCTURED",
    CosNotifyChannelAdmin.SEQUENCE_EVENT: "SEQUENCE",
}


def _kind(style: str, ctype: Any) -> str:
    try:
        return f"{style}_{_CLIENT_TYPES[ctype]}"
    except KeyError:
        raise CORBA.BAD_PARAM(0, CORBA.COMPLETED_NO) from None


class _AdminBase(QoSMixin, FilterMixin):
    side = "C"

    def __init__(self, channel: Any, row: AdminRow) -> None:
        self.channel = channel
        self.rt = channel.rt
        self.id = row.id
        self.es_style = row.es_style
        self.operator = CosNotifyChannelAdmin.InterFilterGroupOperator._items[row.operator]
        self.qos = dict(row.qos)
        self.qos_target = Q.Target(Q.Level.CONSUMER_ADMIN if self.side == "C" else Q.Level.SUPPLIER_ADMIN)
        self._lock = threading.RLock()
        self.proxies: dict[int, Any] = {}
        self.filters = FilterSet(self.rt.resolve, row.filters.get("forwarding"), local=self.rt.endpoints.servant)
        self.types = TypeSet()
        self.destroyed = False
        self._next_proxy = row.next_proxy
        self.oid = admin_oid(channel.id, self.side, self.id)
        self.ref = self.rt.activate(self.oid, self)

    # -- common IDL -------------------------------------------------------------------------------------
    def _get_MyID(self) -> int:
        return self.id

    def _get_MyChannel(self) -> Any:
        return self.channel.ref

    def _get_MyOperator(self) -> Any:
        return self.operator

    def destroy(self) -> None:
        if self.id == 0 and not self.es_style:
            # NS leaves destroying a default admin unspecified; the channel must always have one.
            raise CORBA.NO_PERMISSION(0, CORBA.COMPLETED_NO)
        # Retryable: if the store fails, the client gets TRANSIENT and the admin stays active (refusing new
        # proxies) until a new destroy() finishes; it is deactivated only once its stored row is gone.
        self.teardown(deactivate=False)
        with self.rt.db.unit_of_work() as conn:
            self.rt.store.delete_admin(conn, self.channel.id, self.side, self.id)
        admins = self.channel.consumer_admins if self.side == "C" else self.channel.supplier_admins
        admins.pop(self.id, None)
        self.rt.deactivate(self.oid)

    def teardown(self, *, deactivate: bool = True) -> None:
        """Disconnect every proxy (each deletes its stored row) and deactivate (the channel is going, or this admin
        is). A proxy whose teardown fails on the store stays listed, so calling this again finishes it."""
        with self._lock:
            self.destroyed = True
            proxies = list(self.proxies.values())
        with stopped_pushing(proxies, self.rt):  # their waits for pushes in flight share one bound; a failure
            for proxy in proxies:                # re-opens the proxies not torn down (inflight)
                proxy.teardown(notify_client=True)
        if deactivate:
            self.rt.deactivate(self.oid)

    # -- QoS / filters plumbing ------------------------------------------------------------------------
    def _qos_context(self) -> Q.Context:
        return Q.Context(has_children=bool(self.proxies), parent=self.channel.qos)

    def _persist_qos(self, qos: dict[str, Any]) -> None:
        with self.rt.db.unit_of_work() as conn:
            self.rt.store.update_admin(conn, self.channel.id, self.side, self.id, qos=qos)

    def _persist_filters(self) -> None:
        with self.rt.db.unit_of_work() as conn:
            self.rt.store.update_admin(conn, self.channel.id, self.side, self.id,
                                       filters={"forwarding": self.filters.saved()})

    # -- proxies ------------------------------------------------------------------------------------------
    def _new_proxy(self, kind: str, *, es_style: bool) -> Any:
        level = Q.Level.PROXY_SUPPLIER if self.side == "C" else Q.Level.PROXY_CONSUMER
        # through the channel's gate: not while the channel is handed to another node (TRANSIENT, nothing made),
        # and a hand-off waits for a proxy being made, so its row is there before the next owner loads the channel
        gate = getattr(self.channel, "gate", None)          # (a channel stand-in of the unit tests has none)
        with gate.passing() if gate is not None else contextlib.nullcontext(), self._lock:
            if self.destroyed:
                raise CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO)
            self.channel.check_limit(self.side)
            check_proxies(self.rt.limits, self.channel.factory)
            pid = self._next_proxy
            self._next_proxy = pid + 1
            qos = Q.inherit(self.qos, Q.Target(level, sequence=kind.endswith("SEQUENCE")))
            with self.rt.db.unit_of_work() as conn:
                self.rt.store.insert_proxy(conn, self.channel.id, self.side, self.id, pid, kind, es_style, qos)
            row = ProxyRow(self.channel.id, self.side, self.id, pid, kind, es_style, qos, None, False, False, {}, {})
            proxy = _servant_class(self.side, kind, es_style, qos)(self, row)
            self.proxies[pid] = proxy
        return proxy

    def restore_proxy(self, row: ProxyRow) -> None:
        proxy = _servant_class(self.side, row.kind, row.es_style, row.qos)(self, row)
        self.proxies[row.id] = proxy
        note = stored_enable_transaction_note(proxy)
        if note is not None:
            log.warning("proxy %s: %s", proxy.oid, note)
            if _never_transactional(proxy) is not None:               # said here: not again when it starts
                if self.side == "C":

                    txdelivery.state(proxy).unavailable_warned = True
                else:
                    proxy.t2_unavailable_warned = True

    def start_all(self) -> None:
        for proxy in list(self.proxies.values()):
            proxy.start()

    def forget_proxy(self, pid: int) -> None:
        with self._lock:
            self.proxies.pop(pid, None)

    def _ids(self, style: str) -> list[int]:
        return ids_of(p for p in list(self.proxies.values()) if p.kind.startswith(style))

    def _get_proxy(self, pid: int) -> Any:
        proxy = self.proxies.get(pid)
        if proxy is None or proxy.es_style:
            raise CosNotifyChannelAdmin.ProxyNotFound()
        return proxy.ref


class ConsumerAdminImpl(_AdminBase, CosNotifyChannelAdmin__POA.ConsumerAdmin):
    side = "C"

    def __init__(self, channel: Any, row: AdminRow) -> None:
        super().__init__(channel, row)
        self.priority_filter = mapping_filter_from_ior(self.rt, row.extra.get("priority_filter"))
        self.lifetime_filter = mapping_filter_from_ior(self.rt, row.extra.get("lifetime_filter"))

    def targets_for(self, event: Event) -> list[Any]:
        """Connected proxy suppliers of this admin whose filters (with the admin's) pass the event."""
        if self.destroyed:
            return []
        return [p for p in list(self.proxies.values()) if p.wants(event)]

    def passes(self, own: FilterSet, event: Event) -> bool:
        return group_passes(own, self.filters, self.operator, event)

    # mapping filters (stored; applied per NS 2.3.1 by the proxies)
    def _get_priority_filter(self) -> Any:
        return self.priority_filter

    def _set_priority_filter(self, value: Any) -> None:
        self.priority_filter = value
        self._persist_extra()

    def _get_lifetime_filter(self) -> Any:
        return self.lifetime_filter

    def _set_lifetime_filter(self, value: Any) -> None:
        self.lifetime_filter = value
        self._persist_extra()

    def _persist_extra(self) -> None:
        extra = {"priority_filter": ior_or_none(self.rt, self.priority_filter),
                 "lifetime_filter": ior_or_none(self.rt, self.lifetime_filter)}
        with self.rt.db.unit_of_work() as conn:
            self.rt.store.update_admin(conn, self.channel.id, self.side, self.id, extra=extra)

    def _get_pull_suppliers(self) -> list[int]:
        return self._ids("PULL")

    def _get_push_suppliers(self) -> list[int]:
        return self._ids("PUSH")

    def get_proxy_supplier(self, proxy_id: int) -> Any:
        return self._get_proxy(proxy_id)

    def obtain_notification_pull_supplier(self, ctype: Any) -> tuple[Any, int]:
        proxy = self._new_proxy(_kind("PULL", ctype), es_style=False)
        return proxy.ref, proxy.id

    def obtain_notification_push_supplier(self, ctype: Any) -> tuple[Any, int]:
        proxy = self._new_proxy(_kind("PUSH", ctype), es_style=False)
        return proxy.ref, proxy.id

    def obtain_push_supplier(self) -> Any:
        return self._new_proxy("PUSH_ANY", es_style=True).ref

    def obtain_pull_supplier(self) -> Any:
        return self._new_proxy("PULL_ANY", es_style=True).ref

    def subscription_change(self, added: list[Any], removed: list[Any]) -> None:

        self.types.change(added, removed)
        sharing_of(self.channel).changed()


class SupplierAdminImpl(_AdminBase, CosNotifyChannelAdmin__POA.SupplierAdmin):
    side = "S"

    def admits(self, own: FilterSet, event: Event) -> bool:
        return group_passes(own, self.filters, self.operator, event)

    def _get_pull_consumers(self) -> list[int]:
        return self._ids("PULL")

    def _get_push_consumers(self) -> list[int]:
        return self._ids("PUSH")

    def get_proxy_consumer(self, proxy_id: int) -> Any:
        return self._get_proxy(proxy_id)

    def obtain_notification_pull_consumer(self, ctype: Any) -> tuple[Any, int]:
        proxy = self._new_proxy(_kind("PULL", ctype), es_style=False)
        return proxy.ref, proxy.id

    def obtain_notification_push_consumer(self, ctype: Any) -> tuple[Any, int]:
        proxy = self._new_proxy(_kind("PUSH", ctype), es_style=False)
        return proxy.ref, proxy.id

    def obtain_push_consumer(self) -> Any:
        return self._new_proxy("PUSH_ANY", es_style=True).ref

    def obtain_pull_consumer(self) -> Any:
        return self._new_proxy("PULL_ANY", es_style=True).ref

    def offer_change(self, added: list[Any], removed: list[Any]) -> None:

        self.types.change(added, removed)
        sharing_of(self.channel).changed()


def _never_transactional(proxy: LoadedProxy) -> str | None:
    """Why ``proxy`` can never run a routing transaction whatever its client (NJI 2.7.2), or None."""

    if proxy.side == "C":                # a proxy supplier (LoadedProxy.side): the SupplierView the check reads
        return never_transactional(cast(SupplierView, proxy))
    if proxy.rt.t2 is None:
        return "this node runs no routing transactions"
    if proxy.style == "PUSH":
        return "it is a push-style proxy consumer (its supplier pushes outside any routing transaction)"
    return None


def stored_enable_transaction_note(proxy: LoadedProxy) -> str | None:
    """The load-time rule for a stored ``EnableTransaction`` = TRUE that this version did not check (docs/qos.md,
    "Stored values"): the proxy has no own-flag record, so the value was inherited from its admin or channel, or
    set on the proxy itself by an older version, which accepted it and ignored it. It keeps the meaning the proxy's
    client was given, never a new one silently: such a value is treated as inherited (kept, never used to refuse a
    client at connect; honoured where a routing transaction can run, and shown as ``t2_unavailable`` where the
    client cannot take part). Returns the WARNING to log at load when that is not visible otherwise: the proxy can
    never run a routing transaction (its value is ignored, as it was), or the value was set on the proxy by an older
    version (neither its admin nor its channel holds TRUE) and is honoured from now on. None: nothing to say."""

    if not proxy.qos.get(Q.ENABLE_TRANSACTION) or OWN_ENABLE_TRANSACTION in proxy.extra:
        return None
    parents = (proxy.admin.qos or {}, proxy.channel.qos or {})
    legacy = not any(q.get(Q.ENABLE_TRANSACTION) for q in parents)
    origin = ("set on this proxy by an older nsjms version, which accepted it and ignored it" if legacy
              else "inherited from its admin or channel")
    never = _never_transactional(proxy)
    if never is not None:
        return (f"EnableTransaction is TRUE ({origin}) but {never}: it delivers without a routing transaction, "
                "as before. Set EnableTransaction FALSE on this proxy to clear it (setting TRUE on it is refused "
                "with UNAVAILABLE_VALUE)")
    if legacy:
        return (f"EnableTransaction is TRUE ({origin}); it is kept with the meaning of an inherited value: "
                "honoured from now on where a routing transaction can run (a bridge of this node as the client), "
                "else shown as t2_unavailable in nsjms status; a client is not refused at connect for it")
    return None


def _servant_class(side: str, kind: str, es_style: bool, qos: dict[str, Any]) -> type:
    """Ack servants for proxy suppliers created with DeliveryReliability=Acknowledgment (docs/ack.md)."""

    return ack_class_for(side, kind, es_style, qos) or proxy_class(side, kind, es_style)


_ = (CosNotification, CosNotifyComm)


store_boundary(ConsumerAdminImpl, SupplierAdminImpl)
