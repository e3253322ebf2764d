"""Delivery of a push proxy supplier in a routing transaction (T2, NJI 2.7.2, 2.7.3.1, 2.7.6.1).

A push proxy supplier (structured or sequence) whose ``EnableTransaction`` QoS is TRUE and whose connected client
is a T2 participant of this node (a bridge endpoint receiver, found through ``NodeTransactions.local`` by its
stringified IOR) is the transaction client of NJI 2.7.3.1: instead of the CORBA push it runs each batch in a T2:

* the batch: the entries the dispatcher took plus what else is queued, up to ``TransactionEvents`` events
  (structured proxies) or ``TransactionEventSequences`` sequences of ``MaximumBatchSize`` events (sequence
  proxies), NJI Table 2-10; the values the bridge's ``enable_transaction`` stored on the proxy
  (``extra["transaction"]``), else the channel's admin properties, else 1;
* ``coordinator.begin(TransactionTimeout)`` (seconds; 0 = no deadline);
* the participant's ``begin_in_t2(txn)`` when it has one (the bridge enlists its broker branch, BEGIN's receipt
  awaited in the background);
* the PostgreSQL branch: the batch's queue rows are deleted in it (``Store.delete_deliveries``);
* the participant's ``forward_in_t2(txn, conn, events)`` (the bridge: outbox rows, broker SEND branch);
* ``txn.decide()`` (phase one and the durable COMMIT record); phase two (``txn.complete()``), the return of the
  branch's session and the release of the records (their rows went with the PostgreSQL branch) run on the proxy's
  :class:`Completer`, while the proxy goes on with its next batch (pipelining: phase two of T2 *n* overlaps
  phase one of T2 *n+1*; the completer keeps the broker's commits in the order of the decisions).

A rollback (rollback-only set by the bridge, a branch that could not prepare, ``TransactionTimeout``) puts the
entries back in their places and the dispatcher retries with backoff, like a failed push: nothing is lost and the
order is kept. A rollback caused by the batch's content (the broker refused a frame) makes the proxy deliver the
batch's entries one per T2 (``isolating``, as the non-T2 path does for a failing batch); an entry that fails alone
is then dead-lettered by the bridge INSIDE its next T2 (the bridge's dead-letter destination, with the reason);
if even that fails :data:`~router.channel.boundary.POISON_ATTEMPTS` times, the channel dead-letters it as the
non-T2 path does (into the channel's dead-letter store, :mod:`router.channel.deadletters`; ERROR log,
``dead_lettered`` in the proxy's status). Outages (broker or database unavailable,
deadline passed) never count against an event.

``DecisionUnknown`` (the COMMIT record may or may not be durable): logged at ERROR, the entries are kept out of
the queue (recovery decides; the next batches go on) and the proxy's status shows ``t2_in_doubt``. Once the
transaction is no longer live in the recovery log, the entries whose queue rows still exist are put back, the
others released.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from router.channel import qos as Q
from router.channel.boundary import POISON_ATTEMPTS, Outcome
from router.channel.events import as_structured
from router.channel.inflight import Flight
from router.channel.proxyport import ProxyView, PushDelivering, SupplierView
from router.channel.queue import Entry
from router.routing.completer import Completer
from router.routing.errors import ForwardFailed, refused_content
from router.routing.ledger import Outcome as Ledgered
from router.routing.ledger import t2_branch
from router.routing.ports import OutboundParticipant
from router.routing.runner import Outcome as RunOutcome
from router.routing.runner import RunHooks, RunResult, T2Runner
from xa.coordinator import Transaction
from xa.errors import TransactionTimeout
from xa.pg import PgBranch
from xa.xid import dedupe_id as message_dedupe_id

__all__ = ["Completer", "ForwardFailed", "T2State", "check_honoured", "client_refused", "deliver", "drain",
           "participant", "settings", "status"]

log = logging.getLogger("nsjms.channel")

PG_BRANCH = "queue"
_ISOLATE_AFTER_TIMEOUTS = 3      # consecutive timeouts of a multi-event batch before it is delivered one by one


@dataclass
class T2State:
    """The T2 bookkeeping of one proxy supplier."""

    committed: int = 0
    rolled_back: int = 0
    timeouts: int = 0
    phase_two_failed: int = 0                                   # decided T2s whose phase two recovery finishes
    in_doubt: dict[str, list[Entry]] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)       # record seq -> why it failed alone (content)
    consecutive_timeouts: int = 0
    last_rollback: str = ""
    active: str | None = None                                   # gtrid of the T2 in progress
    unavailable_warned: bool = False


def state(proxy: SupplierView) -> T2State:
    st = proxy.t2_state
    if st is None:
        st = proxy.t2_state = T2State()
    return st


def enabled(proxy: SupplierView) -> bool:
    return bool(proxy.qos.get(Q.ENABLE_TRANSACTION, False))


def participant(proxy: PushDelivering) -> OutboundParticipant | None:
    """The in-process T2 participant the proxy's client is, when this proxy delivers in T2; None otherwise (the
    proxy then pushes over CORBA as usual)."""
    if not enabled(proxy):
        drain(proxy)                # a batch delivered outside T2 goes after the T2s already decided
        return None
    target = participant_quiet(proxy)
    if target is None:
        drain(proxy)
        st = state(proxy)
        if not st.unavailable_warned:
            st.unavailable_warned = True
            log.warning("proxy %s: EnableTransaction is TRUE but %s; delivering without a routing transaction",
                        proxy.oid, unavailable_reason(proxy))
    return target


def unavailable_reason(proxy: SupplierView) -> str:
    if proxy.rt.t2 is None:
        return "this runtime has no routing transactions"
    if _acknowledging(proxy):
        return "it is an acknowledging proxy (DeliveryReliability=Acknowledgment), which has its own delivery"
    return "its consumer is not a bridge endpoint of this node"


def _acknowledging(proxy: SupplierView) -> bool:
    """An Ack proxy supplier (router.channel.ack) runs its own push loop, which never calls ``_deliver``."""
    return proxy.acknowledging


def settings(proxy: SupplierView) -> tuple[int, float]:
    """(events per T2, TransactionTimeout seconds) for ``proxy`` (see the module docstring)."""
    own = proxy.extra.get("transaction") or {}
    admin = proxy.channel.admin_props or {}
    timeout = float(own.get("timeout", admin.get(Q.TRANSACTION_TIMEOUT, 0)) or 0)
    if proxy.form == "SEQUENCE":
        sequences = int(own.get("sequences") or admin.get(Q.TRANSACTION_EVENT_SEQUENCES, 1) or 1)
        return max(1, sequences) * proxy.batch_size(), timeout
    return max(1, int(own.get("events") or admin.get(Q.TRANSACTION_EVENTS, 1) or 1)), timeout


def status(proxy: SupplierView) -> dict[str, Any]:
    """The proxy's T2 fields for ``nsjms status`` (empty when it never ran one and is not enabled)."""
    st = proxy.t2_state
    if st is None and not enabled(proxy):
        return {}
    st = st or T2State()
    out: dict[str, Any] = {"t2_committed": st.committed, "t2_rolled_back": st.rolled_back,
                           "t2_timeouts": st.timeouts}
    if st.active:
        out["t2_active"] = st.active
    if st.phase_two_failed:
        out["t2_phase_two_failed"] = st.phase_two_failed
    if st.in_doubt:
        out["t2_in_doubt"] = {g: len(e) for g, e in st.in_doubt.items()}
    if st.last_rollback:
        out["t2_last_rollback"] = st.last_rollback
    out.update(unavailable(proxy))
    return out


