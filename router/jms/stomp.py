"""The STOMP 1.2 transport (stomp.py 9), for ActiveMQ Classic and other STOMP brokers.

Threads: stomp.py's receiver thread runs :class:`_Listener`, which only puts ``(epoch, kind, frame)`` on an inbox
queue. One dispatcher thread owned by the transport drains it: it routes MESSAGE frames to subscription queues,
hands RECEIPT/ERROR frames to the caller waiting on that receipt, fails every waiter of a lost connection, and
calls the connection-state callback. Acking, sending and transaction work run on the callers' threads.

Each successful connect starts a new *epoch*; transactions and un-acked deliveries belong to the epoch that made
them and die with it (the broker rolls them back / redelivers). stomp.py's own reconnect loop is disabled
(one attempt per connect): :meth:`StompTransport.reconnect` retries under :data:`RECONNECT_POLICY`.

Every socket the transport opens has ``TCP_NODELAY`` (:func:`_no_delay`): STOMP is request/response (a COMMIT
or BEGIN waits for its RECEIPT), and with Nagle's algorithm a small frame written while the previous segment is
unacknowledged waits for the broker's delayed ACK (typically 40 ms on Linux): every small transaction took about
44 ms to confirm instead of about 1 ms (docs/performance.md, round 7). stomp.py 9 does not set it.

stomp.py exceptions and socket errors are translated to :mod:`router.jms.transport` exceptions here and only here.
"""

from __future__ import annotations

import itertools
import logging
import queue
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import stomp
from stomp.exception import StompException
from stomp.utils import PREAMBLE_END_RE, Frame

from router.jms import readframe
from router.jms.model import BodyType, DeliveryMode, Destination, JmsMessage
from router.jms.refusal import RESOURCE_MARK, is_resource
from router.jms.sendframe import FrameTemplates, encode_ack_frame, encode_send_frame
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
    ReceiptTimeout,
    RemoteProtocolError,
    RetryPolicy,
    SendFailed,
    SessionBook,
    SimpleCodec,
    StateCallback,
    Subscription,
    SubscriptionSpec,
    TransportError,
    redact_url,
    refused_send,
    stomp_destination,
)

__all__ = ["PendingCommit", "StompTransport", "encode_send_frame", "parse_stomp_url"]

log = logging.getLogger("nsjms.transport.stomp")

_STOP = object()
_LINK_ERRORS = (StompException, OSError)
_SERVER_FRAMES = frozenset({"connected", "message", "receipt", "error", "heartbeat"})
#: decode_error of a MESSAGE whose header held a NUL byte (STOMP cannot carry one: the frame arrived split).
SPLIT_FRAME = "a STOMP header of this message holds a NUL byte, which split its MESSAGE frame (reassembled)"


#: Bytes of SEND frames joined into one socket write by :meth:`StompTransport.send_encoded_many` (at least one
#: frame per write, whatever its size).
WRITE_CHUNK = 256 * 1024


def _no_delay(conn: stomp.Connection12) -> None:
    """``TCP_NODELAY`` on ``conn``'s socket (just opened by ``connect``; a TLS socket too): frames go out when
    written, not held back by Nagle's algorithm until the broker acknowledges the previous segment. A socket
    already gone (the connect failed at once) is left to the connect's own error."""
    sock = getattr(conn.transport, "socket", None)
    if sock is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as exc:
        log.debug("TCP_NODELAY on the STOMP socket to %s: %s", conn.transport.current_host_and_port, exc)


#: How long written data may stay unacknowledged by the broker's TCP before the kernel aborts the connection
#: (``TCP_USER_TIMEOUT``), in ms: 1.5 x the 10 s heart-beat, the silence after which stomp.py gives a connection up.
#: A silent cut (packets dropped, no RST) while a write waits for room in a full send buffer otherwise blocks that
#: write, stomp.py's socket lock and with it the heart-beat thread (it sends before it checks what it received)
#: for as long as TCP retransmits (``tcp_retries2``: about 15 minutes); with it the write fails and the connection
#: counts as lost (issue 31). A broker that answers zero-window probes (a full receive window under load) is not cut.
SILENT_LINK_TIMEOUT_MS = 15_000


def _bound_silence(conn: stomp.Connection12) -> None:
    """``TCP_USER_TIMEOUT`` = :data:`SILENT_LINK_TIMEOUT_MS` on ``conn``'s socket (Linux; elsewhere a no-op)."""
    sock = getattr(conn.transport, "socket", None)
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if sock is None or option is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, option, SILENT_LINK_TIMEOUT_MS)
    except OSError as exc:
        log.debug("TCP_USER_TIMEOUT on the STOMP socket to %s: %s", conn.transport.current_host_and_port, exc)


def _write_chunked(conn: stomp.Connection12, frames: Iterable[bytes]) -> None:
    """Write encoded ``frames`` in order, joined into socket writes of about :data:`WRITE_CHUNK` bytes (at least one
    whole frame each: stomp.py's socket lock keeps another thread's frame out of a write)."""
    chunk: list[bytes] = []
    size = 0
    for frame in frames:
        chunk.append(frame)
        size += len(frame)
        if size >= WRITE_CHUNK:
            conn.transport.send(b"".join(chunk))
            chunk, size = [], 0
    if chunk:
        conn.transport.send(b"".join(chunk))


