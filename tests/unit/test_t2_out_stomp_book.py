"""A T2's broker branch (:class:`router.bridge.txbranch.SendBranch`) writing its receipt-less frames in runs
(:meth:`SendBranch.send_many`, the STOMP transport's ``send_encoded_many``) against the scripted fake broker of
``test_transport_stomp_faults``: the transport's book attributes an ERROR without a receipt id exactly as for
frames written one by one (issue 12: batched T2 writes must not change which transaction a refusal marks)."""

# ruff: noqa: F811  (fixtures imported from the module that defines them, used as parameters)
from __future__ import annotations

import time

import pytest
from test_transport_stomp_faults import (  # noqa: F401  (fake: that module's fixture)
    FakeBroker,
    began,
    connect,
    fake,
    in_thread,
    last_frame,
)

from router.bridge.txbranch import SendBranch
from router.jms.stomp.transport import StompTransport
from router.jms.transport import EncodedMessage
from xa.errors import PrepareFailed
from xa.xid import NodeId, branch_xid, new_gtrid

DEST = "/queue/q"


def _frames(n: int, tag: str) -> list[tuple[EncodedMessage, bool]]:
    return [(EncodedMessage({"content-type": "text/plain"}, f"{tag} {i}".encode()), True) for i in range(n)]


def _branch(fake: FakeBroker, t: StompTransport) -> SendBranch:
    branch = SendBranch(t)
    branch.xid = branch_xid(new_gtrid(NodeId("n1")), "broker")
    fake.got_frame.clear()
    branch.tx = began(fake, t)                   # SendBranch.begin's receipted BEGIN, answered by the fake
    return branch


def _frames_of(fake: FakeBroker, tx: str) -> list[bytes]:
    return [f for f in fake.frames if f.startswith(b"SEND") and f"transaction:{tx}".encode() in f]


def _answer_last(fake: FakeBroker, branch: SendBranch) -> None:
    """Send the branch's last frame (receipted, in the background) and answer its receipt."""
    assert branch.tx is not None
    branch.send(DEST, EncodedMessage({}, b"last"), persistent=True, last=True, background=True)
    deadline = time.monotonic() + 5
    while not (fake.frames and fake.frames[-1].endswith(b"\n\nlast")) and time.monotonic() < deadline:
        time.sleep(0.01)
    frame = last_frame(fake, b"SEND").decode()
    assert frame.endswith("\n\nlast") and f"transaction:{branch.tx}" in frame and "receipt:" in frame
    fake.reply(f"RECEIPT\nreceipt-id:{fake.receipt_header()}\n\n\x00".encode())


def test_a_refusal_of_a_batched_frame_marks_only_its_t2_not_the_decided_one(fake: FakeBroker) -> None:
    """T2 1 wrote a run of frames and its receipted last one (answered: prepared); T2 2 on the same connection
    writes a run whose frame the broker refuses with an ERROR without receipt id, before T2 1's COMMIT. Only T2 2
    is marked: its prepare votes no for its content, T2 1's COMMIT goes out as a COMMIT and succeeds."""
    t = connect(fake, receipt_timeout=10)
    first = _branch(fake, t)
    first.send_many(DEST, _frames(3, "one"))
    _answer_last(fake, first)
    first.prepare()
    assert first.sent == 4 and len(_frames_of(fake, str(first.tx))) == 4
    second = _branch(fake, t)
    second.send_many(DEST, _frames(3, "two"))
    deadline = time.monotonic() + 5
    while len(_frames_of(fake, str(second.tx))) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [f.rsplit(b"\n", 1)[-1] for f in _frames_of(fake, str(second.tx))] == [b"two 0", b"two 1", b"two 2"]
    fake.reply(b"ERROR\nmessage:two refused\n\n\x00")
    while t.last_error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert t.transaction_problem(str(second.tx)) == "two refused"
    assert t.transaction_problem(str(first.tx)) is None
    fake.got_frame.clear()
    thread, errors = in_thread(first.commit)
    assert f"transaction:{first.tx}".encode() in last_frame(fake, b"COMMIT")          # not ABORT
    fake.reply(f"RECEIPT\nreceipt-id:{fake.receipt_header()}\n\n\x00".encode())
    thread.join(5)
    assert not errors and not thread.is_alive()
    _answer_last(fake, second)
    with pytest.raises(PrepareFailed, match="two refused") as failed:
        second.prepare()
    assert failed.value.content is True  # type: ignore[attr-defined]
    t.close()


def test_an_error_for_a_batched_frame_of_a_t2_still_sending_marks_it(fake: FakeBroker) -> None:
    """The ERROR (no receipt id) arrives while T2 1's run is unanswered and T2 2 has only its receipted BEGIN:
    T2 1 is marked, T2 2 (no unanswered frame) is not."""
    t = connect(fake, receipt_timeout=10)
    first = _branch(fake, t)
    second = _branch(fake, t)
    first.send_many(DEST, _frames(2, "one"))
    deadline = time.monotonic() + 5
    while len(_frames_of(fake, str(first.tx))) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    fake.reply(b"ERROR\nmessage:one refused\n\n\x00")
    while t.last_error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert t.transaction_problem(str(first.tx)) == "one refused"
    assert t.transaction_problem(str(second.tx)) is None
    t.close()
