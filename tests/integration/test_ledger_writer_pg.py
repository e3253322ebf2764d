"""router.routing.ledger.LedgerWriter against a real PostgreSQL: the node's migrations create the ledger, rows of every
outcome land in their day partition, a failing write rolls the caller's transaction back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from router.db import Database, StoreError
from router.routing.ledger import (
    Direction,
    LedgerRow,
    LedgerWriter,
    Outcome,
    T2Item,
    drop_expired_partitions,
    ensure_partitions,
    maintain,
)

pytestmark = pytest.mark.integration


def test_rows_of_every_kind_round_trip_and_partitions_hold_them(fresh_db: str) -> None:
    db = Database(fresh_db, 2)
    db.open()                                      # migrations 1.. including the ledger
    try:
        now = datetime.now(UTC).replace(microsecond=123456)
        w = LedgerWriter()
        with db.unit_of_work() as conn:
            assert maintain(conn, retention_days=2, ahead_days=1)[0] == [now.date(), now.date() + timedelta(1)]
            w.accepted(conn, [LedgerRow("e1/c0/a1/p0", 0, Direction.CHANNEL_TO_CONSUMER, now, Outcome.ACCEPTED,
                                        event_id=1, proxy_id=0)])
            w.delivered(conn, [LedgerRow("e1/c0/a1/p0", 0, Direction.CHANNEL_TO_CONSUMER, now, Outcome.ACCEPTED,
                                         event_id=1, proxy_id=0, acknowledged_at=now + timedelta(seconds=1))])
            items = [T2Item(f"j2/ID:{n}", 0, Direction.JMS_TO_CHANNEL, now.timestamp(), jms_message_id=f"ID:{n}",
                            bridge_id=2, destination="queue/in") for n in range(3)]
            w.t2(conn, gtrid="gt-1", outcome=Outcome.IN_DOUBT, items=items, prepared_at=now)
            w.t2(conn, gtrid="gt-1", outcome=Outcome.DELIVERED, items=items, prepared_at=now, decided_at=now,
                 broker_committed_at=now, acknowledged_at=now)
        with psycopg.connect(fresh_db) as conn:
            rows = conn.execute("SELECT dedupe_id, outcome, gtrid, jms_message_id, accepted_at, acknowledged_at, "
                                "tableoid::regclass::text FROM nsjms_ledger ORDER BY entry_id").fetchall()
        assert [(r[0], r[1]) for r in rows[:2]] == [("e1/c0/a1/p0", "accepted"), ("e1/c0/a1/p0", "delivered")]
        assert rows[0][4] == now and rows[1][5] == now + timedelta(seconds=1)
        assert [r[1] for r in rows[2:]] == ["in_doubt"] * 3 + ["delivered"] * 3
        assert {r[2] for r in rows[2:]} == {"gt-1"} and rows[2][3] == "ID:0"
        assert {r[6] for r in rows} == {f"nsjms_ledger_p{now:%Y%m%d}"}
        with db.unit_of_work() as conn:
            assert drop_expired_partitions(conn, 1, now.date() + timedelta(days=3)) == [now.date(),
                                                                                       now.date() + timedelta(1)]
            assert ensure_partitions(conn, now.date(), 1) == [now.date()]
    finally:
        db.close()


def test_a_failing_ledger_write_fails_the_whole_unit_of_work(fresh_db: str) -> None:
    db = Database(fresh_db, 2)
    db.open()
    try:
        with psycopg.connect(fresh_db, autocommit=True) as admin:     # the ledger refuses every insert
            admin.execute("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
                          "$$ BEGIN RAISE EXCEPTION 'ledger refuses'; END $$")
            admin.execute("CREATE TRIGGER refuse BEFORE INSERT ON nsjms_ledger_default "
                          "FOR EACH ROW EXECUTE FUNCTION refuse()")
        with pytest.raises(StoreError, match="ledger refuses"), db.unit_of_work() as conn:
            conn.execute("SELECT nextval('nsjms_channel_id')")
            conn.execute("INSERT INTO nsjms_channel(id, qos, admin_props) VALUES (100, '{}', '{}')")
            LedgerWriter().accepted(conn, [LedgerRow("x", 100, Direction.CHANNEL_TO_CONSUMER, 0.0,
                                                     Outcome.ACCEPTED)])
        with psycopg.connect(fresh_db) as conn:
            assert conn.execute("SELECT count(*) FROM nsjms_channel WHERE id = 100").fetchone() == (0,)
    finally:
        db.close()


def test_node_maintenance_runs_in_its_own_transaction_and_gives_up_on_a_locked_ledger(
        fresh_db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from router.node.server import Node, NodeSettings
    from router.routing.ledger import LedgerSettings, list_partitions

    node = Node(NodeSettings(state_dir=tmp_path, pg_dsn=fresh_db, ledger=LedgerSettings(ahead_days=2)))
    node.db = Database(fresh_db, 2)
    node.db.open()
    try:
        with psycopg.connect(fresh_db) as blocker:           # a long transaction holding the ledger
            blocker.execute("LOCK TABLE nsjms_ledger IN ACCESS EXCLUSIVE MODE")
            assert node.maintain_ledger() is False            # lock_timeout: gives up instead of waiting
            blocker.rollback()
        assert "ledger partition maintenance failed" in caplog.text
        assert node.maintain_ledger() is True
        with node.db.unit_of_work() as conn:
            today = datetime.now(UTC).date()
            assert list_partitions(conn) == [today + timedelta(days=n) for n in range(3)]
    finally:
        node.db.close()


def test_store_writes_a_deliverys_row_with_its_gtrid_or_leaves_it_to_the_caller(fresh_db: str) -> None:
    from router.channel.store import NewEvent, Store

    db = Database(fresh_db, 2)
    db.open()
    try:
        store = Store()
        with db.unit_of_work() as conn:
            cid = store.next_channel_id(conn)
            store.insert_channel(conn, cid, {}, {}, {"C": {}, "S": {}})
            ids = store.insert_events(conn, cid, [NewEvent(n, 1, b"x", 0, None, None, [(0, 0)], 1_700_000_000.0 + n)
                                                  for n in (1, 2)])
        with db.unit_of_work() as conn:
            store.delete_deliveries(conn, cid, 0, 0, ids[:1], gtrid="gt-7")
            store.delete_deliveries(conn, cid, 0, 0, ids[1:], ledger=False)       # the caller writes its own
            store.delete_deliveries(conn, cid, 0, 0, ids[:1], gtrid="gt-7")      # already gone: no second row
        with psycopg.connect(fresh_db) as conn:
            rows = conn.execute("SELECT dedupe_id, outcome, gtrid, accepted_at FROM nsjms_ledger "
                                "ORDER BY entry_id").fetchall()
        assert [(r[0], r[1], r[2]) for r in rows] == [
            (f"e{ids[0]}/c{cid}/a0/p0", "accepted", None), (f"e{ids[1]}/c{cid}/a0/p0", "accepted", None),
            (f"e{ids[0]}/c{cid}/a0/p0", "delivered", "gt-7")]
        assert rows[0][3] == rows[2][3] == datetime.fromtimestamp(1_700_000_001.0, UTC)
    finally:
        db.close()


def test_a_t2s_broker_commit_time_written_after_its_decision_time_still_lands(fresh_db: str) -> None:
    """A purge that took a T2's hops while only its decision was known writes ``decided_at`` alone; the broker
    commit time recorded later (e.g. by an operator-triggered recovery racing the purge) fills the row at the next
    purge, and what was written first is kept (regression: the update required both columns NULL, so the broker
    commit time stayed NULL for good)."""
    from router.channel.store import NewEvent, Store
    from router.routing.ledger import T2HopRecorder, T2Hops

    db = Database(fresh_db, 2)
    db.open()
    try:
        store = Store()
        with db.unit_of_work() as conn:
            cid = store.next_channel_id(conn)
            store.insert_channel(conn, cid, {}, {}, {"C": {}, "S": {}})
            ids = store.insert_events(conn, cid, [NewEvent(1, 1, b"x", 0, None, None, [(0, 0)], 1_700_000_000.0)])
        with db.unit_of_work() as conn:
            store.delete_deliveries(conn, cid, 0, 0, ids, gtrid="gt-9")
        hops = T2HopRecorder()
        with db.unit_of_work() as conn:
            assert hops.write(conn, {"gt-9": T2Hops(decided_at=1_700_000_010.0)}) == 1
        with db.unit_of_work() as conn:
            assert hops.write(conn, {"gt-9": T2Hops(decided_at=1_700_000_099.0,
                                                    broker_committed_at=1_700_000_011.0)}) == 1
        with db.unit_of_work() as conn:                       # nothing left to fill: the row is not touched again
            assert hops.write(conn, {"gt-9": T2Hops(decided_at=1.0, broker_committed_at=2.0)}) == 0
        with psycopg.connect(fresh_db) as conn:
            row = conn.execute("SELECT decided_at, broker_committed_at FROM nsjms_ledger "
                               "WHERE gtrid = 'gt-9' AND outcome = 'delivered'").fetchone()
        assert row == (datetime.fromtimestamp(1_700_000_010.0, UTC), datetime.fromtimestamp(1_700_000_011.0, UTC))
    finally:
        db.close()


def test_the_inbound_rows_folded_into_the_events_statement_carry_the_node_s_times(fresh_db: str) -> None:
    """A JMS -> channel bridge's event: the one autocommit statement that stores it also writes its JMS message's
    ``accepted`` and ``delivered`` rows. Every time on them is the node's (the push's accepted_at, the store's
    clock for acknowledged_at), never the database's: with the node's clock an hour ahead of the database's,
    the message is still acknowledged after it was accepted (before: acknowledged_at was clock_timestamp())."""
    from router.channel.store import NewEvent, Store
    from router.routing.ledger import Route

    ahead = datetime.now(UTC).timestamp() + 3600.0       # the node's clock, an hour ahead of the database's
    db = Database(fresh_db, 2)
    db.open()
    try:
        store = Store(clock=lambda: ahead + 0.5)
        with db.unit_of_work() as conn:
            cid = store.next_channel_id(conn)
            store.insert_channel(conn, cid, {}, {}, {"C": {}, "S": {}})
        store.ledger.set_route(cid, "S", 3, 4, Route(Direction.JMS_TO_CHANNEL, 7, "queue/in"))
        with db.statement() as conn:                 # the accept path's one statement (router/channel/groupcommit)
            (eid,) = store.insert_events(conn, cid, [NewEvent(1, 1, b"x", 0, None, None, [(0, 0)], ahead, (3, 4),
                                                              "ID:m1")])
        with psycopg.connect(fresh_db) as conn:
            rows = conn.execute("SELECT outcome, accepted_at, acknowledged_at FROM nsjms_ledger "
                                "WHERE direction = 'jms_to_channel' AND event_id = %s ORDER BY entry_id",
                                (eid,)).fetchall()
        assert [r[0] for r in rows] == ["accepted", "delivered"]
        assert rows[0][1] == rows[1][1] == datetime.fromtimestamp(ahead, UTC)
        assert rows[1][2] is not None and rows[1][2] >= rows[1][1], "acknowledged before it was accepted"
        assert rows[1][2] == datetime.fromtimestamp(ahead + 0.5, UTC)
    finally:
        db.close()


def test_two_nodes_maintaining_the_ledger_at_once_both_succeed(fresh_db: str) -> None:
    """Cluster nodes started together maintained one ledger at once: the second's CREATE TABLE of the same day
    failed with "already exists" (seen in a three-node start) and its maintenance waited a whole period. The
    maintenance's advisory lock makes the second wait for the first and find its partitions."""
    import threading

    db = Database(fresh_db, 3)
    db.open()
    day = datetime.now(UTC).date() + timedelta(days=400)       # days no migration or node made
    try:
        results: list[object] = []
        with db.unit_of_work() as first:
            assert maintain(first, retention_days=10_000, ahead_days=1, today=day)[0] == [day, day + timedelta(1)]

            def second() -> None:
                try:
                    with db.unit_of_work() as conn:
                        results.append(maintain(conn, retention_days=10_000, ahead_days=1, today=day))
                except Exception as exc:  # noqa: BLE001 - the failure is the result
                    results.append(exc)

            t = threading.Thread(target=second)
            t.start()
            with psycopg.connect(fresh_db, autocommit=True) as watch:   # the second waits for the first
                deadline = datetime.now(UTC) + timedelta(seconds=30)
                while watch.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone() == (0,):
                    assert datetime.now(UTC) < deadline, "the second maintenance never waited for the first"
                    t.join(0.05)
                    assert t.is_alive(), f"the second maintenance did not wait: {results}"
        t.join(30)
        assert results == [([], [])], "the second found the first's partitions and created nothing"
    finally:
        db.close()
