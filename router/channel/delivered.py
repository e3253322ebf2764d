"""The delivered-events journal: push delivery without one PostgreSQL commit per delivered event (issue 12).

A push proxy supplier used to delete each delivered event's queue row in its own commit. Now, once the consumer's
call returned, the proxy appends the events' ids to its own journal file (one ``write``, no ``fsync``) and deletes
the queue rows of many deliveries in one commit later (when :data:`FLUSH_EVENTS` are pending, after
:data:`FLUSH_AGE` seconds, when its queue has nothing more to deliver now and :data:`IDLE_FLUSH_EVENTS` are
pending or the oldest waited :data:`IDLE_FLUSH_AGE` seconds, or when it stops); after that commit
the journal is emptied. A write to a file survives the death of the process (SIGKILL included, the data is in the
kernel's page cache), so after a crash of the node :meth:`DeliveredJournals.replay` deletes, before the channels
load their queues, the rows of every event the journals name: a process crash delivers again at most the call
that was in flight, as before. Losing the journal's unsynced tail to a power failure only delivers those events
again (at-least-once; their rows were never deleted). Nothing is ever lost: an id is journaled only after its
delivery, a row is deleted only after its id was journaled or in the same step, and a journal that cannot be
written makes the proxy delete that delivery's rows at once, as before.

One file per push proxy, ``<dir>/<channel>-<admin>-<proxy>.ids``, appended by the proxy's single delivery thread:
one line per event, ``<decimal id> <delivery time, unix ms> <crc32 of the two, 8 hex digits>``. The delivery
time (when the consumer's call returned) is the ledger's ``acknowledged_at`` of the event, whenever its row is
deleted. Replay deletes only the rows of well-formed lines whose checksum matches: a torn write (a last line
without its newline, or a torn tail a later append ran into) never names an event, so an undelivered event is
never deleted (at worst a delivered one is pushed again).
A write that fails is cut back to the file's size before it; if even that fails, the journal is closed and marked
``unusable`` and its proxy deletes each delivery's rows at once from then on.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["FLUSH_AGE", "FLUSH_EVENTS", "IDLE_FLUSH_AGE", "IDLE_FLUSH_EVENTS", "DeliveredJournals", "ProxyJournal",
           "read_entries", "read_ids"]

log = logging.getLogger("nsjms.channel")

FLUSH_EVENTS = 256     # delivered events whose rows are deleted together, at most
FLUSH_AGE = 1.0        # seconds a delivered event's row waits at most for its delete
#: When the proxy's queue has nothing more to deliver now, the pending deletes run if this many are pending or the
#: oldest has waited IDLE_FLUSH_AGE seconds (else the dispatcher wakes at that age). Flushing at every idle moment
#: cost one commit per delivered batch once batches were confirmed in about 1 ms (round 7): at 250 events/s offered
#: the node made 1.85 PostgreSQL commits per event instead of about one.
IDLE_FLUSH_EVENTS = 32
IDLE_FLUSH_AGE = 0.1


class ProxyJournal:
    """The journal of one push proxy supplier; used by its delivery thread only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.unusable = False          # a failed write could not be cut back: the proxy stops journaling

    def record(self, ids: Iterable[int], delivered_at: float) -> None:
        """Append delivered event ids (raises ``OSError``: the caller then deletes their rows at once). A failed
        write is cut back to the size before it (a torn line must not prefix the next append); if that fails too,
        the journal becomes ``unusable`` (closed)."""
        if self._fd is None:
            raise OSError(f"the delivered-events journal {self.path} is closed")
        data = b"".join(_line(i, delivered_at) for i in ids)
        size = os.lseek(self._fd, 0, os.SEEK_END)
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError:
            try:
                os.ftruncate(self._fd, size)
            except OSError as exc:
                log.warning("could not cut back the delivered-events journal %s after a failed write (%s); the "
                            "proxy no longer uses it", self.path, exc)
                self.unusable = True
                self._close_fd()
            raise

    def clear(self) -> None:
        """Every journaled id's row is deleted: empty the file (a failure only leaves ids replay finds gone)."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError as exc:
            log.warning("could not empty the delivered-events journal %s: %s", self.path, exc)

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self, *, remove: bool = False) -> None:
        self._close_fd()
        if remove:
            self.path.unlink(missing_ok=True)


def _line(event_id: int, delivered_at: float) -> bytes:
    text = b"%d %d" % (event_id, int(delivered_at * 1000))
    return b"%s %08x\n" % (text, zlib.crc32(text))


def _parse(line: bytes) -> tuple[int, float] | None:
    """(id, delivery time) of one well-formed journal line, or None (torn, garbage, checksum mismatch)."""
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or len(parts[2]) != 8:
        return None
    try:
        crc = int(parts[2], 16)
    except ValueError:
        return None
    if zlib.crc32(parts[0] + b" " + parts[1]) != crc:
        return None
    return int(parts[0]), int(parts[1]) / 1000.0


def read_entries(path: Path) -> list[tuple[int, float]]:
    """(id, delivery time) of each event a journal file names, in order; a torn last line and malformed lines (a
    torn write that a later append completed, garbage, a checksum that does not match) are skipped, never read
    as another id."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    entries = []
    bad = 0
    for line in lines[:-1]:            # the part after the last newline is empty or a torn write
        entry = _parse(line)
        if entry is None:
            bad += 1
        else:
            entries.append(entry)
    if bad:
        log.warning("delivered-events journal %s: %d malformed line(s) ignored (their events stay queued)", path,
                    bad)
    return entries


def read_ids(path: Path) -> list[int]:
    """The ids a journal file names, in order (see :func:`read_entries`)."""
    return [i for i, _ in read_entries(path)]


class DeliveredJournals:
    """The journals of one node, in ``directory`` (created on first use, private)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def open(self, cid: int, aid: int, pid: int) -> ProxyJournal:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        return ProxyJournal(self.directory / f"{cid}-{aid}-{pid}.ids")

    def remove(self, cid: int, aid: int, pid: int) -> None:
        """The proxy is destroyed (its delivered rows deleted): its journal goes (never raises)."""
        try:
            (self.directory / f"{cid}-{aid}-{pid}.ids").unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not remove the delivered-events journal of proxy %d/%d/%d: %s", cid, aid, pid, exc)

    def replay(self, db: Any, store: Any) -> int:
        """At start, before the queues are loaded: delete the queue rows (ledger outcome ``delivered``) of every
        journaled event and remove the journals. Returns how many ids were named. A database error propagates
        (the start fails; the journals stay for the next one)."""
        if not self.directory.is_dir():
            return 0
        named = 0
        for path in sorted(self.directory.glob("*.ids")):
            try:
                cid, aid, pid = (int(p) for p in path.stem.split("-"))
            except ValueError:
                log.warning("ignoring %s: not a delivered-events journal name", path)
                continue
            entries = read_entries(path)
            ids = [i for i, _ in entries]
            if ids:
                with db.unit_of_work() as conn:
                    store.delete_deliveries(conn, cid, aid, pid, ids, acknowledged_at=dict(entries))
                named += len(ids)
            path.unlink()
        if named:
            log.info("delivered-events journals: %d delivered event(s) left the store after the restart", named)
        return named
