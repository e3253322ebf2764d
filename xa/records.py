"""Records of the recovery log, their on-disk framing, and the fold that turns records into live transactions.

Frame (all integers big-endian)::

    +----------------+----------------+---------------------------+
    | length: u32    | crc32: u32     | payload: `length` bytes   |   payload = UTF-8 JSON object
    +----------------+----------------+---------------------------+

The crc32 covers the payload. The first frame of a file is a HEADER (node id, format version). A reader stops
at the first frame that is incomplete or fails its checksum; if no valid frame follows it anywhere in the rest
of the file, that tail is a torn last write and is cut off (:func:`scan`). A bad stretch followed by a valid
frame is a lost unsynced write (skipped) if it holds a page-aligned page of zeros, otherwise damage, not a torn
write: :class:`~xa.errors.LogCorrupted`.
"""

from __future__ import annotations

import enum
import json
import logging
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import HeuristicKind, LogCorrupted

__all__ = [
    "Commit", "End", "Header", "Heuristic", "Kind", "LiveTxn", "Participant", "Progress", "Record", "Rollback",
    "decode", "encode", "fold", "frame", "scan",
]

_log = logging.getLogger("xa.log")

FORMAT_VERSION = 1
MAX_PAYLOAD = 1 << 20
_HEAD = struct.Struct(">II")


class Kind(enum.StrEnum):
    HEADER = "HEADER"
    COMMIT = "COMMIT"  # the decision: durable before any phase-two call
    ROLLBACK = "ROLLBACK"  # rollback decided but some branch could not be rolled back (recovery finishes it)
    PROGRESS = "PROGRESS"  # phase two ended incompletely: which branches are done, which are unknown
    END = "END"  # every branch finished (or an operator forgot the transaction): the log may drop it
    HEURISTIC = "HEURISTIC"  # a participant or an operator decided on its own: who, when, why


@dataclass(frozen=True)
class Participant:
    """A branch as the COMMIT record names it."""

    name: str
    kind: str
    manager: str
    one_phase: bool


@dataclass(frozen=True)
class Header:
    node: str
    created: float
    version: int = FORMAT_VERSION


@dataclass(frozen=True)
class Commit:
    gtrid: str
    participants: tuple[Participant, ...]
    deadline: float | None  # wall-clock seconds; informative (the decision was taken before it)
    at: float


@dataclass(frozen=True)
class Rollback:
    gtrid: str
    participants: tuple[Participant, ...]
    reason: str
    at: float


@dataclass(frozen=True)
class Progress:
    gtrid: str
    done: tuple[str, ...]
    unknown: tuple[str, ...]
    at: float


@dataclass(frozen=True)
class End:
    gtrid: str
    at: float
    who: str = ""  # set when an operator forgot a heuristic outcome


@dataclass(frozen=True)
class Heuristic:
    gtrid: str
    kind: HeuristicKind
    branch: str
    who: str
    why: str
    at: float


Record = Header | Commit | Rollback | Progress | End | Heuristic
_KINDS: dict[type[Any], Kind] = {
    Header: Kind.HEADER, Commit: Kind.COMMIT, Rollback: Kind.ROLLBACK, Progress: Kind.PROGRESS,
    End: Kind.END, Heuristic: Kind.HEURISTIC,
}


# ----------------------------------------------------------------------------------------- encoding
def encode(record: Record) -> bytes:
    """The JSON payload of ``record`` (keys sorted, so equal records give equal bytes)."""
    body: dict[str, Any] = {"type": _KINDS[type(record)].value}
    for name, value in vars(record).items():
        if name == "participants":
            value = [vars(p) for p in value]
        elif isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, enum.Enum):
            value = value.value
        body[name] = value
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


_UNDECODABLE = (ValueError, KeyError, TypeError, AttributeError)  # UnicodeDecodeError is a ValueError


def decode(payload: bytes) -> Record:
    """The record of a payload; ValueError/KeyError/TypeError on anything that is not one."""
    body = json.loads(payload.decode())
    kind = Kind(body.pop("type"))
    if kind is Kind.HEADER:
        return Header(node=str(body["node"]), created=float(body["created"]), version=int(body["version"]))
    if kind is Kind.COMMIT:
        return Commit(str(body["gtrid"]), _participants(body["participants"]), _opt_float(body["deadline"]),
                      float(body["at"]))
    if kind is Kind.ROLLBACK:
        return Rollback(str(body["gtrid"]), _participants(body["participants"]), str(body["reason"]),
                        float(body["at"]))
    if kind is Kind.PROGRESS:
        return Progress(str(body["gtrid"]), _strs(body["done"]), _strs(body["unknown"]), float(body["at"]))
    if kind is Kind.END:
        return End(str(body["gtrid"]), float(body["at"]), str(body["who"]))
    return Heuristic(str(body["gtrid"]), HeuristicKind(body["kind"]),
                     str(body["branch"]), str(body["who"]), str(body["why"]), float(body["at"]))


