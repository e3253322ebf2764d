"""In-memory twins for unit tests: a resource manager with its branches, a recovery log, a clock.

They fail LOUDLY: a call out of protocol order raises :class:`~xa.errors.UsageError` (an assertion about the
coordinator, not a peer failure), and every step can be made to fail by injection::

    db = MemoryManager("pg", clock)
    branch = db.branch("outbox", fail={"prepare": PrepareFailed("disk full")})
    branch = db.branch("stomp", one_phase=True, fail={"commit": OutcomeUnknown("no receipt")}, applies=True)

``fail[step]`` is an exception (raised) or a callable (called, e.g. to advance the clock, then the step runs).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from psycopg import Xid

from .errors import BranchNotFound, LogDurabilityUnknown, ResourceError, UsageError
from .records import LiveTxn, Record, fold
from .xid import NodeId

__all__ = ["FakeClock", "Injection", "MemoryLog", "MemoryManager", "MemoryResource"]

Injection = BaseException | Callable[[], object]


class FakeClock:
    """A clock that moves only when told."""

    def __init__(self, monotonic: float = 1000.0, wall: float = 1_700_000_000.0) -> None:
        self._mono, self._wall = monotonic, wall

    def monotonic(self) -> float:
        return self._mono

    def wall(self) -> float:
        return self._wall

    def advance(self, seconds: float) -> None:
        self._mono += seconds
        self._wall += seconds


def _inject(fail: Mapping[str, Injection], step: str) -> None:
    action = fail.get(step)
    if action is None:
        return
    if isinstance(action, BaseException):
        raise action
    action()


def _inject_for(fail: Mapping[str, Injection], step: str, xid: Xid) -> None:
    """Like :func:`_inject`; an injected ``ResourceError`` names the xid's transaction and branch, as
    ``xa.pg`` does (the injected object itself is not changed: it may be shared between steps)."""
    try:
        _inject(fail, step)
    except ResourceError as exc:
        if exc.gtrid is not None:
            raise
        kwargs = {**exc._kwargs(), "gtrid": xid.gtrid, "branch": exc.branch or xid.bqual or ""}
        raise type(exc)(exc.message, **kwargs) from exc


@dataclass
class MemoryManager:
    """A resource manager (think: one PostgreSQL database) holding committed values and prepared branches."""

    key: str
    clock: FakeClock = field(default_factory=FakeClock)
    fail: dict[str, Injection] = field(default_factory=dict)  # recover / commit_branch / rollback_branch
    committed: list[str] = field(default_factory=list)
    prepared: dict[str, tuple[Xid, list[str]]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def branch(self, name: str, *, one_phase: bool = False, sort_key: str | None = None,
               fail: Mapping[str, Injection] | None = None, applies: bool = False) -> MemoryResource:
        """A new participant. ``applies``: when its injected commit failure fires, the effect happened anyway
        (a STOMP COMMIT that reached the broker but whose receipt was lost)."""
        return MemoryResource(self, name, one_phase, sort_key or name, dict(fail or {}), applies)

    def add_prepared(self, xid: Xid, values: Sequence[str] = ()) -> None:
        """A prepared branch created by someone else (another node, another format, an earlier process)."""
        self.prepared[str(xid)] = (Xid(xid.format_id, xid.gtrid, xid.bqual, self._now()), list(values))

    def _now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.clock.wall(), dt.UTC)

    def recover(self) -> Sequence[Xid]:
        self.calls.append("recover")
        _inject(self.fail, "recover")
        return [xid for xid, _ in self.prepared.values()]

    def commit_branch(self, xid: Xid) -> None:
        self.calls.append(f"commit_branch {xid.bqual}")
        _inject_for(self.fail, "commit_branch", xid)
        _, values = self._take(xid)
        self.committed.extend(values)

    def rollback_branch(self, xid: Xid) -> None:
        self.calls.append(f"rollback_branch {xid.bqual}")
        _inject_for(self.fail, "rollback_branch", xid)
        self._take(xid)

    def _take(self, xid: Xid) -> tuple[Xid, list[str]]:
        try:
            return self.prepared.pop(str(xid))
        except KeyError:
            raise BranchNotFound(f"no prepared branch {xid}", gtrid=xid.gtrid, branch=xid.bqual or "") from None


@dataclass
class MemoryResource:
    """One branch; enforces the call order of :class:`xa.resource.Resource`."""

    db: MemoryManager
    name: str
    one_phase_only: bool
    key: str
    fail: dict[str, Injection]
    applies: bool
    kind: str = "memory"
    xid: Xid | None = None
    pending: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)

    @property
    def manager(self) -> str:
        return self.db.key

    def sort_key(self) -> str:
        return self.key

    def _step(self, step: str, allowed_after: tuple[str, ...]) -> None:
        last = self.steps[-1] if self.steps else ""
        if last not in allowed_after:
            raise UsageError(f"branch {self.name}: {step} after {last or 'nothing'}")
        self.steps.append(step)
        self.db.calls.append(f"{step} {self.name}")

    def begin(self, xid: Xid) -> None:
        self._step("begin", ("",))
        self.xid = xid
        _inject(self.fail, "begin")

    def write(self, value: str) -> None:
        """The caller's work inside the branch."""
        if self.steps != ["begin"]:
            raise UsageError(f"branch {self.name}: work outside an active branch ({self.steps})")
        self.pending.append(value)

    def prepare(self) -> None:
        self._step("prepare", ("begin",))
        _inject(self.fail, "prepare")
        if not self.one_phase_only:
            assert self.xid is not None
            self.db.add_prepared(self.xid, self.pending)

    def commit(self) -> None:
        self._step("commit", ("prepare",))
        assert self.xid is not None
        try:
            _inject(self.fail, "commit")
        except BaseException:
            if self.applies:
                self._apply()
            raise
        self._apply()

    def _apply(self) -> None:
        assert self.xid is not None
        if self.one_phase_only:
            self.db.committed.extend(self.pending)
        else:
            _, values = self.db._take(self.xid)
            self.db.committed.extend(values)

    def rollback(self) -> None:
        self._step("rollback", ("begin", "prepare"))
        assert self.xid is not None
        _inject(self.fail, "rollback")
        self.db.prepared.pop(str(self.xid), None)


