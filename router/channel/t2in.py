"""JMS → channel inside the routing transaction T2 (NJI 2.7.2, 2.7.3.2): the channel as the transaction client.

A pull-style proxy consumer with ``EnableTransaction`` TRUE whose supplier is a bridge pull sender of this node
(``rt.t2.local(client IOR)``, NJI 2.7.2: the channel pulls from the bridge, which receives from JMS synchronously
inside the T2) runs one T2 per round (:meth:`InboundT2Driver.round`):

0. wait (up to ``RECEIVE_WAIT_S``) for the first message WITHOUT a T2 or a database connection (the bridge's
   ``wait_first``): an idle bridge holds no pooled connection, however many there are;
1. begin a T2 with the proxy's ``TransactionTimeout`` (0: no deadline); enlist a PostgreSQL branch (``pg``); with a
   deadline, the branch's statements are bounded by it (``statement_timeout``);
2. the bridge receives up to a batch (``TransactionEvents`` events for a structured proxy,
   ``TransactionEventSequences`` * ``MaximumBatchSize`` for a sequence proxy, NJI Table 2-10), claims the message ids
   in the inbox in the same branch, dead-letters what cannot become an event, and enlists the broker ack branch;
3. the channel decides the events' targets (:meth:`EventChannelImpl.plan_in`, no I/O; an event the channel refuses
   for its QoS or size is dead-lettered by the bridge in the same T2) and stores them in the SAME branch
   (:meth:`EventChannelImpl.store_in`);
4. ``decide``: phase one (the STOMP ack branch's last frame receipted, PREPARE TRANSACTION) and the durable
   COMMIT record; then phase two on the proxy's completer thread (``complete``: COMMIT PREPARED first, then the
   STOMP COMMIT of the acks; only then the events are queued in memory, :meth:`EventChannelImpl.publish`) while
   this thread begins the next T2 (pipelining; at most one decided T2 waits in the completer, which publishes in
   the order of the decisions). A rollback (failure, rollback-only, TransactionTimeout) stores nothing and aborts
   the STOMP transaction: the bridge keeps the deliveries and the next round takes them again.

Without ``EnableTransaction`` the same pull from a bridge of this node on a Persistent channel is one local
unit of work (:meth:`InboundT2Driver.round_local`): the inbox claims and the events in one PostgreSQL
transaction, the acks written after it committed; it too opens its connection only once a message arrived.

The settings are read each round from the proxy, then its admin, then the channel (QoS and admin properties), so
``set_qos`` / ``set_admin`` / ``enable_transaction`` take effect at the next T2.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from omniORB import CORBA

import CosNotification

from router.channel import qos as Q
from router.channel.boundary import MINOR_EVENT_TOO_LARGE, describe
from router.channel.channel import RoutePlan
from router.channel.events import Event, Form, normalise_structured
from router.channel.proxyport import InboundProxy, ProxyView
from router.channel.txdelivery import enable_needs_check
from router.routing.completer import Completer
from router.routing.crashpoints import crashpoint, pausepoint
from router.routing.ledger import t2_branch
from router.routing.ports import InboundBatch, InboundSource, RoundTarget, TakeLocal
from router.routing.runner import Abandon, RunHooks, T2Runner
from router.routing.runner import Outcome as RunOutcome
from xa.coordinator import BranchOutcome, Transaction
from xa.coordinator import Outcome as XaOutcome
from xa.errors import TransactionRolledBack
from xa.pg import PgBranch
from xa.states import State

if TYPE_CHECKING:
    from router.channel.runtime import Runtime

__all__ = ["InboundT2Driver", "T2Settings", "check_honoured", "local_round", "local_target", "plan_events",
           "resolve_in_doubt", "room", "status", "supplier_refused", "t2_settings", "unavailable_reason"]

log = logging.getLogger("nsjms.channel")

#: How long one round waits for the first message (the pull loop's idle step).
RECEIVE_WAIT_S = 0.2
#: Deliveries per local (non-T2) round, bounded by the channel's room (MaxQueueLength).
LOCAL_BATCH = 100
#: How long a local round whose COMMIT broke keeps asking the store whether it committed.
IN_DOUBT_RESOLVE_S = 600.0


@dataclass(frozen=True)
class T2Settings:
    enabled: bool
    batch: int          # deliveries per T2
    timeout_s: int      # TransactionTimeout; 0 = none


def _lookup(proxy: ProxyView, name: str, default: Any) -> Any:
    """``name`` as ``proxy`` sees it: its own QoS, its admin's, the channel's admin properties, the channel's QoS."""
    admin, channel = proxy.admin, proxy.channel
    for holder in (proxy.qos, admin.qos, getattr(admin, "admin_props", None), channel.admin_props, channel.qos):
        if isinstance(holder, dict) and name in holder:
            return holder[name]
    return default


