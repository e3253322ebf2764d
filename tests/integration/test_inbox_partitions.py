"""nsjms_inbox partitioned by the messages' sent day (migration 0005, router/db/inbox.py; issue 31), on a real
PostgreSQL: existing rows kept and still recognised, a redelivery recognised whatever day it arrives, purging by
dropping partitions without losing a row still inside the retention, and a racing redelivery still waits for
its first delivery's transaction."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
import pytest

from router.db.inbox import DEFAULT_PARTITION, NO_TIMESTAMP_DAY, list_partitions, maintain, purge_default, sent_day
from router.db.migrate import load, run
from router.routing.t2.transactions import inbox_claim

pytestmark = pytest.mark.integration

WEEK_S = 7 * 86400.0
# 23:59:59.900 UTC on 2026-12-06: its redelivery may well arrive the next day
LATE_MS = int(datetime(2026, 12, 6, 23, 59, 59, 900000, tzinfo=UTC).timestamp() * 1000)


@pytest.fixture
def conn(fresh_db: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(fresh_db, autocommit=True) as c:
        with c.transaction():
            run(c)
        yield c


def where(conn: psycopg.Connection[Any], message_id: str) -> list[tuple[str, date]]:
    return [(str(t), d) for t, d in conn.execute(
        "SELECT tableoid::regclass::text, sent_day FROM nsjms_inbox WHERE message_id = %s", (message_id,))]


def test_migration_0005_keeps_the_rows_and_a_message_received_before_it_is_still_recognised(fresh_db: str) -> None:
    before = [m for m in load() if m.version < 5]
    with psycopg.connect(fresh_db, autocommit=True) as c:
        with c.transaction():
            run(c, before)
        c.execute("INSERT INTO nsjms_inbox(bridge_id, message_id, gtrid) VALUES (1, 'ID:old-1', 'g0'), "
                  "(1, 'ID:old-2', 'g0')")
        with c.transaction():
            assert run(c)[0] == 5                       # 0005, then any later migration
        assert where(c, "ID:old-1") == [(DEFAULT_PARTITION, NO_TIMESTAMP_DAY)]
        with c.transaction():
            # redelivered after the upgrade, now with its JMSTimestamp: the legacy row recognises it
            assert inbox_claim(c, 1, ["ID:old-1", "ID:new-1"], "g1", {"ID:old-1": LATE_MS, "ID:new-1": LATE_MS}) \
                == {"ID:new-1"}
        assert c.execute("SELECT count(*) FROM nsjms_inbox").fetchone() == (3,)


def test_a_redelivery_is_recognised_across_midnight_and_rows_go_to_their_day(conn: psycopg.Connection[Any]) -> None:
    day = sent_day(LATE_MS)
    created, _ = maintain(conn, WEEK_S, now=datetime(2026, 12, 6, 12, tzinfo=UTC))
    assert day in created and day + timedelta(days=1) in created
    with conn.transaction():
        assert inbox_claim(conn, 7, ["ID:a"], "g1", {"ID:a": LATE_MS}) == {"ID:a"}
    assert where(conn, "ID:a") == [(f"nsjms_inbox_p{day:%Y%m%d}", day)]
    # the redelivery is received the next day (received_at does not matter): same timestamp, same key
    with conn.transaction():
        assert inbox_claim(conn, 7, ["ID:a"], "g2", {"ID:a": str(LATE_MS)}) == set()
        assert inbox_claim(conn, 8, ["ID:a"], "g2", {"ID:a": LATE_MS}) == {"ID:a"}, "unique per bridge"
    # no timestamp: the default partition, recognised there too
    with conn.transaction():
        assert inbox_claim(conn, 7, ["ID:b"], "g3") == {"ID:b"}
        assert inbox_claim(conn, 7, ["ID:b"], "g4", {"ID:b": 0}) == set()
    assert where(conn, "ID:b") == [(DEFAULT_PARTITION, NO_TIMESTAMP_DAY)]


def test_a_redelivery_racing_its_first_delivery_waits_for_its_outcome(conn: psycopg.Connection[Any],
                                                                       fresh_db: str) -> None:
    maintain(conn, WEEK_S, now=datetime(2026, 12, 6, 12, tzinfo=UTC))
    got: list[set[str]] = []
    with psycopg.connect(fresh_db) as first:
        assert inbox_claim(first, 7, ["ID:r"], "g1", {"ID:r": LATE_MS}) == {"ID:r"}     # not committed yet

        def second() -> None:
            with psycopg.connect(fresh_db) as other:
                got.append(inbox_claim(other, 7, ["ID:r"], "g2", {"ID:r": LATE_MS}))

        racer = threading.Thread(target=second)
        racer.start()
        racer.join(1.0)
        assert racer.is_alive(), "the second claim must wait for the first transaction"
        first.commit()
        racer.join(30)
    assert got == [set()], "the redelivery was recognised once the first delivery committed"


def test_purging_drops_old_partitions_and_keeps_rows_still_inside_the_retention(
        conn: psycopg.Connection[Any]) -> None:
    early = int(datetime(2026, 11, 20, 10, tzinfo=UTC).timestamp() * 1000)
    maintain(conn, WEEK_S, now=datetime(2026, 11, 20, 9, tzinfo=UTC))
    with conn.transaction():
        assert inbox_claim(conn, 1, ["ID:old", "ID:late"], "g", {"ID:old": early, "ID:late": early}) \
            == {"ID:old", "ID:late"}
        # ID:old was received long ago; ID:late (sent the same day) waited in the broker and was received just now
        conn.execute("UPDATE nsjms_inbox SET received_at = now() - interval '10 days' WHERE message_id = 'ID:old'")
    now = datetime.now(UTC)
    _, dropped = maintain(conn, WEEK_S, now=now)
    assert date(2026, 11, 20) in dropped and date(2026, 11, 20) not in list_partitions(conn)
    assert where(conn, "ID:old") == [], "a row past the retention went with its partition"
    assert where(conn, "ID:late") == [(DEFAULT_PARTITION, date(2026, 11, 20))], "kept: received within the retention"
    with conn.transaction():
        assert inbox_claim(conn, 1, ["ID:late"], "g2", {"ID:late": early}) == set(), "still recognised"
    conn.execute("UPDATE nsjms_inbox SET received_at = now() - interval '8 days' WHERE message_id = 'ID:late'")
    assert purge_default(conn, WEEK_S) == 1
    assert conn.execute("SELECT count(*) FROM nsjms_inbox").fetchone() == (0,)
    assert {now.date() + timedelta(days=n) for n in range(3)} <= set(list_partitions(conn))
