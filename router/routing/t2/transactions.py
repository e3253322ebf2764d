"""The node's routing transactions (T2, NJI 2.7): coordinator, recovery log, recovery, outbox and inbox.

One :class:`NodeTransactions` per node, made by the node before anything routes:

* ``coordinator``: :class:`xa.Coordinator` over the node's recovery log (a file journal in the state directory,
  ``<state>/xa-<node>.log``; docs/transactions.md says why a file and not a table);
* ``recovery``: :class:`xa.RecoveryManager` over the node's PostgreSQL database (manager key ``postgresql``) and the
  two one-phase STOMP participants: ``stomp-send`` (re-send the transaction's outbox rows with their dedupe ids,
  :class:`OutboxResender`) and ``stomp-ack`` (nothing to re-send: the broker redelivers what was not acknowledged
  and the inbox recognises it);
* :meth:`NodeTransactions.start` runs one recovery pass before routing starts, with no in-flight guard (the node
  holds its state-directory lock and has begun nothing, so every prepared branch of this node is from an earlier
  run; left prepared, its row locks would block the new run's transactions on the same queue rows), then a thread
  that marks overdue transactions (``TransactionTimeout``), runs recovery every ``period`` seconds with the guard,
  and deletes outbox rows of ended transactions and inbox rows older than the retention.

The outbox functions and the re-sender live in :mod:`router.routing.outbox` (re-exported here); they and
:func:`inbox_claim` take the caller's connection (the T2's PostgreSQL branch) and run one statement each.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import Xid

from router.cluster.decisions import FencedDecisionLog, FencedRecovery, recover_fenced
from router.db.conninfo import connect as connect_bounded
from router.db.inbox import NO_TIMESTAMP_DAY
from router.db.inbox import maintain as inbox_maintain
from router.db.inbox import purge_default as inbox_purge_default
from router.db.inbox import sent_day as inbox_sent_day
from router.jms.model import Destination
from router.jms.transport import MessageCodec, Transport, TransportError
from router.routing.crashpoints import armed, crashpoint, pausepoint, pauses_armed
from router.routing.ledger import T2HopRecorder, T2Hops
from router.routing.ledger_takeover import record_resends
from router.routing.outbox import (
    ACK_MANAGER,
    OUTBOX_DEAD_LETTER,
    OUTBOX_DEFAULT_CODEC,
    SEND_MANAGER,
    OutboxResender,
    OutboxRow,
    outbox_delete,
    outbox_insert,
    outbox_rows,
    outbox_rows_many,
)
from router.routing.t2.latecommit import LateCommitManager, LateCommits
from xa.coordinator import Coordinator, Transaction
from xa.errors import ResourceError
from xa.log import FileLog, RecoveryLog
from xa.observer import Observer
from xa.pg import PgManager
from xa.records import Participant
from xa.recovery import InDoubt, RecoveryManager, RecoveryReport, SafeAction
from xa.resource import Clock, Resource, SystemClock
from xa.xid import NodeId

__all__ = [
    "ACK_MANAGER", "OPERATOR_SEND", "OUTBOX_DEAD_LETTER", "OUTBOX_DEFAULT_CODEC", "PG_MANAGER", "SEND_MANAGER",
    "NodeTransactions", "OutboxResender", "OutboxRow",
    "inbox_claim", "outbox_delete", "outbox_insert", "outbox_rows", "outbox_rows_many",
]

log = logging.getLogger("nsjms.t2")

PG_MANAGER = "postgresql"
DEFAULT_GUARD_S = 60.0
DEFAULT_PERIOD_S = 5.0
#: How often the inbox's day partitions are maintained (created ahead, dropped past the retention).
INBOX_MAINTENANCE_S = 600.0
DEFAULT_INBOX_RETENTION_S = 7 * 86400.0
#: The broker send branch named by an operator's COMMIT of an undecided T2 (``xa.recovery.RecoveryManager.resolve``):
#: recovery re-sends the T2's outbox rows once its PostgreSQL branch is committed; a T2 without outbox rows (JMS ->
#: channel) has nothing to re-send and the branch is done at once.
OPERATOR_SEND = Participant("broker", "stomp-send", SEND_MANAGER, True)
Conn = psycopg.Connection[Any]


# ----------------------------------------------------------------------------------------------- outbox / inbox

def inbox_claim(conn: Conn, bridge_id: int, message_ids: Sequence[str], gtrid: str,
                sent_ms: Mapping[str, int | str] | None = None) -> set[str]:
    """Record ``message_ids`` as received by ``bridge_id`` in the caller's branch; returns the ids that were NEW.
    An id already there (committed by an earlier T2) is a redelivery: the caller acknowledges it without an
    event. An id a concurrent, undecided T2 holds makes this statement wait for that T2's outcome.

    ``sent_ms``: each message's JMSTimestamp (ms, or the STOMP ``timestamp`` header; missing or 0: none), whose
    UTC day is the row's partition (``router/db/inbox.py``): a redelivery has the same timestamp, so the same
    partition and key. A row of the day 1970-01-01 (no timestamp, or kept from before migration 0005, whose
    timestamp is not known) for the id counts too."""
    if not message_ids:
        return set()
    ids = list(message_ids)
    days = [inbox_sent_day((sent_ms or {}).get(m)) for m in ids]
    rows = conn.execute(
        "WITH m AS (SELECT * FROM unnest(%s::text[], %s::date[]) AS t(message_id, sent_day)), "
        "legacy AS (SELECT message_id FROM nsjms_inbox WHERE bridge_id = %s AND sent_day = %s "
        "AND message_id = ANY(%s)) "
        "INSERT INTO nsjms_inbox(bridge_id, message_id, gtrid, sent_day) SELECT %s, m.message_id, %s, m.sent_day "
        "FROM m WHERE m.message_id NOT IN (SELECT message_id FROM legacy) "
        "ON CONFLICT DO NOTHING RETURNING message_id",
        (ids, days, bridge_id, NO_TIMESTAMP_DAY, ids, bridge_id, gtrid)).fetchall()
    return {str(r[0]) for r in rows}


# ------------------------------------------------------------------------------------------------- the node
class NodeTransactions:
    """The node's T2 machinery (see the module docstring). Thread-safe."""

    def __init__(self, node_id: str, state_dir: Path, db: Any, dsn: str, *,
                 transport: Callable[[], Transport] | None = None, clock: Clock | None = None,
                 guard_s: float = DEFAULT_GUARD_S, period_s: float = DEFAULT_PERIOD_S,
                 inbox_retention_s: float = DEFAULT_INBOX_RETENTION_S, observer: Observer | None = None,
                 ledger_hops: bool = False, epoch: Callable[[], int | None] | None = None,
                 codecs: Sequence[MessageCodec] = (), dead_letter: Destination = OUTBOX_DEAD_LETTER) -> None:
        """``epoch``: the node's live cluster epoch (None once fenced); given, the decisions of the coordinator and
        of recovery (an operator's commit) are also written to PostgreSQL, fenced by it, and their rows deleted once
        the transactions end (router/cluster/decisions.py, docs/cluster.md). ``codecs``, ``dead_letter``: the outbox
        re-sender's (:class:`OutboxResender`), for this run's re-sends and a takeover's alike."""
        self.node = NodeId(node_id)
        self.db = db
        self.clock: Clock = clock or SystemClock()
        self.period_s = period_s
        self.inbox_retention_s = inbox_retention_s
        self.log = FileLog(state_dir, self.node)
        # ledger_hops: the decision and broker-commit times go into the T2s' ledger rows at the purge (docs/audit.md)
        self.hops = T2HopRecorder(observer) if ledger_hops else None
        self.epoch = epoch
        decisions: RecoveryLog = self.log
        if epoch is not None:
            decisions = FencedDecisionLog(self.log, db, node_id, epoch)
        self.coordinator = Coordinator(self.node, decisions, self.clock, observer=self.hops or observer)
        # bounded: a recovery pass (and `nsjms txn`, which waits for it) never hangs on a cut network
        self.pg = PgManager(lambda: connect_bounded(dsn, autocommit=True, connect_timeout=3), key=PG_MANAGER)
        # what recovery or an operator commits is queued by the running channels (router/routing/t2/latecommit.py)
        self.late = LateCommits()
        self.pg = LateCommitManager(self.pg, self.late, self._prepared_ids)  # type: ignore[assignment]
        if armed() or pauses_armed():
            self.pg = _CrashingManager(self.pg)  # type: ignore[assignment]
        self._transport_factory = transport
        self._transport: Transport | None = None
        self._transport_lock = threading.Lock()
        # One recovery pass or operator action (nsjms txn) at a time: an operator's heuristic commit must not meet a
        # concurrent presumed abort of the same branch.
        self.recovery_lock = threading.RLock()
        self.resender = OutboxResender(self._rows_of, self._resend_transport, rows_of_many=self._rows_of_many,
                                       codecs=codecs, dead_letter=dead_letter)
        self.recovery = RecoveryManager(self.node, decisions, [self.pg], self.resender, self.clock,
                                        in_flight_guard=guard_s, in_flight=self.coordinator.in_flight,
                                        observer=observer)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._targets: dict[str, Any] = {}
        self.last_report: RecoveryReport | None = None
        self.passes = 0
        self._flush_failing = False

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self, *, background: bool = True) -> RecoveryReport:
        """Recover what earlier runs left (no in-flight guard: nothing of this run has begun), then start the
        housekeeping thread. Returns the first pass's report (errors in it are retried by later passes).

        With ``background`` the first pass does only the PostgreSQL work (commit the branches of logged COMMITs,
        roll back the undecided ones: the channel must not restore rows a logged COMMIT removes, nor meet rows a
        dead run's prepared branch still locks) and the re-sends of outbox rows it made ready (``deferred`` in
        the report) are the housekeeping thread's first job, at once: the node routes meanwhile (a re-send does
        not touch what the channel restores). Without ``background`` the pass does everything before returning."""
        guard, self.recovery.guard = self.recovery.guard, 0.0
        try:
            report = self.recover_now(resend=not background)
        finally:
            self.recovery.guard = guard
        self._purge()
        self.maintain_inbox()
        if background:
            self._thread = threading.Thread(target=self._loop, args=(bool(report.deferred),),
                                            name="t2-housekeeping", daemon=True)
            self._thread.start()
        return report

    def close(self) -> None:
        """Stop the housekeeping, then delete the decision rows (``nsjms_decision``) and outbox rows of the T2s that
        ended (a clean stop leaves none behind: a survivor re-sends the outbox of every decision row it finds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._flush_ended()
        try:
            self._purge()
        except Exception as exc:  # noqa: BLE001 - the next start's purge does it
            log.warning("T2: the outbox purge at stop failed (done at the next start): %s", exc)
        self.pg.close()
        with self._transport_lock:
            if self._transport is not None:
                self._transport.close()
                self._transport = None
        self.log.close()

    def _loop(self, resend_now: bool = False) -> None:
        if resend_now:
            try:
                self.recover_now()
            except Exception:
                log.exception("T2 recovery pass failed; retrying")
        ticks = 0
        inbox_due = 0.0
        while not self._stop.wait(0.5):
            ticks += 1
            self._flush_ended()         # decision rows of ended T2s (router/cluster/decisions.py), every 0.5 s
            try:
                self.coordinator.expire()
                if ticks % max(1, int(self.period_s / 0.5)) == 0:
                    self.recover_now()
                    self._purge()
                    if time.monotonic() >= inbox_due:
                        inbox_due = time.monotonic() + (INBOX_MAINTENANCE_S if self.maintain_inbox() else
                                                        self.period_s * 12)
            except Exception:
                log.exception("T2 housekeeping pass failed; retrying")

    def _flush_ended(self) -> bool:
        """Delete the decision rows of the T2s that ended (a node in a cluster); its own try: a failing DELETE
        neither stops the recovery and purge of the tick nor logs a traceback (one warning per run of failures)."""
        flush = getattr(self.coordinator.log, "flush_ended", None)
        if flush is None:
            return True
        try:
            flush()
        except Exception as exc:  # noqa: BLE001 - kept for the next call (FencedDecisionLog.flush_ended)
            if not self._flush_failing:
                log.warning("T2: the decision rows of ended transactions could not be deleted (retried every 0.5 s): "
                            "%s", exc)
            self._flush_failing = True
            return False
        if self._flush_failing:
            log.info("T2: the decision rows of ended transactions are deleted again")
        self._flush_failing = False
        return True

    def maintain_inbox(self) -> bool:
        """Create the inbox's day partitions ahead and drop those past the retention (``router/db/inbox.py``), in
        one short transaction of its own that waits at most 2 s for the inbox's locks (a prepared T2 holding the
        table makes it fail; retried a minute later). Returns whether it succeeded."""
        try:
            with self.db.unit_of_work() as conn:
                conn.execute("SET LOCAL lock_timeout = '2s'")
                created, dropped = inbox_maintain(conn, self.inbox_retention_s)
        except Exception as exc:  # noqa: BLE001 — a store error or lock timeout: retried
            log.warning("inbox partition maintenance failed (retried): %s", exc)
            return False
        if created or dropped:
            log.info("inbox partitions: created %s; dropped %s", ", ".join(map(str, created)) or "none",
                     ", ".join(map(str, dropped)) or "none")
        return True

    # -- recovery -------------------------------------------------------------------------------------------
    def recover_now(self, *, resend: bool = True) -> RecoveryReport:
        with self.recovery_lock:
            before = self._live_for_hops()
            report = self.recovery.run(resend=resend)
            resent_at, self.resender.committed_at = self.resender.committed_at, {}
            if self.hops is not None:
                self.hops.recovered(before, report.ended, resent_at)
        self.passes += 1
        self.last_report = report
        if report.errors:
            log.warning("T2 recovery: %d problem(s), retried next pass: %s", len(report.errors),
                        "; ".join(report.errors[:5]))
        if report.committed or report.rolled_back or report.resent:
            log.info("T2 recovery: committed %d, rolled back %d, re-sent %d branch(es)", len(report.committed),
                     len(report.rolled_back), len(report.resent))
        return report

    def _live_for_hops(self) -> Mapping[str, Any]:
        if self.hops is None:
            return {}
        try:
            return self.log.live()
        except Exception:  # noqa: BLE001 - the recovery pass reports the log's failure itself
            return {}

    def recover_fenced(self, dead: str) -> FencedRecovery | None:
        """A survivor's recovery of the routing transactions of ``dead``, a node this node fenced, from PostgreSQL
        alone (router/cluster/decisions.py); returns its ``FencedRecovery`` report, None without a cluster epoch."""
        epoch = self.epoch() if self.epoch is not None else None
        if epoch is None:
            return None
        with self.recovery_lock:
            return recover_fenced(self.db, dead, self.node.value, epoch, self.pg, self.resender, SEND_MANAGER,
                                  record=self._record_resends if self.hops is not None else None)

    def _record_resends(self, conn: Conn, gtrids: list[str]) -> None:
        """The ledger's rows of a survivor's re-send of a fenced node's messages
        (router.routing.ledger_takeover.record_resends), at the re-send's broker commit (the resender's time; now if it
        has none: nothing was sent in it)."""
        now = time.time()
        record_resends(conn, self.node.value, {g: self.resender.committed_at.get(g, now) for g in gtrids})

    def view(self) -> list[InDoubt]:
        return self.recovery.view()

    def resolve(self, gtrid: str, action: SafeAction, who: str, why: str, *,
                heuristic: bool = False) -> RecoveryReport:
        """An operator's decision (``nsjms txn commit|rollback``, router.routing.t2.admin). The ledger hops of what it
        ends are filled as for recovery: acting as the log says (a logged COMMIT finished) gives ``decided_at`` =
        the COMMIT record's time and, for a re-send, ``broker_committed_at``; a heuristic COMMIT (against the log)
        gives ``decided_at`` = the operator's HEURISTIC record, written at once (the T2 stays listed until it is
        forgotten, so the purge would not reach it); what nsjms cannot know stays NULL (docs/audit.md)."""
        with self.recovery_lock:
            before = self._live_for_hops()
            report = self.recovery.resolve(gtrid, action, who, why, heuristic=heuristic, one_phase=(OPERATOR_SEND,))
            resent_at, self.resender.committed_at = self.resender.committed_at, {}
            if self.hops is not None:
                self.hops.recovered(before, report.ended, resent_at)
                if action is SafeAction.COMMIT and gtrid in report.heuristic and any(
                        done.startswith(f"{gtrid}/") for done in report.committed):   # "gtrid/branch" entries
                    self._operator_committed(gtrid)
            return report

    def _operator_committed(self, gtrid: str) -> None:
        """Fill ``decided_at`` of a T2 an operator committed heuristically: its HEURISTIC record's time (the
        decision), into the rows its committed PostgreSQL branch holds. Best effort: a failure is logged."""
        assert self.hops is not None
        try:
            txn = self.log.live().get(gtrid)
            marks = [h.at for h in txn.heuristics] if txn is not None else []
            if not marks:
                return
            with self.db.unit_of_work() as conn:
                self.hops.write(conn, {gtrid: T2Hops(decided_at=max(marks))})
        except Exception as exc:  # noqa: BLE001 - the ledger hop is an observation, never blocks the operator
            log.warning("T2 %s: the operator's commit time could not be written to the ledger: %s", gtrid, exc)

    def forget(self, gtrid: str, who: str) -> None:
        with self.recovery_lock:
            self.recovery.forget(gtrid, who)

    def status(self) -> dict[str, Any]:
        """In-doubt count and the oldest one's age, for ``nsjms status``."""
        view = [v for v in self.view() if v.action is not SafeAction.WAIT]
        ages = [v.age_s for v in view if v.age_s is not None]
        return {"in_doubt": len(view), "oldest_in_doubt_s": max(ages) if ages else None,
                "recovery_passes": self.passes}

    def depths(self) -> dict[str, int]:
        """Rows in the outbox (exact: rows of transactions not yet ended, few) and the inbox (PostgreSQL's live-row
        estimate, ``pg_stat_user_tables.n_live_tup``: the inbox keeps days of message ids, too many to count every
        2 s) for ``nsjms status`` and the ``nsjms.t2.*.depth`` gauges."""
        with self.db.unit_of_work() as conn:
            # the inbox is partitioned (migration 0005): the parent has no rows of its own, its partitions do
            row = conn.execute("SELECT (SELECT count(*) FROM nsjms_outbox), (SELECT coalesce(sum(n_live_tup), 0) "
                               "FROM pg_stat_user_tables WHERE relid IN (SELECT inhrelid FROM pg_inherits "
                               "WHERE inhparent = 'nsjms_inbox'::regclass))").fetchone()
        return {"outbox": int(row[0]), "inbox": int(row[1])} if row else {"outbox": 0, "inbox": 0}

    def _prepared_ids(self, gids: Sequence[str]) -> dict[str, str]:
        """PostgreSQL's transaction id of each prepared transaction ``gids`` names (router/routing/t2/latecommit.py)."""
        with self.db.unit_of_work() as conn:
            rows = conn.execute("SELECT gid, transaction::text FROM pg_prepared_xacts WHERE database = "
                                "current_database() AND gid = ANY(%s)", (list(gids),)).fetchall()
        return {str(gid): str(txid) for gid, txid in rows}

    # -- outbox / inbox housekeeping ------------------------------------------------------------------------
    def _rows_of(self, gtrid: str) -> list[OutboxRow]:
        with self.db.unit_of_work() as conn:
            return outbox_rows(conn, gtrid)

    def _rows_of_many(self, gtrids: Sequence[str]) -> dict[str, list[OutboxRow]]:
        with self.db.unit_of_work() as conn:
            return outbox_rows_many(conn, gtrids)

    def _purge(self) -> None:
        """Delete this node's outbox rows of transactions that ended (the log no longer knows them: every branch, the
        broker's included, finished), and inbox rows older than the retention. Rows whose gtrid names another node
        are that node's to purge: they are never in this node's log, and may be in flight or in doubt there.

        The snapshot is taken FIRST, then the live set is read: a row visible in the snapshot was committed by a
        transaction that had begun (in flight, or in the log) before the live set was read, and it leaves both
        only once its END is written. The hop times of the T2s that ended (:class:`router.routing.ledger.T2HopRecorder`)
        are taken BEFORE the snapshot (a T2 is ready once its PostgreSQL branch committed, so its ledger rows are in
        the snapshot) and filled into their ledger rows in this same transaction.

        The whole purge holds :attr:`recovery_lock`: an operator's recovery pass or resolution (``nsjms txn``, on an
        ORB thread) that ended a T2 between the snapshot and the reading of the live set would make the T2 look
        ended while its rows, committed after the snapshot, are not in it: the UPDATE would match nothing and the
        hop times taken for it would be lost (review finding)."""
        with self.recovery_lock:
            self._purge_locked()

    def _purge_locked(self) -> None:
        hops = self.hops.take() if self.hops is not None else {}
        keep: set[str] = set()
        try:
            with self.db.unit_of_work() as conn:
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                conn.execute("SELECT 1 FROM nsjms_outbox LIMIT 1")          # fixes the snapshot
                keep = set(self.log.live()) | set(self.coordinator.in_flight())
                # only this node's rows: another node's in-flight or in-doubt rows are not in this node's log
                # (starts_with, not LIKE: a node id may contain '_', LIKE's one-character wildcard)
                conn.execute("DELETE FROM nsjms_outbox WHERE starts_with(gtrid, %s) AND NOT (gtrid = ANY(%s))",
                             (f"{self.node.value}:", sorted(keep)))
                if self.hops is not None and hops:
                    self.hops.write(conn, {g: h for g, h in hops.items() if g not in keep})
                inbox_purge_default(conn, self.inbox_retention_s)     # day partitions: maintain_inbox()
        except BaseException:
            keep = set(hops)                                            # not written: the next purge retries
            raise
        finally:
            if self.hops is not None and hops:
                self.hops.give_back({g: h for g, h in hops.items() if g in keep})

    # -- the resend transport -------------------------------------------------------------------------------
    def broker_problem(self) -> str | None:
        """Why outbox rows cannot be re-sent now (the broker connection cannot be opened), or None: checked before
        an operator's commit that re-sends, so that nothing is committed that cannot be sent."""
        try:
            self._resend_transport()
        except Exception as exc:  # noqa: BLE001 - any failure to connect is the answer
            return f"{type(exc).__name__}: {exc}"
        return None

    def _resend_transport(self) -> Transport:
        with self._transport_lock:
            if self._transport_factory is None:
                raise TransportError("no broker is configured for re-sends")
            if self._transport is None or not self._transport.is_connected():
                if self._transport is not None:
                    self._transport.close()
                self._transport = self._transport_factory()
                self._transport.connect()
            return self._transport

    # -- enlisting -------------------------------------------------------------------------------------------
    def enlist(self, txn: Transaction, resource: Resource) -> Xid:
        """``txn.enlist(resource)``; with crash points armed (tests), the resource passes them at each step."""
        return txn.enlist(_CrashingResource(resource) if armed() else resource)

    # -- in-process participants ----------------------------------------------------------------------------
    def register_local(self, ior: str, target: Any) -> None:
        """A servant of this node that takes part in T2 in-process (a bridge endpoint), by its stringified IOR:
        a channel proxy whose client is that object runs the T2 with it directly (NJI 2.7.2)."""
        self._targets[ior] = target

    def unregister_local(self, ior: str) -> None:
        self._targets.pop(ior, None)

    def local(self, ior: str | None) -> Any:
        return self._targets.get(ior) if ior else None