def parse_stomp_url(url: str) -> tuple[list[tuple[str, int]], bool]:
    """``stomp://h1:61613[,h2:61613]`` → host/port list and whether TLS (``stomp+ssl``) is wanted."""
    parts = urlsplit(url)
    if parts.scheme not in ("stomp", "stomp+ssl"):
        raise LocalProtocolError(f"not a stomp URL: {redact_url(url)}")
    if "@" in parts.netloc:
        raise LocalProtocolError("put credentials in the username/password options, not in the URL")
    hosts = []
    for item in parts.netloc.split(","):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise LocalProtocolError(f"want HOST:PORT in {url!r}, got {item!r}")
        hosts.append((host.strip("[]"), int(port)))
    return hosts, parts.scheme == "stomp+ssl"


def _watch_split_frames(conn: stomp.Connection12, inbox: queue.Queue[Any], epoch: int) -> None:
    """Runs on stomp.py's receiver thread, only enqueues. STOMP ends a frame at the first NUL byte, and ActiveMQ
    passes a NUL inside a header value through unescaped (a STOMP producer can put one there): stomp.py then sees a
    MESSAGE whose header section never ends, followed by a "frame" whose command is the rest of that header. stomp.py
    logs and drops the second part, and the first lacks most headers, so the message could be neither acked nor
    rejected. Both parts are handed to the dispatcher, which reassembles them (:class:`_SplitFrame`)."""
    original: Callable[[Frame, bytes], None] = conn.transport.process_frame

    def process_frame(frame: Frame, raw: bytes) -> None:
        kind = str(frame.cmd).lower()
        if kind == "message" and PREAMBLE_END_RE.search(raw) is None:
            inbox.put((epoch, "split", frame))
        elif kind not in _SERVER_FRAMES:
            inbox.put((epoch, "fragment", (frame, PREAMBLE_END_RE.search(raw) is not None)))
        else:
            original(frame, raw)

    conn.transport.process_frame = process_frame


def _unescape(text: str) -> str:
    """STOMP 1.2 header unescaping (``\\c`` ``\\n`` ``\\r`` ``\\\\``) of a line stomp.py did not parse."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            out.append({"c": ":", "n": "\n", "r": "\r", "\\": "\\"}.get(text[i + 1], text[i + 1]))
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


@dataclass
class _SplitFrame:
    """A MESSAGE frame being put back together from the pieces a NUL byte in its headers cut it into."""

    epoch: int
    headers: dict[str, str]

    def add(self, fragment: Frame) -> None:
        """The fragment's "command" continues the last header's value after the NUL, unless it is a whole
        ``name:value`` line (the NUL ended the value; STOMP 1.2 escapes colons inside values)."""
        last = next(reversed(self.headers), None)
        name, colon, value = str(fragment.cmd).partition(":")
        if last is not None:
            self.headers[last] += "\0"
        if colon:
            self.headers.setdefault(_unescape(name), _unescape(value))
        elif last is not None:
            self.headers[last] += _unescape(str(fragment.cmd))
        for key, val in fragment.headers.items():
            self.headers.setdefault(key, val)


class _Listener(stomp.ConnectionListener):
    """Runs on stomp.py's receiver thread: only enqueues."""

    def __init__(self, inbox: queue.Queue[Any], epoch: int) -> None:
        self._inbox = inbox
        self._epoch = epoch

    def on_connected(self, frame: Frame) -> None:
        self._inbox.put((self._epoch, "connected", frame))

    def on_message(self, frame: Frame) -> None:
        self._inbox.put((self._epoch, "message", frame))

    def on_receipt(self, frame: Frame) -> None:
        self._inbox.put((self._epoch, "receipt", frame))

    def on_error(self, frame: Frame) -> None:
        self._inbox.put((self._epoch, "error", frame))

    def on_disconnected(self) -> None:
        self._inbox.put((self._epoch, "disconnected", None))

    def on_heartbeat_timeout(self) -> None:
        self._inbox.put((self._epoch, "disconnected", None))


@dataclass
class _Waiter:
    """One caller waiting for the answer to a receipted frame (or for CONNECTED)."""

    operation: str
    epoch: int
    loss_is_failure: bool          # True: a lost connection means "not done"; False: the outcome is unknown
    answers: queue.Queue[tuple[str, Frame | None]] = field(default_factory=lambda: queue.Queue(maxsize=1))
    on_answer: Callable[[], None] | None = None     # run on the dispatcher thread when the answer arrives

    def wait(self, timeout: float) -> Frame:
        try:
            kind, frame = self.answers.get(timeout=timeout)
        except queue.Empty:
            raise ReceiptTimeout(f"no receipt within {timeout:g} s", self.operation) from None
        if kind == "error" and frame is not None:
            raise _broker_error(frame)
        if kind == "lost":
            if self.loss_is_failure:
                raise BrokerUnavailable(f"{self.operation}: connection lost before the broker answered")
            raise ReceiptTimeout("connection lost before the receipt", self.operation)
        assert frame is not None
        return frame


def _broker_error(frame: Frame) -> BrokerError:
    body = frame.body.decode("utf-8", "replace") if isinstance(frame.body, bytes) else str(frame.body or "")
    return BrokerError(frame.headers.get("message", "(no message header)"), body, frame.headers.get("receipt-id"))


