"""The operator's joined view (router.routing.t2.view): a pure function over the log's records, prepared xids and
outbox/inbox rows; the safe action and its reason for each in-doubt situation; refusals; orphans and foreign xids."""

from __future__ import annotations

import datetime as dt

import pytest
from psycopg import Xid

from router.routing.t2.view import HeldInfo, InboxInfo, OutboxInfo, Snapshot, join, parse_duration, refusal, select
from xa.errors import HeuristicKind
from xa.records import Commit, Heuristic, Participant, Progress, Record, Rollback, fold
from xa.xid import FORMAT_ID, branch_xid, dedupe_id

NOW = 1_800_000_000.0
NODE = "n1"
QUEUE = Participant("channel-queue", "postgresql", "postgresql", False)
OUTBOX = Participant("outbox", "postgresql", "postgresql", False)
STOMP = Participant("stomp", "stomp-send", "stomp-send", True)
G1 = "n1:000000000001000000000001"
G2 = "n1:000000000002000000000002"
OTHER = "n2:000000000003000000000003"


def prepared(gtrid: str, branch: str, age: float, *, format_id: int = FORMAT_ID) -> Xid:
    xid = branch_xid(gtrid, branch) if format_id == FORMAT_ID and ":" in gtrid else Xid(format_id, gtrid, branch)
    return Xid(xid.format_id, xid.gtrid, xid.bqual, dt.datetime.fromtimestamp(NOW - age, dt.UTC))


def snap(records: list[Record], xids: list[Xid] | None, *, guard: float = 60.0, mode: str = "online",
         outbox: tuple[OutboxInfo, ...] = (), inbox: tuple[InboxInfo, ...] = (),
         busy: frozenset[str] = frozenset()) -> Snapshot:
    return Snapshot(NODE, NOW, guard, fold(records), xids, "" if xids is not None else "connection refused",
                    outbox, inbox, busy, mode)


def rows(gtrid: str, n: int) -> tuple[OutboxInfo, ...]:
    return tuple(OutboxInfo(gtrid, i, dedupe_id(gtrid, i), 7, "queue://orders", NOW - 300) for i in range(n))


def test_commit_logged_with_a_prepared_branch_names_commit_and_the_dedupe_ids() -> None:
    listing = join(snap([Commit(G1, (QUEUE, OUTBOX, STOMP), NOW + 30, NOW - 300)],
                        [prepared(G1, "outbox", 301)], outbox=rows(G1, 2)))
    [t] = listing.transactions
    assert (t.status, t.decision, t.action) == ("commit-logged", "commit", "commit")
    assert "COMMIT logged; prepared branches outbox must be committed" in t.reason
    assert f"re-sends carry dedupe ids {G1}/0..{G1}/1" in t.reason
    assert [(b.name, b.state) for b in t.branches] == [("channel-queue", "gone"), ("outbox", "prepared"),
                                                      ("stomp", "not-confirmed")]
    assert t.age_s == pytest.approx(300) and t.deadline == NOW + 30 and t.decided_at == NOW - 300
    assert (t.bridges, t.destinations, t.events, t.in_doubt) == ((7,), ("queue://orders",), 2, True)
    assert refusal(t, "rollback") is not None and refusal(t, "commit") is None


def test_commit_logged_broker_unknown_names_resend() -> None:
    records: list[Record] = [Commit(G1, (QUEUE, OUTBOX, STOMP), None, NOW - 50),
                             Progress(G1, ("channel-queue", "outbox"), ("stomp",), NOW - 49)]
    [t] = join(snap(records, [], outbox=rows(G1, 3))).transactions
    assert t.action == "resend" and "broker outcome unknown" in t.reason and f"{G1}/2" in t.reason
    assert [b.state for b in t.branches] == ["done", "done", "unknown"]


