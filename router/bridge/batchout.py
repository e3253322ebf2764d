"""Channel → JMS without a routing transaction, in batches from a push proxy of this node (issue 12).

When the channel's push proxy supplier that feeds a bridge lives in the same node (the bridge's endpoint receiver is
a servant of this process), the proxy does not push one event per CORBA call: its dispatcher drains what is queued
and hands the batch in-process to :class:`LocalBatches` (the endpoint servant's outbound batches port in the node's
``LocalEndpoints``), which sends it in ONE STOMP transaction: BEGIN and the SENDs without receipts, the COMMIT
receipted. The channel side (``router.channel.localpush``) pipelines: while a COMMIT's receipt is in flight it
already writes the next batch's BEGIN and SENDs; that batch's COMMIT goes out only once the previous receipt came
back, so at most two batches are in flight and the broker never commits a later batch before an earlier one.

The guarantees are the ones of the CORBA push (``router.bridge.core``): the events of a batch leave the channel
only once the broker confirmed its COMMIT. A batch the broker refuses (an ERROR frame for one of its messages, or
for the COMMIT) is sent again one message at a time, receipted, and the refused message is dead-lettered with the
reason while the others are delivered (:meth:`ChannelToJms._send_one`); the batch written behind it is aborted and
goes back to the channel's queue, in order. A broker out of a resource (a full store or disk, usage limits, quotas,
producer flow control: ``router.jms.refusal``) refuses no message in particular: like a connection problem it
raises :class:`ForwardDeferred`, nothing is dead-lettered. A connection problem raises :class:`ForwardDeferred`:
every batch in flight goes back to the queue (a COMMIT whose receipt was lost may have happened: at most
duplicates), except the events already delivered (:attr:`Batch.handled`): the messages the one-by-one resend had
confirmed before it stopped (a dead letter refused too, a lost connection) and the events dead-lettered by the
mapping. An event the mapping cannot express is dead-lettered before its batch is sent, as on the push path.

Every message carries the JMS property ``nsjms_dedupe_id`` (:data:`router.bridge.txout.DEDUPE_PROPERTY`, the name
the routing transactions use) with the id the channel gives its event for this proxy (:meth:`LocalBatches.batch`'s
``ids``: ``e<event>/c<channel>/a<admin>/p<proxy>`` for a stored event, ``router.routing.ledger.channel_dedupe_id``, the
ledger's id of the same obligation; ``b<run>/s<seq>/…`` for a BestEffort one). A batch put back and sent again
carries the same ids, also when it is resent one message at a time, so a JMS consumer recognises every duplicate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from router import telemetry
from router.bridge.core import ChannelToJms, describe
from router.bridge.ports import ForwardDeferred
from router.bridge.txout import DEDUPE_PROPERTY
from router.jms.model import DeliveryMode, Destination, JmsMessage, JmsType, Typed
from router.jms.transport import (
    BrokerError,
    Confirm,
    EncodedMessage,
    PendingConfirmation,
    SendRefused,
    TransportError,
    resource_refusal,
)
from router.mapping.errors import MappingError
from router.routing.ports import OutboundBatch

__all__ = ["IN_FLIGHT", "STRUCTURED_BATCH", "Batch", "LocalBatches"]

log = logging.getLogger("nsjms.bridge")

#: Events per STOMP transaction for a structured push proxy (a sequence proxy's batch is its MaximumBatchSize).
STRUCTURED_BATCH = 100
#: Batches in flight at most: one whose COMMIT receipt is awaited, one written behind it (its COMMIT not yet).
IN_FLIGHT = 2

ToFrame = Callable[[Any, Destination], tuple[JmsMessage, EncodedMessage]]


@dataclass
class Batch:
    """One batch on its way: the events, their messages (the events the mapping refused were dead-lettered), the
    broker transaction and the COMMIT's pending receipt."""

    events: list[Any]
    messages: list[tuple[JmsMessage, EncodedMessage | None]] = field(default_factory=list)
    origin: list[int] = field(default_factory=list)          # the index in ``events`` of each message
    #: Indices in ``events`` of the events already delivered when the batch as a whole was not: dead-lettered by
    #: the mapping, or sent (or dead-lettered) one by one before a failure. They count as delivered: a batch put
    #: back must not send (or dead-letter) them again.
    handled: set[int] = field(default_factory=set)
    tx: str | None = None
    pending: PendingConfirmation | None = None
    committed: bool = False                      # its COMMIT was written: never ABORTed, its outcome is the broker's
    refused: TransportError | None = None        # the broker refused a frame of it: sent again one by one
    #: The dedupe id of each event (``nsjms_dedupe_id``), by index in ``events``; None: the messages carry none.
    ids: Sequence[str] | None = None


