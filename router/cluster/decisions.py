"""The T2 decision in PostgreSQL, fenced by epoch, and a survivor's recovery of a fenced node's transactions
(table ``nsjms_decision`` of migration 0008; docs/cluster.md says why the decision lives here).

:class:`FencedDecisionLog` wraps a node's file recovery log (``xa.log.FileLog``) for its coordinator: a COMMIT
record is first written to ``nsjms_decision`` in a short transaction of its own that runs the fence check
(:func:`router.cluster.members.check`), then appended to the file. A fenced node's decision is refused there
(:class:`xa.errors.LogWriteFailed`: the coordinator rolls the transaction back), so once a survivor's fence has
committed, the dead node's set of decisions in the table is final and complete: every COMMIT in its file log is in
the table (the table is written first). The file log stays the node's own recovery source at its restart.

:func:`recover_fenced` is what a survivor runs for a node it fenced: commit the prepared branches of its decided
transactions, re-send their outbox rows with the same dedupe ids, roll back its other prepared branches (presumed
abort), then delete those decision and outbox rows. It touches only xids whose gtrid names the fenced node.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from router import telemetry
from router.cluster import members as M
from router.cluster.errors import Fenced
from xa.errors import BranchNotFound, LogDurabilityUnknown, LogWriteFailed
from xa.log import RecoveryLog
from xa.records import Commit, End, LiveTxn, Participant, Record
from xa.xid import NodeId, is_ours

__all__ = ["FencedDecisionLog", "FencedRecovery", "decisions_of", "recover_fenced"]

log = logging.getLogger("nsjms.cluster")


class FencedDecisionLog:
    """A :class:`xa.log.RecoveryLog` for the coordinator: COMMIT records go to ``nsjms_decision`` (fenced) and then
    to ``inner``; everything else to ``inner`` only. ``epoch()``: the node's live epoch, None once fenced."""

    def __init__(self, inner: RecoveryLog, db: Any, node_id: str, epoch: Callable[[], int | None]) -> None:
        self.inner, self.db, self.node_id, self._epoch = inner, db, node_id, epoch
        self._ended: list[str] = []          # gtrids whose END was logged: their rows go in the next decision write
        self._lock = threading.Lock()

    @property
    def node(self) -> NodeId:
        return self.inner.node

    def live(self) -> Mapping[str, LiveTxn]:
        return self.inner.live()

    def append(self, record: Record, *, durable: bool) -> None:
        if isinstance(record, Commit):
            self._decide(record)
            try:
                self.inner.append(record, durable=durable)
            except LogWriteFailed:
                self._undo(record.gtrid)     # the coordinator rolls back: the table must not say COMMIT
                raise
            return
        self.inner.append(record, durable=durable)
        if isinstance(record, End):
            with self._lock:
                self._ended.append(record.gtrid)

    def _decide(self, record: Commit) -> None:
        epoch = self._epoch()
        if epoch is None:
            telemetry.cluster_fenced_write("decision")
            raise LogWriteFailed(f"node {self.node_id!r} is fenced: no decision", gtrid=record.gtrid)
        with self._lock:
            ended, self._ended = self._ended, []
        parts = json.dumps([vars(p) for p in record.participants])
        try:
            with self.db.unit_of_work() as conn:
                M.check(conn, self.node_id, epoch)
                conn.execute("INSERT INTO nsjms_decision (gtrid, node_id, epoch, participants) "
                             "VALUES (%s, %s, %s, %s::jsonb)", (record.gtrid, self.node_id, epoch, parts))
                if ended:
                    conn.execute("DELETE FROM nsjms_decision WHERE gtrid = ANY(%s)", (ended,))
        except Fenced as exc:
            telemetry.cluster_fenced_write("decision")
            raise LogWriteFailed(f"decision refused: {exc}", gtrid=record.gtrid) from exc
        except Exception as exc:
            # router.db's StoreError (this package sits beside router.db: its errors are matched by their
            # in_doubt attribute): a COMMIT whose answer was lost may have committed the row
            with self._lock:
                self._ended.extend(ended)
            if getattr(exc, "in_doubt", False):
                raise LogDurabilityUnknown(f"decision row may or may not be committed: {exc}",
                                           gtrid=record.gtrid) from exc
            raise LogWriteFailed(f"decision row not written: {exc}", gtrid=record.gtrid) from exc

    def flush_ended(self) -> None:
        """Delete the decision rows of the transactions whose END was logged since the last decision write (the
        node's T2 housekeeping calls this every 0.5 s, so an idle node leaves none behind for long: a survivor
        re-sends the outbox rows of every decision row it finds). A failure keeps them for the next call."""
        with self._lock:
            ended, self._ended = self._ended, []
        if not ended:
            return
        try:
            with self.db.unit_of_work() as conn:
                conn.execute("DELETE FROM nsjms_decision WHERE gtrid = ANY(%s)", (ended,))
        except Exception:  # retried at the next call
            with self._lock:
                self._ended.extend(ended)
            raise

    def _undo(self, gtrid: str) -> None:
        try:
            with self.db.unit_of_work() as conn:
                conn.execute("DELETE FROM nsjms_decision WHERE gtrid = %s", (gtrid,))
        except Exception:  # best effort: a survivor would COMMIT PREPARED a gone branch (a no-op)
            log.warning("T2 %s: the decision row of a transaction rolled back could not be deleted", gtrid,
                        exc_info=True)

    def __getattr__(self, name: str) -> Any:      # path, size, compact, close ... of the file log
        return getattr(self.inner, name)


