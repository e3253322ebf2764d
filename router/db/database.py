"""The node's one PostgreSQL connection pool and the one boundary where psycopg's errors become the project's.

A caller opens a unit of work and hands its connection to the store functions it calls, so everything it does in
that block commits (or rolls back) together::

    with db.unit_of_work() as conn:
        store.insert_events(conn, cid, rows)

A connection is checked out within ``checkout_timeout`` seconds (default 5) and each new connection is made within
``connect_timeout`` seconds, so a caller never waits long on a database that is down; every connection carries the
parameters of :mod:`router.db.conninfo` (libpq keepalives, ``tcp_user_timeout``), so no wait on an established
connection outlives a silent network cut by more than ``conninfo.STATEMENT_BOUND_S``. A pooled connection is
checked (one round trip) before use only when it sat idle in the pool for ``idle_check`` seconds (default 5) or
was never used: a connection in steady use costs no check, so a unit of work is one transaction, not two. A
connection that broke while in use (the database restarted) fails the operation with :class:`StoreUnavailable`
(nothing committed; the caller retries as for any outage). That failure (a broken connection only, not e.g. a
serialization failure or deadlock) starts a new "broken generation": the pool checks its idle connections at once
(on a thread of its own: on a cut network each check waits up to ``conninfo.STATEMENT_BOUND_S``),
and every connection last checked out before it (in use or being returned then) is checked at its next checkout.
So after a restart, the units of work that fail are the first one to meet a stale connection plus those that were
already holding a connection while the server went away (each of those fails once, as it would have with a check
on every checkout); a unit of work that starts after the first failure is never given a stale connection. Errors (see
:mod:`router.db.errors`): no connection in time or a broken connection is :class:`StoreUnavailable` (``in_doubt``
when it broke during COMMIT); a statement the database cancelled on a working connection (statement or lock
timeout, an operator's cancel) is :class:`StoreTimeout` (the database is up: not an outage, and no connection is
checked); any other psycopg error is :class:`StoreError`; nothing else is translated.
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from router.db.conninfo import bounded
from router.db.errors import StoreError, StoreTimeout, StoreUnavailable, WriteFenced
from router.db.lane import StatementLane
from router.db.migrate import run as run_migrations

__all__ = ["DEFAULT_CHECKOUT_TIMEOUT", "DEFAULT_CONNECT_TIMEOUT", "DEFAULT_IDLE_CHECK", "Database", "FenceToken",
           "StatementFence"]

DEFAULT_CHECKOUT_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 3
DEFAULT_IDLE_CHECK = 5.0
#: psycopg_pool's background connection attempts give up after this long (then a checkout starts a new one).
RECONNECT_TIMEOUT = 5.0
#: A statement the database cancelled on a working connection (statement_timeout, pg_cancel_backend; lock_timeout)
_CANCELLED = (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable)
_IDLE_SINCE = "_nsjms_idle_since"        # attribute stamped on a connection when it goes back to the pool
_GENERATION = "_nsjms_generation"        # the pool's broken generation when the connection was last checked out


@dataclass(frozen=True, slots=True)
class FenceToken:
    """The node's fencing token (docs/cluster.md): its node id and its current epoch."""

    node_id: str
    epoch: int


class StatementFence(Protocol):
    """The node's fence for a write that checks it inside its OWN statement (a single statement in autocommit,
    :meth:`Database.statement`, is its own transaction: :attr:`Database.fence` cannot run before its COMMIT). The
    writer puts :func:`router.cluster.members.CHANNEL_FENCE_CTE` in the statement with :meth:`token`'s values."""

    def token(self) -> FenceToken:
        """This node's token now; :class:`WriteFenced` (nothing is sent) when the node knows it was fenced."""
        ...

    def refused(self, exc: WriteFenced) -> None:
        """A statement carrying the token wrote nothing: the node was fenced (it notices and stops) or the object
        moved. Called once per refused write, before ``exc`` goes to the writer's callers; never raises."""
        ...


