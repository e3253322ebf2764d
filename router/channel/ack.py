"""Event acknowledgement (NJI 4.2), outbound: the Ack proxy suppliers (push and pull) and their resend loop.

Outbound (channel → consumer), the ``*SupplierAck`` servants over :class:`AckState`:

* A proxy supplier of structured or sequence form whose QoS ``DeliveryReliability`` is ``Acknowledgment`` when it
  is created (inherited from its admin/channel, or restored from the store) is activated as the matching
  ``CosNotifyChannelAdminAck::*ProxyP*SupplierAck`` servant; clients ``_narrow`` to that interface to call
  ``acknowledge``.
* Every event (structured) or batch (sequence, first event only) gets a ``SequenceNumber`` header (long) from a
  per-connection counter: 0, 1, …, 2^31-1, 0, … The channel overwrites a SequenceNumber that came from upstream
  (each hop is its own logical connection, NJI 4.2.5). The counter is reset only by a new connection; in nsjms a
  disconnect destroys the proxy, so a new connection is a new proxy starting at 0.
* A sent batch stays *in flight* until ``acknowledge`` names its number; only then are its stored queue rows
  deleted. The in-flight numbers of persistent events and the counter are kept in the proxy's ``extra`` column
  *before* the push, so after ``kill -9`` the same events are resent with the same numbers (the consumer
  recognises them as duplicates).
* Reliable Delivery Sequence: a push failing with a transient error is retried every ``RetryInterval``
  (tenacity, interrupted by the proxy's stop event); a batch not acknowledged within ``RetryInterval`` is sent
  again (pull: offered again). Both count against ``Retries`` per connection; a successful ``acknowledge`` resets
  the count. When the count is exhausted the connection STOPS: nothing more is sent, nothing is dropped, the
  failure is logged (ERROR), counted (OpenTelemetry counter ``nsjms.ack.connections_stopped``, meter
  ``nsjms``, attributes ``nsjms.channel``/``nsjms.proxy``) and listed by ``nsjms status`` and the node's status
  object. ``resume_connection`` on the proxy is the operator's reset: it clears
  the flag and the retry count and resends the in-flight events with their original numbers.

The concepts around these servants have modules of their own (re-exported here for existing importers):
:mod:`router.channel.ackstate` (SequenceNumbers, :class:`AckState`: the in-flight window, no I/O),
:mod:`router.channel.ackstatus` (the operators' ``NsjmsStatus`` object of stopped connections) and
:mod:`router.channel.ackin` (:class:`InboundAck`: the channel acknowledges ``CosNotifyCommAck`` suppliers).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import tenacity

import omniORB
from omniORB import CORBA

import CosEventComm

from idl.generated import CosNotifyChannelAdminAck__POA
from router.channel import txdelivery
from router.channel.ackin import InboundAck
from router.channel.ackstate import (
    SN_LIMIT,
    AckState,
    Pending,
    ack_enabled,
    next_sn,
    retry_policy,
    sequence_number_of,
    with_sequence_number,
)
from router.channel.ackstatus import STATUS_KEY, ConnectionStatusImpl, _status, _stopped_counter, activate_status
from router.channel.boundary import EVENT_SPECIFIC, Outcome, store_boundary_all
from router.channel.proxies import (
    _TRANSIENT,
    PullSupplierMixin,
    PushSupplierMixin,
    SequenceProxyPullSupplierImpl,
    SequenceProxyPushSupplierImpl,
    StructuredProxyPullSupplierImpl,
    StructuredProxyPushSupplierImpl,
)
from router.channel.queue import Entry, order_key
from router.telemetry import A

__all__ = [
    "SN_LIMIT",
    "STATUS_KEY",
    "AckState",
    "ConnectionStatusImpl",
    "InboundAck",
    "ack_class_for",
    "activate_status",
    "next_sn",
    "sequence_number_of",
    "with_sequence_number",
]

if TYPE_CHECKING:
    from router.channel.proxyport import SupplierView

log = logging.getLogger("nsjms.ack")

_IDLE = 0.5


class _AckSupplierMixin:
    """acknowledge, SequenceNumber headers, stop/reset, persistence — shared by push and pull Ack proxies."""

    ack: AckState
    acknowledging = True          # its own resend window delivers (router.channel.txdelivery: never in a T2)

    def _init_ack(self) -> None:
        self.ack = AckState.load(self.extra.get("ack"))  # type: ignore[attr-defined]
        self._tls = threading.local()
        self._clock: Callable[[], float] = time.time    # the resend scheduler's clock (unix s); tests inject one

    def enqueue(self, record: Any) -> None:
        if self.ack.restored and record.db_id in self.ack.restored:
            record.hold()
            if self.ack.adopt(Entry(record, order_key(self.queue.order_policy, record))):  # type: ignore[attr-defined]
                return
            record.release()
        super().enqueue(record)  # type: ignore[misc]

    def start(self) -> None:
        if self.ack.stopped and _status(self.rt) is not None:  # type: ignore[attr-defined]
            _status(self.rt).report(self.oid, self.ack.stopped)  # type: ignore[attr-defined,union-attr]
        if self.connected and not self.destroyed:  # type: ignore[attr-defined]
            txdelivery.warn_unavailable(cast("SupplierView", self))
        super().start()  # type: ignore[misc]

    def status_extra(self) -> dict[str, Any]:
        """Extra fields of this proxy in ``nsjms status`` (router.node.server snapshot): acknowledgement state."""
        with self.ack.lock:
            extra: dict[str, Any] = {"in_flight": len(self.ack.inflight), "retries_used": self.ack.retry_count}
            if self.ack.stopped:
                extra["STOPPED"] = repr(self.ack.stopped) + " (reset with resume_connection)"
        extra.update(self.ack.schedule(self._policy()[1]))
        unavailable = txdelivery.unavailable(cast("SupplierView", self))
        return {**extra, **getattr(self, "dead_letter_status", dict)(), **unavailable}

    def _save_ack(self) -> None:
        with self.ack.lock:
            state = self.ack.to_json()
        self.save_extra(ack=state)  # type: ignore[attr-defined]

    def _policy(self) -> tuple[int, float]:
        return retry_policy(self.qos)  # type: ignore[attr-defined]

    # -- IDL ------------------------------------------------------------------------------------------
    def acknowledge(self, sequence_numbers: list[int]) -> None:
        """Delete the acknowledged events' rows, then save the acknowledgement state. The call passes the channel's
        gate, so a hand-off of the channel (router/cluster/release.py) waits for it; if the proxy stops before the
        rows are deleted (the database away), nothing is saved and the client gets ``TRANSIENT``
        (``COMPLETED_NO``): asked again, the node running the proxy then acknowledges them. (Before, the call
        returned as done with the rows still stored, and the next owner delivered those events again.)"""
        self._check_alive()  # type: ignore[attr-defined]
        self._check_open()   # type: ignore[attr-defined]   # not while its channel is handed over: TRANSIENT
        gate = getattr(self.channel, "gate", None)  # type: ignore[attr-defined]   # (none on unit-test stand-ins)
        with gate.passing() if gate is not None else contextlib.nullcontext():
            done = self.ack.acknowledge(list(sequence_numbers))
            if done:
                if not self._finish(done):  # type: ignore[attr-defined]
                    raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)
                self._save_ack()
        self._wake()  # type: ignore[attr-defined]

    def resume_connection(self) -> None:
        """Also the operator's reset of a connection stopped by exhausted retries (NJI 4.2.7.3, scheme 1); a proxy
        that was also suspended is resumed by the same call."""
        self._check_alive()  # type: ignore[attr-defined]
        self._check_open()  # type: ignore[attr-defined]   # not while its channel moves (router/cluster)
        if not self.ack.stopped:
            super().resume_connection()  # type: ignore[misc]
            return
        with self.ack.lock:
            self.ack.stopped, self.ack.retry_count = "", 0
            for p in self.ack.inflight.values():
                p.sent_at = 0.0
        self._save_ack()
        status = _status(self.rt)  # type: ignore[attr-defined]
        if status is not None:
            status.clear(self.oid)  # type: ignore[attr-defined]
        log.warning("proxy %s: stopped connection reset by the operator; resending in-flight events",
                    self.oid)  # type: ignore[attr-defined]
        if self.suspended and self.connected:  # type: ignore[attr-defined]
            super().resume_connection()  # type: ignore[misc]  # one call clears a suspension too (and wakes)
            return
        self._wake()  # type: ignore[attr-defined]

    def _stop_connection(self, reason: str) -> None:
        with self.ack.lock:
            if self.ack.stopped:
                return
            self.ack.stopped = reason
        self._save_ack()
        log.error("proxy %s: logical connection STOPPED: %s; events stay queued until resume_connection",
                  self.oid, reason)  # type: ignore[attr-defined]
        status = _status(self.rt)  # type: ignore[attr-defined]
        if status is not None:
            status.report(self.oid, reason)  # type: ignore[attr-defined]

        _stopped_counter().add(1, {A.CHANNEL: self.channel.id, A.PROXY: self.oid})  # type: ignore[attr-defined]

    def _count_retry(self) -> bool:
        """One more retry on this connection; False (and the connection stopped) if Retries are exhausted."""
        retries, _ = self._policy()
        with self.ack.lock:
            exhausted = self.ack.retry_count >= retries
            if not exhausted:
                self.ack.retry_count += 1
                self.ack.resends += 1
        if exhausted:
            self._stop_connection(f"no acknowledgement after {retries} retries")
        return not exhausted

    def convert(self, entries: list[Entry]) -> Any:
        value = super().convert(entries)  # type: ignore[misc]
        sn = getattr(self._tls, "sn", None)
        if sn is None:
            return value
        if isinstance(value, list):
            return [with_sequence_number(value[0], sn), *value[1:]] if value else value
        return with_sequence_number(value, sn)

    def _release_resources(self) -> None:
        for e in self.ack.drain():
            e.record.release()
        super()._release_resources()  # type: ignore[misc]


class Step(enum.Enum):
    """What one pass of an acknowledging push proxy's scheduler came to."""

    OK = "ok"                # batches sent (or their failure handled); go on
    IDLE = "idle"            # nothing to send now: it waited
    STOPPED = "stopped"      # Retries ran out: the connection is stopped
    GONE = "gone"            # the consumer no longer exists: the proxy disconnected


