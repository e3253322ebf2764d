"""Membership, leases and fencing on a real PostgreSQL (router/cluster; issue 25's foundation).

A paused node is simulated as what it is to the database: a node that stops renewing and later tries to write with
its old epoch. The race that fencing exists for (a write that passed its check while a survivor takes over) is made
deterministic: the takeover is started while the writer's transaction is open, the test waits until PostgreSQL
shows it waiting for that transaction's lock, then lets the writer commit."""

from __future__ import annotations

import threading

import psycopg
import pytest

from router.cluster import Fenced, NodeLive, NotExpired
from router.cluster import members as M
from router.cluster.lease import LeaseSettings, expired
from router.db import Database

from clusterkit import LONG, db_fixture, join  # noqa: F401 - db_fixture: the fixture "db"

pytestmark = pytest.mark.integration

SHORT = LeaseSettings(renew_s=0.05, expiry_s=0.2)    # leases that expire while the test waits for it to say so
WAIT_S = 30.0


def _wait_expired(db: Database, node: str) -> None:
    """Until PostgreSQL's clock says ``node``'s lease expired (a condition, polled; never a fixed sleep)."""
    done = threading.Event()
    for _ in range(int(WAIT_S / 0.05)):
        with db.unit_of_work() as conn:
            if node in expired(M.members(conn)):
                return
        done.wait(0.05)
    raise AssertionError(f"the lease of {node} did not expire within {WAIT_S} s")


def test_join_renew_and_a_second_process_with_the_same_id(db: Database) -> None:
    assert join(db, "n1") == 1
    with pytest.raises(NodeLive):
        join(db, "n1")                                      # another process with this id: refused
    with db.unit_of_work() as conn:
        before = M.members(conn)[0].lease_until
        assert M.renew(conn, "n1", 1, LONG) >= before
    assert join(db, "n1", steal=True) == 2                  # a restart that holds the state lock: epoch 2 at once
    with pytest.raises(Fenced), db.unit_of_work() as conn:
        M.renew(conn, "n1", 1, LONG)                         # the old incarnation learns it at its next renewal


def test_a_takeover_waits_for_the_expiry_and_fences_the_paused_node(db: Database) -> None:
    join(db, "n1", SHORT)
    survivor = join(db, "n2")
    with db.unit_of_work() as conn:
        M.assign(conn, ("bridge", 7), "n1")
    with db.unit_of_work() as conn:                           # n1 is alive: its lease is fresh
        M.renew(conn, "n1", 1, LONG)
    with pytest.raises(NotExpired), db.unit_of_work() as conn:
        M.fence(conn, "n1", "n2", survivor)
    with db.unit_of_work() as conn:
        M.renew(conn, "n1", 1, SHORT)                          # then it pauses: no renewal after this one
    _wait_expired(db, "n1")
    with db.unit_of_work() as conn:
        assert M.fence(conn, "n1", "n2", survivor) == 2
        assert M.claim(conn, ("bridge", 7), "n1", "n2")
    # n1 wakes up: every write that depends on its epoch is refused, and so is its renewal
    with pytest.raises(Fenced), db.unit_of_work() as conn:
        M.check(conn, "n1", 1)
    with pytest.raises(Fenced), db.unit_of_work() as conn:
        M.check_owner(conn, ("bridge", 7), "n1", 1)
    with pytest.raises(Fenced), db.unit_of_work() as conn:
        M.renew(conn, "n1", 1, SHORT)
    with db.unit_of_work() as conn:
        M.check_owner(conn, ("bridge", 7), "n2", survivor)    # the new owner writes
        assert M.owned(conn, "n2") == [("bridge", 7)] and M.owned(conn, "n1") == []
    assert join(db, "n1") == 3                               # it rejoins as a new member (nothing owned)


def test_a_write_that_passed_its_check_commits_before_the_takeover_and_none_after(db: Database,
                                                                                  fresh_db: str) -> None:
    join(db, "n1", SHORT)
    survivor = join(db, "n2")
    with db.unit_of_work() as conn:
        conn.execute("CREATE TABLE fenced_writes (epoch bigint)")
    _wait_expired(db, "n1")
    writer = psycopg.connect(fresh_db)                        # n1's write, in flight when the takeover starts
    writer.execute("SELECT pg_backend_pid()")
    M.check(writer, "n1", 1)
    writer.execute("INSERT INTO fenced_writes VALUES (1)")
    outcome: list[object] = []

    def takeover() -> None:
        try:
            with db.unit_of_work() as conn:
                outcome.append(M.fence(conn, "n1", "n2", survivor))
        except BaseException as exc:   # noqa: BLE001 - handed to the test thread's assertion
            outcome.append(exc)

    t = threading.Thread(target=takeover)
    t.start()
    with psycopg.connect(fresh_db, autocommit=True) as watch:  # the takeover waits for the writer's lock
        for _ in range(int(WAIT_S / 0.02)):
            waiting = watch.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                    "AND query LIKE '%%nsjms_member%%FOR UPDATE%%'").fetchone()
            if waiting and waiting[0]:
                break
            threading.Event().wait(0.02)
        else:
            raise AssertionError("the takeover never waited for the writer's fence check")
    assert not outcome                                        # still waiting: the writer has not ended
    writer.commit()                                           # the write that passed its check commits
    t.join(WAIT_S)
    assert outcome == [2]
    with pytest.raises(Fenced):                               # the next write of the old epoch is refused
        M.check(writer, "n1", 1)
    writer.rollback()
    writer.close()
    with db.unit_of_work() as conn:
        rows = conn.execute("SELECT epoch FROM fenced_writes").fetchall()
    assert rows == [(1,)]


