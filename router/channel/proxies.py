"""Proxy servants: the common base, the proxy registry, and the supplier side (NS 3.4.1-3.4.14).

* :class:`ProxyBase` — ids, navigation, QoS, filters, connection state (persisted), suspend/resume, teardown.
* Proxy *suppliers* (channel → consumer) own a :class:`~router.channel.queue.ProxyQueue`. Push proxies run one
  dispatcher thread each, so a slow or dead consumer only delays itself; a failed push keeps the events queued and
  is retried with backoff until the consumer answers, disconnects (``Disconnected``) or no longer exists
  (``OBJECT_NOT_EXIST``), in which case the proxy disconnects itself and is destroyed (NS 3.3.7.1).
* Proxy *consumers* (supplier → channel) live in :mod:`router.channel.consumers`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import omniORB
from omniORB import CORBA

import CosEventChannelAdmin
import CosEventChannelAdmin__POA
import CosEventComm
import CosNotification
import CosNotifyChannelAdmin
import CosNotifyChannelAdmin__POA
import CosNotifyComm

from router.channel import localpush, txdelivery
from router.channel import qos as Q
from router.channel.boundary import MINOR_PULL_WAIT_OVER, Outcome, store_boundary_all
from router.channel.common import (
    FilterMixin,
    FilterSet,
    QoSMixin,
    ior_or_none,
    mapping_filter_from_ior,
    raise_unsupported_qos,
)
from router.channel.delivered import FLUSH_AGE, FLUSH_EVENTS
from router.channel.delivery import DeliveryFailures
from router.channel.events import Event, Form, as_any, as_structured
from router.channel.inflight import STUCK_REASON, Flight
from router.channel.queue import Entry, ProxyQueue, Record
from router.channel.runtime import proxy_oid
from router.channel.store import ProxyRow, StoreError
from router.channel.typesets import TypeSet
from router.ledger import Outcome as LedgerOutcome

__all__ = ["ProxyBase", "ProxySupplierBase", "proxy_class"]

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
        self.filters = FilterSet(self.rt.resolve, row.filters.get("forwarding"), local=self.rt.local_servant)
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

    def _connect(self, client: Any, *, required: bool) -> None:
        """Record the client (nil allowed unless required); AlreadyConnected if one is connected."""
        with self._lock:
            self._check_alive()
            if self.closing:                    # a teardown that failed on the store: it must be finished first
                raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)
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
            if not self.connected:
                raise CosNotifyChannelAdmin.NotConnected()
            if self.suspended:
                raise CosNotifyChannelAdmin.ConnectionAlreadyInactive()
            self._update(suspended=True)
            self.suspended = True

    def resume_connection(self) -> None:
        with self._lock:
            self._check_alive()
            if not self.connected:
                raise CosNotifyChannelAdmin.NotConnected()
            if not self.suspended:
                raise CosNotifyChannelAdmin.ConnectionAlreadyActive()
            self._update(suspended=False)
            self.suspended = False
        self._wake()

    def _wake(self) -> None:
        """Wake the worker (queue or pull loop)."""

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
            from router.channel.sharing import sharing_of

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
        from router.channel.filters import mapped_deadline, mapped_priority, proxy_view

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
                reason: str | None = None) -> bool:
        """These entries left the queue for good: ``outcome`` says why (delivered; expired, discarded or
        dead-lettered with a ``reason``), and is what the ledger records in the same unit of work.

        The stored rows are deleted first, retried while the database is unavailable (a delivered event whose row
        survived would be delivered again after a restart, never lost); then the records are released. With
        ``wait=False`` (a client's call is waiting) there is one attempt: a :class:`StoreError` propagates and
        nothing is released, so the caller can keep the entries and try again later. Returns False when the rows
        may still be there (the proxy stopped before the database came back)."""
        ids = [e.record.db_id for e in entries if e.record.db_id is not None]
        volatile = self._volatile_ledger(entries)
        acked, be_acked = _delivery_times(entries)
        if (ids or volatile) and not wait and not self.destroyed:
            with self.rt.db.unit_of_work() as conn:
                self.rt.store.delete_deliveries(conn, self.channel.id, self.admin.id, self.id, ids,
                                                outcome=outcome, reason=reason, best_effort=volatile,
                                                acknowledged_at=acked, best_effort_acknowledged_at=be_acked)
            ids, volatile = [], []
        backoff, done = 0.05, True
        while (ids or volatile) and not self.destroyed:
            try:
                with self.rt.db.unit_of_work() as conn:
                    self.rt.store.delete_deliveries(conn, self.channel.id, self.admin.id, self.id, ids,
                                                    outcome=outcome, reason=reason, best_effort=volatile,
                                                    acknowledged_at=acked, best_effort_acknowledged_at=be_acked)
                break
            except Exception as exc:  # noqa: BLE001 — e.g. PostgreSQL restarting
                log.warning("proxy %s: could not remove %d delivered event(s) from the store (%s); retrying",
                            self.oid, len(ids), exc)
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
        events = [e.record.event for e in entries]
        if self.form == "ANY":
            return as_any(events[0])
        if self.form == "STRUCTURED":
            return as_structured(events[0])
        return [as_structured(ev) for ev in events]

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
        from router.channel.sharing import sharing_of

        return sharing_of(self.channel).obtain(self, "offer", mode)

    def subscription_change(self, added: list[Any], removed: list[Any]) -> None:
        from router.channel.sharing import sharing_of

        self.types.change(added, removed)
        sharing_of(self.channel).changed()


def _delivery_times(entries: list[Entry]) -> tuple[dict[int, float], dict[int, float]]:
    """delete_deliveries' ``acknowledged_at`` (by event id) and ``best_effort_acknowledged_at`` (by seq): when
    each delivered entry's call returned."""
    persistent = {e.record.db_id: e.delivered_at for e in entries
                  if e.delivered_at is not None and e.record.db_id is not None}
    volatile = {e.record.seq: e.delivered_at for e in entries if e.delivered_at is not None and e.record.db_id is None}
    return persistent, volatile


class PushSupplierMixin(ProxySupplierBase):
    """Push delivery: one dispatcher thread per proxy.

    Delivered events leave the store in batches: their ids go to the proxy's journal at once and their queue
    rows are deleted by one commit for many deliveries (:mod:`router.channel.delivered`; without a journal, e.g.
    in unit tests without a state directory, each delivery is deleted at once)."""

    connect_declares_type_error = True          # connect_*_push_consumer declares TypeError (NS 3.4)

    push_op = ""
    failing: str | None = None
    failed_attempts = 0
    _journal: Any = None                  # router.channel.delivered.ProxyJournal of the delivery thread
    _pending: list[Entry] | None = None   # delivered and journaled, queue rows not deleted yet
    _pending_since = 0.0
    _journal_off = False                  # the journal failed beyond repair: each delivery commits at once
    _undeleted: tuple[int, ...] = ()      # delivered, records released, a flush could not delete their rows
    _pending_lock = threading.RLock()     # per proxy (__init__); this default serves proxies built bare in tests

    _flight: Flight[Entry] | None = None          # the push in flight (router.channel.inflight), vs a teardown
    _stuck: tuple[Entry, ...] = ()         # in flight when the teardown stopped waiting for the push

    def __init__(self, admin: Any, row: ProxyRow) -> None:
        super().__init__(admin, row)
        self._pending_lock = threading.RLock()   # _pending/_undeleted: the delivery thread vs a teardown
        self._flight = Flight[Entry]()

    def start(self) -> None:
        if self.connected and not self.destroyed:
            self.rt.spawn(f"push-{self.oid}", self.supervised(self._push_loop))

    def _ready(self, since: float | None) -> tuple[int, float | None]:
        """How many entries to take now, and when the current partial batch started (sequence pacing)."""
        count = self.queue.peek_count()
        size = self.batch_size()
        if count >= size:
            return size, None
        if count == 0:
            return 0, None
        pacing = self.pacing()
        if self.form != "SEQUENCE" or pacing <= 0:    # PacingInterval 0: no time spent collecting (NS 2.5.5)
            return count, None
        started = since if since is not None else time.time()
        return (count, None) if time.time() - started >= pacing else (0, started)

    def _push_loop(self) -> None:
        try:
            self._push_until_stopped()
        finally:
            txdelivery.drain(self)         # the phase two of T2s this loop decided (txdelivery.Completer)
            self._flush_delivered(closing=True)

    def _push_until_stopped(self) -> None:
        backoff, since = 0.05, None
        while not (self.stop_event.is_set() or self.rt.shutting_down.is_set()):
            if self.suspended or not self.connected:
                self._flush_delivered()
                self.queue.wait(_IDLE_WAIT)
                continue
            n, since = self._ready(since)
            entries = self.queue.take(self._batch_limit(n), self.rt.max_event_bytes) if n else []
            if not entries:
                self._flush_delivered()
                self.queue.wait(self._idle_wait(since))
                continue
            outcome = self._deliver(entries)
            if outcome is Outcome.GONE:
                return
            if outcome is Outcome.DELIVERED:
                backoff = 0.05
            else:
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)

    def _idle_wait(self, since: float | None) -> float:
        wait = _IDLE_WAIT
        due = self.queue.next_due()
        if due is not None:
            wait = min(wait, max(0.001, due - time.time()))
        if since is not None:
            wait = min(wait, max(0.001, since + self.pacing() - time.time()))
        return wait

    def _check_transactional_client(self, client: Any) -> None:
        reason = txdelivery.client_refused(self, client)
        if reason is not None:
            log.info("proxy %s: connect refused: EnableTransaction is TRUE on this proxy but %s", self.oid, reason)
            raise CosEventChannelAdmin.TypeError()

    def _deliver(self, entries: list[Entry]) -> Outcome:
        """:meth:`_deliver_now`, marked in flight so a teardown waits for its end (router.channel.inflight); once a
        teardown began nothing is pushed (the entries go back; the teardown records them with the queue)."""
        flight = self._flight
        if flight is None:                       # a proxy built bare (tests)
            return self._deliver_now(entries)
        if not flight.begin(list(entries), lambda: bool(self.closing or self.destroyed)):
            self.queue.requeue(entries)
            return Outcome.GONE
        try:
            return self._deliver_now(entries)
        finally:
            flight.end()

    def _deliver_now(self, entries: list[Entry]) -> Outcome:
        """One attempt to push ``entries``; whatever happens, each entry is delivered, put back or dead-lettered.

        An unexpected (non-CORBA) error puts the entries back before it propagates to :meth:`supervised`, which
        restarts the loop: a failing worker never drops what it took. With EnableTransaction and a bridge of this
        node as the consumer, the batch runs in a routing transaction instead (router.channel.txdelivery); with such
        a bridge and no routing transaction, batches go to it in-process (router.channel.localpush)."""
        target = txdelivery.participant(self)
        if target is not None:
            self._flush_delivered()
            return txdelivery.deliver(self, target, entries)
        batches = localpush.target(self)
        if batches is not None:            # a bridge of this node: batched, pipelined, in-process
            return localpush.deliver(self, batches, entries)
        try:
            outcome, exc = self._attempt(entries)
        except BaseException:
            self.queue.requeue(entries)
            raise
        if outcome is Outcome.DELIVERED:
            self.failing, self.failed_attempts = None, 0
            self._delivered_one_batch()
            self._delivered(entries)
            return outcome
        self._flush_delivered()            # the store is exact before a put-back, a teardown or a dead letter
        if outcome is Outcome.GONE:
            log.info("proxy %s: consumer gone (%s); disconnecting", self.oid, type(exc).__name__)
            self.queue.requeue(entries)
            self.teardown(notify_client=False, retry=True)
        elif outcome is Outcome.RETRY:
            # NS 2.5.5.1: keep retrying until the consumer answers or no longer exists; nothing is dropped. A
            # consumer that keeps refusing shows in `nsjms status` (failing, attempts) and in the log.
            self.failing, self.failed_attempts = f"{type(exc).__name__}: {exc}", self.failed_attempts + 1
            log.warning("proxy %s: push failed (%s, attempt %d); %d event(s) stay queued", self.oid, exc,
                        self.failed_attempts, len(entries))
            self.queue.requeue(entries)
        else:
            assert exc is not None
            self._content_failed(entries, exc)
        return outcome

    def _delivered(self, entries: list[Entry]) -> None:
        """The consumer's call returned: journal the events and delete their rows with later deliveries', or (no
        journal, or it cannot be written) delete them now."""
        now = time.time()
        for e in entries:
            e.delivered_at = now                # the ledger's acknowledged_at, whenever the row is deleted
        journal = self._journal_of_thread()
        if journal is None:
            self._finish(entries)
            return
        try:
            journal.record((e.record.db_id for e in entries if e.record.db_id is not None), now)
        except OSError as exc:
            log.warning("proxy %s: could not write its delivered-events journal (%s); deleting at once", self.oid,
                        exc)
            if journal.unusable:
                self._journal_off = True       # it could not be cut back: each delivery commits from now on
            self._flush_delivered()
            self._finish(entries)
            return
        with self._pending_lock:
            if not self._pending:
                self._pending, self._pending_since = [], time.monotonic()
            self._pending.extend(entries)
            full = len(self._pending) >= FLUSH_EVENTS or time.monotonic() - self._pending_since >= FLUSH_AGE
        # A BestEffort event the ledger records has no row to journal: its delivered row is written now (with
        # the pending ones), so a crash cannot leave a delivered event looking lost to the audit.
        if full or (any(e.record.db_id is None for e in entries) and self._volatile_ledger(entries)):
            self._flush_delivered()

    def _journal_of_thread(self) -> Any:
        if self._journal_off:
            return None
        if self._journal is None:
            journals = getattr(self.rt, "delivered", None)
            if journals is None:
                return None
            try:
                self._journal = journals.open(self.channel.id, self.admin.id, self.id)
            except OSError as exc:
                log.warning("proxy %s: no delivered-events journal (%s); each delivery commits", self.oid, exc)
                return None
        return self._journal

    def _flush_delivered(self, *, closing: bool = False) -> None:
        """Delete the pending delivered events' rows in one commit, then empty the journal. ``closing`` (the
        delivery thread ends): the journal is closed too, and removed if the proxy is gone.

        Under ``_pending_lock``, so a teardown sees either the pending events or their rows deleted; ids whose
        delete did not happen (the proxy stopped while the database was down) stay in ``_undeleted`` for the
        teardown, which deletes them as ``delivered`` before the proxy's other rows go as ``discarded``."""
        with self._pending_lock:
            pending, self._pending = self._pending, None
            done = self._finish(pending) if pending else True
            if not done and pending:
                self._undeleted += tuple(e.record.db_id for e in pending if e.record.db_id is not None)
        journal = self._journal
        if journal is not None and done:
            journal.clear()
        if closing and journal is not None:
            self._journal = None
            journal.close(remove=self.destroyed and done)

    def _delete_row(self, retry: bool) -> None:
        """The teardown's delete, with the delivered events not yet deleted recorded as ``delivered`` in the same
        unit of work (not ``discarded`` with the proxy's other rows), and the proxy's journal removed. A push in
        flight is waited for first (bounded by the push's call timeout): what it delivered is then among them."""
        if self._flight is not None:
            wait_s = getattr(self.rt, "push_timeout_ms", 10_000) / 1000.0 + 2.0      # inflight.teardown_bound_s
            deadline = getattr(self, "_teardown_deadline", None)     # one for all proxies of a destroy (inflight)
            if deadline is not None:
                wait_s = max(0.0, min(wait_s, deadline - time.monotonic()))
            self._stuck = tuple(self._flight.wait_ended(wait_s))
            if self._stuck:
                log.warning("proxy %s: destroyed while a push of %d event(s) did not end within %g s; recorded as "
                            "discarded with that reason (the consumer may have received them)", self.oid,
                            len(self._stuck), wait_s)
        with self._pending_lock:
            super()._delete_row(retry)
            pending, self._pending, self._undeleted = self._pending, None, ()
        for e in pending or ():
            e.record.release()
        journals = getattr(self.rt, "delivered", None)
        if journals is not None:
            journals.remove(self.channel.id, self.admin.id, self.id)

    def _deliveries_before_delete(self, conn: Any) -> None:
        stuck = [e.record.db_id for e in self._stuck if e.record.db_id is not None]
        if stuck:
            self.rt.store.delete_deliveries(conn, self.channel.id, self.admin.id, self.id, stuck,
                                            outcome=LedgerOutcome.DISCARDED, reason=STUCK_REASON)
        pending = self._pending or []
        ids = [e.record.db_id for e in pending if e.record.db_id is not None] + list(self._undeleted)
        volatile = self._volatile_ledger(pending)
        acked, be_acked = _delivery_times(pending)
        if ids or volatile:
            self.rt.store.delete_deliveries(conn, self.channel.id, self.admin.id, self.id, ids,
                                            best_effort=volatile, acknowledged_at=acked,
                                            best_effort_acknowledged_at=be_acked)

    def status_extra(self) -> dict[str, Any]:
        failing = {"failing": self.failing, "attempts": self.failed_attempts} if self.failing else {}
        return {**failing, **self.dead_letter_status(), **txdelivery.status(self)}


