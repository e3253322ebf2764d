"""One contract suite for a T2 branch resource and its recovery manager, run against the in-memory twin AND real
PostgreSQL (``xa.pg``): whatever a unit test assumes of the twin, PostgreSQL must do too."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import psycopg
import pytest
from psycopg import Xid
from psycopg.conninfo import make_conninfo

from router.node.services import free_port
from xa.coordinator import Coordinator
from xa.errors import BranchNotFound, BranchUnavailable, PrepareFailed, UsageError
from xa.pg import PgBranch, PgManager
from xa.resource import RecoverableManager, Resource
from xa.states import State
from xa.testing import FakeClock, MemoryLog, MemoryManager, MemoryResource
from xa.xid import NodeId, branch_xid, is_ours, new_gtrid

pytestmark = pytest.mark.integration
NODE = NodeId("n1")


class Harness(Protocol):
    manager: RecoverableManager

    def branch(self, name: str) -> Resource: ...
    def work(self, branch: Resource, value: str) -> None: ...
    def doom(self, branch: Resource) -> None: ...  # make the branch's prepare fail
    def visible(self) -> set[str]: ...
    def crash(self, branch: Resource) -> None: ...  # the session holding the branch dies
    def unreachable(self) -> RecoverableManager: ...  # the same manager when its server cannot be reached


class MemoryHarness:
    def __init__(self) -> None:
        self.db = MemoryManager("pg", FakeClock())
        self.manager: RecoverableManager = self.db

    def branch(self, name: str) -> Resource:
        return self.db.branch(name)

    def work(self, branch: Resource, value: str) -> None:
        assert isinstance(branch, MemoryResource)
        branch.write(value)

    def doom(self, branch: Resource) -> None:
        assert isinstance(branch, MemoryResource)
        branch.fail["prepare"] = PrepareFailed("doomed", branch=branch.name)

    def visible(self) -> set[str]:
        return set(self.db.committed)

    def crash(self, branch: Resource) -> None:
        pass  # prepared branches live in the manager, as in a database

    def unreachable(self) -> RecoverableManager:
        down = BranchUnavailable("connection refused")
        return MemoryManager("pg", fail={"recover": down, "commit_branch": down, "rollback_branch": down})


class PgHarness:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conns: list[psycopg.Connection[Any]] = []
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (v text, CONSTRAINT t_v UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)")
        self.pg = PgManager(lambda: psycopg.connect(dsn))
        self.manager: RecoverableManager = self.pg

    def branch(self, name: str) -> Resource:
        conn = psycopg.connect(self.dsn)
        self.conns.append(conn)
        return PgBranch(conn, name)

    def work(self, branch: Resource, value: str) -> None:
        assert isinstance(branch, PgBranch)
        branch.conn.execute("INSERT INTO t (v) VALUES (%s)", (value,))

    def doom(self, branch: Resource) -> None:
        assert isinstance(branch, PgBranch)  # a deferred unique violation: detected at PREPARE TRANSACTION
        branch.conn.execute("INSERT INTO t (v) VALUES ('dup'), ('dup')")

    def visible(self) -> set[str]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return {row[0] for row in conn.execute("SELECT v FROM t")}

    def crash(self, branch: Resource) -> None:
        assert isinstance(branch, PgBranch)
        branch.conn.close()

    def unreachable(self) -> RecoverableManager:
        dead = make_conninfo(self.dsn, host="127.0.0.1", port=str(free_port()), connect_timeout="2")
        return PgManager(lambda: psycopg.connect(dead))

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.pg.close()


@pytest.fixture(params=["memory", "postgresql"])
def h(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "memory":
        yield MemoryHarness()
        return
    harness = PgHarness(request.getfixturevalue("fresh_db"))
    try:
        yield harness
    finally:
        harness.close()


def ours(h: Harness) -> list[Xid]:
    return [x for x in h.manager.recover() if is_ours(x, NODE)]


def coordinator() -> Coordinator:
    return Coordinator(NODE, MemoryLog(NODE), FakeClock())


def test_two_phase_commit_makes_the_work_visible(h: Harness) -> None:
    t = coordinator().begin(30)
    a, b = h.branch("a"), h.branch("b")
    for branch, value in ((a, "1"), (b, "2")):
        t.enlist(branch)
        h.work(branch, value)
    assert t.commit().state is State.COMMITTED
    assert h.visible() == {"1", "2"} and ours(h) == []


def test_prepared_branch_survives_its_session_and_is_committed_by_xid(h: Harness) -> None:
    xid = branch_xid(new_gtrid(NODE), "a")
    a = h.branch("a")
    a.begin(xid)
    h.work(a, "x")
    a.prepare()
    h.crash(a)
    [found] = ours(h)
    assert (found.format_id, found.gtrid, found.bqual) == (xid.format_id, xid.gtrid, xid.bqual)
    assert found.prepared is not None
    assert h.visible() == set()
    h.manager.commit_branch(found)
    assert h.visible() == {"x"} and ours(h) == []
    with pytest.raises(BranchNotFound):
        h.manager.commit_branch(found)


def test_prepared_branch_rolled_back_by_xid(h: Harness) -> None:
    xid = branch_xid(new_gtrid(NODE), "a")
    a = h.branch("a")
    a.begin(xid)
    h.work(a, "x")
    a.prepare()
    h.crash(a)
    h.manager.rollback_branch(xid)
    assert h.visible() == set() and ours(h) == []
    with pytest.raises(BranchNotFound):
        h.manager.rollback_branch(xid)


def test_unknown_xid_is_branch_not_found(h: Harness) -> None:
    xid = branch_xid(new_gtrid(NODE), "nothing")
    with pytest.raises(BranchNotFound):
        h.manager.commit_branch(xid)
    with pytest.raises(BranchNotFound):
        h.manager.rollback_branch(xid)


def test_rollback_before_and_after_prepare(h: Harness) -> None:
    early, late = h.branch("early"), h.branch("late")
    early.begin(branch_xid(new_gtrid(NODE), "early"))
    h.work(early, "e")
    early.rollback()
    late.begin(branch_xid(new_gtrid(NODE), "late"))
    h.work(late, "l")
    late.prepare()
    late.rollback()
    assert h.visible() == set() and ours(h) == []


def test_rollback_with_nothing_begun_is_quiet(h: Harness) -> None:
    t = coordinator().begin()
    t.enlist(h.branch("a"))
    assert t.rollback().state is State.ROLLED_BACK


def test_prepare_failure_is_prepare_failed_and_everything_rolls_back(h: Harness) -> None:
    t = coordinator().begin(30)
    good, bad = h.branch("a-good"), h.branch("b-bad")
    t.enlist(good)
    h.work(good, "kept?")
    t.enlist(bad)
    h.doom(bad)
    with pytest.raises(PrepareFailed) as info:
        t.commit()
    assert info.value.branch == "b-bad" and info.value.gtrid == t.gtrid
    assert t.state is State.ROLLED_BACK
    assert h.visible() == set() and ours(h) == []


def test_unreachable_manager_is_branch_unavailable(h: Harness) -> None:
    down = h.unreachable()
    xid = branch_xid(new_gtrid(NODE), "a")
    with pytest.raises(BranchUnavailable):
        down.recover()
    with pytest.raises(BranchUnavailable) as info:
        down.commit_branch(xid)
    assert info.value.gtrid == xid.gtrid
    with pytest.raises(BranchUnavailable):
        down.rollback_branch(xid)


# ------------------------------------------------------------------------- PostgreSQL-only boundary
def test_pg_branch_refuses_a_busy_or_autocommit_connection(fresh_db: str) -> None:
    xid = branch_xid(new_gtrid(NODE), "a")
    with psycopg.connect(fresh_db) as busy:
        busy.execute("SELECT 1")  # work done before enlisting: it would not be part of the branch
        with pytest.raises(UsageError, match="not idle"):
            PgBranch(busy, "a").begin(xid)
    with psycopg.connect(fresh_db, autocommit=True) as auto, pytest.raises(UsageError, match="autocommit"):
        PgBranch(auto, "a").begin(xid)


def test_pg_errors_are_translated_at_the_boundary(fresh_db: str) -> None:
    """A non-connection error at commit is BranchUnavailable (outcome unknown), never a raw psycopg error."""
    conn = psycopg.connect(fresh_db)
    try:
        branch = PgBranch(conn, "a")
        branch.begin(branch_xid(new_gtrid(NODE), "a"))
        branch.prepare()
        conn.close()  # the session dies after PREPARE
        with pytest.raises(BranchUnavailable) as info:
            branch.commit()
        assert isinstance(info.value.__cause__, psycopg.Error)
        with pytest.raises(BranchUnavailable, match="closed while prepared"):
            branch.rollback()
    finally:
        conn.close()
    manager = PgManager(lambda: psycopg.connect(fresh_db))
    try:
        [xid] = [x for x in manager.recover() if is_ours(x, NODE)]
        manager.rollback_branch(xid)
    finally:
        manager.close()


def test_a_cancelled_prepare_votes_no_and_the_session_stays_usable(fresh_db: str) -> None:
    """PREPARE TRANSACTION cancelled by the server (its deferred unique check waits for another session's
    uncommitted row until ``lock_timeout``; PostgreSQL does not apply ``statement_timeout`` there): PostgreSQL
    turns a failed PREPARE into a ROLLBACK, so the branch voted no — PrepareFailed, not BranchUnavailable
    ("session gone, outcome unknown"). The session is still usable (it holds the next T2's branch), nothing stays
    prepared, and the coordinator rolls the T2 back."""
    with psycopg.connect(fresh_db, autocommit=True) as admin:
        admin.execute("CREATE TABLE c (v text, CONSTRAINT c_v UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)")
    other = psycopg.connect(fresh_db)
    conn = psycopg.connect(fresh_db)
    manager = PgManager(lambda: psycopg.connect(fresh_db))
    try:
        other.execute("INSERT INTO c (v) VALUES ('x')")               # uncommitted: the check must wait for it
        conn.execute("SET lock_timeout = '200ms'")
        conn.commit()
        branch = PgBranch(conn, "a")
        t = coordinator().begin()
        t.enlist(branch)
        conn.execute("INSERT INTO c (v) VALUES ('x')")
        with pytest.raises(PrepareFailed) as info:
            t.commit()
        assert type(info.value.__cause__).__name__ == "LockNotAvailable"
        assert t.state is State.ROLLED_BACK
        assert not conn.closed and conn.execute("SELECT 1").fetchone() == (1,)   # the session is fine
        conn.commit()
        again = PgBranch(conn, "a")                                  # and can hold the branch of the next T2
        t2 = coordinator().begin()
        t2.enlist(again)
        conn.execute("INSERT INTO c (v) VALUES ('y')")
        assert t2.commit().state is State.COMMITTED
        assert [x for x in manager.recover() if is_ours(x, NODE)] == []
    finally:
        other.close()
        conn.close()
        manager.close()