def unavailable(proxy: SupplierView) -> dict[str, Any]:
    """``t2_unavailable`` (the reason) for a connected proxy supplier of any kind (push or pull, acknowledging or
    not) whose EnableTransaction is TRUE — inherited from its admin or channel, or a stored value (docs/qos.md) —
    but that delivers without a routing transaction; else nothing."""
    if not enabled(proxy) or not proxy.connected:
        return {}
    reason = never_transactional(proxy)
    if reason is None and participant_quiet(proxy) is None:
        reason = unavailable_reason(proxy)
    return {} if reason is None else {"t2_unavailable": reason}


def warn_unavailable(proxy: SupplierView) -> None:
    """One WARNING per proxy supplier (and node run) that delivers without the routing transaction its
    EnableTransaction asks for; called when a pull or acknowledging proxy supplier starts (connect, restore). A
    plain push proxy supplier says it at its first delivery (:func:`participant`)."""
    why = unavailable(proxy).get("t2_unavailable")
    st = state(proxy)
    if why is None or st.unavailable_warned:
        return
    st.unavailable_warned = True
    log.warning("proxy %s: EnableTransaction is TRUE but %s; delivering without a routing transaction", proxy.oid,
                why)


#: ``extra`` key of a proxy: EnableTransaction was set TRUE on the proxy itself (not inherited from its admin or
#: channel); router.channel.proxies.OWN_ENABLE_TRANSACTION
OWN_ENABLE_TRANSACTION = "own_enable_transaction"


