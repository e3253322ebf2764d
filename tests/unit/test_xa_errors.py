"""The xa exception tree: misuse vs peer failure, data carried, picklable."""

from __future__ import annotations

import pickle

import pytest

from xa import errors as e

G = "n1:" + "a" * 24


def samples() -> list[e.XAError]:
    return [
        e.XAError("x", gtrid=G), e.UsageError("u"), e.IllegalTransition("i", gtrid=G, state="S", event="E"),
        e.DuplicateBranch("d", gtrid=G), e.ForeignXid("f", gtrid=G),
        e.TransactionRolledBack("r", gtrid=G, reason="why"), e.TransactionTimeout("t", gtrid=G, reason="late"),
        e.DecisionUnknown("du", gtrid=G), e.ResourceError("re", gtrid=G, branch="b"),
        e.PrepareFailed("p", gtrid=G, branch="b"), e.BranchUnavailable("bu", branch="b"),
        e.OutcomeUnknown("ou", gtrid=G, branch="stomp"), e.BranchNotFound("nf", branch="b"),
        e.HeuristicOutcome("h", gtrid=G, branch="b", kind=e.HeuristicKind.MIXED),
        e.LogError("l"), e.LogWriteFailed("lw"), e.LogDurabilityUnknown("ld"), e.LogCorrupted("lc"),
    ]


@pytest.mark.parametrize("exc", samples(), ids=lambda x: type(x).__name__)
def test_pickle_round_trip(exc: e.XAError) -> None:
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is type(exc)
    assert vars(again) == vars(exc)
    assert str(again) == str(exc)


def test_misuse_and_peer_failure_are_separate_branches() -> None:
    assert not issubclass(e.UsageError, e.ResourceError)
    assert issubclass(e.IllegalTransition, e.UsageError)
    assert issubclass(e.OutcomeUnknown, e.ResourceError)
    assert issubclass(e.TransactionTimeout, e.TransactionRolledBack)
    assert all(issubclass(getattr(e, n), e.XAError) for n in e.__all__ if n != "HeuristicKind")


def test_gtrid_in_message() -> None:
    assert str(e.PrepareFailed("no", gtrid=G, branch="b")) == f"no [gtrid={G}]"
