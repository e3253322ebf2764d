"""The T2 ledger hops against operator recovery and resolution, on real PostgreSQL and the node's real recovery log
(router.routing.t2.transactions.NodeTransactions with ``ledger_hops``; review findings).

* The purge (outbox rows of ended T2s deleted, their hop times written into their ledger rows) raced an operator's
  ``recover_now`` (``nsjms txn``, an ORB thread): a recovery that ended a T2 between the purge's snapshot and its
  reading of the live set made the purge's UPDATE match nothing (the rows committed after the snapshot) and the hop
  times taken for that T2 were dropped: ``broker_committed_at`` stayed NULL for good.
* ``resolve`` (an operator's commit) never gave the ledger what it knows.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from router.db import Database
from router.routing.t2.admin import node_ops
from router.routing.t2.transactions import NodeTransactions
from xa.pg import PgBranch
from xa.recovery import SafeAction

from t2kit import SendBranch

pytestmark = pytest.mark.integration

RACE_WINDOW_S = 2.0      # how long the purge lets the operator's recovery run inside its window (no assertion on it)


@pytest.fixture
def db(fresh_db: str) -> Iterator[Database]:
    database = Database(fresh_db, 4)
    database.open()
    yield database
    database.close()


def _ledger_row(conn: psycopg.Connection[Any], gtrid: str) -> None:
    conn.execute("INSERT INTO nsjms_ledger (dedupe_id, channel_id, direction, gtrid, accepted_at, outcome) "
                 "VALUES (%s, 1, 'channel_to_jms', %s, %s, 'delivered')", (f"{gtrid}:0", gtrid, datetime.now(UTC)))


def _hops(dsn: str, gtrid: str) -> tuple[Any, Any]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT decided_at, broker_committed_at FROM nsjms_ledger WHERE gtrid = %s",
                           (gtrid,)).fetchone()
    assert row is not None
    return row[0], row[1]


def _pending_t2(node: NodeTransactions, db: Database) -> str:
    """A T2 whose broker COMMIT was receipted but whose PostgreSQL COMMIT was not confirmed (COMMIT_PENDING: its
    branch stays prepared, recovery commits it); its ledger row is in that branch."""
    t = node.coordinator.begin(30)
    with db.branch() as conn:
        branch = PgBranch(conn, "pg")
        node.enlist(t, branch)
        _ledger_row(conn, t.gtrid)

        def unconfirmed() -> None:
            raise OSError("the COMMIT PREPARED's answer was lost")

        branch.commit = unconfirmed  # type: ignore[method-assign]
        node.enlist(t, SendBranch())
        t.commit()
    assert node.hops is not None and node.hops.pending() == 1
    return t.gtrid


def _undecided_t2(tmp_path: Path, db: Database, fresh_db: str) -> str:
    """A T2 whose PostgreSQL branch (with its ledger row) is prepared and whose node died before any decision."""
    dead = NodeTransactions("n1", tmp_path, db, fresh_db)
    t = dead.coordinator.begin(30)
    with db.branch() as conn:
        branch = PgBranch(conn, "pg")
        dead.enlist(t, branch)
        _ledger_row(conn, t.gtrid)
        branch.prepare()                            # the process died here: no decision
    dead.pg.close()
    dead.log.close()
    return t.gtrid


def test_an_operator_recovery_inside_the_purge_loses_no_hop(tmp_path: Path, db: Database, fresh_db: str) -> None:
    node = NodeTransactions("n1", tmp_path, db, fresh_db, ledger_hops=True, guard_s=0.0)
    try:
        gtrid = _pending_t2(node, db)
        purger = threading.current_thread()
        real_live = node.log.live
        operator = threading.Thread(target=node.recover_now, name="orb-operator")

        def live() -> Any:
            if threading.current_thread() is purger and not operator.is_alive() and operator.ident is None:
                operator.start()                    # nsjms txn on an ORB thread, inside the purge's window
                operator.join(RACE_WINDOW_S)
            return real_live()

        node.log.live = live  # type: ignore[method-assign]
        node._purge()
        operator.join()
        node.log.live = real_live  # type: ignore[method-assign]
        assert node.last_report is not None and gtrid in node.last_report.ended, node.last_report
        node._purge()                               # the next purge writes what is ready
        decided, committed = _hops(fresh_db, gtrid)
        assert decided is not None and committed is not None, (decided, committed)
    finally:
        node.close()


def test_an_operator_commit_fills_the_hops_it_knows(tmp_path: Path, db: Database, fresh_db: str) -> None:
    """A logged COMMIT finished by ``nsjms txn commit`` is recovery: decided_at (and the live broker commit)."""
    node = NodeTransactions("n1", tmp_path, db, fresh_db, ledger_hops=True)
    try:
        gtrid = _pending_t2(node, db)
        assert node.hops is not None
        node.hops.take()                            # the live times were lost (say, a restart): the log is left
        report = node.resolve(gtrid, SafeAction.COMMIT, "ops", "ticket 42")
        assert gtrid in report.ended, report
        node._purge()
        decided, _ = _hops(fresh_db, gtrid)
        assert decided is not None
    finally:
        node.close()


def test_a_heuristic_commit_records_the_operators_decision_time(tmp_path: Path, db: Database,
                                                                 fresh_db: str) -> None:
    """A prepared branch with no COMMIT record, committed by the operator against the log: decided_at = the
    HEURISTIC record's time; broker_committed_at stays NULL (nsjms does not know the broker's outcome)."""
    gtrid = _undecided_t2(tmp_path, db, fresh_db)
    node = NodeTransactions("n1", tmp_path, db, fresh_db, ledger_hops=True)   # the node after its restart
    try:
        report = node.resolve(gtrid, SafeAction.COMMIT, "ops", "the broker has the messages", heuristic=True)
        assert gtrid in report.heuristic and report.committed, report
        decided, committed = _hops(fresh_db, gtrid)
        [mark] = node.log.live()[gtrid].heuristics
        assert decided is not None and decided.timestamp() == pytest.approx(mark.at, abs=1e-3)
        assert committed is None
    finally:
        node.close()


def test_an_operator_commit_through_the_admin_fills_the_hops(tmp_path: Path, db: Database, fresh_db: str) -> None:
    """The same through the operator's path (``node_ops``, behind the CORBA TransactionAdmin and ``nsjms txn``):
    before, it called the recovery manager directly and the ledger row kept decided_at NULL."""
    node = NodeTransactions("n1", tmp_path, db, fresh_db, ledger_hops=True)
    try:
        gtrid = _pending_t2(node, db)
        assert node.hops is not None
        node.hops.take()                            # the live times were lost (say, a restart): the log is left
        result = node_ops(node, tmp_path).resolve(gtrid, "commit", "ops", "ticket 42")
        assert result["gtrid"] == gtrid and not result["heuristic"], result
        node._purge()
        decided, _ = _hops(fresh_db, gtrid)
        assert decided is not None
    finally:
        node.close()


def test_a_heuristic_commit_through_the_admin_records_the_decision_time(tmp_path: Path, db: Database,
                                                                        fresh_db: str) -> None:
    """A heuristic commit through ``node_ops``: decided_at = the HEURISTIC record's time (before: NULL)."""
    gtrid = _undecided_t2(tmp_path, db, fresh_db)
    node = NodeTransactions("n1", tmp_path, db, fresh_db, ledger_hops=True)   # the node after its restart
    try:
        result = node_ops(node, tmp_path).resolve(gtrid, "heuristic-commit", "ops", "the broker has the messages")
        assert result["heuristic"], result
        decided, committed = _hops(fresh_db, gtrid)
        [mark] = node.log.live()[gtrid].heuristics
        assert decided is not None and decided.timestamp() == pytest.approx(mark.at, abs=1e-3)
        assert committed is None
    finally:
        node.close()
