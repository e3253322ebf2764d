"""``nsjms txn list/show``'s event count of a prepared channel -> JMS branch on real PostgreSQL (review finding 14).

The branch DELETED queue rows (router/routing/t2/ops.py ``TxnOps._held`` counts them by their ``xmax``). Rows that the
branch and another transaction both share-locked first (``FOR KEY SHARE``) get a MultiXact as ``xmax`` when the
branch deletes them, not the branch's xid: they were not counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from router.db import Database
from router.routing.t2.ops import TxnOps, connect_rows
from router.routing.t2.view import join
from xa.pg import PgManager
from xa.xid import NodeId, branch_xid, new_gtrid

pytestmark = pytest.mark.integration

NODE = "n1"
CHANNEL = 7


@pytest.fixture
def db(fresh_db: str) -> Iterator[str]:
    database = Database(fresh_db, 2)
    database.open()                          # the node's schema
    database.close()
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("INSERT INTO nsjms_channel(id, qos, admin_props) VALUES (%s, '{}', '{}')", (CHANNEL,))
        for seq in range(1, 6):
            (eid,) = conn.execute("INSERT INTO nsjms_event(channel_id, seq, form, body, priority) "
                                  "VALUES (%s, %s, 0, 'x', 0) RETURNING id", (CHANNEL, seq)).fetchone() or (0,)
            conn.execute("INSERT INTO nsjms_queue(channel_id, admin_id, proxy_id, event_id) VALUES (%s, 0, 1, %s)",
                         (CHANNEL, eid))
    yield fresh_db


def test_queue_rows_a_prepared_branch_deleted_under_a_multixact_are_counted(db: str, tmp_path: Path) -> None:
    gtrid = new_gtrid(NodeId(NODE))
    xid = branch_xid(gtrid, "pg")
    other, branch = psycopg.connect(db), psycopg.connect(db)
    try:
        locked = "SELECT 1 FROM nsjms_queue WHERE channel_id = %s AND event_id IN (SELECT min(event_id) + k " \
                 "FROM nsjms_queue, generate_series(0, 2) k WHERE channel_id = %s GROUP BY k) FOR KEY SHARE"
        other.execute(locked, (CHANNEL, CHANNEL))      # another transaction share-locks 3 of the 5 rows
        branch.tpc_begin(xid)
        branch.execute(locked, (CHANNEL, CHANNEL))     # so does the branch: xmax becomes a MultiXact
        other.commit()
        assert branch.execute("DELETE FROM nsjms_queue WHERE channel_id = %s", (CHANNEL,)).rowcount == 5
        branch.tpc_prepare()
        with psycopg.connect(db, autocommit=True) as conn:
            plain = conn.execute("SELECT count(*) FROM nsjms_queue q JOIN pg_prepared_xacts p "
                                 "ON q.xmax = p.transaction").fetchone()
        assert plain == (2,), "3 of the rows carry a MultiXact, not the branch's xid (the situation under test)"

        pg = PgManager(lambda: psycopg.connect(db, autocommit=True))
        try:
            snap = TxnOps(NODE, tmp_path, None, pg, connect_rows(db), None, mode="offline", guard_s=0.0).snapshot()
        finally:
            pg.close()
        assert [(h.gtrid, h.channel_id, h.events) for h in snap.held] == [(gtrid, CHANNEL, 5)]
        [view] = join(snap).transactions
        assert (view.gtrid, view.events, view.events_known) == (gtrid, 5, True)
    finally:
        other.close()
        branch.close()
        with psycopg.connect(db, autocommit=True) as conn:
            for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
                                       ).fetchall():
                conn.execute(f"ROLLBACK PREPARED '{gid}'")