def decisions_of(conn: Any, node_id: str) -> dict[str, tuple[Participant, ...]]:
    """The decided transactions of ``node_id`` in ``nsjms_decision``: gtrid -> participants."""
    rows = conn.execute("SELECT gtrid, participants FROM nsjms_decision WHERE node_id = %s",
                        (node_id,)).fetchall()
    return {str(g): tuple(Participant(**p) for p in parts) for g, parts in rows}


@dataclass
class FencedRecovery:
    """What :func:`recover_fenced` did for one fenced node."""

    node_id: str
    committed: list[str] = field(default_factory=list)      # gtrids whose prepared branches were committed
    rolled_back: list[str] = field(default_factory=list)    # gtrids of undecided branches rolled back
    resent: list[str] = field(default_factory=list)         # gtrids whose outbox rows were re-sent
    errors: list[str] = field(default_factory=list)


def recover_fenced(db: Any, dead: str, by: str, by_epoch: int, pg: Any,
                   resend: Callable[[str, Participant], None], send_manager: str, *,
                   record: Callable[[Any, list[str]], None] | None = None) -> FencedRecovery:
    """Finish ``dead``'s routing transactions (see the module docstring). ``dead`` must be ``fenced`` (checked
    first, with ``by``'s own epoch): a live node's xids are never touched. ``pg``: an ``xa.pg.PgManager``;
    ``resend(gtrid, participant)``: the outbox re-sender (``router.routing.t2.transactions.OutboxResender``). Failures
    are collected in the report (the caller retries at its next pass); the rows of a transaction are deleted only once
    its branches are finished and its messages re-sent. ``record(conn, gtrids)``: called with the transactions whose
    outbox rows were re-sent, on the transaction that then deletes those rows (the ledger's re-send rows,
    ``router.routing.ledger_takeover.record_resends``), in a savepoint: if it fails, it is logged and the clean-up goes
    on (the ledger lacks those rows; re-sending again to record them would add duplicates)."""
    report = FencedRecovery(dead)
    with db.unit_of_work() as lock:
        # held until the end: one node at a time finishes ``dead``'s transactions (a survivor whose fencer died
        # takes this over, takeover.to_recover); another node's pass skips it meanwhile
        M.check(lock, by, by_epoch)
        row = lock.execute("SELECT state FROM nsjms_member WHERE node_id = %s FOR UPDATE SKIP LOCKED",
                           (dead,)).fetchone()
        if row is None or row[0] != "fenced":
            return report                                      # rejoined (its own recovery runs), unknown, or busy
        decided = decisions_of(lock, dead)
        _finish_fenced(lock, dead, decided, pg, resend, send_manager, report, record)
    if report.committed or report.rolled_back or report.resent or report.errors:
        log.warning("cluster: transactions of fenced node %s: committed %d, rolled back %d, re-sent %d, %d error(s)",
                    dead, len(set(report.committed)), len(set(report.rolled_back)), len(report.resent),
                    len(report.errors))
    return report


def _finish_fenced(conn: Any, dead: str, decided: dict[str, tuple[Participant, ...]], pg: Any,
                   resend: Callable[[str, Participant], None], send_manager: str, report: FencedRecovery,
                   record: Callable[[Any, list[str]], None] | None = None) -> None:
    node = NodeId(dead)
    prepared = [x for x in pg.recover() if is_ours(x, node)]
    failed: set[str] = set()
    # one call: the PostgreSQL manager's late-commit hand-over (router/routing/t2/latecommit.py) then scans the queue
    # once
    ops = [("commit" if xid.gtrid in decided else "rollback", xid) for xid in prepared]
    try:
        results: list[Exception | None] = list(pg.finish_branches(ops)) if ops else []
    except Exception as exc:  # noqa: BLE001 - reported, retried at the next pass
        results = [exc] * len(ops)
    for (step, xid), err in zip(ops, results, strict=True):
        if err is not None and not isinstance(err, BranchNotFound):   # BranchNotFound: finished meanwhile
            failed.add(xid.gtrid)                                      # reported, retried at the next pass
            report.errors.append(f"{xid.gtrid}: {type(err).__name__}: {err}")
            continue
        (report.committed if step == "commit" else report.rolled_back).append(xid.gtrid)
    done = []
    for gtrid, parts in sorted(decided.items()):
        if gtrid in failed:
            continue
        try:
            for p in parts:
                if p.one_phase and p.manager == send_manager:
                    resend(gtrid, p)
                    report.resent.append(gtrid)
        except Exception as exc:  # noqa: BLE001 - the broker is down: retried at the next pass
            report.errors.append(f"{gtrid}: re-send: {type(exc).__name__}: {exc}")
            continue
        done.append(gtrid)
    if done:
        resent = sorted(set(report.resent) & set(done))
        if record is not None and resent:
            try:
                with conn.transaction():     # a savepoint: a failing record never blocks the clean-up (re-sent again)
                    record(conn, resent)
            except Exception as exc:  # noqa: BLE001 - the ledger then lacks these rows; logged
                log.warning("cluster: the ledger rows of the re-send of %d transaction(s) of %s were not written: %s",
                            len(resent), dead, exc)
        conn.execute("DELETE FROM nsjms_outbox WHERE gtrid = ANY(%s)", (done,))
        conn.execute("DELETE FROM nsjms_decision WHERE gtrid = ANY(%s) AND node_id = %s", (done, dead))
