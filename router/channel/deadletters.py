"""The channel's dead-letter store: events the channel gave up on, kept with their reason until an operator acts.

Table ``nsjms_dead_letter`` (migration ``router/db/migrations/*_dead_letter.sql``). A proxy supplier that
gives up on an event (its content failed alone :data:`~router.channel.boundary.POISON_ATTEMPTS` times,
:mod:`router.channel.delivery`) moves it here in the SAME unit of work that deletes its queue row and writes its
``dead_letter`` ledger row (:meth:`DeadLetterStore.add_queued`, copying the event as the queue stored it); a
BestEffort event, which has no stored copy, is written from its encoding (:meth:`DeadLetterStore.add`). A pulled
event the channel refuses (unusable QoS headers, above ``node.max_event_bytes``) is written the same way (side
``'S'``). So an event is never in neither place. Operators list, show, retry and discard the rows
(:mod:`router.deadletter.ops`, ``nsjms deadletter``).

Every method takes ``conn``, a connection inside the caller's transaction (CONVENTIONS 17); every statement is
parameterised. :func:`retry_target` (where a retry goes) and :func:`readable_reason` are decisions without I/O.
Errors are psycopg's, translated at the caller's boundary (:mod:`router.db`).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg

from omniORB import CORBA

from router.channel.events import Event, encode

__all__ = ["DeadLetter", "DeadLetterStore", "NewDeadLetter", "RetryTarget", "kept_body", "pulled_dedupe_id",
           "readable_reason", "retry_target"]

Conn = psycopg.Connection[Any]

#: What each event-specific failure means, for the reason an operator reads.
_MEANING: dict[str, str] = {
    "DATA_CONVERSION": "the consumer's ORB cannot convert text in it to its code set",
    "BAD_PARAM": "the consumer refused it as a bad parameter",
    "MARSHAL": "the consumer's ORB could not unmarshal it",
    "IMP_LIMIT": "it is above an implementation limit of the consumer",
    "COMM_FAILURE": "the consumer's ORB closed the connection while receiving it (above its message size limit?)",
}


def readable_reason(exc: BaseException, attempts: int) -> str:
    """Why the channel gave up, in words: what the failure means and how often it happened alone."""
    if isinstance(exc, CORBA.SystemException):
        name = type(exc).__name__
        meaning = _MEANING.get(name, f"the consumer failed it with {name}")
    else:
        meaning = f"the channel could not convert it for this consumer ({type(exc).__name__})"
    return f"{meaning}; failed alone {attempts} time(s), so the channel stopped trying"


def kept_body(event: Event) -> tuple[bytes | None, str]:
    """The event's CDR encoding for the store, or None with a note for its reason when even that fails."""
    try:
        return encode(event), ""
    except Exception as exc:  # noqa: BLE001 — kept without its body, and said so
        return None, f" (its content could not be encoded either: {type(exc).__name__}: {exc})"


def pulled_dedupe_id(run_id: str, seq: int, channel_id: int, admin_id: int, proxy_id: int) -> str:
    """Names a refused pulled event (it has no ledger obligation): ``p<run>/s<seq>/c<channel>/a<admin>/p<proxy>``."""
    return f"p{run_id}/s{seq}/c{channel_id}/a{admin_id}/p{proxy_id}"


@dataclass(frozen=True)
class NewDeadLetter:
    """A dead letter written from the event itself (BestEffort events, refused pulled events)."""

    dedupe_id: str
    channel_id: int
    side: str                 # 'C' proxy supplier gave up; 'S' pulled event refused by the channel
    admin_id: int
    proxy_id: int
    seq: int
    form: int
    body: bytes | None        # CDR encapsulation (router.channel.events.encode); None: could not be encoded
    priority: int
    deadline: float | None
    start_at: float | None
    persistent: bool
    event_name: str
    reason: str
    exception: str
    attempts: int
    received_at: float


