"""The bridge core: the data paths of a bridge, channel → JMS and JMS → channel (NJI 2.3, 2.4, 2.6), free of the ORB.

The core decides what happens to every event and message; it reaches the channel, the broker and the bridge only
through the ports of ``router.bridge.ports``. The CORBA servants that connect it to a channel are thin adapters in
``router.bridge.flows``; the JMS → channel rounds (push loop, pull supply) are in ``router.bridge.jmsin``.

Channel → JMS: events leave the channel only once the broker confirmed them (receipt of the SEND, or of the COMMIT
of a STOMP transaction for a batch). A push that cannot be forwarded raises :class:`ForwardDeferred` (the adapter
answers ``TRANSIENT`` to the channel, which keeps the events queued and retries with backoff; a retried push is
sent in full: what the broker stored before a part-way failure is sent again, duplicates never a loss); a pull
receiver re-sends the same batch until it is confirmed, less what of it the broker already took (the channel keeps
a pulled event stored until the next pull). An
event the mapping cannot express goes to the dead-letter destination with the reason; if even that send fails, the
event stays in the channel.

JMS → channel: a message is acknowledged to the broker only after the channel accepted the event (for persistent
events: committed). A crash in between makes the broker redeliver. When the channel pulls from the bridge (a
Persistent channel of this node) the channel calls ``PullSupply.take_in_t2`` / ``take_local`` in-process and the
message ids go to the inbox with the events (``router.bridge.t2in``): exactly once. Otherwise (push configuration,
BestEffort channel) the bridge remembers recently forwarded message ids and acknowledges a redelivered duplicate
without forwarding it twice. An unmappable message, or one whose event the channel refuses
(:class:`~router.bridge.ports.EventRefused`), is dead-lettered with the reason and then acknowledged.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from router import telemetry
from router.bridge.ports import BatchSource, BridgeHost, ChannelError, ChannelGone, ForwardDeferred, Inbox
from router.jms.model import BodyType, DeliveryMode, Destination, JmsMessage, JmsType, Typed
from router.jms.transport import (
    BrokerError,
    Confirm,
    Delivery,
    SendRefused,
    Transport,
    TransportError,
    resource_refusal,
)
from router.routing.eventsize import DEFAULT_MAX_EVENT_BYTES

__all__ = ["BROKER_DLQ", "DEFAULT_DLQ", "MAX_EVENT_BYTES", "ChannelPuller", "ChannelToJms", "DeadLetter",
           "JmsToChannel", "untransportable"]

log = logging.getLogger("nsjms.bridge")

DEFAULT_DLQ = Destination("queue", "nsjms.DLQ")
BROKER_DLQ = "ActiveMQ.DLQ"
#: Largest event (CDR-encoded StructuredEvent) a JMS → channel bridge hands to the channel: the node's one limit
#: (``node.max_event_bytes``, passed as ``BrokerSettings.max_event_bytes``), the same the channel refuses above
#: with IMP_LIMIT and the ORB's giopMaxMsgSize is derived from. Larger messages are dead-lettered with the reason.
MAX_EVENT_BYTES = DEFAULT_MAX_EVENT_BYTES
MAX_BACKOFF = 5.0


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text[:500]}" if text else type(exc).__name__


class DeadLetter:
    """Sends what cannot be routed to the dead-letter destination, with the reason in its properties."""

    def __init__(self, transport_for: Callable[[], Transport], bridge_id: int,
                 destination: Destination = DEFAULT_DLQ, fits: Callable[[JmsMessage], None] | None = None) -> None:
        self._transport_for = transport_for
        #: raises MappingError when a message would not fit the broker's limits (the bridge's codec check)
        self.fits = fits
        self.bridge_id = bridge_id
        self.destination = destination
        self.count = 0
        #: Set while the broker refuses writes to the dead-letter destination (the bridge's status shows it).
        self.problem = ""
        self._reported: collections.OrderedDict[str, None] = collections.OrderedDict()

    def refused(self, exc: SendRefused, what: str, key: str, reason: str) -> None:
        """The broker refused a dead letter: record it for the status, and log it at ERROR once per ``key`` (one
        event or message), not once per retry."""
        self.problem = (f"dead-letter destination refused: {self.destination.stomp()}: "
                        f"{exc.message or exc.reason}")
        if key in self._reported:
            return
        self._reported[key] = None
        while len(self._reported) > 10_000:
            self._reported.popitem(last=False)
        log.error("bridge %d: the broker refused the dead letter of %s (%s); %s. Reason it was dead-lettered: %s",
                  self.bridge_id, what, self.problem, "it stays in the channel and is retried"
                  if what.startswith("an event") else f"it is NACKed to {BROKER_DLQ}", reason)

    def message(self, body: bytes, reason: str, origin: str, extra: dict[str, str] | None = None) -> JmsMessage:
        """The dead letter for ``body``: the original bytes, the reason and where it came from in its properties."""
        props = {"nsjms_dlq_reason": Typed(JmsType.STRING, reason[:1000]),
                 "nsjms_dlq_bridge": Typed(JmsType.INT, self.bridge_id),
                 "nsjms_dlq_origin": Typed(JmsType.STRING, origin)}
        for k, v in (extra or {}).items():
            props[k] = Typed(JmsType.STRING, v)
        return JmsMessage(BodyType.BYTES, body, destination=self.destination, properties=props)

    def of_delivery(self, delivery: Delivery, reason: str) -> JmsMessage:
        """The dead letter of a JMS message the bridge cannot route: the original as it arrived (its body kind and
        body, its application properties, priority, delivery mode, type, correlation id and reply-to; not its
        expiration: a dead letter is kept until an operator acts) with the reason, the bridge, its message id and
        source destination added as ``nsjms_dlq_*`` properties. So a retry (``nsjms deadletter broker retry``)
        gives the bridge the message it refused, not only its bytes. A message the codec could not decode is kept
        as its raw bytes, and so is one whose copy would not fit the broker's limits with the reason added (the
        codec's check). A dead letter is always PERSISTENT (a broker restart keeps it); the original's delivery mode
        is in ``nsjms_dlq_delivery_mode``."""
        from router.mapping.errors import MappingError

        extra = {"nsjms_dlq_message_id": delivery.message_id, "nsjms_dlq_destination": delivery.destination}
        letter = self.message(delivery.body, reason, "message", extra)
        if delivery.decode_error is not None:
            return letter
        original = delivery.message
        kept = {k: v for k, v in original.properties.items() if not k.startswith("nsjms_dlq_")}
        mode = Typed(JmsType.STRING, original.delivery_mode.name)
        full = JmsMessage(original.body_type, original.body, destination=self.destination,
                          delivery_mode=DeliveryMode.PERSISTENT, priority=original.priority,
                          correlation_id=original.correlation_id, reply_to=original.reply_to,
                          jms_type=original.jms_type,
                          properties={**kept, **letter.properties, "nsjms_dlq_delivery_mode": mode})
        try:
            if self.fits is not None:
                self.fits(full)
        except (MappingError, ValueError) as exc:
            log.warning("bridge %d: the dead letter of message %s is its body alone: with its properties it does not "
                        "fit (%s)", self.bridge_id, delivery.message_id, exc)
            return letter
        return full

    def send(self, body: bytes, reason: str, origin: str, extra: dict[str, str] | None = None) -> None:
        """Raises :class:`TransportError` if the dead letter could not be stored by the broker."""
        self.send_message(self.message(body, reason, origin, extra), reason, origin)

    def send_message(self, msg: JmsMessage, reason: str, origin: str) -> None:
        """Send a dead letter made by :meth:`message` or :meth:`of_delivery`; raises :class:`TransportError` if the
        broker did not store it."""
        self._transport_for().send(self.destination, msg, confirm=Confirm.CONFIRMED)
        self.sent(reason, origin)

    def sent(self, reason: str, origin: str) -> None:
        """Count and log one dead letter the broker stored (directly, or in a committed transaction)."""
        self.count += 1
        self.problem = ""
        telemetry.bridge_dead_letter(self.bridge_id, origin)
        log.warning("bridge %d: dead-lettered a %s to %s: %s", self.bridge_id, origin, self.destination.stomp(),
                    reason)


# ----------------------------------------------------------------------------------------------------------
# Channel → JMS
# ----------------------------------------------------------------------------------------------------------
class ChannelToJms:
    """Forwards structured events to one JMS destination; used by the receiver servants below."""

    def __init__(self, bridge: BridgeHost, destination: Destination, transport: Transport,
                 to_jms: Callable[[Any, Destination], JmsMessage], dead_letter: DeadLetter,
                 event_bytes: Callable[[Any], bytes]) -> None:
        self.bridge = bridge
        self.destination = destination
        self.transport = transport
        self.to_jms = to_jms
        self.dead_letter = dead_letter
        self.event_bytes = event_bytes
        self.forwarded = 0
        self._lock = threading.Lock()     # one batch at a time: order is kept

    def forward(self, events: Sequence[Any], progress: set[int] | None = None) -> None:
        """Map and send; returns once the broker confirmed every message. Raises TransportError otherwise.

        ``progress``, when given, is the caller's record of this very batch, kept by the caller across its retries
        of the same event objects (a pull receiver's pending batch): the indexes of the events an earlier attempt
        handled (stored by the broker, or dead-lettered). They are skipped, and each event handled now is added
        as soon as the broker confirmed it, so a retry of a batch that failed part-way sends only the rest.

        Without ``progress`` (a push from the channel over CORBA) the whole batch is sent every time: nothing
        proves that a re-offered event is the one offered before (two events can have the same content, and the
        channel does not always re-offer the same head: expiry, discard policy, priority order), so what the
        broker stored before the failure is sent again — duplicates, never a loss."""
        handled = progress if progress is not None else set()
        messages: list[tuple[int, JmsMessage]] = []
        for i, ev in enumerate(events):
            if i in handled:
                continue
            msg = self._map(ev)
            if msg is None:
                handled.add(i)                           # dead-lettered
            else:
                messages.append((i, msg))
        with self._lock, telemetry.forward_span(self.bridge.id, len(messages)):
            self._send(messages, handled)
        self.forwarded += len(messages)
        telemetry.bridge_moved(self.bridge.id, len(messages), "to_jms")

    def _map(self, event: Any) -> JmsMessage | None:
        """The message for ``event``; None once the event was dead-lettered. An event the channel handed over
        CORBA with its dedupe id in the variable header (router.channel.dedupe) is mapped without it, and the
        message carries it as its ``nsjms_dedupe_id`` property."""
        from router.mapping.dedupe import DEDUPE_HEADER, taken  # router.mapping loads the ORB: not at import
        from router.mapping.errors import MappingError

        event, dedupe_id = taken(event)
        try:
            msg = self.to_jms(event, self.destination)
            if dedupe_id is None:
                return msg
            return replace(msg, properties={**msg.properties, DEDUPE_HEADER: Typed(JmsType.STRING, dedupe_id)})
        except MappingError as exc:
            reason = str(exc)
        except Exception as exc:  # any failure to map one event dead-letters that event, never stalls
            log.exception("bridge %d: mapping an event failed", self.bridge.id)
            reason = f"mapping failed: {describe(exc)}"
        self._dead_letter(self.event_bytes(event), reason)
        return None

    def _dead_letter(self, body: bytes, reason: str) -> None:
        """Dead-letter one event. If the broker refuses the dead letter too, :class:`SendRefused` propagates (the
        push answers TRANSIENT, the event stays in the channel: nothing lost) and the refusal is made visible."""
        try:
            self.dead_letter.send(body, reason, "event")
        except SendRefused as exc:
            key = hashlib.sha256(body + b"\0" + reason.encode()).hexdigest()
            self.dead_letter.refused(exc, "an event", key, reason)
            raise

    def _send(self, messages: list[tuple[int, JmsMessage]], handled: set[int]) -> None:
        """Send ``messages`` (index in the batch, message); the index of each one stored or dead-lettered is added
        to ``handled`` as soon as the broker confirmed it."""
        if not messages:
            return
        if len(messages) > 1:
            try:                                         # a pushed sequence: one STOMP transaction (atomic send);
                self._send_transaction([m for _, m in messages])  # routing transactions (T2): router.bridge.txout
            except (BrokerError, SendRefused) as exc:    # one message refused: find it, keep the rest
                if resource_refusal(exc):                # the broker is out of a resource: an outage
                    raise
            else:
                handled.update(i for i, _ in messages)
                return
        for i, msg in messages:
            self._send_one(msg)
            handled.add(i)

    def _send_one(self, msg: JmsMessage) -> None:
        """A message the broker refuses with an ERROR frame (:class:`SendRefused`) would be refused again:
        dead-letter it (the bridge must not stall on it). Connection problems (:class:`SendFailed`,
        :class:`BrokerUnavailable`, :class:`UnconfirmedOutcome`) and a broker out of a resource (:class:`BrokerFull`:
        a full store, usage limits, quotas, producer flow control) propagate: the event stays in the channel."""
        try:
            self.transport.send(self.destination, msg, confirm=Confirm.CONFIRMED)
        except SendRefused as exc:
            reason = f"broker refused the message: {exc.message or exc.reason}"
            self._dead_letter(self.transport.encode(msg).body, reason)

    def _send_transaction(self, chunk: list[JmsMessage]) -> None:
        tx = self.transport.begin(Confirm.PIPELINED)
        try:
            for msg in chunk:
                self.transport.send(self.destination, msg, transaction=tx, confirm=Confirm.PIPELINED)
        except BaseException:
            try:
                self.transport.abort(tx)
            except TransportError:
                pass
            raise
        self.transport.commit(tx)

    def deliver(self, events: list[Any]) -> None:
        """A push from the channel: forward ``events``, then acknowledge them to an Ack proxy (NJI 2.6.2). Raises
        :class:`ForwardDeferred` when they could not be forwarded (stopped bridge, broker problem): they stay in
        the channel."""
        if not self.bridge.running():
            raise ForwardDeferred("the bridge is stopped")
        try:
            self.forward(events)
        except TransportError as exc:
            self.bridge.note_broker_problem(exc)
            log.warning("bridge: forwarding failed, events stay in the channel: %s", exc)
            raise ForwardDeferred(str(exc)) from None
        self.bridge.acknowledge_channel(events)


class ChannelPuller:
    """Channel → JMS, pull style: pulls batches from a :class:`~router.bridge.ports.BatchSource`, paced by the
    endpoint's PacingInterval, and forwards them.

    A batch that could not be sent is kept on this object (not in the worker), so after a stop/start it is sent
    before anything new is pulled: the channel confirms a pulled batch when the next pull arrives. With it the
    puller keeps which of its events were already handled (:attr:`done`: stored by the broker or dead-lettered
    before the failure); these are the same event objects, so the resend skips them (no duplicate).

    Only the current worker (the one whose stop event is :attr:`stop`) writes :attr:`pending` or acknowledges
    from it, under :attr:`_lock`. A worker of an earlier start that is still inside ``forward`` or the channel's
    ``acknowledge`` works on its own batch only: it neither acknowledges nor clears the batch of the worker that
    replaced it (what it already forwarded is sent again by the new worker at most: at-least-once, no loss). A
    batch it pulled after it was replaced goes to :attr:`orphans`, sent by the current worker before it pulls."""

    def __init__(self, flow: ChannelToJms, source: BatchSource | None, pacing_s: Callable[[], float],
                 stop: threading.Event) -> None:
        self.flow = flow
        self.source = source
        self.pacing_s = pacing_s          # read every round: PacingInterval can change while the bridge runs
        self.stop = stop
        self.pending: list[Any] = []
        #: Indexes of ``pending`` already stored by the broker or dead-lettered (ChannelToJms.forward's progress).
        self.done: set[int] = set()
        #: Batches pulled by a worker after it was replaced: nobody has sent them yet.
        self.orphans: list[list[Any]] = []
        self._lock = threading.Lock()

    def run(self) -> None:
        stop = self.stop                 # this worker's generation; a restart gets a new event
        source = self.source
        assert source is not None, "ChannelPuller.run before a source was attached"
        backoff = 0.05
        while not stop.is_set():
            with self._lock:
                if self.stop is not stop:
                    return
                if not self.pending and self.orphans:
                    self.pending, self.done = self.orphans.pop(0), set()
                batch, done = self.pending, self.done
            if not batch:
                try:
                    pulled = source.pull()
                except ChannelGone:
                    self.flow.bridge.channel_disconnected()
                    return
                except ChannelError as exc:
                    log.warning("bridge: pull from the channel failed: %s", exc)
                    stop.wait(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF)
                    continue
                if not pulled:
                    stop.wait(self.pacing_s() or 0.05)
                    continue
                with self._lock:
                    if self.stop is not stop:           # replaced while pulling: the current worker sends it
                        self.orphans.append(pulled)
                        return
                    self.pending, self.done = pulled, set()
                batch, done = pulled, self.done
            try:
                self.flow.forward(batch, done)
            except Exception as exc:  # noqa: BLE001 — keep the batch and send it again, pull nothing meanwhile
                self.flow.bridge.note_broker_problem(exc)
                stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
                continue
            with self._lock:
                if self.stop is not stop:               # replaced: the batch (if still pending) is the new worker's
                    return
                if self.pending is batch:
                    self.pending, self.done = [], set()
            self.flow.bridge.acknowledge_channel(batch)   # this worker's own batch, all of it confirmed
            backoff = 0.05


# ----------------------------------------------------------------------------------------------------------
# JMS → channel
# ----------------------------------------------------------------------------------------------------------
class JmsToChannel:
    """Receives from one JMS destination and hands events to the channel; acks only what the channel accepted."""

    RECENT = 10_000

    def __init__(self, bridge: BridgeHost, transport: Transport, to_event: Callable[[JmsMessage], Any],
                 dead_letter: DeadLetter, subscribe: Callable[[], Any],
                 event_size: Callable[[Any], int] | None = None, max_event_bytes: int = MAX_EVENT_BYTES,
                 clock_ms: Callable[[], int] | None = None, inbox: Inbox | None = None,
                 event_bytes: Callable[[Any], bytes] | None = None) -> None:
        self.bridge = bridge
        self.inbox = inbox                                # None: the node's (router.bridge.t2in.PG_INBOX)
        self.event_size = event_size
        self.event_bytes = event_bytes                    # the event's CDR encoding: its size, kept for storage
        self.max_event_bytes = max_event_bytes
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.transport = transport
        self.to_event = to_event
        self.dead_letter = dead_letter
        self._subscribe = subscribe
        self._subscribe_lock = threading.Lock()
        self.subscription: Any = None
        self.subscription_refused: str | None = None      # the broker's ERROR answer to our SUBSCRIBE, until one works
        self.forwarded = 0
        self.duplicates = 0
        self.refused = 0
        self.held: list[tuple[Delivery, Any]] = []       # received, not yet pushed when the push loop stopped
        #: Deliveries whose dead letter (or NACK) failed with a broker problem while the connection lives (a full
        #: store refuses the dead letter): taken again by :meth:`receive` first, never left un-acknowledged on the
        #: live subscription (which the broker does not redeliver while it lives).
        self.unsettled: list[Delivery] = []
        self.held_lock = threading.Lock()                 # an old push loop and its replacement may both touch it
        self.t2in: Any = None                             # router.bridge.t2in.InboundT2, once a T2 ran
        self._recent: collections.OrderedDict[str, None] = collections.OrderedDict()

    def inbound(self) -> Any:
        """The inbox-backed receiver of this flow (router.bridge.t2in.InboundT2), made on first use."""
        if self.t2in is None:
            from router.bridge.t2in import InboundT2

            self.t2in = InboundT2(self) if self.inbox is None else InboundT2(self, self.inbox)
        return self.t2in

    def ensure_subscribed(self) -> Any:
        """The bridge's one subscription, made on first use. Serialised: after a node restart the channel's pull
        proxy pulls (``receive``) while ``start`` subscribes; two SUBSCRIBEs would leave a second subscription
        whose prefetched messages nobody reads (they stayed un-acked until the next restart)."""
        with self._subscribe_lock:
            if self.subscription is None:
                try:
                    self.subscription = self._subscribe()
                except BrokerError as exc:   # refused (a selector, an authorization): the bridge's state says so
                    self.subscription_refused = str(exc)
                    raise
                self.subscription_refused = None
            return self.subscription

    def receive(self, timeout: float) -> Delivery | None:
        """A delivery whose settling failed before (:attr:`unsettled`, of the live connection), else the next one."""
        with self.held_lock:
            while self.unsettled:
                kept = self.unsettled.pop(0)
                if self._live(kept):
                    return kept
        delivery: Delivery | None = self.ensure_subscribed().receive(timeout)
        return delivery

    def _live(self, delivery: Delivery) -> bool:
        """Whether ``delivery`` came on the live connection (one of a lost connection is redelivered by the broker)."""
        book = getattr(self.transport, "_book", None)
        epoch = getattr(book, "epoch", None)
        return epoch is None or (delivery.epoch == epoch and bool(getattr(book, "connected", True)))

    def seen(self, delivery: Delivery) -> bool:
        """Already forwarded (a redelivery after a lost ack). Keyed on the broker's message id alone: ActiveMQ
        does not set ``redelivered`` on redeliveries after a broker restart."""
        return delivery.message_id in self._recent

    def remember(self, delivery: Delivery) -> None:
        self._recent[delivery.message_id] = None
        while len(self._recent) > self.RECENT:
            self._recent.popitem(last=False)

    def map(self, delivery: Delivery) -> Any | None:
        """The event for a delivery; or None once the delivery was settled otherwise (dead-lettered and acked,
        or refused to the broker's own DLQ). Whatever goes wrong with one message settles that message: it never
        escapes to the receive loop (which would leave the message unacknowledged and stall the prefetch)."""
        problem = self._problem(delivery)
        if problem == "refuse":
            self._settling(delivery, lambda: self.refuse(delivery))
            return None
        if problem is None:
            event, problem = self._event(delivery)
            if problem is None:
                return event
        reason = problem
        self._settling(delivery, lambda: self.reject(delivery, reason))
        return None

    def _settling(self, delivery: Delivery, settle: Callable[[], None]) -> None:
        """Run ``settle`` (dead letter + ack, or NACK); when the broker fails it (a full store refuses the dead
        letter: an outage, router.jms.refusal; a lost connection) the delivery is kept for :meth:`receive` and the
        error propagates (the receive loop backs off)."""
        try:
            settle()
        except TransportError:
            with self.held_lock:
                self.unsettled.append(delivery)
            raise

    def _problem(self, delivery: Delivery) -> str | None:
        """Why ``delivery`` cannot become an event before mapping it ("refuse": NACK to the broker's DLQ)."""
        if delivery.decode_error is not None:
            return f"undecodable STOMP frame: {delivery.decode_error}"
        if untransportable(delivery):
            return "refuse"
        expiration = delivery.message.expiration
        if expiration and expiration <= self.clock_ms():
            return (f"expired: JMSExpiration {expiration} is in the past (0 means never); JMS lets an expired "
                    "message be dropped, nsjms keeps it here instead")
        return None

    def _event(self, delivery: Delivery) -> tuple[Any, str | None]:
        event, _, problem = self.event_encoded(delivery)
        return event, problem

    def event_encoded(self, delivery: Delivery) -> tuple[Any, bytes | None, str | None]:
        """(event, its CDR encoding when ``event_bytes`` made one, why it cannot be forwarded or None). The
        encoding measures the event against ``max_event_bytes``; a local round hands it to the channel, which
        stores a persistent StructuredEvent with exactly these bytes instead of encoding it a second time."""
        from router.mapping.errors import MappingError

        try:
            event = self.to_event(delivery.message)
        except MappingError as exc:
            return None, None, f"unmappable JMS message: {exc}"
        except Exception as exc:  # RecursionError, a codec bug, ...: dead-letter this message only
            log.exception("bridge %d: mapping message %s failed", self.bridge.id, delivery.message_id)
            return None, None, f"unmappable JMS message: {describe(exc)}"
        body: bytes | None = None
        if self.event_bytes is not None or self.event_size is not None:
            try:
                if self.event_bytes is not None:
                    body = self.event_bytes(event)
                    size = len(body)
                else:
                    assert self.event_size is not None
                    size = self.event_size(event)
            except Exception as exc:  # noqa: BLE001 — an event the ORB cannot marshal can never be delivered
                return None, None, f"the event cannot be encoded for CORBA: {describe(exc)}"
            if size > self.max_event_bytes:
                return None, None, (f"the event is {size} bytes; the node's event size limit is "
                                    f"{self.max_event_bytes} bytes (node.max_event_bytes): the channel would refuse "
                                    "it")
        return event, body, None

    def refuse(self, delivery: Delivery) -> None:
        """NACK: ActiveMQ moves the *original* message, body intact, to ``ActiveMQ.DLQ``. The broker's copy carries
        no reason, so a record naming the message id and the reason goes to the bridge's own dead-letter
        destination first. If the broker refuses that record (:class:`SendRefused`) the message is NACKed all
        the same (the reason is then only in the log and the status); other failures propagate un-NACKed: the
        broker redelivers and this runs again."""
        reason = ("empty, unmarked body: a Java Map/Stream/Object message the STOMP transport cannot carry (or an "
                  f"empty text); the original was moved to the broker's dead-letter queue {BROKER_DLQ}")
        log.warning("bridge %d: message %s: %s", self.bridge.id, delivery.message_id, reason)
        try:
            self.dead_letter.send(b"", reason, "refused",
                                  {"nsjms_dlq_message_id": delivery.message_id,
                                   "nsjms_dlq_destination": delivery.destination,
                                   "nsjms_dlq_moved_to": BROKER_DLQ})
        except SendRefused as exc:      # NACK anyway: unacknowledged, it would never be redelivered (stuck)
            self.dead_letter.refused(exc, f"message {delivery.message_id}", delivery.message_id, reason)
        self.transport.nack(delivery, confirm=Confirm.CONFIRMED)
        self.refused += 1

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Acks go without a receipt (ActiveMQ answers an ACK receipt only after ~10 ms; without one: ~6,000/s).
        A lost ack is harmless: the broker redelivers and :meth:`seen` recognises the message."""

        for d in deliveries:            # all remembered first: a failed ack must not leave later ones unknown
            self.remember(d)
        self.transport.ack_many(deliveries)      # one socket write for all (issue 12, round 5)
        telemetry.bridge_moved(self.bridge.id, len(deliveries), "from_jms")

    def reject(self, delivery: Delivery, reason: str) -> None:
        """The message can never become an event the channel takes: dead-letter the original, then ack it. If the
        broker refuses the dead letter itself (:class:`SendRefused`), the original is NACKed to the broker's DLQ
        instead (the reason is then only in the log): it must not stay unacknowledged."""
        try:
            self.dead_letter.send_message(self.dead_letter.of_delivery(delivery, reason), reason, "message")
        except SendRefused as exc:
            self.dead_letter.refused(exc, f"message {delivery.message_id}", delivery.message_id, reason)
            self.transport.nack(delivery, confirm=Confirm.CONFIRMED)
            return
        self.transport.ack(delivery, confirm=Confirm.CONFIRMED)


def untransportable(delivery: Delivery) -> bool:
    """An empty body that nothing marks: over STOMP a Java Map/Stream/Object message arrives exactly like this
    (ENVIRONMENT.md, docs/bridge.md), so it cannot be told from an empty TextMessage and is not forwarded."""
    return delivery.body_lost
