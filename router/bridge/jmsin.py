"""The bridge core, JMS → channel rounds: the push loop (the bridge pushes into the channel's proxy consumer) and
the pull supply (the channel's proxy consumer pulls from the bridge). Free of the ORB: the channel is a
:class:`~router.bridge.ports.ChannelSink` or the caller of :class:`PullSupply`; the CORBA servants and the sink
over a proxy reference are in ``router.bridge.flows``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from router.bridge.core import MAX_BACKOFF, JmsToChannel
from router.bridge.ports import (
    ChannelFull,
    ChannelGone,
    ChannelSink,
    ChannelUnavailable,
    EventRefused,
    LocalChannel,
)
from router.jms.transport import BrokerUnavailable, Confirm, Delivery, TransportError

if TYPE_CHECKING:
    from router.bridge.t2in import InBatch
    from router.routing.ports import Conn
    from xa.coordinator import Transaction

#: The push loop's longest wait while the broker refuses the bridge's SUBSCRIBE (a refusal stays until the broker or
#: the bridge changes; MAX_BACKOFF, 5 s, is for a connection that comes back by itself).
REFUSED_MAX_BACKOFF = 60.0

__all__ = ["PullSupply", "PushSenderLoop"]

log = logging.getLogger("nsjms.bridge")

Got = list[tuple[Delivery, Any]]


class PushSenderLoop:
    """JMS → channel, channel side PUSH: a thread receives (listener style, or paced for a MESSAGE_CONSUMER
    endpoint), pushes into the channel (``sink``), then acks.

    ``stop_bridge`` keeps the JMS subscription, so deliveries this loop received but had not pushed when it was
    stopped stay un-acked on that subscription: they are kept in ``flow.held`` and pushed first by the next loop
    (the broker would only redeliver them after the connection ends)."""

    def __init__(self, flow: JmsToChannel, sink: ChannelSink, sequence: bool, batch: Callable[[], int],
                 pacing_s: Callable[[], float], paced_receive: bool, stop: threading.Event) -> None:
        self.flow = flow
        self.sink = sink
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
                # a refused SUBSCRIBE is answered the same way until someone changes the broker: back off further
                cap = REFUSED_MAX_BACKOFF if self.flow.subscription_refused else MAX_BACKOFF
                backoff = min(backoff * 2, cap)
                self.flow.bridge.reconnect_source()
            except ChannelGone:
                self.flow.bridge.channel_disconnected()
                return
            except Exception:
                log.exception("bridge %d: receive loop failed; continuing", self.flow.bridge.id)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)

    def _collect(self, got: Got) -> Got:
        """Receive up to a batch into ``got`` (the same list, so a failure midway loses nothing already taken)."""
        deadline = time.monotonic() + (self.pacing_s if self.pacing_s > 0 else 0.2)
        while len(got) < self.batch and not self.stop.is_set():
            wait = max(0.0, deadline - time.monotonic()) if got else 0.5
            delivery = self._next(wait)
            if delivery is None:
                if got or self.paced_receive:
                    break
                continue
            if self.flow.seen(delivery):
                self.flow.duplicates += 1
                self.flow.transport.ack(delivery, confirm=Confirm.PIPELINED)
                continue
            event = self.flow.map(delivery)
            if event is not None:
                got.append((delivery, event))
        return got

    def _next(self, wait: float) -> Delivery | None:
        """A delivery an earlier local round received and left un-acknowledged (``t2in.held``: its unit of work
        failed, and the channel is no longer a local one), else the next one from the subscription."""
        t2in = self.flow.t2in
        if t2in is not None:
            delivery = t2in.pop_held()
            if delivery is not None:
                return delivery  # type: ignore[no-any-return]
        return self.flow.receive(wait)

    def _round(self) -> None:
        if not self.flow.bridge.running():
            self.stop.wait(0.2)
            return
        self.batch = max(1, self._batch()) if self.sequence else 1
        self.pacing_s = self._pacing()
        local = self.sink.local()
        if local is not None and not self.flow.held:
            self._round_local(local)
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

    def _round_local(self, local: LocalChannel) -> None:
        """The channel is in this process and Persistent: instead of a push over the ORB, one local unit of work
        (router.channel.t2in.local_round): the events with their inbox ids in one PostgreSQL transaction, the acks
        after it committed, so a redelivered message never becomes a second event, across crashes too. A channel
        that refuses an event as too large fails the round (logged; the loop goes on)."""
        if self.paced_receive and self.pacing_s > 0:
            self.stop.wait(self.pacing_s)
        try:
            inbound = self.flow.inbound()
            local.round(inbound.take_local, self.batch, 0.5, ready=inbound.wait)
        except ChannelFull:
            log.info("bridge %d: channel full; waiting", self.flow.bridge.id)
            self.stop.wait(0.5)

    def _take_held(self) -> Got:
        """Held deliveries not yet forwarded (a held one that was forwarded but whose ack failed is acked again)."""
        with self.flow.held_lock:
            held, self.flow.held = self.flow.held, []
        fresh = []
        for delivery, event in held:
            if not self.flow.seen(delivery):
                fresh.append((delivery, event))
                continue
            try:
                self.flow.transport.ack(delivery, confirm=Confirm.PIPELINED)
            except TransportError as exc:     # a lost connection: the broker redelivers it, seen() recognises it
                log.debug("bridge %d: ack of held message %s: %s", self.flow.bridge.id, delivery.message_id, exc)
        return fresh

    def _hold(self, got: Got) -> None:
        """Keep ``got`` (received on the live subscription, un-acked) for the next round or loop of this bridge."""
        if got:
            with self.flow.held_lock:      # a loop stopped by stop_bridge and its replacement may hold at once
                self.flow.held = got + self.flow.held

    def _push(self, got: Got) -> Got:
        """Push and ack ``got``; returns what is left unsettled (stopped meanwhile)."""
        while not self.stop.is_set():
            try:
                self.sink.push([e for _, e in got] if self.sequence else [got[0][1]])
            except EventRefused:                 # one event is refused forever (QoS, too large): find it
                return self._push_one_by_one(got)
            except ChannelFull:
                log.info("bridge %d: channel full; waiting", self.flow.bridge.id)
                self.stop.wait(0.5)
                continue
            except ChannelUnavailable as exc:    # TRANSIENT, a database failure surfacing as UNKNOWN, ...
                log.warning("bridge %d: push into the channel failed (%s); retrying", self.flow.bridge.id, exc)
                self.stop.wait(0.5)
                continue
            self.flow.forwarded += len(got)
            self.flow.ack([d for d, _ in got])
            return []
        return got

    def _push_one_by_one(self, got: Got) -> Got:
        """A batch had an event the channel refuses as it is (:class:`EventRefused`: unusable QoS, or too large
        when the channel's limit differs from the bridge's): find it, dead-letter it with the channel's reason,
        forward the rest (each retried like a batch while the channel is full or failing). Returns what is left
        unsettled (stopped meanwhile)."""
        for i, (delivery, event) in enumerate(got):
            while True:
                if self.stop.is_set():
                    return got[i:]
                try:
                    self.sink.push([event])
                except EventRefused as exc:
                    self.flow.reject(delivery, exc.reason)
                    break
                except ChannelFull:
                    log.info("bridge %d: channel full; waiting", self.flow.bridge.id)
                    self.stop.wait(0.5)
                    continue
                except ChannelUnavailable as exc:
                    log.info("bridge %d: push into the channel failed (%s); retrying", self.flow.bridge.id, exc)
                    self.stop.wait(0.5)
                    continue
                self.flow.forwarded += 1
                self.flow.ack([delivery])
                break
        return []


class PullSupply:
    """JMS → channel, channel side PULL: the channel's pull-style proxy consumer pulls from this object (through
    the servants of ``router.bridge.flows``, or in-process: ``take_in_t2`` / ``take_local``). A message handed to
    the channel is acknowledged when the channel pulls again (it routed the previous one by then)."""

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

    def take_in_t2(self, txn: Transaction, conn: Conn, max_n: int, timeout: float) -> InBatch:
        """JMS → channel inside the channel's T2 (router.bridge.t2in): called in-process by the channel's pull
        proxy with the transaction and its PostgreSQL branch. Events handed over by earlier non-transactional pulls
        are acknowledged first (the channel routed them before pulling again)."""
        try:
            self._confirm()
        except TransportError as exc:
            self.flow.bridge.note_broker_problem(exc)
            raise
        batch: InBatch = self.flow.inbound().take(self.flow.bridge.rt.t2, txn, conn, max_n, timeout)
        return batch

    def t2_ready(self) -> bool:
        """Whether a round can take anything now (the bridge is started): the channel waits otherwise."""
        return bool(self.flow.bridge.running())

    def wait_first(self, timeout: float) -> bool:
        """Whether a round has something to take, waiting up to ``timeout`` s for the first delivery WITHOUT a
        database connection (router.bridge.t2in ``InboundT2.wait``); the round then takes with no wait. Events
        handed over by earlier non-transactional pulls are acknowledged first, as :meth:`take_local` does."""
        try:
            self._confirm()
        except TransportError as exc:
            self.flow.bridge.note_broker_problem(exc)
            raise
        return bool(self.flow.inbound().wait(timeout))

    def take_local(self, conn: Conn, max_n: int, timeout: float) -> InBatch:
        """JMS → channel without a T2, the channel in this process (router.bridge.t2in ``take_local``): the
        inbox claims go in the channel's local transaction on ``conn``; acks after it committed."""
        try:
            self._confirm()
        except TransportError as exc:
            self.flow.bridge.note_broker_problem(exc)
            raise
        batch: InBatch = self.flow.inbound().take_local(conn, max_n, timeout)
        return batch

    def _next(self, timeout: float) -> Delivery | None:
        """A delivery a rolled-back T2 left un-acknowledged (EnableTransaction was turned off since), else the
        next one from the subscription."""
        t2in = self.flow.t2in
        if t2in is not None:
            delivery = t2in.pop_held()
            if delivery is not None:
                return delivery  # type: ignore[no-any-return]
        return self.flow.receive(timeout)

    def take(self, n: int, timeout: float) -> list[Any]:
        """Up to ``n`` events (waiting up to ``timeout`` s for the first); acknowledges what the previous call
        handed over. Nothing while the bridge is stopped."""
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
                    self.flow.transport.ack(delivery, confirm=Confirm.PIPELINED)
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