@dataclass(frozen=True)
class DeadLetter:
    """One row of the store."""

    id: int
    dedupe_id: str
    channel_id: int
    side: str
    admin_id: int
    proxy_id: int
    event_id: int | None
    seq: int
    form: int
    body: bytes | None
    priority: int
    deadline: float | None
    start_at: float | None
    persistent: bool
    event_name: str
    reason: str
    exception: str
    attempts: int
    received_at: float
    dead_at: float

    def summary(self) -> dict[str, Any]:
        """Everything but the body (its size instead): what ``list`` and ``show`` report."""
        out = asdict(self)
        out.pop("body")
        out["size"] = len(self.body) if self.body is not None else None
        return out


class RetryTarget(enum.Enum):
    """Where a retried dead letter goes (:func:`retry_target`)."""

    PROXY = "proxy"        # back into the queue of the proxy supplier that gave up on it
    CHANNEL = "channel"    # routed by the channel again (its filters pick the consumers)
    REFUSED = "refused"    # nowhere: the channel is gone, or the event could not be encoded


def retry_target(dl: DeadLetter, *, channel_alive: bool, proxy_alive: bool) -> tuple[RetryTarget, str]:
    """Decide where a retry of ``dl`` goes, with the reason (shown to the operator and logged)."""
    if dl.body is None:
        return RetryTarget.REFUSED, "its event could not be encoded when it was dead-lettered; discard it"
    if not channel_alive:
        return RetryTarget.REFUSED, f"channel {dl.channel_id} no longer exists; discard it"
    if dl.side == "S":
        return RetryTarget.CHANNEL, f"routed by channel {dl.channel_id} again (a pulled event it had refused)"
    if proxy_alive:
        return RetryTarget.PROXY, f"back into the queue of proxy supplier {dl.admin_id}/{dl.proxy_id}"
    return RetryTarget.CHANNEL, (f"proxy supplier {dl.admin_id}/{dl.proxy_id} is gone: routed by channel "
                                 f"{dl.channel_id} again")


_COLUMNS = ("id, dedupe_id, channel_id, side, admin_id, proxy_id, event_id, seq, form, body, priority, deadline, "
            "start_at, persistent, event_name, reason, exception, attempts, received_at, dead_at")


