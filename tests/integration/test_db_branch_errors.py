"""``Database.branch()`` translates psycopg errors of the statements run inside a T2 branch exactly as
``unit_of_work`` does (issue 24).

Before: only the checkout was translated; a statement that failed inside a T2 (an SQL error, a statement timeout, a
connection lost under the branch) left the block as a raw psycopg error, and channel code classified it with
``getattr(exc, "content")``. Now it is ``StoreError`` / ``StoreTimeout`` / ``StoreUnavailable`` (never in doubt),
and the errors of the branch's own two-phase calls (``xa`` errors) pass unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import Xid

from router.db import Database, StoreError, StoreTimeout, StoreUnavailable
from xa.errors import XAError
from xa.pg import PgBranch

pytestmark = pytest.mark.integration


def _xid(n: int) -> Xid:
    return Xid(0x4E53, f"branch-errors-{n}", "pg")


@pytest.fixture
def db(fresh_db: str) -> Iterator[Database]:
    d = Database(fresh_db, pool_size=2, idle_check=60.0)
    d.open(migrate=False)
    with d.unit_of_work() as conn:
        conn.execute("CREATE TABLE branch_probe (n int PRIMARY KEY)")
    yield d
    d.close()


def _count(db: Database) -> int:
    with db.unit_of_work() as conn:
        row = conn.execute("SELECT count(*) FROM branch_probe").fetchone()
        assert row is not None
        return int(row[0])


def test_an_sql_error_inside_a_t2_branch_is_a_store_error(db: Database) -> None:
    with pytest.raises(StoreError) as info, db.branch() as conn:
        PgBranch(conn, "pg").begin(_xid(1))
        conn.execute("INSERT INTO branch_probe VALUES (1)")
        conn.execute("INSERT INTO branch_probe VALUES (1)")          # UniqueViolation
    assert type(info.value) is StoreError, info.value                 # not an outage, not a timeout
    assert isinstance(info.value.__cause__, psycopg.errors.UniqueViolation)
    assert "database error during work" in str(info.value)
    assert _count(db) == 0                                           # nothing of the branch committed


def test_a_cancelled_statement_inside_a_t2_branch_is_a_store_timeout(db: Database) -> None:
    with pytest.raises(StoreTimeout) as info, db.branch() as conn:
        PgBranch(conn, "pg").begin(_xid(2))
        conn.execute("INSERT INTO branch_probe VALUES (2)")
        conn.execute("SELECT set_config('statement_timeout', '1ms', true)")
        conn.execute("SELECT pg_sleep(5)")                            # QueryCanceled on a working connection
    assert not isinstance(info.value, StoreUnavailable), info.value
    assert "cancelled a statement" in str(info.value)
    assert _count(db) == 0


def test_a_connection_lost_inside_a_t2_branch_is_store_unavailable_not_in_doubt(db: Database) -> None:
    with pytest.raises(StoreUnavailable) as info, db.branch() as conn:
        PgBranch(conn, "pg").begin(_xid(3))
        conn.execute("INSERT INTO branch_probe VALUES (3)")
        pid = conn.info.backend_pid
        with db.unit_of_work() as other:                              # the server ends the branch's session
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        conn.execute("SELECT 1")
    assert info.value.in_doubt is False                               # nothing of a T2 commits before prepare
    assert "connection failed during work" in str(info.value)
    assert _count(db) == 0                                            # the pool serves working connections after


def test_errors_of_the_branchs_own_two_phase_calls_and_others_pass_unchanged(db: Database) -> None:
    with pytest.raises(XAError), db.branch() as conn:
        branch = PgBranch(conn, "pg")
        branch.begin(_xid(4))
        branch.begin(_xid(5))                                         # misuse: xa's error, not translated here
    with pytest.raises(KeyError), db.branch():
        raise KeyError("not a database error")
