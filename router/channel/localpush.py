"""Push delivery to a bridge of this node, in batches and pipelined, without a routing transaction (issue 12).

A push proxy supplier whose consumer is the endpoint receiver of a channel → JMS bridge living in this node (the
servant offers :class:`~router.routing.ports.OutboundBatches` in the node's ``LocalEndpoints``: the bridge's
``LocalBatches``) does not push one event per CORBA call.
Its dispatcher drains what is queued, up to :data:`STRUCTURED_BATCH` events for a structured proxy or the proxy's
``MaximumBatchSize`` for a sequence proxy (a sequence proxy with a ``PacingInterval`` still waits for a full batch
or the interval, as for a CORBA consumer), and hands the batch to the bridge in-process, which sends it as one
STOMP transaction. Pipelining: while the broker commits one batch, the next one is converted, mapped and written
(BEGIN and SENDs) when a full batch is queued (a backlog); its COMMIT is written once the previous COMMIT's receipt
arrived (at most :data:`IN_FLIGHT` batches in flight; the broker never commits a later batch before an earlier
one). Group commit: with less than a full batch queued, the next batch waits for that receipt and then takes every
event queued meanwhile (up to the batch size), so events arriving one by one go in fewer, larger transactions
without waiting longer than the receipt they would have waited for anyway (issue 27: transactions of 1.4-1.9
events cost the node and the broker per transaction).

Exactly as for a CORBA push: a batch's events leave the queue (journaled as delivered, ``router.channel.delivered``)
only once the broker confirmed its COMMIT; a due delete of the delivered rows (the journal batches them) runs after
the next batch's COMMIT is written, while its receipt is in flight (at once when no batch follows). A batch the
broker refused in part is sent again message by message by the bridge (a refused message dead-lettered there, the
others delivered), and every batch written behind it is aborted and put back in the queue in its place. A broker
problem (``ForwardDeferred``) puts back every batch not confirmed (less its events the bridge delivered already:
``Batch.handled``), the proxy retries with backoff and shows ``failing`` in ``nsjms status``; a COMMIT whose receipt
was lost may have happened, so those events may reach the broker twice (never lost). An event the channel cannot
convert is isolated and dead-lettered by the proxy's poison handling (``router.channel.delivery``). A consumer in
another process is pushed over CORBA one event (or sequence) per call, as before.
"""

from __future__ import annotations

import logging
from collections import deque

from router.channel.boundary import Outcome
from router.channel.dedupe import dedupe_ids
from router.channel.events import as_structured
from router.channel.proxyport import PushDelivering
from router.channel.queue import Entry
from router.routing.errors import ForwardDeferred
from router.routing.ports import OutboundBatch, OutboundBatches

__all__ = ["IN_FLIGHT", "MAX_BATCHES_PER_CALL", "STRUCTURED_BATCH", "deliver", "target"]

log = logging.getLogger("nsjms.channel")

#: Events per broker transaction for a structured push proxy (a sequence proxy's is its MaximumBatchSize).
STRUCTURED_BATCH = 100
#: Batches in flight at most: one whose COMMIT receipt is awaited and one written behind it (its COMMIT not yet).
IN_FLIGHT = 2
#: Batches one :func:`deliver` call sends before it returns to the proxy's dispatcher loop (which re-checks the
#: proxy's state: stopped, suspended, QoS changed).
MAX_BATCHES_PER_CALL = 64


def target(proxy: PushDelivering) -> OutboundBatches | None:
    """The bridge's outbound batches port (``LocalBatches``) when ``proxy`` (a push proxy supplier, structured or
    sequence, not an acknowledging one) feeds a running bridge of this node; None otherwise (the proxy pushes over
    CORBA, which also tells it when a stopped or destroyed bridge refuses)."""
    client_ior = proxy.client_ior
    if proxy.form not in ("STRUCTURED", "SEQUENCE") or proxy.acknowledging or not client_ior:
        return None
    cached = proxy.local_batches_cache
    if cached is None or cached[0] != client_ior:
        try:
            found = proxy.rt.endpoints.outbound_batches(proxy.client_ref())
        except Exception:  # noqa: BLE001 — not resolvable here: not a local bridge
            found = None
        cached = proxy.local_batches_cache = (client_ior, found)
    batches = cached[1]
    if batches is None or not batches.running():
        return None
    return batches


def _cap(proxy: PushDelivering) -> int:
    return int(proxy.batch_size()) if proxy.form == "SEQUENCE" else STRUCTURED_BATCH


#: The STOMP transport's default wait for a receipt (router.jms.stomp ``receipt_timeout``): a teardown waits this
#: long per batch in flight.
RECEIPT_TIMEOUT_S = 30.0


def _may_go_on(proxy: PushDelivering) -> bool:
    return not (proxy.stop_event.is_set() or proxy.rt.shutting_down.is_set() or proxy.suspended
                or not proxy.connected or proxy.destroyed or proxy.closing)


def _track(proxy: PushDelivering, entries: list[Entry]) -> list[Entry]:
    """Mark ``entries`` (just taken from the queue) in flight, so a teardown waits for them and records them."""
    flight = proxy.push_flight
    if flight is not None:
        flight.add(entries)
    return entries


def _settled(proxy: PushDelivering, entries: list[Entry]) -> None:
    flight = proxy.push_flight
    if flight is not None:
        flight.drop(entries)


