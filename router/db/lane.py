"""A dedicated autocommit connection for one hot caller's single statements (issue 27: the group committer's lone
groups, one per supplier push), beside the node's pool (:mod:`router.db.database`).

:meth:`Database.statement` checks a pooled connection out, switches it to autocommit and back, stamps it and puts it
back, for every statement: about a fifth of the node's CPU per accepted push. A lane keeps ONE connection open in
autocommit, so a statement on it is only the statement (prepared on its first run: the connection is the lane's for
its whole life). One caller at a time: :meth:`StatementLane.take` returns None when the lane is busy, and the caller
uses the pool (:meth:`Database.statement`) as before. So a lane adds one connection to the node's PostgreSQL
sessions, never a wait.

The statement's guarantees and errors are exactly :meth:`Database.statement`'s: it is its own transaction (atomic,
durable when it returns); a connection the server closed while the lane was idle whose goodbye is already on the
socket (a poll, no round trip) is closed and replaced before the statement is sent (safe: nothing was sent); if the
replacement cannot be made, :class:`StoreUnavailable` (not in doubt). During the statement, a broken connection is
:class:`StoreUnavailable` ``in_doubt`` (its implicit commit may have happened; the lane's connection is dropped and
made again at the next statement, and the pool checks its own idle connections: the server may have restarted), a
statement the database cancelled on a working connection :class:`StoreTimeout`, any other psycopg error
:class:`StoreError` (nothing committed). Tested in ``tests/integration/test_db_lane.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, cast

import psycopg
from psycopg.pq import ConnStatus, DiagnosticField, ExecStatus

from router.db.errors import StoreError, StoreTimeout, StoreUnavailable

__all__ = ["StatementLane", "exec_prepared"]

_PREPARED = "_nsjms_prepared"            # names of the statements prepared on a lane's connection
_CANCELLED = (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable)
_NO_SUCH_STATEMENT = b"26000"            # invalid_sql_statement_name: a prepared statement the server does not have


class StatementLane:
    """One dedicated autocommit connection (see the module docstring). ``connect(timeout)`` makes a new connection
    (the node's bounded parameters); ``readable(conn)`` tells whether an idle connection has something to read;
    ``broken()`` is called when a connection broke in use (the pool then checks its idle ones)."""

    def __init__(self, connect: Callable[[float], psycopg.Connection[Any]],
                 readable: Callable[[psycopg.Connection[Any]], bool], broken: Callable[[], None]) -> None:
        self._connect = connect
        self._readable = readable
        self._broken = broken
        self._busy = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        self.statements = 0                  # statements run on the lane (tests, benchmarks)

    def take(self, timeout: float) -> AbstractContextManager[psycopg.Connection[Any]] | None:
        """A context manager yielding the lane's connection for ONE statement, or None when the lane is in use (or
        closed): the caller then uses the pool. ``timeout``: the limit of a (re)connection, if one is needed."""
        if self._closed or not self._busy.acquire(blocking=False):
            return None
        return self._statement(timeout)

    @contextmanager
    def _statement(self, timeout: float) -> Iterator[psycopg.Connection[Any]]:
        sent = False
        try:
            conn = self._ready(timeout)
            sent = True
            yield conn
            self.statements += 1
        except _CANCELLED as exc:
            if self._conn is not None and not self._conn.broken:
                raise StoreTimeout(f"the database cancelled the statement (statement or lock timeout, or an "
                                   f"operator's cancel; the database is reachable): {_first_line(exc)}") from exc
            self._drop()
            raise StoreUnavailable(f"database connection failed during statement: {_first_line(exc)}",
                                   in_doubt=sent) from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            broken = self._conn is None or self._conn.broken
            if broken:
                self._drop()
            raise StoreUnavailable(f"database connection failed during {'statement' if sent else 'connect'}: "
                                   f"{_first_line(exc)}", in_doubt=sent and broken) from exc
        except psycopg.Error as exc:
            raise StoreError(f"database error during statement: {_first_line(exc)}") from exc
        finally:
            self._busy.release()

    def _ready(self, timeout: float) -> psycopg.Connection[Any]:
        """The lane's connection, made or replaced first when it is missing, closed or has something to read while
        idle (the server said goodbye). Nothing is sent on a connection that is replaced."""
        conn = self._conn
        if conn is not None and (conn.closed or conn.broken or self._readable(conn)):
            self._drop()
            self._broken()                   # the server closed it: the pool's idle connections are suspect too
            conn = None
        if conn is None:
            conn = self._connect(timeout)
            conn.autocommit = True
            self._conn = conn
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 — a broken connection's close may fail; it is gone either way
                pass

    def close(self) -> None:
        """Close the connection (waiting for a statement in progress); later :meth:`take` calls return None."""
        self._closed = True
        with self._busy:
            self._drop()


def exec_prepared(conn: psycopg.Connection[Any], name: bytes, query: bytes, types: Sequence[int],
                  values: Sequence[bytes | None], formats: Sequence[int]) -> tuple[bytes | None, ...] | None:
    """Run the named statement on ``conn`` (a lane's connection, in a :meth:`StatementLane.take` block), preparing it
    at its first use on that connection (``query`` with ``$n`` parameters of ``types``, OIDs): one libpq call with
    the values already encoded (``formats``: 0 text, 1 binary), without psycopg's per-call query conversion,
    adaptation and cursor. Returns the first row's values as the server sent them (text), None when it returned no
    row. A failure raises the psycopg exception psycopg would (its class from the SQLSTATE), or
    ``OperationalError`` when the connection broke, for the lane's translation. libpq releases the GIL while it
    waits, as psycopg's own waits do."""
    pg = conn.pgconn
    done: set[bytes] | None = getattr(conn, _PREPARED, None)
    if done is None:
        done = set()
        setattr(conn, _PREPARED, done)
    if name not in done:
        res = pg.prepare(name, query, list(types))
        if res.status != ExecStatus.COMMAND_OK:
            raise _error(conn, res)
        done.add(name)
    res = pg.exec_prepared(name, cast(Any, list(values)), list(formats), 0)   # None is NULL (as psycopg sends it)
    if (res.status != ExecStatus.TUPLES_OK and conn.pgconn.status != ConnStatus.BAD
            and res.error_field(DiagnosticField.SQLSTATE) == _NO_SUCH_STATEMENT):
        # the server forgot the statement (DEALLOCATE / DISCARD ALL, a pooler that moved the session to another
        # backend): nothing ran; prepared again and run once more, instead of failing every push until the
        # connection is replaced (the review of this session)
        done.discard(name)
        res = pg.prepare(name, query, list(types))
        if res.status != ExecStatus.COMMAND_OK:
            raise _error(conn, res)
        done.add(name)
        res = pg.exec_prepared(name, cast(Any, list(values)), list(formats), 0)
    if res.status != ExecStatus.TUPLES_OK:
        raise _error(conn, res)
    if not res.ntuples:
        return None
    return tuple(res.get_value(0, c) for c in range(res.nfields))


def _error(conn: psycopg.Connection[Any], res: Any) -> psycopg.Error:
    if conn.pgconn.status == ConnStatus.BAD:
        return psycopg.OperationalError(conn.pgconn.error_message.decode("utf-8", "replace").strip()
                                        or "the connection broke")
    return psycopg.errors.error_from_result(res, encoding=conn.info.encoding)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