def t2_settings(proxy: ProxyView, *, sequence: bool) -> T2Settings:
    """The values ``enable_transaction`` stored on the proxy (``extra["transaction"]``, as for channel → JMS,
    router.channel.txdelivery) win over the QoS / admin properties."""
    own = proxy.extra.get("transaction") or {}
    enabled = bool(_lookup(proxy, Q.ENABLE_TRANSACTION, False))
    if sequence:
        per = max(1, int(_lookup(proxy, CosNotification.MaximumBatchSize, 1)))
        batch = max(1, int(own.get("sequences") or _lookup(proxy, Q.TRANSACTION_EVENT_SEQUENCES, 1))) * per
    else:
        batch = max(1, int(own.get("events") or _lookup(proxy, Q.TRANSACTION_EVENTS, 1)))
    timeout = own.get("timeout", _lookup(proxy, Q.TRANSACTION_TIMEOUT, 0))
    return T2Settings(enabled, batch, max(0, int(timeout or 0)))


def room(proxy: ProxyView, wanted: int) -> int:
    """How many events a round may take now: the channel's free places when MaxQueueLength bounds it."""
    limit = int(proxy.channel.admin_props.get(CosNotification.MaxQueueLength, 0))
    if not limit:
        return wanted
    return max(1, min(wanted, limit - int(proxy.channel.queued_count())))


def plan_events(proxy: ProxyView, batch: InboundBatch) -> RoutePlan:
    """Targets of the batch's events for ``proxy`` (the bridge's proxy consumer). An event the channel refuses
    (BAD_QOS, above the size limit) is dead-lettered by the bridge in the same transaction/unit of work; a full
    channel (IMP_LIMIT with RejectNewEvents) or anything else fails the round (retried)."""
    channel = proxy.channel
    events: list[Event] = [normalise_structured(ev) for ev in batch.events]
    try:
        return _with_bodies(channel.plan_in(proxy, events), events, batch)
    except (CORBA.BAD_QOS, CORBA.IMP_LIMIT) as exc:
        if isinstance(exc, CORBA.IMP_LIMIT) and exc.minor != MINOR_EVENT_TOO_LARGE:
            raise
    good: list[Event] = []
    for i, ev in enumerate(events):
        try:
            channel.plan_in(proxy, [ev])
        except CORBA.BAD_QOS as exc:
            batch.reject(i, f"{describe(exc)}: the channel rejected the event's QoS headers")
            continue
        except CORBA.IMP_LIMIT as exc:
            if exc.minor != MINOR_EVENT_TOO_LARGE:
                raise
            batch.reject(i, f"{describe(exc)}: above the channel's size limit of {proxy.rt.max_event_bytes} bytes")
            continue
        good.append(ev)
    return _with_bodies(channel.plan_in(proxy, good), events, batch) if good else RoutePlan()


def _with_bodies(plan: RoutePlan, events: list[Event], batch: InboundBatch) -> RoutePlan:
    """The CDR encodings the bridge made of the batch's events (``batch.bodies``, to check their size) become the
    plan's bodies, so :meth:`EventChannelImpl.store_in` stores a persistent event without encoding it again. Only
    for a StructuredEvent kept as it is (the channel's encoding of it is the same ``cdrMarshal`` of the same
    value); an event the channel already encoded keeps its own."""
    bodies = batch.bodies
    if not bodies:
        return plan
    by_event = {id(ev): body for ev, body in zip(events, bodies, strict=False)
                if body is not None and ev.form is Form.STRUCTURED}
    for rec, _ in plan.plans:
        body = by_event.get(id(rec.event))
        if body is not None and rec.seq not in plan.bodies:
            plan.bodies[rec.seq] = body
            rec.size = len(body)
    return plan


