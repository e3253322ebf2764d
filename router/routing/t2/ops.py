"""The I/O layer of ``nsjms txn``: read a :class:`router.routing.t2.view.Snapshot`, act through recovery, keep an audit
trail.

:class:`TxnOps` is used in both modes: offline by ``nsjms txn`` itself (holding the state directory's lock, on the
node's recovery log and a :class:`xa.pg.PgManager` of its own, in-flight guard 0 since nothing can be deciding), and
online by the router's ``TransactionAdmin`` servant (on the running node's log, recovery manager and in-flight set,
with recovery's guard). Every operator action is appended to ``<state_dir>/txn-operator.log`` (one JSON object a
line: time, who, why, what, result); decisions against the log are also HEURISTIC records in the recovery log
itself (``xa.recovery.RecoveryManager.resolve``), shown as heuristic outcomes until ``forget``.

Exceptions: :class:`Refused` (the request cannot be done; the message says why and what is safe instead).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import Xid

from router.db.conninfo import connect as bounded_connect
from router.routing.t2.transactions import OPERATOR_SEND
from router.routing.t2.view import (
    START_NODE,
    HeldInfo,
    InboxInfo,
    Listing,
    OutboxInfo,
    Snapshot,
    TxnView,
    join,
    refusal,
)
from xa.errors import HeuristicKind, XAError
from xa.log import RecoveryLog
from xa.pg import PgManager
from xa.records import Heuristic, LiveTxn
from xa.recovery import RecoveryManager, RecoveryReport, SafeAction
from xa.xid import FORMAT_ID, NodeId, is_ours, parse_gtrid

__all__ = ["AUDIT_FILE", "HEURISTIC_COMMIT", "Refused", "TxnOps", "operator_log"]

AUDIT_FILE = "txn-operator.log"
HEURISTIC_COMMIT = "heuristic-commit"  # the action of ``nsjms txn commit --heuristic`` (over IIOP too)
Rows = Callable[[], AbstractContextManager[psycopg.Connection[Any]]]


class Refused(Exception):
    """The operator's request is refused; the message says why (and what is safe instead)."""


