"""STOMP transport failure semantics against a scripted fake broker on 127.0.0.1 (no real service needed):
missing receipts, a connection lost while a receipt is awaited, ERROR frames with and without a receipt id."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from router.jms.model import BodyType, JmsMessage
from router.jms.retry import RetryPolicy
from router.jms.stomp.transport import StompTransport
from router.jms.transport import (
    BrokerError,
    BrokerUnavailable,
    Confirm,
    ConnectionState,
    LocalProtocolError,
    SendFailed,
    SendRefused,
    UnconfirmedOutcome,
    open_transport,
)

MSG = JmsMessage(BodyType.TEXT, "x")


class FakeBroker:
    """Accepts connections, answers CONNECT, records frames; answers nothing else unless told to."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.frames: list[bytes] = []
        self.conns: list[socket.socket] = []
        self.got_frame = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        while True:
            try:
                chunk = conn.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\x00" in buf:
                frame, buf = buf.split(b"\x00", 1)
                self._frame(conn, frame.lstrip(b"\r\n"))

    def _frame(self, conn: socket.socket, frame: bytes) -> None:
        if frame.startswith((b"STOMP", b"CONNECT")):
            conn.sendall(b"CONNECTED\nversion:1.2\nheart-beat:0,0\n\n\x00")
            return
        if frame.startswith(b"DISCONNECT"):
            rid = frame.decode().split("receipt:")[1].split("\n")[0]
            conn.sendall(f"RECEIPT\nreceipt-id:{rid}\n\n\x00".encode())
            return
        self.frames.append(frame)
        self.got_frame.set()

    def reply(self, raw: bytes) -> None:
        self.conns[-1].sendall(raw)

    def receipt_header(self) -> str:
        for line in self.frames[-1].decode().splitlines():
            if line.startswith("receipt:"):
                return line.split(":", 1)[1]
        raise AssertionError("no receipt header in the last frame")

    def drop(self) -> None:
        for conn in self.conns:
            conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def close(self) -> None:
        self.server.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    broker = FakeBroker()
    yield broker
    broker.close()


def connect(fake: FakeBroker, **opts: object) -> StompTransport:
    t = open_transport(f"stomp://127.0.0.1:{fake.port}", heartbeats=(0, 0), **opts)
    assert isinstance(t, StompTransport)
    t.connect()
    return t


def in_thread(fn: object) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)
    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def test_missing_receipt_is_an_unknown_outcome(fake: FakeBroker) -> None:
    t = connect(fake, receipt_timeout=0.3)
    with pytest.raises(UnconfirmedOutcome) as info:
        t.send("/queue/q", MSG)
    assert info.value.outcome == "unknown" and info.value.operation == "send"
    assert b"persistent:true" in fake.frames[-1]
    t.close()


def test_lost_connection_while_waiting(fake: FakeBroker) -> None:
    t = connect(fake, receipt_timeout=10)
    thread, errors = in_thread(lambda: t.send("/queue/q", MSG))
    assert fake.got_frame.wait(5)
    fake.drop()
    thread.join(5)
    assert len(errors) == 1 and isinstance(errors[0], UnconfirmedOutcome)   # a plain SEND may have landed
    assert not t.is_connected()
    with pytest.raises(SendFailed) as info:
        t.send("/queue/q", MSG)                                          # now definitely not sent
    assert isinstance(info.value.__cause__, BrokerUnavailable) and info.value.destination == "/queue/q"
    t.close()


