"""``nsjms reset`` (issue 29): docs/operations.md's manual reset missed tables and left a node that could not start.
The command removes every ``nsjms_*`` object, this node's prepared transactions and the state directory's files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from router.db import migrate
from router.node.lifecycle import StateLock
from xa.xid import NodeId, branch_xid, new_gtrid

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NODE = "reset-node"


def _nsjms(state: Path, dsn: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSJMS_")}
    return subprocess.run([sys.executable, "-m", "router.cli", "reset", "--state-dir", str(state), *argv],
                          capture_output=True, text=True, check=False, timeout=300, cwd=REPO,
                          stdin=subprocess.DEVNULL,
                          env=dict(env, NSJMS_POSTGRES_DSN=dsn, NSJMS_NODE_NODE_ID=NODE))


def _objects(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [str(r[0]) for r in conn.execute("SELECT relname FROM pg_class WHERE relname LIKE 'nsjms%' "
                                                "ORDER BY relname")]


def _prepared(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [str(r[0]) for r in conn.execute("SELECT gid FROM pg_prepared_xacts "
                                                "WHERE database = current_database()")]


def test_reset_leaves_a_database_and_state_directory_a_node_starts_from(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db) as conn:
        migrate.run(conn)
        conn.execute("INSERT INTO nsjms_channel (id, qos, admin_props) "
                     "VALUES (nextval('nsjms_channel_id'), '{}', '{}')")
    branch = psycopg.connect(fresh_db)  # an in-doubt branch of this node, holding a lock on nsjms_channel
    try:
        branch.tpc_begin(branch_xid(new_gtrid(NodeId(NODE)), "pg"))
        branch.execute("DELETE FROM nsjms_channel")
        branch.tpc_prepare()
    finally:
        branch.close()
    state = tmp_path / "state"
    (state / "delivered").mkdir(parents=True)
    (state / "delivered" / "7.journal").write_text("x")
    (state / f"xa-{NODE}.log").write_text("{}\n")
    (state / "endpoints.json").write_text("{}")
    before = _objects(fresh_db)
    assert "nsjms_schema_version" in before and "nsjms_inbox" in before and "nsjms_ledger" in before

    asked = _nsjms(state, fresh_db)                                # no --yes: nothing done
    assert asked.returncode == 2 and "nothing done" in asked.stderr and "xa-reset-node.log" in asked.stderr, \
        asked.stderr
    assert _objects(fresh_db) == before and (state / f"xa-{NODE}.log").exists()

    lock = StateLock(state)                                        # a node runs: refused, nothing touched
    lock.acquire()
    try:
        refused = _nsjms(state, fresh_db, "--yes")
    finally:
        lock.release()
    assert refused.returncode == 5 and "nothing was reset" in refused.stderr, refused.stderr
    assert _objects(fresh_db) == before and len(_prepared(fresh_db)) == 1

    with psycopg.connect(fresh_db) as conn:                        # another node's work is in the same tables
        conn.execute("INSERT INTO nsjms_member (node_id, epoch, state, lease_until, renewed_at, joined_at) "
                     "VALUES ('other-node', 1, 'live', now() + interval '1 minute', now(), now())")
    shared = _nsjms(state, fresh_db, "--yes")                      # review finding: refused, nothing touched
    assert shared.returncode == 4 and "other-node" in shared.stderr, shared.stderr
    assert _objects(fresh_db) == before and len(_prepared(fresh_db)) == 1
    with psycopg.connect(fresh_db) as conn:                        # it stopped cleanly: it left the membership
        conn.execute("UPDATE nsjms_member SET state = 'left' WHERE node_id = 'other-node'")

    done = _nsjms(state, fresh_db, "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rolled back 1 prepared transaction(s)" in done.stdout, done.stdout
    assert _objects(fresh_db) == [] and _prepared(fresh_db) == []
    assert sorted(p.name for p in state.iterdir()) == ["node.lock"]
    with psycopg.connect(fresh_db) as conn:                        # what the next start does: every migration
        assert migrate.run(conn) == [m.version for m in migrate.load()]
