"""Database.lane() (router/db/lane.py) on a real PostgreSQL: one dedicated autocommit connection, each statement its
own transaction; a connection the server closed while idle is replaced before anything is sent; one user at a time
(a busy lane answers None, the caller uses the pool); errors as Database.statement's."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from router.db import Database, StoreError
from router.db.errors import StoreUnavailable

pytestmark = pytest.mark.integration

WAIT_S = 30.0


@pytest.fixture
def db(fresh_db: str) -> Iterator[Database]:
    database = Database(fresh_db, 2)
    database.open()
    with database.unit_of_work() as conn:
        conn.execute("CREATE TABLE lane_t (v int PRIMARY KEY)")
    yield database
    database.close()


def _values(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [int(r[0]) for r in conn.execute("SELECT v FROM lane_t ORDER BY v").fetchall()]


def test_a_statement_commits_on_its_own_and_the_lane_is_one_connection(db: Database, fresh_db: str) -> None:
    lane = db.lane()
    pids = set()
    for v in (1, 2):
        work = lane.take(5.0)
        assert work is not None
        with work as conn:
            conn.execute("INSERT INTO lane_t VALUES (%s)", (v,))
            pids.add(conn.info.backend_pid)
            assert lane.take(5.0) is None                  # in use: the caller takes the pool instead
    assert _values(fresh_db) == [1, 2]                      # committed (another session sees them)
    assert len(pids) == 1 and lane.statements == 2
    work = lane.take(5.0)
    assert work is not None
    with pytest.raises(StoreError), work as conn:           # a refused statement: nothing committed
        conn.execute("INSERT INTO lane_t VALUES (1)")
    work = lane.take(5.0)
    assert work is not None
    with work as conn:                                      # the connection is still fine
        conn.execute("INSERT INTO lane_t VALUES (3)")
    assert _values(fresh_db) == [1, 2, 3]


def test_a_connection_the_server_closed_is_replaced_before_sending(db: Database, fresh_db: str) -> None:
    lane = db.lane()
    work = lane.take(5.0)
    assert work is not None
    with work as conn:
        old = conn.info.backend_pid
    with psycopg.connect(fresh_db, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (old,))
        for _ in range(int(WAIT_S / 0.02)):                 # until the server's goodbye is on the lane's socket
            gone = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (old,)).fetchone()
            if gone and not gone[0]:
                break
            threading.Event().wait(0.02)
        else:
            raise AssertionError("the backend did not end")
    work = lane.take(5.0)
    assert work is not None
    with work as conn:                                      # not a failure: nothing had been sent on the old one
        conn.execute("INSERT INTO lane_t VALUES (4)")
        assert conn.info.backend_pid != old
    assert _values(fresh_db) == [4]


def test_a_connection_lost_during_the_statement_is_in_doubt(db: Database, fresh_db: str) -> None:
    lane = db.lane()
    work = lane.take(5.0)
    assert work is not None
    with pytest.raises(StoreUnavailable) as err, work as conn:
        conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")   # the server ends it during the statement
    assert err.value.in_doubt
    work = lane.take(5.0)
    assert work is not None
    with work as conn:                                      # made again at the next statement
        conn.execute("INSERT INTO lane_t VALUES (5)")
    assert _values(fresh_db) == [5]
    db.close()
    assert lane.take(5.0) is None                           # closed with the database


def test_a_prepared_statement_the_server_forgot_is_prepared_again(db: Database, fresh_db: str) -> None:
    """The review's finding: the lane remembered which statements it had prepared on its connection for good; a
    server that forgot them (DEALLOCATE ALL, DISCARD ALL, a pooler moving the session) failed every lone push with
    "prepared statement does not exist" until the connection was replaced. Now it prepares again (nothing ran)."""
    from router.db.lane import exec_prepared

    lane = db.lane()
    insert = b"INSERT INTO lane_t VALUES ($1) RETURNING v"
    for v, forget in ((10, False), (11, True), (12, False)):
        work = lane.take(5.0)
        assert work is not None
        with work as conn:
            if forget:
                conn.execute("DEALLOCATE ALL")
            assert exec_prepared(conn, b"lane_t_insert", insert, [23], [str(v).encode()], [0]) == (str(v).encode(),)
    assert _values(fresh_db) == [10, 11, 12]