def local_round(proxy: ProxyView, take: Callable[[Any, int, float], InboundBatch], max_n: int, wait_s: float, *,
                ready: Callable[[float], bool] | None = None) -> int:
    """JMS → channel without a T2, the bridge and ``proxy``'s channel in this process: the inbox claims and the
    events in ONE local PostgreSQL transaction, the acks written after it committed, the events queued in memory
    after that. Exactly once for the events the channel stores, without two-phase commit: a crash before the
    commit stores nothing and the broker redelivers; a crash after it makes the broker redeliver messages whose
    ids the inbox holds (acknowledged, no second event). Returns how many deliveries the round took.

    ``ready(wait_s)`` waits for the first message WITHOUT a database connection; the unit of work (a pooled
    connection) is opened only when it says there is something to take, and ``take`` then does not wait. Without
    ``ready``, ``take`` waits inside the unit of work (callers that have no such wait)."""
    if ready is not None:
        if not ready(wait_s):
            return 0
        wait_s = 0.0
    plan = RoutePlan()
    batch: InboundBatch | None = None
    try:
        with proxy.rt.db.unit_of_work() as conn:
            batch = take(conn, max_n, wait_s)
            if not batch.received:
                return 0
            pausepoint("in.local.after_take")
            if batch.events:
                plan = plan_events(proxy, batch)
                proxy.channel.store_in(conn, plan)
            pausepoint("in.local.before_commit")
    except BaseException as exc:
        if batch is not None:
            batch.abandon()
        if getattr(exc, "in_doubt", False) and plan.plans:
            resolve_in_doubt(proxy, plan)
        raise
    crashpoint("in.local.after_commit")
    batch.settle()
    proxy.channel.publish(plan)
    return int(batch.received)


class LocalRounds:
    """The channel's :class:`~router.routing.ports.InboundRounds`: JMS → channel PUSH into a Persistent channel of
    this node, the bridge's local rounds run by :func:`local_round` (registered as the node's
    ``LocalEndpoints.inbound_rounds`` by the node, ``router.node.server``)."""

    batch = LOCAL_BATCH

    # the bridge holds the channel's own proxy consumer servant (its RoundTarget): read as the InboundProxy it is
    def room(self, proxy: RoundTarget, wanted: int) -> int:
        return room(cast(InboundProxy, proxy), wanted)

    def round(self, proxy: RoundTarget, take: TakeLocal, max_n: int, timeout: float, *,
              ready: Callable[[float], bool] | None = None) -> int:
        return local_round(cast(InboundProxy, proxy), take, max_n, timeout, ready=ready)


def resolve_in_doubt(proxy: ProxyView, plan: RoutePlan, *, within_s: float = IN_DOUBT_RESOLVE_S) -> threading.Thread:
    """A local round whose COMMIT broke (``StoreUnavailable.in_doubt``) may have stored its events: the broker
    redelivers its messages, which the inbox then acknowledges without events if the commit happened, so the
    events would stay in the store, unqueued, until the node restarts (issue 31's pattern, here without a T2).
    A thread asks the store (backing off while it is unreachable) whether the events' rows exist and, if they
    do, queues the plan's events; if not, nothing was stored and the redelivery makes them events. Gives up
    (ERROR, they are then delivered after the next start, which loads them) after ``within_s``."""
    ids = [rec.db_id for rec, _ in plan.plans if rec.db_id is not None]

    def run() -> None:
        delay, deadline = 0.1, time.monotonic() + within_s
        while time.monotonic() < deadline and not proxy.rt.shutting_down.is_set():
            try:
                with proxy.rt.db.unit_of_work() as conn:
                    row = conn.execute("SELECT count(*) FROM nsjms_event WHERE id = ANY(%s)", (ids,)).fetchone()
            except Exception as exc:  # noqa: BLE001 — still unreachable: ask again
                log.debug("proxy %s: in-doubt local round waits for the store: %s", proxy.oid, exc)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if row and int(row[0]):
                proxy.channel.publish(plan)
                log.warning("proxy %s: the local round whose COMMIT broke had committed: its %d event(s) are "
                            "queued", proxy.oid, len(plan.plans))
            else:
                log.info("proxy %s: the local round whose COMMIT broke stored nothing; the broker redelivers its "
                         "messages", proxy.oid)
            return
        log.error("proxy %s: could not tell whether a local round whose COMMIT broke stored its %d event(s); if it "
                  "did, they are delivered after the node restarts", proxy.oid, len(plan.plans))

    thread = threading.Thread(target=run, name=f"in-doubt-{proxy.oid}", daemon=True)
    if ids:
        thread.start()
    return thread


