"""PostgreSQL branches over psycopg's two-phase API; the ONE place where psycopg errors become ``xa`` errors.

* :class:`PgBranch` is a :class:`~xa.resource.Resource` over a connection the CALLER owns: after
  ``Transaction.enlist(branch)`` (which runs ``tpc_begin``) the caller does its SQL on ``branch.conn``; the
  coordinator then runs ``PREPARE TRANSACTION`` / ``COMMIT PREPARED`` / ``ROLLBACK``. The connection must not be in
  autocommit mode and must be idle when enlisted.
* :class:`PgManager` is a :class:`~xa.resource.RecoverableManager` on a session of its own, never one that holds
  a branch (``tpc_recover()`` on the connection that holds a prepared transaction breaks that connection); it
  lists only the prepared transactions of the database it connects to (``pg_prepared_xacts`` shows every
  database's, and ``COMMIT PREPARED`` must run in the owning database), and finishes one by xid.

Translation: ``UndefinedObject`` (no such prepared transaction) → :class:`BranchNotFound`; psycopg's
``OperationalError`` and ``InterfaceError`` → :class:`BranchUnavailable` (outcome unknown), at every step,
PREPARE included. That class is more than a lost session: PostgreSQL's class 53 (insufficient resources:
``OutOfMemory``, which is what "maximum number of prepared transactions reached" raises, ``DiskFull``,
``ConfigurationLimitExceeded``) and class 57 (operator intervention) are ``OperationalError`` too, so a PREPARE
refused for one of them on a live session is also :class:`BranchUnavailable`, not :class:`PrepareFailed`. The
outcome is the same: the coordinator rolls every branch back for any failed PREPARE whatever its class, and
:meth:`PgBranch.prepare` resets a session that is still open (:meth:`PgBranch._forget_failed_prepare`), so the
rollback is a plain ROLLBACK (tests/integration/test_xa_pg_prepare_fails.py,
``test_max_prepared_transactions_exhausted``). Any other error while preparing (a deferred constraint, a
trigger's error) → :class:`PrepareFailed`; any other error elsewhere → :class:`BranchUnavailable`. A
statement the server cancelled (``QueryCanceled``, ``LockNotAvailable``: a statement or lock timeout, an
operator's cancel) is not a lost session: while preparing it is :class:`PrepareFailed` (PostgreSQL rolled the
branch back; the session stays usable), elsewhere :class:`BranchUnavailable` (the branch is still prepared;
recovery finishes it), and the other branches of a batch on that session are still attempted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import Xid, errors

from .errors import BranchNotFound, BranchUnavailable, PrepareFailed, ResourceError, UsageError

__all__ = ["PgBranch", "PgManager", "translate"]

Connect = Callable[[], psycopg.Connection[Any]]


#: The server cancelled a statement (``statement_timeout``, ``lock_timeout``, ``pg_cancel_backend``): the session
#: is fine and the statement did not happen — not a lost connection (as ``router.db`` maps them to StoreTimeout).
_CANCELLED = (errors.QueryCanceled, errors.LockNotAvailable)


def session_lost(exc: psycopg.Error) -> bool:
    """A connection-level failure (the session, or the server, is gone; what the call did is unknown)."""
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) and not isinstance(exc, _CANCELLED)


def translate(exc: psycopg.Error, *, step: str, gtrid: str | None, branch: str) -> ResourceError:
    """The ``xa`` error for a psycopg error raised during ``step`` of a branch."""
    text = f"PostgreSQL {step} of branch {branch}: {type(exc).__name__}: {str(exc).strip()}"
    if isinstance(exc, errors.UndefinedObject):
        return BranchNotFound(text, gtrid=gtrid, branch=branch)
    if session_lost(exc):
        return BranchUnavailable(text, gtrid=gtrid, branch=branch)
    if step == "prepare":                # PostgreSQL turns a failed PREPARE TRANSACTION into a ROLLBACK: a no vote
        return PrepareFailed(text, gtrid=gtrid, branch=branch)
    return BranchUnavailable(text, gtrid=gtrid, branch=branch)


class PgBranch:
    """One PostgreSQL branch of a T2 on the caller's connection."""

    kind = "postgresql"
    one_phase_only = False

    def __init__(self, conn: psycopg.Connection[Any], name: str, *, manager: str = "postgresql",
                 sort_key: str | None = None) -> None:
        self.conn = conn
        self.name = name
        self.manager = manager
        self._sort_key = sort_key or name
        self._xid: Xid | None = None
        self._begun = self._prepared = False
        self._prepare_sent = False  # PREPARE TRANSACTION went out (its outcome is unknown if the session died)

    def sort_key(self) -> str:
        return self._sort_key

    @contextmanager
    def _boundary(self, step: str) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as exc:
            gtrid = self._xid.gtrid if self._xid else None
            raise translate(exc, step=step, gtrid=gtrid, branch=self.name) from exc

    def begin(self, xid: Xid) -> None:
        if self.conn.autocommit:
            raise UsageError(f"branch {self.name}: the connection is in autocommit mode", gtrid=xid.gtrid)
        status = self.conn.info.transaction_status
        if status != psycopg.pq.TransactionStatus.IDLE:
            raise UsageError(f"branch {self.name}: the connection is not idle ({status.name}); enlist the branch "
                             "before doing its work", gtrid=xid.gtrid)
        self._xid = xid
        with self._boundary("begin"):
            self.conn.tpc_begin(xid)
        self._begun = True

    def prepare(self) -> None:
        self._prepare_sent = True
        try:
            with self._boundary("prepare"):
                self.conn.tpc_prepare()
        except ResourceError:
            if not self.conn.closed:
                self._forget_failed_prepare()
            raise
        self._prepared = True

    def _forget_failed_prepare(self) -> None:
        """``PREPARE TRANSACTION`` failed on a live session (a constraint or a cancel: :class:`PrepareFailed`;
        ``max_prepared_transactions`` reached or another class 53 error: :class:`BranchUnavailable`, see the
        module docstring): PostgreSQL turned it into a ROLLBACK, nothing was prepared. psycopg marks its
        transaction prepared BEFORE sending the statement, so its ``tpc_rollback()`` would send ``ROLLBACK
        PREPARED`` for nothing (an error: the rollback reported unknown) and leave the caller's connection stuck in
        a two-phase state: reset it."""
        idle = self.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        # psycopg has no public way to drop its two-phase state; (xid, False) makes tpc_rollback() a plain ROLLBACK.
        self.conn._tpc = None if idle or self._xid is None else (self._xid, False)
        self._begun = not idle  # idle: the transaction is over, nothing left to roll back

    def commit(self) -> None:
        with self._boundary("commit"):
            self.conn.tpc_commit()

    def rollback(self) -> None:
        if not self._begun:
            return  # nothing begun here
        if self.conn.closed:
            if self._prepared or self._prepare_sent:  # it may outlive its session: recovery must roll it back
                what = "prepared" if self._prepared else "preparing (PREPARE TRANSACTION may have happened)"
                raise BranchUnavailable(f"branch {self.name}: session closed while {what}",
                                        gtrid=self._xid.gtrid if self._xid else None, branch=self.name)
            return  # PostgreSQL aborted the unprepared branch with its session
        with self._boundary("rollback"):
            self.conn.tpc_rollback()


