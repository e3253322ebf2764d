"""Subscription and offer sharing inside one channel (NS 2.6, 3.3.1-2, 3.4.1.3, 3.4.2.5; spec digest §10).

The channel keeps two aggregates, recomputed whenever something that defines them changes:

* **subscriptions** = the types consumers asked for directly (``subscription_change`` on a proxy supplier or
  ConsumerAdmin) plus the event types of the constraints of the *local* forwarding filters attached to proxy
  suppliers and ConsumerAdmins (filters created by this node's factory; a remote filter's types are not known);
* **offers** = the types suppliers announced (``offer_change`` on a proxy consumer or SupplierAdmin).

When an aggregate changes, the difference is sent, in order, by one worker thread per channel: subscription
changes to every connected supplier whose reference is a ``CosNotifyComm::NotifySubscribe``, offer changes to
every connected consumer that is a ``NotifyPublish``, unless that proxy turned updates off with
``obtain_*_types(*_UPDATES_OFF)``. ``NO_IMPLEMENT`` from a client is tolerated (NS 2.6.1). An all-types entry is
reported as ``{"", "%ALL"}`` (NS 2.6.6).

``obtain_*_types(ALL_NOW_UPDATES_ON)`` takes the snapshot and enables updates under the same lock that orders
the differences, so a client never misses a change made after its snapshot.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from omniORB import CORBA

import CosNotification
import CosNotifyChannelAdmin

from router.channel.filters import types_for
from router.channel.proxyport import ProxyView
from router.corbacall import NOTIFY, PROBE, CallFailed, call

__all__ = ["Sharing", "sharing_of"]

log = logging.getLogger("nsjms.channel")

_SUBSCRIBE_ID = "IDL:omg.org/CosNotifyComm/NotifySubscribe:1.0"
_PUBLISH_ID = "IDL:omg.org/CosNotifyComm/NotifyPublish:1.0"
_ALL = ("", "%ALL")


def sharing_of(channel: Any) -> Sharing:
    """The channel's Sharing (created on first use)."""
    sharing = getattr(channel, "_sharing", None)
    if sharing is None:
        with _create_lock:
            sharing = getattr(channel, "_sharing", None)
            if sharing is None:
                sharing = channel._sharing = Sharing(channel)
    return sharing


_create_lock = threading.Lock()


def _norm(d: str, t: str) -> tuple[str, str]:
    return _ALL if (d, t) in (("", ""), ("*", "*"), ("", "*"), ("*", "%ALL")) else (d, t)


