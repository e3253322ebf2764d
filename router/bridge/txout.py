"""The bridge's part in a channel → JMS routing transaction (T2, NJI 2.7.2 / 2.7.4 / 2.7.5.1), free of the ORB.

The channel's push proxy supplier is the transaction client: it begins the T2, enlists its PostgreSQL branch
(the batch's queue rows are deleted in it) and hands the batch in-process to :meth:`OutboundT2.forward_in_t2`
(found through ``NodeTransactions.local`` by the stringified IOR of the bridge's endpoint receiver). The bridge,
a transactional object that never decides (NJI 2.7.4), then in the SAME PostgreSQL branch and T2:

1. maps every event (NJI 2.4); an event the mapping cannot express becomes a dead letter for the bridge's
   dead-letter destination (reason in its properties), a message of this T2 like the others: atomic with the
   rest of the batch;
2. gives message ``i`` (0-based, dead letters included) the dedupe id ``xa.xid.dedupe_id(gtrid, i)``, carried as
   the JMS property ``nsjms_dedupe_id`` and, when the bridge's broker settings ask for it
   (``BrokerSettings.amq_dupl_id``; off by default: ActiveMQ Classic ignores it, Artemis drops a duplicate
   itself), as ``_AMQ_DUPL_ID``;
3. inserts one outbox row per message (its encoding exactly as sent, with the codec's name: recovery re-sends the
   same bytes);
4. enlists the broker SEND branch (:class:`router.bridge.txbranch.SendBranch`) and sends the frames in its STOMP
   transaction, the last one receipted.

**The frames go out while the mapping goes on** (issue 12, round 4): every :attr:`OutboundT2.send_chunk` mapped
frames (dedupe ids set) are written at once, receipt-less, in the T2's STOMP transaction
(:meth:`SendBranch.send_many`: one socket write per run of frames to the same destination, through the STOMP
transport's ``send_encoded_many``), before the next events are mapped, so the broker works through them meanwhile;
while the T2's background BEGIN has no receipt yet (queued at the broker behind a COMMIT) mapping goes on instead
of waiting, and the chunk grows. The last frame is never in such a chunk: it carries the receipt. The wire bytes and
their order are those of one SEND per frame. A chunk refused or not written fails the T2 at once (the rest is not
mapped).

Steps 3 and 4 overlap: the outbox INSERT goes out in psycopg's pipeline mode, then the frames not written yet and
the receipted last one, and the INSERT's result is read once they are written, so PostgreSQL stores the rows while
the broker takes the frames (both are uncommitted work of the same T2 until its decision, so their order does not
matter). A failed INSERT raises when the pipeline ends, before ``forward_in_t2`` returns: the T2 then rolls back as
for any other failure.

**Two broker connections** (``alt_transport``): consecutive T2s go out on the bridge's two STOMP connections in turn.
One connection makes the broker handle its frames one after another, so T2 *n+1*'s BEGIN and SENDs would wait at
the broker behind T2 *n*'s COMMIT (the broker's disk sync, in the proxy's phase two); on the other connection the
broker takes them while it commits T2 *n*. The order of the commits is the proxy's completer's (one phase two at a
time, each COMMIT receipted before the next starts), so the batches still become visible in the order they were
taken; a T2 lives on one connection from BEGIN to COMMIT/ABORT, so its transaction book is that connection's.

**Stopping** (:meth:`OutboundT2.quiesce`, the node's stop and the bridge's destroy): no new T2 is admitted and the
ones in progress are waited for (bounded) before the broker connections close, so a decided T2's STOMP COMMIT is
not cut off by the stop (it would end UNKNOWN and be re-sent by recovery at the next start, a duplicate when the
broker had already committed it). A T2 still running after the bound is left to recovery (its COMMIT record, if
decided, stays in the log).

Any failure marks the T2 rollback-only with the reason and raises :class:`ForwardFailed` (``content`` True when
the broker refused a frame: the batch, not the broker, is the problem; the channel then narrows it down). The
commit and every decision stay with the channel.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from router import telemetry
from router.bridge.ports import Outbox
from router.bridge.txbranch import SendBranch
from router.jms.model import BodyType, DeliveryMode, Destination, JmsMessage, JmsType, Typed
from router.jms.transport import EncodedMessage, MessageCodec, SendRefused, Transport, stomp_destination
from router.mapping.errors import MappingError
from router.routing.errors import ForwardFailed
from router.routing.ledger import t2_dead_letter
from router.routing.outbox import OutboxRow, outbox_insert
from router.routing.ports import Conn, Forwarded
from xa.errors import TransactionRolledBack
from xa.xid import dedupe_id

__all__ = ["DEDUPE_PROPERTY", "DUPL_ID_HEADER", "PG_OUTBOX", "ForwardFailed", "Forwarded", "OutboundT2", "PgOutbox"]

log = logging.getLogger("nsjms.bridge")

DEDUPE_PROPERTY = "nsjms_dedupe_id"
DUPL_ID_HEADER = "_AMQ_DUPL_ID"
#: Mapped frames of a T2 written to the broker together while the next ones are mapped (module docstring).
SEND_CHUNK = 25


class PgOutbox:
    """The :class:`~router.bridge.ports.Outbox` in PostgreSQL (table ``nsjms_outbox``), in the caller's branch."""

    def insert(self, conn: Any, rows: Sequence[OutboxRow]) -> None:
        outbox_insert(conn, rows)