class TxnOps:
    """List, show, resolve, forget and recover the routing transactions of one node (see the module docstring)."""

    def __init__(self, node: str, state_dir: Path, log: RecoveryLog | None, pg: PgManager, rows: Rows,
                 recovery: RecoveryManager | None, *, mode: str, guard_s: float,
                 in_flight: Callable[[], frozenset[str]] = frozenset,
                 serial: AbstractContextManager[Any] | None = None,
                 run: Callable[[], RecoveryReport] | None = None,
                 resolve: Callable[..., RecoveryReport] | None = None,
                 broker_check: Callable[[], str | None] | None = None) -> None:
        """``serial``: held around every action (online: the node's recovery lock, so an operator's action never
        interleaves with a recovery pass); ``run``: one recovery pass (online: the node's, which counts it);
        ``resolve``: an operator's decision, ``(gtrid, action, who, why, heuristic=...)`` (online: the node's
        ``NodeTransactions.resolve``, which also fills the ledger hops of what it ends; offline: the recovery
        manager's); ``broker_check``: why messages cannot be re-sent now, or None (asked before a commit that
        re-sends, and offline for the listing's advice; None: not checked)."""
        self.node, self.state_dir, self.log, self.pg, self.rows = NodeId(node), state_dir, log, pg, rows
        self.recovery, self.mode, self.guard_s, self.in_flight = recovery, mode, guard_s, in_flight
        self.serial: AbstractContextManager[Any] = serial if serial is not None else threading.RLock()
        self._run = run
        self._resolve = resolve
        self._broker_check = broker_check

    # --------------------------------------------------------------------------------------------- read
    def snapshot(self) -> Snapshot:
        live: Mapping[str, LiveTxn] = self.log.live() if self.log is not None else {}
        busy = self.in_flight()
        prepared: list[Xid] | None
        error = ""
        try:
            prepared = list(self.pg.recover())
        except XAError as exc:
            prepared, error = None, str(exc)
        ours = [x for x in prepared or () if is_ours(x, self.node)]
        gtrids = sorted(set(live) | {x.gtrid for x in ours})
        outbox, inbox = self._rows(gtrids) if gtrids and prepared is not None else ((), ())
        held = self._held(ours) if ours else []
        return Snapshot(self.node.value, time.time(), self.guard_s, live, prepared, error, outbox, inbox, busy,
                        self.mode, held)

    def _held(self, xids: list[Xid]) -> list[HeldInfo]:
        """The channel events prepared branches hold (:class:`router.routing.t2.view.HeldInfo`).

        A prepared branch's own INSERTs (outbox, ledger, inbox rows) are invisible to every other session until it
        commits, and PostgreSQL has no dirty read. What a channel -> JMS T2 DELETED is visible: the proxy queue rows
        of its batch stay in place, locked, their ``xmax`` naming the prepared transaction (the branches use no
        subtransactions, so no subxid can stand in). Their count is the batch's event count, and the bridge whose
        proxy owns the queue names the destination. ``xmax`` is either the prepared transaction's xid
        (``pg_prepared_xacts.transaction``) or, when the row was also share-locked before the branch deleted it
        (``FOR KEY SHARE`` by the branch and another transaction), a MultiXact whose members
        (``pg_get_multixact_members``) include that xid as the updater: both are counted (review finding 14: the
        second kind was missed). SQL cannot read a tuple's "xmax is a MultiXact" flag, so an ``xmax`` is looked up
        as a MultiXact only when it is not a prepared transaction's xid and lies within the MultiXacts the table can
        hold (``mxid_age`` between 1 and the age of ``pg_class.relminmxid``: looking up anything else raises). One
        sequential scan of ``nsjms_queue`` (an operator's command, not the data path)."""
        by_gid = {str(x): x.gtrid for x in xids}
        with self.rows() as conn:
            rows = conn.execute(_HELD_SQL, (sorted(by_gid),)).fetchall()
        return [HeldInfo(by_gid[str(gid)], _opt(bid), int(cid), f"/{kind}/{name}" if kind and name else None, int(n))
                for gid, bid, cid, kind, name, n in rows]

    def _rows(self, gtrids: list[str]) -> tuple[list[OutboxInfo], list[InboxInfo]]:
        with self.rows() as conn:
            out = conn.execute("SELECT o.gtrid, o.idx, o.dedupe_id, o.bridge_id, o.destination, "
                               "extract(epoch FROM o.created_at)::float8, b.channel_id FROM nsjms_outbox o "
                               "LEFT JOIN nsjms_bridge b ON b.id = o.bridge_id WHERE o.gtrid = ANY(%s) "
                               "ORDER BY o.gtrid, o.idx", (gtrids,)).fetchall()
            inb = conn.execute("SELECT i.gtrid, i.bridge_id, i.message_id, extract(epoch FROM i.received_at)::float8, "
                               "b.channel_id FROM nsjms_inbox i LEFT JOIN nsjms_bridge b ON b.id = i.bridge_id "
                               "WHERE i.gtrid = ANY(%s) ORDER BY i.gtrid, i.message_id", (gtrids,)).fetchall()
        return ([OutboxInfo(str(g), int(i), str(d), int(b), str(dest), float(at), _opt(ch))
                 for g, i, d, b, dest, at, ch in out],
                [InboxInfo(str(g), int(b), str(m), float(at), _opt(ch)) for g, b, m, at, ch in inb])

    def listing(self) -> Listing:
        snap = self.snapshot()
        listing = join(snap)
        if self.mode == "offline" and self._broker_check is not None and any(
                t.sends and t.action in (SafeAction.COMMIT.value, SafeAction.RESEND.value)
                for t in listing.transactions):
            problem = self._broker_check()                 # the advice says what can be done from here
            if problem is not None:
                listing = join(dataclasses.replace(snap, broker_problem=problem))
        return listing

    def show(self, gtrid: str) -> TxnView:
        for view in self.listing().transactions:
            if view.gtrid == gtrid:
                return view
        raise Refused(f"no transaction {gtrid} of node {self.node} is pending (finished, or never existed); "
                      "`nsjms txn list` shows the pending ones, orphaned prepared branches need --xid GID")

    # -------------------------------------------------------------------------------------------- act
    def _recovery(self) -> RecoveryManager:
        if self.recovery is None:
            raise Refused("the recovery log could not be opened for writing")
        return self.recovery

    def resolve(self, gtrid: str, action: str, who: str, why: str) -> dict[str, Any]:
        """Commit or roll back one transaction; refused against a logged decision (:func:`refusal`). ``action``:
        ``commit``, ``rollback``, or ``heuristic-commit`` (``--heuristic``: needed to commit what has no COMMIT
        logged). Every request, refused or done, is in the operator log."""
        try:
            with self.serial:
                result = self._resolve_one(gtrid, action, who, why)
        except Refused as exc:
            self.audit(who, why, action, gtrid, f"refused: {exc}")
            raise
        except Exception as exc:
            self.audit(who, why, action, gtrid, f"failed: {type(exc).__name__}: {exc}")
            raise
        self.audit(who, why, action, gtrid, result)
        return result

    def _resolve_one(self, gtrid: str, action: str, who: str, why: str) -> dict[str, Any]:
        heuristic = action == HEURISTIC_COMMIT
        decision = "commit" if heuristic else action
        if decision not in ("commit", "rollback"):
            raise Refused(f"an operator can commit, commit --heuristic or roll back, not {action!r}")
        view = self.show(gtrid)
        reason = refusal(view, decision, heuristic=heuristic)
        if reason is not None:
            raise Refused(reason)
        if decision == "commit" and view.sends and self._broker_check is not None:
            problem = self._broker_check()             # never commit what cannot be sent (checked first)
            if problem is not None:
                raise Refused(f"{gtrid}: nothing done: committing it re-sends {view.events} message(s) and the "
                              f"broker cannot be reached ({problem}); "
                              + ("start the node (its recovery does this at start)" if self.mode == "offline"
                                 else "try again once the broker is back"))
        try:
            if self._resolve is not None:
                report = self._resolve(gtrid, SafeAction(decision), who, why, heuristic=heuristic)
            else:
                report = self._recovery().resolve(gtrid, SafeAction(decision), who, why, heuristic=heuristic,
                                                  one_phase=(OPERATOR_SEND,))
        except XAError as exc:
            raise Refused(str(exc)) from exc
        result = _report(report)
        result.update(gtrid=gtrid, action=action, heuristic=gtrid in report.heuristic, events=view.events,
                      destinations=list(view.destinations))
        return result

    def resolve_xid(self, gid: str, action: str, who: str, why: str) -> dict[str, Any]:
        """Commit or roll back ONE orphaned prepared branch by its GID (``pg_prepared_xacts.gid``), recording the
        operator's decision as a HEURISTIC record first (shown until ``forget``)."""
        try:
            if action not in ("commit", "rollback") or not who.strip() or not why.strip():
                raise Refused("--xid needs commit or rollback, who and why")
            with self.serial:
                return self._resolve_xid(gid, action, who, why)
        except Refused as exc:
            self.audit(who, why, f"{action} --xid", gid, f"refused: {exc}")
            raise
        except Exception as exc:
            self.audit(who, why, f"{action} --xid", gid, f"failed: {type(exc).__name__}: {exc}")
            raise

    def _resolve_xid(self, gid: str, action: str, who: str, why: str) -> dict[str, Any]:
        found = [x for x in self.pg.recover() if str(x) == gid]
        if not found:
            raise Refused(f"no prepared transaction with GID {gid!r} in this node's database")
        xid = found[0]
        if is_ours(xid, self.node):
            raise Refused(f"{gid} is branch {xid.bqual} of transaction {xid.gtrid} of this node: use "
                          f"`nsjms txn {action} {xid.gtrid}`")
        if xid.format_id != FORMAT_ID or parse_gtrid(xid.gtrid) is not None:
            raise Refused(f"{gid} belongs to another node or application: nsjms never touches it")
        if self.log is None:
            raise Refused("the recovery log could not be opened for writing")
        kind = HeuristicKind.COMMIT if action == "commit" else HeuristicKind.ROLLBACK
        self.log.append(Heuristic(xid.gtrid, kind, xid.bqual or "*", who, why, time.time()), durable=True)
        try:
            (self.pg.commit_branch if action == "commit" else self.pg.rollback_branch)(xid)
        except XAError as exc:
            raise Refused(f"{gid}: {exc} (the decision is recorded; run the command again)") from exc
        result = {"gid": gid, "gtrid": xid.gtrid, "action": action, "heuristic": True}
        self.audit(who, why, f"{action} --xid", gid, result)
        return result

    def forget(self, gtrid: str, who: str) -> dict[str, Any]:
        try:
            with self.serial:
                self._recovery().forget(gtrid, who)
        except XAError as exc:
            self.audit(who, "", "forget", gtrid, f"refused: {exc}")
            raise Refused(str(exc)) from exc
        except Exception as exc:
            self.audit(who, "", "forget", gtrid, f"failed: {type(exc).__name__}: {exc}")
            raise
        self.audit(who, "", "forget", gtrid, "forgotten")
        return {"gtrid": gtrid, "forgotten": True}

    def recover(self, who: str = "") -> dict[str, Any]:
        """One recovery pass (what the router does at start and every few seconds), in the operator log."""
        note = ""
        try:
            with self.serial:
                if self._run is not None:
                    report = self._run()
                else:
                    # offline with the broker out of reach: the PostgreSQL work only (what a node's start does
                    # first); the re-sends wait for the node, never a commit whose re-send fails half-way
                    stuck = [t.gtrid for t in self.listing().transactions if t.action == START_NODE]
                    report = self._recovery().run(resend=not stuck)
                    if stuck:
                        note = (f"re-sends deferred: the broker cannot be reached from here; start the node (its "
                                f"recovery re-sends at start) for {', '.join(stuck)}")
        except (XAError, Refused) as exc:
            self.audit(who, "", "recover", "", f"refused: recovery failed: {exc}")
            raise Refused(f"recovery failed: {exc}") from exc
        except Exception as exc:
            self.audit(who, "", "recover", "", f"failed: {type(exc).__name__}: {exc}")
            raise
        result = _report(report)
        if note:
            result["note"] = note
        self.audit(who, "", "recover", "", result)
        return result

    # ------------------------------------------------------------------------------------------ audit
    def audit(self, who: str, why: str, action: str, target: str, result: Any) -> None:
        operator_log(self.state_dir, self.node.value, self.mode, who, why, action, target, result)


