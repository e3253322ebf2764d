"""JMS → channel inside the routing transaction T2 (NJI 2.7.2, 2.7.3.2, 2.7.4, 2.7.5.2): the bridge's part.

The channel's pull-style proxy consumer is the transaction client (``router.channel.t2in``): it begins the T2,
enlists its PostgreSQL branch and calls the bridge's pull sender in-process with the transaction
(:meth:`InboundT2.take`). The bridge receives up to a batch of deliveries from JMS synchronously and, in the T2:

* claims the message ids in the inbox (``router.routing.t2.transactions.inbox_claim``, the caller's PostgreSQL branch):
  an id already there was turned into an event by an earlier, committed T2 (a redelivery after a lost ack or a crash
  before the broker commit): it is acknowledged in the T2 and produces no event;
* maps the others; a message that cannot become an event (undecodable, expired, unmappable, too large, or one the
  channel refuses) is dead-lettered with the reason by a SEND in the same STOMP transaction as its ACK, and its
  inbox claim is released (so a redelivery after an unknown broker outcome is dead-lettered again, never dropped);
* enlists :class:`AckBranch`, the broker branch: every delivery of the batch (new, duplicate, dead-lettered)
  is acknowledged inside one STOMP transaction, committed only after the PostgreSQL branch committed.

A rolled-back T2 leaves the deliveries un-acknowledged on the live subscription (ActiveMQ restores the acks of an
aborted STOMP transaction but does NOT redeliver those messages while the consumer lives): they are kept here and
taken first by the next T2, so they are retried, never stranded. Deliveries of a lost connection are dropped (the
broker redelivers them to the new one). A broker commit with an unknown outcome on a live connection makes the next
T2 reconnect first, so the broker redelivers whatever it did not take, and the inbox recognises it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from router import telemetry
from router.bridge.ackbranch import ACK_RUN, AckBranch, LocalAcks, transport_book
from router.bridge.ports import Inbox
from router.jms.transport import (
    BrokerError,
    Delivery,
    TransportError,
)
from router.routing.t2.transactions import inbox_claim
from xa.errors import UsageError

# ACK_RUN, LocalAcks, AckBranch: router.bridge.ackbranch (re-exported for existing importers)
__all__ = ["ACK_RUN", "PG_INBOX", "AckBranch", "InBatch", "InboundT2", "LocalAcks", "PgInbox", "inbox_release"]

log = logging.getLogger("nsjms.bridge")

Conn = psycopg.Connection[Any]
_BROKER_DLQ = "ActiveMQ.DLQ"
#: Deliveries settled in STOMP transactions on one broker connection after which the bridge renews it (between
#: T2s, :meth:`InboundT2._maintain`). ActiveMQ Classic (5.17) keeps every message ACKed in a transaction on a
#: client-individual subscription for the connection's life (``StompSubscription.transactedMessages``: its COMMIT
#: clears the list only for ``client`` acks) and scans that list once per prefetched message at every COMMIT: COMMITs
#: slowed in proportion to the messages moved until the bridge fell behind for good (issue 31: 73/s for 11 minutes,
#: then 15-40/s). A new connection starts that list empty; the un-acked prefetched messages of the old one are
#: redelivered, first, and are not duplicates (none was acknowledged). docs/bridge.md, "Connection renewal".
RENEW_AFTER = 1_000
#: How long a renewal waits for the bridge's T2s already decided (their STOMP COMMIT runs on the channel's completer
#: thread while the next T2 begins) before it is put off to a later round.
RENEW_WAIT_S = 10.0


def inbox_release(conn: Conn, bridge_id: int, message_ids: Sequence[str]) -> None:
    """Undo this T2's claim of ``message_ids`` (messages it dead-letters instead of turning into events)."""
    if message_ids:
        conn.execute("DELETE FROM nsjms_inbox WHERE bridge_id = %s AND message_id = ANY(%s)",
                     (bridge_id, list(message_ids)))


