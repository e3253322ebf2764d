"""Proxy consumers: suppliers push events in, or the channel pulls them (NS 3.4.3-3.4.11).

A push returns only once the channel queued the events for every interested consumer, and for persistent events
once they are committed to PostgreSQL: a push that returned normally is an event the channel will not lose.
Pull-style proxy consumers run one thread each that calls the supplier's ``try_pull*``; it stops pulling while the
connection is suspended or while the channel is full with ``RejectNewEvents`` (NS 2.5.7).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import omniORB
from omniORB import CORBA

import CosEventChannelAdmin
import CosEventChannelAdmin__POA
import CosEventComm
import CosNotification
import CosNotifyChannelAdmin__POA
import CosNotifyComm

from router.channel import t2in
from router.channel.ack import InboundAck
from router.channel.boundary import MINOR_EVENT_TOO_LARGE, describe, store_boundary_all, store_faults
from router.channel.deadletters import NewDeadLetter, kept_body, pulled_dedupe_id
from router.channel.delivery import DeadLetters
from router.channel.events import Event, describe_event, normalise_any, normalise_structured
from router.channel.proxies import ProxyBase
from router.channel.sharing import sharing_of
from router.channel.t2in import InboundT2Driver

__all__ = ["CONSUMER_CLASSES"]

log = logging.getLogger("nsjms.channel")

_PULL_IDLE_MIN, _PULL_IDLE_MAX = 0.005, 0.2
_MAX_BACKOFF = 5.0


class ProxyConsumerBase(ProxyBase):
    side = "S"

    def admits(self, event: Event) -> bool:
        """Filters of this proxy consumer combined with its SupplierAdmin's (NS 2.3)."""
        return bool(self.admin.admits(self.filters, event))

    _inbound_ack: Any = None

    def _check_honoured(self, qos: dict[str, Any], requested: frozenset[str] | None = None) -> None:

        t2in.check_honoured(self, qos, requested)

    def _check_transactional_client(self, client: Any) -> None:

        reason = t2in.supplier_refused(self, client)
        if reason is not None:
            log.info("proxy %s: connect refused: EnableTransaction is TRUE on this proxy but %s", self.oid, reason)
            raise CosEventChannelAdmin.TypeError()

    def _t2_unavailable(self) -> dict[str, Any]:

        return t2in.status(self)

    def _accept(self, events: list[Event]) -> None:
        if self.destroyed:
            raise CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO)
        if not self.connected:
            raise CosEventComm.Disconnected()
        with store_faults():            # database down: a prompt, retryable TRANSIENT (COMPLETED_NO), never UNKNOWN
            self._route_acked(events)

    def _route_acked(self, events: list[Event]) -> None:
        """Route; with a CosNotifyCommAck supplier, suppress duplicates and acknowledge (docs/ack.md)."""
        if self._inbound_ack is None:

            self._inbound_ack = InboundAck(self)
        if self._inbound_ack.active():
            self._inbound_ack.accept(events, lambda evs: self.channel.route(self, evs))
        else:
            self.channel.route(self, events)

    def obtain_subscription_types(self, mode: Any) -> list[Any]:

        return sharing_of(self.channel).obtain(self, "sub", mode)

    def offer_change(self, added: list[Any], removed: list[Any]) -> None:

        self.types.change(added, removed)
        sharing_of(self.channel).changed()


class PushConsumerMixin(ProxyConsumerBase):
    """Push style: the supplier calls us; nothing to run."""

    #: the WARNING for an EnableTransaction TRUE it cannot honour was logged (once per proxy and node run)
    t2_unavailable_warned = False

    def start(self) -> None:
        """Nothing runs (the supplier pushes); says once if its EnableTransaction cannot be honoured."""
        why = self._t2_unavailable().get("t2_unavailable") if self.connected and not self.destroyed else None
        if why is not None and not self.t2_unavailable_warned:
            self.t2_unavailable_warned = True
            log.warning("proxy %s: EnableTransaction is TRUE but %s; it is pushed to without a routing transaction",
                        self.oid, why)
        super().start()

    def status_extra(self) -> dict[str, Any]:
        return self._t2_unavailable()