class MemoryLog:
    """A recovery log in memory. ``fail`` injects a failure into the next append of a record type (by class
    name, e.g. ``{"Commit": LogWriteFailed("disk full")}``); with ``written=True`` in :meth:`fail_after_write`
    the record is kept although the append raised (a sync that failed after the write)."""

    def __init__(self, node: NodeId, calls: list[str] | None = None) -> None:
        self._node = node
        self.calls = calls if calls is not None else []  # share a manager's ``calls`` for one timeline
        self.records: list[Record] = []
        self.durable: list[bool] = []
        self.fail: dict[str, BaseException] = {}
        self._keep_on_failure: set[str] = set()
        self.failed = False

    @property
    def node(self) -> NodeId:
        return self._node

    def fail_after_write(self, kind: str, exc: BaseException) -> None:
        self.fail[kind] = exc
        self._keep_on_failure.add(kind)

    def append(self, record: Record, *, durable: bool) -> None:
        if self.failed:
            raise LogDurabilityUnknown("the log failed earlier")
        kind = type(record).__name__
        self.calls.append(f"log {kind}{' durable' if durable else ''}")
        exc = self.fail.pop(kind, None)
        if exc is not None:
            if kind in self._keep_on_failure:
                self.records.append(record)
                self.durable.append(False)
                self.failed = isinstance(exc, LogDurabilityUnknown)
            raise exc
        self.records.append(record)
        self.durable.append(durable)

    def live(self) -> Mapping[str, LiveTxn]:
        if self.failed:
            raise LogDurabilityUnknown("the log failed earlier")
        return fold(self.records)

    def reopened(self, *, keep_unsynced: bool = True) -> MemoryLog:
        """The log as a restarted process sees it (after a power loss when ``keep_unsynced`` is False: only the
        records up to the last durable one)."""
        again = MemoryLog(self._node)
        last = max((i for i, d in enumerate(self.durable) if d), default=-1)
        again.records = list(self.records if keep_unsynced else self.records[: last + 1])
        again.durable = [True] * len(again.records)
        return again

    def kinds(self) -> list[str]:
        return [type(r).__name__ for r in self.records]