class PgInbox:
    """The :class:`~router.bridge.ports.Inbox` in PostgreSQL (table ``nsjms_inbox``), in the caller's unit of work."""

    def claim(self, conn: Conn, bridge_id: int, message_ids: Sequence[str], gtrid: str,
              sent_ms: Mapping[str, int | str] | None = None) -> set[str]:
        return inbox_claim(conn, bridge_id, message_ids, gtrid, sent_ms)

    def release(self, conn: Conn, bridge_id: int, message_ids: Sequence[str]) -> None:
        inbox_release(conn, bridge_id, message_ids)


PG_INBOX = PgInbox()


@dataclass
class InBatch:
    """What one T2 took from JMS: the events to store (in order) and how to refuse one of them."""

    events: list[Any] = field(default_factory=list)
    bodies: list[bytes | None] = field(default_factory=list)   # each event's CDR encoding when the bridge made one
    deliveries: list[Delivery] = field(default_factory=list)
    received: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    _reject: Callable[[int, str], None] | None = None
    _local: LocalAcks | None = None
    _branch: AckBranch | None = None

    def settle(self) -> None:
        """Non-transactional round: the caller's transaction committed; write the acks (see :class:`LocalAcks`)."""
        if self._local is not None:
            self._local.settle()

    def seal(self) -> None:
        """T2 round: every frame of the batch is in (the channel rejected what it refuses): the broker branch writes
        its last frame now and awaits the receipt while PostgreSQL prepares (:meth:`AckBranch.seal`)."""
        if self._branch is not None:
            self._branch.seal()

    def abandon(self) -> None:
        """Non-transactional round: the caller's transaction failed; the deliveries are taken again next round."""
        if self._local is not None:
            self._local.rollback()

    def reject(self, index: int, reason: str) -> None:
        """The channel refuses event ``index`` (BAD_QOS, too large): dead-letter its message in the same T2."""
        if self._reject is None:
            raise UsageError("reject on an empty batch")
        self._reject(index, reason)