class AckPushMixin(_AckSupplierMixin, PushSupplierMixin):
    """Push with acknowledgements: a window of in-flight batches, resent after RetryInterval without an ack."""

    def __init__(self, admin: Any, row: Any) -> None:
        super().__init__(admin, row)
        self._init_ack()

    def _push_loop(self) -> None:
        since: float | None = None
        while not (self.stop_event.is_set() or self.rt.shutting_down.is_set()):
            outcome, since = self._tick(since)
            if outcome is Step.GONE:
                return

    def _tick(self, since: float | None) -> tuple[Step, float | None]:
        """One pass of the resend scheduler at the clock's current reading."""
        now = self._clock()
        if self.ack.stopped or self.suspended or not self.connected:
            self.ack.passed(now)                     # decided at `now`: nothing is sent
            self.queue.wait(_IDLE)
            return Step.IDLE, since
        outcome, since = self._step(since, now)
        self.ack.passed(now)
        return outcome, since

    def _step(self, since: float | None, now: float) -> tuple[Step, float | None]:
        _, interval = self._policy()
        overdue = self.ack.overdue(now, interval)
        if overdue:
            fresh = [p for p in overdue if p.sent_at == 0.0]
            if len(fresh) < len(overdue) and not self._count_retry():
                return Step.STOPPED, since
            return self._send_all(overdue), since
        if self.ack.room():
            n, since = self.ready_count(since)
            entries = self.queue.take(self.batch_limit(n), self.rt.max_event_bytes) if n else []
            if entries:
                p = self.ack.open(entries, 0.0)
                if any(e.record.db_id is not None for e in entries):
                    self._save_ack()                 # the number is on disk before the consumer can see it
                return self._send_all([p]), since
        self.queue.wait(self._ack_wait(interval, since, now))
        return Step.IDLE, since

    def _ack_wait(self, interval: float, since: float | None, now: float) -> float:
        wait = self._idle_wait(since) if self.ack.room() else _IDLE
        due = self.ack.next_due(interval)
        return max(0.001, min(wait, due - now)) if due is not None else wait

    def _send_all(self, pendings: list[Pending]) -> Step:
        for p in pendings:
            outcome = self._send(p)
            if outcome is not Step.OK:
                return outcome
        return Step.OK

    def _send(self, p: Pending) -> Step:
        """Push one batch under its number; transient failures are retried every RetryInterval (tenacity)."""
        _, interval = self._policy()
        try:
            self._retrying(interval)(self._push_once, p)
        except (CosEventComm.Disconnected, CORBA.OBJECT_NOT_EXIST) as exc:
            log.info("proxy %s: consumer gone (%s); disconnecting", self.oid, type(exc).__name__)
            self.teardown(notify_client=False, retry=True)
            return Step.GONE
        except _Exhausted:
            return Step.STOPPED
        except _ContentFailed as failed:
            return self._content_failed_in_flight(p, failed.exc)
        except CORBA.Exception as exc:
            log.warning("proxy %s: push of SequenceNumber %d failed (%s)", self.oid, p.sn, exc)
        else:
            self.delivered_one_batch()
        p.sent_at = self._clock()
        return Step.OK

    def _content_failed_in_flight(self, p: Pending, exc: BaseException) -> Step:
        """A batch the consumer's ORB cannot take (size, content) is not retried under its SequenceNumber until
        Retries stop the connection: its number is withdrawn (the consumer never received it) and its entries go
        through the channel's poison handling (isolated, retried alone, dead-lettered after the limit)."""
        with self.ack.lock:
            self.ack.inflight.pop(p.sn, None)
        self.content_failed(p.entries, exc)
        if any(e.record.db_id is not None for e in p.entries):
            self._save_ack()
        return Step.OK

    def _retrying(self, interval: float) -> tenacity.Retrying:
        stop_event = self.stop_event

        def before_sleep(state: tenacity.RetryCallState) -> None:
            if not self._count_retry():
                raise _Exhausted()

        def sleep(seconds: float) -> None:
            stop_event.wait(seconds)            # interrupted by the proxy's stop

        return tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_TRANSIENT),
            stop=lambda state: stop_event.is_set() or bool(self.ack.stopped),
            wait=tenacity.wait_fixed(interval),
            sleep=sleep,
            before_sleep=before_sleep,
            reraise=True)

    def _push_once(self, p: Pending) -> None:
        client = self.client_ref()
        if client is None:
            raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)
        omniORB.setClientCallTimeout(client, self.rt.push_timeout_ms)
        while True:
            self._tls.sn = p.sn
            try:
                value = self.convert(p.entries)
            except Exception as exc:
                raise _ContentFailed(exc) from exc
            finally:
                self._tls.sn = None
            try:
                getattr(client, self.push_op)(value)
                return
            except CORBA.DATA_CONVERSION as exc:     # the consumer's code set: narrow the text and push again
                if not self._narrow_text(exc):
                    raise _ContentFailed(exc) from exc
            except EVENT_SPECIFIC as exc:
                raise _ContentFailed(exc) from exc
            except CORBA.COMM_FAILURE as exc:
                if self._after_comm_failure(client, exc) is Outcome.EVENT_FAILED:
                    raise _ContentFailed(exc) from exc
                raise