def last_frame(fake: FakeBroker, command: bytes) -> bytes:
    """The fake's last frame once it is a ``command`` frame (polled with a deadline)."""
    deadline = time.monotonic() + 5
    while not (fake.frames and fake.frames[-1].startswith(command)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake.frames[-1].startswith(command)
    return fake.frames[-1]


def begun(fake: FakeBroker, t: StompTransport) -> str:
    """begin(Confirm.PIPELINED) writes the BEGIN without a receipt (issue 12), returns at once: the transaction id."""
    tx = t.begin(Confirm.PIPELINED)
    frame = last_frame(fake, b"BEGIN").decode()
    assert frame.startswith("BEGIN") and "receipt:" not in frame
    assert frame.split("transaction:")[1].split("\n")[0] == tx
    return tx


def began(fake: FakeBroker, t: StompTransport) -> str:
    """begin() writes the BEGIN receipted and returns once the fake answered its receipt."""
    holder: list[str] = []
    thread, errors = in_thread(lambda: holder.append(t.begin()))
    assert fake.got_frame.wait(5)
    fake.reply(f"RECEIPT\nreceipt-id:{fake.receipt_header()}\n\n\x00".encode())
    thread.join(5)
    assert not errors and holder
    tx = fake.frames[-1].decode().split("transaction:")[1].split("\n")[0]
    assert holder[0] == tx
    return tx


def test_an_error_answering_a_receipted_begin_raises_at_the_begin(fake: FakeBroker) -> None:
    """begin() (a T2 branch's) stays receipted: a BEGIN the broker refuses raises BrokerError from begin() itself,
    so the branch sees an outage at its start, not a refused message at the COMMIT (which would make the T2
    dead-letter a good event). Before: begin() returned without waiting and no receipt was asked."""
    t = connect(fake, receipt_timeout=10)
    thread, errors = in_thread(t.begin)
    assert fake.got_frame.wait(5)
    assert fake.frames[-1].startswith(b"BEGIN")
    fake.reply(f"ERROR\nreceipt-id:{fake.receipt_header()}\nmessage:begin refused\n\n\x00".encode())
    thread.join(5)
    assert len(errors) == 1 and isinstance(errors[0], BrokerError) and "begin refused" in str(errors[0])
    t.close()


def test_an_error_answering_a_pipelined_begin_fails_the_commit(fake: FakeBroker) -> None:
    """A BEGIN without a receipt that the broker refuses (an ERROR with no receipt id) shows up at the COMMIT."""
    t = connect(fake, receipt_timeout=10)
    tx = begun(fake, t)
    fake.reply(b"ERROR\nmessage:begin refused\n\n\x00")
    deadline = time.monotonic() + 5
    while t.last_error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    fake.got_frame.clear()
    thread, errors = in_thread(lambda: t.commit(tx))
    assert fake.got_frame.wait(5)
    assert fake.frames[-1].startswith(b"ABORT")                         # the COMMIT is not even written
    fake.reply(f"RECEIPT\nreceipt-id:{fake.receipt_header()}\n\n\x00".encode())
    thread.join(5)
    assert len(errors) == 1 and isinstance(errors[0], BrokerError) and "begin refused" in str(errors[0])
    t.close()


def test_commit_receipts_are_matched_asynchronously_in_any_order(fake: FakeBroker) -> None:
    """commit_pipelined writes the COMMIT and returns; two COMMITs in flight, their receipts answered in reverse
    order, each wait() gets its own answer (the refused one raises, the other returns)."""
    t = connect(fake, receipt_timeout=10)
    tx1 = begun(fake, t)
    first = t.commit_pipelined(tx1)
    last_frame(fake, b"COMMIT")
    rid1 = fake.receipt_header()
    tx2 = begun(fake, t)
    second = t.commit_pipelined(tx2)
    last_frame(fake, b"COMMIT")
    rid2 = fake.receipt_header()
    assert rid1 != rid2
    fake.reply(f"ERROR\nreceipt-id:{rid2}\nmessage:commit refused\n\n\x00".encode()
               + f"RECEIPT\nreceipt-id:{rid1}\n\n\x00".encode())
    first.wait()
    with pytest.raises(BrokerError, match="commit refused"):
        second.wait()
    t.close()


def test_an_error_after_a_commit_receipt_does_not_fail_that_commit(fake: FakeBroker) -> None:
    """Pipelined: tx2's SEND is written after tx1's COMMIT; the broker answers tx1's receipt, then an ERROR without a
    receipt id (tx2's SEND refused). tx1 was committed whole: its wait() returns, tx2's commit fails. (Before, tx1
    stayed in the book until wait() and the later ERROR marked it too: a false failure and a resent batch.)"""
    t = connect(fake, receipt_timeout=10)
    tx1 = begun(fake, t)
    t.send("/queue/q", MSG, transaction=tx1, confirm=Confirm.PIPELINED)
    first = t.commit_pipelined(tx1)
    last_frame(fake, b"COMMIT")
    rid1 = fake.receipt_header()
    tx2 = begun(fake, t)
    t.send("/queue/q", MSG, transaction=tx2, confirm=Confirm.PIPELINED)
    last_frame(fake, b"SEND")
    fake.reply(f"RECEIPT\nreceipt-id:{rid1}\n\n\x00".encode() + b"ERROR\nmessage:tx2 send refused\n\n\x00")
    deadline = time.monotonic() + 5
    while t.last_error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert t.last_error is not None
    first.wait()                                                        # tx1 committed: no error
    assert t.transaction_problem(tx2) == "tx2 send refused"
    t.close()


def test_a_discarded_pending_commit_leaves_no_waiter_behind(fake: FakeBroker) -> None:
    """discard() instead of wait() (the caller unwinds): the COMMIT's receipt waiter and the transaction leave the
    books at once; a late receipt is dropped."""
    t = connect(fake, receipt_timeout=10)
    tx = begun(fake, t)
    pending = t.commit_pipelined(tx)
    last_frame(fake, b"COMMIT")
    rid = fake.receipt_header()
    assert rid in t._waiters
    pending.discard()
    assert rid not in t._waiters and t.transaction_problem(tx) is not None     # unknown to the book now
    fake.reply(f"RECEIPT\nreceipt-id:{rid}\n\n\x00".encode())
    assert t.is_connected()
    t.close()


def test_lost_connection_while_waiting_for_a_commit(fake: FakeBroker) -> None:
    t = connect(fake, receipt_timeout=10)
    tx = began(fake, t)
    fake.got_frame.clear()
    thread, errors = in_thread(lambda: t.commit(tx))
    assert fake.got_frame.wait(5)
    fake.drop()
    thread.join(5)
    assert len(errors) == 1 and isinstance(errors[0], UnconfirmedOutcome) and errors[0].operation == "commit"
    t.close()


def test_error_frame_goes_to_the_waiting_caller(fake: FakeBroker) -> None:
    t = connect(fake, receipt_timeout=10)
    thread, errors = in_thread(lambda: t.send("/queue/q", MSG))
    assert fake.got_frame.wait(5)
    fake.reply(f"ERROR\nreceipt-id:{fake.receipt_header()}\nmessage:not allowed\n\nstack trace\x00".encode())
    thread.join(5)
    assert len(errors) == 1 and isinstance(errors[0], SendRefused)   # refused: the bridge dead-letters it
    assert errors[0].message == "not allowed" and errors[0].body == "stack trace"
    cause = errors[0].__cause__
    assert isinstance(cause, BrokerError) and cause.message == "not allowed" and cause.body == "stack trace"
    assert t.is_connected()
    t.close()


def test_a_lost_connection_is_a_send_failure_but_not_a_refusal(fake: FakeBroker) -> None:
    t = connect(fake, receipt_timeout=10)
    fake.drop()
    deadline = time.monotonic() + 5
    while t.is_connected() and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(SendFailed) as info:
        t.send("/queue/q", MSG)
    assert not isinstance(info.value, SendRefused)
    t.close()


def _subscribed(fake: FakeBroker, t: StompTransport) -> object:
    holder: list[object] = []
    thread, errors = in_thread(lambda: holder.append(t.subscribe("/queue/in")))
    assert fake.got_frame.wait(5)
    fake.reply(f"RECEIPT\nreceipt-id:{fake.receipt_header()}\n\n\x00".encode())
    thread.join(5)
    assert not errors and holder
    return holder[0]


@pytest.mark.parametrize("nul_at", ["middle", "end"])
def test_a_nul_byte_in_a_header_is_reassembled_and_handed_over_as_undecodable(fake: FakeBroker, nul_at: str) -> None:
    """ActiveMQ passes a NUL inside a header value (a STOMP producer put it there) through unescaped; STOMP ends the
    frame there. The message used to arrive as a header-less MESSAGE (dropped: never acked, never dead-lettered)."""
    from router.jms.stomp.inbound import SPLIT_FRAME

    t = connect(fake, receipt_timeout=10)
    sub = _subscribed(fake, t)
    value = b"a\x00b" if nul_at == "middle" else b"a\x00"
    fake.reply(b"MESSAGE\nnote:" + value + b"\nexpires:0\ndestination:/queue/in\nack:ID\\c1\nsubscription:sub-1\n"
               b"message-id:ID\\cm-1\n\npoison\x00\n"
               b"MESSAGE\ndestination:/queue/in\nack:ID\\c2\nsubscription:sub-1\nmessage-id:ID\\cm-2\n\ngood\x00")
    first = sub.receive(5)  # type: ignore[attr-defined]
    second = sub.receive(5)  # type: ignore[attr-defined]
    assert first is not None and first.decode_error == SPLIT_FRAME
    assert first.message_id == "ID:m-1" and first.ack_id == "ID:1" and first.body == b"poison"
    assert first.headers["note"] == ("a\x00b" if nul_at == "middle" else "a\x00")
    assert second is not None and second.decode_error is None and second.body == b"good"
    fake.got_frame.clear()
    t.ack(first, confirm=Confirm.PIPELINED)                       # it can be settled like any other delivery
    assert fake.got_frame.wait(5) and fake.frames[-1].startswith(b"ACK") and b"id:ID\\c1" in fake.frames[-1]
    t.close()


def test_unreceipted_error_makes_open_transactions_roll_back(fake: FakeBroker) -> None:
    t = connect(fake, receipt_timeout=10)
    tx = began(fake, t)
    t.send("/queue/q", MSG, transaction=tx, confirm=Confirm.PIPELINED)
    fake.reply(b"ERROR\nmessage:send refused\n\n\x00")
    deadline = time.monotonic() + 5
    while t.last_error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    fake.got_frame.clear()
    thread, errors = in_thread(lambda: t.commit(tx))
    assert fake.got_frame.wait(5)
    assert fake.frames[-1].startswith(b"ABORT")                         # never COMMIT a damaged transaction
    fake.reply(f"RECEIPT\nreceipt-id:{fake.receipt_header()}\n\n\x00".encode())
    thread.join(5)
    assert len(errors) == 1 and isinstance(errors[0], BrokerError) and "send refused" in str(errors[0])
    t.close()


def receipted_send(fake: FakeBroker, t: StompTransport, tx: str) -> None:
    """A SEND in ``tx`` with a receipt, answered by the fake (the last frame of a T2's batch)."""
    thread, errors = in_thread(lambda: t.send("/queue/q", MSG, transaction=tx, confirm=Confirm.CONFIRMED))
    deadline = time.monotonic() + 5
    while not (fake.frames and fake.frames[-1].startswith(b"SEND") and b"receipt:" in fake.frames[-1]) \
            and time.monotonic() < deadline:       # not an earlier receipted frame (the BEGIN) or unreceipted SEND
        time.sleep(0.01)
    frame = last_frame(fake, b"SEND").decode()
    assert f"transaction:{tx}" in frame and "receipt:" in frame
    fake.reply(f"RECEIPT\nreceipt-id:{fake.receipt_header()}\n\n\x00".encode())
    thread.join(5)
    assert not errors and not thread.is_alive()


def wait_for_error(t: StompTransport) -> None:
    deadline = time.monotonic() + 5
    while t.last_error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert t.last_error is not None


def test_an_error_for_the_next_transaction_does_not_mark_one_whose_frames_were_all_answered(
        fake: FakeBroker) -> None:
    """Pipelined T2s on one connection: tx1 is decided (its last SEND was receipted and answered), its COMMIT not
    written yet; tx2's receipt-less SEND is refused by an ERROR without a receipt id. Only tx2 is marked: tx1's
    COMMIT goes out as a COMMIT (before: the ERROR marked every open transaction, so tx1 was ABORTed although its
    decision was durable — branch unknown, resent later, out of order)."""
    t = connect(fake, receipt_timeout=10)
    fake.got_frame.clear()
    tx1 = began(fake, t)
    t.send("/queue/q", MSG, transaction=tx1, confirm=Confirm.PIPELINED)
    receipted_send(fake, t, tx1)
    fake.got_frame.clear()
    tx2 = began(fake, t)
    t.send("/queue/q", MSG, transaction=tx2, confirm=Confirm.PIPELINED)
    last_frame(fake, b"SEND")
    fake.reply(b"ERROR\nmessage:tx2 send refused\n\n\x00")
    wait_for_error(t)
    assert t.transaction_problem(tx2) == "tx2 send refused"
    assert t.transaction_problem(tx1) is None
    fake.got_frame.clear()
    thread, errors = in_thread(lambda: t.commit(tx1))
    frame = last_frame(fake, b"COMMIT")                                 # not ABORT
    assert f"transaction:{tx1}".encode() in frame
    fake.reply(f"RECEIPT\nreceipt-id:{fake.receipt_header()}\n\n\x00".encode())
    thread.join(5)
    assert not errors and not thread.is_alive()
    t.close()


def test_an_error_for_the_next_transaction_after_a_commit_was_written_does_not_fail_that_commit(
        fake: FakeBroker) -> None:
    """tx2's receipt-less SEND goes out before tx1's COMMIT, and its ERROR (no receipt id) arrives between tx1's
    COMMIT and the COMMIT's RECEIPT: tx1 had no unanswered frame, so its commit returns (before: it raised "the
    broker committed it without that frame" and recovery sent tx1's messages a second time)."""
    t = connect(fake, receipt_timeout=10)
    fake.got_frame.clear()
    tx1 = began(fake, t)
    receipted_send(fake, t, tx1)
    fake.got_frame.clear()
    tx2 = began(fake, t)
    t.send("/queue/q", MSG, transaction=tx2, confirm=Confirm.PIPELINED)
    last_frame(fake, b"SEND")
    thread, errors = in_thread(lambda: t.commit(tx1))
    assert f"transaction:{tx1}".encode() in last_frame(fake, b"COMMIT")
    fake.reply(b"ERROR\nmessage:tx2 send refused\n\n\x00"
               + f"RECEIPT\nreceipt-id:{fake.receipt_header()}\n\n\x00".encode())
    thread.join(5)
    assert not errors and not thread.is_alive()
    assert t.transaction_problem(tx2) == "tx2 send refused"
    t.close()


def test_a_late_error_for_a_receipted_frame_marks_only_its_transaction(fake: FakeBroker) -> None:
    """An ERROR carrying the receipt id of a frame whose caller gave up waiting (UnconfirmedOutcome) marks that frame's
    transaction, not the others."""
    t = connect(fake, receipt_timeout=0.2)
    fake.got_frame.clear()
    tx1 = began(fake, t)
    fake.got_frame.clear()
    tx2 = began(fake, t)
    t.send("/queue/q", MSG, transaction=tx2, confirm=Confirm.PIPELINED)
    with pytest.raises(UnconfirmedOutcome):
        t.send("/queue/q", MSG, transaction=tx1, confirm=Confirm.CONFIRMED)
    assert f"transaction:{tx1}".encode() in last_frame(fake, b"SEND")
    fake.reply(f"ERROR\nreceipt-id:{fake.receipt_header()}\nmessage:late refusal\n\n\x00".encode())
    wait_for_error(t)
    assert t.transaction_problem(tx1) == "late refusal" and t.transaction_problem(tx2) is None
    t.close()


def test_an_error_arriving_after_the_commit_was_sent_still_fails_the_commit(fake: FakeBroker) -> None:
    """The ERROR for an earlier receipt-less SEND can arrive after COMMIT went out (before its RECEIPT): the
    transaction stays in the book until the receipt, so commit() raises instead of returning normally (ActiveMQ
    refuses such a COMMIT itself; a broker that commits it has committed a transaction missing a message)."""
    t = connect(fake, receipt_timeout=10)
    tx = began(fake, t)
    t.send("/queue/q", MSG, transaction=tx, confirm=Confirm.PIPELINED)
    thread, errors = in_thread(lambda: t.commit(tx))
    deadline = time.monotonic() + 5
    while not fake.frames[-1].startswith(b"COMMIT") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake.frames[-1].startswith(b"COMMIT")
    fake.reply(b"ERROR\nmessage:send refused late\n\n\x00"
               + f"RECEIPT\nreceipt-id:{fake.receipt_header()}\n\n\x00".encode())
    thread.join(5)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], BrokerError) and "send refused late" in str(errors[0])
    with pytest.raises(LocalProtocolError):
        t.commit(tx)                                                    # the transaction has ended all the same
    t.close()