class PullSupplierMixin(ProxySupplierBase):
    """Pull delivery: the consumer calls ``pull*`` (blocking) or ``try_pull*``.

    A pulled event leaves the in-memory queue at once, but its stored row stays until a later pull confirms it: a
    pull confirms only the entries of pulls whose reply had been built before it started (a request that arrives
    after a reply was built shows that reply went out). A crash in between therefore redelivers the last pulled
    events after the restart instead of losing them: pull delivery of persistent events is at-least-once, with at
    most one pull's worth of duplicates per consumer and crash.

    A blocking pull waits at most :attr:`max_pull_wait` seconds (shorter than the ORBs' client call timeouts), then
    answers ``TRANSIENT`` (``COMPLETED_NO``, nothing taken) and the client pulls again: a pull the client abandoned
    never takes an event whose reply nobody reads.
    """

    max_pull_wait = _MAX_PULL_WAIT

    def __init__(self, admin: Any, row: ProxyRow) -> None:
        super().__init__(admin, row)
        self._unconfirmed: list[Entry] = []     # handed out by pulls whose reply was built; the next pull confirms
        self._pull_lock = threading.Lock()
        self._pulls_ended = threading.Condition(self._pull_lock)   # a teardown waits for the pulls in progress
        self._pulls_active = 0

    def _begin_pull(self) -> None:
        """Confirm what the pulls finished before this one handed out (their replies were built, and this request
        comes after them); the entries of pulls still in progress are not in ``_unconfirmed`` yet."""
        with self._pull_lock:
            done, self._unconfirmed = self._unconfirmed, []
            self._pulls_active += 1
        if not done:
            return
        try:
            self._finish(done, wait=False)      # never block a client's pull on the database
        except StoreError:
            with self._pull_lock:               # still unconfirmed: the next pull tries again
                self._unconfirmed = done + self._unconfirmed
                self._pulls_active -= 1
                self._pull_ended()
            raise                               # TRANSIENT at the servant boundary: the client pulls again

    def _end_pull(self, handed: list[Entry]) -> None:
        """The pull's reply is built: from now on its entries may be confirmed by the next pull."""
        with self._pull_lock:
            self._pulls_active -= 1
            self._pull_ended()
            if not self.destroyed:
                self._unconfirmed.extend(handed)
                handed = []
        for e in handed:                        # the proxy went away meanwhile: its rows are gone with it
            e.record.release()

    _pulls_ended: threading.Condition | None = None    # per proxy (__init__); None for proxies built bare in tests

    def _pull_ended(self) -> None:
        """Under ``_pull_lock``: wake a teardown waiting for the pulls in progress."""
        if self._pulls_ended is not None:
            self._pulls_ended.notify_all()

    def _delete_row(self, retry: bool) -> None:
        """The teardown's delete: the pulls in progress end first (a blocking one sees the proxy disconnected at
        once; bounded by the pull's own limit), so what they hand out is among the entries handed out."""
        if self._pulls_ended is not None:
            with self._pull_lock:
                self._pulls_ended.wait_for(lambda: self._pulls_active == 0, self.max_pull_wait + 2.0)
        super()._delete_row(retry)

    def _deliveries_before_delete(self, conn: Any) -> None:
        """Entries handed out by pulls whose reply was built are recorded ``delivered``, not ``discarded`` with the
        proxy's queued events: the teardown comes after those replies went out, which is what a next pull would
        have taken as their confirmation (the class docstring)."""
        with self._pull_lock:
            handed = list(self._unconfirmed)
        ids = [e.record.db_id for e in handed if e.record.db_id is not None]
        if ids:
            self.rt.store.delete_deliveries(conn, self.channel.id, self.admin.id, self.id, ids)

    def _release_resources(self) -> None:
        with self._pull_lock:
            pending, self._unconfirmed = self._unconfirmed, []
        for e in pending:
            e.record.release()
        super()._release_resources()

    def _check_pullable(self) -> None:
        self._check_alive()
        if not self.connected:
            raise CosEventComm.Disconnected()

    def _blocking_take(self, want: Callable[[], int]) -> list[Entry]:
        """Begin a pull and wait for entries. The pull stays in progress (its entries cannot be confirmed) until
        :meth:`_end_pull`, once its reply is built; on an exception it ends here, having taken nothing."""
        self._begin_pull()
        try:
            return self._blocking_wait(want)
        except BaseException:
            self._end_pull([])
            raise

    def _blocking_wait(self, want: Callable[[], int]) -> list[Entry]:
        started = time.time()
        give_up = time.monotonic() + self.max_pull_wait
        while True:
            self._check_pullable()
            if self.rt.shutting_down.is_set():
                raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)
            if not self.suspended:
                n = want()
                count = self.queue.peek_count()
                pacing = self.pacing()
                if count >= n or (count and time.time() - started >= pacing):
                    entries: list[Entry] = self.queue.take(self._batch_limit(n), self.rt.max_event_bytes)
                    if entries:
                        return entries
            left = give_up - time.monotonic()
            if left <= 0:                       # answer before the client's call timeout abandons the pull
                raise CORBA.TRANSIENT(MINOR_PULL_WAIT_OVER, CORBA.COMPLETED_NO)
            self.queue.wait(min(_IDLE_WAIT, left))

    def _try_take(self, n: int) -> list[Entry]:
        """Begin a pull and take what is there (see :meth:`_blocking_take`)."""
        self._begin_pull()
        try:
            self._check_pullable()
            if self.suspended:
                return []
            taken: list[Entry] = self.queue.take(self._batch_limit(n), self.rt.max_event_bytes)
            return taken
        except BaseException:
            self._end_pull([])
            raise

    def _serve(self, entries: list[Entry]) -> tuple[Any, bool]:
        """Build the reply to a pull begun by ``_blocking_take``/``_try_take`` and end that pull."""
        handed: list[Entry] = []
        try:
            if not entries:
                return self.empty_value(), False
            value = self._hand_out(entries)
            handed = entries
            return value, True
        finally:
            self._end_pull(handed)

    def _pull(self, want: Callable[[], int]) -> Any:
        return self._serve(self._blocking_take(want))[0]

    def _try_pull(self, n: int) -> tuple[Any, bool]:
        return self._serve(self._try_take(n))

    def _hand_out(self, entries: list[Entry]) -> Any:
        """The reply to a pull. If converting the entries fails, they are handled as a content failure (never
        counted as handed out); the consumer gets TRANSIENT and pulls again."""
        try:
            value = self.convert(entries)
        except Exception as exc:
            self._content_failed(entries, exc)
            raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO) from exc
        self._delivered_one_batch()
        return value

    def status_extra(self) -> dict[str, Any]:
        return self.dead_letter_status()

    def _limit(self, max_number: int) -> int:
        size = self.batch_size()
        return size if max_number <= 0 else min(max_number, size)


