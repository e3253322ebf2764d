"""Delivery failures of a proxy supplier: poison events and dead letters (mixed into ``ProxySupplierBase``).

A batch whose *content* failed (see :data:`router.channel.boundary.EVENT_SPECIFIC`; also a conversion error inside
the channel) is put back and its entries are then delivered one at a time, so the failing event is found and the
others go through. One event that fails alone :data:`~router.channel.boundary.POISON_ATTEMPTS` times is
dead-lettered: it moves from the queue to the channel's dead-letter store (:mod:`router.channel.deadletters`, with
its reason) in ONE unit of work that also writes its ``dead_letter`` ledger row, so it is never in neither place; an
operator retries or discards it (``nsjms deadletter``). Also an ERROR log line naming the event and the reason, the
``nsjms.events.dead_lettered`` counter, and the proxy's ``dead_lettered`` / ``last_dead_letter`` fields in
``nsjms status``. The events behind it are delivered as usual.

A push refused with ``DATA_CONVERSION`` ``COMPLETED_NO`` (the consumer's char code set cannot carry the event's
text, e.g. a ``€`` for an ISO-8859-1 consumer: issue 31) is not a poison attempt: the proxy narrows the text it
sends that consumer one step (ISO-8859-1, then ASCII; :mod:`router.mapping.text`) and pushes again at once. Only a
push that still fails once the text is ASCII counts against the event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import omniORB
from omniORB import CORBA

import CosEventComm

from router.channel.boundary import EVENT_SPECIFIC, POISON_ATTEMPTS, Outcome, describe
from router.channel.deadletters import NewDeadLetter, kept_body, readable_reason
from router.channel.events import describe_event
from router.channel.queue import Entry
from router.corbacall import PROBE, CallFailed, call
from router.mapping.text import next_limit
from router.routing.ledger import Outcome as LedgerOutcome
from router.routing.ledger import channel_dedupe_id, volatile_dedupe_id
from router.telemetry import NAME, A

__all__ = ["DeadLetters", "DeliveryFailures"]

log = logging.getLogger("nsjms.channel")

_counter: Any = None


def _dead_letter_counter() -> Any:
    global _counter
    if _counter is None:
        from opentelemetry import metrics


        _counter = metrics.get_meter(NAME).create_counter(
            "nsjms.events.dead_lettered", unit="{event}",
            description="Events a proxy supplier gave up delivering because of their content")
    return _counter


class DeadLetters:
    """The dead-letter accounting of one proxy: an ERROR log line, the ``nsjms.events.dead_lettered`` counter and
    the ``dead_lettered`` / ``last_dead_letter`` fields of ``nsjms status`` (needs ``oid`` and ``channel``)."""

    dead_lettered = 0
    last_dead_letter: str | None = None
    oid: str
    channel: Any

    def _count_dead_letter(self, what: str, reason: str, message: str) -> None:
        """Record one dead letter: ``what`` names the event, ``message`` is the log line after the proxy's id."""
        self.dead_lettered += 1
        self.last_dead_letter = f"{what}: {reason}"
        log.error("proxy %s: %s", self.oid, message)

        _dead_letter_counter().add(1, {A.CHANNEL: self.channel.id, A.PROXY: self.oid, A.REASON: reason.split()[0]})

    def dead_letter_status(self) -> dict[str, Any]:
        if not self.dead_lettered:
            return {}
        return {"dead_lettered": self.dead_lettered, "last_dead_letter": self.last_dead_letter}