class _Exhausted(Exception):
    """Retries ran out inside a tenacity loop (the connection is already stopped)."""


class _ContentFailed(Exception):
    """The consumer's ORB refused this batch because of its content (not retried under its number)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


class AckPullMixin(_AckSupplierMixin, PullSupplierMixin):
    """Pull with acknowledgements: pulled batches stay in flight and are offered again after RetryInterval."""

    def __init__(self, admin: Any, row: Any) -> None:
        super().__init__(admin, row)
        self._init_ack()

    def _end_pull(self, handed: list[Entry]) -> None:
        """Nothing to confirm by the next pull (``_try_take``/``_blocking_take`` begin no pull here):
        acknowledgements confirm delivery, and entries are tracked in flight by :meth:`_next_batch`."""

    def _hand_out(self, entries: list[Entry]) -> Any:
        """Entries stay in flight (offered again after RetryInterval) whatever happens to this reply."""
        return self.convert(entries)

    def _next_batch(self, n: int) -> list[Entry]:
        self._tls.sn = None
        if self.suspended or self.ack.stopped:
            return []
        _, interval = self._policy()
        now = self._clock()
        overdue = self.ack.overdue(now, interval)
        self.ack.passed(now)
        if overdue:
            p = overdue[0]
            if p.sent_at != 0.0 and not self._count_retry():
                return []
        elif self.ack.room():
            entries = self.queue.take(n)
            if not entries:
                return []
            p = self.ack.open(entries, 0.0)
            if any(e.record.db_id is not None for e in entries):
                self._save_ack()
        else:
            return []
        p.sent_at = now
        self._tls.sn = p.sn
        return p.entries

    def _try_take(self, n: int) -> list[Entry]:
        self._check_pullable()
        return self._next_batch(n)

    def _blocking_take(self, want: Callable[[], int]) -> list[Entry]:
        while True:
            self._check_pullable()
            if self.rt.shutting_down.is_set():
                raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)
            entries = self._next_batch(want())
            if entries:
                return entries
            _, interval = self._policy()
            due = self.ack.next_due(interval)
            self.queue.wait(_IDLE if due is None else max(0.001, min(_IDLE, due - self._clock())))


# -- concrete Ack servants ---------------------------------------------------------------------------------
class StructuredProxyPushSupplierAckImpl(AckPushMixin, StructuredProxyPushSupplierImpl,
                                         CosNotifyChannelAdminAck__POA.StructuredProxyPushSupplierAck):
    pass


class SequenceProxyPushSupplierAckImpl(AckPushMixin, SequenceProxyPushSupplierImpl,
                                       CosNotifyChannelAdminAck__POA.SequenceProxyPushSupplierAck):
    pass


class StructuredProxyPullSupplierAckImpl(AckPullMixin, StructuredProxyPullSupplierImpl,
                                         CosNotifyChannelAdminAck__POA.StructuredProxyPullSupplierAck):
    pass


class SequenceProxyPullSupplierAckImpl(AckPullMixin, SequenceProxyPullSupplierImpl,
                                       CosNotifyChannelAdminAck__POA.SequenceProxyPullSupplierAck):
    pass


ACK_SUPPLIER_CLASSES: dict[str, type] = {
    "PUSH_STRUCTURED": StructuredProxyPushSupplierAckImpl,
    "PUSH_SEQUENCE": SequenceProxyPushSupplierAckImpl,
    "PULL_STRUCTURED": StructuredProxyPullSupplierAckImpl,
    "PULL_SEQUENCE": SequenceProxyPullSupplierAckImpl,
}


def ack_class_for(side: str, kind: str, es_style: bool, qos: dict[str, Any]) -> type | None:
    """The Ack servant class for a proxy supplier created with DeliveryReliability=Acknowledgment, else None."""
    if side != "C" or es_style or not ack_enabled(qos):
        return None
    return ACK_SUPPLIER_CLASSES.get(kind)


store_boundary_all([ACK_SUPPLIER_CLASSES])
