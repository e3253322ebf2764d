"""Browse a broker destination, and consume one of its messages by id, over STOMP (stomp.py 9): the
:class:`~router.jms.browsing.DestinationBrowser` of an operator's tools (the broker's dead-letter queues,
:mod:`router.deadletter.broker`). One short connection per operation, apart from the bridges' transports.

* **browse**: ``SUBSCRIBE`` with ActiveMQ's ``browser:true`` header: the broker sends copies of the queue's
  messages (none is consumed, locked or marked redelivered) and then a MESSAGE carrying ``browser:end`` (also for an
  empty queue). ActiveMQ shows at most its destination policy's ``maxBrowsePageSize`` messages (400 by default).
* **settle**: ``SUBSCRIBE`` with ``ack:client-individual`` and the selector ``JMSMessageID = '<id>'``; the message
  delivered is ACKed, and with a copy to send, ``BEGIN``, ``SEND`` (receipted), ``ACK`` (receipted) and ``COMMIT``
  (receipted) make the copy and the consumption one broker transaction: a lost connection before the COMMIT's
  receipt rolls both back (the broker aborts the open transaction of a closed connection: the original stays, no
  copy); after it, both happened. A COMMIT whose receipt never came is :class:`~router.jms.errors.UnconfirmedOutcome`:
  the outcome is unknown (browse again: the original is either there, and no copy was sent, or gone and the copy
  sent).

stomp.py's exceptions and socket errors are translated here into :mod:`router.jms.errors` (and only here).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import stomp
from stomp.utils import Frame

from router.jms.browsing import Browse, BrowsedMessage, MessageHeld, OutgoingCopy, id_selector
from router.jms.errors import BrokerError, BrokerUnavailable, LocalProtocolError, UnconfirmedOutcome
from router.jms.stomp.inbound import broker_error
from router.jms.stomp.link import LINK_ERRORS, parse_stomp_url
from router.jms.transport import redact_url

__all__ = ["StompBrowser"]

log = logging.getLogger("nsjms.transport.stomp.browse")

#: The headers a browsed copy carries for this subscription only (not the message's).
_SUBSCRIPTION_HEADERS = frozenset({"subscription", "ack", "browser"})


class _Inbox(stomp.ConnectionListener):
    """stomp.py's receiver thread puts every frame here; the operation's own thread reads them in order."""

    def __init__(self) -> None:
        self.frames: queue.Queue[tuple[str, Frame | None]] = queue.Queue()

    def on_message(self, frame: Frame) -> None:
        self.frames.put(("message", frame))

    def on_receipt(self, frame: Frame) -> None:
        self.frames.put(("receipt", frame))

    def on_error(self, frame: Frame) -> None:
        self.frames.put(("error", frame))

    def on_disconnected(self) -> None:
        self.frames.put(("lost", None))


class _Session:
    """One connected STOMP connection and its frames."""

    def __init__(self, conn: stomp.Connection12, inbox: _Inbox, url: str, timeout: float) -> None:
        self.conn, self.inbox, self.url, self.timeout = conn, inbox, url, timeout

    def next(self, timeout: float, lost: str) -> tuple[str, Frame] | None:
        """The next MESSAGE or RECEIPT frame (its kind and the frame) within ``timeout`` s, or None: the one read
        loop of this module. An ERROR frame raises :class:`BrokerError`, a lost connection
        :class:`BrokerUnavailable` (``lost`` says what was lost)."""
        try:
            kind, frame = self.inbox.frames.get(timeout=timeout)
        except queue.Empty:
            return None
        if kind == "lost":
            raise BrokerUnavailable(lost)
        assert frame is not None
        if kind == "error":
            raise broker_error(frame)
        return kind, frame

    def write(self, what: str, action: Callable[[], object]) -> None:
        try:
            action()
        except LINK_ERRORS as exc:
            raise BrokerUnavailable(f"{what} on {self.url}: the frame could not be written: {exc}") from exc

    def receipted(self, what: str, action: Callable[[str], object]) -> None:
        """Write a frame with a receipt and wait for it; the broker's ERROR for it raises BrokerError, no answer
        UnconfirmedOutcome, a lost connection BrokerUnavailable. MESSAGE frames meanwhile are not expected (dropped)."""
        rid = f"{what}-{uuid.uuid4().hex}"
        self.write(what, lambda: action(rid))
        if self.wait_for("receipt", "receipt-id", rid, self.timeout,
                         f"{what} on {self.url}: the connection was lost before its receipt") is None:
            raise UnconfirmedOutcome(f"no receipt from {self.url} within {self.timeout:g} s", what)

    def wait_for(self, kind: str, header: str, value: str, timeout: float, lost: str) -> Frame | None:
        """The first ``kind`` frame whose ``header`` is ``value`` within ``timeout`` s, or None; other frames are
        dropped; raises as :meth:`next`."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            item = self.next(left, lost)
            if item is None:
                return None
            got, frame = item
            if got == kind and frame.headers.get(header) == value:
                return frame
        return None


