"""The data paths of a bridge: channel → JMS and JMS → channel (NJI 2.3, 2.4, 2.6).

The bridge is a *standard client of the channel* (NJI 2.3): its endpoint receiver/sender are CORBA servants of the
CosNotifyComm interfaces, connected to proxies it obtained from the channel, so every channel guarantee (persistent
queues, retries, ordering) applies to it unchanged.

Channel → JMS: events leave the channel only once the broker confirmed them (receipt of the SEND, or of the COMMIT
of a STOMP transaction for a batch). A push that cannot be forwarded raises ``TRANSIENT`` to the channel, which
keeps the events queued and retries with backoff; a pull receiver re-sends the same batch until it is confirmed
(the channel keeps a pulled event stored until the next pull). An event the mapping cannot express goes to the
dead-letter destination with the reason; if even that send fails, the event stays in the channel.

JMS → channel: a message is acknowledged to the broker only after the channel accepted the event (for persistent
events: committed). A crash in between makes the broker redeliver. When the channel pulls from the bridge (a
Persistent channel of this node) the channel calls :meth:`_PullSenderBase.take_in_t2` / ``take_local`` in-process
and the message ids go to the inbox with the events (``router.bridge.t2in``): exactly once. Otherwise (push
configuration, BestEffort channel) the bridge remembers recently forwarded message ids and acknowledges a
redelivered duplicate without forwarding it twice. An unmappable message, or one whose event
the channel rejects (``BAD_QOS``), is dead-lettered with the reason and then acknowledged.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import omniORB
from omniORB import CORBA

import CosEventComm
import CosNotification
import CosNotifyComm__POA

from router import telemetry
from router.channel.boundary import MINOR_EVENT_TOO_LARGE
from router.config import DEFAULT_MAX_EVENT_BYTES
from router.jms.model import BodyType, Destination, JmsMessage, JmsType, Typed
from router.jms.transport import (
    BrokerError,
    BrokerUnavailable,
    Delivery,
    LocalProtocolError,
    SendRefused,
    Transport,
    TransportError,
)

__all__ = ["DEFAULT_DLQ", "ChannelToJms", "DeadLetter", "JmsToChannel"]

log = logging.getLogger("nsjms.bridge")

DEFAULT_DLQ = Destination("queue", "nsjms.DLQ")
BROKER_DLQ = "ActiveMQ.DLQ"
#: Largest event (CDR-encoded StructuredEvent) a JMS → channel bridge hands to the channel: the node's one limit
#: (``node.max_event_bytes``, passed as ``BrokerSettings.max_event_bytes``), the same the channel refuses above
#: with IMP_LIMIT and the ORB's giopMaxMsgSize is derived from. Larger messages are dead-lettered with the reason.
MAX_EVENT_BYTES = DEFAULT_MAX_EVENT_BYTES
_TIMET = 10_000_000
_MAX_BACKOFF = 5.0


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text[:500]}" if text else type(exc).__name__


class DeadLetter:
    """Sends what cannot be routed to the dead-letter destination, with the reason in its properties."""

    def __init__(self, transport_for: Callable[[], Transport], bridge_id: int,
                 destination: Destination = DEFAULT_DLQ) -> None:
        self._transport_for = transport_for
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

    def send(self, body: bytes, reason: str, origin: str, extra: dict[str, str] | None = None) -> None:
        """Raises :class:`TransportError` if the dead letter could not be stored by the broker."""
        msg = self.message(body, reason, origin, extra)
        self._transport_for().send(self.destination, msg, receipt=True)
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

    def __init__(self, bridge: Any, destination: Destination, transport: Transport,
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

    def forward(self, events: Sequence[Any]) -> None:
        """Map and send; returns once the broker confirmed every message. Raises TransportError otherwise."""
        messages: list[JmsMessage] = []
        for ev in events:
            msg = self._map(ev)
            if msg is not None:
                messages.append(msg)
        with self._lock, telemetry.forward_span(self.bridge.id, len(messages)):
            self._send(messages)
        self.forwarded += len(messages)
        telemetry.bridge_moved(self.bridge.id, len(messages), "to_jms")

    def _map(self, event: Any) -> JmsMessage | None:
        from router.mapping.errors import MappingError

        try:
            return self.to_jms(event, self.destination)
        except MappingError as exc:
            reason = str(exc)
        except Exception as exc:  # any failure to map one event dead-letters that event, never stalls
            log.exception("bridge %d: mapping an event failed", self.bridge.id)
            reason = f"mapping failed: {_describe(exc)}"
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

    def _send(self, messages: list[JmsMessage]) -> None:
        if not messages:
            return
        if len(messages) == 1:
            self._send_one(messages[0])
            return
        try:                                             # a pushed sequence: one STOMP transaction (atomic send);
            self._send_transaction(messages)             # routing transactions (T2) are router.bridge.txout
        except (BrokerError, SendRefused):               # one message refused: find it, keep the rest
            for msg in messages:
                self._send_one(msg)

    def _send_one(self, msg: JmsMessage) -> None:
        """A message the broker refuses with an ERROR frame (:class:`SendRefused`) would be refused again:
        dead-letter it (the bridge must not stall on it). Connection problems (:class:`SendFailed`,
        :class:`BrokerUnavailable`, :class:`ReceiptTimeout`) propagate: the event stays in the channel."""
        try:
            self.transport.send(self.destination, msg, receipt=True)
        except SendRefused as exc:
            from router.mapping.stomp_body import message_to_stomp

            reason = f"broker refused the message: {exc.message or exc.reason}"
            self._dead_letter(message_to_stomp(msg).body, reason)

    def _send_transaction(self, chunk: list[JmsMessage]) -> None:
        tx = self.transport.begin()
        try:
            for msg in chunk:
                self.transport.send(self.destination, msg, transaction=tx, receipt=False)
        except BaseException:
            try:
                self.transport.abort(tx)
            except TransportError:
                pass
            raise
        self.transport.commit(tx)


def _transient(exc: Exception) -> CORBA.TRANSIENT:
    log.warning("bridge: forwarding failed, events stay in the channel: %s", exc)
    return CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)


class _PushReceiverMixin:
    """Endpoint receiver: the channel pushes to the bridge."""

    def __init__(self, flow: ChannelToJms) -> None:
        self.flow = flow

    def offer_change(self, added: Any, removed: Any) -> None:
        return None

    def _forward(self, events: list[Any]) -> None:
        if not self.flow.bridge.running():
            raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)
        try:
            self.flow.forward(events)
        except TransportError as exc:
            self.flow.bridge.note_broker_problem(exc)
            raise _transient(exc) from None
        self.flow.bridge.acknowledge_channel(events)     # NJI 2.6.2: an Ack proxy needs it (no-op otherwise)


class StructuredPushReceiver(_PushReceiverMixin, CosNotifyComm__POA.StructuredPushConsumer):
    def push_structured_event(self, notification: Any) -> None:
        self._forward([notification])

    def disconnect_structured_push_consumer(self) -> None:
        self.flow.bridge.channel_disconnected()


class SequencePushReceiver(_PushReceiverMixin, CosNotifyComm__POA.SequencePushConsumer):
    def push_structured_events(self, notifications: list[Any]) -> None:
        self._forward(list(notifications))

    def disconnect_sequence_push_consumer(self) -> None:
        self.flow.bridge.channel_disconnected()


class _PullReceiverBase:
    """Endpoint receiver pulling from the channel, paced by the endpoint's PacingInterval.

    A batch that could not be sent is kept on the object (not in the worker), so after a stop/start it is sent
    before anything new is pulled: the channel confirms a pulled batch when the next pull arrives."""

    def __init__(self, flow: ChannelToJms, proxy: Any, pacing_s: Callable[[], float], stop: threading.Event) -> None:
        self.flow = flow
        self.proxy = proxy
        self.pacing_s = pacing_s          # read every round: PacingInterval can change while the bridge runs
        self.stop = stop
        self.pending: list[Any] = []

    def run(self) -> None:
        stop = self.stop                 # this worker's generation; a restart gets a new event
        backoff = 0.05
        while not stop.is_set():
            if not self.pending:
                try:
                    self.pending = self.pull()
                except (CosEventComm.Disconnected, CORBA.OBJECT_NOT_EXIST):
                    self.flow.bridge.channel_disconnected()
                    return
                except CORBA.Exception as exc:
                    log.warning("bridge: pull from the channel failed: %s", exc)
                    stop.wait(backoff)
                    backoff = min(backoff * 2, _MAX_BACKOFF)
                    continue
                if not self.pending:
                    stop.wait(self.pacing_s() or 0.05)
                    continue
            try:
                self.flow.forward(self.pending)
            except Exception as exc:  # noqa: BLE001 — keep the batch and send it again, pull nothing meanwhile
                self.flow.bridge.note_broker_problem(exc)
                stop.wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)
                continue
            self.flow.bridge.acknowledge_channel(self.pending)
            self.pending, backoff = [], 0.05

    def pull(self) -> list[Any]:
        raise NotImplementedError


class StructuredPullReceiver(_PullReceiverBase, CosNotifyComm__POA.StructuredPullConsumer):
    def pull(self) -> list[Any]:
        event, has = self.proxy.try_pull_structured_event()
        return [event] if has else []

    def disconnect_structured_pull_consumer(self) -> None:
        self.flow.bridge.channel_disconnected()

    def offer_change(self, added: Any, removed: Any) -> None:
        return None


class SequencePullReceiver(_PullReceiverBase, CosNotifyComm__POA.SequencePullConsumer):
    def pull(self) -> list[Any]:
        events, has = self.proxy.try_pull_structured_events(1000)
        return list(events) if has else []

    def disconnect_sequence_pull_consumer(self) -> None:
        self.flow.bridge.channel_disconnected()

    def offer_change(self, added: Any, removed: Any) -> None:
        return None


# ----------------------------------------------------------------------------------------------------------
# JMS → channel
# ----------------------------------------------------------------------------------------------------------
class JmsToChannel:
    """Receives from one JMS destination and hands events to the channel; acks only what the channel accepted."""

    RECENT = 10_000

    def __init__(self, bridge: Any, transport: Transport, to_event: Callable[[JmsMessage], Any],
                 dead_letter: DeadLetter, subscribe: Callable[[], Any],
                 event_size: Callable[[Any], int] | None = None, max_event_bytes: int = MAX_EVENT_BYTES,
                 clock_ms: Callable[[], int] | None = None) -> None:
        self.bridge = bridge
        self.event_size = event_size
        self.max_event_bytes = max_event_bytes
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.transport = transport
        self.to_event = to_event
        self.dead_letter = dead_letter
        self._subscribe = subscribe
        self._subscribe_lock = threading.Lock()
        self.subscription: Any = None
        self.forwarded = 0
        self.duplicates = 0
        self.refused = 0
        self.held: list[tuple[Delivery, Any]] = []       # received, not yet pushed when the push loop stopped
        self.t2in: Any = None                             # router.bridge.t2in.InboundT2, once a T2 ran
        self._recent: collections.OrderedDict[str, None] = collections.OrderedDict()

    def inbound(self) -> Any:
        """The inbox-backed receiver of this flow (router.bridge.t2in.InboundT2), made on first use."""
        if self.t2in is None:
            from router.bridge.t2in import InboundT2

            self.t2in = InboundT2(self)
        return self.t2in

    def ensure_subscribed(self) -> Any:
        """The bridge's one subscription, made on first use. Serialised: after a node restart the channel's pull
        proxy pulls (``receive``) while ``start`` subscribes; two SUBSCRIBEs would leave a second subscription
        whose prefetched messages nobody reads (they stayed un-acked until the next restart)."""
        with self._subscribe_lock:
            if self.subscription is None:
                self.subscription = self._subscribe()
            return self.subscription

    def receive(self, timeout: float) -> Delivery | None:
        delivery: Delivery | None = self.ensure_subscribed().receive(timeout)
        return delivery

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
            self.refuse(delivery)
            return None
        if problem is not None:
            self.reject(delivery, problem)
            return None
        event, problem = self._event(delivery)
        if problem is not None:
            self.reject(delivery, problem)
            return None
        return event

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
        from router.mapping.errors import MappingError

        try:
            event = self.to_event(delivery.message)
        except MappingError as exc:
            return None, f"unmappable JMS message: {exc}"
        except Exception as exc:  # RecursionError, a codec bug, ...: dead-letter this message only
            log.exception("bridge %d: mapping message %s failed", self.bridge.id, delivery.message_id)
            return None, f"unmappable JMS message: {_describe(exc)}"
        if self.event_size is not None:
            try:
                size = self.event_size(event)
            except Exception as exc:  # noqa: BLE001 — an event the ORB cannot marshal can never be delivered
                return None, f"the event cannot be encoded for CORBA: {_describe(exc)}"
            if size > self.max_event_bytes:
                return None, (f"the event is {size} bytes; the node's event size limit is {self.max_event_bytes} "
                              "bytes (node.max_event_bytes): the channel would refuse it")
        return event, None

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
        self.transport.nack(delivery, receipt=True)
        self.refused += 1

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Acks go without a receipt (ActiveMQ answers an ACK receipt only after ~10 ms; without one: ~6,000/s).
        A lost ack is harmless: the broker redelivers and :meth:`seen` recognises the message."""
        for d in deliveries:            # all remembered first: a failed ack must not leave later ones unknown
            self.remember(d)
        for d in deliveries:
            self.transport.ack(d, receipt=False)
        telemetry.bridge_moved(self.bridge.id, len(deliveries), "from_jms")

    def reject(self, delivery: Delivery, reason: str) -> None:
        """The message can never become an event the channel takes: dead-letter the original, then ack it. If the
        broker refuses the dead letter itself (:class:`SendRefused`), the original is NACKed to the broker's DLQ
        instead (the reason is then only in the log): it must not stay unacknowledged."""
        extra = {"nsjms_dlq_message_id": delivery.message_id, "nsjms_dlq_destination": delivery.destination}
        try:
            self.dead_letter.send(delivery.body, reason, "message", extra)
        except SendRefused as exc:
            self.dead_letter.refused(exc, f"message {delivery.message_id}", delivery.message_id, reason)
            self.transport.nack(delivery, receipt=True)
            return
        self.transport.ack(delivery, receipt=True)


