"""The recovery log: framing, durability calls, torn tails, garbage, corruption, failures, compaction."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xa.log as xlog
from xa.errors import HeuristicKind, LogCorrupted, LogDurabilityUnknown, LogError, LogWriteFailed, UsageError
from xa.log import FileLog, FileOps, log_path
from xa.records import (
    Commit,
    End,
    Header,
    Heuristic,
    Participant,
    Progress,
    Record,
    Rollback,
    fold,
    frame,
    scan,
)
from xa.xid import NodeId

NODE = NodeId("n1")
PARTS = (Participant("queue", "postgresql", "pg", False), Participant("stomp", "stomp-send", "broker", True))


def gtrid(i: int) -> str:
    return f"n1:{i:024x}"


def commit(i: int) -> Commit:
    return Commit(gtrid(i), PARTS, 1000.0 + i, 900.0 + i)


class CountingOps(FileOps):
    def __init__(self) -> None:
        self.syncs = 0
        self.fail_write: OSError | None = None
        self.partial = 0
        self.fail_sync: OSError | None = None
        self.fail_truncate: OSError | None = None

    def write(self, fd: int, data: bytes) -> None:
        if self.fail_write is not None:
            if self.partial:
                os.write(fd, data[: self.partial])  # a torn write: part of the record reached the file
            raise self.fail_write
        super().write(fd, data)

    def sync(self, fd: int) -> None:
        if self.fail_sync is not None:
            raise self.fail_sync
        self.syncs += 1
        super().sync(fd)

    def truncate(self, fd: int, length: int) -> None:
        if self.fail_truncate is not None:
            raise self.fail_truncate
        super().truncate(fd, length)


# ------------------------------------------------------------------------------------------- basics
def test_create_syncs_file_and_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced_dirs: list[Path] = []
    real = xlog._sync_dir

    def sync_dir(path: Path) -> None:
        synced_dirs.append(path)
        real(path)

    monkeypatch.setattr(xlog, "_sync_dir", sync_dir)
    ops = CountingOps()
    log = FileLog(tmp_path, NODE, ops=ops, wall=lambda: 5.0)
    assert log.path == log_path(tmp_path, NODE) and log.path.exists()
    assert ops.syncs == 1 and synced_dirs == [tmp_path]
    records, valid = scan(log.path.read_bytes())
    assert records == [Header("n1", 5.0)] and valid == log.path.stat().st_size
    log.close()


def test_records_survive_reopen_and_end_forgets(tmp_path: Path) -> None:
    log = FileLog(tmp_path, NODE)
    log.append(commit(1), durable=True)
    log.append(commit(2), durable=True)
    log.append(Progress(gtrid(2), ("queue",), ("stomp",), 1.0), durable=False)
    log.append(End(gtrid(1), 2.0), durable=False)
    log.close()
    again = FileLog(tmp_path, NODE)
    live = again.live()
    assert list(live) == [gtrid(2)]
    assert live[gtrid(2)].commit == commit(2)
    assert live[gtrid(2)].done == {"queue"} and live[gtrid(2)].unknown == {"stomp"}
    again.close()


def test_durable_append_syncs_and_lazy_append_does_not(tmp_path: Path) -> None:
    ops = CountingOps()
    log = FileLog(tmp_path, NODE, ops=ops)
    base = ops.syncs
    log.append(End(gtrid(9), 1.0), durable=False)
    assert ops.syncs == base
    log.append(commit(1), durable=True)
    assert ops.syncs == base + 1
    log.close()


def test_log_of_another_node_is_refused(tmp_path: Path) -> None:
    FileLog(tmp_path, NODE).close()
    os.rename(log_path(tmp_path, NODE), log_path(tmp_path, NodeId("n2")))
    with pytest.raises(UsageError, match="log of node 'n1'"):
        FileLog(tmp_path, NodeId("n2"))


def test_takeover_node_opens_a_dead_nodes_log_under_its_id(tmp_path: Path) -> None:
    dead = FileLog(tmp_path, NodeId("n1"))
    dead.append(commit(1), durable=True)
    dead.close()
    taken = FileLog(tmp_path, NodeId("n1"))  # another process, the dead node's id and state dir
    assert gtrid(1) in taken.live()
    taken.close()


# ------------------------------------------------------------------------------------ torn / garbage
def _log_with(tmp_path: Path, records: list[Record]) -> tuple[Path, list[int]]:
    log = FileLog(tmp_path, NODE, wall=lambda: 0.0)
    ends = [log.size()]
    for r in records:
        log.append(r, durable=True)
        ends.append(log.size())
    log.close()
    return log.path, ends


def test_every_cut_inside_the_last_record_is_a_torn_tail(tmp_path: Path) -> None:
    path, ends = _log_with(tmp_path, [commit(1), commit(2), commit(3)])
    full = path.read_bytes()
    for cut in range(ends[2] + 1, ends[3]):
        path.write_bytes(full[:cut])
        log = FileLog(tmp_path, NODE)
        assert set(log.live()) == {gtrid(1), gtrid(2)}
        assert path.stat().st_size == ends[2]  # the torn tail was cut off on open
        log.append(commit(4), durable=True)  # and appending continues on a clean boundary
        log.close()
        assert set(FileLog(tmp_path, NODE).live()) == {gtrid(1), gtrid(2), gtrid(4)}


@pytest.mark.parametrize("tail", [b"\x00" * 4096, b"\xff" * 3, b"garbage that is not a frame", b"\x00\x00\x00\x05ab"])
def test_garbage_tail_is_ignored_and_truncated(tmp_path: Path, tail: bytes) -> None:
    path, ends = _log_with(tmp_path, [commit(1)])
    with path.open("ab") as f:
        f.write(tail)
    log = FileLog(tmp_path, NODE)
    assert set(log.live()) == {gtrid(1)}
    assert path.stat().st_size == ends[-1]
    log.close()


def test_damage_followed_by_valid_records_is_corruption(tmp_path: Path) -> None:
    path, ends = _log_with(tmp_path, [commit(1), commit(2), commit(3)])
    data = bytearray(path.read_bytes())
    data[ends[1] + 12] ^= 0xFF  # flip a byte inside commit(2)'s payload
    path.write_bytes(bytes(data))
    with pytest.raises(LogCorrupted):
        FileLog(tmp_path, NODE)
    assert path.read_bytes() == bytes(data)  # nothing was cut: an operator decides


@pytest.mark.parametrize("payload", [b'{"type":"NOPE"}', b"[1, 2]", b'"text"', b'{"type":"END"}', b"\xff\xfe"])
def test_checksum_valid_but_undecodable_record_is_corruption(tmp_path: Path, payload: bytes) -> None:
    path, _ = _log_with(tmp_path, [commit(1)])
    import struct
    import zlib
    with path.open("ab") as f:
        f.write(struct.pack(">II", len(payload), zlib.crc32(payload)) + payload)
    with pytest.raises(LogCorrupted):
        FileLog(tmp_path, NODE)


def test_missing_header_is_corruption(tmp_path: Path) -> None:
    log_path(tmp_path, NODE).write_bytes(frame(commit(1)))
    with pytest.raises(LogCorrupted):
        FileLog(tmp_path, NODE)


# ----------------------------------------------------------------------------------------- failures
def test_failed_write_is_undone_and_reported_as_not_written(tmp_path: Path) -> None:
    ops = CountingOps()
    log = FileLog(tmp_path, NODE, ops=ops)
    log.append(commit(1), durable=True)
    ops.fail_write, ops.partial = OSError(28, "No space left on device"), 10
    with pytest.raises(LogWriteFailed):
        log.append(commit(2), durable=True)
    ops.fail_write = None
    log.append(commit(3), durable=True)  # still usable
    log.close()
    assert set(FileLog(tmp_path, NODE).live()) == {gtrid(1), gtrid(3)}


def test_write_failure_that_cannot_be_undone_poisons_the_log(tmp_path: Path) -> None:
    ops = CountingOps()
    log = FileLog(tmp_path, NODE, ops=ops)
    ops.fail_write, ops.partial, ops.fail_truncate = OSError(5, "EIO"), 10, OSError(5, "EIO")
    with pytest.raises(LogDurabilityUnknown):
        log.append(commit(1), durable=True)
    ops.fail_write = ops.fail_truncate = None
    with pytest.raises(LogDurabilityUnknown):
        log.append(commit(2), durable=True)
    with pytest.raises(LogDurabilityUnknown):
        log.live()
    log.close()
    assert set(FileLog(tmp_path, NODE).live()) == set()  # the torn record was cut off on reopen


def test_fsync_failure_poisons_the_log(tmp_path: Path) -> None:
    ops = CountingOps()
    log = FileLog(tmp_path, NODE, ops=ops)
    ops.fail_sync = OSError(5, "EIO")
    with pytest.raises(LogDurabilityUnknown):
        log.append(commit(1), durable=True)
    ops.fail_sync = None
    with pytest.raises(LogDurabilityUnknown):
        log.append(End(gtrid(1), 1.0), durable=False)
    with pytest.raises(LogDurabilityUnknown):
        log.live()
    log.close()


def test_concurrent_durable_appends_all_land(tmp_path: Path) -> None:
    ops = CountingOps()
    log = FileLog(tmp_path, NODE, ops=ops)
    base = ops.syncs

    def work(t: int) -> None:
        for i in range(25):
            log.append(commit(t * 1000 + i), durable=True)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ops.syncs - base <= 200  # group commit: never more syncs than appends
    log.close()
    assert len(FileLog(tmp_path, NODE).live()) == 200


# --------------------------------------------------------------------------------------- compaction
def test_compaction_keeps_live_records_only(tmp_path: Path) -> None:
    log = FileLog(tmp_path, NODE, compact_bytes=2000)
    log.append(commit(0), durable=True)
    log.append(Progress(gtrid(0), ("queue",), ("stomp",), 3.0), durable=False)
    log.append(Heuristic(gtrid(9999), HeuristicKind.MIXED, "queue", "operator:alice", "checked", 4.0), durable=True)
    biggest = 0
    for i in range(1, 200):
        log.append(commit(i), durable=True)
        log.append(End(gtrid(i), 5.0), durable=False)
        biggest = max(biggest, log.size())
    assert log.size() < biggest  # it shrank at least once
    assert not log.path.with_name(log.path.name + ".tmp").exists()
    expected = {g: (t.commit, t.done, t.unknown, t.heuristics) for g, t in log.live().items()}
    assert set(expected) == {gtrid(0), gtrid(9999)}
    log.append(commit(500), durable=True)
    log.close()
    again = FileLog(tmp_path, NODE)
    got = {g: (t.commit, t.done, t.unknown, t.heuristics) for g, t in again.live().items()}
    assert got == {**expected, gtrid(500): (commit(500), set(), set(), [])}
    again.close()


def test_explicit_compaction_of_an_empty_log(tmp_path: Path) -> None:
    log = FileLog(tmp_path, NODE, wall=lambda: 7.0)
    log.append(commit(1), durable=True)
    log.append(End(gtrid(1), 1.0), durable=False)
    log.compact()
    assert scan(log.path.read_bytes())[0] == [Header("n1", 7.0)]
    log.close()


# ------------------------------------------------------------------------------------------ property
participants = st.lists(st.builds(Participant, st.sampled_from(["queue", "outbox", "inbox", "stomp"]),
                                  st.just("postgresql"), st.just("pg"), st.booleans()), max_size=4)
gtrids = st.integers(0, 2**32).map(gtrid)
times = st.floats(0, 2e9, allow_nan=False)
records = st.one_of(
    st.builds(Commit, gtrids, participants.map(tuple), st.none() | times, times),
    st.builds(Rollback, gtrids, participants.map(tuple), st.text(max_size=40), times),
    st.builds(Progress, gtrids, st.lists(st.text(max_size=8)).map(tuple), st.lists(st.text(max_size=8)).map(tuple),
              times),
    st.builds(End, gtrids, times, st.text(max_size=10)),
    st.builds(Heuristic, gtrids, st.sampled_from(list(HeuristicKind)), st.text(max_size=8), st.text(max_size=12),
              st.text(max_size=30), times),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(records, max_size=12), st.data())
def test_any_prefix_parses_to_a_prefix_of_the_records(items: list[Record], data: st.DataObject) -> None:
    full: list[Record] = [Header("n1", 1.0), *items]
    frames = [frame(r) for r in full]
    blob = b"".join(frames)
    cut = data.draw(st.integers(0, len(blob)))
    got, valid = scan(blob[:cut])
    assert got == full[: len(got)]
    assert valid == sum(len(f) for f in frames[: len(got)])
    assert cut - valid < len(frames[len(got)]) if len(got) < len(full) else valid == cut


@settings(max_examples=150, deadline=None)
@given(st.lists(records, max_size=6), st.binary(max_size=64))
def test_garbage_after_a_valid_log_is_never_a_record(items: list[Record], garbage: bytes) -> None:
    full: list[Record] = [Header("n1", 1.0), *items]
    blob = b"".join(frame(r) for r in full)
    got, valid = scan(blob + garbage)
    assert got == full and valid == len(blob)


def test_fold_matches_log_semantics() -> None:
    live = fold([commit(1), Progress(gtrid(1), ("queue",), ("stomp",), 1.0), Progress(gtrid(1), ("stomp",), (), 2.0)])
    assert live[gtrid(1)].done == {"queue", "stomp"} and live[gtrid(1)].unknown == set()


# ------------------------------------------------------------------------- review regressions (ab12)
def _open_fds_under(directory: Path) -> list[str]:
    """Paths (possibly "(deleted)") of this process's open fds that point into ``directory``."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(str(directory)):
            out.append(target)
    return out