# ----------------------------------------------------------------------------------------------------------
# Concrete proxy suppliers
# ----------------------------------------------------------------------------------------------------------
class ProxyPushSupplierImpl(PushSupplierMixin, CosNotifyChannelAdmin__POA.ProxyPushSupplier):
    client_iface = CosEventComm.PushConsumer
    push_op = "push"
    client_disconnect_op = "disconnect_push_consumer"

    def connect_any_push_consumer(self, push_consumer: Any) -> None:
        self._connect(push_consumer, required=True)

    def disconnect_push_supplier(self) -> None:
        self.client_disconnected()


class StructuredProxyPushSupplierImpl(PushSupplierMixin, CosNotifyChannelAdmin__POA.StructuredProxyPushSupplier):
    client_iface = CosNotifyComm.StructuredPushConsumer
    push_op = "push_structured_event"
    client_disconnect_op = "disconnect_structured_push_consumer"

    def connect_structured_push_consumer(self, push_consumer: Any) -> None:
        self._connect(push_consumer, required=True)

    def disconnect_structured_push_supplier(self) -> None:
        self.client_disconnected()


class SequenceProxyPushSupplierImpl(PushSupplierMixin, CosNotifyChannelAdmin__POA.SequenceProxyPushSupplier):
    client_iface = CosNotifyComm.SequencePushConsumer
    push_op = "push_structured_events"
    client_disconnect_op = "disconnect_sequence_push_consumer"

    def connect_sequence_push_consumer(self, push_consumer: Any) -> None:
        self._connect(push_consumer, required=True)

    def disconnect_sequence_push_supplier(self) -> None:
        self.client_disconnected()