def test_jms_to_channel_resend_speaks_of_acks_not_of_outbox_rows() -> None:
    """Issue 31: a JMS -> channel T2 has no outbox rows; its unknown broker branch is the ACKs'."""
    acks = Participant("stomp-ack", "stomp-ack", "stomp-ack", True)
    records: list[Record] = [Commit(G1, (QUEUE, acks), None, NOW - 50), Progress(G1, ("channel-queue",), (), NOW)]
    [t] = join(snap(records, [], inbox=(InboxInfo(G1, 4, "ID:1", NOW - 50),))).transactions
    assert t.action == "resend" and "outbox" not in t.reason.replace("no outbox rows", "")
    assert "the broker redelivers the messages whose ACKs it did not commit" in t.reason


def test_an_undecided_branch_shows_the_events_it_holds_and_a_commit_needs_heuristic() -> None:
    held = (HeldInfo(G1, 7, 3, "/queue/orders", 10), HeldInfo(G1, 8, 3, "/topic/audit", 2))
    [t] = join(Snapshot(NODE, NOW, 0.0, {}, [prepared(G1, "queue", 120)], held=held)).transactions
    assert (t.events, t.events_known, t.destinations, t.bridges) == (12, True, ("/queue/orders", "/topic/audit"),
                                                                     (7, 8))
    assert "it holds 12 channel event(s) for /queue/orders, /topic/audit" in t.reason
    assert "commits 12 event(s) to /queue/orders, /topic/audit" in (refusal(t, "commit") or "")
    assert refusal(t, "commit", heuristic=True) is None
    [blind] = join(Snapshot(NODE, NOW, 0.0, {}, [prepared(G1, "queue", 120)])).transactions
    assert (blind.events, blind.events_known) == (0, False) and "an unknown number" in (refusal(blind, "commit") or "")


def test_offline_without_a_broker_a_resend_is_advised_as_starting_the_node() -> None:
    records: list[Record] = [Commit(G1, (QUEUE, OUTBOX, STOMP), None, NOW - 50),
                             Progress(G1, ("channel-queue", "outbox"), ("stomp",), NOW - 49)]
    base = snap(records, [], outbox=rows(G1, 3), guard=0.0, mode="offline")
    [t] = join(Snapshot(**{**base.__dict__, "broker_problem": "embedded broker not running"})).transactions
    assert t.action == "start-node" and "embedded broker not running" in t.reason
    assert "nothing done" in (refusal(t, "commit") or "")


def test_undecided_older_than_the_guard_is_presumed_abort_younger_waits() -> None:
    listing = join(snap([], [prepared(G1, "outbox", 120), prepared(G1, "channel-queue", 120),
                             prepared(G2, "outbox", 5)]))
    by = {t.gtrid: t for t in listing.transactions}
    assert (by[G1].status, by[G1].action, by[G1].reason) == ("undecided", "rollback", "no COMMIT logged: presumed "
                                                             "abort")
    assert [(b.name, b.state) for b in by[G1].branches] == [("channel-queue", "prepared"), ("outbox", "prepared")]
    assert by[G2].action == "wait" and "younger than the in-flight guard (60 s)" in by[G2].reason
    assert not by[G2].in_doubt
    assert [t.gtrid for t in select(listing, in_doubt=True)] == [G1]
    assert [t.gtrid for t in listing.transactions] == [G1, G2]  # oldest first
    assert refusal(by[G1], "commit", heuristic=True) is None and refusal(by[G1], "rollback") is None
    assert "Add --heuristic" in (refusal(by[G1], "commit") or ""), "no COMMIT logged: a heuristic commit"


def test_offline_guard_is_zero_and_says_why() -> None:
    [t] = join(snap([], [prepared(G1, "outbox", 5)], guard=0.0, mode="offline")).transactions
    assert t.action == "rollback" and t.reason.endswith("(the node is stopped: nothing can be deciding it)")


def test_in_flight_waits_and_operator_actions_are_refused() -> None:
    [t] = join(snap([], [prepared(G1, "outbox", 500)], busy=frozenset({G1}))).transactions
    assert (t.status, t.action) == ("in-flight", "wait")
    assert "driving it now" in (refusal(t, "rollback") or "") and "driving it now" in (refusal(t, "commit") or "")