def enable_needs_check(proxy: ProxyView, qos: dict[str, Any], requested: frozenset[str] | None) -> bool:
    """Whether the request (``requested``: the names it sets on the proxy, None: all of ``qos``) makes the proxy's
    EnableTransaction TRUE where it was not checked yet: it asks for TRUE, and the proxy holds no TRUE yet, or holds
    one only by inheritance (a value its admin or channel had, copied in when the proxy was made) and the request
    sets it on the proxy itself. A request that leaves EnableTransaction alone keeps an inherited TRUE (shown as
    ``t2_unavailable`` where it cannot run); TRUE already set on the proxy itself was checked when it was set."""
    if not qos.get(Q.ENABLE_TRANSACTION):
        return False
    if not proxy.qos.get(Q.ENABLE_TRANSACTION):
        return True
    named = requested is None or Q.ENABLE_TRANSACTION in requested
    return named and not proxy.extra.get(OWN_ENABLE_TRANSACTION)


def never_transactional(proxy: SupplierView) -> str | None:
    """Why proxy supplier ``proxy`` can never run a routing transaction, whatever its consumer (NJI 2.7.2), or None."""
    if proxy.rt.t2 is None:
        return "this node runs no routing transactions"
    if proxy.style == "PULL":
        return "it is a pull proxy supplier (nsjms has no OTS to receive a client's transaction)"
    if _acknowledging(proxy):
        return "it is an acknowledging proxy supplier (DeliveryReliability=Acknowledgment), which has its own delivery"
    return None


def check_honoured(proxy: SupplierView, qos: dict[str, Any], requested: frozenset[str] | None = None) -> None:
    """``EnableTransaction`` = TRUE on a proxy supplier is accepted only where a routing transaction can run
    (NJI 2.7.2): a PUSH proxy supplier whose connected consumer is a bridge endpoint of this node, or that has no
    consumer yet (decided at delivery: see :func:`status`). A pull proxy supplier (NJI's transaction server role:
    nsjms has no OTS to receive a client's transaction) and a push proxy supplier connected to any other consumer
    refuse it with UnsupportedQoS (UNAVAILABLE_VALUE), and so does an acknowledging proxy supplier
    (DeliveryReliability=Acknowledgment: its own resend window delivers, outside any T2). Checked when the request
    sets TRUE on the proxy itself, also when the proxy already inherited TRUE (:func:`enable_needs_check`)."""
    if not enable_needs_check(proxy, qos, requested):
        return
    if never_transactional(proxy) is not None or (proxy.connected and participant_quiet(proxy) is None):
        raise Q.QoSError([Q.PropertyProblem("UNAVAILABLE_VALUE", Q.ENABLE_TRANSACTION, False, False)])


def client_refused(proxy: SupplierView, client: Any) -> str | None:
    """Why ``client`` (a consumer about to connect) cannot take part in this push proxy supplier's routing
    transactions, or None when it can: it is a bridge endpoint of this node (a T2 participant)."""
    t2 = proxy.rt.t2
    if t2 is None or _acknowledging(proxy):
        return unavailable_reason(proxy)
    if t2.local(proxy.rt.ior(client)) is not None:
        return None
    if proxy.rt.endpoints.outbound_t2(client) is not None:
        return None
    return "its consumer is not a bridge endpoint of this node"