def operator_log(state_dir: Path, node: str, mode: str, who: str, why: str, action: str, target: str,
                 result: Any) -> None:
    """Append one operator action to ``<state_dir>/txn-operator.log`` (also ``nsjms deadletter``'s actions)."""
    line = json.dumps({"at": time.time(), "node": node, "mode": mode, "who": who, "why": why,
                       "action": action, "target": target, "result": result}, sort_keys=True)
    fd = os.open(state_dir / AUDIT_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


#: The queue rows each prepared branch deleted (:meth:`TxnOps._held`): ``xmax`` = its xid, or a MultiXact whose
#: updating member is its xid. The row filter of the second part runs before ``pg_get_multixact_members`` is called.
_HELD_SQL = """
    WITH p AS (SELECT gid, transaction FROM pg_prepared_xacts WHERE database = current_database() AND gid = ANY(%s)),
    limits AS (SELECT mxid_age(relminmxid) AS oldest FROM pg_class WHERE oid = 'nsjms_queue'::regclass),
    held AS (
        SELECT p.gid, q.channel_id, q.admin_id, q.proxy_id FROM p JOIN nsjms_queue q ON q.xmax = p.transaction
        UNION ALL
        SELECT p.gid, q.channel_id, q.admin_id, q.proxy_id
        FROM (SELECT q.channel_id, q.admin_id, q.proxy_id, q.xmax AS mx FROM nsjms_queue q, limits
              WHERE q.xmax <> '0'::xid AND mxid_age(q.xmax) BETWEEN 1 AND limits.oldest
                AND NOT EXISTS (SELECT 1 FROM pg_prepared_xacts x WHERE x.transaction = q.xmax)
              OFFSET 0) q
        CROSS JOIN LATERAL pg_get_multixact_members(q.mx) m
        JOIN p ON p.transaction = m.xid
        WHERE m.mode IN ('upd', 'nokeyupd'))
    SELECT h.gid, b.id, h.channel_id, lower(b.sink->>'destination_type'), b.sink->>'destination_name', count(*)
    FROM held h LEFT JOIN nsjms_bridge b ON b.channel_id = h.channel_id AND b.admin_id = h.admin_id
        AND b.proxy_id = h.proxy_id AND b.sink->>'type' = 'JMS_MESSAGE'
    GROUP BY h.gid, b.id, h.channel_id, b.sink"""


def _opt(value: Any) -> int | None:
    return None if value is None else int(value)


def _report(report: RecoveryReport) -> dict[str, Any]:
    return dataclasses.asdict(report)


def connect_rows(dsn: str) -> Rows:
    """Read-only row access on a connection of its own (offline mode), its waits bounded (router/db/conninfo.py)."""
    from contextlib import contextmanager


    @contextmanager
    def rows() -> Iterator[psycopg.Connection[Any]]:
        with bounded_connect(dsn, autocommit=True, connect_timeout=5) as conn:
            yield conn

    return rows