def _own(batch: OutboundBatch) -> Batch:
    """A batch the port hands back: one :meth:`LocalBatches.batch` made (the channel never makes its own)."""
    if not isinstance(batch, Batch):
        raise TypeError(f"not a batch of a bridge's local batches: {type(batch).__name__}")
    return batch


class LocalBatches:
    """The in-process face of a channel → JMS bridge to its channel's push proxy (see the module docstring).

    Used by one dispatcher thread at a time (the proxy's); every call raises :class:`ForwardDeferred` when the
    batch could not be sent or confirmed for a reason other than its content."""

    def __init__(self, flow: ChannelToJms, to_frame: ToFrame | None = None) -> None:
        self.flow = flow
        self.to_frame = to_frame

    def running(self) -> bool:
        return self.flow.bridge.running()

    # -- the steps, in order: batch, start, commit, settle (or abort) -----------------------------------------
    @staticmethod
    def batch(events: Sequence[Any], ids: Sequence[str] | None = None) -> Batch:
        """A new batch of ``events`` (the caller holds it before :meth:`start`: a failure there may have
        dead-lettered some of its events already, see :attr:`Batch.handled`). ``ids``: each event's dedupe id,
        the same every time the channel offers that event to this bridge (see the module docstring)."""
        return Batch(list(events), ids=ids)

    def start(self, batch: OutboundBatch) -> None:
        """Map the batch's events and write BEGIN and the SENDs, no receipt awaited (the SENDs through the
        transport's ``send_encoded_many`` when every message is encoded: the STOMP transport over plain TCP writes
        them with one socket write per 256 KiB)."""
        batch = _own(batch)
        flow = self.flow
        if not flow.bridge.running():
            raise ForwardDeferred("the bridge is stopped")
        ids = batch.ids
        try:                  # a dead letter the broker refuses (SendRefused) keeps the rest of the batch queued
            for i, ev in enumerate(batch.events):
                mapped = self._map(ev)
                if mapped is None:
                    batch.handled.add(i)               # dead-lettered: that is its delivery
                else:
                    if ids is not None:
                        if mapped[1] is not None:      # the frame the batch's SEND writes
                            mapped[1].headers[DEDUPE_PROPERTY] = ids[i]
                        else:
                            mapped = (_message_with(mapped[0], ids[i]), None)
                    batch.messages.append(mapped)
                    batch.origin.append(i)
        except TransportError as exc:
            raise self._deferred(exc) from None
        if not batch.messages:
            return
        try:
            transport = flow.transport
            batch.tx = transport.begin(Confirm.PIPELINED)
            encoded_all = [(encoded, msg.delivery_mode is DeliveryMode.PERSISTENT)
                           for msg, encoded in batch.messages if encoded is not None]
            if len(encoded_all) == len(batch.messages):
                transport.send_encoded_many(flow.destination, encoded_all, transaction=batch.tx)
                return
            for msg, encoded in batch.messages:
                if encoded is None:
                    transport.send(flow.destination, msg, transaction=batch.tx, confirm=Confirm.PIPELINED)
                else:
                    transport.send_encoded(flow.destination, encoded, transaction=batch.tx, confirm=Confirm.PIPELINED,
                                           persistent=msg.delivery_mode is DeliveryMode.PERSISTENT)
        except (BrokerError, SendRefused) as exc:       # a frame refused at once: found again one by one
            batch.refused = exc
            self.abort(batch)
            if resource_refusal(exc):                   # the broker is out of a resource: an outage
                raise self._deferred(exc) from None
        except TransportError as exc:
            self.abort(batch)
            raise self._deferred(exc) from None

    def commit(self, batch: OutboundBatch) -> None:
        """Write the batch's COMMIT; its receipt is awaited by :meth:`settle`."""
        batch = _own(batch)
        if batch.tx is None or batch.refused is not None:
            return
        batch.committed = True
        try:
            batch.pending = self.flow.transport.commit_pipelined(batch.tx)
        except (BrokerError, SendRefused) as exc:
            if resource_refusal(exc):                   # the broker is out of a resource: an outage
                raise self._deferred(exc) from None
            batch.refused = exc
        except TransportError as exc:
            raise self._deferred(exc) from None

    def settle(self, batch: OutboundBatch) -> bool:
        """Wait for the batch's COMMIT receipt; True when the transaction carried it all. False when the broker
        refused part of it: it was then sent again message by message (a refused one dead-lettered), and the
        caller must abort what it wrote behind it. Raises :class:`ForwardDeferred` when the outcome is not a
        confirmation (the batch stays in the channel and is offered again); the messages confirmed one by one
        before that are then in :attr:`Batch.handled` (the caller must not put their events back)."""
        batch = _own(batch)
        flow = self.flow
        clean = True
        try:
            if batch.pending is not None:
                pending, batch.pending = batch.pending, None
                try:
                    pending.wait()
                except (BrokerError, SendRefused) as exc:
                    if resource_refusal(exc):           # an outage: the batch goes back, nothing dead-lettered
                        raise
                    batch.refused = exc
            if batch.refused is not None:
                clean = False
                log.warning("bridge %d: the broker refused a transaction of %d message(s) (%s); sending them one "
                            "at a time", flow.bridge.id, len(batch.messages), batch.refused)
                with telemetry.forward_span(flow.bridge.id, len(batch.messages)):
                    for k, (msg, _) in enumerate(batch.messages):
                        if batch.origin[k] not in batch.handled:
                            if batch.ids is not None:      # the same id as the batch's SEND carried
                                msg = _message_with(msg, batch.ids[batch.origin[k]])
                            flow._send_one(msg)
                            batch.handled.add(batch.origin[k])
        except TransportError as exc:
            raise self._deferred(exc) from None
        flow.forwarded += len(batch.messages)
        telemetry.bridge_moved(flow.bridge.id, len(batch.messages), "to_jms")
        flow.bridge.acknowledge_channel(batch.events)
        return clean

    def abort(self, batch: OutboundBatch) -> None:
        """The batch is not sent: roll its transaction back (a lost connection rolled it back already). A COMMIT
        already written is not rolled back (its outcome is the broker's); its receipt is no longer waited for."""
        batch = _own(batch)
        tx, batch.tx = batch.tx, None
        pending, batch.pending = batch.pending, None
        if pending is not None:
            pending.discard()
        if tx is None or batch.committed:
            return
        try:
            self.flow.transport.abort(tx)
        except TransportError as exc:
            log.info("bridge %d: ABORT of %s failed (%s); the broker rolls it back with the connection",
                     self.flow.bridge.id, tx, exc)

    # -- helpers ---------------------------------------------------------------------------------------------
    def _map(self, event: Any) -> tuple[JmsMessage, EncodedMessage | None] | None:
        if self.to_frame is None:
            msg = self.flow._map(event)
            return None if msg is None else (msg, None)

        try:
            return self.to_frame(event, self.flow.destination)
        except MappingError as exc:
            reason = str(exc)
        except Exception as exc:  # any failure to map one event dead-letters that event, never stalls
            log.exception("bridge %d: mapping an event failed", self.flow.bridge.id)

            reason = f"mapping failed: {describe(exc)}"
        self.flow._dead_letter(self.flow.event_bytes(event), reason)
        return None

    def _deferred(self, exc: TransportError) -> ForwardDeferred:
        self.flow.bridge.note_broker_problem(exc)
        log.warning("bridge: forwarding failed, events stay in the channel: %s", exc)
        return ForwardDeferred(str(exc))


def _message_with(msg: JmsMessage, dedupe_id: str) -> JmsMessage:
    """``msg`` with the property ``nsjms_dedupe_id``: for a message sent (encoded again) one by one."""
    if DEDUPE_PROPERTY in msg.properties:
        return msg
    return replace(msg, properties={**msg.properties, DEDUPE_PROPERTY: Typed(JmsType.STRING, dedupe_id)})