def participant_quiet(proxy: SupplierView) -> OutboundParticipant | None:
    """The participant registered under the client's IOR; else the one the node's local endpoints hold for the
    servant behind the client reference (the same bridge, whatever its IOR's spelling)."""
    t2 = proxy.rt.t2
    if t2 is None or not proxy.client_ior or _acknowledging(proxy):
        return None
    target: OutboundParticipant | None = t2.local(proxy.client_ior)
    if target is None:
        try:
            target = proxy.rt.endpoints.outbound_t2(proxy.client_ref())
        except Exception:  # noqa: BLE001 — not resolvable here: not a local participant
            target = None
        if target is not None:
            t2.register_local(proxy.client_ior, target)
    return target


# ----------------------------------------------------------------------------------------------- delivering
def deliver(proxy: PushDelivering, target: OutboundParticipant, entries: list[Entry]) -> Outcome:
    """One T2 for ``entries`` (plus what else is queued, up to the batch size). Every entry ends delivered, put
    back, held for recovery (decision unknown) or dead-lettered."""
    st = state(proxy)
    limit, timeout = settings(proxy)
    if proxy.isolating:
        limit = 1
    flight = proxy.push_flight   # the push in flight (router.channel.inflight), vs a teardown
    if _resolve_in_doubt(proxy, st):          # entries were put back ahead of these: take again, in order
        proxy.queue.requeue(entries)
        if flight is not None:
            flight.drop(entries)
        entries = proxy.queue.take(limit)
        taken = entries
    elif len(entries) < limit:
        taken = proxy.queue.take(limit - len(entries))
        entries = entries + taken
    else:
        taken = []
    if flight is not None:                    # a teardown waits for the whole T2 and records what it took
        flight.add(taken)
        flight.allow((timeout or 0.0) + 2.0)
    if not entries:
        return Outcome.DELIVERED
    try:
        events = [as_structured(e.record.event) for e in entries]
    except Exception as exc:  # noqa: BLE001 — the channel cannot convert this content: event-specific
        proxy.content_failed(entries, exc)
        return Outcome.EVENT_FAILED
    dead_reason = st.reasons.get(entries[0].record.seq) if len(entries) == 1 else None
    completer(proxy).wait_for_room()     # at most two T2s of the proxy hold a session and a prepared transaction
    hooks = _OutboundHooks(proxy, st, target, entries, flight)
    assert proxy.rt.t2 is not None            # a proxy delivers in T2 only on a node with T2 (participant)
    try:
        run = T2Runner(proxy.rt.t2, proxy.rt.db).run(_Forward(proxy, target, hooks, events, dead_reason), hooks,
                                                      timeout=timeout or None, completer=completer(proxy))
        return _settle(proxy, st, target, hooks.entries, run)     # without the events whose rows were gone
    finally:
        st.active = None


class _Forward:
    """The work of one channel → JMS T2: the participant's broker branch begins, the PostgreSQL branch deletes
    the batch's queue rows, the participant forwards the events (outbox rows, broker SENDs)."""

    def __init__(self, proxy: PushDelivering, target: OutboundParticipant, hooks: _OutboundHooks, events: list[Any],
                 dead_reason: str | None) -> None:
        self.proxy, self.target, self.hooks, self.events, self.dead_reason = proxy, target, hooks, events, dead_reason

    def __call__(self, txn: Transaction, conn: Any) -> Any:
        proxy, entries, dead_reason = self.proxy, self.hooks.entries, self.dead_reason
        t2 = proxy.rt.t2
        assert t2 is not None                 # a proxy delivers in T2 only on a node with T2 (participant)
        self.target.begin_in_t2(txn)          # the broker's BEGIN goes out now, its receipt overlaps our SQL
        t2.enlist(txn, t2_branch(proxy.rt.store.ledger, conn, PgBranch(conn, PG_BRANCH), txn.gtrid,
                                 [e.record.db_id for e in entries]))
        ids = [e.record.db_id for e in entries if e.record.db_id is not None]
        store, where = proxy.rt.store, (conn, proxy.channel.id, proxy.admin.id, proxy.id, ids)
        deleted = (store.delete_deliveries(*where, returning=True, outcome=Ledgered.DEAD_LETTER, reason=dead_reason)
                   if dead_reason else store.delete_deliveries(*where, returning=True))
        if deleted is not None and len(deleted) < len(ids):       # another unit of work ended some deliveries
            self.hooks.entries, self.events = _without_gone(proxy, txn.gtrid, conn, entries, self.events, deleted)
        return self.target.forward_in_t2(txn, conn, self.events, dead_letter_reason=dead_reason)