class PgManager:
    """Recovery's view of one PostgreSQL database, on its OWN session (never one that holds a branch).

    The session is opened on first use and kept for the next calls (a connection per ``COMMIT PREPARED`` costs
    more than the commit: about 35 ms against the test server); any psycopg error drops it, and the next call
    opens a new one. Thread-safe; :meth:`close` ends the session. :meth:`finish_branches`
    (:class:`~xa.resource.BatchManager`) finishes many branches over up to ``sessions`` extra sessions at once
    (one per ``per_session`` branches), closed when the batch is done.
    """

    def __init__(self, connect: Connect, *, key: str = "postgresql", sessions: int = 12,
                 per_session: int = 16) -> None:
        self._connect = connect
        self.key = key
        self.sessions = max(1, sessions)
        self.per_session = max(1, per_session)
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    @contextmanager
    def _session(self, step: str, xid: Xid | None = None) -> Iterator[psycopg.Connection[Any]]:
        gtrid, branch = (xid.gtrid, xid.bqual or "") if xid else (None, "")
        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                    self._conn.autocommit = True
                yield self._conn
            except psycopg.Error as exc:
                self._drop()
                raise translate(exc, step=step, gtrid=gtrid, branch=branch) from exc

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def recover(self) -> Sequence[Xid]:
        with self._session("recover") as conn:
            database = conn.info.dbname
            return [x for x in conn.tpc_recover() if x.database == database]

    def commit_branch(self, xid: Xid) -> None:
        with self._session("commit", xid) as conn:
            conn.tpc_commit(xid)

    def rollback_branch(self, xid: Xid) -> None:
        with self._session("rollback", xid) as conn:
            conn.tpc_rollback(xid)

    # -- many branches at once (xa.resource.BatchManager) ---------------------------------------------------
    def finish_branches(self, ops: Sequence[tuple[str, Xid]]) -> list[ResourceError | None]:
        """``COMMIT PREPARED`` / ``ROLLBACK PREPARED`` of every ``(step, xid)``, spread over up to ``sessions``
        sessions of their own at once: each statement waits for its own WAL flush, and concurrent flushes are
        grouped by PostgreSQL, so N sessions finish about N times as many per second. Small batches use the kept
        session."""
        results: list[ResourceError | None] = [None] * len(ops)
        workers = min(self.sessions, -(-len(ops) // self.per_session))
        if workers <= 1:
            for i, (step, xid) in enumerate(ops):
                try:
                    self.commit_branch(xid) if step == "commit" else self.rollback_branch(xid)
                except ResourceError as exc:
                    results[i] = exc
            return results
        threads = [threading.Thread(target=self._worker, args=(ops, range(w, len(ops), workers), results),
                                    name=f"xa-pg-finish-{w}", daemon=True) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results

    def _worker(self, ops: Sequence[tuple[str, Xid]], mine: range, results: list[ResourceError | None]) -> None:
        conn: psycopg.Connection[Any] | None = None
        todo = list(mine)
        try:
            for n, i in enumerate(todo):
                step, xid = ops[i]
                try:
                    if conn is None:
                        conn = self._connect()
                        conn.autocommit = True
                    if step == "commit":
                        conn.tpc_commit(xid)
                    else:
                        conn.tpc_rollback(xid)
                except psycopg.Error as exc:
                    err = translate(exc, step=step, gtrid=xid.gtrid, branch=xid.bqual or "")
                    results[i] = err
                    if session_lost(exc):
                        # The session (or the server) is gone: the rest of this share is not attempted.
                        for j in todo[n + 1:]:
                            results[j] = BranchUnavailable(f"PostgreSQL {ops[j][0]} not attempted: {err}",
                                                           gtrid=ops[j][1].gtrid, branch=ops[j][1].bqual or "")
                        return
        finally:
            if conn is not None:
                conn.close()

    def close(self) -> None:
        with self._lock:
            self._drop()
