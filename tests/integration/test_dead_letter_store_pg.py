"""``DeadLetterStore`` on a real PostgreSQL (its migration ``*_dead_letter.sql``): a dead letter is copied from the
queue row it replaces, only while that row exists, and once (a unit of work retried after a lost COMMIT reply writes
nothing twice)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from router.channel.deadletters import DeadLetterStore, NewDeadLetter
from router.db import migrate

pytestmark = pytest.mark.integration


@pytest.fixture
def conn(fresh_db: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(fresh_db, autocommit=True) as c:
        with c.transaction():
            migrate.run(c)
        c.execute("INSERT INTO nsjms_channel(id, qos, admin_props) VALUES (7, '{}', '{}')")
        c.execute("INSERT INTO nsjms_event(id, channel_id, seq, form, body, priority, deadline, start_at) "
                  "VALUES (41, 7, 5, 1, '\\x0102', 3, NULL, NULL)")
        c.execute("INSERT INTO nsjms_queue(channel_id, admin_id, proxy_id, event_id) VALUES (7, 0, 2, 41)")
        yield c


def test_a_queued_event_is_copied_once_and_only_while_its_queue_row_exists(conn: psycopg.Connection[Any]) -> None:
    store = DeadLetterStore(clock=lambda: 1_700_000_000.0)
    args: dict[str, Any] = dict(dedupe_id="e41/c7/a0/p2", name="d/t/n", reason="readable",
                                exception="BAD_PARAM(0)", attempts=3)
    with conn.transaction():
        dl_id = store.add_queued(conn, 7, 0, 2, 41, **args)
        conn.execute("DELETE FROM nsjms_queue WHERE event_id = 41")
    assert dl_id is not None
    assert store.add_queued(conn, 7, 0, 2, 41, **args) is None          # the queue row is gone: nothing written
    conn.execute("INSERT INTO nsjms_queue(channel_id, admin_id, proxy_id, event_id) VALUES (7, 0, 2, 41)")
    assert store.add_queued(conn, 7, 0, 2, 41, **args) is None          # same obligation: never twice
    dl = store.get(conn, dl_id)
    assert dl is not None
    assert (dl.body, dl.priority, dl.seq, dl.event_id, dl.side, dl.persistent) == (b"\x01\x02", 3, 5, 41, "C", True)
    assert (dl.reason, dl.exception, dl.attempts, dl.dead_at) == ("readable", "BAD_PARAM(0)", 3, 1_700_000_000.0)
    rows, total = store.listing(conn, channel=7)
    assert [r.id for r in rows] == [dl_id] and total == 1
    assert store.listing(conn, channel=8) == ([], 0)


def test_an_event_without_a_stored_copy_is_written_once(conn: psycopg.Connection[Any]) -> None:
    store = DeadLetterStore()
    row = NewDeadLetter("brun/s9/c7/a0/p2", 7, "C", 0, 2, 9, 0, None, 0, None, None, False, "an untyped event",
                        "reason (its content could not be encoded either: X)", "MARSHAL(0)", 3, 1_700_000_000.0)
    first = store.add(conn, row)
    assert first is not None and store.add(conn, row) is None
    assert store.count(conn) == 1
    with conn.transaction():
        assert store.get(conn, first, lock=True) is not None
        assert store.delete(conn, first) and not store.delete(conn, first)
    assert store.count(conn) == 0
    assert not store.proxy_stored(conn, 7, 0, 2)                        # no such proxy row