class _OutboundHooks(RunHooks[Any]):
    """The proxy's part of its T2s (router.routing.runner): bookkeeping once decided, phase two's end."""

    def __init__(self, proxy: PushDelivering, st: T2State, target: OutboundParticipant, entries: list[Entry],
                 flight: Flight[Entry] | None) -> None:
        self.proxy, self.st, self.target, self.entries, self.flight = proxy, st, target, entries, flight
        self.token: int | None = None

    def started(self, txn: Transaction) -> None:
        self.st.active = txn.gtrid

    def decided(self, txn: Transaction, value: Any) -> None:
        # Decided: the T2 commits whatever happens now (recovery finishes it after a crash), so the proxy goes on
        # with its next batch while this one's phase two runs on the proxy's completer
        # (docs/transactions.md#performance).
        st, proxy = self.st, self.proxy
        st.consecutive_timeouts = 0
        for e in self.entries:
            st.reasons.pop(e.record.seq, None)
        proxy.failing, proxy.failed_attempts = None, 0
        proxy.delivered_one_batch()
        # a teardown of the proxy (its own destroy, its channel's) waits for this phase two too (bounded), never
        # deleting the proxy under a committing T2 nor recording its entries discarded (router.channel.inflight)
        if self.flight is not None:
            self.token = self.flight.hold(self.entries, PHASE_TWO_WAIT_S)

    def completed(self, txn: Transaction, value: Any, outcome: Any, error: Exception | None) -> None:
        """Phase two ended (COMMIT PREPARED, the broker's COMMIT, END) and the session went back to the pool: the
        participant hears of the end and the records are released (their rows went with the PostgreSQL branch,
        here or in recovery: the decision is COMMIT either way); only a finished phase two counts as committed."""
        done = error is None
        if not done:    # the coordinator handed it to recovery (COMMIT_PENDING, out of in_flight)
            log.error("T2 %s: phase two failed; handed to recovery, which commits it from its COMMIT record",
                      txn.gtrid, exc_info=error)
        _ended(self.target, txn, value if done else None, True)
        if done:
            self.st.committed += 1
        else:
            self.st.phase_two_failed += 1
        for e in self.entries:
            e.record.release()

    def settled(self, txn: Transaction) -> None:
        if self.flight is not None and self.token is not None:
            self.flight.settle(self.token)


def _settle(proxy: PushDelivering, st: T2State, target: OutboundParticipant, entries: list[Entry],
            run: RunResult[Any]) -> Outcome:
    """The proxy's side of a T2's outcome: its entries delivered, held for recovery, or put back."""
    txn = run.txn
    match run.outcome:
        case RunOutcome.COMMITTED | RunOutcome.DEFERRED:
            return Outcome.DELIVERED
        case RunOutcome.IN_DOUBT:
            exc = run.cause
            gtrid = getattr(exc, "gtrid", None) or (txn.gtrid if txn else "?")
            st.in_doubt[gtrid] = entries
            proxy.failing = f"T2 decision unknown: {exc}"
            log.error("proxy %s: T2 %s: %s; %d event(s) held out of the queue until recovery decides", proxy.oid,
                      getattr(exc, "gtrid", None), exc, len(entries))
            _ended(target, txn, None, False, str(exc))
            return Outcome.RETRY
        case RunOutcome.ROLLED_BACK:
            _ended(target, txn, None, False, run.reason)
            error = run.error
            if not isinstance(error, Exception):
                proxy.queue.requeue(entries)
                run.reraise_interrupt()
                raise AssertionError("a T2 the work abandoned")   # deliver's work never abandons
            return _rolled_back(proxy, st, entries, error, run.reason)