class DeadLetterStore:
    """Parameterised access to ``nsjms_dead_letter`` on the caller's connection (see the module docstring)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock

    # One statement: the event as its queue row holds it, only while that queue row exists (a unit of work retried
    # after a lost COMMIT reply finds it gone and writes nothing; the dedupe id is unique too).
    _ADD_QUEUED = """
        INSERT INTO nsjms_dead_letter(dedupe_id, channel_id, side, admin_id, proxy_id, event_id, seq, form, body,
                                      priority, deadline, start_at, persistent, event_name, reason, exception,
                                      attempts, received_at, dead_at)
        SELECT %(dedupe)s, q.channel_id, 'C', q.admin_id, q.proxy_id, e.id, e.seq, e.form, e.body, e.priority,
               e.deadline, e.start_at, true, %(name)s, %(reason)s, %(exc)s, %(attempts)s, e.received_at,
               to_timestamp(%(now)s::float8)
        FROM nsjms_queue q JOIN nsjms_event e ON e.id = q.event_id
        WHERE q.channel_id = %(cid)s AND q.admin_id = %(aid)s AND q.proxy_id = %(pid)s AND q.event_id = %(eid)s
        ON CONFLICT (dedupe_id) DO NOTHING
        RETURNING id"""

    def add_queued(self, conn: Conn, cid: int, aid: int, pid: int, event_id: int, *, dedupe_id: str, name: str,
                   reason: str, exception: str, attempts: int) -> int | None:
        """Copy a stored event's queue row of proxy supplier (``aid``, ``pid``) here; the caller deletes the queue
        row in the same unit of work. Returns the new row's id, None when the queue row was already gone."""
        row = conn.execute(self._ADD_QUEUED, {
            "dedupe": dedupe_id, "cid": cid, "aid": aid, "pid": pid, "eid": event_id, "name": name,
            "reason": reason, "exc": exception, "attempts": attempts, "now": self._clock()}).fetchone()
        return int(row[0]) if row else None

    def add(self, conn: Conn, dl: NewDeadLetter) -> int | None:
        """Write a dead letter from the event itself; None when its dedupe id is already stored."""
        row = conn.execute(
            "INSERT INTO nsjms_dead_letter(dedupe_id, channel_id, side, admin_id, proxy_id, seq, form, body, "
            "priority, deadline, start_at, persistent, event_name, reason, exception, attempts, received_at, dead_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, to_timestamp(%s::float8), "
            "to_timestamp(%s::float8)) ON CONFLICT (dedupe_id) DO NOTHING RETURNING id",
            (dl.dedupe_id, dl.channel_id, dl.side, dl.admin_id, dl.proxy_id, dl.seq, dl.form, dl.body, dl.priority,
             dl.deadline, dl.start_at, dl.persistent, dl.event_name, dl.reason, dl.exception, dl.attempts,
             dl.received_at, self._clock())).fetchone()
        return int(row[0]) if row else None

    def listing(self, conn: Conn, *, channel: int | None = None, limit: int = 1000) -> tuple[list[DeadLetter], int]:
        """The oldest ``limit`` rows (of ``channel``, or all), and how many there are in all."""
        where, params = ("WHERE channel_id = %s", (channel,)) if channel is not None else ("", ())
        rows = conn.execute(f"SELECT {_COLUMNS} FROM nsjms_dead_letter {where} ORDER BY id LIMIT %s",
                            (*params, limit)).fetchall()
        total = conn.execute(f"SELECT count(*) FROM nsjms_dead_letter {where}", params).fetchone()
        return [_row(r) for r in rows], int(total[0]) if total else 0

    def get(self, conn: Conn, dl_id: int, *, lock: bool = False) -> DeadLetter | None:
        """One row; ``lock``: held (FOR UPDATE) until the caller's transaction ends, for a retry or discard."""
        row = conn.execute(f"SELECT {_COLUMNS} FROM nsjms_dead_letter WHERE id = %s"
                           f"{' FOR UPDATE' if lock else ''}", (dl_id,)).fetchone()
        return _row(row) if row else None

    def delete(self, conn: Conn, dl_id: int) -> bool:
        """Remove one row (retried or discarded): False when it was already gone."""
        return conn.execute("DELETE FROM nsjms_dead_letter WHERE id = %s", (dl_id,)).rowcount == 1

    @staticmethod
    def proxy_stored(conn: Conn, cid: int, aid: int, pid: int) -> bool:
        """Whether proxy supplier (``aid``, ``pid``) of channel ``cid`` still has its row, which is then share-locked
        until the caller's transaction ends: a destroy of that proxy (which deletes its queue rows with it) waits,
        so a retry's queue row is never left behind a proxy deleted meanwhile."""
        return conn.execute("SELECT 1 FROM nsjms_proxy WHERE channel_id = %s AND side = 'C' AND admin_id = %s "
                            "AND id = %s FOR SHARE", (cid, aid, pid)).fetchone() is not None

    def count(self, conn: Conn) -> int:
        row = conn.execute("SELECT count(*) FROM nsjms_dead_letter").fetchone()
        return int(row[0]) if row else 0


def _epoch(value: Any) -> float:
    return value.timestamp() if isinstance(value, datetime) else float(value)


def _row(r: Any) -> DeadLetter:
    (dl_id, dedupe, cid, side, aid, pid, eid, seq, form, body, prio, deadline, start_at, persistent, name, reason,
     exc, attempts, received, dead) = r
    return DeadLetter(int(dl_id), dedupe, int(cid), str(side), int(aid), int(pid), None if eid is None else int(eid),
                      int(seq), int(form), None if body is None else bytes(body), int(prio), deadline, start_at,
                      bool(persistent), name, reason, exc, int(attempts), _epoch(received), _epoch(dead))
