"""``nsjms reset``: remove every trace of one node's state, so that the next ``nsjms serve`` starts empty.

Under the state directory's lock (refused, exit 5, while a node runs there; a node cannot start meanwhile):

1. the embedded ActiveMQ and PostgreSQL a killed node left running are stopped (``nsjms stop-services``);
2. with an external PostgreSQL (``postgres.dsn``): refused (:class:`ResetRefused`, nothing touched) while another
   node id is a live member of that database (``nsjms_member``: the tables hold its work too); else this node's
   prepared transactions (xids of its node id) are rolled back, then every ``nsjms_*`` table, partition and
   sequence of the role's first ``search_path`` schema is
   dropped, ``nsjms_schema_version`` included (the next start applies every migration to an empty schema);
3. everything in the state directory but the lock file is removed: the recovery log ``xa-<node>.log``, the
   ``delivered/`` journals, the embedded services' data (``pg/``, ``activemq/`` with the broker credentials),
   ``endpoints.json``, ``status.json``.

Messages already in an external broker stay there (purge the bridges' queues in its console; durable subscriptions
are named ``nsjms-bridge-<id>``). Without ``--yes`` nothing is done: the plan is printed and the exit code is 2.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ResetDone", "ResetRefused", "plan", "reset"]

LOCK_FILE = "node.lock"


@dataclass
class ResetDone:
    """What :func:`reset` did."""

    stopped: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def plan(state_dir: Path, external_dsn: str) -> list[str]:
    """What :func:`reset` would do, as lines (pure but for listing the directory)."""
    lines = ["stop the embedded ActiveMQ and PostgreSQL a stopped node left running under " + str(state_dir)]
    if external_dsn:
        from router.node.config import redact_dsn

        lines.append(f"in {redact_dsn(external_dsn)}: roll back this node's prepared transactions, drop every "
                     "nsjms_* table and sequence (channels, bridges, persistent events, outbox, inbox, ledger, "
                     "schema version)")
    else:
        lines.append("the embedded PostgreSQL's data (pg/) goes with the state directory")
    names = sorted(p.name for p in state_dir.iterdir() if p.name != LOCK_FILE) if state_dir.is_dir() else []
    lines.append(f"remove from {state_dir}: {', '.join(names) or 'nothing'}")
    return lines


def reset(state_dir: Path, external_dsn: str, node_id: str, *, connect_timeout_s: float = 10.0) -> ResetDone:
    """Does it (see the module docstring). Raises ``StateDirLocked`` while a node runs there (nothing touched),
    ``psycopg.Error`` when the external database refuses (the state directory is then left as it was)."""
    from router.node.lifecycle import StateLock
    from router.node.server import stop_services

    done = ResetDone()
    if not state_dir.is_dir():
        return done
    done.stopped = stop_services(state_dir)  # takes and releases the lock: refused while a node runs
    lock = StateLock(state_dir)
    lock.acquire()
    try:
        if external_dsn:
            _reset_database(external_dsn, node_id, connect_timeout_s, done)
        for path in sorted(state_dir.iterdir()):
            if path.name == LOCK_FILE:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            done.removed.append(path.name)
    finally:
        lock.release()
    return done


class ResetRefused(Exception):
    """The reset was refused before anything was touched (the message says why)."""


def _other_live_members(conn: Any, node_id: str) -> list[str]:
    """Node ids other than ``node_id`` that are members of this database and have not left (router/cluster):
    their work is in the same tables. None when the cluster tables do not exist (an older schema)."""
    exists = conn.execute("SELECT to_regclass('nsjms_member') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return []
    rows = conn.execute("SELECT node_id FROM nsjms_member WHERE node_id <> %s AND state = 'live' ORDER BY node_id",
                        (node_id,)).fetchall()
    return [str(r[0]) for r in rows]


_OBJECTS = """
SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = current_schema() AND c.relname LIKE 'nsjms\\_%' AND c.relkind IN ('r', 'p', 'S')
   AND NOT c.relispartition
 ORDER BY c.relname
"""


def _reset_database(dsn: str, node_id: str, timeout: float, done: ResetDone) -> None:
    from psycopg import sql

    from router.db.conninfo import connect as bounded_connect
    from xa.xid import NodeId, is_ours

    node = NodeId(node_id)
    with bounded_connect(dsn, connect_timeout=max(1, int(timeout)), autocommit=True) as conn:
        others = _other_live_members(conn, node_id)
        if others:      # checked before anything is touched: the tables are shared with those nodes
            raise ResetRefused(f"other node(s) of this database are members: {', '.join(others)}; reset would drop "
                               "their channels, queued events, outbox and inbox too: stop them first (a node that "
                               "stops cleanly leaves the membership)")
        for xid in conn.tpc_recover():
            if is_ours(xid, node):
                conn.tpc_rollback(xid)
                done.rolled_back.append(str(xid.gtrid))
        conn.execute("SET lock_timeout = '30s'")  # a foreign session holding a table: fail, never hang
        with conn.transaction():
            objects: list[tuple[Any, ...]] = list(conn.execute(_OBJECTS))
            for name, kind in objects:
                what = sql.SQL("SEQUENCE") if kind == "S" else sql.SQL("TABLE")
                conn.execute(sql.SQL("DROP {} IF EXISTS {} CASCADE").format(what, sql.Identifier(str(name))))
                done.dropped.append(str(name))