#: How long a teardown of the proxy waits for a decided T2's phase two (COMMIT PREPARED and the broker's COMMIT
#: receipt); past it the teardown goes on and recovery finishes the T2 from its COMMIT record.
PHASE_TWO_WAIT_S = 15.0


def completer(proxy: SupplierView) -> Completer:
    """The proxy's :class:`Completer` (created on first use)."""
    c = proxy.t2_completer
    if c is None:
        c = proxy.t2_completer = Completer(f"t2-complete-{proxy.oid}")
    return c


def drain(proxy: SupplierView, timeout: float | None = None) -> bool:
    """Wait for the phase two of the proxy's decided T2s (its delivery ends, or it stops delivering in T2)."""
    c = proxy.t2_completer
    return True if c is None else c.drain(timeout)


def _without_gone(proxy: PushDelivering, gtrid: str, conn: Any, entries: list[Entry], events: list[Any],
                  deleted: set[int]) -> tuple[list[Entry], list[Any]]:
    """The entries (and their events) whose queue rows this T2 deleted, and those of BestEffort events; the others'
    rows were already gone: another unit of work ended their delivery — typically a previous run's undecided T2
    that an operator committed (``nsjms txn commit --heuristic``) after the restore had loaded its deleted but
    uncommitted rows (the start-up pass failed to roll it back); its outbox re-sends them with their dedupe ids.
    Sending them again here, under this T2's ids, would be a duplicate nobody could recognise: they leave memory
    instead (that unit of work wrote their ledger rows). The T2's ledger rows name the messages by their new
    places (:func:`router.routing.ledger.t2_branch`'s ``messages``)."""
    keep = [k for k, e in enumerate(entries) if e.record.db_id is None or e.record.db_id in deleted]
    kept_at = set(keep)
    gone = [e for k, e in enumerate(entries) if k not in kept_at]
    log.warning("proxy %s: T2 %s: %d event(s) of the batch no longer have their queue row (another unit of work, "
                "e.g. a heuristic commit of an earlier T2, ended their delivery): not sent again (event ids %s)",
                proxy.oid, gtrid, len(gone), [e.record.db_id for e in gone][:10])
    flight = proxy.push_flight
    if flight is not None:
        flight.drop(gone)
    for e in gone:
        e.record.release()
    kept = [entries[k] for k in keep]
    rows = proxy.rt.store.ledger.t2_rows(conn)
    if rows is not None:
        rows.messages = {e.record.db_id: message_dedupe_id(gtrid, i) for i, e in enumerate(kept)
                         if e.record.db_id is not None}
        rows.rows = [replace(r, jms_message_id=rows.messages.get(r.event_id)) if r.gtrid == gtrid
                     and r.event_id is not None else r for r in rows.rows]
    return kept, [events[k] for k in keep]


def _ended(target: OutboundParticipant, txn: Transaction | None, result: Any, committed: bool,
           reason: str = "") -> None:
    if txn is None:
        return
    try:
        target.ended(txn.gtrid, result, committed, reason)
    except Exception:
        log.exception("T2 %s: the participant's end callback failed", txn.gtrid)


def _rolled_back(proxy: PushDelivering, st: T2State, entries: list[Entry], exc: Exception, reason: str) -> Outcome:
    st.rolled_back += 1
    st.last_rollback = reason
    content = refused_content(exc)     # ForwardFailed / a refused frame found at prepare
    timed_out = isinstance(exc, TransactionTimeout)
    if timed_out:
        st.timeouts += 1
        st.consecutive_timeouts += 1
    if content:
        return _content_failure(proxy, st, entries, reason)
    if timed_out and len(entries) > 1 and st.consecutive_timeouts >= _ISOLATE_AFTER_TIMEOUTS:
        proxy.isolating = max(proxy.isolating, len(entries))
        log.warning("proxy %s: %d routing transactions in a row passed their TransactionTimeout; delivering the "
                    "next %d event(s) one per transaction", proxy.oid, st.consecutive_timeouts, len(entries))
    proxy.failing, proxy.failed_attempts = f"T2 rolled back: {reason}", proxy.failed_attempts + 1
    log.warning("proxy %s: routing transaction rolled back (%s, attempt %d); %d event(s) stay queued", proxy.oid,
                reason, proxy.failed_attempts, len(entries))
    proxy.queue.requeue(entries)
    return Outcome.RETRY