class InboundT2:
    """The bridge side of JMS → channel T2s for one bridge (one subscription, one pulling proxy)."""

    def __init__(self, flow: Any, inbox: Inbox = PG_INBOX) -> None:
        self.flow = flow
        self.inbox = inbox
        self.held: list[Delivery] = []
        self.resync = False
        self.poison_nack: set[str] = set()     # dead letters the broker refused: NACK these to its DLQ
        self.committed = 0
        self.rolled_back = 0
        self.renewals = 0
        self.renew_after = RENEW_AFTER
        self._settled: tuple[Any, int] = (None, 0)  # (connection epoch, deliveries put in STOMP transactions on it)
        self._inflight: list[AckBranch] = []   # broker branches not finished yet (see RENEW_WAIT_S)
        self._lock = threading.Lock()          # one T2 at a time per bridge: deliveries keep their order

    # -- the T2 call ------------------------------------------------------------------------------------------
    def take(self, t2: Any, txn: Any, conn: Conn, max_n: int, timeout: float) -> InBatch:
        """Receive up to ``max_n`` deliveries (waiting up to ``timeout`` s for the first) inside ``txn``; ``conn``
        is the T2's PostgreSQL branch. Enlists the broker branch when something was received. Raises on a
        broker or database failure (the caller rolls the T2 back; the deliveries are kept for the next one)."""
        return self._take(conn, max_n, timeout, txn.gtrid, lambda branch: t2.enlist(txn, branch))

    def wait(self, timeout: float) -> bool:
        """Whether a round has something to take: a delivery an earlier round left on the live connection, or the
        first new one (received here, waiting up to ``timeout`` s, and kept for the round, which takes it first).
        The channel calls this BEFORE it opens its PostgreSQL connection (a pooled one) and its T2, and then
        :meth:`take` / :meth:`take_local` with no wait: an idle bridge holds no pooled connection while it waits
        for JMS, whatever the number of bridges. False while the bridge is stopped."""
        flow = self.flow
        if not flow.bridge.running():
            return False
        with self._lock:
            self._check_held()
            self._maintain()
            epoch = self._epoch()
            self.held = [d for d in self.held if epoch is None or d.epoch == epoch]
            if self.held:
                return True
            delivery = flow.receive(timeout)
            if delivery is None:
                return False
            self.held.append(delivery)
            return True

    def pop_held(self) -> Delivery | None:
        """The first delivery an earlier round left here on the live connection (a round that received it with
        :meth:`wait` and then failed: pool timeout, database outage), taken off, else None. A caller that stops
        using T2 rounds (the push loop, its channel now BestEffort or in another process) forwards these first,
        or they would stay un-acknowledged on the live subscription, which the broker never redelivers."""
        with self._lock:
            self._check_held()
            if self.resync:
                self.resync = False
                self._reconnect()
            epoch = self._epoch()
            self.held = [d for d in self.held if epoch is None or d.epoch == epoch]
            return self.held.pop(0) if self.held else None

    def take_local(self, conn: Conn, max_n: int, timeout: float) -> InBatch:
        """Without a T2 (EnableTransaction FALSE), for a channel in this process: like :meth:`take`, but the
        claims and the events go in the caller's ONE local transaction on ``conn``, and the caller writes the
        acks after it committed (``batch.settle()``) or gives the deliveries back (``batch.abandon()``)."""
        return self._take(conn, max_n, timeout, f"local:{uuid.uuid4().hex}", None)

    def _take(self, conn: Conn, max_n: int, timeout: float, gtrid: str,
              enlist: Callable[[AckBranch], object] | None) -> InBatch:
        flow = self.flow
        if not flow.bridge.running():
            return InBatch()
        with self._lock:
            self._check_held()
            self._maintain()
            deliveries = self._collect(max(1, max_n), timeout)
            if deliveries and not flow.bridge.running():
                # stop_bridge while this round waited for messages: a stopped bridge forwards nothing. They stay
                # un-acked on the kept subscription and are taken first when the bridge starts again.
                self.held = deliveries + self.held
                return InBatch()
            if not deliveries:
                return InBatch()
            stats = {"forwarded": 0, "duplicates": 0}
            letters: list[tuple[str, str, str]] = []
            branch: AckBranch | LocalAcks
            if enlist is not None:
                self._count_settled(len(deliveries))
                branch = AckBranch(flow.transport, deliveries, on_rollback=lambda b: self._hold(b, letters),
                                        on_commit=lambda: self._committed(stats, letters),
                                        on_unknown=self._unknown, background_begin=True)
                self._inflight = [b for b in self._inflight if not b.finished.is_set()] + [branch]
                try:
                    enlist(branch)
                except BaseException:
                    branch.rollback()                # nothing was begun: give the deliveries back
                    raise
            else:
                branch = LocalAcks(flow.transport, deliveries, on_rollback=lambda b: self._hold(b, letters),
                                   on_commit=lambda: self._committed(stats, letters),
                                   on_failed=lambda exc, refused: self._settle_failed(exc, refused, letters))
            batch = InBatch(received=len(deliveries))
            if isinstance(branch, LocalAcks):
                batch._local = branch
            else:
                batch._branch = branch
            try:
                self._fill(batch, branch, conn, gtrid, deliveries, letters)
            except BaseException:
                if isinstance(branch, LocalAcks):
                    branch.rollback()
                raise
            stats["forwarded"], stats["duplicates"] = len(batch.events), batch.duplicates
            return batch

    def _fill(self, batch: InBatch, branch: AckBranch | LocalAcks, conn: Conn, gtrid: str,
              deliveries: list[Delivery], letters: list[tuple[str, str, str]]) -> None:
        flow = self.flow
        bridge_id = int(flow.bridge.id)
        new = self.inbox.claim(conn, bridge_id, sorted({d.message_id for d in deliveries}), gtrid,
                               {d.message_id: d.timestamp_ms for d in deliveries})  # partition key
        released: list[str] = []

        def dead_letter(d: Delivery, reason: str) -> None:
            released.append(d.message_id)
            batch.dead_lettered += 1
            letters.append((reason, "message", d.message_id))
            if d.message_id in self.poison_nack:
                log.error("bridge %d: message %s: %s; the dead-letter destination refused it before, so it is "
                          "NACKed to %s", bridge_id, d.message_id, reason, _BROKER_DLQ)
                branch.nack(d)
                return
            dl = flow.dead_letter
            branch.send(dl.destination, dl.of_delivery(d, reason))
            branch.ack(d)

        for d in deliveries:
            if d.message_id not in new:              # an earlier T2 made its event (or an earlier copy here)
                batch.duplicates += 1
                branch.ack(d)
                continue
            new.discard(d.message_id)
            problem = flow._problem(d)
            if problem == "refuse":
                reason = ("empty, unmarked body: a Java Map/Stream/Object message the STOMP transport cannot carry "
                          f"(or an empty text); the original was moved to the broker's dead-letter queue {_BROKER_DLQ}")
                released.append(d.message_id)
                batch.dead_lettered += 1
                letters.append((reason, "refused", d.message_id))
                dl = flow.dead_letter
                if d.message_id not in self.poison_nack:     # its record was refused before: NACK alone
                    branch.send(dl.destination, dl.message(b"", reason, "refused", {
                        "nsjms_dlq_message_id": d.message_id, "nsjms_dlq_destination": d.destination,
                        "nsjms_dlq_moved_to": _BROKER_DLQ}))
                branch.nack(d)
                continue
            body = None
            if problem is None:
                event, body, problem = flow.event_encoded(d)
            if problem is not None:
                dead_letter(d, problem)
                continue
            branch.ack(d)
            batch.events.append(event)
            batch.bodies.append(body)
            batch.deliveries.append(d)

        def reject(index: int, reason: str) -> None:
            d = batch.deliveries[index]
            # its ACK is in the transaction already: add the dead letter, release the inbox claim
            dl = flow.dead_letter
            branch.send(dl.destination, dl.of_delivery(d, reason), before=d)
            self.inbox.release(conn, bridge_id, [d.message_id])
            batch.dead_lettered += 1
            letters.append((reason, "message", d.message_id))

        batch._reject = reject
        self.inbox.release(conn, bridge_id, released)

    # -- outcomes ---------------------------------------------------------------------------------------------
    def _committed(self, stats: dict[str, int], letters: list[tuple[str, str, str]]) -> None:
        flow = self.flow
        self.committed += 1
        flow.forwarded += stats["forwarded"]
        flow.duplicates += stats["duplicates"]
        for reason, origin, message_id in letters:
            self.poison_nack.discard(message_id)
            flow.dead_letter.sent(reason, origin)
            if origin == "refused":
                flow.refused += 1

        telemetry.bridge_moved(flow.bridge.id, stats["forwarded"], "from_jms")

    def _hold(self, branch: AckBranch | LocalAcks, letters: list[tuple[str, str, str]]) -> None:
        """A rolled-back T2: its deliveries stay un-acknowledged on the subscription; the next T2 takes them. When
        the broker refused a frame of a T2 that sent dead letters, those messages are NACKed next time (to the
        broker's own DLQ, the reason in the log): a refused dead letter must not stall the bridge."""
        self.rolled_back += 1
        self.held = list(branch.deliveries) + self.held
        if branch.refused and letters:
            self.poison_nack.update(m for _, _, m in letters)
            log.error("bridge %d: the broker refused a frame of a T2 with %d dead letter(s) (%s); those messages "
                      "are NACKed to %s next time", self.flow.bridge.id, len(letters), branch.refused, _BROKER_DLQ)

    def _settle_failed(self, exc: BaseException, refused: bool, letters: list[tuple[str, str, str]]) -> None:
        """Writing the acks of a committed local round failed: reconnect before the next round so the broker
        redelivers what was not acknowledged (the inbox recognises the events' messages); a refused dead letter is
        NACKed next time."""
        log.warning("bridge %d: acknowledging after the local commit failed (%s); reconnecting so the broker "
                    "redelivers (the inbox recognises what became events)", self.flow.bridge.id, exc)
        if refused:
            self.poison_nack.update(m for _, _, m in letters)
        self.flow.bridge.note_broker_problem(exc)
        self.resync = True

    def _unknown(self, exc: BaseException) -> None:
        log.warning("bridge %d: STOMP COMMIT of the ack branch not confirmed (%s); reconnecting so the broker "
                    "redelivers what it did not take (the inbox recognises those)", self.flow.bridge.id, exc)
        if isinstance(exc, BrokerError):
            self.flow.bridge.note_broker_problem(exc)
        self.resync = True

    # -- receiving --------------------------------------------------------------------------------------------
    def _collect(self, max_n: int, timeout: float) -> list[Delivery]:
        """Held deliveries of the live connection first, then new ones (waiting ``timeout`` for the first)."""
        epoch = self._epoch()
        held, self.held = self.held, []
        out = [d for d in held if epoch is None or d.epoch == epoch]
        if len(out) > max_n:
            self.held = out[max_n:]
            out = out[:max_n]
        try:
            while len(out) < max_n and self.flow.bridge.running():
                delivery = self.flow.receive(timeout if not out else 0.0)
                if delivery is None:
                    break
                out.append(delivery)
        except BaseException:
            self.held = out + self.held
            raise
        return out

    def _check_held(self) -> None:
        """Held deliveries the live connection can no longer acknowledge make the next round reconnect (issue 31:
        after the broker's disk had been full the bridge looped on "delivery … was already acknowledged or is
        unknown; retrying"). A rolled-back T2 gives its deliveries back to the transport's book with its ABORT's
        answer; an ABORT that got no answer (a receipt timeout, an ERROR: a broker stalled or failing on a full
        disk) leaves them claimed in the book while they are un-acknowledged at the broker, in flight on this
        consumer, which never redelivers them while it lives. Every later T2 then failed on the first of them, and
        the messages behind them stayed in the prefetch. Reconnecting ends the old consumer, the broker redelivers
        everything not acknowledged on the new connection, and the inbox recognises what already became an event:
        nothing is lost, nothing is doubled."""
        book = transport_book(self.flow.transport)
        pending = getattr(book, "pending", None)
        if pending is None or not self.held:
            return
        epoch = self._epoch()
        unknown = [d for d in self.held if (epoch is None or d.epoch == epoch) and not pending(d)]
        if unknown:
            log.warning("bridge %d: %d held message(s) (first %s) can no longer be acknowledged on this connection "
                        "(an ABORT went unanswered); reconnecting so the broker redelivers them", self.flow.bridge.id,
                        len(unknown), unknown[0].message_id)
            self.resync = True

    def _epoch(self) -> Any:
        """The live connection's epoch (deliveries of an earlier one are gone: the broker redelivers them), or
        None when the transport keeps no book."""
        book = transport_book(self.flow.transport)
        return getattr(book, "epoch", None) if book is not None and getattr(book, "connected", False) else None

    def _maintain(self) -> None:
        """Between T2s (the caller holds ``_lock``): reconnect after an unknown outcome, or renew a connection that
        settled :data:`RENEW_AFTER` deliveries in transactions (the broker's per-connection state, see there)."""
        if self.resync:
            self.resync = False
            self._reconnect()
            return
        epoch, settled = self._settled
        if settled >= self.renew_after and epoch is not None and epoch == self._epoch() and self._quiet():
            self._renew()

    def _quiet(self) -> bool:
        """Whether every broker branch of this bridge has finished (waiting up to :data:`RENEW_WAIT_S` for the one
        the channel's completer is committing); no new one begins meanwhile (the caller holds ``_lock``)."""
        deadline = time.monotonic() + RENEW_WAIT_S
        for branch in self._inflight:
            branch.finished.wait(max(0.0, deadline - time.monotonic()))
        self._inflight = [b for b in self._inflight if not b.finished.is_set()]
        if self._inflight:
            log.info("bridge %d: connection renewal put off: %d routing transaction(s) still finishing",
                     self.flow.bridge.id, len(self._inflight))
        return not self._inflight

    def _count_settled(self, n: int) -> None:
        epoch, settled = self._settled
        now = self._epoch()
        self._settled = (now, (settled if epoch == now else 0) + n)

    def _renew(self) -> None:
        try:
            self.flow.transport.renew()
        except TransportError as exc:
            self.flow.bridge.note_broker_problem(exc)
            self.resync = True
            raise
        finally:
            self.held = []                        # the old connection's: the broker redelivers them
            self._settled = (None, 0)
        self.resync = False                       # a renewal is a reconnect: whatever a COMMIT left unknown is
        self.renewals += 1                        # redelivered on the new connection
        log.info("bridge %d: broker connection renewed after %d transacted deliveries", self.flow.bridge.id,
                 self.renew_after)

    def _reconnect(self) -> None:
        try:
            self.flow.transport.reconnect()
        except TransportError as exc:
            self.flow.bridge.note_broker_problem(exc)
            self.resync = True
            raise
        self.held = []
