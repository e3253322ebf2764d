"""A routing transaction's (T2, channel → JMS) frames byte for byte, as :class:`router.bridge.txout.OutboundT2` writes
them through its broker branch (:class:`router.bridge.txbranch.SendBranch`) and the STOMP transport.

The events of ``test_to_jms_wire`` (one per mapping branch) go out in two T2s into the recording fake broker of that
test: the first with the broker BEGIN enlisted early (``begin_in_t2``, its receipt awaited in the background) and an
unmappable event in the middle (a dead letter to another destination inside the batch), the second enlisted by
``forward_in_t2`` and ending with a dead letter (the receipted last frame goes to the dead-letter queue). Each is
prepared (the last frame's receipt) and committed. The bytes on the socket must equal ``t2_out_wire_golden.txt``,
written by the code that sent one socket write per SEND frame (before issue 12's batched T2 writes): how the frames
are written may change, not a byte of them nor their order. The gtrid is fixed; transaction and receipt ids are
numbered in order of appearance (``test_to_jms_wire._normalise``).

Regenerate the golden file only for an intended change of the frames: ``NSJMS_WRITE_GOLDEN=1 pytest ...``.
"""

# ruff: noqa: F811  (fixtures imported from the module that defines them, used as parameters)
from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from stomp import transport as stomp_transport
from test_to_jms_wire import (  # noqa: F401  (orb, recorder: that module's fixtures)
    DEST,
    NOW_MS,
    Recorder,
    _normalise,
    events,
    orb,
    recorder,
)

from router.bridge import brokerlink as bridge_module
from router.bridge.brokerlink import BrokerLink
from router.bridge.txbranch import SendBranch
from router.bridge.txout import OutboundT2
from router.jms.model import Destination
from router.jms.stomp.transport import StompTransport
from router.mapping.errors import MappingError
from router.mapping.stomp_codec import StompCodec
from router.routing.t2.transactions import OutboxRow
from xa.xid import NodeId, branch_xid, new_gtrid

GOLDEN = Path(__file__).with_name("t2_out_wire_golden.txt")
DLQ = Destination("queue", "wire.dlq")
UNMAPPABLE = "unmappable"


class Txn:
    def __init__(self, serial: int) -> None:
        self.gtrid = new_gtrid(NodeId("wire"), wall_ms=lambda: NOW_MS + serial, random_bytes=lambda n: bytes(n))
        self.branches: list[SendBranch] = []
        self.rollback_only: str | None = None

    def set_rollback_only(self, reason: str) -> None:
        self.rollback_only = reason


class Conn:
    def pipeline(self) -> Any:
        from contextlib import nullcontext
        return nullcontext()


class Outbox:
    def __init__(self) -> None:
        self.rows: list[OutboxRow] = []

    def insert(self, conn: Any, rows: Any) -> None:
        self.rows.extend(rows)


def _enlist(txn: Txn, branch: SendBranch) -> None:
    txn.branches.append(branch)
    branch.begin(branch_xid(txn.gtrid, "broker"))


def _to_frame(event: Any, destination: Destination) -> Any:
    if event == UNMAPPABLE:
        raise MappingError("this event cannot be mapped (pinned dead letter)", "body")
    bridge = SimpleNamespace(codec=StompCodec())       # the bridge's codec (BrokerSettings.codec)
    return BrokerLink._to_jms_frame(bridge, event, destination)  # type: ignore[arg-type]


def _wire(recorder: Recorder, monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[Txn], Outbox, list[int]]:
    class Clock:
        @staticmethod
        def time() -> float:
            return NOW_MS / 1000

    monkeypatch.setattr(bridge_module, "time", Clock)
    t = StompTransport(f"stomp://127.0.0.1:{recorder.port}", heartbeats=(0, 0), codec=StompCodec())
    t.connect()
    outbox = Outbox()
    out = OutboundT2(7, DEST, lambda: t, StompCodec(), lambda ev, dest: None,  # type: ignore[arg-type,return-value]
                     lambda ev: b"the unmappable event's bytes", DLQ, _enlist, lambda: True, to_frame=_to_frame,
                     outbox=outbox)
    out.send_chunk = 3          # chunks of mapped frames written while mapping goes on (ignored by the older code)
    writes: list[int] = []
    real_send = stomp_transport.Transport.send

    def send(self: Any, encoded_frame: bytes) -> None:
        writes.append(encoded_frame.count(b"\x00SEND\n") + encoded_frame.startswith(b"SEND\n"))
        real_send(self, encoded_frame)

    monkeypatch.setattr(stomp_transport.Transport, "send", send)
    evs = events()
    txns = [Txn(1), Txn(2)]
    try:
        first, second = txns
        out.begin_in_t2(first)
        deadline = time.monotonic() + 10      # its BEGIN's receipt in: the chunks below are then written as due
        while not first.branches[0].begun():
            assert time.monotonic() < deadline
            time.sleep(0.005)
        out.forward_in_t2(first, Conn(), [*evs[:2], UNMAPPABLE, *evs[2:]])
        first.branches[0].prepare()
        first.branches[0].commit()
        out.forward_in_t2(second, Conn(), [evs[0], evs[5], UNMAPPABLE])
        second.branches[0].prepare()
        second.branches[0].commit()
    finally:
        t.close()               # its DISCONNECT is answered after every frame before it was recorded
    with recorder.lock:
        text = _normalise(bytes(recorder.data))
    for i, txn in enumerate(txns, 1):
        text = text.replace(txn.gtrid, f"<gtrid {i}>").replace(txn.gtrid.replace(":", "\\c"), f"<gtrid {i}>")
    return text, txns, outbox, writes


def test_a_t2s_frames_are_byte_for_byte_the_pinned_ones(recorder: Recorder,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    wire, txns, outbox, writes = _wire(recorder, monkeypatch)
    assert [t.rollback_only for t in txns] == [None, None]
    assert len(outbox.rows) == len(events()) + 1 + 3
    if os.environ.get("NSJMS_WRITE_GOLDEN") == "1":
        GOLDEN.write_text(wire, encoding="utf-8")
    assert wire == GOLDEN.read_text(encoding="utf-8")
    # the SENDs of a T2 go out a few per socket write (chunks of 3 split where the destination changes; its last
    # frame, receipted, alone): T2 1 = [0 1 | DLQ 2] [3 4 5] [6 7 8] [last 9], T2 2 = [0 1] [last DLQ 2]
    assert [n for n in writes if n] == [2, 1, 3, 3, 1, 2, 1], writes


def test_the_pinned_t2_frames_cover_what_they_claim() -> None:
    text = GOLDEN.read_text(encoding="utf-8")
    assert text.count("BEGIN\n") == 2 and text.count("COMMIT\n") == 2
    assert text.count("destination:/queue/wire.dlq") == 2 and "nsjms_dlq_reason:" in text
    assert text.count("receipt:send-#") == 2, "one receipted SEND per T2: its last"
    for needle in ("nsjms_dedupe_id:<gtrid 1>/0", "nsjms_dedupe_id:<gtrid 1>/2", "nsjms_dedupe_id:<gtrid 2>/2",
                   "persistent:false", "transaction:tx-#2", "$body_encoding:cdr-any"):
        assert needle in text, needle
