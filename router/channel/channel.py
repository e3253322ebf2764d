"""EventChannelFactory and EventChannel servants, and the routing of events inside a channel (NS 3.4.17-18).

Routing (:meth:`EventChannelImpl.route`): per-event QoS from the header (BAD_QOS on bad values), filtering at the
proxy consumer and its SupplierAdmin, admission against MaxQueueLength (IMP_LIMIT or DiscardPolicy), fan-out to
every connected proxy supplier whose filters pass, and, for persistent events, one database transaction holding
the events and their queue rows *before* the supplier's call returns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from omniORB import CORBA

import CosNotification
import CosNotifyChannelAdmin
import CosNotifyChannelAdmin__POA

from router import telemetry
from router.channel import qos as Q
from router.channel.ack import activate_status
from router.channel.admins import ConsumerAdminImpl, SupplierAdminImpl
from router.channel.boundary import MINOR_EVENT_TOO_DEEP, check_size, store_boundary
from router.channel.common import QoSMixin, ids_of, raise_unsupported_qos
from router.channel.events import Event, Form, decode, encode, jms_message_id
from router.channel.filters import ChannelFilterFactory, FilterFactoryImpl, filter_factory_oid
from router.channel.gate import Gate
from router.channel.inflight import stopped_pushing
from router.channel.loading import LoadFailed, drop_created, load
from router.channel.proxyport import ConsumerView, ProxyView, QueueTarget
from router.channel.queue import Entry, Record, choose_victim
from router.channel.runtime import FACTORY_KEY, Runtime, channel_oid
from router.channel.sharing import sharing_of
from router.channel.sizing import EventTooDeep, check_depth, size_bound
from router.channel.store import AdminRow, ChannelRow, NewEvent
from router.cluster.forward import cluster_ids
from router.quotas import check_admins, check_channels

__all__ = ["EventChannelFactoryImpl", "EventChannelImpl", "LoadFailed", "RoutePlan"]

log = logging.getLogger("nsjms.channel")

_TIMET_PER_SECOND = 10_000_000


@dataclass
class RoutePlan:
    """What :meth:`EventChannelImpl.plan_in` decided: events with their target proxies, CDR bodies, and how many
    queued events the DiscardPolicy must discard to make room."""

    plans: list[tuple[Record, list[QueueTarget]]] = field(default_factory=list)
    bodies: dict[int, bytes] = field(default_factory=dict)
    overflow: int = 0
    source: ProxyView | None = None      # the proxy consumer the events came from (ledger origin)
    now: float = 0.0                     # when the channel accepted them (the ledger's accepted_at)
    volatile: list[int] = field(default_factory=list)   # BestEffort seqs the ledger recorded (set by store_in)


class EventChannelFactoryImpl(CosNotifyChannelAdmin__POA.EventChannelFactory):
    """The node's single factory; its channels are loaded from the store at start."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._lock = threading.RLock()
        self.channels: dict[int, EventChannelImpl] = {}
        self.arriving: set[int] = set()     # claimed from a dead node, not loaded yet (router/cluster/takeover.py)
        self.ref: Any = None
        self.filter_factory: Any = None
        self.filter_factory_ref: Any = None

    def activate(self) -> Any:

        self.filter_factory = FilterFactoryImpl(self.rt)
        self.filter_factory_ref = self.filter_factory.activate()
        self.filter_factory.on_change = self._constraints_changed
        activate_status(self.rt)
        self.rt.ins_poa.activate_object_with_id(FACTORY_KEY.encode(), self)
        self.ref = self.rt.ins_poa.id_to_reference(FACTORY_KEY.encode())
        return self.ref

    def restore(self, only: Collection[int] | None = None) -> None:
        """Re-create every stored channel (``only``: those ids, the channels this node owns in a cluster) with its
        admins, proxies and queued persistent events."""
        with self.rt.db.unit_of_work() as conn:
            self.rt.set_seq_floor(self.rt.store.max_seq(conn))
        journals = getattr(self.rt, "delivered", None)
        if journals is not None:
            # delivered before a crash: not queued again. A node restores its bridges first (server.py), so the
            # ledger rows of a bridge's proxy carry the bridge's route.
            journals.replay(self.rt.db, self.rt.store)
        if self.filter_factory is not None:        # before the channels: their filter references name these
            self.filter_factory.restore(only)
        with self.rt.db.unit_of_work() as conn:
            crows = self.rt.store.load_channels(conn)
        for row in crows:
            if only is not None and row.id not in only:
                continue
            load(self, row.id, partial(EventChannelImpl, self, row))     # all or nothing (loading.py)
        log.info("restored %d channel(s)", len(self.channels))

    def arrive(self, ids: Collection[int]) -> None:
        """Channels this node has just claimed from a dead node and will load: until :meth:`adopt` loads each,
        ``get_event_channel`` answers TRANSIENT (retry) for it, not ChannelNotFound (which a client may act on)."""
        with self._lock:
            self.arriving |= set(ids) - set(self.channels)
        self.rt.forwarder.invalidate()          # their owner is this node now (router/cluster/forward.py)

    def adopt(self, ids: Collection[int]) -> list[int]:
        """Load channels this node took over from a dead node or by a hand-off (router/cluster/takeover.py) as
        :meth:`restore` does; returns the ids loaded (those not already here). Each channel is loaded all or nothing
        (router/channel/loading.py): one that fails is undone and stays ``arriving`` (clients are told to retry)
        while the others are loaded; then :class:`LoadFailed` says which, and the caller loads them again later."""
        with self.rt.db.unit_of_work() as conn:
            self.rt.raise_seq_floor(self.rt.store.max_seq(conn))
            crows = [r for r in self.rt.store.load_channels(conn) if r.id in ids]
        if self.filter_factory is not None:        # their filters, as they are now (made after this node started)
            self.filter_factory.restore(ids)
        loaded: list[int] = []
        failed: list[int] = []
        for row in crows:
            with self._lock:
                if row.id in self.channels:
                    continue
            try:
                load(self, row.id, partial(EventChannelImpl, self, row))
            except Exception:
                log.exception("channel %d: loading it failed; undone, it is loaded again at the next period", row.id)
                failed.append(row.id)
                continue
            loaded.append(row.id)
            with self._lock:
                self.arriving.discard(row.id)
        with self._lock:                         # loaded, or gone from the database meanwhile (destroyed): not found,
            self.arriving -= set(ids) - set(failed)      # not retry; a failed one: retry
        log.info("took over %d channel(s): %s", len(loaded), loaded)
        if failed:
            raise LoadFailed(loaded, failed)
        return loaded

    # -- IDL ----------------------------------------------------------------------------------------------
    def create_channel(self, initial_qos: list[Any], initial_admin: list[Any]) -> tuple[Any, int]:
        try:
            qos = Q.apply_qos(Q.channel_defaults(), [(p.name, p.value) for p in initial_qos],
                              Q.Target(Q.Level.CHANNEL), Q.Context(has_children=False, parent=None))
        except Q.QoSError as exc:
            raise_unsupported_qos(exc)
        try:
            admin = Q.apply_admin(Q.admin_defaults(), [(p.name, p.value) for p in initial_admin])
        except Q.AdminError as exc:
            raise CosNotification.UnsupportedAdmin(Q.to_property_errors(exc.problems)) from exc
        with self._lock:
            check_channels(self.rt.limits, self)
            default_admin_qos = {"C": Q.inherit(qos, Q.Target(Q.Level.CONSUMER_ADMIN)),
                                 "S": Q.inherit(qos, Q.Target(Q.Level.SUPPLIER_ADMIN))}
            with self.rt.db.unit_of_work() as conn:
                cid = self.rt.store.next_channel_id(conn)
                self.rt.store.insert_channel(conn, cid, qos, admin, default_admin_qos)
                if self.rt.owner is not None:       # a cluster member owns what it creates (docs/cluster.md)
                    self.rt.owner.assign(conn, "channel", cid)
            row = ChannelRow(cid, qos, admin, 1, 1)
            try:
                channel = load(self, cid, partial(EventChannelImpl, self, row))   # all or nothing (loading.py)
            except Exception:
                drop_created(self.rt, cid)
                raise
        return channel.ref, cid

    def _constraints_changed(self) -> None:

        with self._lock:
            channels = list(self.channels.values())
        for channel in channels:
            sharing_of(channel).changed()

    def get_all_channels(self) -> list[int]:
        """Every channel of the cluster, not only this node's (NS 3.4.18.2; router/cluster/forward.py)."""
        with self._lock:
            here = list(self.channels)
        return cluster_ids(self.rt.db, "channel", here)

    def get_event_channel(self, id: int) -> Any:  # noqa: A002
        with self._lock:
            channel = self.channels.get(id)
            arriving = id in self.arriving
        if channel is None and arriving:
            raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)      # taken over, being loaded: asked again, it is here
        if channel is None:        # run by another node of the cluster: forwarded (router/cluster/forward.py)
            ref = self.rt.forwarder.reference_for(self.rt.poa, channel_oid(id),
                                                  CosNotifyChannelAdmin.EventChannel._NP_RepositoryId)
            if ref is None:
                raise CosNotifyChannelAdmin.ChannelNotFound()
            return ref
        return channel.ref

    def forget(self, cid: int) -> None:
        """Channel ``cid`` no longer runs here: destroyed (its filters stay, as any filter outlives its channel), or
        handed to another node (``router/cluster/release.py``: its filters are retired here, the new owner loads
        them)."""
        with self._lock:
            channel = self.channels.pop(cid, None)
        if channel is None:
            return
        self.rt.deactivate(channel.filter_factory_oid)
        if not channel._deleted and self.filter_factory is not None:
            self.filter_factory.retire(cid)


