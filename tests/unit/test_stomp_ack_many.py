"""Receipt-less ACKs written together (issue 12, round 5): ``encode_ack_frame`` writes exactly stomp.py's bytes,
:meth:`StompTransport.ack_many` keeps the book of that many ``ack`` calls and writes the frames at once, and a
local (non-T2) JMS -> channel round's frames (:class:`router.bridge.t2in.LocalAcks`) keep their order with the
ACKs between two other frames grouped."""

# ruff: noqa: F811  (fixtures imported from the module that defines them, used as parameters)
from __future__ import annotations

import time
from typing import Any

import pytest
from psycopg import Xid
from stomp import transport as stomp_transport
from stomp.protocol import Protocol12
from test_stomp_framing import _Capture
from test_transport_stomp_faults import FakeBroker, _subscribed, connect, fake  # noqa: F401

from router.bridge.t2in import ACK_RUN, AckBranch, LocalAcks
from router.jms.model import BodyType, Destination, JmsMessage
from router.jms.stomp.sendframe import encode_ack_frame
from router.jms.transport import Confirm, Delivery, LocalProtocolError


@pytest.mark.parametrize(("ack_id", "tx"), [("ID:host-1-2:1:1:1:7", None), ("plain", "tx-9"),
                                            ("back\\slash\nnew:line", "t:x"), ("é日", None)])
def test_an_ack_frame_is_stomp_pys_byte_for_byte(ack_id: str, tx: str | None) -> None:
    capture = _Capture()
    Protocol12(capture).ack(ack_id, transaction=tx)
    assert encode_ack_frame(ack_id, tx) == capture.frames[0]


def _messages(fake: FakeBroker, n: int) -> None:
    fake.reply(b"".join(f"MESSAGE\ndestination:/queue/in\nack:ID\\c{i}\nsubscription:sub-1\nmessage-id:ID\\cm-{i}\n"
                        f"\nbody {i}\x00".encode() for i in range(n)))


def _acks(fake: FakeBroker, n: int) -> list[bytes]:
    deadline = time.monotonic() + 5
    while sum(f.startswith(b"ACK") for f in fake.frames) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return [f for f in fake.frames if f.startswith(b"ACK")]


