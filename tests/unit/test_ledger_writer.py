"""router.routing.ledger.LedgerWriter without a database: one statement per batch, column arrays, validation, routes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from router.routing.ledger import (
    Direction,
    LedgerRow,
    LedgerSettings,
    LedgerWriter,
    Outcome,
    Route,
    T2Item,
    channel_dedupe_id,
    inbound_dedupe_id,
    timestamp,
)


class FakeConn:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any]] = []

    def execute(self, query: Any, params: Any = None) -> None:
        self.calls.append((query, params))


def fake() -> Any:
    return FakeConn()


def row(dedupe: str = "d1", **kw: Any) -> LedgerRow:
    base: dict[str, Any] = {"dedupe_id": dedupe, "channel_id": 3, "direction": Direction.CHANNEL_TO_JMS,
                            "accepted_at": 1_700_000_000.25, "outcome": Outcome.ACCEPTED}
    base.update(kw)
    return LedgerRow(**base)


def test_a_batch_is_one_statement_with_one_array_per_column() -> None:
    conn, w = fake(), LedgerWriter()
    assert w.accepted(conn, [row("a", event_id=1), row("b", event_id=2, bridge_id=7, destination="queue/q")]) == 2
    assert len(conn.calls) == 1
    params = conn.calls[0][1]
    assert len(params) == 18 and all(len(col) == 2 for col in params[:17])
    assert params[17] is None      # the writer's node id (LedgerWriter(node_id=...)), one for the whole statement
    event_id, _jms, dedupe, channel, _proxy, bridge, dest, direction, _gtrid, accepted = params[:10]
    assert (event_id, dedupe, channel, bridge, dest) == ([1, 2], ["a", "b"], [3, 3], [None, 7], [None, "queue/q"])
    assert direction == ["channel_to_jms", "channel_to_jms"] and all(type(d) is str for d in direction)
    assert accepted[0] == datetime(2023, 11, 14, 22, 13, 20, 250000, tzinfo=UTC)
    assert params[15] == ["accepted", "accepted"] and params[16] == [None, None]
    assert w.rows_written == 2


def test_every_row_of_a_batch_carries_the_writers_node() -> None:
    conn, w = fake(), LedgerWriter(node_id="node-b")
    w.delivered(conn, [row("a"), row("b")])
    assert conn.calls[0][1][17] == "node-b" and "node_id" in conn.calls[0][0].as_string(None)


def test_terminal_helpers_set_outcome_and_reason() -> None:
    conn, w = fake(), LedgerWriter()
    w.delivered(conn, [row()])
    w.dead_lettered(conn, [row()], "mapping failed")
    w.discarded(conn, [row()], "DiscardPolicy")
    w.expired(conn, [row()], "expired")
    assert [(c[1][15], c[1][16]) for c in conn.calls] == [
        (["delivered"], [None]), (["dead_letter"], ["mapping failed"]), (["discarded"], ["DiscardPolicy"]),
        (["expired"], ["expired"])]


def test_a_reason_that_does_not_match_the_outcome_writes_nothing() -> None:
    conn, w = fake(), LedgerWriter()
    with pytest.raises(ValueError, match="needs failure_reason"):
        w.write(conn, [row(), row(outcome=Outcome.DEAD_LETTER)])
    with pytest.raises(ValueError, match="takes no failure_reason"):
        w.write(conn, [row(failure_reason="why")])
    assert conn.calls == []


def test_t2_writes_every_item_with_the_transaction_hops_in_one_statement() -> None:
    conn, w = fake(), LedgerWriter()
    items = [T2Item("a", 1, Direction.JMS_TO_CHANNEL, 10.0, jms_message_id="ID:1", bridge_id=4),
             T2Item("b", 1, Direction.JMS_TO_CHANNEL, 11.0, jms_message_id="ID:2", bridge_id=4)]
    w.t2(conn, gtrid="g1", outcome=Outcome.IN_DOUBT, items=items, prepared_at=12.0)
    w.t2(conn, gtrid="g1", outcome=Outcome.ROLLED_BACK, items=items, prepared_at=12.0, decided_at=13.0,
         reason="broker refused")
    assert len(conn.calls) == 2
    first = conn.calls[0][1]
    assert first[8] == ["g1", "g1"] and first[1] == ["ID:1", "ID:2"] and first[15] == ["in_doubt", "in_doubt"]
    assert first[11] == [timestamp(12.0)] * 2 and first[12] == [None, None]
    assert conn.calls[1][1][16] == ["broker refused"] * 2
    with pytest.raises(ValueError):
        w.t2(conn, gtrid="g1", outcome=Outcome.ROLLED_BACK, items=items)


def test_disabled_or_empty_writes_nothing() -> None:
    conn = fake()
    assert LedgerWriter(LedgerSettings(enabled=False)).accepted(conn, [row()]) == 0
    assert LedgerWriter().accepted(conn, []) == 0
    assert conn.calls == []


def test_settings_say_which_traffic_is_recorded_and_validate() -> None:
    assert LedgerSettings().records(persistent=True) and not LedgerSettings().records(persistent=False)
    assert LedgerSettings(best_effort=True).records(persistent=False)
    assert not LedgerSettings(enabled=False, best_effort=True).records(persistent=True)
    bads: list[dict[str, Any]] = [{"retention_days": 0}, {"ahead_days": -1}, {"maintenance_interval_s": 0}]
    for bad in bads:
        with pytest.raises(ValueError, match=r"ledger\."):
            LedgerSettings(**bad)


def test_routes_and_dedupe_ids() -> None:
    w = LedgerWriter()
    route = Route(Direction.CHANNEL_TO_JMS, 5, "queue/out")
    w.set_route(1, "C", 2, 3, route)
    assert w.route(1, "C", 2, 3) == route and w.route(1, "S", 2, 3) is None
    w.forget_route(1, "C", 2, 3)
    assert w.route(1, "C", 2, 3) is None
    assert channel_dedupe_id(9, 1, 2, 3) == "e9/c1/a2/p3"
    assert inbound_dedupe_id(5, "ID:x-1") == "j5/ID:x-1"


# -------------------------------------------------------------------------------------- a T2's PostgreSQL branch
class Branch:
    """A two-phase participant twin: records the order of its steps."""

    name, kind, manager, one_phase_only = "queue", "postgresql", "postgresql", False

    def __init__(self, steps: list[str]) -> None:
        self.steps = steps

    def sort_key(self) -> str:
        return self.name

    def begin(self, xid: Any) -> None:
        self.steps.append("begin")

    def prepare(self) -> None:
        self.steps.append("prepare")

    def commit(self) -> None:
        self.steps.append("commit")

    def rollback(self) -> None:
        self.steps.append("rollback")


class StepConn(FakeConn):
    def __init__(self, steps: list[str], fail: Exception | None = None) -> None:
        super().__init__()
        self.steps, self.fail = steps, fail

    def execute(self, query: Any, params: Any = None) -> None:
        if self.fail is not None:
            raise self.fail
        self.steps.append("insert")
        super().execute(query, params)


GTRID = "n1:0123456789abcdef01234567"


def test_a_t2_branch_writes_its_collected_rows_in_one_statement_just_before_prepare() -> None:
    from router.routing.ledger import t2_branch

    steps: list[str] = []
    conn, w = StepConn(steps), LedgerWriter()
    branch = t2_branch(w, conn, Branch(steps), GTRID, [11, None, 12])
    assert w.t2_rows(conn) is None, "nothing collects before the branch begins"
    branch.begin(None)
    rows = w.t2_rows(conn)
    assert rows is not None and rows.gtrid == GTRID
    assert rows.messages == {11: f"{GTRID}/0", 12: f"{GTRID}/2"}, "message i of the T2 is event i of the batch"
    rows.rows += [row("a", gtrid=GTRID, outcome=Outcome.DELIVERED), row("b", gtrid=GTRID, outcome=Outcome.DELIVERED)]
    assert conn.calls == []
    branch.prepare()
    assert steps == ["begin", "insert", "prepare"] and len(conn.calls) == 1
    prepared = conn.calls[0][1][11]
    assert prepared[0] is not None and prepared[0] == prepared[1], "one prepared_at for the T2's rows"
    assert w.t2_rows(conn) is None
    branch.commit()
    assert steps[-1] == "commit"


def test_a_rolled_back_t2_branch_writes_nothing_and_a_failing_insert_votes_no() -> None:
    import psycopg

    from router.routing.ledger import t2_branch
    from xa.errors import PrepareFailed

    steps: list[str] = []
    conn, w = StepConn(steps), LedgerWriter()
    branch = t2_branch(w, conn, Branch(steps), GTRID)
    branch.begin(None)
    w.t2_rows(conn).rows.append(row("a", outcome=Outcome.DELIVERED))  # type: ignore[union-attr]
    branch.rollback()
    assert steps == ["begin", "rollback"] and conn.calls == [] and w.t2_rows(conn) is None
    failing = StepConn(steps := [], psycopg.errors.CheckViolation("no"))
    branch = t2_branch(w, failing, Branch(steps), GTRID)
    branch.begin(None)
    w.t2_rows(failing).rows.append(row("a", outcome=Outcome.DELIVERED))  # type: ignore[union-attr]
    with pytest.raises(PrepareFailed, match=r"prepare"):
        branch.prepare()
    assert "prepare" not in steps, "the branch never prepares without its rows"


def test_without_the_ledger_the_branch_is_unchanged() -> None:
    from router.routing.ledger import t2_branch

    inner = Branch([])
    assert t2_branch(LedgerWriter(LedgerSettings(enabled=False)), fake(), inner, GTRID) is inner
    assert t2_branch(None, fake(), inner, GTRID) is inner