def local_target(proxy: ProxyView) -> InboundSource | None:
    """The JMS bridge pull sender of this node that ``proxy`` (a proxy consumer) pulls from, in-process: the one
    registered under its supplier's IOR, else the inbound port the node's local endpoints hold for the servant
    behind the supplier's reference (the same bridge, whatever its IOR's spelling); None otherwise."""
    t2 = proxy.rt.t2
    if t2 is None or not proxy.client_ior:
        return None
    target: InboundSource | None = t2.local(proxy.client_ior)
    if target is not None and not hasattr(target, "take_in_t2"):   # the IOR names an outbound participant
        return None
    if target is None:
        try:
            target = proxy.rt.endpoints.inbound(proxy.client_ref())
        except Exception:  # noqa: BLE001 — not resolvable here: not a local participant
            target = None
        if target is not None:
            t2.register_local(proxy.client_ior, target)
    return target


def supplier_refused(proxy: ProxyView, client: Any) -> str | None:
    """Why ``client`` (a supplier about to connect) cannot take part in this proxy consumer's routing transactions,
    or None when it can: a JMS bridge pull sender of this node, pulled by a PULL proxy consumer."""
    t2 = proxy.rt.t2
    if t2 is None or proxy.style != "PULL":
        return unavailable_reason(proxy)
    target = t2.local(proxy.rt.ior(client))
    if target is None:
        target = proxy.rt.endpoints.inbound(client)
    elif not hasattr(target, "take_in_t2"):          # the IOR names an outbound participant
        target = None
    return None if target is not None else "its supplier is not a JMS bridge pull sender of this node"


def unavailable_reason(proxy: ProxyView) -> str | None:
    """Why a proxy consumer cannot run its routing transactions (NJI 2.7.2), or None when it can, or when it has no
    supplier yet (decided when one connects, see :func:`status`)."""
    if proxy.rt.t2 is None:
        return "this runtime has no routing transactions"
    if proxy.style != "PULL":
        return ("it is a push-style proxy consumer: its supplier pushes outside any routing transaction (nsjms has "
                "no OTS to receive a client's transaction; a JMS -> channel bridge runs T2s through a PULL proxy)")
    if proxy.connected and local_target(proxy) is None:
        return "its supplier is not a JMS bridge pull sender of this node"
    return None


def check_honoured(proxy: ProxyView, qos: dict[str, Any], requested: frozenset[str] | None = None) -> None:
    """``EnableTransaction`` = TRUE on a proxy consumer is accepted only where a routing transaction can run: a
    PULL proxy consumer, on a node with T2, whose supplier is a JMS bridge pull sender of this node, or that has no
    supplier yet. Anything else (a push-style proxy consumer, a pull proxy consumer connected to any other supplier,
    a node without T2) refuses it with UnsupportedQoS (UNAVAILABLE_VALUE [FALSE, FALSE]); the reason is logged.
    Checked when the request sets TRUE on the proxy itself, also when the proxy already inherited TRUE
    (:func:`router.channel.txdelivery.enable_needs_check`)."""
    if not enable_needs_check(proxy, qos, requested):
        return
    reason = unavailable_reason(proxy)
    if reason is not None:
        log.info("proxy %s: EnableTransaction=TRUE refused: %s", proxy.oid, reason)
        raise Q.QoSError([Q.PropertyProblem("UNAVAILABLE_VALUE", Q.ENABLE_TRANSACTION, False, False)])


def status(proxy: ProxyView) -> dict[str, Any]:
    """``t2_unavailable`` (the reason) for a connected proxy consumer whose EnableTransaction is TRUE (its own, or
    inherited from its admin or channel) but that cannot run a routing transaction; else nothing."""
    if not proxy.connected or not t2_settings(proxy, sequence=proxy.form == "SEQUENCE").enabled:
        return {}
    reason = unavailable_reason(proxy)
    return {"t2_unavailable": reason} if reason is not None else {}


def _own(t2: Any, gtrid: str) -> None:
    late = getattr(t2, "late", None)
    if late is not None:
        late.own(gtrid)