class ProxyPullSupplierImpl(PullSupplierMixin, CosNotifyChannelAdmin__POA.ProxyPullSupplier):
    client_iface = CosEventComm.PullConsumer
    client_disconnect_op = "disconnect_pull_consumer"

    def connect_any_pull_consumer(self, pull_consumer: Any) -> None:
        self._connect(pull_consumer, required=False)

    def pull(self) -> Any:
        return self._pull(lambda: 1)

    def try_pull(self) -> tuple[Any, bool]:
        return self._try_pull(1)

    def disconnect_pull_supplier(self) -> None:
        self.client_disconnected()


class StructuredProxyPullSupplierImpl(PullSupplierMixin, CosNotifyChannelAdmin__POA.StructuredProxyPullSupplier):
    client_iface = CosNotifyComm.StructuredPullConsumer
    client_disconnect_op = "disconnect_structured_pull_consumer"

    def connect_structured_pull_consumer(self, pull_consumer: Any) -> None:
        self._connect(pull_consumer, required=False)

    def pull_structured_event(self) -> Any:
        return self._pull(lambda: 1)

    def try_pull_structured_event(self) -> tuple[Any, bool]:
        return self._try_pull(1)

    def disconnect_structured_pull_supplier(self) -> None:
        self.client_disconnected()


