"""An in-process twin of a STOMP/JMS broker and a :class:`~router.jms.transport.Transport` for it (``memory://NAME``).

It behaves like ActiveMQ Classic over STOMP where the contract tests pin it down: messages go through the same
codec as on the wire (so properties arrive as String headers), queues and topics, durable subscriptions,
transactions (sends and acks applied at COMMIT; after ABORT the acked deliveries must be acked again), auto /
client / client-individual acks, redelivery (``redelivered: true``) of un-acked messages on unsubscribe, close and
broker restart, NACK to a dead-letter list, JMS selectors (comparisons, AND/OR/NOT, IN, LIKE, BETWEEN, IS NULL, with
ActiveMQ's String-to-number/boolean conversion; no arithmetic), and ERROR answers (a bad selector is a
:class:`BrokerError`).

It fails loudly: misuse raises :class:`LocalProtocolError` exactly as the STOMP transport does (both use
:class:`SessionBook`), and :meth:`MemoryBroker.inject_fault` makes the next matching operation fail with a chosen
error so callers' failure paths can be unit-tested. Delivery delay (``AMQ_SCHEDULED_DELAY``) is not simulated.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import urlsplit

from router.jms.model import BodyType, DeliveryMode, Destination, JmsMessage
from router.jms.transport import (
    RECONNECT_POLICY,
    AckMode,
    BrokerError,
    BrokerUnavailable,
    ConnectionState,
    Delivery,
    EncodedMessage,
    LocalProtocolError,
    MessageCodec,
    QueueSubscription,
    RetryPolicy,
    SendFailed,
    SessionBook,
    SimpleCodec,
    StateCallback,
    Subscription,
    SubscriptionSpec,
    TransportError,
    refused_send,
    stomp_destination,
)

__all__ = ["MemoryBroker", "MemoryTransport", "compile_selector"]

Selector = Callable[[Mapping[str, str]], bool | None]
_RIDS = itertools.count(1)      # receipt ids of the twin's answered frames (SessionBook.frame_answered)


# --------------------------------------------------------------------------------------------------- selectors
_TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>\d+(?:\.\d+)?)|(?P<op><>|<=|>=|[=<>(),])"
                    r"|(?P<id>[A-Za-z_$][\w$.]*))")
_KEYWORDS = {"AND", "OR", "NOT", "IN", "LIKE", "ESCAPE", "IS", "NULL", "BETWEEN", "TRUE", "FALSE"}


class _SelectorSyntax(ValueError):
    pass


def _tokens(text: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    pos, text = 0, text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise _SelectorSyntax(f"bad selector near {text[pos:pos + 10]!r}")
        pos = m.end()
        kind = m.lastgroup or ""
        value: Any = m.group(kind)
        if kind == "str":
            value = value[1:-1].replace("''", "'")
        elif kind == "num":
            value = float(value) if "." in value else int(value)
        elif kind == "id" and value.upper() in _KEYWORDS:
            kind, value = "kw", value.upper()
        out.append((kind, value))
    return out


def _header_value(headers: Mapping[str, str], name: str) -> Any:
    if name == "JMSPriority":
        return int(headers.get("priority", "4"))
    if name == "JMSDeliveryMode":
        return "PERSISTENT" if headers.get("persistent") == "true" else "NON_PERSISTENT"
    aliases = {"JMSType": "type", "JMSCorrelationID": "correlation-id", "JMSMessageID": "message-id"}
    return headers.get(aliases.get(name, name))


class _Parser:
    """Recursive descent over the JMS selector subset; builds closures returning True / False / None."""

    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0

    def peek(self, *values: str) -> bool:
        return self.i < len(self.toks) and self.toks[self.i][1] in values and self.toks[self.i][0] in ("kw", "op")

    def take(self, value: str) -> None:
        if not self.peek(value):
            raise _SelectorSyntax(f"expected {value}")
        self.i += 1

    def parse(self) -> Selector:
        node = self.disjunction()
        if self.i != len(self.toks):
            raise _SelectorSyntax(f"unexpected {self.toks[self.i][1]!r}")
        return node

    def disjunction(self) -> Selector:
        node = self.conjunction()
        while self.peek("OR"):
            self.i += 1
            node = _or(node, self.conjunction())
        return node

    def conjunction(self) -> Selector:
        node = self.negation()
        while self.peek("AND"):
            self.i += 1
            node = _and(node, self.negation())
        return node

    def negation(self) -> Selector:
        if self.peek("NOT"):
            self.i += 1
            inner = self.negation()
            return lambda h: None if (v := inner(h)) is None else not v
        return self.comparison()

    def comparison(self) -> Selector:
        left = self.operand()
        negate = self.peek("NOT")
        self.i += negate
        if self.peek("=", "<>", "<", ">", "<=", ">=") and not negate:
            op = self.toks[self.i][1]
            self.i += 1
            if op not in ("=", "<>") and self.i < len(self.toks) and self.toks[self.i][0] == "str":
                raise _SelectorSyntax(f"{op} needs a numeric operand")   # as ActiveMQ's grammar
            return _compare(op, left, self.operand())
        if self.peek("IS"):
            return self._is_null(left)
        node = self._special(left)
        return (lambda h: None if (v := node(h)) is None else not v) if negate else node

    def _is_null(self, left: Callable[[Mapping[str, str]], Any]) -> Selector:
        self.i += 1
        want_null = not self.peek("NOT")
        self.i += not want_null
        self.take("NULL")
        return lambda h: (left(h) is None) == want_null

    def _special(self, left: Callable[[Mapping[str, str]], Any]) -> Selector:
        if self.peek("IN"):
            self.i += 1
            self.take("(")
            values = [self.string()]
            while self.peek(","):
                self.i += 1
                values.append(self.string())
            self.take(")")
            return lambda h: None if (v := left(h)) is None else v in values
        if self.peek("LIKE"):
            self.i += 1
            return _like(left, self.string(), self._escape())
        if self.peek("BETWEEN"):
            self.i += 1
            low = self.operand()
            self.take("AND")
            return _and(_compare(">=", left, low), _compare("<=", left, self.operand()))
        if self.i == len(self.toks) or self.peek(")", "AND", "OR"):
            return lambda h: v if isinstance(v := left(h), bool) else None
        raise _SelectorSyntax(f"unexpected {self.toks[self.i][1]!r}")

    def _escape(self) -> str | None:
        if not self.peek("ESCAPE"):
            return None
        self.i += 1
        return self.string()

    def string(self) -> str:
        value = self.literal()
        if not isinstance(value, str):
            raise _SelectorSyntax(f"expected a string literal, got {value!r}")
        return value

    def literal(self) -> Any:
        if self.i >= len(self.toks) or self.toks[self.i][0] not in ("str", "num", "kw"):
            raise _SelectorSyntax("expected a literal")
        kind, value = self.toks[self.i]
        if kind == "kw" and value not in ("TRUE", "FALSE"):
            raise _SelectorSyntax(f"expected a literal, got {value}")
        self.i += 1
        return value == "TRUE" if kind == "kw" else value

    def operand(self) -> Callable[[Mapping[str, str]], Any]:
        if self.peek("("):
            self.i += 1
            inner = self.disjunction()
            self.take(")")
            return inner
        if self.i < len(self.toks) and self.toks[self.i][0] == "id":
            name = self.toks[self.i][1]
            self.i += 1
            return lambda h: _header_value(h, name)
        value = self.literal()
        return lambda h: value


def _or(a: Selector, b: Selector) -> Selector:
    def run(h: Mapping[str, str]) -> bool | None:
        x, y = a(h), b(h)
        return True if x or y else (None if x is None or y is None else False)
    return run


def _and(a: Selector, b: Selector) -> Selector:
    def run(h: Mapping[str, str]) -> bool | None:
        x, y = a(h), b(h)
        return False if x is False or y is False else (None if x is None or y is None else True)
    return run


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda x, y: x == y, "<>": lambda x, y: x != y, "<": lambda x, y: x < y, ">": lambda x, y: x > y,
    "<=": lambda x, y: x <= y, ">=": lambda x, y: x >= y}


def _compare(op: str, left: Callable[[Mapping[str, str]], Any], right: Callable[[Mapping[str, str]], Any]
             ) -> Selector:
    def run(h: Mapping[str, str]) -> bool | None:
        x, y = left(h), right(h)
        x, y = _coerce(x, y), _coerce(y, x)
        if x is None or y is None:
            return None
        if isinstance(x, bool) != isinstance(y, bool) or isinstance(x, str) != isinstance(y, str):
            return False
        return _OPS[op](x, y)
    return run


def _coerce(value: Any, other: Any) -> Any:
    """ActiveMQ converts a String operand to the other side's type (number, boolean); None when it cannot."""
    if not isinstance(value, str) or isinstance(other, str) or other is None:
        return value
    if isinstance(other, bool):
        return value.lower() == "true" if value.lower() in ("true", "false") else None
    try:
        return int(value) if value.strip().lstrip("+-").isdigit() else float(value)
    except ValueError:
        return None