class DeliveryFailures(DeadLetters):
    """Poison handling shared by push and pull proxy suppliers (needs ``queue``, ``oid``, ``channel``, ``_finish``)."""

    isolating = 0                  # entries still to be delivered one at a time after a batch failed on content
    text_limit: int | None = None  # the highest code point sent in strings to this consumer (None: any)
    queue: Any
    oid: str
    channel: Any

    def _narrow_text(self, exc: CORBA.DATA_CONVERSION) -> bool:
        """After a push failed with ``exc``: narrow the text of this proxy's pushes one step and say so, or answer
        False when the consumer may have run the call (not ``COMPLETED_NO``), the failure is not a character its
        code set cannot map (minor ``DATA_CONVERSION_CannotMapChar``: any other DATA_CONVERSION, e.g. one the
        consumer's servant raises itself, is an ordinary failed attempt and never narrows what a consumer that can
        read Latin-1 receives; review finding) or the text is already ASCII."""
        narrower = next_limit(self.text_limit)
        if (exc.completed != CORBA.COMPLETED_NO or exc.minor != omniORB.DATA_CONVERSION_CannotMapChar
                or narrower is None):
            return False
        self.text_limit = narrower
        log.warning("proxy %s: the consumer's code set cannot carry the event's text (%s); from now on its strings "
                    "carry only characters up to U+%04X, others as wstring or \\u escapes (docs/mapping.md)",
                    self.oid, describe(exc), narrower)
        return True

    def batch_limit(self, n: int) -> int:
        """The batch size to take now: 1 while isolating the entries of a batch that failed on its content."""
        return min(n, 1) if self.isolating else n

    def delivered_one_batch(self) -> None:
        if self.isolating:
            self.isolating -= 1

    def content_failed(self, entries: list[Entry], exc: BaseException) -> None:
        """The batch failed because of what it holds: isolate it, or count the failure of its only entry and
        dead-letter that entry once it failed :data:`POISON_ATTEMPTS` times. Never loses an entry."""
        reason = describe(exc)
        if len(entries) > 1:
            self.isolating = max(self.isolating, len(entries))
            log.warning("proxy %s: a batch of %d event(s) failed (%s); delivering them one at a time", self.oid,
                        len(entries), reason)
            self.queue.requeue(entries)
            return
        entry = entries[0]
        entry.failures += 1
        if entry.failures < POISON_ATTEMPTS:
            log.warning("proxy %s: delivery of event seq=%d failed because of its content (%s, attempt %d of %d)",
                        self.oid, entry.record.seq, reason, entry.failures, POISON_ATTEMPTS)
            self.queue.requeue(entries)
            return
        self.dead_letter_entry(entry, reason, readable=readable_reason(exc, entry.failures))

    def dead_letter_entry(self, entry: Entry, reason: str, *, readable: str | None = None) -> None:
        """Move ``entry`` to the dead-letter store (:mod:`router.channel.deadletters`) in the unit of work that
        deletes its queue row and writes its ``dead_letter`` ledger row; ``reason`` is the failure (the exception),
        ``readable`` what it means for an operator (default: ``reason``)."""
        rec = entry.record
        what = f"seq={rec.seq} {describe_event(rec.event)} ({rec.size} bytes)"
        if rec.db_id is not None:
            what += f" stored as event id {rec.db_id}"
        self.delivered_one_batch()
        self._count_dead_letter(what, reason, f"DEAD-LETTERED event {what} after {entry.failures} failed "
                                              f"deliveries: {reason}; moved to the dead-letter store "
                                              "(nsjms deadletter list); the events behind it go on")
        self._finish([entry], outcome=LedgerOutcome.DEAD_LETTER,
                     reason=f"dead-lettered after {entry.failures} failed deliveries: {reason}",
                     also=self._dead_letter_row(entry, readable or reason, reason))

    def _dead_letter_row(self, entry: Entry, readable: str, exception: str) -> Callable[[Any], None]:
        """The write that keeps ``entry`` in the dead-letter store, for :meth:`_finish`'s unit of work: a stored
        event is copied from its queue row (only while that row exists); a BestEffort one from its encoding."""
        rec, store, cid = entry.record, self.rt.dead_letters, self.channel.id
        aid, pid, name, attempts = self.admin.id, self.id, describe_event(rec.event), entry.failures
        if rec.db_id is not None:
            eid = rec.db_id
            dedupe = channel_dedupe_id(eid, cid, aid, pid)

            def queued(conn: Any) -> None:
                store.add_queued(conn, cid, aid, pid, eid, dedupe_id=dedupe, name=name, reason=readable,
                                 exception=exception, attempts=attempts)
            return queued
        body, note = kept_body(rec.event)
        accepted = self.channel.volatile_accepted_at(rec.seq) or time.time()
        row = NewDeadLetter(volatile_dedupe_id(self.rt.store.ledger.run_id, rec.seq, cid, aid, pid), cid, "C", aid,
                            pid, rec.seq, int(rec.event.form), body, rec.priority, rec.deadline, rec.start_at, False,
                            name, readable + note, exception, attempts, accepted)

        def volatile(conn: Any) -> None:
            store.add(conn, row)
        return volatile

    def _finish(self, entries: list[Entry], *, wait: bool = True, outcome: LedgerOutcome = LedgerOutcome.DELIVERED,
                reason: str | None = None, also: Callable[[Any], None] | None = None) -> bool:
        raise NotImplementedError

    rt: Any
    admin: Any
    id: int

    # -- one push attempt (push proxy suppliers) ---------------------------------------------------------------
    push_op: str

    def client_ref(self) -> Any:
        raise NotImplementedError

    def convert(self, entries: list[Entry]) -> Any:
        raise NotImplementedError

    def _attempt(self, entries: list[Entry]) -> tuple[Outcome, BaseException | None]:
        """Convert and push; CORBA failures become outcomes (see :class:`~router.channel.boundary.Outcome`)."""
        try:
            client = self.client_ref()
            if client is None:
                raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)
            omniORB.setClientCallTimeout(client, self.rt.push_timeout_ms)
        except CORBA.OBJECT_NOT_EXIST as exc:
            return Outcome.GONE, exc
        except CORBA.Exception as exc:
            return Outcome.RETRY, exc
        try:
            value = self.convert(entries)
        except Exception as exc:  # noqa: BLE001 — the channel cannot convert this content: event-specific
            return Outcome.EVENT_FAILED, exc
        try:
            getattr(client, self.push_op)(value)
        except (CosEventComm.Disconnected, CORBA.OBJECT_NOT_EXIST) as exc:
            return Outcome.GONE, exc
        except CORBA.DATA_CONVERSION as exc:
            if self._narrow_text(exc):
                return self._attempt(entries)       # at most twice more: the limit only narrows
            return Outcome.EVENT_FAILED, exc
        except EVENT_SPECIFIC as exc:
            return Outcome.EVENT_FAILED, exc
        except CORBA.COMM_FAILURE as exc:
            return self._after_comm_failure(client, exc), exc
        except CORBA.Exception as exc:
            return Outcome.RETRY, exc
        return Outcome.DELIVERED, None

    @staticmethod
    def _after_comm_failure(client: Any, exc: CORBA.COMM_FAILURE) -> Outcome:
        """A connection closed while our request was being sent (``COMM_FAILURE_MarshalArguments``) is how a
        consumer's ORB refuses a message above its own size limit. It counts against the event only if the
        consumer answers a small call right after; otherwise the consumer is unavailable (retry) or gone."""
        if exc.minor != omniORB.COMM_FAILURE_MarshalArguments:
            return Outcome.RETRY
        try:
            gone = bool(call(client, "_non_existent", policy=PROBE))
        except CallFailed:
            return Outcome.RETRY
        return Outcome.GONE if gone else Outcome.EVENT_FAILED