def test_rollback_logged_refuses_commit_with_the_reason() -> None:
    [t] = join(snap([Rollback(G1, (QUEUE, OUTBOX), "prepare failed", NOW - 10)],
                    [prepared(G1, "channel-queue", 11)])).transactions
    assert (t.decision, t.action) == ("rollback", "rollback")
    reason = refusal(t, "commit")
    assert reason is not None and "the decision ROLLBACK is logged" in reason and "Safe action: rollback" in reason
    assert refusal(t, "rollback") is None


def test_rollback_of_a_logged_commit_is_refused_naming_the_safe_action() -> None:
    [t] = join(snap([Commit(G1, (OUTBOX, STOMP), None, NOW - 10)], [prepared(G1, "outbox", 11)])).transactions
    reason = refusal(t, "rollback")
    assert reason is not None
    assert "the decision COMMIT is logged" in reason and "would break atomicity" in reason
    assert "Safe action: commit (COMMIT logged" in reason


def test_heuristic_outcome_is_listed_until_forgotten_with_who_and_why() -> None:
    records: list[Record] = [Heuristic(G1, HeuristicKind.COMMIT, "*", "ops@host", "ticket 42", NOW - 100)]
    [t] = join(snap(records, [])).transactions
    assert (t.status, t.action) == ("heuristic-commit", "forget")
    assert "ops@host at 2027-01-15T07:58:20Z: ticket 42" in t.reason  # who, when (UTC, readable), why
    assert t.heuristics == ({"kind": "commit", "branch": "*", "who": "ops@host", "why": "ticket 42",
                             "at": NOW - 100},)


def test_orphans_are_listed_apart_and_foreign_xids_only_counted() -> None:
    orphan = prepared("hand-made", "outbox", 900)
    other_node = prepared(OTHER, "outbox", 900)
    other_app = Xid.from_string("some_application_gid")
    listing = join(snap([], [orphan, other_node, other_app, prepared(G1, "outbox", 900)]))
    assert [t.gtrid for t in listing.transactions] == [G1]
    [o] = listing.orphans
    assert (o.gid, o.gtrid, o.bqual) == (str(orphan), "hand-made", "outbox")
    assert o.age_s == pytest.approx(900) and "recovery never touches it" in o.reason
    assert listing.foreign == 2
    as_json = listing.as_dict()
    assert as_json["orphans"][0]["gid"] == str(orphan) and as_json["foreign"] == 2


def test_postgresql_unreachable_is_an_error_and_retry() -> None:
    listing = join(snap([Commit(G1, (OUTBOX,), None, NOW - 5)], None))
    [t] = listing.transactions
    assert t.action == "retry" and "cannot reach postgresql" in t.reason
    assert [b.state for b in t.branches] == ["unreachable"]
    assert listing.errors == ("PostgreSQL: connection refused",)


def test_inbox_rows_count_as_events_and_bridges() -> None:
    inbox = (InboxInfo(G1, 3, "ID:m-1", NOW - 40, 12), InboxInfo(G1, 3, "ID:m-2", NOW - 40, 12))
    [t] = join(snap([Commit(G1, (QUEUE, STOMP), None, NOW - 40)], [prepared(G1, "channel-queue", 41)],
                    inbox=inbox)).transactions
    assert (t.events, t.bridges, t.channels, t.destinations) == (2, (3,), (12,), ())
    assert t.as_dict()["events"] == 2 and t.as_dict()["channels"] == [12]


def test_older_than_filter_and_durations() -> None:
    listing = join(snap([], [prepared(G1, "outbox", 4000), prepared(G2, "outbox", 100)]))
    assert [t.gtrid for t in select(listing, older_than=parse_duration("1h"))] == [G1]
    assert [parse_duration(x) for x in ("90", "90s", "15m", "2h", "1d", "1.5m")] == [90, 90, 900, 7200, 86400, 90]
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration("soon")