def _like(left: Callable[[Mapping[str, str]], Any], pattern: str, escape: str | None) -> Selector:
    regex, chars = "", iter(pattern)
    for ch in chars:
        if escape and ch == escape:
            regex += re.escape(next(chars, ""))
        else:
            regex += ".*" if ch == "%" else "." if ch == "_" else re.escape(ch)
    compiled = re.compile(regex, re.DOTALL)
    return lambda h: None if not isinstance(v := left(h), str) else compiled.fullmatch(v) is not None


def compile_selector(text: str | None) -> Selector:
    """A predicate over STOMP headers; :class:`ValueError` for a malformed selector."""
    if not text or not text.strip():
        return lambda h: True
    return _Parser(text).parse()


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


# --------------------------------------------------------------------------------------------------- transport
@dataclass
class _TxOps:
    ops: list[Callable[[], None]] = field(default_factory=list)
    entry: Any = None            # the transaction's SessionBook record (its rollback_only refuses the COMMIT)


class _Done:
    """:class:`~router.jms.transport.PendingReceipt` of the twin: the outcome is known when it is made."""

    def __init__(self, error: TransportError | None) -> None:
        self._error = error

    def wait(self) -> None:
        if self._error is not None:
            raise self._error

    def discard(self) -> None:
        return None