class PushSenderLoop:
    """JMS → channel, channel side PUSH: a thread receives (listener style, or paced for a MESSAGE_CONSUMER
    endpoint), pushes into the bridge's proxy consumer, then acks.

    ``stop_bridge`` keeps the JMS subscription, so deliveries this loop received but had not pushed when it was
    stopped stay un-acked on that subscription: they are kept in ``flow.held`` and pushed first by the next loop
    (the broker would only redeliver them after the connection ends)."""

    def __init__(self, flow: JmsToChannel, proxy: Any, sequence: bool, batch: Callable[[], int],
                 pacing_s: Callable[[], float], paced_receive: bool, stop: threading.Event) -> None:
        self.flow = flow
        self.proxy = proxy
        self.sequence = sequence
        self._batch = batch               # MaximumBatchSize and PacingInterval of the bridge's proxy, read each round
        self._pacing = pacing_s
        self.batch = 1
        self.pacing_s = 0.0
        self.paced_receive = paced_receive
        self.stop = stop

    def run(self) -> None:
        backoff = 0.05
        while not self.stop.is_set():
            try:
                self._round()
                backoff = 0.05
            except (BrokerUnavailable, TransportError) as exc:
                self.flow.bridge.note_broker_problem(exc)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)
                self.flow.bridge.reconnect_source()
            except (CosEventComm.Disconnected, CORBA.OBJECT_NOT_EXIST):
                self.flow.bridge.channel_disconnected()
                return
            except Exception:
                log.exception("bridge %d: receive loop failed; continuing", self.flow.bridge.id)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)

    def _collect(self, got: list[tuple[Delivery, Any]]) -> list[tuple[Delivery, Any]]:
        """Receive up to a batch into ``got`` (the same list, so a failure midway loses nothing already taken)."""
        deadline = time.monotonic() + (self.pacing_s if self.pacing_s > 0 else 0.2)
        while len(got) < self.batch and not self.stop.is_set():
            wait = max(0.0, deadline - time.monotonic()) if got else 0.5
            delivery = self.flow.receive(wait)
            if delivery is None:
                if got or self.paced_receive:
                    break
                continue
            if self.flow.seen(delivery):
                self.flow.duplicates += 1
                self.flow.transport.ack(delivery, receipt=False)
                continue
            event = self.flow.map(delivery)
            if event is not None:
                got.append((delivery, event))
        return got

    def _round(self) -> None:
        if not self.flow.bridge.running():
            self.stop.wait(0.2)
            return
        self.batch = max(1, self._batch()) if self.sequence else 1
        self.pacing_s = self._pacing()
        local = getattr(self.flow.bridge, "local_push_proxy", None)
        servant = local() if local is not None else None
        if servant is not None and not self.flow.held:
            self._round_local(servant)
            return
        got = self._take_held()
        try:
            if not got:
                if self.paced_receive and self.pacing_s > 0:
                    self.stop.wait(self.pacing_s)
                self._collect(got)
            if got and not self.stop.is_set():
                got = self._push(got)
        finally:
            self._hold(got)              # whatever was received and not settled: the next round pushes it

    def _round_local(self, servant: Any) -> None:
        """The channel is in this process and Persistent: instead of a push over the ORB, one local unit of work
        (router.channel.t2in.local_round): the events with their inbox ids in one PostgreSQL transaction, the acks
        after it committed, so a redelivered message never becomes a second event, across crashes too. The
        proxy's own checks come first (destroyed: OBJECT_NOT_EXIST; disconnected: Disconnected)."""
        from router.channel.t2in import LOCAL_BATCH, local_round, room

        if servant.destroyed:
            raise CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO)
        if not servant.connected:
            raise CosEventComm.Disconnected()
        if self.paced_receive and self.pacing_s > 0:
            self.stop.wait(self.pacing_s)
        try:
            local_round(servant, self.flow.inbound().take_local, room(servant, max(self.batch, LOCAL_BATCH)), 0.5)
        except CORBA.IMP_LIMIT as exc:
            if exc.minor == MINOR_EVENT_TOO_LARGE:
                raise
            log.info("bridge %d: channel full; waiting", self.flow.bridge.id)
            self.stop.wait(0.5)

    def _take_held(self) -> list[tuple[Delivery, Any]]:
        """Held deliveries not yet forwarded (a held one that was forwarded but whose ack failed is acked again)."""
        held, self.flow.held = self.flow.held, []
        fresh = []
        for delivery, event in held:
            if not self.flow.seen(delivery):
                fresh.append((delivery, event))
                continue
            try:
                self.flow.transport.ack(delivery, receipt=False)
            except TransportError as exc:     # a lost connection: the broker redelivers it, seen() recognises it
                log.debug("bridge %d: ack of held message %s: %s", self.flow.bridge.id, delivery.message_id, exc)
        return fresh

    def _hold(self, got: list[tuple[Delivery, Any]]) -> None:
        """Keep ``got`` (received on the live subscription, un-acked) for the next round or loop of this bridge."""
        if got:
            self.flow.held = got + self.flow.held

    def _push(self, got: list[tuple[Delivery, Any]]) -> list[tuple[Delivery, Any]]:
        """Push and ack ``got``; returns what is left unsettled (stopped meanwhile)."""
        while not self.stop.is_set():
            try:
                if self.sequence:
                    self.proxy.push_structured_events([e for _, e in got])
                else:
                    self.proxy.push_structured_event(got[0][1])
            except CORBA.BAD_QOS:
                return self._push_one_by_one(got)
            except CORBA.IMP_LIMIT as exc:
                if exc.minor == MINOR_EVENT_TOO_LARGE:   # not "full": that event is refused forever; find it
                    return self._push_one_by_one(got)
                log.info("bridge %d: channel full; waiting", self.flow.bridge.id)
                self.stop.wait(0.5)
                continue
            except CORBA.OBJECT_NOT_EXIST:
                raise
            except CORBA.SystemException as exc:     # TRANSIENT, a database failure surfacing as UNKNOWN, ...
                log.warning("bridge %d: push into the channel failed (%s); retrying", self.flow.bridge.id, exc)
                self.stop.wait(0.5)
                continue
            self.flow.forwarded += len(got)
            self.flow.ack([d for d, _ in got])
            return []
        return got

    def _push_one_by_one(self, got: list[tuple[Delivery, Any]]) -> list[tuple[Delivery, Any]]:
        """A batch had an event with unusable QoS (BAD_QOS) or one the channel refuses as too large (IMP_LIMIT with
        MINOR_EVENT_TOO_LARGE, only when the channel's limit differs from the bridge's): find it, dead-letter it,
        forward the rest (each retried like a batch while the channel is full or failing). Returns what is left
        unsettled (stopped meanwhile)."""
        for i, (delivery, event) in enumerate(got):
            while True:
                if self.stop.is_set():
                    return got[i:]
                try:
                    self.proxy.push_structured_event(event)
                except CORBA.BAD_QOS:
                    self.flow.reject(delivery, "the channel rejected the event's QoS (BAD_QOS)")
                    break
                except CORBA.IMP_LIMIT as exc:
                    if exc.minor != MINOR_EVENT_TOO_LARGE:          # the channel is full: retry
                        log.info("bridge %d: channel full; waiting", self.flow.bridge.id)
                        self.stop.wait(0.5)
                        continue
                    self.flow.reject(delivery, "the channel refused the event as too large (IMP_LIMIT, "
                                     "MINOR_EVENT_TOO_LARGE): its size limit is below this node's "
                                     "node.max_event_bytes")
                    break
                except CORBA.OBJECT_NOT_EXIST:
                    raise
                except CORBA.SystemException as exc:       # IMP_LIMIT, TRANSIENT, UNKNOWN, ...
                    log.info("bridge %d: push into the channel failed (%s); retrying", self.flow.bridge.id, exc)
                    self.stop.wait(0.5)
                    continue
                self.flow.forwarded += 1
                self.flow.ack([delivery])
                break
        return []