class Sharing:
    """Aggregates, per-proxy update switches and the ordered notifier of one channel."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self._lock = threading.Lock()
        self._last = {"sub": self._compute("sub"), "offer": self._compute("offer")}
        self._updates_off: set[str] = set()             # proxy oids that turned updates off
        self._queue: queue.Queue[tuple[Any, str, list[Any], list[Any]]] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._capable: dict[str, Any] = {}

    # -- aggregates -----------------------------------------------------------------------------------------
    def _compute(self, which: str) -> set[tuple[str, str]]:
        admins = self.channel.consumer_admins if which == "sub" else self.channel.supplier_admins
        out: set[tuple[str, str]] = set()
        for admin in list(admins.values()):
            for holder in [admin, *list(admin.proxies.values())]:
                out.update(_norm(str(et.domain_name), str(et.type_name)) for et in holder.types.types())
                if which == "sub":
                    out.update(self._filter_types(holder))
        return out

    def _filter_types(self, holder: Any) -> set[tuple[str, str]]:

        out: set[tuple[str, str]] = set()
        for target in holder.filters.targets():
            constraints = getattr(target, "constraints", None)
            if constraints is not None and not getattr(target, "destroyed", False):
                out.update(_norm(str(et.domain_name), str(et.type_name)) for et in types_for(constraints))
        return out

    def current(self, which: str) -> list[Any]:
        with self._lock:
            return [CosNotification.EventType(d, t) for d, t in sorted(self._last[which])]

    def changed(self) -> None:
        """Something that defines an aggregate changed: recompute both and send the differences."""
        try:
            sub, offer = self._compute("sub"), self._compute("offer")
        except CORBA.Exception as exc:
            log.info("channel %s: subscription aggregate not recomputed: %s", self.channel.id, exc)
            return
        with self._lock:
            for which, now in (("sub", sub), ("offer", offer)):
                added, removed = now - self._last[which], self._last[which] - now
                self._last[which] = now
                if added or removed:
                    self._fan_out(which, sorted(added), sorted(removed))

    def obtain(self, proxy: ProxyView, which: str, mode: Any) -> list[Any]:
        """``obtain_subscription_types`` / ``obtain_offered_types`` with ObtainInfoMode (Table 3-1), atomic."""
        with self._lock:
            snapshot = [CosNotification.EventType(d, t) for d, t in sorted(self._last[which])]
            if mode in (CosNotifyChannelAdmin.ALL_NOW_UPDATES_ON, CosNotifyChannelAdmin.NONE_NOW_UPDATES_ON):
                self._updates_off.discard(proxy.oid)
            else:
                self._updates_off.add(proxy.oid)
        if mode in (CosNotifyChannelAdmin.NONE_NOW_UPDATES_OFF, CosNotifyChannelAdmin.NONE_NOW_UPDATES_ON):
            return []
        return snapshot

    # -- notification -------------------------------------------------------------------------------------
    def _fan_out(self, which: str, added: list[tuple[str, str]], removed: list[tuple[str, str]]) -> None:
        """Queue the difference for every interested proxy (caller holds the lock: order is preserved)."""
        admins = self.channel.supplier_admins if which == "sub" else self.channel.consumer_admins
        add = [CosNotification.EventType(d, t) for d, t in added]
        rem = [CosNotification.EventType(d, t) for d, t in removed]
        for admin in list(admins.values()):
            for proxy in list(admin.proxies.values()):
                if proxy.connected and not proxy.destroyed and proxy.oid not in self._updates_off:
                    self._queue.put((proxy, which, add, rem))
        if self._worker is None or not self._worker.is_alive():
            self._worker = self.channel.rt.spawn(f"sharing-{self.channel.id}", self._run)

    def _run(self) -> None:
        rt = self.channel.rt
        while not rt.shutting_down.is_set():
            try:
                proxy, which, add, rem = self._queue.get(timeout=1.0)
            except queue.Empty:
                continue
            try:
                self._deliver(proxy, which, add, rem)
            except Exception:
                log.exception("proxy %s: %s_change notification failed", getattr(proxy, "oid", "?"), which)

    def _deliver(self, proxy: ProxyView, which: str, add: list[Any], rem: list[Any]) -> None:
        client = self._client(proxy, _SUBSCRIBE_ID if which == "sub" else _PUBLISH_ID)
        if client is None:
            return
        operation = "subscription_change" if which == "sub" else "offer_change"
        try:
            call(client, operation, add, rem, policy=NOTIFY)
        except CallFailed as exc:
            if not isinstance(exc.cause, CORBA.NO_IMPLEMENT):
                log.info("proxy %s: %s to the client failed: %s", proxy.oid, operation, exc)
        except Exception as exc:  # noqa: BLE001 — a client's failure (a user exception) must not stop the notifier
            log.info("proxy %s: %s to the client failed: %s", proxy.oid, operation, exc)

    def _client(self, proxy: ProxyView, repo_id: str) -> Any:
        if proxy.oid in self._capable:
            return self._capable[proxy.oid]
        import CosNotifyComm

        iface = CosNotifyComm.NotifySubscribe if repo_id == _SUBSCRIBE_ID else CosNotifyComm.NotifyPublish
        narrowed = None
        try:
            client = proxy.client_ref()
            if client is not None and call(client, "_is_a", repo_id, policy=PROBE):
                narrowed = client._unchecked_narrow(iface)
        except CallFailed as exc:
            log.info("proxy %s: client type not known (%s)", proxy.oid, exc)
            return None
        self._capable[proxy.oid] = narrowed
        return narrowed
