"""Group commit of accepted persistent events: concurrent suppliers' events share one PostgreSQL commit.

Leader/follower, no timer. A push that finds a free commit slot (fewer than ``max_inflight`` groups committing,
default :data:`MAX_INFLIGHT` = 2, each on its own pooled connection) becomes a leader and commits its own events at
once (no added latency when alone), together with whatever else is queued then. Pushes arriving while every slot is
busy queue their events and wait; when a commit ends, one of them becomes the next leader and commits everything
queued so far (up to :data:`MAX_GROUP_EVENTS` events) in one unit of work, with one ``Store.insert_events``
statement per channel. Two groups in flight let the next group's statement be built and sent while the previous
one waits for its WAL flush (PostgreSQL then flushes both commit records together when the second arrives in time),
instead of leaving the disk idle while the node prepares the next group; one slot (``max_inflight=1``) is the
strict "one commit at a time" of round 3. So a push waits at most for the commits in progress plus its own
group's commit, and returns only once its events are durable (or with the error that prevented it). Pushes are
grouped in arrival order; with more than a group's worth queued, a push also waits for the groups queued before
it. Groups in flight at the same time are independent transactions: the order in which their rows become
visible is not the order of the pushes (ids are still assigned at insert; nothing on the accept side depends on
commit order, and a push's own events are always in one group).

A push that finds nothing queued and a slot free (a lone supplier's every push) commits its own rows directly, as a
group of one, without a queued job or its wake-up event (``_commit_alone``).

Wake-ups are targeted: a finished group wakes its own members (each waits on its own event) and at most one
queued push to lead the next group, never every waiting thread.

A group of one channel's events that the store writes in one statement (``Store.one_statement``: always, outside a
T2, which never comes here) is written on an autocommit connection (``Database.statement``): the statement is its
own transaction, one round trip instead of three (BEGIN, INSERT, COMMIT), equally atomic and durable when it
returns; a connection that breaks while it runs makes the error ``in_doubt`` (``COMPLETED_MAYBE``). Other groups
use a unit of work. Such a statement goes on the committer's own lane when it is free (``Database.lane``,
``router/db/lane.py``: one dedicated autocommit connection, the one-event statement prepared on it once and run with
values the store encodes, no pool checkout, no autocommit switches, no psycopg cursor per push; issue 27), else on
a pooled connection (a second group in flight): the same statement, guarantees and errors either way.

Fencing (docs/cluster.md): each statement carries the node's fence check itself (``Database.statement_fence``: the
node's token, put in the statement by ``Store.insert_events``), since an autocommit statement's COMMIT leaves no room
for the unit of work's check; a refused check stores nothing and fails every push of the group with
``WriteFenced`` (``TRANSIENT``, ``COMPLETED_NO``), after the fence's ``refused`` hook has seen it. A group of
several channels refused while the node's own token is still good (one of its channels moved to another node) is
written again channel by channel, so only the pushes of the channel that moved fail.

Bounded waits: a push whose events are still queued (no group took them) after ``max_wait`` s (default
:data:`MAX_WAIT_S`, the pool's checkout timeout) withdraws them and fails with ``StoreUnavailable``
(``TRANSIENT``, ``COMPLETED_NO``): they were never sent to the database and no later group can store them, so a
supplier told its push failed never finds it stored later (a silent network cut to PostgreSQL once left pushes
queued behind a stuck commit; when the network came back, every abandoned push was stored, each supplier retry
too). A push whose events are in a group being committed waits for that group's outcome, which the connection's
own bounds end (pool checkout timeout, ``router/db/conninfo.py``: libpq keepalives and ``tcp_user_timeout``).

Errors: if the group's unit of work fails, every push of the group gets the same exception (a ``StoreError`` is
translated as before at the servant boundary, ``router/channel/boundary.py``: ``TRANSIENT`` or
``PERSIST_STORE``; ``COMPLETED_MAYBE`` when the connection broke during COMMIT, for every member). Nothing of a
failed group is stored, so each supplier may retry its own push.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from router.channel.store import NewEvent
from router.db.database import FenceToken, StatementFence
from router.db.errors import StoreUnavailable, WriteFenced
from router.db.lane import StatementLane

__all__ = ["MAX_GROUP_EVENTS", "MAX_INFLIGHT", "MAX_WAIT_S", "GroupCommit"]

#: Events per group commit at most (a single larger push is committed alone, whole).
MAX_GROUP_EVENTS = 1000
#: Groups committing at the same time at most (each holds one pooled connection while it commits).
MAX_INFLIGHT = 2
#: How long a push's events may wait queued behind the commits in progress (the pool's checkout timeout).
MAX_WAIT_S = 5.0
#: The group's checkout waits at least this long, whatever its oldest push has left.
MIN_CHECKOUT_S = 0.5


class _Store(Protocol):
    def insert_events(self, conn: Any, cid: int, events: Sequence[NewEvent], *,
                      fence: FenceToken | None = None, prepared: bool = False) -> list[int]: ...


class _Database(Protocol):
    def unit_of_work(self, timeout: float | None = None) -> Any: ...


class _OneStatementStore(_Store, Protocol):
    def one_statement(self, cid: int, events: Sequence[NewEvent]) -> bool: ...


class _OneStatementDatabase(_Database, Protocol):
    def statement(self, timeout: float | None = None) -> Any: ...


@dataclass(eq=False)
class _Job:
    cid: int
    rows: Sequence[NewEvent]
    deadline: float = 0.0                 # monotonic: queued past it, the push gives up
    done: bool = False
    lead: bool = False                    # woken to lead the next group (a slot is free)
    ids: list[int] = field(default_factory=list)
    error: BaseException | None = None
    wake: threading.Event = field(default_factory=threading.Event)


class GroupCommit:
    """Stores the events of concurrent pushes in shared transactions (see the module docstring)."""

    def __init__(self, db: _Database, store: _Store, *, max_events: int = MAX_GROUP_EVENTS,
                 one_statement: bool = False, max_inflight: int = MAX_INFLIGHT,
                 max_wait: float = MAX_WAIT_S) -> None:
        """``one_statement``: ``db`` has ``statement()`` and ``store`` has ``one_statement()`` (see the module
        docstring); without it every group is a unit of work. ``max_inflight``: groups committing at once.
        ``max_wait``: how long a push's events may stay queued (not taken into a group) before it gives up."""
        self._db = db
        self._max_wait = max_wait
        self.withdrawn = 0               # pushes that gave up queued (their events never sent to the database)
        self._store = store
        self._max_events = max_events
        self._one_statement = one_statement
        self._max_inflight = max(1, max_inflight)
        self._lock = threading.Lock()
        self._pending: list[_Job] = []
        self._inflight = 0
        self.commits = 0                 # groups committed (``nsjms status``, tests and benchmarks)
        self.events = 0                  # events those groups stored
        self.statements = 0              # of those groups, the ones written as one autocommit statement
        # a dedicated autocommit connection for those statements (router/db/lane.py), when the database has one:
        # a group that finds it in use (another group in flight) takes a pooled connection as before
        lane = getattr(db, "lane", None) if one_statement else None
        self._lane: StatementLane | None = lane() if callable(lane) else None

    def insert(self, cid: int, rows: Sequence[NewEvent]) -> list[int]:
        """Store ``rows`` of channel ``cid`` durably; returns their ids in order. Raises the group's error, or
        :class:`StoreUnavailable` (nothing stored, never stored later) when no group took them within
        ``max_wait`` s."""
        deadline = time.monotonic() + self._max_wait
        with self._lock:                 # alone: nothing queued and a free slot; it commits its own rows at once
            alone = not self._pending and self._inflight < self._max_inflight
            if alone:
                self._inflight += 1
        if alone:
            return self._commit_alone(cid, rows, deadline)
        job = _Job(cid, rows, deadline)
        with self._lock:
            self._pending.append(job)
            group = self._lead_if_free()
        while True:
            if group:
                try:
                    self._commit(group)
                finally:
                    with self._lock:
                        self._inflight -= 1
                        self._hand_on()
                group = []
            if job.done:
                return _result(job)
            with self._lock:
                queued = job in self._pending    # taken into a group: its commit's outcome ends the wait
            job.wake.wait(max(0.0, deadline - time.monotonic()) if queued else None)
            with self._lock:
                job.wake.clear()
                if job.done:
                    return _result(job)
                if job.lead:
                    job.lead = False
                    group = self._lead_if_free()
                elif job in self._pending and time.monotonic() >= deadline:
                    self._pending.remove(job)      # never sent: withdrawn, no later group can store it
                    self.withdrawn += 1
                    self._hand_on()
                    raise StoreUnavailable(f"the database did not take the event(s) within {self._max_wait:g} s "
                                           f"(commits in progress have not ended: is it reachable?)")

    def _lead_if_free(self) -> list[_Job]:
        """(Lock held.) A free slot and something queued: take a group (the caller commits it), else []."""
        if self._inflight >= self._max_inflight or not self._pending:
            return []
        self._inflight += 1
        return self._take_group()

    def _hand_on(self) -> None:
        """(Lock held.) A slot became free: wake the first queued push to lead the next group."""
        if self._pending and self._inflight < self._max_inflight:
            first = self._pending[0]
            first.lead = True
            first.wake.set()

    def _take_group(self) -> list[_Job]:
        group: list[_Job] = []
        n = 0
        while self._pending and (not group or n + len(self._pending[0].rows) <= self._max_events):
            job = self._pending.pop(0)
            group.append(job)
            n += len(job.rows)
        return group

    def _commit(self, group: list[_Job]) -> None:
        by_channel: dict[int, list[_Job]] = {}
        for job in group:
            by_channel.setdefault(job.cid, []).append(job)
        rows = {cid: [r for j in jobs for r in j.rows] for cid, jobs in by_channel.items()}
        single = False
        # the checkout waits only what the group's oldest push has left of its max_wait (at least MIN_CHECKOUT_S):
        # a push's answer stays bounded when the database is unreachable (docs/channel.md, a network cut)
        limit = max(MIN_CHECKOUT_S, min(job.deadline for job in group) - time.monotonic())
        try:                                  # whatever fails here fails every member: none is left undone
            single = self._single(rows)
            results = self._write(rows, single, limit)
        except WriteFenced as exc:
            if len(by_channel) > 1 and self._node_not_fenced():
                self._commit_apart(by_channel)
                return
            self._fail(group, exc)
            return
        except BaseException as exc:
            self._fail(group, exc)
            if not isinstance(exc, Exception):
                raise
            return
        with self._lock:
            self.commits += 1
            self.statements += int(single)
            self.events += sum(len(job.rows) for job in group)
            for cid, jobs in by_channel.items():
                self._done(jobs, results[cid])

    def _commit_apart(self, by_channel: dict[int, list[_Job]]) -> None:
        """A group of several channels was refused by the fence while the node itself is not fenced: one of its
        channels moved to another node (a hand-off). Nothing of the group was stored (its unit of work rolled
        back), so each channel is written again on its own: only the pushes of a channel this node no longer owns
        fail (``WriteFenced``, ``TRANSIENT``: the supplier retries and is forwarded to the owner); the others are
        stored as if the group had been theirs alone."""
        failure: BaseException | None = None
        for cid, jobs in by_channel.items():
            group = {cid: [r for j in jobs for r in j.rows]}
            limit = max(MIN_CHECKOUT_S, min(job.deadline for job in jobs) - time.monotonic())
            try:
                single = self._single(group)
                ids = self._write(group, single, limit)[cid]
            except BaseException as exc:  # noqa: BLE001 — its pushes get it; a non-Exception is raised after the rest
                self._fail(jobs, exc)
                if not isinstance(exc, Exception):
                    failure = exc
                continue
            with self._lock:
                self.commits += 1
                self.statements += int(single)
                self.events += len(group[cid])
                self._done(jobs, ids)
        if failure is not None:
            raise failure

    def _node_not_fenced(self) -> bool:
        """Whether this node's own token is still good (so a refused group means a channel moved, not the node)."""
        fence: StatementFence | None = getattr(self._db, "statement_fence", None)
        if fence is None:
            return False
        try:
            fence.token()
        except WriteFenced:
            return False
        return True

    def _fail(self, jobs: list[_Job], exc: BaseException) -> None:
        with self._lock:
            for job in jobs:
                job.error, job.done = exc, True
                job.wake.set()

    @staticmethod
    def _done(jobs: list[_Job], ids: list[int]) -> None:
        """(Lock held.) The jobs of one channel, in order, get their ids from the channel's statement."""
        at = 0
        for job in jobs:
            job.ids, job.done = ids[at:at + len(job.rows)], True
            at += len(job.rows)
            job.wake.set()

    def _commit_alone(self, cid: int, rows: Sequence[NewEvent], deadline: float) -> list[int]:
        """A lone leader's group (it holds a slot; nothing else was queued): its own rows, written as any group's
        (:meth:`_write`), without a job, its wake-up event or a second round of the lock; the slot is handed on as
        after any group."""
        try:
            limit = max(MIN_CHECKOUT_S, deadline - time.monotonic())
            group = {cid: list(rows)}
            single = self._single(group)
            ids = self._write(group, single, limit)[cid]
            with self._lock:
                self.commits += 1
                self.statements += int(single)
                self.events += len(rows)
            return ids
        finally:
            with self._lock:
                self._inflight -= 1
                self._hand_on()

    def _write(self, rows: dict[int, list[NewEvent]], single: bool, limit: float) -> dict[int, list[int]]:
        """One group's write: one statement on the lane or a pooled autocommit connection (``single``), else a unit
        of work with one statement per channel; each statement carries the node's fence. Raises what failed (the
        fence's ``refused`` hook has seen a :class:`WriteFenced`)."""
        fence: StatementFence | None = getattr(self._db, "statement_fence", None)
        try:
            token = fence.token() if fence is not None else None
            work: Any = self._lane.take(limit) if single and self._lane is not None else None
            prepared = work is not None       # the lane's connection: its prepared statement (router/db/lane.py)
            if work is None:
                work = cast(_OneStatementDatabase, self._db).statement(limit) if single \
                    else self._db.unit_of_work(limit)
            with work as conn:
                return {cid: self._store.insert_events(conn, cid, events, fence=token, prepared=prepared)
                        for cid, events in rows.items()}
        except WriteFenced as exc:
            if fence is not None:
                fence.refused(exc)
            raise

    def _single(self, rows: dict[int, list[NewEvent]]) -> bool:
        """Whether the group is one statement: one channel, and the store writes its events in one."""
        if not self._one_statement or len(rows) != 1:
            return False
        ((cid, events),) = rows.items()
        return cast(_OneStatementStore, self._store).one_statement(cid, events)


def _result(job: _Job) -> list[int]:
    if job.error is not None:
        raise job.error
    return job.ids