class Database:
    """One pool of at most ``max(2, pool_size)`` connections shared by every store of the node."""

    def __init__(self, dsn: str, pool_size: int = 8, *, checkout_timeout: float = DEFAULT_CHECKOUT_TIMEOUT,
                 connect_timeout: int = DEFAULT_CONNECT_TIMEOUT, idle_check: float = DEFAULT_IDLE_CHECK) -> None:
        self.checkout_timeout = checkout_timeout
        self.idle_check = idle_check
        # the node's fence check (router/cluster, docs/cluster.md), run last in every unit of work that ends cleanly,
        # before its COMMIT (not in branch() nor statement()); raises StoreError (rolled back) when it was fenced
        self.fence: Callable[[psycopg.Connection[Any]], None] | None = None
        # the same check for a write made in one autocommit statement (statement()), which carries it in the
        # statement itself (router/channel/groupcommit.py, the accept path; docs/cluster.md); None: no fence
        self.statement_fence: StatementFence | None = None
        self._dsn = dsn
        self._connect_timeout = max(1, int(connect_timeout))
        self._lanes: list[StatementLane] = []
        self._generation = 0                 # +1 each time a connection is found broken (the server restarted?)
        self._generation_lock = threading.Lock()
        self._purging = threading.Lock()     # at most one background check of the idle connections at a time
        # bounded(): libpq keepalives and tcp_user_timeout, so no wait on an established connection outlives a
        # silent network cut by more than conninfo.STATEMENT_BOUND_S (router/db/conninfo.py).
        # reconnect_timeout: psycopg_pool retries a failed connection attempt with a doubling delay (1, 2, 4 ... s)
        # until it; after a long outage the next attempt could be 30 s away when the database returns. Bounded,
        # the attempt gives up and the next checkout that finds no connection starts a new one at once.
        self._pool = ConnectionPool(dsn, min_size=1, max_size=max(2, pool_size), open=False,
                                    kwargs=bounded(dsn, autocommit=False,
                                                   connect_timeout=max(1, int(connect_timeout))),
                                    timeout=checkout_timeout, check=self._check_if_idle, name="nsjms",
                                    reconnect_timeout=RECONNECT_TIMEOUT)

    def open(self, timeout: float = 30.0, *, migrate: bool = True) -> None:
        """Open the pool (waiting up to ``timeout`` s for a first connection) and bring the schema up to date."""
        self._pool.open(wait=True, timeout=timeout)
        if migrate:
            self.migrate()

    def close(self) -> None:
        for lane in self._lanes:
            lane.close()
        self._pool.close()

    def lane(self) -> StatementLane:
        """A dedicated autocommit connection for one caller's single statements (:mod:`router.db.lane`), closed with
        the pool; its statements are :meth:`statement`'s, without the pool's checkout."""
        def connect(timeout: float) -> psycopg.Connection[Any]:
            limit = max(1, min(self._connect_timeout, int(timeout)))
            return psycopg.connect(self._dsn, **bounded(self._dsn, autocommit=True, connect_timeout=limit))

        lane = StatementLane(connect, _readable, self._purge_broken)
        self._lanes.append(lane)
        return lane

    def migrate(self) -> list[int]:
        """Apply the missing numbered migrations (see :mod:`router.db.migrate`); returns the versions applied."""
        with self.unit_of_work() as conn:
            return run_migrations(conn)

    @contextmanager
    def unit_of_work(self, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection inside one transaction: committed on a clean exit, rolled back on an exception.
        ``timeout``: the checkout's limit instead of ``checkout_timeout`` (a caller with less time left).

        Do not open a second unit of work inside one: it would take a second connection and a second transaction.
        """
        stage = "checkout"
        used: psycopg.Connection[Any] | None = None
        limit = self.checkout_timeout if timeout is None else timeout
        try:
            with self._pool.connection(timeout=limit) as conn:
                used, stage = conn, "work"
                try:
                    yield conn
                    if self.fence is not None:      # last, before the COMMIT: held until it (docs/cluster.md)
                        self.fence(conn)
                finally:
                    _mark_idle(conn)
                stage = "commit"
        except PoolTimeout as exc:
            raise StoreUnavailable(f"no database connection within {limit:g} s") from exc
        except _CANCELLED as exc:
            if stage == "commit" or used is None or used.broken:   # never seen; treated as a lost connection
                self._purge_broken()
                raise StoreUnavailable(f"database connection failed during {stage}: {_first_line(exc)}",
                                       in_doubt=stage == "commit") from exc
            raise StoreTimeout(f"the database cancelled a statement during {stage} (statement or lock timeout, or "
                               f"an operator's cancel; the database is reachable): {_first_line(exc)}") from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if used is None or used.broken:      # not a serialization failure, deadlock, lock timeout, cancel
                self._purge_broken()
            raise StoreUnavailable(f"database connection failed during {stage}: {_first_line(exc)}",
                                   in_doubt=stage == "commit") from exc
        except psycopg.Error as exc:
            raise StoreError(f"database error during {stage}: {_first_line(exc)}") from exc

    @contextmanager
    def statement(self, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection in autocommit mode for a unit of work of exactly ONE statement: that statement is
        its own transaction (atomic; durable when it returns, ``synchronous_commit`` permitting, as a COMMIT is),
        so the unit of work is one round trip instead of three (BEGIN, the statement, COMMIT). The caller must
        not run a second statement on it: each would commit on its own. The node's fence check (:attr:`fence`) does
        not run here: a write that depends on ownership carries it in its statement (:attr:`statement_fence`).

        Errors as :meth:`unit_of_work`, except that a connection that broke during the statement is
        ``in_doubt`` (its implicit commit may have happened); a statement that failed otherwise committed
        nothing. A statement the database cancelled (``statement_timeout``, ``lock_timeout``, an operator's
        ``pg_cancel_backend``) raises :class:`StoreTimeout`, never in doubt (it was its own transaction).
        A connection the server closed while it sat in the pool (a restart) whose goodbye (the server's
        FATAL message or its FIN) is already waiting on the socket is found before the statement is sent (no round
        trip: a poll of the socket), discarded, and the statement gets ONE other connection (nothing was sent, so
        this is safe); if that one is broken too, the failure is certain (nothing committed), not in doubt. A
        connection whose server vanished without a goodbye (a crash or a network cut: nothing on the socket)
        cannot be told from a working one without a round trip, so the statement is sent and the failure is in
        doubt (``COMPLETED_MAYBE``), conservatively."""
        used: psycopg.Connection[Any] | None = None
        limit = self.checkout_timeout if timeout is None else timeout
        try:
            # getconn/putconn, not the pool's connection() (issue 27: the group committer's lone pushes come here):
            # its ``with conn`` would only add a COMMIT or ROLLBACK that an autocommit connection never needs (the
            # statement was its own transaction; a connection left in another state is reset or discarded by putconn)
            conn = self._idle_working(limit)
            try:
                used = conn
                conn.autocommit = True
                try:
                    yield conn
                finally:
                    if not conn.closed:
                        conn.autocommit = False
                    _mark_idle(conn)
            finally:
                self._pool.putconn(conn)
        except PoolTimeout as exc:
            raise StoreUnavailable(f"no database connection within {limit:g} s") from exc
        except _CANCELLED as exc:
            if used is None or used.broken:      # never seen; treated as a lost connection (as unit_of_work)
                self._purge_broken()
                raise StoreUnavailable(f"database connection failed during {'statement' if used else 'checkout'}: "
                                       f"{_first_line(exc)}", in_doubt=used is not None) from exc
            # autocommit: the cancelled statement was its own transaction and committed nothing (not in doubt)
            raise StoreTimeout(f"the database cancelled the statement (statement or lock timeout, or an "
                               f"operator's cancel; the database is reachable): {_first_line(exc)}") from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if used is None or used.broken:
                self._purge_broken()
            raise StoreUnavailable(f"database connection failed during {'statement' if used else 'checkout'}: "
                                   f"{_first_line(exc)}", in_doubt=used is not None and used.broken) from exc
        except psycopg.Error as exc:
            raise StoreError(f"database error during statement: {_first_line(exc)}") from exc

    def _idle_working(self, timeout: float) -> psycopg.Connection[Any]:
        """A pooled connection for :meth:`statement` (the caller gives it back with ``putconn``). One with something
        to read while idle (the server closed it) is checked; a failed check discards it (the pool replaces it),
        checks the other idle ones (:meth:`_purge_broken`) and takes ONE other connection, whose failed check
        raises."""
        for attempt in (1, 2):
            conn = self._pool.getconn(timeout=timeout)
            if _readable(conn):                  # nothing is due on an idle connection: the server went away?
                try:
                    ConnectionPool.check_connection(conn)
                except (psycopg.OperationalError, psycopg.InterfaceError):
                    if attempt == 1:
                        conn.close()             # back to the pool closed: discarded and replaced
                    self._pool.putconn(conn)
                    if attempt == 2:
                        raise
                    self._purge_broken()
                    continue
                except BaseException:
                    self._pool.putconn(conn)
                    raise
            return conn
        raise AssertionError("unreachable")      # pragma: no cover

    @contextmanager
    def branch(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for a T2 branch (``xa.pg.PgBranch``): idle, not autocommit, no transaction begun.

        The branch's own boundary (``xa.pg``) translates errors of its two-phase calls (they leave the block as
        ``xa`` errors, untouched here). The checkout and the caller's statements inside the block are translated
        as :meth:`unit_of_work` translates them during its work: no connection in time or a broken connection is
        :class:`StoreUnavailable` (never in doubt: nothing of a T2 commits before its prepare), a statement the
        database cancelled on a working connection :class:`StoreTimeout`, any other psycopg error
        :class:`StoreError`. The connection goes back to the pool when the block ends; one left inside a
        transaction is rolled back by the pool, a broken one is discarded.
        """
        try:
            cm = self._pool.connection(timeout=self.checkout_timeout)
            conn = cm.__enter__()
        except PoolTimeout as exc:
            raise StoreUnavailable(f"no database connection within {self.checkout_timeout:g} s") from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise StoreUnavailable(f"database connection failed during checkout: {_first_line(exc)}") from exc
        try:
            yield conn
        except BaseException as exc:
            broken = conn.broken
            if broken:
                self._purge_broken()
            _drop_if_unfinished(conn)
            _mark_idle(conn)
            cm.__exit__(type(exc), exc, exc.__traceback__)
            if isinstance(exc, psycopg.Error):
                raise _work_error(exc, broken=broken) from exc
            raise
        else:
            _drop_if_unfinished(conn)
            _mark_idle(conn)
            cm.__exit__(None, None, None)

    def _check_if_idle(self, conn: psycopg.Connection[Any]) -> None:
        """The pool's check on checkout: a round trip only for a connection idle ``idle_check`` s, never used, or
        last checked out before a connection was last found broken (it was in use or on its way back to the pool
        when the server went away, so :meth:`_purge_broken` could not check it)."""
        generation = self._generation
        since = getattr(conn, _IDLE_SINCE, None)
        stamp = getattr(conn, _GENERATION, None)
        if since is None or stamp is None or stamp < generation or time.monotonic() - since >= self.idle_check:
            ConnectionPool.check_connection(conn)
        setattr(conn, _GENERATION, generation)

    def _purge_broken(self) -> None:
        """A connection broke in use: check the idle ones now (each broken one is discarded and replaced in the
        background), so the callers after this one do not each meet a stale connection; the connections out of
        the pool now are checked at their next checkout (a new broken generation). Never raises."""
        with self._generation_lock:
            self._generation += 1
        if self._purging.acquire(blocking=False):      # in the background: on a cut network each check of an
            threading.Thread(target=self._check_idle, name="nsjms-pool-check", daemon=True).start()  # idle
            # connection waits up to conninfo.STATEMENT_BOUND_S, and the caller must answer its client now

    def _check_idle(self) -> None:
        try:
            self._pool.check()
        except Exception:  # noqa: BLE001 — best effort; the checkout's own check still applies
            pass
        finally:
            self._purging.release()

    def stats(self) -> dict[str, int]:
        """The pool's counters (psycopg_pool's ``get_stats``)."""
        return {k: int(v) for k, v in self._pool.get_stats().items()}


def _mark_idle(conn: psycopg.Connection[Any]) -> None:
    """The connection goes back to the pool (idle) now: stamped by the unit of work that used it."""
    setattr(conn, _IDLE_SINCE, time.monotonic())


def _readable(conn: psycopg.Connection[Any]) -> bool:
    """Whether the idle connection's socket has something to read (a closed or erroring socket counts)."""
    try:       # poll, not select: select() refuses a descriptor >= 1024 (FD_SETSIZE), common in a busy node
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)   # POLLERR, POLLHUP, POLLNVAL: always
        return bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):
        return True


def _drop_if_unfinished(conn: psycopg.Connection[Any]) -> None:
    """A connection still associated with a two-phase transaction (prepared, then neither committed nor rolled
    back here: recovery finishes it by xid) is closed, never handed to the next user of the pool."""
    if getattr(conn, "_tpc", None) is not None and not conn.closed:
        conn.close()


def _work_error(exc: psycopg.Error, *, broken: bool) -> StoreError:
    """The project's error for a psycopg error raised by a statement of a T2 branch (as :meth:`Database.unit_of_work`
    classifies one raised during its work)."""
    if isinstance(exc, _CANCELLED) and not broken:
        return StoreTimeout(f"the database cancelled a statement during work (statement or lock timeout, or an "
                            f"operator's cancel; the database is reachable): {_first_line(exc)}")
    if isinstance(exc, (*_CANCELLED, psycopg.OperationalError, psycopg.InterfaceError)):
        return StoreUnavailable(f"database connection failed during work: {_first_line(exc)}")
    return StoreError(f"database error during work: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
