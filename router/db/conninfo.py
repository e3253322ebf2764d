"""The connection parameters that bound every wait on an established PostgreSQL connection.

``connect_timeout`` bounds making a connection; nothing in libpq bounds a wait on a connection already made. When
the network between the node and PostgreSQL silently drops packets (a cut cable, a firewall that drops instead of
rejecting, a host that froze: no RST, no FIN), a statement sent on such a connection waits for the kernel's TCP
retransmissions, about 15 minutes (``tcp_retries2``), and a connection waiting for a reply the server will never
send waits for ever. Worse, when the network returns inside those 15 minutes, the kernel's retransmission delivers
the statement and the server runs it: a push whose supplier was long told it failed (its call timed out) is
stored after all, and the supplier's retry stores it a second time.

So every connection the node makes carries (libpq parameters, https://www.postgresql.org/docs/15/libpq-connect.html):

``tcp_user_timeout`` (:data:`TCP_USER_TIMEOUT_MS`)
    the kernel closes the connection when data it sent stays unacknowledged that long (Linux ``TCP_USER_TIMEOUT``).
    A statement sent into a cut network fails after it and its bytes are discarded with the socket: the server
    can never receive it later. It also bounds the keepalive probes below.
``keepalives`` / ``keepalives_idle`` / ``keepalives_interval`` / ``keepalives_count``
    a connection waiting for a reply (nothing unacknowledged: the statement arrived, the answer does not) sends a
    probe after :data:`KEEPALIVE_IDLE_S` s of silence; unanswered probes close it within ``tcp_user_timeout``.

A query that legitimately runs long is not affected: the server's kernel acknowledges the probes. The parameters
only apply to TCP connections (a Unix-socket DSN ignores them, as libpq does).

The server side gets ``idle_in_transaction_session_timeout`` (:data:`IDLE_IN_TRANSACTION_MS`) as a session option:
a transaction whose client vanished mid-way (its connection closed by the timeout above while the server never
learned of it) releases its locks after that long instead of the server's own TCP keepalive (2 hours by default).
Prepared transactions (two-phase branches) are not sessions and are not affected.

No ``statement_timeout`` is set for every session: a statement that runs long on a reachable server is not a
network fault, and some legitimately do (migrations, partition maintenance, an operator's audit); the waits that
must be short have their own deadline (a T2's statements ``TransactionTimeout``, partition DDL a ``lock_timeout``,
a pool checkout ``checkout_timeout``, a queued push the group commit's ``max_wait``).

Worst case of one statement on a cut network: :data:`STATEMENT_BOUND_S` (the user timeout, plus the keepalive's
idle time when the cut happened after the statement was acknowledged).

``application_name``: a node names every session it makes ``nsjms/<node id>/<incarnation>``
(:func:`name_sessions`, called before its first connection with :func:`router.cluster.sessions.session_name`; the
incarnation token is the one its cluster membership row records), so a survivor that fenced it can end exactly
that process's sessions (:mod:`router.cluster.sessions`): a paused node's open transaction holds its row locks until
its session ends.
A DSN that sets ``application_name`` itself keeps it (those sessions are then not ended at a takeover).
"""

from __future__ import annotations

from typing import Any

import psycopg

__all__ = ["IDLE_IN_TRANSACTION_MS", "KEEPALIVE_IDLE_S", "STATEMENT_BOUND_S", "TCP_USER_TIMEOUT_MS", "bounded",
           "connect", "name_sessions"]

_SESSIONS: dict[str, str] = {}      # "name" of this process's sessions, once name_sessions ran


def name_sessions(name: str) -> None:
    """From now on every connection this process makes has ``application_name`` ``name`` (unless its DSN sets one)."""
    _SESSIONS["name"] = name

#: Unacknowledged data (a statement, a keepalive probe) closes the connection after this long.
TCP_USER_TIMEOUT_MS = 3000
#: A silent connection is probed after this long.
KEEPALIVE_IDLE_S = 1
KEEPALIVE_INTERVAL_S = 1
KEEPALIVE_COUNT = 3
#: The server ends a session left idle inside a transaction this long (its client vanished).
IDLE_IN_TRANSACTION_MS = 60_000
#: How long one statement can wait on a connection whose network was cut, at most (seconds).
STATEMENT_BOUND_S = KEEPALIVE_IDLE_S + TCP_USER_TIMEOUT_MS / 1000


def bounded(dsn: str = "", **kwargs: Any) -> dict[str, Any]:
    """``kwargs`` for ``psycopg.connect(dsn, ...)`` (or a pool's ``kwargs``) plus the parameters above; a key the
    caller passes wins. ``options`` (server settings) is merged: the DSN's and the caller's come after ours, so
    an operator's own ``idle_in_transaction_session_timeout`` wins too (a keyword would replace the DSN's)."""
    from psycopg.conninfo import conninfo_to_dict

    out: dict[str, Any] = {"keepalives": 1, "keepalives_idle": KEEPALIVE_IDLE_S,
                           "keepalives_interval": KEEPALIVE_INTERVAL_S, "keepalives_count": KEEPALIVE_COUNT,
                           "tcp_user_timeout": TCP_USER_TIMEOUT_MS}
    options = f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}"
    in_dsn_params = conninfo_to_dict(dsn) if dsn else {}
    in_dsn = str(in_dsn_params.get("options") or "")
    given = str(kwargs.pop("options", "") or "")
    if "name" in _SESSIONS and "application_name" not in in_dsn_params:
        out["application_name"] = _SESSIONS["name"]
    out.update(kwargs)
    out["options"] = " ".join(part for part in (options, in_dsn, given) if part)
    return out


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """``psycopg.connect(dsn, **bounded(**kwargs))``: a connection none of whose waits outlives a network cut by
    more than :data:`STATEMENT_BOUND_S` s."""
    return psycopg.connect(dsn, **bounded(dsn, **kwargs))
