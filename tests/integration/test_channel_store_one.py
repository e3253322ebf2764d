"""Store.insert_events against a real PostgreSQL: one event with one target goes through the scalar-parameter
statement (issue 27) and stores exactly the rows the array statement stores (event, queue row, ledger row)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from router.channel.store import NewEvent, Store
from router.db import Database, FenceToken, WriteFenced
from router.routing.ledger import Direction, LedgerSettings, LedgerWriter, Route, maintain

pytestmark = pytest.mark.integration


def _rows(dsn: str, eid: int) -> tuple[Any, ...]:
    with psycopg.connect(dsn) as conn:
        ev = conn.execute("SELECT channel_id, form, body, priority, deadline, start_at, received_at "
                          "FROM nsjms_event WHERE id = %s", (eid,)).fetchall()
        q = conn.execute("SELECT channel_id, admin_id, proxy_id FROM nsjms_queue WHERE event_id = %s",
                         (eid,)).fetchall()
        led = conn.execute("SELECT dedupe_id, channel_id, proxy_id, bridge_id, destination, direction, gtrid, "
                           "accepted_at, outcome FROM nsjms_ledger WHERE event_id = %s", (eid,)).fetchall()
    return ev, q, [(r[0].replace(f"e{eid}/", "e*/"), *r[1:]) for r in led]


@pytest.mark.parametrize("ledgered", [True, False])
def test_one_event_one_target_stores_what_the_array_statement_stores(fresh_db: str, ledgered: bool,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    db = Database(fresh_db, 2)
    db.open()
    try:
        writer = LedgerWriter(LedgerSettings(enabled=ledgered))
        writer.set_route(7, "C", 1, 3, Route(Direction.CHANNEL_TO_JMS, bridge_id=5, destination="queue/out"))
        store = Store(writer, clock=lambda: 1_700_000_000.25)
        scalar_calls: list[int] = []
        one = store._insert_one

        def spy(conn: Any, cid: int, *args: Any) -> list[int]:
            scalar_calls.append(cid)
            return one(conn, cid, *args)

        monkeypatch.setattr(store, "_insert_one", spy)
        with db.unit_of_work() as conn:
            maintain(conn, retention_days=2, ahead_days=1)
            conn.execute("INSERT INTO nsjms_channel(id, qos, admin_props) VALUES (7, '{}', '{}')")

        for seq, deadline, accepted in ((1, None, None), (4, 1_700_000_060.5, 1_699_999_999.0)):
            def event(seq: int, deadline: float | None = deadline, accepted: float | None = accepted) -> NewEvent:
                return NewEvent(seq, 2, b"\x00body\xff" * 100, 4, deadline, None, [(1, 3)], accepted_at=accepted)

            with db.statement() as conn:
                (scalar,) = store.insert_events(conn, 7, [event(seq)])
            # the same event again, but beside another one: the array statement
            two = [event(seq + 1), event(seq + 2)]
            with db.statement() as conn:
                array, _ = store.insert_events(conn, 7, two)
            got, expected = _rows(fresh_db, scalar), _rows(fresh_db, array)
            assert got == expected
            assert len(got[1]) == 1 and len(got[2]) == (1 if ledgered else 0)
        assert writer.rows_written == (6 if ledgered else 0)
        assert scalar_calls == [7, 7]                     # the lone events went through the scalar statement
    finally:
        db.close()


@pytest.mark.parametrize(("ledgered", "fenced"), [(True, True), (True, False), (False, True)])
def test_the_prepared_statement_on_a_lane_stores_what_the_array_statement_stores(fresh_db: str, ledgered: bool,
                                                                                 fenced: bool) -> None:
    """The group committer's lone push on its lane (router/db/lane.py): the values encoded by the store, the
    statement prepared once on the lane's connection; the same rows as psycopg's array statement, fence included."""
    db = Database(fresh_db, 2)
    db.open()
    try:
        writer = LedgerWriter(LedgerSettings(enabled=ledgered), node_id="nœud-1")
        writer.set_route(7, "C", 1, 3, Route(Direction.CHANNEL_TO_JMS, bridge_id=5, destination="queue/ünï"))
        store = Store(writer, clock=lambda: 1_700_000_000.25)
        fence = FenceToken("n1", 4) if fenced else None
        with db.unit_of_work() as conn:
            maintain(conn, retention_days=2, ahead_days=1)
            conn.execute("INSERT INTO nsjms_channel(id, qos, admin_props) VALUES (7, '{}', '{}')")
            conn.execute("INSERT INTO nsjms_member (node_id, epoch, state, lease_until, renewed_at, joined_at) "
                         "VALUES ('n1', 4, 'live', now() + interval '1 day', now(), now())")
            conn.execute("INSERT INTO nsjms_owner (kind, object_id, node_id) VALUES ('channel', 7, 'n1')")
        lane = db.lane()
        for seq, deadline, accepted in ((1, None, None), (70_000, 1_700_000_060.123456, 1_699_999_999.5),
                                        (2**40, 1e-3, None)):
            def event(seq: int, deadline: float | None = deadline, accepted: float | None = accepted) -> NewEvent:
                return NewEvent(seq, 2, b"\x00body\xff" * 100, 4, deadline, None, [(1, 3)], accepted_at=accepted)

            work = lane.take(5.0)
            assert work is not None
            with work as conn:
                (prepared,) = store.insert_events(conn, 7, [event(seq)], fence=fence, prepared=True)
            with db.statement() as conn:
                array, _ = store.insert_events(conn, 7, [event(seq + 1), event(seq + 2)], fence=fence)
            assert _rows(fresh_db, prepared) == _rows(fresh_db, array)
        assert lane.statements == 3
        with db.unit_of_work() as conn:                      # the channel moves: the prepared statement refuses
            conn.execute("UPDATE nsjms_owner SET node_id = 'n2' WHERE object_id = 7")
        work = lane.take(5.0)
        assert work is not None
        if fenced:
            with pytest.raises(WriteFenced), work as conn:
                store.insert_events(conn, 7, [NewEvent(9, 2, b"x", 4, None, None, [(1, 3)])], fence=fence,
                                    prepared=True)
        else:
            with work as conn:
                store.insert_events(conn, 7, [NewEvent(9, 2, b"x", 4, None, None, [(1, 3)])], prepared=True)
    finally:
        db.close()
