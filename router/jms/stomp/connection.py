"""A STOMP 1.2 connection (stomp.py 9) to a broker: its lifecycle across connection epochs, frames written with
their receipts awaited, and the frames the broker sends, handled on the dispatcher thread. :class:`StompTransport`
(:mod:`router.jms.stomp.transport`) builds the Transport operations on it.

Threads: stomp.py's receiver thread runs :class:`~router.jms.stomp.inbound.Listener`, which only puts ``(epoch, kind,
frame)`` on an inbox queue. One dispatcher thread owned by the transport drains it: it routes MESSAGE frames to
subscription queues, hands RECEIPT/ERROR frames to the caller waiting on that receipt, fails every waiter of a lost
connection, and calls the connection-state callback. Acking, sending and transaction work run on the callers' threads.

Each successful connect starts a new *epoch*; transactions and un-acked deliveries belong to the epoch that made
them and die with it (the broker rolls them back / redelivers). stomp.py's own reconnect loop is disabled
(one attempt per connect): :meth:`StompConnection.reconnect` retries under :data:`~router.jms.retry.RECONNECT_POLICY`.

stomp.py exceptions and socket errors are translated to :mod:`router.jms.errors` exceptions in this package and only
here.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import stomp
from stomp.utils import Frame

from router.jms.codec import SimpleCodec, frame_delivery
from router.jms.errors import (
    BrokerError,
    BrokerUnavailable,
    LocalProtocolError,
    RemoteProtocolError,
    UnconfirmedOutcome,
)
from router.jms.model import BodyType, JmsMessage
from router.jms.refusal import RESOURCE_MARK, is_resource
from router.jms.retry import RECONNECT_POLICY, RetryPolicy
from router.jms.session import QueueSubscription, SessionBook, TransportBase
from router.jms.stomp import readframe
from router.jms.stomp.inbound import SPLIT_FRAME, Listener, SplitFrame, broker_error, watch_split_frames
from router.jms.stomp.link import LINK_ERRORS, bound_silence, no_delay, parse_stomp_url
from router.jms.stomp.receipts import EitherEvent, Waiter
from router.jms.stomp.sendframe import FrameTemplates
from router.jms.transport import ConnectionState, Delivery, MessageCodec, StateCallback, TransportError, redact_url

__all__ = ["StompConnection"]

log = logging.getLogger("nsjms.transport.stomp")

_STOP = object()


class StompConnection(TransportBase):
    """The connection under :class:`~router.jms.stomp.transport.StompTransport` (see the module docstring)."""

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
        self._waiters: dict[str, Waiter] = {}
        self._subs: dict[str, QueueSubscription] = {}
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._dispatcher: threading.Thread | None = None
        self._split: SplitFrame | None = None     # dispatcher thread only
        self._sub_lock = threading.Lock()          # one SUBSCRIBE per subscription and connection epoch
        self._sub_epochs: dict[str, int] = {}
        self.last_error: BrokerError | None = None
        self._connect_lock = threading.RLock()
        self._quiet_epoch = -1                     # the epoch renew() closes on purpose: its end is not a loss

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, connected={self.is_connected()})"

    # ------------------------------------------------------------------------------------------- connection
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
        stop = EitherEvent(self._shutdown, self._closed_event)
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
            self._quiet_epoch = epoch    # the broker closes the socket after its DISCONNECT receipt: no loss either
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
        waiter = Waiter("connect", epoch, loss_is_failure=True)
        self._waiters[f"connect-{epoch}"] = waiter
        try:
            conn.connect(*self._credentials, wait=False, headers=self._connect_headers())
            no_delay(conn)
            bound_silence(conn)
            waiter.wait(self._connect_timeout)
        except (LINK_ERRORS + (UnconfirmedOutcome, BrokerUnavailable)) as exc:
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
        conn.set_listener("nsjms", Listener(self._inbox, epoch))
        watch_split_frames(conn, self._inbox, epoch)
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

    def _resubscribe(self) -> None:
        """Subscribe again, on a new connection, every subscription of the old one (the transport's own)."""
        raise NotImplementedError

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
                self._waiters[rid] = Waiter(operation, epoch, loss_is_failure, on_answer=on_answer)
            self._book.frame_written(tx, rid)
        assert conn is not None
        try:
            action(conn, headers)
        except LINK_ERRORS as exc:
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
        self._split = SplitFrame(epoch, dict(frame.headers))

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
        return frame_delivery(message, headers, body, subscription=headers.get("subscription", ""),
                              ack_id=str(headers.get("ack", message_id)), message_id=message_id, epoch=epoch,
                              decode_error=problem)

    def _on_receipt(self, epoch: int, frame: Frame) -> None:
        rid = frame.headers.get("receipt-id", "")
        self._book.frame_answered(rid)
        self._answer(rid, "receipt", frame)

    def _on_error(self, epoch: int, frame: Frame) -> None:
        error = broker_error(frame)
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
        planned = epoch == self._quiet_epoch          # renew() or close(): closed on purpose
        if planned:
            log.info("connection to %s (epoch %d) closed on purpose", self.url, epoch)
        else:
            log.warning("connection to %s lost (epoch %d)", self.url, epoch)
        self._fail_waiters(lambda w: w.epoch == epoch)
        for sub in list(self._subs.values()):
            sub.wake()
        if not planned:
            self._notify(ConnectionState.DISCONNECTED)

    def _fail_waiters(self, which: Callable[[Waiter], bool]) -> None:
        for rid, waiter in list(self._waiters.items()):
            if which(waiter):
                self._answer(rid, "lost", None)

    def _notify(self, state: ConnectionState) -> None:
        self._inbox.put((0, "state", state))