def _participants(raw: Iterable[Mapping[str, Any]]) -> tuple[Participant, ...]:
    return tuple(Participant(str(p["name"]), str(p["kind"]), str(p["manager"]), bool(p["one_phase"]))
                 for p in raw)


def _strs(raw: Iterable[Any]) -> tuple[str, ...]:
    return tuple(str(x) for x in raw)


def _opt_float(raw: Any) -> float | None:
    return None if raw is None else float(raw)


def frame(record: Record) -> bytes:
    """One framed record: length, crc32, payload."""
    payload = encode(record)
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"record of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    return _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def _frame_at(data: bytes, offset: int) -> tuple[bytes, int] | None:
    """(payload, next offset) of a checksum-valid frame at ``offset``, or None."""
    if offset + _HEAD.size > len(data):
        return None
    length, crc = _HEAD.unpack_from(data, offset)
    end = offset + _HEAD.size + length
    if length == 0 or length > MAX_PAYLOAD or end > len(data):  # a zero-filled tail is never a frame
        return None
    payload = data[offset + _HEAD.size:end]
    return (payload, end) if zlib.crc32(payload) == crc else None


def scan(data: bytes) -> tuple[list[Record], int]:
    """The records of a log image and the end of its last valid record (where a torn tail starts).

    A damaged stretch followed by valid records is a LOST UNSYNCED WRITE, skipped, when it contains a
    page-aligned block of :data:`PAGE` zero bytes: after a power loss, a page of the unsynced tail that never
    reached the disk reads back as zeros while a later page did reach it. Nothing after such a hole was ever
    synced (a successful fsync would have written the hole too), so what is lost is what the durability
    contract allows to lose; the records after it are kept. Raises :class:`LogCorrupted` for any other damage
    followed by a valid record, or a checksum-valid frame that does not decode (written by something else, or
    by a newer version).
    """
    records: list[Record] = []
    offset = 0
    while True:
        while (found := _frame_at(data, offset)) is not None:
            payload, end = found
            try:
                records.append(decode(payload))
            except _UNDECODABLE as exc:
                raise LogCorrupted(f"undecodable record at byte {offset}: {exc}") from exc
            offset = end
        following = _next_record(data, offset) if offset < len(data) else None
        if following is None:
            return records, offset
        if not _lost_page(data, offset, following):
            raise LogCorrupted(f"damaged record at byte {offset} followed by a valid record at byte {following}")
        _log.warning("recovery log: bytes %d-%d are a lost unsynced write (a zero-filled page): skipped",
                     offset, following)
        offset = following


#: the unit in which an unsynced write can be lost (the page cache's page, the file system's block)
PAGE = 4096


def _lost_page(data: bytes, start: int, end: int) -> bool:
    """Whether ``data[start:end]`` contains a page-aligned page of zeros."""
    page = -(-start // PAGE) * PAGE
    while page + PAGE <= end:
        if not any(data[page:page + PAGE]):
            return True
        page += PAGE
    return False


def _next_record(data: bytes, start: int) -> int | None:
    """The offset of the first decodable, checksum-valid frame after ``start``, or None."""
    for candidate in range(start + 1, len(data) - _HEAD.size + 1):
        found = _frame_at(data, candidate)
        if found is None:
            continue
        try:
            decode(found[0])
        except _UNDECODABLE:
            continue
        return candidate
    return None


# ---------------------------------------------------------------------------------------------- fold
@dataclass
class LiveTxn:
    """What the log knows about one transaction that has not ended."""

    gtrid: str
    commit: Commit | None = None
    rollback: Rollback | None = None
    done: set[str] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)
    heuristics: list[Heuristic] = field(default_factory=list)

    def records(self) -> list[Record]:
        """The minimal records that rebuild this state (what compaction keeps)."""
        decisions = [r for r in (self.commit, self.rollback) if r is not None]
        out: list[Record] = list(decisions)
        if self.done or self.unknown:
            at = max((r.at for r in decisions), default=0.0)
            out.append(Progress(self.gtrid, tuple(sorted(self.done)), tuple(sorted(self.unknown)), at))
        out.extend(self.heuristics)
        return out


def fold(records: Iterable[Record], live: dict[str, LiveTxn] | None = None) -> dict[str, LiveTxn]:
    """Apply ``records`` in order to ``live`` (gtrid -> state); END removes a transaction."""
    state = {} if live is None else live
    for record in records:
        apply_record(state, record)
    return state


def apply_record(live: dict[str, LiveTxn], record: Record) -> None:
    if isinstance(record, Header):
        return
    if isinstance(record, End):
        live.pop(record.gtrid, None)
        return
    txn = live.setdefault(record.gtrid, LiveTxn(record.gtrid))
    if isinstance(record, Commit):
        txn.commit = record
    elif isinstance(record, Rollback):
        txn.rollback = record
    elif isinstance(record, Progress):
        txn.done.update(record.done)
        txn.unknown.difference_update(record.done)
        txn.unknown.update(n for n in record.unknown if n not in txn.done)
    else:
        txn.heuristics.append(record)