PG_OUTBOX = PgOutbox()


@dataclass(frozen=True)
class _Frame:
    destination: str
    encoded: EncodedMessage
    persistent: bool


class OutboundT2:
    """One channel → JMS bridge as a T2 participant (see the module docstring). Thread-safe."""

    def __init__(self, bridge_id: int, destination: Destination, transport: Callable[[], Transport],
                 codec: MessageCodec, to_jms: Callable[[Any, Destination], JmsMessage],
                 event_bytes: Callable[[Any], bytes], dead_letter: Destination, enlist: Callable[[Any, Any], Any],
                 running: Callable[[], bool], note_problem: Callable[[Exception], None] | None = None, *,
                 amq_dupl_id: bool = False,
                 to_frame: Callable[[Any, Destination], tuple[JmsMessage, EncodedMessage]] | None = None,
                 outbox: Outbox = PG_OUTBOX, alt_transport: Callable[[], Transport] | None = None,
                 send_chunk: int = SEND_CHUNK) -> None:
        self.bridge_id = bridge_id
        self.destination = destination
        self.transport = transport
        self.alt_transport = alt_transport   # the second connection: consecutive T2s alternate (module docstring)
        self._turn = False
        self._closing = False
        self.codec = codec
        self.to_jms = to_jms
        self.event_bytes = event_bytes
        self.dead_letter = dead_letter
        self.enlist = enlist                 # NodeTransactions.enlist (passes the crash points)
        self.running = running
        self.note_problem = note_problem     # wakes the bridge's supervisor after a broker failure
        self.amq_dupl_id = amq_dupl_id
        # map AND encode in one step (the bridge encodes to check the broker's limits: encoding once saves that
        # work per event); its encoding must be ``codec``'s. None: ``to_jms`` then ``codec.encode``
        self.to_frame = to_frame
        self.outbox = outbox                 # where the T2's messages are kept for recovery (ports.Outbox)
        self.send_chunk = send_chunk         # mapped frames written at once while the mapping goes on
        self.forwarded = 0
        self.dead_lettered = 0
        self.committed = 0
        self.rolled_back = 0
        self.last_rollback = ""
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)   # notified when a T2 ends (quiesce)
        self._active: dict[str, Any] = {}          # gtrid -> transaction in progress
        self._early: dict[str, SendBranch] = {}    # gtrid -> broker branch enlisted by begin_in_t2
        self.on_idle: Callable[[], None] | None = None     # set by the bridge: a disable waits for this
        # set by the bridge: True while a disable_transaction waits for the T2s in progress; no new T2 starts then
        self.draining: Callable[[], bool] | None = None

    # -- state ------------------------------------------------------------------------------------------------
    def active(self) -> bool:
        """True while a T2 of this bridge is in progress (from forward to its end)."""
        with self._lock:
            return bool(self._active)

    def ended(self, gtrid: str, result: Forwarded | None, committed: bool, reason: str = "") -> None:
        """Called by the transaction client once the T2 ended (committed, rolled back, or handed to recovery)."""
        with self._lock:
            was = self._active.pop(gtrid, None) is not None
            self._early.pop(gtrid, None)
            idle = not self._active
            if committed and result is not None:
                self.committed += 1
                self.forwarded += result.sent
                self.dead_lettered += result.dead_lettered
            elif not committed and was:
                self.rolled_back += 1
                self.last_rollback = reason
            self._idle.notify_all()
        if committed and result is not None:
            telemetry.bridge_moved(self.bridge_id, result.sent, "to_jms")
            for _ in range(result.dead_lettered):
                telemetry.bridge_dead_letter(self.bridge_id, "event")
        if idle and self.on_idle is not None:
            self.on_idle()

    def quiesce(self, timeout: float) -> bool:
        """Admit no new T2 from now on and wait up to ``timeout`` seconds until the T2s in progress ended (their
        phase two included); True when none is left. Called before the broker connections close (module
        docstring, "Stopping")."""
        with self._idle:
            self._closing = True
            return self._idle.wait_for(lambda: not self._active, timeout)

    def status(self) -> dict[str, Any]:
        with self._lock:
            overdue = sum(1 for t in self._active.values() if getattr(t, "timed_out", False))
            return {"t2_active": len(self._active), "t2_overdue": overdue, "t2_committed": self.committed,
                    "t2_rolled_back": self.rolled_back, "t2_last_rollback": self.last_rollback or None}

    # -- the work ---------------------------------------------------------------------------------------------
    def begin_in_t2(self, txn: Any) -> None:
        """Enlist the broker branch of ``txn`` now, its STOMP BEGIN's receipt awaited in the background
        (``SendBranch(background_begin=True)``): the channel calls this before its own work on the T2's PostgreSQL
        branch, which then overlaps the BEGIN (queued at the broker behind the previous T2's COMMIT on the same
        connection). :meth:`forward_in_t2` sends in that branch. Failures as in :meth:`forward_in_t2`."""
        self._admit(txn)
        if not self.running():
            self._fail(txn, "the bridge is not started", content=False)
        branch = self._enlist(txn, background=True)
        with self._lock:
            self._early[txn.gtrid] = branch

    def forward_in_t2(self, txn: Any, conn: Conn, events: Sequence[Any], *,
                      dead_letter_reason: str | None = None) -> Forwarded:
        """Carry ``events`` in ``txn`` (see the module docstring); with ``dead_letter_reason`` every event goes to
        the dead-letter destination with that reason instead (the channel isolated a poison event)."""
        self._admit(txn)
        if not self.running():
            self._fail(txn, "the bridge is not started", content=False)
        frames: list[_Frame] = []
        rows: list[OutboxRow] = []
        dead = 0
        written = 0                              # frames[:written] are on the wire (receipt-less)
        branch: SendBranch | None = None
        last = len(events) - 1                   # one frame per event: the last one carries the receipt
        codec = self.codec.name                  # every frame is this codec's encoding (``to_frame`` too)
        for i, event in enumerate(events):
            frame, refused = self._frame_of(event, dead_letter_reason)
            dead += refused is not None
            frames.append(frame)
            did = self._dedupe(frame, txn.gtrid, i)
            if refused is not None and dead_letter_reason is None:   # the mapping's: its ledger row says so
                t2_dead_letter(conn, did, refused)
            rows.append(OutboxRow(txn.gtrid, i, did, self.bridge_id,
                                  frame.destination, {**frame.encoded.headers,
                                                      "persistent": "true" if frame.persistent else "false"},
                                  frame.encoded.body, codec))
            if i - written + 1 >= self.send_chunk and i < last:     # a chunk goes out while mapping continues
                branch = branch or self._branch(txn)
                if branch.begun():               # else mapping goes on; the chunk grows until the BEGIN is in
                    self._send_many(txn, branch, frames, written, i + 1)
                    written = i + 1
        branch = branch or self._branch(txn)
        with conn.pipeline():                    # the INSERT's result is read when the block ends (see above)
            self.outbox.insert(conn, rows)
            if frames:
                self._send_many(txn, branch, frames, written, len(frames) - 1)
                self._send_last(txn, branch, frames[-1], len(frames) - 1)
        return Forwarded(txn.gtrid, len(frames) - dead, dead)

    def _admit(self, txn: Any) -> None:
        """``txn`` becomes one of the bridge's T2s in progress, unless a disable_transaction is pending
        (:attr:`draining`): then the new T2 is refused as an outage (rollback-only, ``ForwardFailed`` without
        ``content``: its events go back to the queue, nothing counts against them) so that the T2s in progress end,
        the bridge becomes idle and the disable takes effect (under steady traffic the next T2 would otherwise
        always start before the previous one ended, and the disable would never apply)."""
        with self._lock:
            if txn.gtrid in self._active:            # begin_in_t2 admitted it already
                return
            closing = self._closing
            if not closing and (self.draining is None or not self.draining()):
                self._active[txn.gtrid] = txn
                return
        if closing:
            self._fail(txn, "the bridge is stopping: no new routing transaction starts", content=False)
        self._fail(txn, "disable_transaction is pending: no new routing transaction starts", content=False)

    def _pick(self) -> Callable[[], Transport]:
        """The connection of a new T2: the two in turn when the bridge has two (module docstring)."""
        if self.alt_transport is None:
            return self.transport
        with self._lock:
            self._turn = not self._turn
            return self.alt_transport if self._turn else self.transport

    def _enlist(self, txn: Any, *, background: bool) -> SendBranch:
        try:
            branch = SendBranch(self._pick()(), on_problem=self._noted, background_begin=background)
            self.enlist(txn, branch)
        except TransactionRolledBack:            # past its deadline: the coordinator rolled it back already
            raise
        except Exception as exc:  # noqa: BLE001 — BranchUnavailable, BrokerUnavailable: the broker is out of reach
            self._noted(exc)
            self._fail(txn, f"broker unavailable: {type(exc).__name__}: {exc}", content=False)
        return branch

    def _branch(self, txn: Any) -> SendBranch:
        """The T2's broker branch: the one :meth:`begin_in_t2` enlisted, or a new one."""
        with self._lock:
            early = self._early.pop(txn.gtrid, None)
        return early if early is not None else self._enlist(txn, background=False)

    def _send_many(self, txn: Any, branch: SendBranch, frames: list[_Frame], start: int, stop: int) -> None:
        """Write ``frames[start:stop]`` receipt-less in the T2's STOMP transaction, in order, one
        ``SendBranch.send_many`` per run of frames to the same destination (a dead letter starts a new run)."""
        while start < stop:
            dest = frames[start].destination
            end = start + 1
            while end < stop and frames[end].destination == dest:
                end += 1
            try:
                branch.send_many(dest, [(f.encoded, f.persistent) for f in frames[start:end]])
            except Exception as exc:  # noqa: BLE001 — translated as for one frame (_send_failed)
                self._send_failed(txn, exc, branch.sent)
            start = end

    def _send_last(self, txn: Any, branch: SendBranch, frame: _Frame, index: int) -> None:
        try:
            branch.send(frame.destination, frame.encoded, persistent=frame.persistent, last=True, background=True)
        except Exception as exc:  # noqa: BLE001 — translated (_send_failed)
            self._send_failed(txn, exc, index)

    def _send_failed(self, txn: Any, exc: Exception, index: int) -> None:
        if isinstance(exc, SendRefused):
            self._fail(txn, f"broker refused message {index} of the batch: {exc.message or exc.reason}",
                       content=True)
        self._noted(exc)                         # SendFailed, UnconfirmedOutcome, BrokerUnavailable, ...
        self._fail(txn, f"sending to the broker failed: {type(exc).__name__}: {exc}", content=False)

    def _noted(self, exc: Exception) -> None:
        if self.note_problem is not None:
            self.note_problem(exc)

    def _fail(self, txn: Any, reason: str, *, content: bool) -> None:
        txn.set_rollback_only(f"bridge {self.bridge_id}: {reason}")
        raise ForwardFailed(reason, content=content)

    def _dedupe(self, frame: _Frame, gtrid: str, idx: int) -> str:
        did = dedupe_id(gtrid, idx)
        frame.encoded.headers[DEDUPE_PROPERTY] = did
        if self.amq_dupl_id:
            frame.encoded.headers[DUPL_ID_HEADER] = did
        return did

    def _frame_of(self, event: Any, dead_letter_reason: str | None) -> tuple[_Frame, str | None]:
        """The frame of ``event`` and, when it is a dead letter (unmappable, or ``dead_letter_reason``), why."""

        reason = dead_letter_reason
        if reason is None:
            try:
                if self.to_frame is not None:
                    msg, encoded = self.to_frame(event, self.destination)
                    return self._encoded(self.destination, msg, encoded), None
                return self._frame(self.destination, self.to_jms(event, self.destination)), None
            except MappingError as exc:
                reason = str(exc)
            except Exception as exc:
                log.exception("bridge %d: mapping an event failed", self.bridge_id)
                reason = f"mapping failed: {type(exc).__name__}: {exc}"
        log.warning("bridge %d: dead-lettering an event to %s in its routing transaction: %s", self.bridge_id,
                    self.dead_letter.stomp(), reason)
        return self._frame(self.dead_letter, self._dead_letter(self.event_bytes(event), reason)), reason

    def _frame(self, destination: Destination, msg: JmsMessage) -> _Frame:
        return self._encoded(destination, msg, self.codec.encode(msg))

    @staticmethod
    def _encoded(destination: Destination, msg: JmsMessage, encoded: EncodedMessage) -> _Frame:
        return _Frame(stomp_destination(destination), EncodedMessage(dict(encoded.headers), encoded.body),
                      msg.delivery_mode is DeliveryMode.PERSISTENT)

    def _dead_letter(self, body: bytes, reason: str) -> JmsMessage:
        props = {"nsjms_dlq_reason": Typed(JmsType.STRING, reason[:1000]),
                 "nsjms_dlq_bridge": Typed(JmsType.INT, self.bridge_id),
                 "nsjms_dlq_origin": Typed(JmsType.STRING, "event")}
        return JmsMessage(BodyType.BYTES, body, destination=self.dead_letter, properties=props)