def drop_and_reconnect(fake: FakeBroker, t: StompTransport) -> None:
    """The broker drops the connection; once the transport noticed, it reconnects (a new socket)."""
    fake.drop()
    deadline = time.monotonic() + 5
    while t.is_connected() and time.monotonic() < deadline:
        time.sleep(0.01)
    t.reconnect()
    assert t.is_connected()


def test_state_callback_and_reconnect_after_drop(fake: FakeBroker) -> None:
    states: list[ConnectionState] = []
    t = connect(fake, on_state=states.append)
    drop_and_reconnect(fake, t)
    t.close()
    assert states == [ConnectionState.CONNECTED, ConnectionState.DISCONNECTED, ConnectionState.CONNECTED,
                      ConnectionState.CLOSED]


def test_connect_refused_is_unavailable_and_reconnect_stops_on_shutdown() -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    shutdown = threading.Event()
    policy = RetryPolicy("test.reconnect", max_attempts=1000, max_total_s=60, initial_wait_s=0.05, max_wait_s=0.2)
    t = open_transport(f"stomp://127.0.0.1:{port}", shutdown=shutdown, reconnect_policy=policy)
    with pytest.raises(BrokerUnavailable):
        t.connect()
    threading.Timer(0.5, shutdown.set).start()
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable):
        t.reconnect()
    assert 0.4 < time.monotonic() - started < 5
    t.close()


