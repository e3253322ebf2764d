"""router.latecommit: what recovery or an operator commits reaches the channels unless a driver owns the T2."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from psycopg import Xid

from router.latecommit import LateCommitManager, LateCommits
from xa.errors import BranchUnavailable, ResourceError


class FakeManager:
    key = "postgresql"

    def __init__(self) -> None:
        self.done: list[tuple[str, str]] = []

    def recover(self) -> Sequence[Xid]:
        return []

    def commit_branch(self, xid: Xid) -> None:
        self.done.append(("commit", xid.gtrid))

    def rollback_branch(self, xid: Xid) -> None:
        self.done.append(("rollback", xid.gtrid))

    def finish_branches(self, ops: Sequence[tuple[str, Xid]]) -> list[ResourceError | None]:
        for step, xid in ops:
            self.done.append((step, xid.gtrid))
        return [None] * len(ops)

    def close(self) -> None:
        pass


def xid(gtrid: str) -> Xid:
    return Xid.from_parts(0x6E736A31, gtrid, "pg")


def ids_of(table: dict[str, str]) -> Callable[[Sequence[str]], dict[str, str]]:
    def lookup(gids: Sequence[str]) -> dict[str, str]:
        return {g: table[Xid.from_string(g).gtrid] for g in gids if Xid.from_string(g).gtrid in table}
    return lookup


def test_commits_before_attach_are_handed_over_and_owned_ones_never() -> None:
    late, sunk = LateCommits(), list[list[str]]()
    inner = FakeManager()
    mgr = LateCommitManager(inner, late, ids_of({"n:a": "101", "n:b": "102", "n:c": "103"}))
    late.own("n:b")                      # a driver queues its own T2's events
    mgr.commit_branch(xid("n:a"))
    assert mgr.finish_branches([("commit", xid("n:b")), ("rollback", xid("n:x"))]) == [None, None]
    late.attach(lambda ids: sunk.append(list(ids)) or len(ids))
    assert sunk == [["101"]]
    late.disown("n:b")
    mgr.finish_branches([("commit", xid("n:c"))])
    assert sunk == [["101"], ["103"]]
    assert inner.done == [("commit", "n:a"), ("commit", "n:b"), ("rollback", "n:x"), ("commit", "n:c")]


def test_ids_unreadable_commit_nothing_and_rollbacks_go_on() -> None:
    def broken(gids: Sequence[str]) -> dict[str, str]:
        raise OSError("database unreachable")

    late, inner = LateCommits(), FakeManager()
    mgr = LateCommitManager(inner, late, broken)
    results = mgr.finish_branches([("commit", xid("n:a")), ("rollback", xid("n:b"))])
    assert isinstance(results[0], BranchUnavailable) and results[1] is None
    assert inner.done == [("rollback", "n:b")], "a commit whose events could not be found waits for the next pass"
    try:
        mgr.commit_branch(xid("n:a"))
    except BranchUnavailable:
        pass
    else:
        raise AssertionError("commit_branch went on without the transaction id")
    assert inner.done == [("rollback", "n:b")]
