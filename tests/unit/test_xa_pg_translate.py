"""xa.pg's one translation boundary for psycopg errors (the contract against real PostgreSQL is in
tests/integration/test_xa_contract.py): a statement the server cancelled is not a lost session."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import Xid, errors

from xa.errors import BranchNotFound, BranchUnavailable, PrepareFailed
from xa.pg import PgManager, session_lost, translate


@pytest.mark.parametrize("cancelled", [errors.QueryCanceled("canceling statement due to statement timeout"),
                                       errors.LockNotAvailable("canceling statement due to lock timeout")])
def test_a_cancelled_statement_is_not_a_lost_session(cancelled: Any) -> None:
    assert not session_lost(cancelled)
    assert isinstance(translate(cancelled, step="prepare", gtrid="g", branch="b"), PrepareFailed)
    assert isinstance(translate(cancelled, step="commit", gtrid="g", branch="b"), BranchUnavailable)


def test_connection_errors_stay_session_lost() -> None:
    lost = errors.AdminShutdown("terminating connection due to administrator command")
    assert session_lost(lost)
    assert isinstance(translate(lost, step="prepare", gtrid="g", branch="b"), BranchUnavailable)
    assert isinstance(translate(errors.UndefinedObject("no such"), step="commit", gtrid="g", branch="b"),
                      BranchNotFound)


@pytest.mark.parametrize("refused", [errors.OutOfMemory("maximum number of prepared transactions reached"),
                                     errors.DiskFull("could not extend file"),
                                     errors.ConfigurationLimitExceeded("too many")])
def test_a_prepare_refused_for_insufficient_resources_is_branch_unavailable(refused: Any) -> None:
    """Class 53 is an OperationalError: even on PREPARE it is BranchUnavailable, not PrepareFailed (what the
    module docstring says; the coordinator rolls back alike, tests/integration/test_xa_pg_prepare_fails.py)."""
    assert isinstance(translate(refused, step="prepare", gtrid="g", branch="b"), BranchUnavailable)
    assert isinstance(translate(errors.UniqueViolation("dup"), step="prepare", gtrid="g", branch="b"),
                      PrepareFailed)


class _Session:
    """A session twin: COMMIT PREPARED of ``cancel`` is cancelled by the server; the others succeed."""

    def __init__(self, done: list[str], cancel: str) -> None:
        self.done, self.cancel, self.autocommit = done, cancel, False

    def tpc_commit(self, xid: Xid) -> None:
        if xid.gtrid == self.cancel:
            raise errors.QueryCanceled("canceling statement due to statement timeout")
        self.done.append(xid.gtrid)

    def close(self) -> None:
        pass


def test_a_cancelled_commit_prepared_does_not_skip_the_rest_of_its_session_share() -> None:
    """Many branches finished over several sessions: one COMMIT PREPARED cancelled (a timeout) is that branch's
    BranchUnavailable (recovery retries it); the branches after it on the same session are still committed (a
    lost session would mark them "not attempted")."""
    done: list[str] = []
    manager = PgManager(lambda: _Session(done, "g0"), sessions=2, per_session=1)  # type: ignore[arg-type,return-value]
    ops = [("commit", Xid(1, f"g{i}", "b")) for i in range(4)]           # g0, g2 on one session; g1, g3 the other
    results = manager.finish_branches(ops)
    assert isinstance(results[0], BranchUnavailable)
    assert results[1:] == [None, None, None]
    assert sorted(done) == ["g1", "g2", "g3"]
