"""The recovery log: an append-only, checksummed file journal in the node's state directory.

One file per node, ``<state_dir>/xa-<node>.log`` (format: :mod:`xa.records`). Guarantees of :class:`FileLog`:

* ``append(record, durable=True)`` returns only after the record is on disk (``fdatasync``). Concurrent durable
  appends share one sync (group commit): a thread that finds its record already covered by another thread's
  sync returns without syncing again.
* ``append(record, durable=False)`` (PROGRESS, END) is written to the OS before it returns, so it survives a
  crash of the process (SIGKILL), but not necessarily a power loss; losing one only makes recovery redo work
  that is idempotent (commit of a branch already gone; re-send with the same dedupe id).
* A failed append raises :class:`~xa.errors.LogWriteFailed` only when the record is guaranteed absent (the tail
  was cut back and synced); otherwise :class:`~xa.errors.LogDurabilityUnknown`, and the log refuses every
  further write (after a failed fsync the kernel's page cache cannot be trusted: the node must reopen the log,
  i.e. restart, and let recovery read what is really on disk).
* Creating the file is atomic (``<file>.tmp``, synced, renamed, directory synced); a file with no valid frame
  at all is a crash during creation and is replaced by a fresh log. Opening cuts off a torn tail (and syncs
  the cut); a zero-filled page followed by valid records is a lost unsynced write (skipped, see
  :func:`xa.records.scan`); other damage followed by valid records raises :class:`~xa.errors.LogCorrupted`.
* Compaction: once ended transactions hold more than ``compact_bytes`` and more than half the file, the live
  records are rewritten to ``<file>.tmp``, synced, renamed over the log, and the directory synced. After the
  rename the log always writes to the new file; a failed directory fsync then fails the log (durability of the
  rename unknown). Compaction triggered by an END never makes that append fail (logged instead).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from .errors import LogCorrupted, LogDurabilityUnknown, LogError, LogWriteFailed, UsageError
from .records import End, Header, LiveTxn, Record, apply_record, fold, frame, scan
from .xid import NodeId

__all__ = ["FileLog", "FileOps", "RecoveryLog", "log_path"]

_log = logging.getLogger("xa.log")


class RecoveryLog(Protocol):
    """What the coordinator and recovery need from a log."""

    @property
    def node(self) -> NodeId:
        """The node whose decisions this log holds."""

    def append(self, record: Record, *, durable: bool) -> None:
        """Append ``record``; with ``durable`` return only once it is on stable storage. Raise
        :class:`LogWriteFailed` (record absent) or :class:`LogDurabilityUnknown` (may be present)."""

    def live(self) -> Mapping[str, LiveTxn]:
        """A snapshot of every transaction with records and no END, by gtrid."""


class FileOps:
    """The system calls the log uses, as a seam for fault injection in tests."""

    def write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def sync(self, fd: int) -> None:
        os.fdatasync(fd)

    def truncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)


def log_path(state_dir: Path, node: NodeId) -> Path:
    return Path(state_dir) / f"xa-{node.value}.log"


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileLog:
    """The file journal (see the module docstring). Thread-safe."""

    def __init__(self, state_dir: Path, node: NodeId, *, compact_bytes: int = 1 << 20,
                 ops: FileOps | None = None, wall: Callable[[], float] = time.time) -> None:
        self._node = node
        self._path = log_path(state_dir, node)
        self._ops = ops or FileOps()
        self._compact_bytes = compact_bytes
        self._lock = threading.Lock()  # file offset, live map, fd swap
        self._sync_lock = threading.Lock()  # one fsync at a time; taken BEFORE _lock when both are needed
        self._live: dict[str, LiveTxn] = {}
        self._sizes: dict[str, int] = {}
        self._dead = 0
        self._failed: str | None = None
        try:
            self._fd, self._end = self._open(wall())
        except OSError as exc:
            raise LogError(f"cannot open the recovery log {self._path}: {exc}") from exc
        self._synced = self._end

    # ------------------------------------------------------------------------------------- opening
    @property
    def node(self) -> NodeId:
        return self._node

    @property
    def path(self) -> Path:
        return self._path

    def _open(self, wall: float) -> tuple[int, int]:
        if self._path.exists():
            fd = os.open(self._path, os.O_RDWR)
            try:
                data = os.pread(fd, os.fstat(fd).st_size, 0)
                records, valid = scan(data)
                if records:
                    return fd, self._load(fd, data, records, valid)
            except BaseException:
                os.close(fd)
                raise
            # No valid frame at all (a crash while an older version created the file): nothing to lose.
            os.close(fd)
            _log.warning("recovery log %s holds no valid record (%d bytes): starting a fresh log", self._path,
                         len(data))
        self._header = Header(self._node.value, wall)
        fd = self._install([self._header])
        try:
            _sync_dir(self._path.parent)
        except BaseException:
            os.close(fd)
            raise
        return fd, os.lseek(fd, 0, os.SEEK_END)

    def _load(self, fd: int, data: bytes, records: list[Record], valid: int) -> int:
        self._header = self._check_header(records)
        if valid < len(data):  # torn last write: cut it off for good
            self._ops.truncate(fd, valid)
            self._ops.sync(fd)
        for record in records[1:]:
            self._track(record, len(frame(record)))
        os.lseek(fd, valid, os.SEEK_SET)
        return valid

    def _check_header(self, records: list[Record]) -> Header:
        head = records[0] if records else None
        if not isinstance(head, Header):
            raise LogCorrupted(f"{self._path} does not start with a header record")
        if head.node != self._node.value:
            raise UsageError(f"{self._path} is the log of node {head.node!r}, not {self._node.value!r}")
        return head

    def _install(self, records: list[Record]) -> int:
        """Write ``records`` to ``<file>.tmp``, sync it and rename it over the log; returns its open fd. The
        caller syncs the directory. On failure nothing was renamed (the log, if any, is untouched)."""
        tmp = self._path.with_name(self._path.name + ".tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            self._ops.write(fd, b"".join(frame(r) for r in records))
            self._ops.sync(fd)
            os.replace(tmp, self._path)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return fd

    def _track(self, record: Record, size: int) -> None:
        apply_record(self._live, record)
        gtrid = getattr(record, "gtrid", None)
        if gtrid is None:
            return
        self._sizes[gtrid] = self._sizes.get(gtrid, 0) + size
        if isinstance(record, End):
            self._dead += self._sizes.pop(gtrid)

    # ------------------------------------------------------------------------------------ appending
    def append(self, record: Record, *, durable: bool) -> None:
        data = frame(record)
        with self._lock:
            self._write(data)
            self._track(record, len(data))
            end = self._end
        if durable:
            self._sync_to(end)
        elif isinstance(record, End):
            try:
                self._maybe_compact()
            except LogError as exc:  # the END itself is written: compaction is housekeeping
                _log.error("recovery log %s: compaction failed: %s", self._path, exc)

    def _write(self, data: bytes) -> None:
        if self._failed is not None:
            raise LogDurabilityUnknown(f"the recovery log refuses writes after an earlier failure: {self._failed}")
        start = self._end
        try:
            self._ops.write(self._fd, data)
        except OSError as exc:
            self._undo(start, exc)
        self._end = start + len(data)

    def _undo(self, start: int, exc: OSError) -> None:
        try:
            self._ops.truncate(self._fd, start)
            self._ops.sync(self._fd)
            os.lseek(self._fd, start, os.SEEK_SET)
        except OSError as again:
            self._failed = f"write failed ({exc}) and could not be undone ({again})"
            raise LogDurabilityUnknown(self._failed) from exc
        raise LogWriteFailed(f"recovery log write failed, record not written: {exc}") from exc

    def _sync_to(self, end: int) -> None:
        with self._sync_lock:
            if self._synced >= end:
                return  # another thread's sync covered this record (group commit)
            with self._lock:
                if self._failed is not None:
                    raise LogDurabilityUnknown(f"the recovery log failed earlier: {self._failed}")
                target, fd = self._end, self._fd
            try:
                self._ops.sync(fd)
            except OSError as exc:
                with self._lock:
                    self._failed = f"fsync failed: {exc}"
                raise LogDurabilityUnknown(f"recovery log fsync failed: {exc}") from exc
            self._synced = target

    def live(self) -> Mapping[str, LiveTxn]:
        """Refuses after a durability failure: memory may then hold a record the disk does not."""
        with self._lock:
            if self._failed is not None:
                raise LogDurabilityUnknown(f"the recovery log failed earlier: {self._failed}")
            return fold([r for txn in self._live.values() for r in txn.records()])

    # ----------------------------------------------------------------------------------- compaction
    def _maybe_compact(self) -> None:
        with self._lock:
            due = self._dead >= self._compact_bytes and self._dead * 2 >= self._end
        if due:
            self.compact()

    def compact(self) -> None:
        """Rewrite the live records to a new file and atomically replace the log with it."""
        with self._sync_lock, self._lock:
            if self._failed is not None:
                raise LogDurabilityUnknown(f"the recovery log failed earlier: {self._failed}")
            records: list[Record] = [self._header]
            records += [r for txn in self._live.values() for r in txn.records()]
            try:
                fd = self._install(records)
            except OSError as exc:
                raise LogWriteFailed(f"recovery log compaction failed (the old log is intact): {exc}") from exc
            # The new file IS the log now: every later record must go to it, whatever happens next.
            old, self._fd = self._fd, fd
            os.close(old)
            self._end = self._synced = os.lseek(fd, 0, os.SEEK_END)
            self._sizes = {t.gtrid: sum(len(frame(r)) for r in t.records()) for t in self._live.values()}
            self._dead = 0
            try:
                _sync_dir(self._path.parent)
            except OSError as exc:
                # The rename may not survive a power loss (the old file would come back without the records
                # appended from now on): refuse further writes until a restart reads what is really on disk.
                self._failed = f"directory fsync after compaction failed: {exc}"
                raise LogDurabilityUnknown(f"recovery log compaction: {self._failed}") from exc

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def size(self) -> int:
        with self._lock:
            return self._end

    def close(self) -> None:
        with self._sync_lock, self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