class PullConsumerMixin(ProxyConsumerBase, DeadLetters):
    """Pull style: a thread per proxy pulls from the supplier."""

    connect_declares_type_error = True          # connect_*_pull_supplier declares TypeError (NS 3.4)

    def start(self) -> None:
        if self.connected and not self.destroyed:
            self.rt.spawn(f"pull-{self.oid}", self.supervised(self._pull_loop))

    def _channel_full(self) -> bool:
        props = self.channel.admin_props
        limit = int(props.get(CosNotification.MaxQueueLength, 0))
        return bool(limit and props.get(CosNotification.RejectNewEvents) and self.channel.queued_count() >= limit)

    def room(self, wanted: int) -> int:
        """How many events a pull may ask for now: the channel's free places when it is bounded."""
        limit = int(self.channel.admin_props.get(CosNotification.MaxQueueLength, 0))
        if not limit:
            return wanted
        return max(1, min(wanted, limit - int(self.channel.queued_count())))

    def _pull_loop(self) -> None:
        """Pull, then route what was pulled; pulled events are kept and routed again until the channel took them
        (a full channel, a database failure), so nothing the supplier handed over is lost while the node runs."""
        idle, backoff = _PULL_IDLE_MIN, 0.05
        pulled: list[Event] = []
        while not (self.stop_event.is_set() or self.rt.shutting_down.is_set()):
            if pulled:
                pulled = self._route_pulled(pulled)
                if not pulled:
                    backoff = 0.05
                else:
                    self.stop_event.wait(backoff)
                    backoff = min(backoff * 2, _MAX_BACKOFF)
                continue
            if self.suspended or self._channel_full():
                self.stop_event.wait(0.1)
                continue
            target = self._t2_driver().target()
            if target is not None:               # a JMS bridge of this node: a T2 or a local unit of work per round
                try:
                    if self._t2_driver().step(target) < 0:
                        self.stop_event.wait(0.1)         # the bridge is stopped
                    backoff = 0.05
                except Exception as exc:  # noqa: BLE001 — rolled back; the bridge keeps the deliveries for the next
                    log.warning("proxy %s: pulling from its bridge failed, nothing stored (%s); retrying", self.oid,
                                exc)
                    self.stop_event.wait(backoff)
                    backoff = min(backoff * 2, _MAX_BACKOFF)
                continue
            try:
                supplier = self.client_ref()
                omniORB.setClientCallTimeout(supplier, self.rt.push_timeout_ms)
                pulled = self.pull_once(supplier)
            except (CosEventComm.Disconnected, CORBA.OBJECT_NOT_EXIST) as exc:
                log.info("proxy %s: supplier gone (%s); disconnecting", self.oid, type(exc).__name__)
                self.teardown(notify_client=False, retry=True)
                return
            except CORBA.Exception as exc:
                log.warning("proxy %s: pull failed (%s); retrying", self.oid, exc)
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)
                continue
            backoff = 0.05
            if not pulled:
                self.stop_event.wait(idle)
                idle = min(idle * 2, _PULL_IDLE_MAX)
                continue
            idle = _PULL_IDLE_MIN

    _t2: Any = None
    _T2_SEQUENCE = False
    #: the refused pulled event whose dead letter's unit of work failed (its COMMIT answer may have been lost), with
    #: the seq its dedupe id was made from; the pull loop offers that same event again first
    _dl_unconfirmed: tuple[Event, int] | None = None

    def drain_inbound(self, timeout_s: float) -> bool:
        """The phase two of its JMS → channel T2s (router.channel.t2in) ended within ``timeout_s``."""
        return True if self._t2 is None else bool(self._t2.drain(timeout_s))

    def _t2_driver(self) -> Any:
        """The JMS → channel T2 driver of this proxy (router.channel.t2in), made on first use."""
        if self._t2 is None:

            self._t2 = InboundT2Driver(self, sequence=self._T2_SEQUENCE)
        return self._t2

    def _route_pulled(self, events: list[Event]) -> list[Event]:
        """Route pulled events; returns the ones still to route (none once all are settled: routed, or one by one
        refused for unusable QoS headers or size and kept in the dead-letter store). The whole batch is tried at
        once; when the channel refuses it because of one event, the events are routed one at a time and routing
        stops at the first that must wait (channel full, database failure): only it and the events behind it are
        returned, never an event already routed."""
        try:
            self._route_acked(events)
            return []
        except CORBA.BAD_QOS as exc:
            if len(events) == 1:
                return [] if self._refused(events[0], exc, "its QoS headers are unusable") else events
        except CORBA.IMP_LIMIT as exc:
            if exc.minor != MINOR_EVENT_TOO_LARGE:
                log.info("proxy %s: channel full with RejectNewEvents; %d pulled event(s) wait", self.oid,
                         len(events))
                return events
            if len(events) == 1:
                why = f"above the channel's size limit of {self.rt.max_event_bytes} bytes"
                return [] if self._refused(events[0], exc, why) else events
        except Exception:
            log.warning("proxy %s: routing %d pulled event(s) failed; retrying", self.oid, len(events),
                        exc_info=True)
            return events
        for i, ev in enumerate(events):
            if self._route_pulled([ev]):
                return events[i:]
        return []

    def _refused(self, event: Event, exc: BaseException, why: str) -> bool:
        """A pulled event the channel refuses is dead-lettered: the supplier handed it over and considers it
        delivered (a pull-style JMS bridge acknowledges its message at the next pull), so it is kept in the
        channel's dead-letter store (side 'S', :mod:`router.channel.deadletters`) with the reason. False when that
        store could not be written (the event is kept in memory and routed again later)."""
        reason = f"{describe(exc)}: {why}"
        what = describe_event(event)
        kept = self._dl_unconfirmed
        # the same event again after a failed store: the same seq, so the same dedupe id, so a row whose COMMIT
        # answer was lost is recognised (ON CONFLICT DO NOTHING) instead of stored twice (review finding 11)
        seq = kept[1] if kept is not None and kept[0] is event else self.rt.next_seq()
        body, note = kept_body(event)
        row = NewDeadLetter(pulled_dedupe_id(self.rt.store.ledger.run_id, seq, self.channel.id, self.admin.id,
                                             self.id), self.channel.id, "S", self.admin.id, self.id, seq,
                            int(event.form), body, 0, None, None, False, what,
                            f"the channel refused the pulled event: {why}{note}", describe(exc), 1, time.time())
        try:
            with self.rt.db.unit_of_work() as conn:
                self.rt.dead_letters.add(conn, row)
        except Exception as store_exc:  # noqa: BLE001 — e.g. PostgreSQL restarting: the pull loop tries again
            self._dl_unconfirmed = (event, seq)
            log.warning("proxy %s: could not keep the refused pulled event %s in the dead-letter store (%s); "
                        "retrying", self.oid, what, store_exc)
            return False
        self._dl_unconfirmed = None
        self._count_dead_letter(what, reason, f"DEAD-LETTERED pulled event {what}: the channel refuses it ({reason}); "
                                              "moved to the dead-letter store (nsjms deadletter list); the events "
                                              "behind it go on")
        return True

    def status_extra(self) -> dict[str, Any]:
        extra = self.dead_letter_status()
        if self._t2 is not None:
            extra.update(self._t2.status())
        extra.update(self._t2_unavailable())
        return extra

    def pull_once(self, supplier: Any) -> list[Event]:
        raise NotImplementedError