# ------------------------------------------------------------------------------------------ crash points (tests)
class _CrashingResource:
    """Passes the T2 crash points (router.routing.crashpoints) around a participant's protocol steps."""

    def __init__(self, inner: Resource) -> None:
        self.inner = inner
        self.name, self.kind, self.manager = inner.name, inner.kind, inner.manager
        self.one_phase_only = inner.one_phase_only

    def sort_key(self) -> str:
        return self.inner.sort_key()

    def begin(self, xid: Xid) -> None:
        self.inner.begin(xid)

    def prepare(self) -> None:
        if not self.one_phase_only:
            crashpoint("t2.before_prepare")
        self.inner.prepare()
        if not self.one_phase_only:
            crashpoint("t2.after_prepare")

    def commit(self) -> None:
        if not self.one_phase_only:
            crashpoint("t2.after_decision")
        self.inner.commit()
        crashpoint("t2.after_broker_commit" if self.one_phase_only else "t2.after_pg_commit")

    def rollback(self) -> None:
        self.inner.rollback()


class _CrashingManager:
    def __init__(self, inner: PgManager) -> None:
        self.inner = inner
        self.key = inner.key

    def recover(self) -> Sequence[Xid]:
        return self.inner.recover()

    def commit_branch(self, xid: Xid) -> None:
        pausepoint("t2.recovery.before_pg_commit")
        self.inner.commit_branch(xid)
        crashpoint("t2.recovery.after_pg_commit")

    def rollback_branch(self, xid: Xid) -> None:
        pausepoint("t2.recovery.before_pg_rollback")
        self.inner.rollback_branch(xid)

    def finish_branches(self, ops: Sequence[tuple[str, Xid]]) -> list[ResourceError | None]:
        if pauses_armed():          # one branch at a time, each passing its pause point
            results: list[ResourceError | None] = []
            for step, xid in ops:
                try:
                    (self.commit_branch if step == "commit" else self.rollback_branch)(xid)
                    results.append(None)
                except ResourceError as exc:
                    results.append(exc)
            return results
        results = self.inner.finish_branches(ops)
        for (step, _), err in zip(ops, results, strict=True):
            if step == "commit" and err is None:
                crashpoint("t2.recovery.after_pg_commit")
        return results

    def close(self) -> None:
        self.inner.close()
