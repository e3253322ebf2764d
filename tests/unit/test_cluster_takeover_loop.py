"""router.cluster.takeover.Takeover.pass_once without a database: who is taken over (expired or departed members,
never this node), what happens when a member renewed meanwhile (NotExpired: skipped), the order recovery -> start,
and a failed recovery retried at the next pass for the members this node fenced."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from router.cluster import NotExpired
from router.cluster import takeover as T
from router.cluster.lease import MemberView
from router.cluster.ownership import Owned
from router.cluster.spread import Spread

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _view(node: str, state: str, lease_left_s: float) -> MemberView:
    return MemberView(node, 1, state, f"{node}:2809", NOW + timedelta(seconds=lease_left_s),
                      NOW - timedelta(seconds=7), NOW)


class _Db:
    @contextmanager
    def unit_of_work(self) -> Iterator[Any]:
        yield self

    def execute(self, *args: Any) -> Any:
        return self


def _takeover(monkeypatch: pytest.MonkeyPatch, views: list[MemberView], claims: dict[str, Any],
              fenced_by_me: list[str], events: list[tuple[str, Any]], *, fail_recover: bool = False) -> T.Takeover:
    monkeypatch.setattr(T.M, "members", lambda conn: views)

    def claim_spread(conn: Any, dead: str, by: str, by_epoch: int) -> Spread:
        events.append(("claim", dead))
        outcome = claims[dead]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome if isinstance(outcome, Spread) else Spread(2, outcome)

    monkeypatch.setattr(T, "claim_spread", claim_spread)

    def release_recovered(conn: Any, recovered: list[str]) -> list[tuple[int, str]]:
        if recovered:
            events.append(("release", tuple(recovered)))
        return []

    monkeypatch.setattr(T, "release_recovered", release_recovered)

    def recover(dead: str) -> None:
        events.append(("recover", dead))
        if fail_recover:
            raise ConnectionError("PostgreSQL went away")

    t = T.Takeover(_Db(), "me", lambda: 1, 1.0, start=lambda owned: events.append(("start", owned)),
                   recover=recover)
    monkeypatch.setattr(t, "_to_recover", lambda: fenced_by_me)
    return t


def test_expired_and_departed_members_are_taken_over_never_this_node_nor_a_live_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    views = [_view("me", "live", -5.0), _view("dead", "live", -1.0), _view("gone", "left", 0.0),
             _view("alive", "live", 10.0), _view("renewed", "live", -0.5)]
    owned = Owned((3,), (7,))
    events: list[tuple[str, Any]] = []
    t = _takeover(monkeypatch, views, {"dead": owned, "gone": Owned(), "renewed": NotExpired("renewed", "renewed")},
                  [], events)
    done = t.pass_once()
    assert [d.node_id for d in done] == ["dead"] and done[0].owned == owned and done[0].epoch == 2
    assert done[0].after_last_renewal_s == 7.0
    assert events == [("claim", "dead"), ("recover", "dead"), ("release", ("dead",)),  # recovery before the
                      ("start", owned),                                               # others' shares, the start
                      ("claim", "gone"), ("recover", "gone"),                       # owned nothing: no start
                      ("claim", "renewed")]                                         # renewed meanwhile: skipped
    assert t.status()[0]["channels"] == [3] and t.status()[0]["bridges"] == [7]


def test_a_failed_recovery_is_reported_and_retried_for_the_members_this_node_fenced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, Any]] = []
    t = _takeover(monkeypatch, [_view("me", "live", 5.0)], {}, ["old"], events, fail_recover=True)
    assert t.pass_once() == []
    assert events == [("recover", "old")], "the other survivors' shares of it stay claimed until its recovery ran"
    assert t.last_error is not None and "PostgreSQL went away" in t.last_error


def test_a_fenced_node_takes_nothing_over(monkeypatch: pytest.MonkeyPatch) -> None:
    t = T.Takeover(_Db(), "me", lambda: None, 1.0, start=lambda owned: None)
    with pytest.raises(T.Fenced):
        t.pass_once()


def test_a_start_that_failed_after_its_claim_committed_is_retried_at_the_next_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim commits, then loading the claimed work fails (a database blip): the next pass no longer lists the
    member as expired, yet the claimed ids are started then."""
    owned = Owned((3,), (7,))
    views = [_view("me", "live", 5.0), _view("dead", "live", -1.0)]
    events: list[tuple[str, Any]] = []
    t = _takeover(monkeypatch, views, {"dead": owned}, [], events)
    starts: list[Owned] = []

    def start(o: Owned) -> None:
        starts.append(o)
        if len(starts) == 1:
            raise ConnectionError("PostgreSQL blip in bridges.restore")

    t._start = start
    with pytest.raises(ConnectionError):
        t.pass_once()
    views[1] = _view("dead", "fenced", -1.0)          # claimed: no longer expired
    t.pass_once()
    assert starts == [owned, owned], "the claimed work is started at the next pass"
    t.pass_once()
    assert len(starts) == 2, "once started, not again"
    assert [s["started"] for s in t.status()] == [True]