def test_failed_directory_fsync_after_the_compaction_rename(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """t_compact.py: the rename happened, so the log must switch to the new file; a failed directory fsync
    leaves the rename's durability unknown (the log refuses writes), never "old log intact" with appends going
    to the deleted old file; the failure does not escape from the END append that triggered it."""
    log = FileLog(tmp_path, NODE, compact_bytes=200)
    log.append(commit(1), durable=True)  # live across the compaction
    real = xlog._sync_dir

    def failing(path: Path) -> None:
        raise OSError(5, "EIO on directory fsync")

    monkeypatch.setattr(xlog, "_sync_dir", failing)
    i = 1000
    with pytest.raises(LogDurabilityUnknown):  # the END appends succeed; the next write is refused
        while i < 1500:
            log.append(commit(i), durable=True)
            log.append(End(gtrid(i), 2.0), durable=False)
            i += 1
    monkeypatch.setattr(xlog, "_sync_dir", real)
    refused = i  # the write that was refused
    assert refused < 1500
    with pytest.raises(LogDurabilityUnknown):
        log.live()
    log.close()
    assert _open_fds_under(tmp_path) == []  # neither the old nor the new fd leaked
    again = FileLog(tmp_path, NODE)
    live = again.live()
    assert gtrid(1) in live  # every acknowledged COMMIT without END survived
    assert gtrid(refused) not in live or live[gtrid(refused)].commit == commit(refused)
    assert [g for g in live if g not in (gtrid(1), gtrid(refused))] == []
    again.close()


def test_failed_rename_during_compaction_keeps_the_old_log_and_leaks_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = FileLog(tmp_path, NODE, compact_bytes=200)
    log.append(commit(1), durable=True)
    real = os.replace

    def failing(src: str, dst: str) -> None:
        if Path(dst) == log.path:
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    for i in range(1000, 1030):  # compaction is due and fails at every END: the ENDs are still written
        log.append(commit(i), durable=True)
        log.append(End(gtrid(i), 2.0), durable=False)
    monkeypatch.setattr(os, "replace", real)
    assert [p for p in _open_fds_under(tmp_path) if not p.endswith(log.path.name)] == []
    assert not log.path.with_name(log.path.name + ".tmp").exists()
    log.append(commit(2), durable=True)
    assert set(log.live()) == {gtrid(1), gtrid(2)}
    log.close()
    assert set(FileLog(tmp_path, NODE).live()) == {gtrid(1), gtrid(2)}


@pytest.mark.parametrize("content", [b"", frame(Header("n1", 1.0))[:7], frame(Header("n1", 1.0))[:-1],
                                     bytes(64)], ids=["empty", "torn-length", "torn-payload", "zeros"])
def test_a_crash_while_creating_the_log_does_not_block_every_later_open(tmp_path: Path, content: bytes) -> None:
    """t_empty.py: a file with no valid frame at all holds nothing to lose: it is a fresh log."""
    log_path(tmp_path, NODE).write_bytes(content)
    log = FileLog(tmp_path, NODE, wall=lambda: 9.0)
    log.append(commit(1), durable=True)
    log.close()
    records, _ = scan(log_path(tmp_path, NODE).read_bytes())
    assert records == [Header("n1", 9.0), commit(1)]


def test_creation_is_atomic(tmp_path: Path) -> None:
    """A failure (crash) before the header is durable leaves no log file at all, so the next open creates one."""
    ops = CountingOps()
    ops.fail_sync = OSError(5, "EIO")
    with pytest.raises(LogError):
        FileLog(tmp_path, NODE, ops=ops)
    assert not log_path(tmp_path, NODE).exists() and _open_fds_under(tmp_path) == []
    assert FileLog(tmp_path, NODE).live() == {}


def test_a_lost_unsynced_page_in_the_middle_of_the_tail_is_not_corruption(tmp_path: Path) -> None:
    """t_midloss.py (corrected: the script zeroed a page past the end of the file, which is only a zero tail):
    after a power loss a page of the UNSYNCED tail may read back as zeros while a later page reached the disk.
    Nothing after such a hole was ever synced, so the log opens; every synced record is kept, the records after
    the hole too."""
    big = tuple(Participant(f"b{i}", "postgresql", "pg", False) for i in range(30))
    log = FileLog(tmp_path, NODE)
    synced_ones = [Commit(gtrid(i), big, None, 1.0) for i in range(5)]
    for c in synced_ones:
        log.append(c, durable=True)
    synced = log.size()
    for i in range(5, 40):
        log.append(Commit(gtrid(i), big, None, 1.0), durable=False)
    log.close()
    data = bytearray(log.path.read_bytes())
    start = -(-synced // 4096) * 4096
    assert start + 4096 < len(data) - 3000  # the hole is followed by whole records
    data[start:start + 4096] = bytes(4096)
    log.path.write_bytes(bytes(data))
    again = FileLog(tmp_path, NODE)
    live = again.live()
    assert all(live[c.gtrid].commit == c for c in synced_ones)
    assert gtrid(39) in live and len(live) < 40  # the records in the hole are lost, the later ones kept
    again.append(commit(100), durable=True)
    again.close()
    assert gtrid(100) in FileLog(tmp_path, NODE).live()


def test_damage_that_is_not_a_zero_page_followed_by_records_is_still_corruption(tmp_path: Path) -> None:
    path, _ = _log_with(tmp_path, [commit(i) for i in range(60)])
    data = bytearray(path.read_bytes())
    data[4096:8192] = bytes([0x5A]) * 4096  # a page of garbage, not of zeros
    path.write_bytes(bytes(data))
    with pytest.raises(LogCorrupted):
        FileLog(tmp_path, NODE)