class SequenceProxyPullSupplierImpl(PullSupplierMixin, CosNotifyChannelAdmin__POA.SequenceProxyPullSupplier):
    client_iface = CosNotifyComm.SequencePullConsumer
    client_disconnect_op = "disconnect_sequence_pull_consumer"

    def connect_sequence_pull_consumer(self, pull_consumer: Any) -> None:
        self._connect(pull_consumer, required=False)

    def pull_structured_events(self, max_number: int) -> list[Any]:
        events: list[Any] = self._pull(lambda: self._limit(max_number))
        return events

    def try_pull_structured_events(self, max_number: int) -> tuple[list[Any], bool]:
        events: tuple[list[Any], bool] = self._try_pull(self._limit(max_number))
        return events

    def disconnect_sequence_pull_supplier(self) -> None:
        self.client_disconnected()


def _nil_to_none(ref: Any) -> Any:
    return None if ref is None or CORBA.is_nil(ref) else ref


def _effective(own: Any, admin: Any) -> Any:
    """The proxy's own mapping filter, else its admin's; None when neither is set."""
    return _nil_to_none(own) or _nil_to_none(admin)


def proxy_class(side: str, kind: str, es_style: bool = False) -> type:
    """The servant class for a proxy kind (a ``ProxyType`` name) on one side of the channel.

    Event-Service-style proxies (``obtain_push_supplier`` etc.) get ``CosEventChannelAdmin`` servants: the NS
    proxy interfaces do not inherit the Event Service ones (NS 3.4), so a client narrowing to
    ``CosEventChannelAdmin::ProxyPushSupplier`` needs an object of that type.
    """
    from router.channel.consumers import CONSUMER_CLASSES, ES_CONSUMER_CLASSES

    if es_style:
        table = ES_SUPPLIER_CLASSES if side == "C" else ES_CONSUMER_CLASSES
    else:
        table = SUPPLIER_CLASSES if side == "C" else CONSUMER_CLASSES
    try:
        return table[kind]
    except KeyError:
        raise ValueError(f"unknown proxy kind {kind!r} on side {side!r} (es_style={es_style})") from None