def test_credentials_only_from_arguments() -> None:
    with pytest.raises(LocalProtocolError):
        open_transport("stomp://user:secret@127.0.0.1:61613")
    t = open_transport("stomp://127.0.0.1:61613", username="u", password="secret")
    assert "secret" not in repr(t) and "secret" not in t.url


def test_one_subscribe_frame_per_subscription_and_connection(fake: FakeBroker) -> None:
    """reconnect() re-subscribes every subscription while subscribe() may run on another thread: a subscription
    already subscribed on the live connection must not be subscribed again (a second consumer's prefetch stranded
    messages after restarts)."""
    t = connect(fake, receipt_timeout=10)
    _subscribed(fake, t)
    t._resubscribe()                        # what reconnect() does after a subscribe() that won the race
    assert [f.split(b"\n", 1)[0] for f in fake.frames].count(b"SUBSCRIBE") == 1
    t.close()


def _no_delay(t: StompTransport) -> int:
    sock = t._conn.transport.socket  # type: ignore[union-attr]
    return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


def test_every_socket_the_transport_opens_has_tcp_nodelay(fake: FakeBroker) -> None:
    """Without TCP_NODELAY a COMMIT written right after the batch's SENDs waited for the broker's delayed ACK:
    about 44 ms per small transaction instead of about 1 ms (docs/performance.md, round 7). A reconnect opens a
    new socket, which must have it too."""
    t = connect(fake)
    try:
        assert _no_delay(t) == 1
        drop_and_reconnect(fake, t)
        assert _no_delay(t) == 1
    finally:
        t.close()