class _PullSenderBase:
    """JMS → channel, channel side PULL: the channel's pull-style proxy consumer pulls from this servant. A message
    handed to the channel is acknowledged when the channel pulls again (it routed the previous one by then)."""

    def __init__(self, flow: JmsToChannel) -> None:
        self.flow = flow
        self._handed: list[Delivery] = []
        self._lock = threading.Lock()

    def _confirm(self) -> None:
        with self._lock:
            done, self._handed = self._handed, []
        if done:
            self.flow.ack(done)
            self.flow.forwarded += len(done)

    def take_in_t2(self, txn: Any, conn: Any, max_n: int, timeout: float) -> Any:
        """JMS → channel inside the channel's T2 (router.bridge.t2in): called in-process by the channel's pull
        proxy with the transaction and its PostgreSQL branch. Events handed over by earlier non-transactional pulls
        are acknowledged first (the channel routed them before pulling again)."""
        try:
            self._confirm()
        except TransportError as exc:
            self.flow.bridge.note_broker_problem(exc)
            raise
        return self.flow.inbound().take(self.flow.bridge.rt.t2, txn, conn, max_n, timeout)

    def t2_ready(self) -> bool:
        """Whether a round can take anything now (the bridge is started): the channel waits otherwise."""
        return bool(self.flow.bridge.running())

    def take_local(self, conn: Any, max_n: int, timeout: float) -> Any:
        """JMS → channel without a T2, the channel in this process (router.bridge.t2in ``take_local``): the
        inbox claims go in the channel's local transaction on ``conn``; acks after it committed."""
        try:
            self._confirm()
        except TransportError as exc:
            self.flow.bridge.note_broker_problem(exc)
            raise
        return self.flow.inbound().take_local(conn, max_n, timeout)

    def _next(self, timeout: float) -> Delivery | None:
        """A delivery a rolled-back T2 left un-acknowledged (EnableTransaction was turned off since), else the
        next one from the subscription."""
        t2in = self.flow.t2in
        if t2in is not None and t2in.held:
            return t2in.held.pop(0)  # type: ignore[no-any-return]
        return self.flow.receive(timeout)

    def _take(self, n: int, timeout: float) -> list[Any]:
        if not self.flow.bridge.running():
            return []
        events: list[Any] = []
        try:
            self._confirm()
            while len(events) < n:
                delivery = self._next(timeout if not events else 0.0)
                if delivery is None:
                    break
                if self.flow.seen(delivery):
                    self.flow.duplicates += 1
                    self.flow.transport.ack(delivery, receipt=False)
                    continue
                event = self.flow.map(delivery)
                if event is None:
                    continue
                with self._lock:
                    self._handed.append(delivery)
                events.append(event)
        except TransportError as exc:
            # What was taken before the failure is in _handed (acked at the next pull): hand it over now, or it
            # would be acked without ever reaching the channel.
            self.flow.bridge.note_broker_problem(exc)
        return events

    def subscription_change(self, added: Any, removed: Any) -> None:
        return None


