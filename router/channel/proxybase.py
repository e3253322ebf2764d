"""Proxy servants' common base and the supplier side's base (NS 3.4.1-3.4.14), split from :mod:`router.channel.proxies`.

* :class:`ProxyBase` — ids, navigation, QoS, filters, connection state (persisted), suspend/resume, teardown.
* :class:`ProxySupplierBase` — a proxy supplier's queue, filters and mapping filters, finishing delivered events.

The push and pull delivery mixins are :mod:`router.channel.pushsupplier` and :mod:`router.channel.pullsupplier`;
the concrete servant classes and the registry of proxy kinds are :mod:`router.channel.proxies`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import omniORB
from omniORB import CORBA

import CosEventChannelAdmin
import CosEventComm
import CosNotification
import CosNotifyChannelAdmin

from router.channel import qos as Q
from router.channel import txdelivery
from router.channel.common import (
    FilterMixin,
    FilterSet,
    QoSMixin,
    ior_or_none,
    mapping_filter_from_ior,
    raise_unsupported_qos,
)
from router.channel.dedupe import dedupe_ids
from router.channel.delivery import DeliveryFailures
from router.channel.events import Event, Form, as_any, as_structured
from router.channel.filters import mapped_deadline, mapped_priority, proxy_view
from router.channel.queue import Entry, ProxyQueue, Record
from router.channel.runtime import proxy_oid
from router.channel.sharing import sharing_of
from router.channel.store import ProxyRow, StoreError
from router.channel.typesets import TypeSet
from router.mapping.dedupe import stamped
from router.mapping.text import narrow_event
from router.routing.completer import Completer
from router.routing.ledger import Outcome as LedgerOutcome

__all__ = ["OWN_ENABLE_TRANSACTION", "ProxyBase", "ProxySupplierBase"]


if TYPE_CHECKING:
    from router.channel.proxyport import HandOffProxy

log = logging.getLogger("nsjms.channel")

_TIMET = 10_000_000
_IDLE_WAIT = 0.5
_MAX_BACKOFF = 5.0
#: A queue's drop reason (router/channel/queue.py) → the ledger's outcome and failure reason.
_DROP_OUTCOMES: dict[str, tuple[LedgerOutcome, str]] = {
    "expired": (LedgerOutcome.EXPIRED, "expired: its deadline passed (Timeout, StopTime or a lifetime filter)"),
    "DiscardPolicy": (LedgerOutcome.DISCARDED, "discarded by the DiscardPolicy: the channel was full "
                                               "(MaxQueueLength)"),
    "MaxEventsPerConsumer": (LedgerOutcome.DISCARDED, "discarded by the DiscardPolicy: the proxy's queue was full "
                                                      "(MaxEventsPerConsumer)"),
    "proxy closed": (LedgerOutcome.DISCARDED, "discarded: the proxy supplier was closed"),
}
#: ``extra`` key: EnableTransaction was set TRUE on the proxy itself (not inherited from its admin or channel)
OWN_ENABLE_TRANSACTION = txdelivery.OWN_ENABLE_TRANSACTION
# A blocking pull answers TRANSIENT after this long: shorter than the client call timeouts of nsjms's own ORBs
# (15 s and 30 s) and of typical clients, so no pull outlives the call that made it.
_MAX_PULL_WAIT = 10.0
# Failures after which a push is retried later: the consumer may come back.
_TRANSIENT = (CORBA.TRANSIENT, CORBA.COMM_FAILURE, CORBA.TIMEOUT, CORBA.NO_RESOURCES, CORBA.INTERNAL,
              CORBA.UNKNOWN, CORBA.NO_RESPONSE)


class ProxyBase(QoSMixin, FilterMixin):
    """State and operations every proxy has."""

    side = "C"
    client_iface: Any = None          # typed interface of the connected client, for narrowing stored IORs
    closing = False                   # teardown begun (stopped), stored row not yet deleted
    connected = False                 # a client is connected (set from the stored row when the proxy is made)
    #: the connect operation declares CosEventChannelAdmin::TypeError (NS 3.4: pull proxy consumers and
    #: push proxy suppliers; not push proxy consumers nor pull proxy suppliers, where omniORB would turn it into
    #: UNKNOWN at the client)
    connect_declares_type_error = False

    def __init__(self, admin: Any, row: ProxyRow) -> None:
        self.admin = admin
        self.channel = admin.channel
        self.rt = admin.rt
        self.id = row.id
        self.kind = row.kind
        self.style, self.form = row.kind.split("_", 1)
        self.es_style = row.es_style
        self.qos = dict(row.qos)
        level = Q.Level.PROXY_SUPPLIER if self.side == "C" else Q.Level.PROXY_CONSUMER
        self.qos_target = Q.Target(level, sequence=self.form == "SEQUENCE")
        self._lock = threading.RLock()
        self.client: Any = None
        self.client_ior = row.client_ior
        self.connected = row.connected
        self.suspended = row.suspended
        self.destroyed = False
        self.stop_event = threading.Event()
        self.filters = FilterSet(self.rt.resolve, row.filters.get("forwarding"), local=self.rt.endpoints.servant)
        self.extra: dict[str, Any] = dict(row.extra or {})
        self.types = TypeSet()
        self.oid = proxy_oid(self.channel.id, self.side, admin.id, self.id)
        self.ref = self.rt.activate(self.oid, self)

    # -- navigation and QoS ------------------------------------------------------------------------------
    def _get_MyType(self) -> Any:
        return getattr(CosNotifyChannelAdmin, self.kind)

    def _get_MyAdmin(self) -> Any:
        return self.admin.ref

    def _qos_context(self) -> Q.Context:
        return Q.Context(has_children=False, parent={**self.channel.qos, **self.admin.qos})

    def _persist_qos(self, qos: dict[str, Any]) -> None:
        self._update(qos=qos)

    def _persist_filters(self) -> None:
        self._update(filters={"forwarding": self.filters.saved()})

    def _update(self, **cols: Any) -> None:
        with self.rt.db.unit_of_work() as conn:
            self.rt.store.update_proxy(conn, self.channel.id, self.side, self.admin.id, self.id, **cols)

    def save_extra(self, **items: Any) -> None:
        """Merge ``items`` into the proxy's ``extra`` jsonb (mapping filters, acknowledgement state) and store it."""
        with self._lock:                 # held across the write: stored snapshots never go backwards
            self.extra.update(items)
            if not self.destroyed:
                self._update(extra=dict(self.extra))

    def validate_event_qos(self, required_qos: list[Any]) -> list[Any]:
        try:
            available = Q.validate_event_qos({**self.channel.qos, **self.qos},
                                             [(p.name, p.value) for p in required_qos])
        except Q.QoSError as exc:
            raise_unsupported_qos(exc)
        return Q.to_named_ranges(available)

    # -- connection --------------------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self.destroyed:
            raise CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO)

    def _check_open(self) -> None:
        """``TRANSIENT`` (``COMPLETED_NO``: nothing changed; asked again, it is done where the proxy runs then) while
        the proxy is closing (a teardown that failed on the store: it must be finished first; or stopped for the
        hand-off of its channel) or its channel is being handed to another node (a proxy made during that stop):
        a connection change made here then would reach PostgreSQL after the next owner loaded the proxy, or start a
        worker on this node beside the next owner's (router/cluster/release.py)."""
        gate = getattr(self.channel, "gate", None)      # (a channel stand-in of the unit tests has none)
        if self.closing or (gate is not None and gate.closed):
            raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)

    def _connect(self, client: Any, *, required: bool) -> None:
        """Record the client (nil allowed unless required); AlreadyConnected if one is connected."""
        with self._lock:
            self._check_alive()
            self._check_open()
            if self.connected:
                raise CosEventChannelAdmin.AlreadyConnected()
            nil = client is None or CORBA.is_nil(client)
            if required and nil:
                raise CORBA.BAD_PARAM(0, CORBA.COMPLETED_NO)
            if (not nil and self.connect_declares_type_error and self.extra.get(OWN_ENABLE_TRANSACTION)
                    and self.qos.get(Q.ENABLE_TRANSACTION)):
                self._check_transactional_client(client)
            self.client = None if nil else client
            self.client_ior = None if nil else self.rt.ior(client)
            self._update(client_ior=self.client_ior, connected=True, suspended=False)
            self.connected, self.suspended = True, False
        self.start()

    def _check_transactional_client(self, client: Any) -> None:
        """Hook: this proxy's own QoS has EnableTransaction TRUE (set on it with ``set_qos`` before a client was
        connected); raise ``CosEventChannelAdmin::TypeError`` if ``client`` cannot take part in its routing
        transactions (the value is never accepted and then ignored). Called only where the connect operation
        declares TypeError (:attr:`connect_declares_type_error`); the other proxies refuse TRUE at ``set_qos``."""

    def set_qos(self, qos: list[Any]) -> None:
        """``set_qos``; an EnableTransaction set on the proxy itself is remembered (``extra``), so a client that
        cannot take part in a routing transaction is refused when it connects (:meth:`_connect`)."""
        super().set_qos(qos)
        if any(p.name == Q.ENABLE_TRANSACTION for p in qos):
            self.save_extra(**{OWN_ENABLE_TRANSACTION: bool(self.qos.get(Q.ENABLE_TRANSACTION))})

    def client_ref(self) -> Any:
        """The connected client's reference (restored lazily from its IOR after a restart)."""
        if self.client is None and self.client_ior:
            self.client = self.rt.resolve(self.client_ior)._unchecked_narrow(self.client_iface)
        return self.client

    def start(self) -> None:
        """Start the proxy's worker, if it has one and is connected (also called after a restore)."""

    def supervised(self, loop: Callable[[], None]) -> Callable[[], None]:
        """A worker that an unexpected error does not kill: it is logged and the loop starts again after a
        backoff, until the proxy stops. (Expected failures are handled inside the loops.)"""

        def run() -> None:
            backoff = 0.1
            while not (self.stop_event.is_set() or self.rt.shutting_down.is_set() or self.destroyed):
                try:
                    loop()
                    return
                except Exception:
                    log.exception("proxy %s: worker failed; restarting it in %.1f s", self.oid, backoff)
                    self.stop_event.wait(backoff)
                    backoff = min(backoff * 2, _MAX_BACKOFF)

        return run

    def suspend_connection(self) -> None:
        with self._lock:
            self._check_alive()
            self._check_open()
            if not self.connected:
                raise CosNotifyChannelAdmin.NotConnected()
            if self.suspended:
                raise CosNotifyChannelAdmin.ConnectionAlreadyInactive()
            self._update(suspended=True)
            self.suspended = True

    def resume_connection(self) -> None:
        with self._lock:
            self._check_alive()
            self._check_open()
            if not self.connected:
                raise CosNotifyChannelAdmin.NotConnected()
            if not self.suspended:
                raise CosNotifyChannelAdmin.ConnectionAlreadyActive()
            self._update(suspended=False)
            self.suspended = False
        self._wake()

    def _wake(self) -> None:
        """Wake the worker (queue or pull loop)."""

    # -- hand-off of the channel to another node (router/cluster/release.py; proxyport.HandOffProxy) ---------
    def stop_for_handoff(self) -> None:
        """Stop here: the worker ends after its push, pull or routing transaction in flight; later connection
        changes are refused ``TRANSIENT`` (:meth:`_check_open`). Unlike a teardown, the stored rows stay: the
        channel's next owner loads them."""
        with self._lock:
            self.closing = True
            self.stop_event.set()
        self._wake()

    def drain_inbound(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) for the phase two of this proxy's inbound routing transactions; True when
        none runs (a proxy without them)."""
        return True

    def delete_delivered_rows(self) -> bool:
        """One attempt to delete the rows of events this proxy delivered whose delete failed; True when none is
        left (a proxy that keeps none)."""
        return True

    def client_disconnected(self) -> None:
        """The client called our ``disconnect_*``: release everything, the reference dies (NS 3.3.7.2)."""
        self.teardown(notify_client=False)

    def teardown(self, *, notify_client: bool, retry: bool = False) -> None:
        """Destroy the proxy. It stops at once (not connected, worker stopped); then its stored row and queue rows
        are deleted, and only then is it marked destroyed, released, forgotten by its admin and deactivated.

        If the store cannot delete the row, the :class:`StoreError` propagates (a calling client gets ``TRANSIENT``,
        ``COMPLETED_NO``) and the proxy stays stopped but registered, stored and retryable: the next call finishes
        the teardown. With ``retry`` (the proxy's own worker found its client gone; nobody calls again) the delete is
        retried with backoff until it works or the node stops."""
        with self._lock:
            if self.destroyed:
                return
            self.closing = True
            self.connected = False
            self.stop_event.set()
        self._wake()
        self._delete_row(retry)
        with self._lock:
            if self.destroyed:                 # a concurrent teardown finished first
                return
            self.destroyed = True
        self._release_resources()
        if notify_client:
            self._notify_client_async()
        self.admin.forget_proxy(self.id)
        self.rt.deactivate(self.oid)
        if self.filters or self.types.types():

            sharing_of(self.channel).changed()      # its subscriptions/offers leave the aggregate

    def _delete_row(self, retry: bool) -> None:
        backoff = 0.05
        while True:
            try:
                with self.rt.db.unit_of_work() as conn:
                    self._deliveries_before_delete(conn)
                    self.rt.store.delete_proxy(conn, self.channel.id, self.side, self.admin.id, self.id)
                return
            except StoreError as exc:
                if not retry or self.rt.shutting_down.is_set():
                    raise
                log.warning("proxy %s: could not delete the disconnected proxy from the store (%s); retrying",
                            self.oid, exc)
                if self.rt.shutting_down.wait(backoff):
                    raise
                backoff = min(backoff * 2, _MAX_BACKOFF)

    def _deliveries_before_delete(self, conn: Any) -> None:
        """In the unit of work that deletes the proxy, before its queue rows go as ``discarded``: a push proxy
        records its delivered events whose rows were not deleted yet as ``delivered``."""

    def _release_resources(self) -> None:
        self._wake()

    def _notify_client_async(self) -> None:
        client = None
        try:
            client = self.client_ref()
        except CORBA.Exception:
            return
        if client is None:
            return
        method = getattr(client, self.client_disconnect_op, None)
        if method is None:
            return

        def call() -> None:
            try:
                omniORB.setClientCallTimeout(client, 2000)
                method()
            except (CORBA.Exception, CosEventComm.Disconnected):
                pass

        self.rt.spawn(f"notify-{self.oid}", call)

    client_disconnect_op = ""


class ProxySupplierBase(ProxyBase, DeliveryFailures):
    """Channel → consumer: an ordered queue, filters with the admin's, mapping filters, delivery."""

    side = "C"
    acknowledging = False                         # DeliveryReliability=Acknowledgment (router.channel.ack): True
    t2_state: txdelivery.T2State | None = None    # its routing transactions' bookkeeping (router.channel.txdelivery)
    t2_completer: Completer | None = None         # the phase-two thread of its T2s, made on first use

    def __init__(self, admin: Any, row: ProxyRow) -> None:
        super().__init__(admin, row)
        self.queue = ProxyQueue(*self._queue_policies(), on_drop=self._dropped)
        self.priority_filter: Any = mapping_filter_from_ior(self.rt, self.extra.get("priority_filter"))
        self.lifetime_filter: Any = mapping_filter_from_ior(self.rt, self.extra.get("lifetime_filter"))

    def _queue_policies(self) -> tuple[int, int, int]:
        q = self.qos
        return (int(q.get(CosNotification.OrderPolicy, CosNotification.PriorityOrder)),
                int(q.get(CosNotification.DiscardPolicy, CosNotification.AnyOrder)),
                int(q.get(CosNotification.MaxEventsPerConsumer, 0)))

    def _check_honoured(self, qos: dict[str, Any], requested: frozenset[str] | None = None) -> None:
        txdelivery.check_honoured(self, qos, requested)

    def _qos_changed(self) -> None:
        order, discard, max_events = self._queue_policies()
        self.queue.discard_policy, self.queue.max_events = discard, max_events
        self._wake()
        if order != self.queue.order_policy:
            log.info("proxy %s: new OrderPolicy applies to events queued from now on", self.oid)
            self.queue.order_policy = order

    # -- routing ------------------------------------------------------------------------------------------
    def wants(self, event: Event) -> bool:
        return self.connected and not self.destroyed and self.admin.passes(self.filters, event)

    def enqueue(self, record: Record) -> None:
        """Queue a routed event. A mapping filter that cannot answer does not cost the event its place: it is
        queued with its own priority and lifetime (and the failure logged)."""
        try:
            mapped = self._mapped(record)
        except Exception:
            log.warning("proxy %s: mapping filters failed for event seq=%d; queued with its own priority and "
                        "lifetime", self.oid, record.seq, exc_info=True)
            mapped = record
        self.queue.put(mapped)

    def _mapped(self, record: Record) -> Record:
        """Apply the priority/lifetime mapping filters (the proxy's own override its admin's, NS 2.3.1)."""
        pf = _effective(self.priority_filter, getattr(self.admin, "priority_filter", None))
        lf = _effective(self.lifetime_filter, getattr(self.admin, "lifetime_filter", None))
        if pf is None and lf is None:
            return record

        priority = mapped_priority(self.rt, pf, record) if pf is not None else record.priority
        deadline = mapped_deadline(self.rt, lf, record, time.time()) if lf is not None else record.deadline
        if priority == record.priority and deadline == record.deadline:
            return record
        return proxy_view(record, priority, deadline)

    def _dropped(self, entries: list[Entry], reason: str) -> None:
        log.debug("proxy %s dropped %d event(s): %s", self.oid, len(entries), reason)
        outcome, why = _DROP_OUTCOMES.get(reason, (LedgerOutcome.DISCARDED, reason))
        self._finish(entries, outcome=outcome, reason=why)

    def _finish(self, entries: list[Entry], *, wait: bool = True, outcome: LedgerOutcome = LedgerOutcome.DELIVERED,
                reason: str | None = None, also: Callable[[Any], None] | None = None) -> bool:
        """These entries left the queue for good: ``outcome`` says why (delivered; expired, discarded or
        dead-lettered with a ``reason``), and is what the ledger records in the same unit of work. ``also`` runs
        first in that unit of work (a dead letter's row, :mod:`router.channel.deadletters`).

        The stored rows are deleted first, retried while the database is unavailable (a delivered event whose row
        survived would be delivered again after a restart, never lost); then the records are released. With
        ``wait=False`` (a client's call is waiting) there is one attempt: a :class:`StoreError` propagates and
        nothing is released, so the caller can keep the entries and try again later. Returns False when the rows
        may still be there (the proxy stopped before the database came back)."""
        ids = [e.record.db_id for e in entries if e.record.db_id is not None]
        volatile = self._volatile_ledger(entries)
        acked, be_acked = _delivery_times(entries)

        def unit() -> None:
            with self.rt.db.unit_of_work() as conn:
                if also is not None:
                    also(conn)
                self.rt.store.delete_deliveries(conn, self.channel.id, self.admin.id, self.id, ids,
                                                outcome=outcome, reason=reason, best_effort=volatile,
                                                acknowledged_at=acked, best_effort_acknowledged_at=be_acked)

        work = bool(ids or volatile or also is not None)
        if work and not wait and not self.destroyed:
            unit()
            work = False
        backoff, done = 0.05, True
        while work and not self.destroyed:
            try:
                unit()
                break
            except Exception as exc:  # noqa: BLE001 — e.g. PostgreSQL restarting
                log.warning("proxy %s: could not remove %d %s event(s) from the store (%s); retrying",
                            self.oid, len(entries), outcome, exc)
                if self.stop_event.wait(backoff) or self.rt.shutting_down.is_set():
                    done = False               # stopping: the rows stay and are delivered again after a restart
                    break
                backoff = min(backoff * 2, _MAX_BACKOFF)
        for e in entries:
            e.record.release()
        return done

    def _volatile_ledger(self, entries: list[Entry]) -> list[tuple[int, float]]:
        """(seq, accepted_at) of the BestEffort entries the ledger recorded (``ledger.best_effort``)."""
        if not self.rt.store.ledger.records(persistent=False):
            return []
        out = []
        for e in entries:
            if e.record.db_id is None:
                accepted_at = self.channel.volatile_accepted_at(e.record.seq)
                if accepted_at is not None:
                    out.append((e.record.seq, accepted_at))
        return out

    def _release_resources(self) -> None:
        rest = self.queue.close()
        for e in rest:
            e.record.release()

    def _wake(self) -> None:
        self.queue.wake()

    # -- batching -----------------------------------------------------------------------------------------
    def batch_size(self) -> int:
        if self.form != "SEQUENCE":
            return 1
        return max(1, int(self.qos.get(CosNotification.MaximumBatchSize, 1)))

    def pacing(self) -> float:
        return int(self.qos.get(CosNotification.PacingInterval, 0)) / _TIMET

    def convert(self, entries: list[Entry]) -> Any:
        """The value to hand to the consumer, its text narrowed when its code set needs it (``text_limit``, set by
        :meth:`~router.channel.delivery.DeliveryFailures._narrow_text` after a ``DATA_CONVERSION``)."""
        events = [e.record.event for e in entries]
        if self.form == "ANY":
            value = as_any(events[0])
        elif self.form == "STRUCTURED":
            value = as_structured(events[0])
        else:
            value = [as_structured(ev) for ev in events]
        if self.form != "ANY" and self.rt.store.ledger.route(self.channel.id, "C", self.admin.id, self.id) \
                is not None:                  # a bridge of this node: each event carries its dedupe id
            value = stamped(value, dedupe_ids(self, entries))
        return value if self.text_limit is None else narrow_event(value, self.form, self.text_limit)

    def empty_value(self) -> Any:
        if self.form == "ANY":
            return CORBA.Any(CORBA.TC_null, None)
        if self.form == "STRUCTURED":
            return as_structured(Event(Form.ANY, CORBA.Any(CORBA.TC_null, None)))
        return []

    # -- mapping filters (persisted in extra; applied by _mapped, NS 2.3.1) ---------------------------------
    def _get_priority_filter(self) -> Any:
        return self.priority_filter

    def _set_priority_filter(self, value: Any) -> None:
        self.priority_filter = _nil_to_none(value)
        self.save_extra(priority_filter=ior_or_none(self.rt, self.priority_filter))

    def _get_lifetime_filter(self) -> Any:
        return self.lifetime_filter

    def _set_lifetime_filter(self, value: Any) -> None:
        self.lifetime_filter = _nil_to_none(value)
        self.save_extra(lifetime_filter=ior_or_none(self.rt, self.lifetime_filter))

    def obtain_offered_types(self, mode: Any) -> list[Any]:

        return sharing_of(self.channel).obtain(self, "offer", mode)

    def subscription_change(self, added: list[Any], removed: list[Any]) -> None:

        self.types.change(added, removed)
        sharing_of(self.channel).changed()


def _delivery_times(entries: list[Entry]) -> tuple[dict[int, float], dict[int, float]]:
    """delete_deliveries' ``acknowledged_at`` (by event id) and ``best_effort_acknowledged_at`` (by seq): when
    each delivered entry's call returned."""
    persistent = {e.record.db_id: e.delivered_at for e in entries
                  if e.delivered_at is not None and e.record.db_id is not None}
    volatile = {e.record.seq: e.delivered_at for e in entries if e.delivered_at is not None and e.record.db_id is None}
    return persistent, volatile


def _nil_to_none(ref: Any) -> Any:
    return None if ref is None or CORBA.is_nil(ref) else ref


def _effective(own: Any, admin: Any) -> Any:
    """The proxy's own mapping filter, else its admin's; None when neither is set."""
    return _nil_to_none(own) or _nil_to_none(admin)


def _hands_off(proxy: ProxyBase) -> HandOffProxy:
    """mypy checks here that every proxy is what a hand-off of its channel stops (router.channel.proxyport)."""
    return proxy