class EsProxyPushSupplierImpl(PushSupplierMixin, CosEventChannelAdmin__POA.ProxyPushSupplier):
    """Event Service ProxyPushSupplier (no id; Any events)."""

    client_iface = CosEventComm.PushConsumer
    push_op = "push"
    client_disconnect_op = "disconnect_push_consumer"

    def connect_push_consumer(self, push_consumer: Any) -> None:
        if push_consumer is None or CORBA.is_nil(push_consumer):
            raise CORBA.BAD_PARAM(0, CORBA.COMPLETED_NO)
        self._connect(push_consumer, required=True)

    def disconnect_push_supplier(self) -> None:
        self.client_disconnected()


class EsProxyPullSupplierImpl(PullSupplierMixin, CosEventChannelAdmin__POA.ProxyPullSupplier):
    """Event Service ProxyPullSupplier (no id; Any events)."""

    client_iface = CosEventComm.PullConsumer
    client_disconnect_op = "disconnect_pull_consumer"

    def connect_pull_consumer(self, pull_consumer: Any) -> None:
        self._connect(pull_consumer, required=False)

    def pull(self) -> Any:
        return self._pull(lambda: 1)

    def try_pull(self) -> tuple[Any, bool]:
        return self._try_pull(1)

    def disconnect_pull_supplier(self) -> None:
        self.client_disconnected()


ES_SUPPLIER_CLASSES: dict[str, type] = {"PUSH_ANY": EsProxyPushSupplierImpl, "PULL_ANY": EsProxyPullSupplierImpl}


SUPPLIER_CLASSES: dict[str, type] = {
    "PUSH_ANY": ProxyPushSupplierImpl,
    "PUSH_STRUCTURED": StructuredProxyPushSupplierImpl,
    "PUSH_SEQUENCE": SequenceProxyPushSupplierImpl,
    "PULL_ANY": ProxyPullSupplierImpl,
    "PULL_STRUCTURED": StructuredProxyPullSupplierImpl,
    "PULL_SEQUENCE": SequenceProxyPullSupplierImpl,
}


store_boundary_all([SUPPLIER_CLASSES, ES_SUPPLIER_CLASSES])