class MemoryTransport:
    """:class:`~router.jms.transport.Transport` on a :class:`MemoryBroker` (``memory://NAME`` or ``broker=``)."""

    def __init__(self, url: str = "memory://", *, broker: MemoryBroker | None = None, client_id: str | None = None,
                 codec: MessageCodec | None = None, on_state: StateCallback | None = None,
                 shutdown: threading.Event | None = None, reconnect_policy: RetryPolicy = RECONNECT_POLICY,
                 **_ignored: Any) -> None:
        parts = urlsplit(url)
        if parts.scheme != "memory":
            raise LocalProtocolError(f"not a memory URL: {url!r}")
        self.url = url
        self.broker = broker or MemoryBroker.named(parts.netloc or parts.path.strip("/"))
        self.client_id = client_id
        self._codec: MessageCodec = codec or SimpleCodec()
        self._on_state = on_state
        self._shutdown = shutdown or threading.Event()
        self._policy = reconnect_policy
        self._book = SessionBook()
        self._epochs = itertools.count(1)
        self._sub_ids = itertools.count(1)
        self._subs: dict[str, QueueSubscription] = {}
        self._txs: dict[str, _TxOps] = {}
        self.renewals = 0

    def __enter__(self) -> MemoryTransport:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connection
    def is_connected(self) -> bool:
        return self._book.connected and not self._book.closed

    def connect(self, *, retry: bool = False) -> None:
        if retry:
            self.reconnect()
            return
        self._book.check_open()
        self._drop_connection()
        self.broker.connect(self, self.client_id)
        self._book.connected_as(next(self._epochs))
        self._notify(ConnectionState.CONNECTED)

    def reconnect(self) -> None:
        self._book.check_open()
        for attempt in self._policy.retrying(self._shutdown):
            with attempt:
                self.connect()
                for sub in list(self._subs.values()):
                    self.broker.subscribe(self, sub.id, sub.spec)

    def renew(self) -> None:
        """The old connection ends as a clean close (its un-acked deliveries go back to the broker), the state
        callback hears only of the new one."""
        self._book.check_open()
        if self._book.connected:
            self.broker.disconnect(self)
            self._book.lost(self._book.epoch)
            self._txs.clear()
            for sub in self._subs.values():
                sub.wake()
        self.reconnect()
        self.renewals += 1

    def close(self) -> None:
        if self._book.closed:
            return
        self.broker.disconnect(self)
        self._book.close()
        for sub in self._subs.values():
            sub.active = False
            sub.wake()
        self._notify(ConnectionState.CLOSED)

    def _drop_connection(self) -> None:
        if self._book.connected:
            self.broker.disconnect(self)
            self._broker_lost()

    def _broker_lost(self) -> None:
        """Called by the broker when it drops this connection."""
        if self._book.lost(self._book.epoch):
            self._txs.clear()
            for sub in self._subs.values():
                sub.wake()
            self._notify(ConnectionState.DISCONNECTED)

    def _notify(self, state: ConnectionState) -> None:
        if self._on_state is not None:
            self._on_state(state)

    def _deliver(self, sub_id: str, headers: dict[str, str], body: bytes) -> None:
        """Called by the broker (under its lock): queue a delivery for the subscription."""
        sub = self._subs.get(sub_id)
        if sub is None:
            return
        try:
            message, problem = self._codec.decode(headers, body), None
        except Exception as exc:  # noqa: BLE001 — same contract as the STOMP transport: hand it on, marked
            message, problem = JmsMessage(BodyType.BYTES, body), f"{type(exc).__name__}: {exc}"
        sub.feed(Delivery(message=message, headers=headers, body=body,
                          subscription=sub_id, ack_id=headers["ack"], message_id=headers["message-id"],
                          destination=headers["destination"], redelivered=headers.get("redelivered") == "true",
                          epoch=self._book.epoch, decode_error=problem))

    def _run(self, operation: str, action: Callable[[], None], *, transaction: str | None = None) -> None:
        """Apply ``action`` now, or at COMMIT when in ``transaction``; an injected fault is raised here."""
        self._book.check_connected()
        fault = self.broker.take_fault(operation)
        if fault is None or fault[1]:
            if transaction is not None:
                self._txs[transaction].ops.append(action)
            else:
                action()
        if fault is not None:
            if isinstance(fault[0], BrokerUnavailable):
                self._drop_connection()
            raise fault[0]

    # -- sending and transactions
    def send(self, destination: Destination | str, message: JmsMessage, *, transaction: str | None = None,
             receipt: bool = True, headers: Mapping[str, str] | None = None) -> None:
        encoded = self._codec.encode(message)
        if headers:
            encoded = EncodedMessage({**encoded.headers, **headers}, encoded.body)
        self.send_encoded(destination, encoded, persistent=message.delivery_mode is DeliveryMode.PERSISTENT,
                          transaction=transaction, receipt=receipt)

    def send_encoded(self, destination: Destination | str, encoded: EncodedMessage, *, persistent: bool,
                     transaction: str | None = None, receipt: bool = True) -> None:
        dest = stomp_destination(destination)
        frame = dict(encoded.headers)
        frame["persistent"] = "true" if persistent else "false"
        try:
            self._book.use_tx(transaction)
            self._run("send", lambda: self.broker.send(dest, dict(frame), encoded.body), transaction=transaction)
            self._answered_in_order(transaction, receipt)
        except BrokerError as exc:
            raise refused_send(exc, dest) from exc
        except BrokerUnavailable as exc:
            raise SendFailed(str(exc), dest) from exc

    def _answered_in_order(self, transaction: str | None, receipt: bool) -> None:
        """The twin answers a receipted frame at once; a receipt-less one stays unanswered in the book until a
        later receipted frame of its transaction (as STOMP's in-order answers, ``SessionBook.frame_refused``)."""
        rid = f"r-{next(_RIDS)}" if receipt else None
        self._book.frame_written(transaction, rid)
        if rid is not None:
            self._book.frame_answered(rid)

    def begin(self) -> str:
        tx = f"tx-{next(self._epochs)}-{id(self):x}"
        self._run("begin", lambda: None)
        self._book.add_tx(tx, self._book.epoch)
        self._txs[tx] = _TxOps(entry=self._book.get_tx(tx))
        return tx

    def begin_nowait(self) -> str:
        """The twin's BEGIN has no round trip either way: as :meth:`begin` (an injected fault raises here)."""
        return self.begin()

    def transaction_problem(self, transaction: str) -> str | None:
        return self._book.tx_problem(transaction)

    def commit(self, transaction: str) -> None:
        self.commit_nowait(transaction).wait()

    def commit_nowait(self, transaction: str) -> _Done:
        """As on STOMP, the checks before the COMMIT raise at once (a transaction lost with its connection, no
        connection); the twin then commits at once and ``wait`` raises the COMMIT's own outcome (an injected
        fault)."""
        entry = self._book.end_tx(transaction)
        ops = self._txs.pop(transaction, _TxOps())
        if not self._book.is_live(entry):
            raise BrokerUnavailable(f"transaction {transaction} was lost with its connection (rolled back)")
        self._book.check_connected()
        try:
            self._run("commit", lambda: self._apply(ops))
        except TransportError as exc:
            return _Done(exc)
        return _Done(None)

    def _apply(self, ops: _TxOps) -> None:
        problem = ops.entry.rollback_only if ops.entry is not None else None
        if problem:                      # as the STOMP transport: no COMMIT of a transaction missing a frame
            raise BrokerError(f"a frame in the transaction failed: {problem}; rolled back")
        with self.broker.lock:
            for op in ops.ops:
                op()

    def abort(self, transaction: str) -> None:
        entry = self._book.end_tx(transaction)
        self._txs.pop(transaction, None)
        if self._book.is_live(entry):
            self._run("abort", lambda: None)
            self._book.restore(entry)

    # -- consuming
    def subscribe(self, destination: Destination | str, *, selector: str | None = None,
                  ack: AckMode | str = AckMode.CLIENT_INDIVIDUAL, durable_name: str | None = None,
                  prefetch: int = 100, transformation: str | None = None) -> Subscription:
        dest = stomp_destination(destination)
        try:
            mode = AckMode(ack)
        except ValueError:
            raise LocalProtocolError(f"unknown ack mode {ack!r}") from None
        if durable_name is not None and (not self.client_id or not dest.startswith("/topic/")):
            raise LocalProtocolError("a durable subscription needs a topic and a client_id on the transport")
        if prefetch < 1:
            raise LocalProtocolError(f"prefetch must be >= 1, got {prefetch}")
        spec = SubscriptionSpec(dest, selector, mode, durable_name, prefetch, transformation)
        sub = QueueSubscription(f"sub-{next(self._sub_ids)}", spec, self._book)
        self._book.check_connected()
        self._book.set_mode(sub.id, mode)
        self._subs[sub.id] = sub
        try:
            self._run("subscribe", lambda: self.broker.subscribe(self, sub.id, spec))
        except TransportError:
            self._subs.pop(sub.id, None)
            self._book.forget_subscription(sub.id)
            raise
        return sub

    def unsubscribe(self, subscription: Subscription, *, remove_durable: bool = False) -> None:
        self._book.check_open()
        sub = self._subs.pop(subscription.id, None)
        if sub is None:
            raise LocalProtocolError(f"unknown subscription {subscription.id!r} (already unsubscribed?)")
        sub.active = False
        self._book.forget_subscription(sub.id)
        sub.wake()
        if self._book.connected:
            self.broker.unsubscribe(self, sub.id, remove_durable=remove_durable)
        elif remove_durable:
            raise BrokerUnavailable("not connected: cannot remove the durable subscription")

    def ack(self, delivery: Delivery, transaction: str | None = None, *, receipt: bool = True) -> None:
        self._settle("ack", delivery, transaction, nack=False)

    def ack_many(self, deliveries: Sequence[Delivery], transaction: str | None = None) -> None:
        """Receipt-less ACKs of ``deliveries`` in order, as :meth:`StompTransport.ack_many` (one call each here)."""
        for delivery in deliveries:
            self.ack(delivery, transaction, receipt=False)

    def nack(self, delivery: Delivery, transaction: str | None = None, *, receipt: bool = True) -> None:
        self._settle("nack", delivery, transaction, nack=True)

    def _settle(self, operation: str, delivery: Delivery, transaction: str | None, *, nack: bool) -> None:
        self._book.take_for_ack(delivery, transaction)
        self._run(operation, lambda: self.broker.settle(self, delivery.subscription, delivery.ack_id, nack=nack),
                  transaction=transaction)