def _disown(t2: Any, gtrid: str) -> None:
    late = getattr(t2, "late", None)
    if late is not None:
        late.disown(gtrid)


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class _TakeAndStore:
    """The work of one JMS → channel T2 (router.routing.runner): the PostgreSQL branch enlisted (its statements
    bounded by TransactionTimeout), the bridge's batch taken in the T2, the events planned, the broker branch
    sealed, the events stored in the branch. Returns the plan, published once the T2 committed."""

    def __init__(self, driver: InboundT2Driver, rt: Runtime, settings: T2Settings, target: InboundSource,
                 wait_s: float) -> None:
        self.driver, self.rt, self.settings, self.target, self.wait_s = driver, rt, settings, target, wait_s
        self.received = 0

    def __call__(self, txn: Transaction, conn: Any) -> RoutePlan:
        rt, settings, proxy = self.rt, self.settings, self.driver.proxy
        assert rt.t2 is not None                   # a round runs only on a node with T2 (local_target)
        rt.t2.enlist(txn, t2_branch(rt.store.ledger, conn, PgBranch(conn, "pg"), txn.gtrid))
        if settings.timeout_s:
            conn.execute("SELECT set_config('statement_timeout', %s, true)", (f"{settings.timeout_s * 1000}ms",))
        batch = self.target.take_in_t2(txn, conn, proxy.room(settings.batch), self.wait_s)
        if not batch.received:
            raise Abandon("nothing received")
        plan = self.driver._plan(batch) if batch.events else RoutePlan()
        seal = getattr(batch, "seal", None)
        if seal is not None:        # the broker takes the acks while PostgreSQL stores and prepares
            seal()
        if batch.events:
            proxy.channel.store_in(conn, plan)
        self.received = int(batch.received)
        return plan


class _InboundHooks(RunHooks[RoutePlan]):
    """The driver's part of its T2s: owned from begin (router/routing/t2/latecommit.py), phase two's end publishes."""

    def __init__(self, driver: InboundT2Driver) -> None:
        self.driver = driver

    def started(self, txn: Transaction) -> None:
        _own(self.driver.proxy.rt.t2, txn.gtrid)   # its events are queued here, whoever commits its branch

    def before_phase_two(self, txn: Transaction) -> None:
        crashpoint("t2.in.before_phase_two")
        pausepoint("t2.in.before_phase_two")     # tests: PostgreSQL stopped here (tests/integration/test_t2_inbound.py)

    def completed(self, txn: Transaction, value: RoutePlan, outcome: XaOutcome | None,
                  error: Exception | None) -> None:
        self.driver._complete(txn, outcome, error, value)