class StructuredPullSender(_PullSenderBase, CosNotifyComm__POA.StructuredPullSupplier):
    def pull_structured_event(self) -> Any:
        while True:
            events = self._take(1, 1.0)
            if events:
                return events[0]

    def try_pull_structured_event(self) -> tuple[Any, bool]:
        events = self._take(1, 0.0)
        if events:
            return events[0], True
        return _empty_event(), False

    def disconnect_structured_pull_supplier(self) -> None:
        self.flow.bridge.channel_disconnected()


class SequencePullSender(_PullSenderBase, CosNotifyComm__POA.SequencePullSupplier):
    def pull_structured_events(self, max_number: int) -> list[Any]:
        while True:
            events = self._take(max(1, max_number), 1.0)
            if events:
                return events

    def try_pull_structured_events(self, max_number: int) -> tuple[list[Any], bool]:
        events = self._take(max(1, max_number), 0.0)
        return events, bool(events)

    def disconnect_sequence_pull_supplier(self) -> None:
        self.flow.bridge.channel_disconnected()


class _SenderMixin:
    """What the bridge connects to its proxy consumer (so the channel can tell it about disconnection)."""

    def __init__(self, on_disconnect: Callable[[], None]) -> None:
        self._on_disconnect = on_disconnect

    def subscription_change(self, added: Any, removed: Any) -> None:
        return None


class PushSenderServant(_SenderMixin, CosNotifyComm__POA.StructuredPushSupplier):
    def disconnect_structured_push_supplier(self) -> None:
        self._on_disconnect()


class SequencePushSenderServant(_SenderMixin, CosNotifyComm__POA.SequencePushSupplier):
    def disconnect_sequence_push_supplier(self) -> None:
        self._on_disconnect()


def untransportable(delivery: Delivery) -> bool:
    """An empty body that nothing marks: over STOMP a Java Map/Stream/Object message arrives exactly like this
    (ENVIRONMENT.md, docs/bridge.md), so it cannot be told from an empty TextMessage and is not forwarded."""
    h = delivery.headers
    return (not delivery.body and "content-length" not in h and "nsjms_body" not in h
            and h.get("transformation") != "jms-map-json" and "$nsjms_idl" not in h)


def _empty_event() -> Any:
    header = CosNotification.EventHeader(CosNotification.FixedEventHeader(CosNotification.EventType("", ""), ""), [])
    return CosNotification.StructuredEvent(header, [], CORBA.Any(CORBA.TC_null, None))


_ = (omniORB, LocalProtocolError)