def _take_more(proxy: PushDelivering, behind: bool = False) -> list[Entry]:
    """The next batch, when one is ready (a sequence proxy's pacing as in its dispatcher loop). ``behind``: a COMMIT
    is in flight; the next batch is written behind it only when a full one is queued (a backlog), else it waits for
    that receipt and then takes everything queued meanwhile (group commit: fewer, larger transactions)."""
    if not _may_go_on(proxy):
        return []
    if behind and proxy.queue.peek_count() < proxy.batch_limit(_cap(proxy)):
        return []
    if proxy.form == "SEQUENCE":
        n, _ = proxy.ready_count(None)
    else:
        n = STRUCTURED_BATCH
    if not n:
        return []
    taken: list[Entry] = proxy.queue.take(proxy.batch_limit(n), proxy.rt.max_event_bytes)
    return _track(proxy, taken)


def _done(proxy: PushDelivering, entries: list[Entry]) -> bool:
    """The broker confirmed ``entries``: journal them as delivered. True when the pending deletes are due: the
    caller flushes them once the next COMMIT is written (``PushSupplierMixin.delivered_entries``'s ``defer_flush``)."""
    proxy.failing, proxy.failed_attempts = None, 0
    proxy.delivered_one_batch()
    due: bool = proxy.delivered_entries(entries, defer_flush=True)
    _settled(proxy, entries)
    return due


def deliver(proxy: PushDelivering, batches: OutboundBatches, entries: list[Entry]) -> Outcome:
    """Deliver ``entries`` and what else is queued, batch after batch, pipelined (see the module docstring).
    Whatever happens, each entry ends delivered, put back or (content) handled by the proxy's poison handling."""
    flight = proxy.push_flight
    if flight is not None:     # a teardown waits for every batch in flight to have its COMMIT receipt
        flight.allow(IN_FLIGHT * RECEIPT_TIMEOUT_S + 2.0)
    limit = proxy.batch_limit(_cap(proxy))
    if len(entries) < limit:
        entries = entries + _track(proxy, proxy.queue.take(limit - len(entries), proxy.rt.max_event_bytes))
    inflight: deque[tuple[list[Entry], OutboundBatch]] = deque()     # [0]: COMMIT written; [1]: BEGIN + SENDs written
    held = entries                                          # taken, not started yet
    failed: tuple[list[Entry], Exception] | None = None     # a batch the channel could not convert
    sent = 0
    try:
        while True:
            if held and failed is None:
                try:
                    events = [as_structured(e.record.event) for e in held]
                except Exception as exc:  # noqa: BLE001 — the channel cannot convert this content: event-specific
                    failed, held = (held, exc), []
                else:
                    batch = batches.batch(events, dedupe_ids(proxy, held))
                    inflight.append((held, batch))     # in flight before start: a failure there puts it back
                    held = []
                    batches.start(batch)
                    sent += 1
                    if len(inflight) == 1:
                        batches.commit(inflight[0][1])
            if failed is None and len(inflight) < IN_FLIGHT and sent < MAX_BATCHES_PER_CALL:
                held = _take_more(proxy, behind=bool(inflight))
                if held:
                    continue
            if not inflight:
                break
            head_entries, head = inflight[0]
            clean = batches.settle(head)       # raises: the head is put back with the rest
            inflight.popleft()
            due = _done(proxy, head_entries)
            if not clean:                     # the broker refused part of it: what was written behind it goes back
                _put_back(proxy, batches, inflight, held)
                held = []
                break
            if inflight:
                batches.commit(inflight[0][1])
            if due:                           # the delivered rows' delete runs while that COMMIT's receipt is out
                proxy.flush_delivered()
    except ForwardDeferred as exc:
        _put_back(proxy, batches, inflight, held + (failed[0] if failed else []))
        proxy.failing, proxy.failed_attempts = f"ForwardDeferred: {exc}", proxy.failed_attempts + 1
        log.warning("proxy %s: delivery to its bridge failed (%s, attempt %d); the events stay queued", proxy.oid,
                    exc, proxy.failed_attempts)
        return Outcome.RETRY
    except BaseException:
        _put_back(proxy, batches, inflight, held + (failed[0] if failed else []), settle=False)
        raise
    if failed is not None:
        proxy.flush_delivered()
        proxy.content_failed(*failed)
        return Outcome.EVENT_FAILED
    return Outcome.DELIVERED


def _put_back(proxy: PushDelivering, batches: OutboundBatches, inflight: deque[tuple[list[Entry], OutboundBatch]],
              held: list[Entry], *, settle: bool = True) -> None:
    """Nothing after a failure is sent: a head whose COMMIT is out is settled first when it can be (so a COMMIT
    that went through is not sent twice), every other batch is aborted, and their entries go back to the queue in
    their place (after the delivered ones' rows are deleted: the store is exact before a put-back)."""
    back: list[Entry] = []
    for i, (entries, batch) in enumerate(inflight):
        if i == 0 and settle and batch.pending is not None:
            try:
                batches.settle(batch)
            except ForwardDeferred:
                pass
            else:
                _done(proxy, entries)
                continue
        batches.abort(batch)
        handled = batch.handled             # dead-lettered, or confirmed one by one before the failure
        if handled:
            proxy.delivered_entries([e for k, e in enumerate(entries) if k in handled])
            _settled(proxy, [e for k, e in enumerate(entries) if k in handled])
        back += [e for k, e in enumerate(entries) if k not in handled]
    inflight.clear()
    back += held
    if back:
        proxy.flush_delivered()
        proxy.queue.requeue(back)
        _settled(proxy, back)