class InboundT2Driver:
    """Runs the T2 rounds of one pull-style proxy consumer (its pull thread only)."""

    def __init__(self, proxy: InboundProxy, *, sequence: bool) -> None:
        self.proxy = proxy
        self.sequence = sequence
        self.committed = 0
        self.rolled_back = 0
        self.timed_out = 0
        self.last_error = ""
        self._in_round = False
        self._completer: Completer | None = None
        self._warned = False
        # Decided T2s whose PostgreSQL branch recovery commits (phase two failed or did not confirm it), by gtrid:
        # their events are published once the recovery log shows the branch done (:meth:`publish_recovered`).
        self._recovering: dict[str, RoutePlan] = {}
        self._recovering_lock = threading.Lock()

    @property
    def active(self) -> bool:
        """A T2 is in progress (BridgeTransactionMgmt's TransactionActive): a round, or a decided T2 whose phase
        two runs on the completer."""
        return self._in_round or (self._completer is not None and self._completer.pending() > 0)

    @active.setter
    def active(self, value: bool) -> None:
        self._in_round = value

    # -- which supplier -----------------------------------------------------------------------------------------
    def target(self) -> InboundSource | None:
        """The JMS bridge of this node this proxy pulls from, in-process, when it runs a T2 (EnableTransaction
        TRUE) or a local unit of work (EnableTransaction FALSE on a Persistent channel); else None (the proxy pulls
        over the ORB as before). EnableTransaction with a supplier that is not a bridge of this node cannot run a
        T2 (no transaction context crosses the ORB here): the proxy pulls without one, and says so once."""
        enabled = t2_settings(self.proxy, sequence=self.sequence).enabled
        target = local_target(self.proxy)
        if target is None:
            if enabled and not self._warned:
                self._warned = True
                log.warning("proxy %s: EnableTransaction is TRUE but %s; it pulls without a routing transaction "
                            "(nsjms status shows t2_unavailable)", self.proxy.oid, unavailable_reason(self.proxy))
            return None
        if not enabled and not self.proxy.channel.connections_persistent():
            return None                  # BestEffort: nothing is stored, the pull path as before
        return target

    def step(self, target: InboundSource, wait_s: float = RECEIVE_WAIT_S) -> int:
        """One round with ``target``: a T2 when EnableTransaction is TRUE, else a local unit of work. Returns -1
        without doing anything while the bridge is stopped (the caller waits)."""
        self.publish_recovered()
        if not target.t2_ready():
            return -1
        if t2_settings(self.proxy, sequence=self.sequence).enabled:
            return self.round(target, wait_s)
        return self.round_local(target, wait_s)

    def round_local(self, target: InboundSource, wait_s: float = RECEIVE_WAIT_S) -> int:
        """Without a T2: :func:`local_round` with the bridge's pull sender, after the phase two of the decided T2s
        (their events are queued first)."""
        self.drain()
        try:
            return local_round(self.proxy, target.take_local, self.proxy.room(LOCAL_BATCH), wait_s,
                               ready=target.wait_first)
        except BaseException as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"[:500]
            raise

    # -- one T2 --------------------------------------------------------------------------------------------------
    def round(self, target: InboundSource, wait_s: float = RECEIVE_WAIT_S) -> int:
        """One T2: returns how many deliveries it took (0: nothing arrived, nothing done). Raises after a rollback
        (the deliveries stay with the bridge for the next round).

        The settings are read once a message is there, AFTER :attr:`active` is set: a ``disable_transaction``
        applied while this round waited for JMS is seen (the round is then a local one, which takes the held
        delivery), and one applied after that read finds the round active (``TransactionActive``: it takes effect
        when this T2 ends; router.bridge.txmgmt reads ``active`` after it applied the disable)."""
        proxy = self.proxy
        rt = proxy.rt
        if not target.wait_first(wait_s):    # no T2, no pooled connection while JMS has nothing for us
            return 0
        wait_s = 0.0
        self.active = True
        try:
            settings = t2_settings(proxy, sequence=self.sequence)
            if not settings.enabled:         # disabled while this round waited: no T2 with stale settings
                self.active = False
                return self.round_local(target, wait_s)
            return self._round(rt, settings, target, wait_s)
        finally:
            self.active = False

    def _round(self, rt: Runtime, settings: T2Settings, target: InboundSource, wait_s: float) -> int:
        """Phase one and the decision on this thread; phase two (COMMIT PREPARED, the broker's COMMIT of the acks,
        END) and the publication of the events on the proxy's completer (:meth:`_complete`), while this thread
        begins the next T2: pipelining, as for channel → JMS (docs/transactions.md "Pipelining"). At most one
        decided T2 is in the completer when a T2 begins (two T2s per proxy at most: two pooled sessions); the
        completer publishes in the order of the decisions, so the channel queues the events in the order the
        bridge received them. A channel bounded by ``MaxQueueLength`` waits for the phase two before it plans (its
        admission must count the events of the previous T2)."""
        proxy = self.proxy
        completer = self.completer()
        if int(proxy.channel.admin_props.get(CosNotification.MaxQueueLength, 0) or 0):
            completer.drain()
        else:
            completer.wait_for_room()
        work = _TakeAndStore(self, rt, settings, target, wait_s)
        assert rt.t2 is not None             # a round runs only on a node with T2 (local_target)
        run = T2Runner(rt.t2, rt.db, reason=_reason).run(work, _InboundHooks(self), timeout=settings.timeout_s or None,
                                                          completer=completer)
        if run.outcome in (RunOutcome.COMMITTED, RunOutcome.DEFERRED):
            return work.received
        if run.error is None:                # nothing received: the work abandoned the T2
            if run.txn is not None:
                _disown(rt.t2, run.txn.gtrid)
            return 0
        if run.txn is not None:              # it began: its failure is this driver's
            self._failed(run.txn, run.cause or run.error)
        raise run.error

    def _complete(self, txn: Transaction, outcome: XaOutcome | None, error: Exception | None, plan: RoutePlan) -> None:
        """Phase two of a decided T2 ended (on the completer) and the session went back to the pool: once the
        PostgreSQL branch committed, the events are queued in memory. A phase two that failed outside a branch's
        outcome was handed to recovery by the coordinator (it commits from the COMMIT record)."""
        proxy = self.proxy
        if error is not None:
            self.last_error = f"{type(error).__name__}: {error}"[:500]
            log.error("proxy %s: phase two of T2 %s failed; handed to recovery, which commits it from its "
                      "COMMIT record; its %d event(s) are queued once it did", proxy.oid, txn.gtrid,
                      len(plan.plans), exc_info=error)
        if outcome is None:
            self._await_recovery(txn.gtrid, plan)
            return
        self.committed += 1
        self.last_error = ""
        if any(b.name == "pg" and b.outcome is not BranchOutcome.COMMITTED for b in outcome.branches):
            log.error("proxy %s: T2 %s decided COMMIT but its PostgreSQL branch is not confirmed; recovery commits "
                      "it and its %d event(s) are queued once it did", proxy.oid, txn.gtrid, len(plan.plans))
            self._await_recovery(txn.gtrid, plan)
            return
        try:
            proxy.channel.publish(plan)
        finally:
            _disown(proxy.rt.t2, txn.gtrid)

    def _await_recovery(self, gtrid: str, plan: RoutePlan) -> None:
        if plan.plans:
            with self._recovering_lock:
                self._recovering[gtrid] = plan
        else:
            _disown(self.proxy.rt.t2, gtrid)

    def publish_recovered(self) -> int:
        """Queue the events of the decided T2s whose PostgreSQL branch recovery has committed since (issue 31:
        they stayed stuck until the node restarted, which loads them from the store). A T2 counts as committed
        there once the recovery log shows its ``pg`` branch done or the T2 ended, and the coordinator no longer
        drives it; the decision was COMMIT, so its rows are in the store. Runs on the proxy's pull thread before
        each round; returns how many T2s it published."""
        with self._recovering_lock:
            if not self._recovering:
                return 0
            waiting = dict(self._recovering)
        t2 = self.proxy.rt.t2
        if t2 is None:
            return 0
        try:
            live, busy = t2.log.live(), t2.coordinator.in_flight()
        except Exception as exc:  # noqa: BLE001 — the log refuses reads after a durability failure: a restart loads them
            log.debug("proxy %s: T2s awaiting recovery wait: %s", self.proxy.oid, exc)
            return 0
        published = 0
        for gtrid, plan in waiting.items():
            entry = live.get(gtrid)
            if gtrid in busy or (entry is not None and "pg" not in entry.done):
                continue
            with self._recovering_lock:
                self._recovering.pop(gtrid, None)
            try:
                self.proxy.channel.publish(plan)
            except Exception:  # a target gone meanwhile: the rows stay stored; the next start loads what remains
                log.exception("proxy %s: queueing the events of T2 %s after its recovery failed", self.proxy.oid,
                              gtrid)
                continue
            finally:
                _disown(t2, gtrid)
            published += 1
            log.warning("proxy %s: T2 %s: recovery committed its PostgreSQL branch; its %d event(s) are queued",
                        self.proxy.oid, gtrid, len(plan.plans))
        return published

    def completer(self) -> Completer:
        """The proxy's phase-two thread for its JMS → channel T2s (made on first use)."""
        if self._completer is None:
            self._completer = Completer(f"t2-in-complete-{self.proxy.oid}")
        return self._completer

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until the phase two of every decided T2 ended (and its events were published)."""
        return True if self._completer is None else self._completer.drain(timeout)

    def _plan(self, batch: InboundBatch) -> RoutePlan:
        return plan_events(self.proxy, batch)

    def _failed(self, txn: Transaction, exc: BaseException) -> None:
        # This driver queues nothing of a T2 that failed: if its branch is committed later (recovery commits a
        # decided one; an operator commits an undecided one it could not roll back), router/routing/t2/latecommit.py
        # queues its events. The runner rolled an undecided one back already (router.routing.runner).
        _disown(self.proxy.rt.t2, txn.gtrid)
        if isinstance(exc, TransactionRolledBack) or txn.state in (State.ROLLED_BACK, State.ROLLING_BACK):
            self.rolled_back += 1
            if txn.timed_out:
                self.timed_out += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:500]

    def status(self) -> dict[str, Any]:
        return {"t2_committed": self.committed, "t2_rolled_back": self.rolled_back, "t2_timed_out": self.timed_out,
                "t2_last_error": self.last_error}