def test_ack_many_writes_the_acks_in_order_and_settles_them_in_the_book(fake: FakeBroker,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    t = connect(fake, receipt_timeout=10)
    sub = _subscribed(fake, t)
    _messages(fake, 3)
    got = [sub.receive(5) for _ in range(3)]  # type: ignore[attr-defined]
    assert all(d is not None for d in got)
    writes: list[bytes] = []
    real_send = stomp_transport.Transport.send

    def send(self: Any, encoded_frame: bytes) -> None:
        writes.append(encoded_frame)
        real_send(self, encoded_frame)

    monkeypatch.setattr(stomp_transport.Transport, "send", send)
    t.ack_many(got)
    assert _acks(fake, 3) == [encode_ack_frame(f"ID:{i}").rstrip(b"\x00") for i in range(3)]
    assert writes == [b"".join(encode_ack_frame(f"ID:{i}") for i in range(3))]     # the three in one socket write
    with pytest.raises(LocalProtocolError):      # the book took them: a second ack is refused, as after ack()
        t.ack(got[0], confirm=Confirm.PIPELINED)
    t.close()


def test_ack_many_writes_those_before_a_refused_delivery_then_raises(fake: FakeBroker) -> None:
    t = connect(fake, receipt_timeout=10)
    sub = _subscribed(fake, t)
    _messages(fake, 3)
    got = [sub.receive(5) for _ in range(3)]  # type: ignore[attr-defined]
    t.ack(got[1], confirm=Confirm.PIPELINED)                 # already acknowledged: the book refuses it in ack_many
    with pytest.raises(LocalProtocolError):
        t.ack_many(got)
    acks = _acks(fake, 2)
    assert acks == [encode_ack_frame("ID:1").rstrip(b"\x00"), encode_ack_frame("ID:0").rstrip(b"\x00")]
    t.ack(got[2], confirm=Confirm.PIPELINED)                 # not taken by the failed call: still pending in the book
    t.close()


# -- LocalAcks: grouping and order ------------------------------------------------------------------------------
class _Recorder:
    """A transport stand-in recording the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def ack_many(self, ds: list[Delivery], transaction: str | None = None) -> None:
        self.calls.append(("ack_many", [d.message_id for d in ds]))

    def ack(self, d: Delivery, transaction: str | None = None, *, confirm: Confirm = Confirm.CONFIRMED) -> None:
        self.calls.append(("ack", (d.message_id, confirm)))

    def nack(self, d: Delivery, transaction: str | None = None, *, confirm: Confirm = Confirm.CONFIRMED) -> None:
        self.calls.append(("nack", (d.message_id, confirm)))

    def send(self, destination: Any, message: Any, *, confirm: Confirm = Confirm.CONFIRMED) -> None:
        self.calls.append(("send", (message.body, confirm)))


def _d(i: int) -> Delivery:
    return Delivery(message=JmsMessage(BodyType.TEXT, str(i)), headers={}, body=b"", subscription="s",
                    ack_id=f"a{i}", message_id=f"m{i}", destination="/queue/in", redelivered=False, epoch=1)


def _local(t: Any, outcome: list[str]) -> LocalAcks:
    return LocalAcks(t, [], on_rollback=lambda _: outcome.append("rollback"),
                     on_commit=lambda: outcome.append("commit"),
                     on_failed=lambda exc, refused: outcome.append(f"failed {exc}"))


def test_a_local_rounds_acks_between_other_frames_go_out_together_in_order() -> None:
    t, outcome = _Recorder(), list[str]()
    acks = _local(t, outcome)
    dest = Destination("queue", "dlq")
    acks.ack(_d(1))
    acks.ack(_d(2))
    acks.nack(_d(3))
    acks.ack(_d(4))
    acks.ack(_d(5))
    acks.send(dest, JmsMessage(BodyType.TEXT, "letter of 5"), before=_d(5))   # before its original's ACK
    acks.ack(_d(6))
    acks.settle()
    assert t.calls == [("ack_many", ["m1", "m2"]), ("nack", ("m3", Confirm.CONFIRMED)), ("ack_many", ["m4"]),
                       ("send", ("letter of 5", Confirm.CONFIRMED)), ("ack_many", ["m5", "m6"])]
    assert outcome == ["commit"]


# -- AckBranch (T2): runs of ACKs ---------------------------------------------------------------------------
class _TxRecorder(_Recorder):
    def ack_many(self, ds: list[Delivery], transaction: str | None = None) -> None:
        self.calls.append(("ack_many", ([d.message_id for d in ds], transaction)))

    def begin(self) -> str:
        self.calls.append(("begin", None))
        return "tx-1"

    def abort(self, transaction: str) -> None:
        self.calls.append(("abort", transaction))

    def ack(self, d: Delivery, transaction: str | None = None, *, confirm: Confirm = Confirm.CONFIRMED) -> None:
        self.calls.append(("ack", (d.message_id, transaction, confirm)))

    def send(self, destination: Any, message: Any, *, transaction: str | None = None,
             confirm: Confirm = Confirm.CONFIRMED) -> None:
        self.calls.append(("send", (message.body, transaction, confirm)))


def _branch(t: Any, ds: list[Delivery], back: list[list[Delivery]] | None = None) -> AckBranch:
    branch = AckBranch(t, ds, on_rollback=(lambda b: back.append(b.deliveries)) if back is not None else None)
    branch.begin(Xid(1, "g1", "stomp-ack"))
    return branch


def test_a_t2s_acks_go_out_in_runs_before_any_other_frame_and_the_last_one_with_its_receipt() -> None:
    t = _TxRecorder()
    ds = [_d(i) for i in range(ACK_RUN + 9)]
    branch = _branch(t, ds)
    for d in ds[:-1]:
        branch.ack(d)
    branch.send(Destination("queue", "dlq"), JmsMessage(BodyType.TEXT, "letter"))
    branch.ack(ds[-1])
    branch.prepare()
    assert branch.frames == len(ds) + 1
    assert t.calls == [("begin", None),
                       ("ack_many", ([f"m{i}" for i in range(ACK_RUN)], "tx-1")),
                       ("ack_many", ([f"m{i}" for i in range(ACK_RUN, len(ds) - 1)], "tx-1")),
                       ("send", ("letter", "tx-1", Confirm.PIPELINED)),
                       ("ack", (f"m{len(ds) - 1}", "tx-1", Confirm.CONFIRMED))]


def test_a_sealed_t2_writes_its_pending_run_then_the_last_frame_with_its_receipt() -> None:
    t = _TxRecorder()
    ds = [_d(i) for i in range(5)]
    branch = _branch(t, ds)
    for d in ds:
        branch.ack(d)
    assert t.calls == [("begin", None)]          # a short run waits for the seal
    branch.seal()
    branch.prepare()
    assert t.calls == [("begin", None), ("ack_many", (["m0", "m1", "m2", "m3"], "tx-1")),
                       ("ack", ("m4", "tx-1", Confirm.CONFIRMED))]


def test_a_rolled_back_t2_never_writes_its_pending_run_and_gives_the_deliveries_back() -> None:
    t, back = _TxRecorder(), list[list[Delivery]]()
    ds = [_d(i) for i in range(5)]
    branch = _branch(t, ds, back)
    for d in ds:
        branch.ack(d)
    branch.rollback()
    assert t.calls == [("begin", None), ("abort", "tx-1")]
    assert back == [ds]