def _content_failure(proxy: PushDelivering, st: T2State, entries: list[Entry], reason: str) -> Outcome:
    """The batch's content made the T2 roll back: isolate, then dead-letter through the bridge, then here."""
    if len(entries) > 1:
        proxy.isolating = max(proxy.isolating, len(entries))
        log.warning("proxy %s: a routing transaction of %d event(s) rolled back because of its content (%s); "
                    "delivering them one per transaction", proxy.oid, len(entries), reason)
        proxy.queue.requeue(entries)
        return Outcome.EVENT_FAILED
    entry = entries[0]
    entry.failures += 1
    if entry.failures >= POISON_ATTEMPTS:
        st.reasons.pop(entry.record.seq, None)
        proxy.dead_letter_entry(entry, f"{reason} (its dead letter could not be sent either, in "
                                  f"{entry.failures - 1} routing transaction(s))",
                           readable=f"its routing transaction to the JMS bridge rolled back because of its content "
                                    f"{entry.failures} time(s), and the bridge could not send it to its dead-letter "
                                    "destination either")
        return Outcome.EVENT_FAILED
    st.reasons.setdefault(entry.record.seq, reason)
    log.warning("proxy %s: event seq=%d alone failed its routing transaction (%s, attempt %d of %d); the bridge "
                "dead-letters it in the next one", proxy.oid, entry.record.seq, reason, entry.failures,
                POISON_ATTEMPTS)
    proxy.queue.requeue(entries)
    return Outcome.EVENT_FAILED


# ------------------------------------------------------------------------------------------ decision unknown
def _resolve_in_doubt(proxy: PushDelivering, st: T2State) -> bool:
    """Entries of a T2 whose decision was unknown: once recovery finished it, put back what is still queued in
    the store (rolled back) and release the rest (committed). True when entries were put back."""
    if not st.in_doubt:
        return False
    t2 = proxy.rt.t2
    if t2 is None:
        return False
    put_back = False
    try:
        live = set(t2.log.live()) | set(t2.coordinator.in_flight())
    except Exception as exc:  # noqa: BLE001 — the log refuses reads after a durability failure: wait for a restart
        log.debug("proxy %s: in-doubt T2s wait: %s", proxy.oid, exc)
        return False
    for gtrid in [g for g in st.in_doubt if g not in live]:
        entries = st.in_doubt[gtrid]
        ids = [e.record.db_id for e in entries if e.record.db_id is not None]
        try:
            with proxy.rt.db.unit_of_work() as conn:
                rows = conn.execute(
                    "SELECT event_id FROM nsjms_queue WHERE channel_id = %s AND admin_id = %s AND proxy_id = %s "
                    "AND event_id = ANY(%s)", (proxy.channel.id, proxy.admin.id, proxy.id, ids)).fetchall()
        except Exception as exc:  # noqa: BLE001 — the database is unavailable: try again at the next batch
            log.warning("proxy %s: cannot settle in-doubt T2 %s yet: %s", proxy.oid, gtrid, exc)
            continue
        still = {int(r[0]) for r in rows}
        back = [e for e in entries if e.record.db_id in still]
        done = [e for e in entries if e.record.db_id not in still]
        del st.in_doubt[gtrid]
        log.warning("proxy %s: in-doubt T2 %s settled by recovery: %d event(s) delivered, %d put back", proxy.oid,
                    gtrid, len(done), len(back))
        if back:
            proxy.queue.requeue(back)
            put_back = True
        for e in done:
            e.record.release()
    return put_back