class _EitherEvent:
    """``is_set``/``wait`` over the caller's shutdown event and the transport's own close event."""

    def __init__(self, *events: threading.Event) -> None:
        self._events = events

    def is_set(self) -> bool:
        return any(e.is_set() for e in self._events)

    def wait(self, timeout: float | None = None) -> bool:
        step = 0.05 if timeout is None else min(0.05, timeout)
        remaining = timeout
        while not self.is_set() and (remaining is None or remaining > 0):
            self._events[0].wait(step)
            remaining = None if remaining is None else remaining - step
        return self.is_set()


class PendingCommit:
    """A COMMIT written by :meth:`StompTransport.commit_nowait`, its receipt not awaited yet."""

    def __init__(self, transport: StompTransport, transaction: str, entry: Any) -> None:
        self._transport = transport
        self.transaction = transaction
        self._entry = entry
        self.rid: str | None = None
        self._problem: tuple[str | None] | None = None     # the transaction's problem when the answer arrived

    def answered(self) -> None:
        """On the dispatcher thread, as the COMMIT's answer arrives: the transaction leaves the book then, so an
        ERROR for a frame written after the COMMIT (another transaction's, pipelined) cannot mark it."""
        self._problem = (self._entry.rollback_only,)
        self._transport._book.discard_tx(self.transaction)

    def discard(self) -> None:
        """Never wait (the caller is unwinding): the receipt's waiter and the transaction leave the books at once;
        the COMMIT's outcome stays unknown, and its answer, when it comes, is dropped."""
        t = self._transport
        if self.rid is not None:
            t._waiters.pop(self.rid, None)
        t._book.discard_tx(self.transaction)

    def wait(self) -> None:
        """Wait for the COMMIT's receipt (:class:`ReceiptTimeout`: the outcome is unknown; :class:`BrokerError`:
        refused, or a frame in the transaction failed)."""
        t = self._transport
        try:
            if self.rid is not None:
                t._wait(self.rid, t._receipt_timeout)
        except BrokerError as exc:
            # ActiveMQ refuses the COMMIT of a transaction whose frame it refused with its own words ("COMMIT FAILED:
            # Transaction marked rollback only"): the refused frame's reason says why (a full store: an outage)
            problem = self._problem[0] if self._problem is not None else self._entry.rollback_only
            if problem and problem not in exc.message:
                raise BrokerError(f"{exc.message} (a frame in the transaction failed: {problem})", exc.body,
                                  exc.receipt_id) from exc
            raise
        finally:
            t._book.discard_tx(self.transaction)
        problem = self._problem[0] if self._problem is not None else self._entry.rollback_only
        if problem:
            raise BrokerError(f"transaction {self.transaction}: a frame in it failed before the COMMIT was "
                              f"confirmed ({problem}); the broker committed it without that frame")


