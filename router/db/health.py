"""PostgreSQL's reachability, probed on one kept connection (issue 27: the node's idle CPU).

The node's PostgreSQL watch (``router.node.lifecycle.ServiceWatch``, every ``watch_interval_s``) used to open a new
connection for each probe: libpq's connection set-up and the SCRAM password exchange cost the node about 6 ms of CPU
and PostgreSQL a backend's fork and about 9 ms more, every 2 s (measured, docs/performance.md). A
:class:`PostgresProbe` keeps its connection and runs ``SELECT 1`` on it; only when that fails (the server ended the
session, restarted, the network is cut) does it open a new one, exactly as the old probe did for every check.

The answers are the old probe's, within the same bound:

* reachable: ``SELECT 1`` answered, on the kept connection or on a new one;
* unreachable: a new connection could not be made (or could not answer) within ``timeout`` s of the check's start.
  A silent network cut fails the kept connection's ``SELECT 1`` after the connection's ``tcp_user_timeout``
  (``router.db.conninfo``: every connection the node makes carries it), and the new connection then gets what is
  left of ``timeout`` (at least 1 s, libpq's smallest ``connect_timeout``): a cut is reported within ``timeout``
  (+1 s at most) of the probe's start, as before, where the old probe waited ``timeout`` for its connection. A frozen
  server (it acknowledges at the TCP level but answers nothing) is bounded by the probe itself: the ``SELECT 1`` gives
  up after ``timeout`` s (its socket shut down, :func:`_select_one`), then the new connection's ``connect_timeout``.

The kept connection is an ordinary session of the node (``application_name`` as every other, ``router.db.conninfo``):
a survivor that fences the node ends it with the rest; the next probe simply opens another. Not thread-safe by
itself: one watch thread uses it (a lock makes a concurrent call wait).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from router.db.conninfo import connect as connect_bounded

__all__ = ["PostgresProbe"]

Connector = Callable[..., "psycopg.Connection[Any]"]


class PostgresProbe:
    """``check()``: None when PostgreSQL at ``dsn`` answered, else the ``psycopg.Error`` that says why not."""

    def __init__(self, dsn: str, timeout: float, *, connect: Connector = connect_bounded,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.dsn = dsn
        self.timeout = timeout
        self._connect = connect
        self._clock = clock
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def check(self) -> psycopg.Error | None:
        with self._lock:
            start = self._clock()
            conn = self._conn
            if conn is not None:
                try:
                    _select_one(conn, self.timeout)
                    return None
                except psycopg.Error:
                    self._drop()             # ended, restarted or cut: a new connection decides, as before
            left = self.timeout - (self._clock() - start)
            try:
                conn = self._connect(self.dsn, connect_timeout=max(1, int(left)), autocommit=True)
            except psycopg.Error as exc:
                return exc
            try:
                _select_one(conn, max(1.0, self.timeout - (self._clock() - start)))
            except psycopg.Error as exc:
                _close(conn)
                return exc
            self._conn = conn
            return None

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            _close(conn)


def _select_one(conn: psycopg.Connection[Any], limit: float) -> None:
    """``SELECT 1`` that gives up after ``limit`` s. A frozen server (SIGSTOP, a backend stuck on I/O, a VM paused)
    still acknowledges at the TCP level, so neither ``tcp_user_timeout`` nor keepalives end the wait; at the deadline
    the connection's socket is shut down (the wait ends as a lost connection) and the probe says why."""
    fired = threading.Event()

    def cut() -> None:
        fired.set()
        _shut(conn)

    timer = threading.Timer(max(0.001, limit), cut)
    timer.daemon = True
    timer.start()
    try:
        conn.execute("SELECT 1")
    except psycopg.Error as exc:
        if fired.is_set():
            raise psycopg.OperationalError(f"PostgreSQL did not answer SELECT 1 within {limit:g} s "
                                           "(a frozen server?)") from exc
        raise
    finally:
        timer.cancel()


def _shut(conn: psycopg.Connection[Any]) -> None:
    """Shut the connection's socket down (both ways) from another thread: a blocked read returns at once."""
    try:
        fd = conn.pgconn.socket
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, psycopg.Error, AttributeError):
        pass                                 # already closed (or a stand-in without a socket)


def _close(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.close()
    except psycopg.Error:
        pass
