"""The in-memory broker of the twin: queues, topics, durable subscriptions, acks and redelivery, and simulated
outages (``restart``/``stop``/``start``) and injected faults for the callers' failure paths."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from router.jms.errors import BrokerError, BrokerUnavailable, TransportError
from router.jms.memory.matcher import Selector, compile_selector
from router.jms.session import SubscriptionSpec
from router.jms.transport import AckMode

if TYPE_CHECKING:
    from router.jms.memory.transport import MemoryTransport

__all__ = ["MemoryBroker"]


# --------------------------------------------------------------------------------------------------- the broker
@dataclass
class _Stored:
    headers: dict[str, str]
    body: bytes
    persistent: bool
    redelivered: bool = False

    def expired(self, now_ms: int) -> bool:
        expires = int(self.headers.get("expires", "0") or 0)
        return 0 < expires <= now_ms


@dataclass
class _BrokerSub:
    owner: MemoryTransport
    sub_id: str
    spec: SubscriptionSpec
    match: Selector
    source: deque[_Stored]
    inflight: dict[str, _Stored] = field(default_factory=dict)

    def has_room(self) -> bool:
        return self.spec.ack is AckMode.AUTO or len(self.inflight) < self.spec.prefetch


@dataclass
class _Durable:
    topic: str
    selector: str | None
    pending: deque[_Stored] = field(default_factory=deque)
    active: bool = False


class MemoryBroker:
    """Queues, topics and subscriptions in memory. ``restart()``/``stop()``/``start()`` simulate broker outages."""

    _registry: ClassVar[dict[str, MemoryBroker]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.lock = threading.RLock()
        self.running = True
        self.queues: dict[str, deque[_Stored]] = {}
        self.dead_letters: list[_Stored] = []
        self._subs: dict[tuple[int, str], _BrokerSub] = {}
        self._durables: dict[tuple[str, str], _Durable] = {}
        self._sessions: dict[int, MemoryTransport] = {}
        self._faults: deque[tuple[str, TransportError, bool]] = deque()
        self._ids = itertools.count(1)

    @classmethod
    def named(cls, name: str) -> MemoryBroker:
        """The broker behind ``memory://NAME`` (created on first use)."""
        with cls._registry_lock:
            return cls._registry.setdefault(name, cls(name))

    @classmethod
    def forget(cls, name: str) -> None:
        with cls._registry_lock:
            cls._registry.pop(name, None)

    # -- outages and faults
    def inject_fault(self, operation: str, error: TransportError, *, applied: bool = False) -> None:
        """The next ``operation`` (send/begin/commit/abort/ack/nack/subscribe) raises ``error``; with ``applied``
        the operation takes effect first (e.g. a COMMIT that happened but whose receipt was lost)."""
        with self.lock:
            self._faults.append((operation, error, applied))

    def take_fault(self, operation: str) -> tuple[TransportError, bool] | None:
        with self.lock:
            for item in self._faults:
                if item[0] == operation:
                    self._faults.remove(item)
                    return item[1], item[2]
            return None

    def restart(self) -> None:
        """Drop every connection; keep persistent messages and durable subscriptions (un-acked → redelivered)."""
        self.stop()
        self.start()

    def stop(self) -> None:
        with self.lock:
            self.running = False
            sessions = list(self._sessions.values())
        for transport in sessions:
            self.disconnect(transport)
            transport._broker_lost()
        with self.lock:
            for q in [*self.queues.values(), *(d.pending for d in self._durables.values())]:
                kept = [m for m in q if m.persistent]
                q.clear()
                q.extend(kept)

    def start(self) -> None:
        with self.lock:
            self.running = True

    # -- sessions
    def connect(self, transport: MemoryTransport, client_id: str | None) -> None:
        with self.lock:
            if not self.running:
                raise BrokerUnavailable(f"memory broker {self.name!r} is down")
            if client_id and any(t.client_id == client_id for t in self._sessions.values()):
                raise BrokerError(f"InvalidClientIDException: client {client_id} already connected")
            self._sessions[id(transport)] = transport

    def disconnect(self, transport: MemoryTransport) -> None:
        with self.lock:
            self._sessions.pop(id(transport), None)
            for key in [k for k in self._subs if k[0] == id(transport)]:
                self._remove_sub(key, remove_durable=False)
            self._pump_all()

    # -- messages
    def send(self, destination: str, headers: dict[str, str], body: bytes) -> None:
        stored = _Stored(headers, body, headers.get("persistent") == "true")
        with self.lock:
            stored.headers["message-id"] = f"ID:{self.name}-{next(self._ids)}"
            stored.headers.setdefault("timestamp", str(int(time.time() * 1000)))
            stored.headers["destination"] = destination
            if destination.startswith("/topic/"):
                self._publish(destination, stored)
            else:
                self.queues.setdefault(destination, deque()).append(stored)
            self._pump_all()

    def _publish(self, topic: str, stored: _Stored) -> None:
        for sub in self._subs.values():
            if sub.spec.destination == topic and sub.spec.durable_name is None and sub.match(stored.headers):
                sub.source.append(_copy(stored))
        for durable in self._durables.values():
            if durable.topic == topic and compile_selector(durable.selector)(stored.headers):
                durable.pending.append(_copy(stored))

    # -- subscriptions
    def subscribe(self, owner: MemoryTransport, sub_id: str, spec: SubscriptionSpec) -> None:
        try:
            match = compile_selector(spec.selector)
        except ValueError as exc:
            raise BrokerError(f"javax.jms.InvalidSelectorException: {spec.selector}", str(exc)) from None
        with self.lock:
            self._subs[(id(owner), sub_id)] = _BrokerSub(owner, sub_id, spec, match, self._source(owner, spec))
            self._pump_all()

    def _source(self, owner: MemoryTransport, spec: SubscriptionSpec) -> deque[_Stored]:
        if spec.durable_name is not None:
            key = (owner.client_id or "", spec.durable_name)
            durable = self._durables.get(key)
            if durable is None or (durable.topic, durable.selector) != (spec.destination, spec.selector):
                durable = self._durables[key] = _Durable(spec.destination, spec.selector)
            if durable.active:
                raise BrokerError(f"durable subscription {spec.durable_name} already has an active consumer")
            durable.active = True
            return durable.pending
        if spec.destination.startswith("/topic/"):
            return deque()
        return self.queues.setdefault(spec.destination, deque())

    def unsubscribe(self, owner: MemoryTransport, sub_id: str, *, remove_durable: bool) -> None:
        with self.lock:
            self._remove_sub((id(owner), sub_id), remove_durable=remove_durable)
            self._pump_all()

    def _remove_sub(self, key: tuple[int, str], *, remove_durable: bool) -> None:
        sub = self._subs.pop(key, None)
        if sub is None:
            return
        for stored in reversed(list(sub.inflight.values())):
            stored.redelivered = True
            sub.source.appendleft(stored)
        if sub.spec.durable_name is not None:
            dkey = (sub.owner.client_id or "", sub.spec.durable_name)
            self._durables[dkey].active = False
            if remove_durable:
                del self._durables[dkey]

    def settle(self, owner: MemoryTransport, sub_id: str, ack_id: str, *, nack: bool) -> None:
        """ACK (or NACK: to ``dead_letters``) one delivery; cumulative for ``client`` mode."""
        with self.lock:
            sub = self._subs.get((id(owner), sub_id))
            if sub is None or ack_id not in sub.inflight:
                raise BrokerError(f"Unexpected ACK received for message-id [{ack_id}]")
            ids = list(sub.inflight)
            upto = ids[: ids.index(ack_id) + 1] if sub.spec.ack is AckMode.CLIENT else [ack_id]
            for one in upto:
                stored = sub.inflight.pop(one)
                if nack:
                    self.dead_letters.append(stored)
            self._pump_all()

    def _pump_all(self) -> None:
        now = int(time.time() * 1000)
        for sub in list(self._subs.values()):
            self._pump(sub, now)

    def _pump(self, sub: _BrokerSub, now_ms: int) -> None:
        for stored in list(sub.source):
            if not sub.has_room():
                return
            if stored.expired(now_ms):
                sub.source.remove(stored)
            elif sub.match(stored.headers):
                sub.source.remove(stored)
                self._hand_over(sub, stored)

    def _hand_over(self, sub: _BrokerSub, stored: _Stored) -> None:
        ack_id = f"{stored.headers['message-id']}#{next(self._ids)}"
        if sub.spec.ack is not AckMode.AUTO:
            sub.inflight[ack_id] = stored
        headers = {**stored.headers, "subscription": sub.sub_id, "ack": ack_id}
        if stored.redelivered:
            headers["redelivered"] = "true"
        if headers.get("persistent") != "true":
            headers.pop("persistent", None)        # as ActiveMQ: only persistent messages carry the header
        sub.owner._deliver(sub.sub_id, headers, stored.body)


def _copy(stored: _Stored) -> _Stored:
    return _Stored(dict(stored.headers), stored.body, stored.persistent)
