"""Push delivery of a proxy supplier (split from :mod:`router.channel.proxies`): one dispatcher thread per proxy."""

from __future__ import annotations

import threading
import time
from typing import Any

import CosEventChannelAdmin

from router.channel import localpush, txdelivery
from router.channel.boundary import Outcome
from router.channel.delivered import FLUSH_AGE, FLUSH_EVENTS, IDLE_FLUSH_AGE, IDLE_FLUSH_EVENTS
from router.channel.inflight import STUCK_REASON, Flight
from router.channel.proxybase import _IDLE_WAIT, _MAX_BACKOFF, ProxySupplierBase, _delivery_times, log
from router.channel.queue import Entry
from router.channel.store import ProxyRow
from router.routing.ledger import Outcome as LedgerOutcome
from router.routing.ports import OutboundBatches

__all__ = ["PushSupplierMixin"]


class PushSupplierMixin(ProxySupplierBase):
    """Push delivery: one dispatcher thread per proxy.

    Delivered events leave the store in batches: their ids go to the proxy's journal at once and their queue
    rows are deleted by one commit for many deliveries (:mod:`router.channel.delivered`; without a journal, e.g.
    in unit tests without a state directory, each delivery is deleted at once)."""

    connect_declares_type_error = True          # connect_*_push_consumer declares TypeError (NS 3.4)

    push_op = ""
    failing: str | None = None
    failed_attempts = 0
    _journal: Any = None                  # router.channel.delivered.ProxyJournal of the delivery thread
    _pending: list[Entry] | None = None   # delivered and journaled, queue rows not deleted yet
    _pending_since = 0.0
    _journal_off = False                  # the journal failed beyond repair: each delivery commits at once
    _undeleted: tuple[int, ...] = ()      # delivered, records released, a flush could not delete their rows
    _pending_lock = threading.RLock()     # per proxy (__init__); this default serves proxies built bare in tests

    push_flight: Flight[Entry] | None = None          # the push in flight (router.channel.inflight), vs a teardown
    #: (client IOR, the outbound batches port of the bridge it names, or None) (router.channel.localpush.target)
    local_batches_cache: tuple[str, OutboundBatches | None] | None = None
    _stuck: tuple[Entry, ...] = ()         # in flight when the teardown stopped waiting for the push

    def __init__(self, admin: Any, row: ProxyRow) -> None:
        super().__init__(admin, row)
        self._pending_lock = threading.RLock()   # _pending/_undeleted: the delivery thread vs a teardown
        self.push_flight = Flight[Entry]()

    def start(self) -> None:
        if self.connected and not self.destroyed:
            self.rt.spawn(f"push-{self.oid}", self.supervised(self._push_loop))

    def ready_count(self, since: float | None) -> tuple[int, float | None]:
        """How many entries to take now, and when the current partial batch started (sequence pacing)."""
        count = self.queue.peek_count()
        size = self.batch_size()
        if count >= size:
            return size, None
        if count == 0:
            return 0, None
        pacing = self.pacing()
        if self.form != "SEQUENCE" or pacing <= 0:    # PacingInterval 0: no time spent collecting (NS 2.5.5)
            return count, None
        started = since if since is not None else time.time()
        return (count, None) if time.time() - started >= pacing else (0, started)

    def _push_loop(self) -> None:
        try:
            self._push_until_stopped()
        finally:
            txdelivery.drain(self)         # the phase two of T2s this loop decided (txdelivery.Completer)
            self.flush_delivered(closing=True)

    def _push_until_stopped(self) -> None:
        backoff, since = 0.05, None
        while not (self.stop_event.is_set() or self.rt.shutting_down.is_set()):
            if self.suspended or not self.connected or self.closing:   # closing: a destroy in progress; if it
                self.flush_delivered()                                   # fails the proxy is re-opened (inflight)
                self.queue.park(_IDLE_WAIT)      # new events cannot help: only a state change (which wakes it)
                continue
            n, since = self.ready_count(since)
            entries = self.queue.take(self.batch_limit(n), self.rt.max_event_bytes) if n else []
            if not entries:
                flush_in = self._idle_flush()
                if flush_in is None:         # it flushed (a commit): look at the queue again before waiting
                    continue
                self.queue.wait(min(self._idle_wait(since), flush_in))
                continue
            outcome = self._deliver(entries)
            if outcome is Outcome.GONE:
                return
            if outcome is Outcome.DELIVERED:
                backoff = 0.05
            else:
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)

    def _idle_flush(self) -> float | None:
        """Nothing to deliver now: run the pending deletes when :data:`IDLE_FLUSH_EVENTS` are pending or the oldest
        waited :data:`IDLE_FLUSH_AGE`, and return None (the caller looks at the queue again: events may have come
        during the commit); else how long the dispatcher may idle before they are due (a delivered row lingers at
        most that long once the traffic stops)."""
        with self._pending_lock:
            count, since = len(self._pending or ()), self._pending_since
        if not count:
            return _IDLE_WAIT
        left = since + IDLE_FLUSH_AGE - time.monotonic()
        if count >= IDLE_FLUSH_EVENTS or left <= 0:
            self.flush_delivered()
            return None
        return max(0.001, left)

    def _idle_wait(self, since: float | None) -> float:
        wait = _IDLE_WAIT
        due = self.queue.next_due()
        if due is not None:
            wait = min(wait, max(0.001, due - time.time()))
        if since is not None:
            wait = min(wait, max(0.001, since + self.pacing() - time.time()))
        return wait

    def _check_transactional_client(self, client: Any) -> None:
        reason = txdelivery.client_refused(self, client)
        if reason is not None:
            log.info("proxy %s: connect refused: EnableTransaction is TRUE on this proxy but %s", self.oid, reason)
            raise CosEventChannelAdmin.TypeError()

    def _deliver(self, entries: list[Entry]) -> Outcome:
        """:meth:`_deliver_now`, marked in flight so a teardown waits for its end (router.channel.inflight); once a
        teardown began nothing is pushed (the entries go back; the teardown records them with the queue)."""
        flight = self.push_flight
        if flight is None:                       # a proxy built bare (tests)
            return self._deliver_now(entries)
        if not flight.begin(list(entries), lambda: bool(self.closing or self.destroyed)):
            self.queue.requeue(entries)
            # a destroy began: this thread exits once the teardown stops it, and idles meanwhile (a destroy that
            # fails re-opens the proxy, router.channel.inflight.reopen, and delivery goes on)
            return Outcome.GONE if self.destroyed or self.stop_event.is_set() else Outcome.RETRY
        try:
            return self._deliver_now(entries)
        finally:
            flight.end()

    def _deliver_now(self, entries: list[Entry]) -> Outcome:
        """One attempt to push ``entries``; whatever happens, each entry is delivered, put back or dead-lettered.

        An unexpected (non-CORBA) error puts the entries back before it propagates to :meth:`supervised`, which
        restarts the loop: a failing worker never drops what it took. With EnableTransaction and a bridge of this
        node as the consumer, the batch runs in a routing transaction instead (router.channel.txdelivery); with such
        a bridge and no routing transaction, batches go to it in-process (router.channel.localpush)."""
        target = txdelivery.participant(self)
        if target is not None:
            self.flush_delivered()
            return txdelivery.deliver(self, target, entries)
        batches = localpush.target(self)
        if batches is not None:            # a bridge of this node: batched, pipelined, in-process
            return localpush.deliver(self, batches, entries)
        try:
            outcome, exc = self._attempt(entries)
        except BaseException:
            self.queue.requeue(entries)
            raise
        if outcome is Outcome.DELIVERED:
            self.failing, self.failed_attempts = None, 0
            self.delivered_one_batch()
            self.delivered_entries(entries)
            return outcome
        self.flush_delivered()            # the store is exact before a put-back, a teardown or a dead letter
        if outcome is Outcome.GONE:
            log.info("proxy %s: consumer gone (%s); disconnecting", self.oid, type(exc).__name__)
            self.queue.requeue(entries)
            self.teardown(notify_client=False, retry=True)
        elif outcome is Outcome.RETRY:
            # NS 2.5.5.1: keep retrying until the consumer answers or no longer exists; nothing is dropped. A
            # consumer that keeps refusing shows in `nsjms status` (failing, attempts) and in the log.
            self.failing, self.failed_attempts = f"{type(exc).__name__}: {exc}", self.failed_attempts + 1
            log.warning("proxy %s: push failed (%s, attempt %d); %d event(s) stay queued", self.oid, exc,
                        self.failed_attempts, len(entries))
            self.queue.requeue(entries)
        else:
            assert exc is not None
            self.content_failed(entries, exc)
        return outcome

    def delivered_entries(self, entries: list[Entry], *, defer_flush: bool = False) -> bool:
        """The consumer's call returned: journal the events and delete their rows with later deliveries', or (no
        journal, or it cannot be written) delete them now.

        ``defer_flush``: when the pending deletes are due (:data:`FLUSH_EVENTS` pending, or older than
        :data:`FLUSH_AGE`), return True instead of flushing, so the caller flushes once it has started its next
        step (``router.channel.localpush`` writes the next COMMIT first: the delete runs while that receipt is in
        flight, not between the receipt and the next COMMIT). A delete that cannot wait (no journal, a journal
        that failed, a BestEffort event the ledger records) is never deferred. Returns False when nothing is
        due."""
        now = time.time()
        for e in entries:
            e.delivered_at = now                # the ledger's acknowledged_at, whenever the row is deleted
        journal = self._journal_of_thread()
        if journal is None:
            if not self._finish(entries):      # stopped before the delete worked: kept for the stop's owner
                self._keep_undeleted(entries)
            return False
        try:
            journal.record((e.record.db_id for e in entries if e.record.db_id is not None), now)
        except OSError as exc:
            log.warning("proxy %s: could not write its delivered-events journal (%s); deleting at once", self.oid,
                        exc)
            if journal.unusable:
                self._journal_off = True       # it could not be cut back: each delivery commits from now on
            self.flush_delivered()
            self._finish(entries)
            return False
        with self._pending_lock:
            if not self._pending:
                self._pending, self._pending_since = [], time.monotonic()
            self._pending.extend(entries)
            full = len(self._pending) >= FLUSH_EVENTS or time.monotonic() - self._pending_since >= FLUSH_AGE
        # A BestEffort event the ledger records has no row to journal: its delivered row is written now (with
        # the pending ones), so a crash cannot leave a delivered event looking lost to the audit.
        if any(e.record.db_id is None for e in entries) and self._volatile_ledger(entries):
            self.flush_delivered()
        elif full:
            if defer_flush:
                return True
            self.flush_delivered()
        return False

    def _journal_of_thread(self) -> Any:
        if self._journal_off:
            return None
        if self._journal is None:
            journals = getattr(self.rt, "delivered", None)
            if journals is None:
                return None
            try:
                self._journal = journals.open(self.channel.id, self.admin.id, self.id)
            except OSError as exc:
                log.warning("proxy %s: no delivered-events journal (%s); each delivery commits", self.oid, exc)
                return None
        return self._journal

    def _keep_undeleted(self, entries: list[Entry]) -> None:
        with self._pending_lock:
            self._undeleted += tuple(e.record.db_id for e in entries if e.record.db_id is not None)

    def delete_delivered_rows(self) -> bool:
        """One attempt to delete the rows of the events it delivered whose delete failed (``_undeleted``, and what
        is pending once its delivery thread ended), as ``delivered``: a hand-off of the channel releases it only
        once this says True (the next owner would deliver those events again; router/cluster/release.py)."""
        with self._pending_lock:
            if self._pending:
                self.flush_delivered()
            ids = list(self._undeleted)
            if not ids:
                return True
            try:
                with self.rt.db.unit_of_work() as conn:
                    self.rt.store.delete_deliveries(conn, self.channel.id, self.admin.id, self.id, ids)
            except Exception as exc:  # noqa: BLE001 - e.g. PostgreSQL restarting: the hand-off asks again
                log.warning("proxy %s: could not remove %d delivered event(s) from the store (%s); the hand-off of "
                            "its channel waits for it", self.oid, len(ids), exc)
                return False
            self._undeleted = ()
        return True

    def flush_delivered(self, *, closing: bool = False) -> None:
        """Delete the pending delivered events' rows in one commit, then empty the journal. ``closing`` (the
        delivery thread ends): the journal is closed too, and removed if the proxy is gone.

        Under ``_pending_lock``, so a teardown sees either the pending events or their rows deleted; ids whose
        delete did not happen (the proxy stopped while the database was down) stay in ``_undeleted`` for the
        teardown, which deletes them as ``delivered`` before the proxy's other rows go as ``discarded``."""
        with self._pending_lock:
            pending, self._pending = self._pending, None
            done = self._finish(pending) if pending else True
            if not done and pending:
                self._undeleted += tuple(e.record.db_id for e in pending if e.record.db_id is not None)
        journal = self._journal
        if journal is not None and done:
            journal.clear()
        if closing and journal is not None:
            self._journal = None
            journal.close(remove=self.destroyed and done)

    def _delete_row(self, retry: bool) -> None:
        """The teardown's delete, with the delivered events not yet deleted recorded as ``delivered`` in the same
        unit of work (not ``discarded`` with the proxy's other rows), and the proxy's journal removed. A push in
        flight is waited for first (bounded by the push's call timeout): what it delivered is then among them."""
        if self.push_flight is not None:
            wait_s = getattr(self.rt, "push_timeout_ms", 10_000) / 1000.0 + 2.0      # inflight.teardown_bound_s
            deadline = getattr(self, "_teardown_deadline", None)     # one for all proxies of a destroy (inflight)
            if deadline is not None:
                wait_s = max(0.0, min(wait_s, deadline - time.monotonic()))
            self._stuck = tuple(self.push_flight.wait_ended(wait_s))
            if self._stuck:
                log.warning("proxy %s: destroyed while a push of %d event(s) did not end within %g s; recorded as "
                            "discarded with that reason (the consumer may have received them)", self.oid,
                            len(self._stuck), wait_s)
        with self._pending_lock:
            super()._delete_row(retry)
            pending, self._pending, self._undeleted = self._pending, None, ()
        for e in pending or ():
            e.record.release()
        journals = getattr(self.rt, "delivered", None)
        if journals is not None:
            journals.remove(self.channel.id, self.admin.id, self.id)

    def _deliveries_before_delete(self, conn: Any) -> None:
        stuck = [e.record.db_id for e in self._stuck if e.record.db_id is not None]
        if stuck:
            self.rt.store.delete_deliveries(conn, self.channel.id, self.admin.id, self.id, stuck,
                                            outcome=LedgerOutcome.DISCARDED, reason=STUCK_REASON)
        pending = self._pending or []
        ids = [e.record.db_id for e in pending if e.record.db_id is not None] + list(self._undeleted)
        volatile = self._volatile_ledger(pending)
        acked, be_acked = _delivery_times(pending)
        if ids or volatile:
            self.rt.store.delete_deliveries(conn, self.channel.id, self.admin.id, self.id, ids,
                                            best_effort=volatile, acknowledged_at=acked,
                                            best_effort_acknowledged_at=be_acked)

    def status_extra(self) -> dict[str, Any]:
        failing = {"failing": self.failing, "attempts": self.failed_attempts} if self.failing else {}
        return {**failing, **self.dead_letter_status(), **txdelivery.status(self)}
