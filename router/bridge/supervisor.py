"""The bridge's supervisor: the one thread that keeps a started bridge connected (mixed into ``BridgeImpl``).

The transport's connection-state callback runs on the transport's dispatcher thread and only records the state and
wakes this thread (CONVENTIONS item 8: callbacks hand work over, they never take the bridge's lock or call the
transport). The supervisor reconnects the broker however long it is away (each ``reconnect()`` is bounded by the
transport's policy, the next round tries again), re-subscribes, and resumes the bridge's proxy when the channel
stopped it (an Ack proxy whose Retries ran out on the bridge's TRANSIENT answers during the outage) or left it
suspended.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from omniORB import CORBA

import CosNotifyChannelAdmin

from router.corbacall import ADMIN, CallFailed, call
from router.jms.refusal import RESOURCE_MARK, classify
from router.jms.transport import ConnectionState, Transport, TransportError, resource_refusal

__all__ = ["SUPERVISE_INTERVAL_S", "Supervised"]

log = logging.getLogger("nsjms.bridge")

SUPERVISE_INTERVAL_S = 1.0         # the supervisor checks a started bridge at least this often


class Supervised:
    """Supervision of one bridge; the attributes below are the bridge's (``router.bridge.bridge.BridgeImpl``)."""

    id: int
    destroyed: bool
    broker_state: ConnectionState
    last_error: str
    transport: Transport | None
    flow_in: Any
    factory: Any
    rt: Any
    stop_event: threading.Event
    _lock: threading.RLock
    _wake: threading.Event
    _supervising: bool

    def running(self) -> bool:
        raise NotImplementedError

    def _transport(self) -> Transport:
        raise NotImplementedError

    def _find_proxy(self) -> Any | None:
        raise NotImplementedError

    def _proxy_ref(self) -> Any:
        raise NotImplementedError

    def _on_broker_state(self, state: ConnectionState) -> None:
        """Transport callback, on the transport's dispatcher thread: record and hand over, nothing else. It takes no
        lock and calls nothing that could wait (CONVENTIONS item 8): the supervisor thread does the work."""
        self.broker_state = state
        if state is ConnectionState.DISCONNECTED and not self.destroyed:
            log.warning("bridge %d: broker connection lost", self.id)
        self._wake.set()

    def note_broker_problem(self, exc: Exception) -> None:
        """A broker operation failed: record it and wake the supervisor (it reconnects if the connection is gone).
        A broker out of a resource (a full store, usage limits: router.jms.refusal) says so: an outage, the events
        stay queued and are retried."""
        self.last_error = f"broker: {exc}"
        if resource_refusal(exc):
            verdict = classify(getattr(exc, "message", "") or str(exc), getattr(exc, "body", "") or "")
            self.last_error = f"broker {RESOURCE_MARK} ({verdict.resource}); events stay queued and are retried: {exc}"
        transport = self.transport
        if transport is not None and not transport.is_connected():
            self.broker_state = ConnectionState.DISCONNECTED
        self._wake.set()

    def _ensure_supervisor(self) -> None:
        """Start the supervisor thread once (called with ``self._lock`` held, never from a callback)."""
        if self._supervising or self.destroyed:
            return
        self._supervising = True
        self.rt.spawn(f"bridge-{self.id}-supervisor", self._supervise)

    def _supervise(self) -> None:
        """Until the bridge is destroyed or the node shuts down: while started, keep the broker connected (however
        long it is away), the subscription in place and the bridge's proxy resumed."""
        try:
            while not (self.destroyed or self.factory.shutdown_event.is_set()):
                self._wake.wait(SUPERVISE_INTERVAL_S)
                self._wake.clear()
                if self.running() or self._holds_subscription():
                    self._heal()
        except Exception:  # a bug here must not end supervision silently: log, and start again
            log.exception("bridge %d: supervisor failed; restarting it", self.id)
            self.factory.shutdown_event.wait(SUPERVISE_INTERVAL_S)
            with self._lock:
                self._supervising = False
                self._ensure_supervisor()
            return
        with self._lock:
            self._supervising = False

    def _holds_subscription(self) -> bool:
        """A stopped JMS → channel bridge keeps its subscription (stop_bridge is Connection.stop): keep its broker
        connection too, so a topic goes on collecting for it across a broker restart."""
        flow = self.flow_in
        return flow is not None and flow.subscription is not None and not self.destroyed

    def _heal(self) -> None:
        """One supervision round (supervisor thread only)."""
        try:
            transport = self._transport()
            if not transport.is_connected():
                transport.reconnect()        # bounded by the transport's policy; the next round tries again
                log.info("bridge %d: broker connection re-established", self.id)
            self.broker_state = ConnectionState.CONNECTED
            if self.flow_in is not None and self.running():
                self.flow_in.ensure_subscribed()
        except TransportError as exc:
            self.last_error = f"broker: {exc}"
            self.broker_state = ConnectionState.DISCONNECTED
            return
        self._resume_proxy()

    def _resume_proxy(self) -> None:
        """The broker is up and the bridge started: a proxy the channel stopped (an Ack proxy whose Retries ran
        out on TRANSIENT answers while the broker was away) or left suspended is resumed (one
        ``resume_connection`` clears both)."""
        servant = self._find_proxy()
        if servant is None:
            return
        stopped = getattr(getattr(servant, "ack", None), "stopped", "")
        if not servant.connected or not (stopped or servant.suspended) or not self.running():
            return
        log.warning("bridge %d: its proxy is %s; resuming it", self.id,
                    f"stopped ({stopped})" if stopped else "suspended")
        try:
            call(self._proxy_ref(), "resume_connection", policy=ADMIN, stop=self.stop_event,
                 expected=(CosNotifyChannelAdmin.ConnectionAlreadyActive, CosNotifyChannelAdmin.NotConnected))
        except (CallFailed, CORBA.Exception, CosNotifyChannelAdmin.ConnectionAlreadyActive,
                CosNotifyChannelAdmin.NotConnected) as exc:
            log.warning("bridge %d: resuming its proxy failed: %s", self.id, exc)

    def reconnect_source(self) -> None:
        """JMS → channel loop: wake the supervisor and wait (bounded) for the broker connection."""
        self._wake.set()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and not self.stop_event.is_set():
            transport = self.transport
            if transport is not None and transport.is_connected():
                return
            self.stop_event.wait(0.1)