# ----------------------------------------------------------------------------------------------------------
class ProxyPushConsumerImpl(PushConsumerMixin, CosNotifyChannelAdmin__POA.ProxyPushConsumer):
    client_iface = CosEventComm.PushSupplier
    client_disconnect_op = "disconnect_push_supplier"

    def connect_any_push_supplier(self, push_supplier: Any) -> None:
        self._connect(push_supplier, required=False)

    def push(self, data: Any) -> None:
        self._accept([normalise_any(data)])

    def disconnect_push_consumer(self) -> None:
        self.client_disconnected()


class StructuredProxyPushConsumerImpl(PushConsumerMixin, CosNotifyChannelAdmin__POA.StructuredProxyPushConsumer):
    client_iface = CosNotifyComm.StructuredPushSupplier
    client_disconnect_op = "disconnect_structured_push_supplier"

    def connect_structured_push_supplier(self, push_supplier: Any) -> None:
        self._connect(push_supplier, required=False)

    def push_structured_event(self, notification: Any) -> None:
        self._accept([normalise_structured(notification)])

    def disconnect_structured_push_consumer(self) -> None:
        self.client_disconnected()


class SequenceProxyPushConsumerImpl(PushConsumerMixin, CosNotifyChannelAdmin__POA.SequenceProxyPushConsumer):
    client_iface = CosNotifyComm.SequencePushSupplier
    client_disconnect_op = "disconnect_sequence_push_supplier"

    def connect_sequence_push_supplier(self, push_supplier: Any) -> None:
        self._connect(push_supplier, required=False)

    def push_structured_events(self, notifications: list[Any]) -> None:
        if notifications:
            self._accept([normalise_structured(ev) for ev in notifications])

    def disconnect_sequence_push_consumer(self) -> None:
        self.client_disconnected()