class StompTransport:
    """:class:`~router.jms.transport.Transport` over STOMP 1.2 with stomp.py 9 (see the module docstring)."""

    def __init__(self, url: str, *, username: str | None = None, password: str | None = None,
                 client_id: str | None = None, codec: MessageCodec | None = None,
                 on_state: StateCallback | None = None, shutdown: threading.Event | None = None,
                 heartbeats: tuple[int, int] = (10_000, 10_000), receipt_timeout: float = 30.0,
                 connect_timeout: float = 10.0, reconnect_policy: RetryPolicy = RECONNECT_POLICY,
                 ssl_options: Mapping[str, Any] | None = None, vhost: str | None = None) -> None:
        self._hosts, self._use_ssl = parse_stomp_url(url)
        self.url = redact_url(url)
        self.client_id = client_id
        self._credentials = (username, password)
        self._codec: MessageCodec = codec or SimpleCodec()
        self._on_state = on_state
        self._shutdown = shutdown or threading.Event()
        self._closed_event = threading.Event()
        self._heartbeats = heartbeats
        self._receipt_timeout = receipt_timeout
        self._connect_timeout = connect_timeout
        self._policy = reconnect_policy
        self._ssl_options = dict(ssl_options or {})
        self._vhost = vhost
        self._book = SessionBook()
        self._frames = FrameTemplates()       # the SEND frames of send_encoded_many (issue 12, round 5)
        self._conn: stomp.Connection12 | None = None
        self._attempts = itertools.count(1)
        self._sub_ids = itertools.count(1)
        self._waiters: dict[str, _Waiter] = {}
        self._subs: dict[str, QueueSubscription] = {}
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._dispatcher: threading.Thread | None = None
        self._split: _SplitFrame | None = None     # dispatcher thread only
        self._sub_lock = threading.Lock()          # one SUBSCRIBE per subscription and connection epoch
        self._sub_epochs: dict[str, int] = {}
        self.last_error: BrokerError | None = None
        self._connect_lock = threading.RLock()
        self._quiet_epoch = -1                     # the epoch renew() closes on purpose: its end is not a loss

    def __repr__(self) -> str:
        return f"StompTransport({self.url!r}, connected={self.is_connected()})"

    def __enter__(self) -> StompTransport:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------- connection
    def is_connected(self) -> bool:
        return self._book.connected and not self._book.closed

    def connect(self, *, retry: bool = False) -> None:
        self._book.check_open()
        self._start_dispatcher()
        if retry:
            self.reconnect()
        else:
            self._connect_once()

    def reconnect(self) -> None:
        self._book.check_open()
        if threading.current_thread() is self._dispatcher:
            raise LocalProtocolError("reconnect() called from the transport's own callback thread")
        self._start_dispatcher()
        stop = _EitherEvent(self._shutdown, self._closed_event)
        with self._connect_lock:                     # one (re)connection at a time (renew() holds it throughout)
            for attempt in self._policy.retrying(stop):  # type: ignore[arg-type]
                with attempt:
                    self._connect_once()
                    self._resubscribe()

    def renew(self) -> None:
        """A planned replacement of the live connection (see ``Transport.renew``): DISCONNECT, receipted (ActiveMQ
        answers once it removed the connection, so its un-acked deliveries are back on their queues, in order, before
        the new connection subscribes), then connect and re-subscribe under the reconnect policy. The old connection
        is dropped quietly (its waiters fail, its deliveries die with its epoch; the state callback is not told)."""
        self._book.check_open()
        if threading.current_thread() is self._dispatcher:
            raise LocalProtocolError("renew() called from the transport's own callback thread")
        with self._connect_lock:
            with self._book.lock:
                conn, epoch, live = self._conn, self._book.epoch, self._book.connected
            if live:
                self._quiet_epoch = epoch    # the socket's close, seen by the receiver thread, is no loss either
                self._say_goodbye()
                with self._book.lock:
                    if self._book.epoch == epoch:
                        self._conn = None
                self._lost(epoch)
                self._drop_socket(conn)
            self.reconnect()

    def close(self) -> None:
        with self._book.lock:
            if self._book.closed:
                return
            conn, epoch, live = self._conn, self._book.epoch, self._book.connected
        if live:
            self._say_goodbye()
        self._book.close()
        self._closed_event.set()
        self._conn = None
        self._fail_waiters(lambda w: True)
        for sub in list(self._subs.values()):
            sub.active = False
            sub.wake()
        self._drop_socket(conn)
        self._notify(ConnectionState.CLOSED)
        self._stop_dispatcher()
        log.info("transport to %s closed (epoch %d)", self.url, epoch)

    def _connect_once(self) -> None:
        self._abandon_current()
        epoch = next(self._attempts)
        conn = self._new_connection(epoch)
        waiter = _Waiter("connect", epoch, loss_is_failure=True)
        self._waiters[f"connect-{epoch}"] = waiter
        try:
            conn.connect(*self._credentials, wait=False, headers=self._connect_headers())
            _no_delay(conn)
            _bound_silence(conn)
            waiter.wait(self._connect_timeout)
        except (_LINK_ERRORS + (ReceiptTimeout, BrokerUnavailable)) as exc:
            self._drop_socket(conn)
            raise BrokerUnavailable(f"cannot connect to {self.url}: {exc or type(exc).__name__}") from exc
        except BrokerError as exc:
            self._drop_socket(conn)
            if "InvalidClientID" in exc.body or "already connected" in exc.message:
                raise BrokerUnavailable(f"client id {self.client_id!r} still in use on the broker") from exc
            raise
        finally:
            self._waiters.pop(f"connect-{epoch}", None)
        with self._book.lock:
            self._conn = conn
            self._book.connected_as(epoch)
        self._notify(ConnectionState.CONNECTED)
        log.info("connected to %s (epoch %d)", self.url, epoch)

    def _new_connection(self, epoch: int) -> stomp.Connection12:
        conn = stomp.Connection12(
            self._hosts, heartbeats=self._heartbeats, auto_content_length=False, auto_decode=False,
            reconnect_attempts_max=1, reconnect_sleep_initial=0.0, reconnect_sleep_increase=0.0,
            reconnect_sleep_jitter=0.0, timeout=self._connect_timeout, vhost=self._vhost)
        if self._use_ssl:
            conn.set_ssl(for_hosts=self._hosts, **self._ssl_options)
        conn.set_listener("nsjms", _Listener(self._inbox, epoch))
        _watch_split_frames(conn, self._inbox, epoch)
        readframe.install(conn.transport)    # stomp.py's frames, parsed in a quarter of its time (issue 12, round 8)
        return conn

    def _connect_headers(self) -> dict[str, str]:
        return {"client-id": self.client_id} if self.client_id else {}

    def _abandon_current(self) -> None:
        """Drop the live connection (if any) as lost, synchronously, before a new one is made."""
        with self._book.lock:
            conn, epoch = self._conn, self._book.epoch
            self._conn = None
        self._lost(epoch)
        self._drop_socket(conn)

    def _say_goodbye(self) -> None:
        try:
            self._transmit("disconnect", lambda c, h: c.send_frame("DISCONNECT", h), {}, receipt=True,
                           loss_is_failure=True, timeout=min(self._receipt_timeout, 5.0))
        except TransportError as exc:
            log.debug("DISCONNECT to %s not confirmed: %s", self.url, exc)

    @staticmethod
    def _drop_socket(conn: stomp.Connection12 | None) -> None:
        if conn is None:
            return
        try:
            conn.transport.disconnect_socket()
        except Exception as exc:  # noqa: BLE001 - stomp.py may raise anything from a half-dead socket; we discard it
            log.debug("closing a STOMP socket: %s", exc)

    # ------------------------------------------------------------------------------------------- sending
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
        frame_headers = dict(encoded.headers)
        frame_headers["persistent"] = "true" if persistent else "false"
        if transaction is not None:
            frame_headers["transaction"] = transaction
        body = encoded.body

        def write(conn: stomp.Connection12, headers: dict[str, str]) -> None:
            if conn.transport.blocking:         # plain TCP: the frame's bytes, written as stomp.py would
                headers["destination"] = dest
                conn.transport.send(encode_send_frame(headers, body))
            else:                               # TLS: stomp.py's I/O thread writes (non-blocking socket)
                conn.send(dest, body, headers=headers)

        try:
            self._book.use_tx(transaction)
            self._transmit("send", write, frame_headers, receipt=receipt, loss_is_failure=transaction is not None,
                           tx=transaction)
        except BrokerError as exc:
            raise refused_send(exc, dest) from exc
        except BrokerUnavailable as exc:
            raise SendFailed(str(exc), dest) from exc

    def send_encoded_many(self, destination: Destination | str, messages: Sequence[tuple[EncodedMessage, bool]], *,
                          transaction: str) -> None:
        """Receipt-less SENDs of ``(encoded, persistent)`` in ``transaction``: the frames and the book exactly as
        that many ``send_encoded(..., transaction=transaction, receipt=False)`` calls, written with one socket
        write per :data:`WRITE_CHUNK` bytes (issue 12, round 4). Same errors as :meth:`send_encoded`; frames of a
        failed call may have been written (the caller aborts the transaction, as after a failed SEND)."""
        dest = stomp_destination(destination)
        try:
            self._book.use_tx(transaction)
            with self._book.lock:
                self._book.check_connected()
                conn = self._conn
                for _ in messages:
                    self._book.frame_written(transaction, None)
            assert conn is not None
            try:
                if conn.transport.blocking:
                    self._write_frames(conn, dest, messages, transaction, self._frames)
                else:
                    for encoded, persistent in messages:
                        headers = {**encoded.headers, "persistent": "true" if persistent else "false",
                                   "transaction": transaction}
                        conn.send(dest, encoded.body, headers=headers)
            except _LINK_ERRORS as exc:
                raise BrokerUnavailable(f"send: the frame could not be written: {exc}") from exc
        except BrokerError as exc:
            raise refused_send(exc, dest) from exc
        except BrokerUnavailable as exc:
            raise SendFailed(str(exc), dest) from exc

    @staticmethod
    def _write_frames(conn: stomp.Connection12, dest: str, messages: Sequence[tuple[EncodedMessage, bool]],
                      transaction: str, frames: FrameTemplates) -> None:
        encode = frames.encode
        _write_chunked(conn, (encode({**encoded.headers, "persistent": "true" if persistent else "false",
                                      "transaction": transaction, "destination": dest}, encoded.body)
                              for encoded, persistent in messages))

    def begin(self) -> str:
        """BEGIN, receipted: a BEGIN the broker refuses raises here (:class:`BrokerError`), at the transaction's
        start, so a routing transaction (T2) branch tells a refused BEGIN (an outage) from a refused message."""
        tx = f"tx-{uuid.uuid4().hex}"
        epoch = self._transmit("begin", lambda c, h: c.begin(tx, headers=h), {}, receipt=True,
                               loss_is_failure=True)
        self._book.add_tx(tx, epoch)
        return tx

    def begin_nowait(self) -> str:
        """BEGIN without a receipt (issue 12: no round trip per batch). The transaction is in the book before
        its frame is written, so an ERROR answering the BEGIN (it has no receipt id) marks it rollback-only: a
        failed BEGIN shows up at the COMMIT (or :meth:`transaction_problem`), which then raises, not telling it
        from a refused SEND. Only for callers that resend a refused transaction one message at a time."""
        tx = f"tx-{uuid.uuid4().hex}"
        self._book.add_tx(tx, self._book.check_connected())
        try:
            self._transmit("begin", lambda c, h: c.begin(tx, headers=h), {}, receipt=False, loss_is_failure=True,
                           tx=tx)
        except BaseException:
            self._book.discard_tx(tx)
            raise
        return tx

    def transaction_problem(self, transaction: str) -> str | None:
        return self._book.tx_problem(transaction)

    def commit(self, transaction: str) -> None:
        """The transaction stays in the book until the COMMIT's receipt: an ERROR for an earlier receipt-less frame
        that arrives meanwhile still marks it, and the commit then raises :class:`BrokerError` (ActiveMQ refuses
        such a COMMIT itself; a broker that accepts it has committed the transaction without that frame)."""
        self.commit_nowait(transaction).wait()

    def commit_nowait(self, transaction: str) -> PendingCommit:
        """Write the COMMIT (receipted) and return without waiting: :meth:`PendingCommit.wait` waits for its
        receipt and raises what :meth:`commit` raises. The caller may write other frames meanwhile (pipelining);
        it must call ``wait`` once. A transaction already known to be lost or rollback-only raises here."""
        entry = self._book.get_tx(transaction)
        try:
            if not self._book.is_live(entry):
                raise BrokerUnavailable(f"transaction {transaction} was lost with its connection (rolled back)")
            if entry.rollback_only:
                self._abort_frame(transaction)
                raise BrokerError(f"transaction {transaction} rolled back: a frame in it failed: "
                                  f"{entry.rollback_only}")
            pending = PendingCommit(self, transaction, entry)
            _, pending.rid = self._write("commit", lambda c, h: c.commit(transaction, headers=h), {}, receipt=True,
                                         loss_is_failure=False, on_answer=pending.answered, tx=transaction)
        except BaseException:
            self._book.discard_tx(transaction)
            raise
        return pending

    def abort(self, transaction: str) -> None:
        entry = self._book.end_tx(transaction)
        if self._book.is_live(entry) and self._abort_frame(transaction):
            self._book.restore(entry)

    def _abort_frame(self, transaction: str) -> bool:
        """True when the broker confirmed the ABORT; a lost connection has rolled back anyway."""
        try:
            self._transmit("abort", lambda c, h: c.abort(transaction, headers=h), {}, receipt=True,
                           loss_is_failure=True, tx=transaction)
            return True
        except BrokerUnavailable as exc:
            log.info("ABORT of %s not sent (%s): the broker rolls it back with the connection", transaction, exc)
            return False

    # ------------------------------------------------------------------------------------------- consuming
    def subscribe(self, destination: Destination | str, *, selector: str | None = None,
                  ack: AckMode | str = AckMode.CLIENT_INDIVIDUAL, durable_name: str | None = None,
                  prefetch: int = 100, transformation: str | None = None) -> Subscription:
        spec = self._spec(destination, selector, ack, durable_name, prefetch, transformation)
        sub = QueueSubscription(f"sub-{next(self._sub_ids)}", spec, self._book)
        self._book.check_connected()
        self._book.set_mode(sub.id, spec.ack)
        self._subs[sub.id] = sub
        try:
            self._subscribe_once(sub)
        except TransportError:
            self._subs.pop(sub.id, None)
            self._book.forget_subscription(sub.id)
            raise
        return sub

    def _spec(self, destination: Destination | str, selector: str | None, ack: AckMode | str,
              durable_name: str | None, prefetch: int, transformation: str | None) -> SubscriptionSpec:
        dest = stomp_destination(destination)
        try:
            mode = AckMode(ack)
        except ValueError:
            raise LocalProtocolError(f"unknown ack mode {ack!r}") from None
        if durable_name is not None and (not self.client_id or not dest.startswith("/topic/")):
            raise LocalProtocolError("a durable subscription needs a topic and a client_id on the transport")
        if prefetch < 1:
            raise LocalProtocolError(f"prefetch must be >= 1, got {prefetch}")
        return SubscriptionSpec(dest, selector, mode, durable_name, prefetch, transformation)

    def _subscribe_once(self, sub: QueueSubscription) -> None:
        """At most one SUBSCRIBE per subscription and connection: ``subscribe()`` on one thread and the re-subscribe
        of ``reconnect()`` on another may both reach a new subscription; a second SUBSCRIBE would make the broker
        dispatch (prefetch) to a consumer whose messages nobody reads."""
        with self._sub_lock:
            if self._book.connected and self._sub_epochs.get(sub.id) == self._book.epoch:
                return
            self._sub_epochs[sub.id] = self._subscribe_frame(sub)

    def _subscribe_frame(self, sub: QueueSubscription) -> int:
        spec = sub.spec
        headers = {"activemq.prefetchSize": str(spec.prefetch)}
        optional = {"selector": spec.selector, "activemq.subscriptionName": spec.durable_name,
                    "transformation": spec.transformation}
        headers.update({k: v for k, v in optional.items() if v is not None})
        return self._transmit("subscribe", lambda c, h: c.subscribe(spec.destination, sub.id, ack=spec.ack.value,
                                                                    headers=h), headers, receipt=True,
                              loss_is_failure=True)

    def _resubscribe(self) -> None:
        for sub in list(self._subs.values()):
            self._subscribe_once(sub)

    def unsubscribe(self, subscription: Subscription, *, remove_durable: bool = False) -> None:
        self._book.check_open()
        sub = self._subs.pop(subscription.id, None)
        if sub is None:
            raise LocalProtocolError(f"unknown subscription {subscription.id!r} (already unsubscribed?)")
        sub.active = False
        self._book.forget_subscription(sub.id)
        self._sub_epochs.pop(sub.id, None)
        sub.wake()
        try:
            self._unsubscribe_frame(sub.id, {})
            if remove_durable and sub.spec.durable_name:   # ActiveMQ removes a durable only once it is inactive
                self._unsubscribe_frame(sub.id, {"activemq.subscriptionName": sub.spec.durable_name})
        except BrokerUnavailable:
            if remove_durable:
                raise
            log.debug("UNSUBSCRIBE %s not sent: the connection is gone, and the subscription with it", sub.id)

    def _unsubscribe_frame(self, sub_id: str, headers: dict[str, str]) -> None:
        self._transmit("unsubscribe", lambda c, h: c.unsubscribe(sub_id, headers=h), headers, receipt=True,
                       loss_is_failure=True)

    def ack(self, delivery: Delivery, transaction: str | None = None, *, receipt: bool = True) -> None:
        self._book.take_for_ack(delivery, transaction)
        self._transmit("ack", lambda c, h: c.ack(delivery.ack_id, transaction=transaction,
                                                 receipt=h.get("receipt")), {}, receipt=receipt,
                       loss_is_failure=transaction is not None)

    def ack_many(self, deliveries: Sequence[Delivery], transaction: str | None = None) -> None:
        """Receipt-less ACKs of ``deliveries``, in order (in ``transaction`` when given): the book and the frames
        exactly as that many ``ack(d, transaction, receipt=False)`` calls, written with one socket write per
        :data:`WRITE_CHUNK` bytes instead of one stomp.py frame and write each (issue 12, round 5). A delivery the
        book refuses (one of a lost connection, one already acknowledged) raises once the frames of those before
        it were written, as the one-by-one calls would; a failed write raises :class:`BrokerUnavailable` (the
        broker redelivers what it did not take)."""
        taken: list[Delivery] = []
        failure: TransportError | None = None
        for delivery in deliveries:
            try:
                self._book.take_for_ack(delivery, transaction)
            except TransportError as exc:
                failure = exc
                break
            taken.append(delivery)
        if taken:
            self._write_acks(taken, transaction)
        if failure is not None:
            raise failure

    def _write_acks(self, deliveries: Sequence[Delivery], transaction: str | None) -> None:
        with self._book.lock:
            self._book.check_connected()
            conn = self._conn
        assert conn is not None
        try:
            if not conn.transport.blocking:
                for delivery in deliveries:
                    conn.ack(delivery.ack_id, transaction=transaction)
                return
            _write_chunked(conn, (encode_ack_frame(delivery.ack_id, transaction) for delivery in deliveries))
        except _LINK_ERRORS as exc:
            raise BrokerUnavailable(f"ack: the frames could not be written: {exc}") from exc

    def nack(self, delivery: Delivery, transaction: str | None = None, *, receipt: bool = True) -> None:
        self._book.take_for_ack(delivery, transaction)
        self._transmit("nack", lambda c, h: c.nack(delivery.ack_id, transaction=transaction,
                                                   receipt=h.get("receipt")), {}, receipt=receipt,
                       loss_is_failure=transaction is not None, tx=transaction)

    # ------------------------------------------------------------------------------------------- frames out
    def _transmit(self, operation: str, action: Callable[[stomp.Connection12, dict[str, str]], object],
                  headers: dict[str, str], *, receipt: bool, loss_is_failure: bool,
                  timeout: float | None = None, tx: str | None = None) -> int:
        """Write one frame; with ``receipt`` wait for its answer. Returns the epoch it went out on."""
        epoch, rid = self._write(operation, action, headers, receipt=receipt, loss_is_failure=loss_is_failure, tx=tx)
        if rid is not None:
            self._wait(rid, timeout or self._receipt_timeout)
        return epoch

    def _write(self, operation: str, action: Callable[[stomp.Connection12, dict[str, str]], object],
               headers: dict[str, str], *, receipt: bool, loss_is_failure: bool,
               on_answer: Callable[[], None] | None = None, tx: str | None = None) -> tuple[int, str | None]:
        """Write one frame, registering a waiter for its receipt first (the dispatcher matches receipts by id,
        in any order); returns the epoch it went out on and the receipt id to :meth:`_wait` for. ``tx``: the
        transaction the frame belongs to (the book attributes an ERROR without a receipt id by it)."""
        rid = f"{operation}-{uuid.uuid4().hex}" if receipt else None
        with self._book.lock:
            epoch = self._book.check_connected()
            conn = self._conn
            if rid is not None:
                headers["receipt"] = rid
                self._waiters[rid] = _Waiter(operation, epoch, loss_is_failure, on_answer=on_answer)
            self._book.frame_written(tx, rid)
        assert conn is not None
        try:
            action(conn, headers)
        except _LINK_ERRORS as exc:
            self._waiters.pop(rid or "", None)
            raise BrokerUnavailable(f"{operation}: the frame could not be written: {exc}") from exc
        return epoch, rid

    def _wait(self, rid: str, timeout: float) -> None:
        waiter = self._waiters[rid]
        try:
            waiter.wait(timeout)
        finally:
            self._waiters.pop(rid, None)

    # ------------------------------------------------------------------------------------------- dispatcher
    def _start_dispatcher(self) -> None:
        if self._dispatcher is None:
            self._dispatcher = threading.Thread(target=self._dispatch_loop, name=f"nsjms-stomp-{self.url}",
                                                daemon=True)
            self._dispatcher.start()

    def _stop_dispatcher(self) -> None:
        thread = self._dispatcher
        if thread is None:
            return
        self._inbox.put(_STOP)
        if thread is not threading.current_thread():
            thread.join(10.0)

    def _dispatch_loop(self) -> None:
        handlers: dict[str, Callable[[int, Any], None]] = {
            "connected": self._on_connected, "message": self._on_message, "receipt": self._on_receipt,
            "error": self._on_error, "disconnected": self._on_disconnected, "state": self._on_state_item,
            "split": self._on_split, "fragment": self._on_fragment}
        while (item := self._inbox.get()) is not _STOP:
            epoch, kind, payload = item
            try:
                handlers[kind](epoch, payload)
            except Exception:  # a bug or a bad callback must not kill the dispatcher
                log.exception("error handling a %s frame from %s", kind, self.url)

    def _on_connected(self, epoch: int, frame: Frame) -> None:
        self._answer(f"connect-{epoch}", "receipt", frame)

    def _on_message(self, epoch: int, frame: Frame, problem: str | None = None) -> None:
        if epoch != self._book.epoch:
            return  # a frame from an abandoned connection: the broker redelivers it
        sub = self._subs.get(frame.headers.get("subscription", ""))
        if sub is None:
            log.warning("MESSAGE for unknown subscription %r dropped", frame.headers.get("subscription"))
            return
        sub.feed(self._delivery(epoch, frame, problem))

    def _on_split(self, epoch: int, frame: Frame) -> None:
        if self._split is not None:
            log.error("an unfinished split MESSAGE frame from %s was followed by another: %s", self.url,
                      sorted(self._split.headers))
        self._split = _SplitFrame(epoch, dict(frame.headers))

    def _on_fragment(self, epoch: int, item: tuple[Frame, bool]) -> None:
        fragment, complete = item
        split = self._split
        if split is None or split.epoch != epoch:
            log.warning("unknown frame %r from %s dropped", str(fragment.cmd)[:80], self.url)
            return
        split.add(fragment)
        if not complete:
            return                      # another NUL later in the same header section
        self._split = None
        frame = Frame("MESSAGE", split.headers, fragment.body)
        log.warning("MESSAGE %s from %s had a NUL byte in a header: reassembled, handed over as undecodable",
                    split.headers.get("message-id"), self.url)
        self._on_message(epoch, frame, SPLIT_FRAME)

    def _delivery(self, epoch: int, frame: Frame, problem: str | None = None) -> Delivery:
        headers = dict(frame.headers)
        body = frame.body if isinstance(frame.body, bytes) else str(frame.body or "").encode("utf-8")
        message_id = headers.get("message-id")
        if message_id is None:
            raise RemoteProtocolError(f"MESSAGE without message-id: {sorted(headers)}")
        if problem is not None:
            message = JmsMessage(BodyType.BYTES, body)
        else:
            try:
                message, problem = self._codec.decode(headers, body), None
            except Exception as exc:  # noqa: BLE001 — the owner must settle it (dead-letter + ack), never lose it
                message, problem = JmsMessage(BodyType.BYTES, body), f"{type(exc).__name__}: {exc}"
        return Delivery(message=message, headers=headers, body=body,
                        subscription=headers.get("subscription", ""), ack_id=str(headers.get("ack", message_id)),
                        message_id=message_id, destination=headers.get("destination", ""),
                        redelivered=headers.get("redelivered") == "true", epoch=epoch, decode_error=problem)

    def _on_receipt(self, epoch: int, frame: Frame) -> None:
        rid = frame.headers.get("receipt-id", "")
        self._book.frame_answered(rid)
        self._answer(rid, "receipt", frame)

    def _on_error(self, epoch: int, frame: Frame) -> None:
        error = _broker_error(frame)
        log.error("ERROR frame from %s: %s", self.url, error.message)
        self.last_error = error
        rid = error.receipt_id or ""
        if rid in self._waiters or f"connect-{epoch}" in self._waiters:
            self._book.frame_answered(rid)
            self._answer(rid if rid in self._waiters else f"connect-{epoch}", "error", frame)
        elif epoch == self._book.epoch:           # for a receipt-less frame (or one whose caller gave up waiting)
            reason = error.message
            if error.resource and not is_resource(reason):     # told by the body: keep the verdict in the reason
                reason = f"{reason} ({RESOURCE_MARK})"
            self._book.frame_refused(reason, rid or None)

    def _on_disconnected(self, epoch: int, _: None) -> None:
        self._answer(f"connect-{epoch}", "lost", None)
        self._lost(epoch)

    def _on_state_item(self, _: int, state: ConnectionState) -> None:
        if self._on_state is not None:
            self._on_state(state)

    def _answer(self, rid: str, kind: str, frame: Frame | None) -> None:
        waiter = self._waiters.get(rid)
        if waiter is not None:
            if waiter.on_answer is not None:
                waiter.on_answer()
                waiter.on_answer = None
            try:
                waiter.answers.put_nowait((kind, frame))
            except queue.Full:
                pass

    def _lost(self, epoch: int) -> None:
        """Connection ``epoch`` is gone: fail its waiters, wake receivers, tell the state callback once."""
        if not self._book.lost(epoch):
            return
        planned = epoch == self._quiet_epoch          # renew(): closed on purpose
        if planned:
            log.info("connection to %s (epoch %d) closed for renewal", self.url, epoch)
        else:
            log.warning("connection to %s lost (epoch %d)", self.url, epoch)
        self._fail_waiters(lambda w: w.epoch == epoch)
        for sub in list(self._subs.values()):
            sub.wake()
        if not planned:
            self._notify(ConnectionState.DISCONNECTED)

    def _fail_waiters(self, which: Callable[[_Waiter], bool]) -> None:
        for rid, waiter in list(self._waiters.items()):
            if which(waiter):
                self._answer(rid, "lost", None)

    def _notify(self, state: ConnectionState) -> None:
        self._inbox.put((0, "state", state))