class EventChannelImpl(QoSMixin, CosNotifyChannelAdmin__POA.EventChannel):
    """One channel: its admins and the routing of events between them."""

    def __init__(self, factory: EventChannelFactoryImpl, row: ChannelRow) -> None:
        self.factory = factory
        self.rt = factory.rt
        self.id = row.id
        self.qos = dict(row.qos)
        self.admin_props = dict(row.admin_props)
        self.qos_target = Q.Target(Q.Level.CHANNEL)
        self._lock = threading.RLock()
        self.consumer_admins: dict[int, Any] = {}
        self.supplier_admins: dict[int, Any] = {}
        self.records: dict[int, Record] = {}      # live events by seq (MaxQueueLength, channel discard)
        self._records_lock = threading.Lock()
        self._volatile_accepted: dict[int, float] = {}   # BestEffort seq → accepted_at, when the ledger has it
        self.destroyed = False
        self._next_admin = {"C": row.next_admin_c, "S": row.next_admin_s}
        self._gate = Gate()                       # closed when the channel is handed to another node
        self.oid = channel_oid(self.id)
        self.ref = self.rt.activate(self.oid, self)
        self.filter_factory_oid = filter_factory_oid(self.id)     # default_filter_factory: its filters are its
        self.filter_factory_ref: Any = None
        node_filters = getattr(factory, "filter_factory", None)
        if node_filters is not None:
            self.filter_factory_ref = self.rt.activate(self.filter_factory_oid,
                                                       ChannelFilterFactory(node_filters, self.id, self.gate))

    # -- restore ------------------------------------------------------------------------------------------
    def restore(self) -> None:

        with self.rt.db.unit_of_work() as conn:
            arows = self.rt.store.load_admins(conn, self.id)
        for arow in arows:
            cls = ConsumerAdminImpl if arow.side == "C" else SupplierAdminImpl
            admin = cls(self, arow)
            (self.consumer_admins if arow.side == "C" else self.supplier_admins)[arow.id] = admin
        with self.rt.db.unit_of_work() as conn:
            prows = self.rt.store.load_proxies(conn, self.id)
        for prow in prows:
            admins = self.consumer_admins if prow.side == "C" else self.supplier_admins
            owner = admins.get(prow.admin_id)
            if owner is not None:
                owner.restore_proxy(prow)
        self._restore_events()

        sharing_of(self)            # the subscription/offer baseline, before any client can change it
        for admin in list(self.consumer_admins.values()) + list(self.supplier_admins.values()):
            admin.start_all()

    def _restore_events(self) -> None:

        by_event: dict[int, Record] = {}
        with self.rt.db.unit_of_work() as conn:
            qrows = self.rt.store.load_queued(conn, self.id)
        for q in qrows:
            rec = by_event.get(q.event_id)
            if rec is None:
                rec = Record(q.seq, decode(q.form, q.body), q.priority, q.deadline, q.start_at, True, q.event_id,
                             size=len(q.body), on_released=self.released)
                by_event[q.event_id] = rec
                self.records[rec.seq] = rec
                rec.hold()          # until every row is queued: a discard must not release it half-way
            proxy = self.consumer_admins.get(q.admin_id)
            target = proxy.proxies.get(q.proxy_id) if proxy is not None else None
            if target is not None:
                self._enqueue_one(target, rec)
        for rec in by_event.values():
            rec.release()           # records no queue took are released here (and reaped)
        if by_event:
            log.info("channel %d: restored %d queued persistent event(s)", self.id, len(by_event))

    # -- QoS / admin properties -------------------------------------------------------------------------
    def _qos_context(self) -> Q.Context:
        with self._lock:
            has = len(self.consumer_admins) + len(self.supplier_admins) > 2 or any(
                a.proxies for a in list(self.consumer_admins.values()) + list(self.supplier_admins.values()))
        return Q.Context(has_children=has, parent=None)

    def _persist_qos(self, qos: dict[str, Any]) -> None:
        with self.rt.db.unit_of_work() as conn:
            self.rt.store.update_channel(conn, self.id, qos=qos)

    def get_admin(self) -> list[Any]:
        return Q.to_properties(self.admin_props)

    def set_admin(self, admin: list[Any]) -> None:
        with self._lock:
            try:
                new = Q.apply_admin(self.admin_props, [(p.name, p.value) for p in admin])
            except Q.AdminError as exc:
                raise CosNotification.UnsupportedAdmin(Q.to_property_errors(exc.problems)) from exc
            with self.rt.db.unit_of_work() as conn:
                self.rt.store.update_channel(conn, self.id, admin_props=new)
            self.admin_props = new

    # -- navigation -------------------------------------------------------------------------------------
    def _get_MyFactory(self) -> Any:
        return self.factory.ref

    def _get_default_consumer_admin(self) -> Any:
        return self.consumer_admins[0].ref

    def _get_default_supplier_admin(self) -> Any:
        return self.supplier_admins[0].ref

    def _get_default_filter_factory(self) -> Any:
        return self.filter_factory_ref or getattr(self.factory, "filter_factory_ref", None)

    def new_for_consumers(self, op: Any) -> tuple[Any, int]:
        admin = self._new_admin("C", op, es_style=False)
        return admin.ref, admin.id

    def new_for_suppliers(self, op: Any) -> tuple[Any, int]:
        admin = self._new_admin("S", op, es_style=False)
        return admin.ref, admin.id

    def get_consumeradmin(self, id: int) -> Any:  # noqa: A002
        admin = self.consumer_admins.get(id)
        if admin is None or admin.es_style:
            raise CosNotifyChannelAdmin.AdminNotFound()
        return admin.ref

    def get_supplieradmin(self, id: int) -> Any:  # noqa: A002
        admin = self.supplier_admins.get(id)
        if admin is None or admin.es_style:
            raise CosNotifyChannelAdmin.AdminNotFound()
        return admin.ref

    def get_all_consumeradmins(self) -> list[int]:
        return ids_of(list(self.consumer_admins.values()))

    def get_all_supplieradmins(self) -> list[int]:
        return ids_of(list(self.supplier_admins.values()))

    # Event Service (CosEventChannelAdmin::EventChannel) operations: ID-less admins.
    def for_consumers(self) -> Any:
        return self._new_admin("C", CosNotifyChannelAdmin.AND_OP, es_style=True).ref

    def for_suppliers(self) -> Any:
        return self._new_admin("S", CosNotifyChannelAdmin.AND_OP, es_style=True).ref

    _deleted = False                     # destroy() finished: the stored channel is gone

    def destroy(self) -> None:
        """Retryable: the channel stops at once (``destroyed``: no events, no admins), but it and its admins stay
        active until its stored rows are deleted; if the store fails, the client gets TRANSIENT and a new
        destroy() finishes the job."""
        with self._lock:
            if self._deleted:
                return
            self.destroyed = True
            admins = list(self.consumer_admins.values()) + list(self.supplier_admins.values())

        with stopped_pushing([p for a in admins for p in list(getattr(a, "proxies", {}).values())], self.rt):
            for admin in admins:                 # a failure re-opens the proxies not torn down (inflight)
                admin.teardown(deactivate=False)
        with self.rt.db.unit_of_work() as conn:
            self.rt.store.delete_channel(conn, self.id)
        with self._lock:
            if self._deleted:
                return
            self._deleted = True
        for admin in admins:
            self.rt.deactivate(admin.oid)
        self.factory.forget(self.id)
        self.rt.deactivate(self.oid)

    def _new_admin(self, side: str, op: Any, *, es_style: bool) -> Any:

        level = Q.Level.CONSUMER_ADMIN if side == "C" else Q.Level.SUPPLIER_ADMIN
        with self.gate.passing(), self._lock:     # as a proxy's (router/channel/admins.py): not during a hand-off
            self._check_alive()
            check_admins(self.rt.limits, self.factory)
            admins = self.consumer_admins if side == "C" else self.supplier_admins
            aid = self._next_admin[side]
            self._next_admin[side] = aid + 1
            qos = Q.inherit(self.qos, Q.Target(level))
            with self.rt.db.unit_of_work() as conn:
                self.rt.store.insert_admin(conn, self.id, side, aid, es_style, int(op._v), qos)
            row = AdminRow(self.id, side, aid, es_style, int(op._v), qos, 0, {}, {})
            cls = ConsumerAdminImpl if side == "C" else SupplierAdminImpl
            admin = cls(self, row)
            admins[aid] = admin
        return admin

    def _check_alive(self) -> None:
        if self.destroyed:
            raise CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO)

    # -- counting for admin limits -------------------------------------------------------------------------
    def proxy_count(self, side: str) -> int:
        admins = self.consumer_admins if side == "C" else self.supplier_admins
        return sum(len(a.proxies) for a in list(admins.values()))

    def check_limit(self, side: str) -> None:
        name = CosNotification.MaxConsumers if side == "C" else CosNotification.MaxSuppliers
        limit = int(self.admin_props.get(name, 0))
        if limit and self.proxy_count(side) >= limit:
            value = CORBA.Any(CORBA.TC_long, limit)
            raise CosNotifyChannelAdmin.AdminLimitExceeded(CosNotifyChannelAdmin.AdminLimit(name, value))

    # -- routing ------------------------------------------------------------------------------------------
    @property
    def gate(self) -> Gate:
        """The channel's entry gate (router/channel/gate.py); made on first use for a channel built bare."""
        gate: Gate | None = self.__dict__.get("_gate")
        if gate is None:
            gate = self.__dict__.setdefault("_gate", Gate())
        return gate

    def route(self, source: ConsumerView, events: Sequence[Event]) -> None:
        """Accept events from a proxy consumer; returns once they are queued (and stored, if persistent)."""
        with self.gate.passing():           # a hand-over waits for the routes in flight (router/channel/gate.py)
            self._route(source, events)

    def _route(self, source: ConsumerView, events: Sequence[Event]) -> None:
        if self.destroyed:
            raise CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO)
        now = time.time()
        sizes = self._sizes_checked(events)
        records = [self._make_record(source, ev, now) for ev in events]
        bodies: dict[int, bytes] = {}
        for rec, (size, body) in zip(records, sizes, strict=True):
            rec.size = size
            if body is not None:
                bodies[rec.seq] = body
        accepted = [r for r in records if source.admits(r.event)]
        if not accepted:
            return
        plans = [(rec, self._targets(rec)) for rec in accepted]
        plans = [(rec, targets) for rec, targets in plans if targets]
        if not plans:
            return
        overflow = self._admit(len(plans))  # only events some consumer will hold count against MaxQueueLength
        self._store(plans, bodies, source, now)
        self._make_room(overflow)           # discard only once the new events are durably stored
        with self._records_lock:
            for rec, _ in plans:
                self.records[rec.seq] = rec
        for rec, targets in plans:
            rec.hold()                      # keep the record alive until every target queued it
            try:
                for proxy in targets:
                    self._enqueue_one(proxy, rec)
            finally:
                rec.release()
        durable = sum(1 for rec, _ in plans if rec.persistent)
        if durable:
            telemetry.accepted(self.id, durable, True)
        if len(plans) > durable:
            telemetry.accepted(self.id, len(plans) - durable, False)

    # -- routing inside a T2 (router.channel.t2in): decide, store in the caller's branch, publish after commit ----
    def plan_in(self, source: ConsumerView, events: Sequence[Event]) -> RoutePlan:
        """:meth:`route` up to the store, without I/O: QoS (BAD_QOS), size (IMP_LIMIT), filters, targets and
        admission (IMP_LIMIT with RejectNewEvents). Nothing changes until :meth:`store_in` and :meth:`publish`."""
        if self.destroyed:
            raise CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO)
        now = time.time()
        sizes = self._sizes_checked(events)
        records = [self._make_record(source, ev, now) for ev in events]
        bodies: dict[int, bytes] = {}
        for rec, (size, body) in zip(records, sizes, strict=True):
            rec.size = size
            if body is not None:
                bodies[rec.seq] = body
        plans = [(rec, self._targets(rec)) for rec in records if source.admits(rec.event)]
        plans = [(rec, targets) for rec, targets in plans if targets]
        overflow = self._admit(len(plans)) if plans else 0
        return RoutePlan(plans, bodies, overflow, source, now)

    def store_in(self, conn: Any, plan: RoutePlan) -> None:
        """:meth:`_store` on ``conn`` (the T2's PostgreSQL branch, or the caller's unit of work): the plan's
        persistent events with their queue rows and ledger rows, and (``ledger.best_effort``) the ledger rows of
        the BestEffort ones."""
        durable = [(rec, t) for rec, t in plan.plans if rec.persistent]
        volatile = [(rec, t) for rec, t in plan.plans if not rec.persistent]
        if volatile and not self.rt.store.ledger.records(persistent=False):
            volatile = []
        if not durable and not volatile:
            return
        accepted_at = plan.now or time.time()
        self._encode_missing(durable, plan.bodies)
        origin, jms_ids = self._ledger_origin(plan.source, [rec for rec, _ in durable + volatile])
        rows = [NewEvent(rec.seq, int(rec.event.form), plan.bodies.get(rec.seq, b""), rec.priority, rec.deadline,
                         rec.start_at, [(p.admin.id, p.id) for p in targets], accepted_at, origin, jms_id)
                for (rec, targets), jms_id in zip(durable + volatile, jms_ids, strict=True)]
        ids = self.rt.store.insert_events(conn, self.id, rows[:len(durable)]) if durable else []
        if volatile:
            self.rt.store.best_effort_accepted(conn, self.id, rows[len(durable):])
        for (rec, _), eid in zip(durable, ids, strict=True):
            rec.db_id = eid
        plan.volatile = [rec.seq for rec, _ in volatile]

    def publish(self, plan: RoutePlan) -> None:
        """After the T2 committed: discard for room (DiscardPolicy), then queue the events in memory."""
        if not plan.plans:
            return
        self._make_room(plan.overflow)
        with self._records_lock:
            for rec, _ in plan.plans:
                self.records[rec.seq] = rec
            for seq in plan.volatile:
                self._volatile_accepted[seq] = plan.now
        for rec, targets in plan.plans:
            rec.hold()
            try:
                for proxy in targets:
                    self._enqueue_one(proxy, rec)
            finally:
                rec.release()
        durable = sum(1 for rec, _ in plan.plans if rec.persistent)
        if durable:
            telemetry.accepted(self.id, durable, True)
        if len(plan.plans) > durable:
            telemetry.accepted(self.id, len(plan.plans) - durable, False)

    @staticmethod
    def _encode_missing(durable: list[tuple[Record, list[QueueTarget]]], bodies: dict[int, bytes]) -> None:
        """Persistent events accepted on their size bound are encoded once, here, to be stored."""
        for rec, _ in durable:
            if rec.seq not in bodies:
                bodies[rec.seq] = encode(rec.event)
                rec.size = len(bodies[rec.seq])

    def _sizes_checked(self, events: Sequence[Event]) -> list[tuple[int, bytes | None]]:
        """Each event's size (and its CDR encoding when it had to be made); the whole push is refused (IMP_LIMIT,
        COMPLETED_NO) if one is larger than the node's ``max_event_bytes``: the channel accepts only what it can
        deliver and store.

        Cheap and exact: an event whose :func:`size_bound` (an upper bound of its encoding) is within the limit is
        accepted without being encoded, its size being that bound; any other event is encoded and its exact
        length checked (the encoding is kept: a persistent event is stored with it, never encoded twice)."""
        limit = self.rt.max_event_bytes
        out: list[tuple[int, bytes | None]] = []
        try:
            for ev in events:
                bound = size_bound(ev)
                if bound is not None and (not limit or bound <= limit):
                    out.append((bound, None))
                else:
                    if bound is None:
                        check_depth(ev)
                    body = encode(ev)
                    out.append((len(body), body))
        except EventTooDeep as exc:
            log.warning("channel %d: refused a push of %d event(s): %s (BAD_PARAM)", self.id, len(events), exc)
            telemetry.rejected(self.id, len(events), "EVENT_TOO_DEEP")
            raise CORBA.BAD_PARAM(MINOR_EVENT_TOO_DEEP, CORBA.COMPLETED_NO) from exc
        too_big = [size for size, body in out if limit and body is not None and size > limit]
        if too_big:
            log.warning("channel %d: refused a push of %d event(s): an event of %d bytes is above the limit of %d "
                        "bytes (IMP_LIMIT)", self.id, len(events), max(too_big), limit)
            telemetry.rejected(self.id, len(events), "EVENT_TOO_LARGE")
            check_size(max(too_big), limit)
        return out

    @staticmethod
    def _enqueue_one(proxy: QueueTarget, rec: Record) -> None:
        """One target's failure (e.g. a discard that could not reach the database) must not keep the event from
        the other targets; the stored queue row of a failed target makes it come back after a restart."""
        try:
            proxy.enqueue(rec)
        except Exception:
            log.exception("channel: could not queue event seq=%d for proxy %s", rec.seq, proxy.oid)

    def _make_record(self, source: ProxyView, ev: Event, now: float) -> Record:
        header = ev.structured.header.variable_header if ev.form is Form.STRUCTURED else []
        try:
            eq = Q.event_qos(source.qos, header)
        except Q.EventQoSError as exc:
            log.info("rejected an event from %s: %s", source.oid, exc)
            telemetry.rejected(self.id, 1, "BAD_QOS")
            raise CORBA.BAD_QOS(0, CORBA.COMPLETED_NO) from exc
        timeout = eq["timeout"]
        deadline = now + timeout / _TIMET_PER_SECOND if timeout else None
        stop = eq["stop_time"]
        if stop is not None:
            stop_unix = Q.utc_to_unix(stop)
            deadline = stop_unix if deadline is None else min(deadline, stop_unix)
        start = eq["start_time"]
        start_at = Q.utc_to_unix(start) if start is not None else None
        persistent = eq["persistent"] and self.connections_persistent()
        return Record(self.rt.next_seq(), ev, eq["priority"], deadline, start_at, persistent,
                      on_released=self.released)

    def connections_persistent(self) -> bool:
        return bool(int(self.qos.get(CosNotification.ConnectionReliability, 0)) == CosNotification.Persistent)

    def _targets(self, rec: Record) -> list[QueueTarget]:
        out: list[QueueTarget] = []
        for admin in list(self.consumer_admins.values()):
            out.extend(admin.targets_for(rec.event))
        return out

    def _admit(self, n: int) -> int:
        """MaxQueueLength (NS 2.5.7): with RejectNewEvents the push is refused (IMP_LIMIT, nothing changed);
        otherwise the number of queued events the DiscardPolicy must discard for ``n`` new ones. Deciding only:
        the discard itself waits until the new events are stored (:meth:`_make_room`), so a store failure
        leaves the queues as they were."""
        limit = int(self.admin_props.get(CosNotification.MaxQueueLength, 0))
        if not limit:
            return 0
        with self._records_lock:
            overflow = len(self.records) + n - limit
        if overflow <= 0:
            return 0
        if bool(self.admin_props.get(CosNotification.RejectNewEvents, False)):
            telemetry.rejected(self.id, n, "IMP_LIMIT")
            raise CORBA.IMP_LIMIT(0, CORBA.COMPLETED_NO)
        return overflow

    def _make_room(self, overflow: int) -> None:
        for _ in range(overflow):
            self._discard_one()

    def _discard_one(self) -> bool:
        """Discard the DiscardPolicy's victim among events still *queued* (not in flight or awaiting a pull
        confirmation, which cannot be taken back). False if nothing could be discarded."""
        policy = int(self.qos.get(CosNotification.DiscardPolicy, 0))
        with self._records_lock:
            candidates = list(self.records.values())
        while candidates:
            victim = choose_victim(policy, [Entry(r, ()) for r in candidates]).record
            removed = False
            for admin in list(self.consumer_admins.values()):
                for proxy in list(admin.proxies.values()):
                    removed = proxy.queue.remove_record(victim) or removed
            if removed:
                log.info("channel %d full: discarded event seq=%d (DiscardPolicy=%d)", self.id, victim.seq, policy)
                return True
            candidates.remove(victim)
        return False

    def sweep_expired(self) -> None:
        """Drop expired events from every queue, also those nobody takes from (suspended, idle pull)."""
        for admin in list(self.consumer_admins.values()):
            for proxy in list(admin.proxies.values()):
                proxy.queue.take(0)

    def _store(self, plans: list[tuple[Record, list[QueueTarget]]], bodies: dict[int, bytes],
               source: ProxyView | None = None, now: float | None = None) -> None:
        """One unit of work: the persistent events with their queue rows and ledger rows, and (``ledger.best_effort``)
        the ledger rows of the BestEffort ones. Any failure fails the push: nothing of it is stored."""
        durable = [(rec, t) for rec, t in plans if rec.persistent]
        volatile = [(rec, t) for rec, t in plans if not rec.persistent]
        if volatile and not self.rt.store.ledger.records(persistent=False):
            volatile = []
        if not durable and not volatile:
            return
        accepted_at = now if now is not None else time.time()
        self._encode_missing(durable, bodies)
        origin, jms_ids = self._ledger_origin(source, [rec for rec, _ in durable + volatile])
        rows = [NewEvent(rec.seq, int(rec.event.form), bodies.get(rec.seq, b""), rec.priority, rec.deadline,
                         rec.start_at, [(p.admin.id, p.id) for p in targets], accepted_at, origin, jms_id)
                for (rec, targets), jms_id in zip(durable + volatile, jms_ids, strict=True)]
        if volatile:                            # ledger.best_effort: their rows in the same unit of work
            with self.rt.db.unit_of_work() as conn:
                ids = self.rt.store.insert_events(conn, self.id, rows[:len(durable)]) if durable else []
                self.rt.store.best_effort_accepted(conn, self.id, rows[len(durable):])
        else:
            ids = self.rt.accept_commits.insert(self.id, rows)     # shares a commit with concurrent pushes
        for (rec, _), eid in zip(durable, ids, strict=True):
            rec.db_id = eid
        if volatile:
            with self._records_lock:
                for rec, _ in volatile:
                    self._volatile_accepted[rec.seq] = accepted_at

    def volatile_accepted_at(self, seq: int) -> float | None:
        """When the BestEffort event ``seq`` was accepted, if the ledger recorded it (its terminal rows need it)."""
        with self._records_lock:
            return self._volatile_accepted.get(seq)

    def _ledger_origin(self, source: ProxyView | None,
                       records: list[Record]) -> tuple[tuple[int, int] | None, list[str | None]]:
        """The (supplier admin, proxy consumer) the events came from, and each event's JMS message id when that
        proxy is a JMS → channel bridge's (the mapping puts ``JMSMessageID`` in the filterable data): the ledger's
        inbound rows (router/routing/ledger.py)."""
        admin = getattr(source, "admin", None)
        if source is None or admin is None:
            return None, [None] * len(records)
        origin = (int(admin.id), int(source.id))
        route = self.rt.store.ledger.route(self.id, "S", *origin)
        if route is None:
            return origin, [None] * len(records)
        return origin, [jms_message_id(rec.event) for rec in records]

    def released(self, rec: Record) -> None:
        """A record left its last queue: forget it; its stored copy is deleted by the store's reaper."""
        self._forget_record(rec)
        if rec.db_id is not None:
            self.rt.store.reap_later(rec.db_id)

    def _forget_record(self, rec: Record) -> None:
        with self._records_lock:
            self.records.pop(rec.seq, None)
            self._volatile_accepted.pop(rec.seq, None)

    def queued_count(self) -> int:
        with self._records_lock:
            return len(self.records)


store_boundary(EventChannelFactoryImpl, EventChannelImpl)

