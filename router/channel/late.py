"""Queue the events of PostgreSQL branches committed behind the channels' back (``router.routing.t2.latecommit``, issue
31).

:func:`queue_committed` gets the PostgreSQL transaction ids of branches recovery or an operator just committed
(JMS -> channel T2s no driver of this node queues itself). The queue rows such a branch inserted carry its id as
``xmin``; each is queued on its proxy like the restore at start does, unless the channel already holds the event
(a record with that ``db_id``: restored at start, or queued by an earlier call), so nothing is queued twice. The
event gets a fresh ``seq`` (its stored one may belong to a previous incarnation's numbering, above the floor this
run started from): it queues behind what the channel holds now.

``xmin`` has no index: each call scans the queue rows of the channels loaded here (none loaded: no query). Calls
are rare (faults, operators); a recovery pass that commits through ``finish_branches`` hands its commits over in one
call, a single ``commit_branch`` (an operator's commit, a fenced node's recovery) in one call each.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from router.channel.events import decode
from router.channel.queue import Record
from router.channel.store import QueuedRow

__all__ = ["queue_committed"]

log = logging.getLogger("nsjms.channel")


def queue_committed(factory: Any, txids: Sequence[str]) -> int:
    """Queue the events whose queue rows PostgreSQL transactions ``txids`` inserted; returns how many events."""
    loaded = [int(cid) for cid, ch in list(factory.channels.items()) if not ch.destroyed]
    if not txids or not loaded:
        return 0                     # no channel here to queue on: no scan
    with factory.rt.db.unit_of_work() as conn:
        rows = conn.execute(
            "SELECT q.channel_id, q.admin_id, q.proxy_id, e.id, e.seq, e.form, e.body, e.priority, e.deadline, "
            "e.start_at FROM nsjms_queue q JOIN nsjms_event e ON e.id = q.event_id "
            "WHERE q.channel_id = ANY(%s) AND q.xmin = ANY(%s::xid[]) "
            "ORDER BY q.channel_id, e.seq, q.admin_id, q.proxy_id",
            (loaded, list(txids))).fetchall()
    by_channel: dict[int, list[QueuedRow]] = {}
    for cid, *rest in rows:
        by_channel.setdefault(int(cid), []).append(QueuedRow(*rest))
    queued = 0
    for cid, qrows in by_channel.items():
        channel = factory.channels.get(cid)
        if channel is None or channel.destroyed:
            continue                 # its rows go with the channel
        queued += _queue(channel, qrows)
    return queued


def _queue(channel: Any, qrows: list[QueuedRow]) -> int:
    with channel._records_lock:
        known = {rec.db_id for rec in channel.records.values() if rec.db_id is not None}
        fresh: dict[int, Record] = {}
        for q in qrows:
            if q.event_id in known or q.event_id in fresh:
                continue
            rec = Record(channel.rt.next_seq(), decode(q.form, q.body), q.priority, q.deadline, q.start_at, True,
                         q.event_id, size=len(q.body), on_released=channel.released)
            rec.hold()               # until every row is queued: a discard must not release it half-way
            fresh[q.event_id] = rec
            channel.records[rec.seq] = rec
    taken: set[int] = set()
    for q in qrows:
        new = fresh.get(q.event_id)
        if new is None:
            continue
        admin = channel.consumer_admins.get(q.admin_id)
        target = admin.proxies.get(q.proxy_id) if admin is not None else None
        if target is not None:
            channel._enqueue_one(target, new)
            taken.add(q.event_id)
    for rec in fresh.values():
        rec.release()                # a record no queue took is released here (and reaped)
    if taken:
        log.warning("channel %d: queued %d event(s) of a PostgreSQL branch committed by recovery or an operator",
                    channel.id, len(taken))
    return len(taken)