class StompBrowser:
    """:class:`~router.jms.browsing.DestinationBrowser` over STOMP (see the module docstring)."""

    def __init__(self, url: str, *, username: str | None = None, password: str | None = None,
                 timeout: float = 30.0, ssl_options: Mapping[str, Any] | None = None,
                 vhost: str | None = None) -> None:
        self._hosts, self._use_ssl = parse_stomp_url(url)
        self.url = redact_url(url)
        self._credentials = (username, password)
        self._timeout = timeout
        self._ssl_options = dict(ssl_options or {})
        self._vhost = vhost

    # ------------------------------------------------------------------------------------------------ browse
    def browse(self, destination: str, *, selector: str | None = None, limit: int = 1000) -> Browse:
        _check_queue(destination)
        with self._session() as s:
            return self._browse(s, destination, selector, limit)

    def _browse(self, s: _Session, destination: str, selector: str | None, limit: int) -> Browse:
        sub = f"browse-{uuid.uuid4().hex}"
        headers = {"browser": "true"}
        if selector:
            headers["selector"] = selector
        s.write("SUBSCRIBE", lambda: s.conn.subscribe(destination, id=sub, ack="auto", headers=headers))
        found: list[BrowsedMessage] = []
        complete = False
        while len(found) < max(1, limit):
            kind, frame = self._frame(s, f"browse of {destination}")
            if kind != "message" or frame.headers.get("subscription") != sub:
                continue
            if frame.headers.get("browser") == "end":
                complete = True
                break
            found.append(_message(frame))
        s.write("UNSUBSCRIBE", lambda: s.conn.unsubscribe(sub))
        return Browse(found, complete)

    # ------------------------------------------------------------------------------------------------ settle
    def settle(self, destination: str, message_id: str,
               copy: Callable[[BrowsedMessage], OutgoingCopy] | None = None, *,
               wait_s: float = 10.0) -> BrowsedMessage | None:
        _check_queue(destination)
        if not message_id:
            raise LocalProtocolError("a message id is required")
        with self._session() as s:
            sub = f"settle-{uuid.uuid4().hex}"
            headers = {"selector": id_selector(message_id), "activemq.prefetchSize": "1"}
            s.write("SUBSCRIBE", lambda: s.conn.subscribe(destination, id=sub, ack="client-individual",
                                                          headers=headers))
            frame = s.wait_for("message", "subscription", sub, wait_s,
                               f"consuming from {destination} on {self.url}: the connection was lost")
            if frame is None:
                s.write("UNSUBSCRIBE", lambda: s.conn.unsubscribe(sub))
                if self._browse(s, destination, id_selector(message_id), 1).messages:
                    raise MessageHeld(f"message {message_id} is on {destination} but was not delivered within "
                                      f"{wait_s:g} s (another consumer holds it, or the broker has not paged it "
                                      "in); nothing done")
                return None
            message = _message(frame)
            ack = str(frame.headers.get("ack", message_id))
            if copy is None:
                s.receipted("ACK", lambda rid: s.conn.ack(ack, receipt=rid))
                return message
            out = copy(message)           # may refuse: the connection closes, the broker puts the message back
            tx = f"tx-{uuid.uuid4().hex}"
            s.write("BEGIN", lambda: s.conn.begin(tx))
            try:
                s.receipted("SEND", lambda rid: s.conn.send(
                    out.destination, out.body, headers={**out.headers, "transaction": tx, "receipt": rid}))
                s.receipted("ACK", lambda rid: s.conn.ack(ack, transaction=tx, receipt=rid))
            except UnconfirmedOutcome as exc:    # before the COMMIT: closing the connection rolls the transaction back
                raise BrokerUnavailable(f"{exc}; the transaction is rolled back, nothing done") from exc
            s.receipted("COMMIT", lambda rid: s.conn.commit(tx, headers={"receipt": rid}))
            return message

    # --------------------------------------------------------------------------------------------- plumbing
    def _frame(self, s: _Session, what: str) -> tuple[str, Frame]:
        item = s.next(self._timeout, f"{what} on {self.url}: the connection was lost")
        if item is None:
            raise BrokerUnavailable(f"{what} on {self.url}: the broker sent nothing for {self._timeout:g} s")
        return item

    @contextlib.contextmanager
    def _session(self) -> Iterator[_Session]:
        conn = stomp.Connection12(self._hosts, heartbeats=(0, 0), auto_content_length=False, auto_decode=False,
                                  reconnect_attempts_max=1, timeout=self._timeout, vhost=self._vhost)
        if self._use_ssl:
            conn.set_ssl(for_hosts=self._hosts, **self._ssl_options)
        inbox = _Inbox()
        conn.set_listener("nsjms-browse", inbox)
        try:
            conn.connect(*self._credentials, wait=True)
        except LINK_ERRORS as exc:
            _drop(conn)
            refused = _first_error(inbox)
            if refused is not None:
                raise BrokerError(f"connecting to {self.url}: {refused.message}", refused.body) from exc
            raise BrokerUnavailable(f"cannot connect to {self.url}: {exc or type(exc).__name__}") from exc
        try:
            yield _Session(conn, inbox, self.url, self._timeout)
        finally:
            try:
                conn.disconnect()
            except LINK_ERRORS as exc:       # the socket may be gone already; the broker cleans up either way
                log.debug("DISCONNECT from %s: %s", self.url, exc)
            _drop(conn)


def _first_error(inbox: _Inbox) -> BrokerError | None:
    while True:
        try:
            kind, frame = inbox.frames.get_nowait()
        except queue.Empty:
            return None
        if kind == "error" and frame is not None:
            return broker_error(frame)


def _drop(conn: stomp.Connection12) -> None:
    try:
        conn.transport.disconnect_socket()
    except Exception as exc:  # noqa: BLE001 - stomp.py may raise anything from a half-dead socket; discarded
        log.debug("closing a STOMP socket: %s", exc)


def _check_queue(destination: str) -> None:
    if not destination.startswith("/queue/") or len(destination) <= len("/queue/"):
        raise LocalProtocolError(f"not a queue destination: {destination!r} (want /queue/NAME)")


def _message(frame: Frame) -> BrowsedMessage:
    headers = {str(k): str(v) for k, v in frame.headers.items() if k not in _SUBSCRIPTION_HEADERS}
    body = frame.body if isinstance(frame.body, bytes) else str(frame.body or "").encode("utf-8")
    return BrowsedMessage(headers.get("destination", ""), headers.get("message-id", ""), headers, body)