def test_a_takeover_is_listed_as_started_only_once_its_work_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (CI, test_cluster_takeover): the status listed a takeover as soon as the claim committed, and a
    client that read it asked the node for the channel before it was loaded (ChannelNotFound). The claim is told
    to the node at once (``claimed``: its factory answers TRANSIENT meanwhile); ``started`` turns true after start."""
    owned = Owned((3,), (7,))
    events: list[tuple[str, Any]] = []
    t = _takeover(monkeypatch, [_view("me", "live", 5.0), _view("dead", "live", -1.0)], {"dead": owned}, [], events)
    seen: list[tuple[str, Any]] = []
    t._claimed = lambda o: seen.append(("claimed", o, [s["started"] for s in t.status()]))
    t._start = lambda o: seen.append(("start", o, [s["started"] for s in t.status()]))
    t.pass_once()
    assert seen == [("claimed", owned, [False]), ("start", owned, [False])]
    assert [s["started"] for s in t.status()] == [True]


def test_the_other_survivors_shares_are_released_after_the_recovery_and_before_this_nodes_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead node's work spread over the survivors (router/cluster/spread.py): the fence's transaction assigned
    channel 3 here and channels 4 and 5 to ``other``; the dead node's transactions are finished first, then the
    others' shares are released (they load them at their next period), then this node starts its own. The status
    says where everything went."""
    mine, theirs = Owned((3,), (7,)), Owned((4, 5), (8,))
    events: list[tuple[str, Any]] = []
    t = _takeover(monkeypatch, [_view("me", "live", 5.0), _view("dead", "live", -1.0)],
                  {"dead": Spread(2, mine, {"other": theirs})}, [], events)
    done = t.pass_once()
    assert events == [("claim", "dead"), ("recover", "dead"), ("release", ("dead",)), ("start", mine)]
    assert done[0].owned == mine and done[0].others == {"other": theirs}
    assert t.status()[0]["spread"] == {"other": {"channels": [4, 5], "bridges": [8]}}


def test_a_dead_node_whose_work_all_went_to_others_starts_nothing_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything went to another survivor (it was less loaded): nothing is started here, the shares are released
    after the recovery, and the takeover is listed."""
    events: list[tuple[str, Any]] = []
    t = _takeover(monkeypatch, [_view("me", "live", 5.0), _view("dead", "live", -1.0)],
                  {"dead": Spread(2, Owned(), {"other": Owned((4,), ())})}, [], events)
    claimed: list[Owned] = []
    t._claimed = claimed.append
    assert [d.node_id for d in t.pass_once()] == ["dead"]
    assert events == [("claim", "dead"), ("recover", "dead"), ("release", ("dead",))]
    assert claimed == []
