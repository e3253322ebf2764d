"""``Database.statement`` against a real PostgreSQL (issue 12, accept side): a unit of work of one statement on an
autocommit connection is one round trip, and it is committed when the call returns (no COMMIT sent)."""

from __future__ import annotations

import psycopg
import pytest

from router.db import Database, StoreError, StoreUnavailable
from router.services import EmbeddedPostgres

pytestmark = pytest.mark.integration


def _db(dsn: str) -> Database:
    db = Database(dsn, pool_size=2, idle_check=60.0)
    db.open(migrate=False)
    with db.unit_of_work() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS t_stmt (id int PRIMARY KEY)")
    return db


def _committed(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as other:
        return [r[0] for r in other.execute("SELECT id FROM t_stmt ORDER BY id").fetchall()]


def test_a_statement_is_committed_when_it_returns_and_sends_no_begin_or_commit(fresh_db: str) -> None:
    db = _db(fresh_db)
    try:
        with db.statement() as conn:
            assert conn.autocommit
            conn.execute("INSERT INTO t_stmt VALUES (1)")
            # still inside the block: another connection sees the row already, so nothing waits for a COMMIT
            assert _committed(fresh_db) == [1]
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    finally:
        db.close()


def test_the_connection_goes_back_to_the_pool_transactional(fresh_db: str) -> None:
    db = _db(fresh_db)
    try:
        with db.statement() as conn:
            conn.execute("SELECT 1")
        for _ in range(3):          # whichever pooled connection: a rolled back unit of work leaves nothing
            with pytest.raises(RuntimeError), db.unit_of_work() as conn2:
                assert not conn2.autocommit
                conn2.execute("INSERT INTO t_stmt VALUES (2)")
                raise RuntimeError("roll back")
        assert _committed(fresh_db) == []
    finally:
        db.close()


def test_a_failed_statement_commits_nothing_and_raises_store_error(fresh_db: str) -> None:
    db = _db(fresh_db)
    try:
        with pytest.raises(StoreError) as info, db.statement() as conn:
            conn.execute("INSERT INTO t_stmt SELECT x FROM (VALUES (3), (3)) AS v(x)")   # duplicate key
        assert not getattr(info.value, "in_doubt", False)
        assert _committed(fresh_db) == []
        with db.statement() as conn:      # the connection is usable again
            conn.execute("INSERT INTO t_stmt VALUES (4)")
        assert _committed(fresh_db) == [4]
    finally:
        db.close()


def test_a_connection_closed_by_a_restart_fails_the_statement_not_in_doubt(own_pg: EmbeddedPostgres) -> None:
    """The server restarted while the connection sat in the pool: found before anything is sent, so the failure
    is certain (nothing committed), not in doubt; the next statement gets a working connection."""
    db = _db(own_pg.dsn)
    try:
        own_pg.stop()
        own_pg.start()
        with pytest.raises(StoreUnavailable) as info, db.statement() as conn:
            conn.execute("INSERT INTO t_stmt VALUES (5)")
        assert not info.value.in_doubt
        with db.statement() as conn:
            conn.execute("INSERT INTO t_stmt VALUES (6)")
        assert _committed(own_pg.dsn) == [6]
    finally:
        db.close()