def test_a_graceful_leave_needs_no_expiry(db: Database) -> None:
    join(db, "n1")
    survivor = join(db, "n2")
    with db.unit_of_work() as conn:
        M.leave(conn, "n1", 1)
        assert expired(M.members(conn)) == ["n1"]
        assert M.fence(conn, "n1", "n2", survivor) == 2


def test_a_paused_nodes_open_unit_of_work_does_not_hold_the_takeover_back(db: Database, fresh_db: str) -> None:
    """n1 is paused inside a unit of work right after its fence check (its member row held FOR KEY SHARE, the
    session idle in its transaction, as a SIGSTOPped node leaves it). Before: the survivor's fence waited for it
    until PostgreSQL ended that session (idle_in_transaction_session_timeout, 60 s; here its lock_timeout of 10 s
    failed the pass and every next one). Now the takeover ends that session and fences n1 in the same pass; n1's
    write is rolled back (refused)."""
    from router.cluster.takeover import Takeover

    e1 = join(db, "n1", SHORT)
    e2 = join(db, "n2")
    paused = psycopg.connect(fresh_db)
    try:
        paused.execute("INSERT INTO nsjms_channel (id, qos, admin_props) VALUES (77, '{}', '{}')")
        M.check(paused, "n1", e1)                            # its unit of work's last statement: then it stops
        _wait_expired(db, "n1")
        took = Takeover(db, "n2", lambda: e2, 1.0, start=lambda owned: None, recover=lambda dead: None).pass_once()
        with db.unit_of_work() as conn:
            state = conn.execute("SELECT state, epoch, fenced_by FROM nsjms_member WHERE node_id = 'n1'").fetchone()
        assert state == ("fenced", e1 + 1, "n2"), f"fenced in this pass, not after the paused session's end: {state}"
        assert took == [], "it owned nothing"
        with pytest.raises(psycopg.OperationalError):       # woken: its session was ended, its write rolled back
            paused.commit()
    finally:
        paused.close()
    with db.unit_of_work() as conn:
        assert conn.execute("SELECT count(*) FROM nsjms_channel WHERE id = 77").fetchone() == (0,)


def test_a_takeover_ends_every_session_of_the_fenced_incarnation_and_no_other(db: Database, fresh_db: str) -> None:
    """n1 is paused inside a transaction holding a row lock (not its member row: the fence does not wait for it, the
    survivor's routing does), as a SIGSTOPped node's open routing-transaction branch holds the rows of its flow.
    Before: that session stayed until PostgreSQL's idle timeout (60 s), and for ever when its statement was still
    running. Now the takeover ends every session named for n1's fenced incarnation (router/cluster/sessions.py) and
    none of another incarnation of n1 nor of n2."""
    from router.cluster.sessions import session_name
    from router.cluster.takeover import Takeover

    token = "5" * 16                                     # as router.cluster.sessions.new_incarnation makes it
    with db.unit_of_work() as conn:
        M.join(conn, "n1", "n1.example:2809", SHORT, token=token)
        conn.execute("INSERT INTO nsjms_channel (id, qos, admin_props) VALUES (78, '{}', '{}')")
    e2 = join(db, "n2")
    paused = psycopg.connect(fresh_db, application_name=session_name("n1", token))
    other = psycopg.connect(fresh_db, application_name=session_name("n1", "0" * 16))  # another incarnation of n1
    live = psycopg.connect(fresh_db, application_name=session_name("n2", "1" * 16))
    try:
        paused.execute("SELECT id FROM nsjms_channel WHERE id = 78 FOR UPDATE")        # then it stops
        for conn in (other, live):
            conn.execute("SELECT 1")
        _wait_expired(db, "n1")
        Takeover(db, "n2", lambda: e2, 1.0, start=lambda owned: None, recover=lambda dead: None).pass_once()
        with db.unit_of_work() as conn:
            conn.execute("SET LOCAL lock_timeout = '5s'")
            got = conn.execute("SELECT id FROM nsjms_channel WHERE id = 78 FOR UPDATE").fetchone()
        assert got == (78,), "the fenced incarnation's lock is gone with its session"
        with pytest.raises(psycopg.OperationalError):
            paused.execute("SELECT 1")
        for conn in (other, live):
            assert conn.execute("SELECT 1").fetchone() == (1,), "another incarnation's or node's session is kept"
    finally:
        for conn in (paused, other, live):
            conn.close()
