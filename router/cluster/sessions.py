"""A survivor ends the PostgreSQL sessions of the node incarnation it fenced (docs/cluster.md, "Guarantees").

A node paused (SIGSTOP, a VM freeze) inside a transaction keeps that transaction's row locks until PostgreSQL ends
its session: ``idle_in_transaction_session_timeout`` (60 s) for a session idle in a transaction, and never for one
whose statement is still "active" (e.g. its server waits to write results to the frozen client): in
``test_cluster_faults.py`` a paused owner's open routing-transaction branch held the survivor's channel -> JMS flow
60 s once and until the node was woken (over 180 s) once. :mod:`router.cluster.blockers` ends only what blocks the
fence itself.

Every session a node makes is named ``nsjms/<node id>/<incarnation>`` (:func:`router.db.conninfo.name_sessions`;
the incarnation is the token its ``nsjms_member`` row records). Once the fence committed (the row says
``fenced``; the fenced incarnation can commit nothing that depends on what it owned), :func:`end_fenced_sessions`
ends (``pg_terminate_backend``) every session of exactly that incarnation: their transactions roll back, which is
what the fence makes of them anyway; prepared branches are not sessions and are finished by the survivor's recovery.
A later incarnation of the same node id has another token and is never touched. Ending a backend of the same
database role needs no privilege beyond the node's own (PostgreSQL allows a role to signal its own backends).
"""

from __future__ import annotations

import secrets
from typing import Any

__all__ = ["end_fenced_sessions", "new_incarnation", "session_name"]


def new_incarnation() -> str:
    """A random incarnation token for a node process (16 hex digits)."""
    return secrets.token_hex(8)


def session_name(node_id: str, token: str) -> str:
    """The ``application_name`` of the sessions of node ``node_id``'s incarnation ``token`` (at most 55 bytes:
    PostgreSQL keeps 63)."""
    return f"nsjms/{node_id}/{token}"


def end_fenced_sessions(conn: Any, dead: str) -> list[int]:
    """End the sessions of ``dead``'s fenced incarnation; the pids ended (none when ``dead`` is not fenced or its
    row names no incarnation)."""
    row = conn.execute("SELECT incarnation FROM nsjms_member WHERE node_id = %s AND state = 'fenced'",
                       (dead,)).fetchone()
    if row is None or not row[0]:
        return []
    rows = conn.execute("SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = %s AND datname = current_database() AND pid <> pg_backend_pid()",
                        (session_name(dead, str(row[0])),)).fetchall()
    return [int(pid) for pid, done in rows if done]
