"""The outbox purge is scoped to its node (issue 24): ``NodeTransactions._purge`` deleted every outbox row whose
gtrid was not in *this* node's recovery log, which on a shared PostgreSQL is every other node's in-flight and in-doubt
rows, i.e. the messages their recovery must re-send. Real PostgreSQL, the node's real recovery log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from router.db import Database
from router.routing.t2.transactions import NodeTransactions, OutboxRow, outbox_insert
from xa.xid import NodeId, new_gtrid

pytestmark = pytest.mark.integration


@pytest.fixture
def db(fresh_db: str) -> Iterator[Database]:
    database = Database(fresh_db, 2)
    database.open()
    yield database
    database.close()


def _row(gtrid: str) -> OutboxRow:
    return OutboxRow(gtrid, 0, f"{gtrid}/0", 1, "/queue/billing", {"persistent": "true"}, b"event")


def _gtrids(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {str(r[0]) for r in conn.execute("SELECT gtrid FROM nsjms_outbox").fetchall()}


@pytest.mark.parametrize("node_id", ["n1", "n_1"])   # '_' is LIKE's wildcard: "n_1:" must not match "nX1:..."
def test_the_purge_deletes_only_this_nodes_ended_rows(tmp_path: Path, db: Database, fresh_db: str,
                                                       node_id: str) -> None:
    mine_ended = new_gtrid(NodeId(node_id))
    others = [new_gtrid(NodeId("n2")), new_gtrid(NodeId("nX1")), new_gtrid(NodeId(f"{node_id}0"))]
    with db.unit_of_work() as conn:
        outbox_insert(conn, [_row(g) for g in [mine_ended, *others]])
    node = NodeTransactions(node_id, tmp_path, db, fresh_db)
    try:
        node._purge()
    finally:
        node.close()
    assert _gtrids(fresh_db) == set(others)       # the other nodes' rows are theirs; this node's ended row is gone