class ProxyPullConsumerImpl(PullConsumerMixin, CosNotifyChannelAdmin__POA.ProxyPullConsumer):
    client_iface = CosEventComm.PullSupplier
    client_disconnect_op = "disconnect_pull_supplier"

    def connect_any_pull_supplier(self, pull_supplier: Any) -> None:
        self._connect(pull_supplier, required=True)

    def pull_once(self, supplier: Any) -> list[Event]:
        value, has_event = supplier.try_pull()
        return [normalise_any(value)] if has_event else []

    def disconnect_pull_consumer(self) -> None:
        self.client_disconnected()


class StructuredProxyPullConsumerImpl(PullConsumerMixin, CosNotifyChannelAdmin__POA.StructuredProxyPullConsumer):
    client_iface = CosNotifyComm.StructuredPullSupplier
    client_disconnect_op = "disconnect_structured_pull_supplier"

    def connect_structured_pull_supplier(self, pull_supplier: Any) -> None:
        self._connect(pull_supplier, required=True)

    def pull_once(self, supplier: Any) -> list[Event]:
        value, has_event = supplier.try_pull_structured_event()
        return [normalise_structured(value)] if has_event else []

    def disconnect_structured_pull_consumer(self) -> None:
        self.client_disconnected()


class SequenceProxyPullConsumerImpl(PullConsumerMixin, CosNotifyChannelAdmin__POA.SequenceProxyPullConsumer):
    _T2_SEQUENCE = True
    client_iface = CosNotifyComm.SequencePullSupplier
    client_disconnect_op = "disconnect_sequence_pull_supplier"

    def connect_sequence_pull_supplier(self, pull_supplier: Any) -> None:
        self._connect(pull_supplier, required=True)

    def pull_once(self, supplier: Any) -> list[Event]:
        size = max(1, int(self.qos.get(CosNotification.MaximumBatchSize, 1)))
        batch, has_event = supplier.try_pull_structured_events(self.room(max(size, 100)))
        return [normalise_structured(ev) for ev in batch] if has_event else []

    def disconnect_sequence_pull_consumer(self) -> None:
        self.client_disconnected()


class EsProxyPushConsumerImpl(PushConsumerMixin, CosEventChannelAdmin__POA.ProxyPushConsumer):
    """Event Service ProxyPushConsumer (no id; Any events)."""

    client_iface = CosEventComm.PushSupplier
    client_disconnect_op = "disconnect_push_supplier"

    def connect_push_supplier(self, push_supplier: Any) -> None:
        self._connect(push_supplier, required=False)

    def push(self, data: Any) -> None:
        self._accept([normalise_any(data)])

    def disconnect_push_consumer(self) -> None:
        self.client_disconnected()


class EsProxyPullConsumerImpl(PullConsumerMixin, CosEventChannelAdmin__POA.ProxyPullConsumer):
    """Event Service ProxyPullConsumer (no id; Any events)."""

    client_iface = CosEventComm.PullSupplier
    client_disconnect_op = "disconnect_pull_supplier"

    def connect_pull_supplier(self, pull_supplier: Any) -> None:
        if pull_supplier is None or CORBA.is_nil(pull_supplier):
            raise CORBA.BAD_PARAM(0, CORBA.COMPLETED_NO)
        self._connect(pull_supplier, required=True)

    def pull_once(self, supplier: Any) -> list[Event]:
        value, has_event = supplier.try_pull()
        return [normalise_any(value)] if has_event else []

    def disconnect_pull_consumer(self) -> None:
        self.client_disconnected()


ES_CONSUMER_CLASSES: dict[str, type] = {"PUSH_ANY": EsProxyPushConsumerImpl, "PULL_ANY": EsProxyPullConsumerImpl}


CONSUMER_CLASSES: dict[str, type] = {
    "PUSH_ANY": ProxyPushConsumerImpl,
    "PUSH_STRUCTURED": StructuredProxyPushConsumerImpl,
    "PUSH_SEQUENCE": SequenceProxyPushConsumerImpl,
    "PULL_ANY": ProxyPullConsumerImpl,
    "PULL_STRUCTURED": StructuredProxyPullConsumerImpl,
    "PULL_SEQUENCE": SequenceProxyPullConsumerImpl,
}


store_boundary_all([CONSUMER_CLASSES, ES_CONSUMER_CLASSES])
