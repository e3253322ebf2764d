"""Channel → JMS routing transactions over twins (no ORB, no services): the broker SEND branch
(router.bridge.txbranch) on the memory transport, the bridge's participant (router.bridge.txout) and the proxy's
T2 delivery (router.channel.txdelivery) with the xa coordinator over an in-memory log and resource manager.

A proxy supplier here is the same fake as in test_channel_delivery (events are ints); its consumer IOR is
registered as the bridge's in-process participant, whose transport is a memory broker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import pytest
from test_channel_delivery import FakeDeadLetters

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)
from omniORB import CORBA

import CosNotification

from idl.generated import BridgeTransactionMgmt as BTM
from router.bridge import txbranch
from router.bridge.txbranch import SendBranch
from router.bridge.txmgmt import TransactionMgmtMixin
from router.bridge.txout import DEDUPE_PROPERTY, DUPL_ID_HEADER, OutboundT2
from router.channel import proxies as P
from router.channel import qos as Q
from router.channel import txdelivery as TX
from router.channel.boundary import POISON_ATTEMPTS, Outcome
from router.channel.events import Event, Form
from router.channel.queue import FIFO_ORDER, ProxyQueue, Record
from router.jms.memory.broker import MemoryBroker
from router.jms.memory.transport import MemoryTransport
from router.jms.model import BodyType, Destination, JmsMessage
from router.jms.refusal import RESOURCE_MARK
from router.jms.transport import (
    BrokerError,
    BrokerUnavailable,
    Confirm,
    EncodedMessage,
    SendRefused,
    Transport,
    UnconfirmedOutcome,
)
from router.mapping.errors import MappingError
from router.mapping.stomp_codec import StompCodec
from xa.coordinator import Coordinator
from xa.errors import BranchUnavailable, LogDurabilityUnknown, OutcomeUnknown, PrepareFailed
from xa.testing import FakeClock, MemoryLog, MemoryManager
from xa.xid import NodeId, branch_xid, new_gtrid

OUT = Destination("queue", "out")
DLQ = Destination("queue", "nsjms.DLQ")
IOR = "IOR:bridge-endpoint"


# ------------------------------------------------------------------------------------------------ twins
class FakeConn:
    """The PostgreSQL branch's connection as the store and outbox functions use it."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, Any]] = []
        self.queued: list[int] = []             # what a SELECT of nsjms_queue answers

    def execute(self, sql: str, params: Any = None) -> Any:
        self.statements.append((sql, params))
        rows = [(i,) for i in self.queued] if sql.startswith("SELECT event_id FROM nsjms_queue") else []
        return type("Cursor", (), {"fetchall": lambda self: rows})()

    def cursor(self) -> FakeConn:
        return self

    @contextmanager
    def copy(self, sql: str) -> Iterator[Any]:
        """``COPY ... FROM STDIN``: recorded as one statement whose params are the columns (as the rows went)."""
        rows: list[tuple[Any, ...]] = []
        yield type("Copy", (), {"write_row": lambda self, row: rows.append(tuple(row))})()
        self.statements.append((sql, tuple(list(col) for col in zip(*rows, strict=True))))

    def outbox(self) -> list[Any]:
        return [p for s, p in self.statements if "nsjms_outbox" in s]

    def pipeline(self) -> Any:
        return nullcontext()


class FakeDb:
    def __init__(self) -> None:
        self.conn = FakeConn()

    @contextmanager
    def branch(self) -> Iterator[FakeConn]:
        yield self.conn

    @contextmanager
    def unit_of_work(self) -> Iterator[FakeConn]:
        yield self.conn


class NoLedger:
    def records(self, *, persistent: bool) -> bool:
        return False


class FakeStore:
    ledger = NoLedger()

    def __init__(self) -> None:
        self.deleted: list[int] = []

    def delete_deliveries(self, conn: Any, cid: int, aid: int, pid: int, ids: list[int], **ledger: Any) -> None:
        self.deleted.extend(ids)


class FakeT2:
    """NodeTransactions as the proxy and the bridge use it."""

    def __init__(self, clock: FakeClock) -> None:
        self.node = NodeId("n1")
        self.log = MemoryLog(self.node)
        self.coordinator = Coordinator(self.node, self.log, clock)
        self._targets: dict[str, Any] = {}

    def enlist(self, txn: Any, resource: Any) -> Any:
        return txn.enlist(resource)

    def register_local(self, ior: str, target: Any) -> None:
        self._targets[ior] = target

    def local(self, ior: str | None) -> Any:
        return self._targets.get(ior) if ior else None


class RefusingTransport:
    """A memory transport whose broker refuses (ERROR frame) every message whose body contains ``poison``
    to the destination (not to the dead-letter queue)."""

    def __init__(self, inner: MemoryTransport) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def send_encoded(self, destination: Any, encoded: EncodedMessage, **kw: Any) -> None:
        if b"poison" in encoded.body and "DLQ" not in str(destination):
            raise SendRefused("ERROR frame", str(destination), "User anonymous is not authorized to write")
        self.inner.send_encoded(destination, encoded, **kw)

    def send_encoded_many(self, destination: Any, messages: Any, *, transaction: str) -> None:
        for encoded, persistent in messages:          # each through send_encoded above (refused there)
            self.send_encoded(destination, encoded, persistent=persistent, transaction=transaction,
                              confirm=Confirm.PIPELINED)


def to_jms(event: Any, destination: Destination) -> JmsMessage:
    if event == 13:
        raise MappingError("event 13 cannot be mapped (injected)", "remainder_of_body")
    body = "poison" if event == 7 else f"event {event}"
    return JmsMessage(BodyType.TEXT, body, destination=destination)


class Rig:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, sequence: bool = False, batch: int = 1,
                 events: int = 10, timeout: int = 0, dupl: bool = False, outbox: Any = None) -> None:
        self.clock = FakeClock()
        self.t2 = FakeT2(self.clock)
        self.pg = MemoryManager("postgresql", self.clock)
        monkeypatch.setattr(TX, "PgBranch", lambda conn, name: self.pg.branch(name))
        self.broker = MemoryBroker(f"t2u-{id(self)}")
        self.transport = MemoryTransport(broker=self.broker, codec=StompCodec())
        self.transport.connect()
        self.wire: Transport = RefusingTransport(self.transport)
        self.running = True
        self.out = OutboundT2(3, OUT, lambda: self.wire, StompCodec(), to_jms, lambda ev: str(ev).encode(), DLQ,
                              self.t2.enlist, lambda: self.running, amq_dupl_id=dupl,
                              **({} if outbox is None else {"outbox": outbox}))
        self.t2.register_local(IOR, self.out)
        cls = P.SequenceProxyPushSupplierImpl if sequence else P.StructuredProxyPushSupplierImpl
        proxy: Any = object.__new__(cls)
        proxy.rt = type("Rt", (), {})()
        proxy.rt.t2, proxy.rt.db, proxy.rt.store = self.t2, FakeDb(), FakeStore()
        proxy.rt.dead_letters = FakeDeadLetters()
        proxy.oid, proxy.id, proxy.style = "ch/0/C/0/1", 1, "PUSH"
        proxy.admin = type("Admin", (), {"id": 0})()
        proxy.channel = type("Channel", (), {"id": 0, "admin_props": {}})()
        proxy.form = "SEQUENCE" if sequence else "STRUCTURED"
        proxy.qos = {"MaximumBatchSize": batch, "PacingInterval": 0, Q.ENABLE_TRANSACTION: True}
        key = "sequences" if sequence else "events"
        proxy.extra = {"transaction": {key: events, "timeout": timeout}}
        proxy.connected, proxy.suspended, proxy.destroyed = True, False, False
        proxy.stop_event = threading.Event()
        proxy.client, proxy.client_ior = None, IOR
        proxy.queue = ProxyQueue(FIFO_ORDER, 0, 0, proxy._dropped)
        proxy.dead_lettered, proxy.last_dead_letter, proxy.isolating = 0, None, 0
        self.proxy = proxy
        self.records: dict[int, Record] = {}

    def put(self, *seqs: int) -> None:
        for s in seqs:
            rec = Record(s, Event(Form.STRUCTURED, s), 0, None, None, True, 100 + s)
            self.records[s] = rec
            self.proxy.queue.put(rec)

    def round(self) -> Outcome:
        """What one turn of the dispatcher does: take a batch, deliver it."""
        entries = self.proxy.queue.take(self.proxy.batch_limit(self.proxy.batch_size()))
        assert entries, "nothing queued"
        outcome: Outcome = self.proxy._deliver(entries)
        TX.drain(self.proxy)             # the phase two the proxy's completer runs meanwhile (pipelined T2s)
        return outcome

    def on(self, name: str) -> list[Any]:
        return list(self.broker.queues.get(f"/queue/{name}", []))

    def bodies(self, name: str) -> list[str]:
        return [m.body.decode() for m in self.on(name)]


# -------------------------------------------------------------------------------------------- the send branch
def _branch(transport: MemoryTransport) -> tuple[SendBranch, Any]:
    branch = SendBranch(transport)
    xid = branch_xid(new_gtrid(NodeId("n1")), "broker")
    branch.begin(xid)
    return branch, xid


def _frame(body: str) -> EncodedMessage:
    return EncodedMessage({"content-type": "text/plain"}, body.encode())


def test_send_branch_sends_in_one_stomp_transaction_and_commits_last() -> None:
    broker = MemoryBroker("t2u-branch")
    with MemoryTransport(broker=broker) as transport:
        branch, _ = _branch(transport)
        branch.send("/queue/b", _frame("one"), persistent=True, last=False)
        branch.send("/queue/b", _frame("two"), persistent=True, last=True)
        assert list(broker.queues.get("/queue/b", [])) == [], "nothing visible before COMMIT"
        branch.prepare()
        assert list(broker.queues.get("/queue/b", [])) == [], "prepare never commits"
        branch.commit()
        assert [m.body for m in broker.queues["/queue/b"]] == [b"one", b"two"]
        assert all(m.persistent for m in broker.queues["/queue/b"])


def test_send_branch_rollback_aborts() -> None:
    broker = MemoryBroker("t2u-abort")
    with MemoryTransport(broker=broker) as transport:
        branch, _ = _branch(transport)
        branch.send("/queue/b", _frame("one"), persistent=True, last=True)
        branch.rollback()
        branch.rollback()                                   # nothing left to roll back: no error
        assert list(broker.queues.get("/queue/b", [])) == []


def test_send_branch_votes_no_without_a_receipt_on_the_last_frame() -> None:
    with MemoryTransport(broker=MemoryBroker("t2u-norcpt")) as transport:
        branch, _ = _branch(transport)
        branch.send("/queue/b", _frame("one"), persistent=True, last=False)
        with pytest.raises(PrepareFailed, match="not receipted"):
            branch.prepare()


def test_send_branch_votes_no_when_a_frame_got_an_error() -> None:
    """An ERROR frame for a receipt-less SEND marks the transaction in the transport's book: prepare refuses, and
    marks the refusal as the batch's content (the connection is alive)."""
    with MemoryTransport(broker=MemoryBroker("t2u-err")) as transport:
        branch, _ = _branch(transport)
        branch.send("/queue/b", _frame("one"), persistent=True, last=True)
        transport._book.mark_rollback_only("not authorized")
        with pytest.raises(PrepareFailed, match="not authorized") as err:
            branch.prepare()
        assert getattr(err.value, "content", False) is True


def test_send_branch_votes_no_after_the_connection_was_lost() -> None:
    broker = MemoryBroker("t2u-lost")
    with MemoryTransport(broker=broker) as transport:
        branch, _ = _branch(transport)
        branch.send("/queue/b", _frame("one"), persistent=True, last=True)
        broker.restart()
        with pytest.raises(PrepareFailed) as err:
            branch.prepare()
        assert getattr(err.value, "content", True) is False, "an outage is not the batch's fault"


@pytest.mark.parametrize("fault", [UnconfirmedOutcome("no receipt", "commit"), BrokerUnavailable("connection lost")])
def test_a_commit_without_its_receipt_is_outcome_unknown(fault: Exception) -> None:
    broker = MemoryBroker(f"t2u-unknown-{type(fault).__name__}")
    with MemoryTransport(broker=broker) as transport:
        branch, xid = _branch(transport)
        branch.send("/queue/b", _frame("one"), persistent=True, last=True)
        branch.prepare()
        broker.inject_fault("commit", fault, applied=True)  # type: ignore[arg-type]
        with pytest.raises(OutcomeUnknown) as err:
            branch.commit()
        assert err.value.gtrid == xid.gtrid and err.value.branch == "broker"


# ------------------------------------------------------------------------------------------------ T2 delivery
class TwinOutbox:
    """An in-memory :class:`router.bridge.ports.Outbox`: keeps the rows per unit of work; ``fail`` makes insert
    raise (as a PostgreSQL error would, surfacing before PREPARE)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.rows: list[Any] = []

    def insert(self, conn: Any, rows: Any) -> None:
        assert conn is not None, "the T2's PostgreSQL branch is handed in"
        if self.fail:
            raise RuntimeError("outbox write failed (injected)")
        self.rows.extend(rows)


def test_the_outbox_port_gets_one_row_per_message_with_the_frame_as_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    outbox = TwinOutbox()
    rig = Rig(monkeypatch, events=3, outbox=outbox)
    rig.put(1, 2, 3)
    assert rig.round() is Outcome.DELIVERED
    sent = rig.on("out")
    assert [(r.idx, r.dedupe_id, r.body) for r in outbox.rows] == [
        (i, m.headers[DEDUPE_PROPERTY], m.body) for i, m in enumerate(sent)], "the frames exactly as sent"
    assert all(r.bridge_id == 3 and r.headers["persistent"] in ("true", "false") for r in outbox.rows)
    assert rig.proxy.rt.db.conn.outbox() == [], "nothing went to PostgreSQL behind the port's back"


def test_a_failing_outbox_write_rolls_the_t2_back_and_keeps_the_events(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, events=3, outbox=TwinOutbox(fail=True))
    rig.put(1, 2, 3)
    assert rig.round() is Outcome.RETRY
    assert rig.on("out") == [], "nothing reached the destination"
    assert rig.pg.prepared == {} and rig.pg.committed == [], "the PostgreSQL branch (queue deletes) rolled back"
    assert not rig.out.active() and rig.out.status()["t2_rolled_back"] == 1
    assert len(rig.proxy.queue) == 3, "the events stay queued and are offered again"
    rig.out.outbox = TwinOutbox()                        # the outbox works again: the same events go out once
    assert rig.round() is Outcome.DELIVERED and rig.bodies("out") == ["event 1", "event 2", "event 3"]


def test_a_batch_is_delivered_in_one_t2_with_dedupe_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, events=3, dupl=True)
    rig.put(1, 2, 3, 4)
    assert rig.round() is Outcome.DELIVERED
    sent = rig.on("out")
    assert [m.body.decode() for m in sent] == ["event 1", "event 2", "event 3"], "TransactionEvents = 3"
    gtrid = sent[0].headers[DEDUPE_PROPERTY].rsplit("/", 1)[0]
    assert [m.headers[DEDUPE_PROPERTY] for m in sent] == [f"{gtrid}/{i}" for i in range(3)]
    assert [m.headers[DUPL_ID_HEADER] for m in sent] == [f"{gtrid}/{i}" for i in range(3)]
    assert rig.proxy.rt.store.deleted == [101, 102, 103], "deleted in the PostgreSQL branch"
    assert sorted(rig.pg.committed) == [] and rig.pg.prepared == {}, "the PostgreSQL branch committed"
    outbox = rig.proxy.rt.db.conn.outbox()
    assert len(outbox) == 1 and outbox[0][2] == [f"{gtrid}/{i}" for i in range(3)], "one outbox row per message"
    assert [r.holders for r in (rig.records[1], rig.records[2], rig.records[3])] == [0, 0, 0], "released"
    assert len(rig.proxy.queue) == 1 and rig.records[4].holders == 1
    assert rig.out.status()["t2_committed"] == 1 and not rig.out.active()
    assert [k for k in rig.t2.log.kinds()] == ["Commit", "End"]


def test_a_participant_that_maps_and_encodes_in_one_step_sends_that_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """``to_frame`` (the bridge's map + encode + limits check in one step): the frame it returns is sent as is,
    with the dedupe id added; ``to_jms`` and the codec are not called again; a mapping failure still dead-letters."""
    rig = Rig(monkeypatch, events=3)
    calls: list[Any] = []

    def to_frame(event: Any, destination: Destination) -> tuple[JmsMessage, EncodedMessage]:
        calls.append(event)
        msg = to_jms(event, destination)
        encoded = StompCodec().encode(msg)
        return msg, EncodedMessage({**encoded.headers, "encoded_once": str(event)}, encoded.body)

    def no_to_jms(event: Any, destination: Destination) -> JmsMessage:
        raise AssertionError("to_jms must not be called when to_frame is given")

    rig.out.to_frame, rig.out.to_jms = to_frame, no_to_jms
    rig.put(1, 13, 3)
    assert rig.round() is Outcome.DELIVERED
    sent = rig.on("out")
    assert [m.body.decode() for m in sent] == ["event 1", "event 3"]
    assert [m.headers["encoded_once"] for m in sent] == ["1", "3"], "the frame to_frame encoded is the one sent"
    gtrid = sent[0].headers[DEDUPE_PROPERTY].rsplit("/", 1)[0]
    dead = rig.on("nsjms.DLQ")
    assert sorted(m.headers[DEDUPE_PROPERTY] for m in sent + dead) == [f"{gtrid}/{i}" for i in range(3)]
    assert [m.body for m in dead] == [b"13"], "the unmappable event is dead-lettered in the T2"
    assert sorted(calls) == [1, 3, 13], "each event mapped once"


def test_a_sequence_proxy_takes_transaction_event_sequences_times_batch_size(monkeypatch: pytest.MonkeyPatch
                                                                             ) -> None:
    rig = Rig(monkeypatch, sequence=True, batch=2, events=2)
    rig.put(*range(1, 8))
    assert rig.round() is Outcome.DELIVERED
    assert rig.bodies("out") == [f"event {i}" for i in (1, 2, 3, 4)], "2 sequences of 2 events"
    assert len(rig.proxy.queue) == 3


def test_an_unmappable_event_is_dead_lettered_inside_the_same_t2(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, events=3)
    rig.put(12, 13, 14)
    assert rig.round() is Outcome.DELIVERED
    assert rig.bodies("out") == ["event 12", "event 14"]
    dead = rig.on("nsjms.DLQ")
    assert len(dead) == 1 and dead[0].body == b"13"
    assert "cannot be mapped" in dead[0].headers["nsjms_dlq_reason"]
    gtrid = rig.on("out")[0].headers[DEDUPE_PROPERTY].rsplit("/", 1)[0]
    assert dead[0].headers[DEDUPE_PROPERTY] == f"{gtrid}/1", "the dead letter is message 1 of the same T2"
    assert rig.out.status()["t2_committed"] == 1 and rig.out.dead_lettered == 1


def test_a_timeout_rolls_back_and_the_events_are_delivered_later(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, events=3, timeout=5)
    real = rig.out.to_jms
    slow = iter([True])

    def late(event: Any, destination: Destination) -> JmsMessage:
        if next(slow, False):
            rig.clock.advance(6)                        # the first T2 passes its TransactionTimeout
        return real(event, destination)

    rig.out.to_jms = late
    rig.put(1, 2, 3)
    assert rig.round() is Outcome.RETRY
    assert rig.on("out") == [] and rig.pg.prepared == {}, "rolled back: nothing sent, nothing prepared"
    assert len(rig.proxy.queue) == 3 and rig.proxy.rt.store.deleted == [101, 102, 103]
    status = rig.proxy.status_extra()
    assert status["t2_timeouts"] == 1 and "deadline" in status["t2_last_rollback"], status
    assert rig.round() is Outcome.DELIVERED
    assert rig.bodies("out") == ["event 1", "event 2", "event 3"], "delivered later, in order, once"


def test_a_refused_send_rolls_back_then_the_poison_event_is_dead_lettered_in_a_t2(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker refuses event 7's message: the T2 is rollback-only (NJI 2.7.4) and rolls back; the batch goes
    one per T2; 7 fails alone once, then the bridge dead-letters it inside its next T2. Nothing is lost."""
    rig = Rig(monkeypatch, events=10)
    rig.put(5, 6, 7, 8)
    assert rig.round() is Outcome.EVENT_FAILED and rig.on("out") == [], "the whole batch rolled back"
    outcomes = [rig.round() for _ in range(5)]
    assert rig.bodies("out") == ["event 5", "event 6", "event 8"], outcomes
    dead = rig.on("nsjms.DLQ")
    assert len(dead) == 1 and "not authorized" in dead[0].headers["nsjms_dlq_reason"]
    assert len(rig.proxy.queue) == 0 and rig.proxy.isolating == 0
    assert rig.proxy.rt.store.deleted.count(107) == 3, "each attempt deleted it in its own branch"
    assert all(r.holders == 0 for r in rig.records.values())


class ManyTransport(RefusingTransport):
    """:class:`RefusingTransport` with the STOMP transport's batch write (``send_encoded_many``): records each call
    as (destination, frames, events mapped by then) and refuses like ``send_encoded``."""

    def __init__(self, inner: MemoryTransport, mapped: list[int]) -> None:
        super().__init__(inner)
        self.calls: list[tuple[str, int, int]] = []
        self.mapped = mapped

    def send_encoded_many(self, destination: Any, messages: Any, *, transaction: str) -> None:
        self.calls.append((str(destination), len(messages), self.mapped[0]))
        for encoded, persistent in messages:
            self.send_encoded(destination, encoded, persistent=persistent, transaction=transaction,
                              confirm=Confirm.PIPELINED)


def _chunked(rig: Rig, chunk: int, *, after_the_begin: bool = True) -> ManyTransport:
    """Chunks of ``chunk`` frames written through a :class:`ManyTransport`; ``after_the_begin``: each event is mapped
    once the T2's background BEGIN is in (a chunk is written only then: the chunks are then deterministic)."""
    mapped = [0]

    def counting(event: Any, destination: Destination) -> JmsMessage:
        deadline = time.monotonic() + 10
        while after_the_begin and not all(b.begun() for b in list(rig.out._early.values())):
            assert time.monotonic() < deadline, "the BEGIN never got its receipt"
            time.sleep(0.005)
        mapped[0] += 1
        return to_jms(event, destination)

    rig.out.to_jms = counting
    rig.out.send_chunk = chunk
    wire = ManyTransport(rig.transport, mapped)
    rig.wire = wire
    return wire


def test_a_t2s_frames_go_out_in_chunks_while_the_mapping_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 12: every ``send_chunk`` mapped frames are written at once (``send_encoded_many``) before the next
    event is mapped, so the broker takes them meanwhile; the last frame goes alone, receipted; a dead letter starts
    a run of its own (another destination); the order and the one STOMP transaction are kept."""
    rig = Rig(monkeypatch, events=8)
    wire = _chunked(rig, 3)
    rig.put(9, 10, 11, 12, 13, 14, 15, 16)                # 13 cannot be mapped: a dead letter
    assert rig.round() is Outcome.DELIVERED
    assert rig.bodies("out") == [f"event {i}" for i in (9, 10, 11, 12, 14, 15, 16)]
    assert len(rig.on("nsjms.DLQ")) == 1
    out, dlq = "/queue/out", "/queue/nsjms.DLQ"
    assert wire.calls == [(out, 3, 3), (out, 1, 6), (dlq, 1, 6), (out, 1, 6), (out, 1, 8)], wire.calls
    gtrid = rig.on("out")[0].headers[DEDUPE_PROPERTY].rsplit("/", 1)[0]
    ids = [m.headers[DEDUPE_PROPERTY] for m in rig.on("out")]
    assert ids == [f"{gtrid}/{i}" for i in (0, 1, 2, 3, 5, 6, 7)]
    assert rig.on("nsjms.DLQ")[0].headers[DEDUPE_PROPERTY] == f"{gtrid}/4"


def test_a_refused_frame_in_an_early_chunk_rolls_the_t2_back_for_its_content(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker refuses event 7's frame in a chunk written before the rest is mapped: the T2 rolls back at once
    (the later events are not mapped), the batch is narrowed down as for any refused message, nothing is lost."""
    rig = Rig(monkeypatch, events=10)
    wire = _chunked(rig, 1)
    rig.put(5, 6, 7, 8)
    assert rig.round() is Outcome.EVENT_FAILED and rig.on("out") == [], "the whole batch rolled back"
    assert wire.calls[-1] == ("/queue/out", 1, 3), "refused before event 8 was mapped"
    outcomes = [rig.round() for _ in range(5)]
    assert rig.bodies("out") == ["event 5", "event 6", "event 8"], outcomes
    dead = rig.on("nsjms.DLQ")
    assert len(dead) == 1 and "not authorized" in dead[0].headers["nsjms_dlq_reason"]
    assert len(rig.proxy.queue) == 0 and all(r.holders == 0 for r in rig.records.values())


def test_a_dead_letter_that_fails_too_ends_in_the_channel_dead_letter(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, events=1)
    real = rig.wire.send_encoded

    def refuse_all(destination: Any, encoded: EncodedMessage, **kw: Any) -> None:
        raise SendRefused("ERROR frame", str(destination), "not authorized")

    rig.wire.send_encoded = refuse_all  # type: ignore[method-assign]
    rig.put(1)
    for _ in range(POISON_ATTEMPTS):
        assert rig.round() is Outcome.EVENT_FAILED
    assert len(rig.proxy.queue) == 0 and rig.proxy.dead_lettered == 1
    assert "not authorized" in rig.proxy.last_dead_letter
    [(_, eid, details)] = rig.proxy.rt.dead_letters.queued     # kept in the channel's dead-letter store
    assert eid == 101 and "dead-letter destination either" in details["reason"]
    assert "not authorized" in details["exception"]
    rig.wire.send_encoded = real  # type: ignore[method-assign]


def test_broker_outage_requeues_without_counting_against_the_events(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, events=5)
    rig.broker.inject_fault("begin", BrokerUnavailable("broker down"))
    rig.put(1, 2)
    assert rig.round() is Outcome.RETRY
    assert len(rig.proxy.queue) == 2 and all(e.failures == 0 for e in rig.proxy.queue._all())
    assert "broker" in rig.proxy.status_extra()["failing"]
    rig.transport.connect()
    assert rig.round() is Outcome.DELIVERED
    assert rig.bodies("out") == ["event 1", "event 2"]


def test_a_stopped_bridge_rolls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, events=5)
    rig.running = False
    rig.put(1)
    assert rig.round() is Outcome.RETRY and len(rig.proxy.queue) == 1
    assert rig.out.status()["t2_rolled_back"] == 1


def test_decision_unknown_holds_the_entries_for_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, events=5)
    rig.t2.log.fail["Commit"] = LogDurabilityUnknown("fsync failed")
    rig.put(1, 2)
    assert rig.round() is Outcome.RETRY
    assert len(rig.proxy.queue) == 0, "kept out of the queue: recovery decides"
    status = rig.proxy.status_extra()
    assert list(status["t2_in_doubt"].values()) == [2] and "decision unknown" in status["failing"]
    assert rig.on("out") == [] and len(rig.pg.prepared) == 1, "left prepared for recovery"
    assert not rig.out.active(), "a disable_transaction is not blocked by it"
    # Recovery rolled it back (the queue rows are still there): the next batch puts them back first.
    rig.pg.prepared.clear()
    rig.proxy.rt.db.conn.queued = [101, 102]
    rig.put(3)
    assert rig.round() is Outcome.DELIVERED
    assert "t2_in_doubt" not in rig.proxy.status_extra()
    assert rig.bodies("out") == ["event 1", "event 2", "event 3"], "put back in their places"


def test_without_enable_transaction_the_proxy_pushes_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch)
    rig.proxy.qos[Q.ENABLE_TRANSACTION] = False
    assert TX.participant(rig.proxy) is None
    rig.proxy.qos[Q.ENABLE_TRANSACTION] = True
    rig.proxy.client_ior = "IOR:someone-else"
    assert TX.participant(rig.proxy) is None
    assert "not a bridge endpoint" in rig.proxy.status_extra()["t2_unavailable"]


def test_enable_transaction_is_refused_where_no_t2_can_run(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch)
    proxy = rig.proxy
    proxy.qos[Q.ENABLE_TRANSACTION] = False
    TX.check_honoured(proxy, {Q.ENABLE_TRANSACTION: True})          # its consumer is the bridge: accepted
    proxy.client_ior = "IOR:someone-else"
    with pytest.raises(Q.QoSError) as err:
        TX.check_honoured(proxy, {Q.ENABLE_TRANSACTION: True})
    assert [(p.code, p.name) for p in err.value.problems] == [("UNAVAILABLE_VALUE", Q.ENABLE_TRANSACTION)]
    proxy.connected = False
    TX.check_honoured(proxy, {Q.ENABLE_TRANSACTION: True})          # not connected yet: decided at delivery
    proxy.style = "PULL"
    with pytest.raises(Q.QoSError):
        TX.check_honoured(proxy, {Q.ENABLE_TRANSACTION: True})      # a pull supplier: no T2 (NJI 2.7.2)
    TX.check_honoured(proxy, {Q.ENABLE_TRANSACTION: False})


def test_the_channel_admin_properties_apply_when_the_proxy_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch)
    rig.proxy.extra = {}
    rig.proxy.channel.admin_props = {Q.TRANSACTION_EVENTS: 2, Q.TRANSACTION_TIMEOUT: 7}
    assert TX.settings(rig.proxy) == (2, 7.0)
    rig.put(1, 2, 3)
    assert rig.round() is Outcome.DELIVERED and rig.bodies("out") == ["event 1", "event 2"]


# ------------------------------------------------------------------------------- BridgeTransactionMgmt
class FakeServant:
    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.qos: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}

    def validate_qos(self, props: list[Any]) -> list[Any]:
        if self.refuse:
            raise CosNotification.UnsupportedQoS([])
        return []

    def set_qos(self, props: list[Any]) -> None:
        for p in props:
            self.qos[p.name] = p.value.value()

    def save_extra(self, **items: Any) -> None:
        self.extra.update(items)


class FakeOut:
    def __init__(self) -> None:
        self.busy = False

    def active(self) -> bool:
        return self.busy

    def status(self) -> dict[str, Any]:
        return {}


class Mgmt(TransactionMgmtMixin):
    def __init__(self, *, sequence: bool = False, out: Any = None, servant: FakeServant | None = None) -> None:
        self.id, self.to_jms_direction = 9, True
        self._lock = threading.RLock()
        self.tx_events = self.tx_timeout = 0
        self.t2_out = FakeOut() if out is None else out
        self.servant = servant or FakeServant()
        self.sequence = sequence
        self.saved: list[dict[str, Any]] = []

    def _save_settings(self, **extra: Any) -> None:
        self.saved.append(extra)

    def _proxy_servant(self) -> Any:
        return self.servant

    def _kind(self) -> str:
        return "SEQUENCE" if self.sequence else "STRUCTURED"


def test_enable_transaction_writes_the_properties_on_the_proxy() -> None:
    m = Mgmt(sequence=True)
    with pytest.raises(BTM.UnsupportedTransaction):
        m.enable_transaction(0, 10)
    m.enable_transaction(4, 30)
    assert m.servant.qos == {Q.ENABLE_TRANSACTION: True}
    assert m.servant.extra == {"transaction": {"sequences": 4, "timeout": 30}}
    assert m.saved == [{"tx_events": 4, "tx_timeout": 30}], "stored with the bridge first"
    with pytest.raises(BTM.TransactionAlreadyActive):
        m.enable_transaction(5, 30)


def test_enable_transaction_is_unsupported_without_a_t2_participant_or_on_a_best_effort_channel() -> None:
    m = Mgmt()
    m.t2_out = None                              # PULL channel endpoint, or a node without T2
    with pytest.raises(BTM.UnsupportedTransaction):
        m.enable_transaction(5, 0)
    m = Mgmt(servant=FakeServant(refuse=True))
    with pytest.raises(BTM.UnsupportedTransaction):
        m.enable_transaction(5, 0)
    assert m.saved == [] and m.tx_events == 0, "nothing stored"


def test_disable_during_an_active_t2_raises_and_takes_effect_when_it_ends() -> None:
    m = Mgmt()
    m.disable_transaction()                      # nothing enabled: nothing to do
    m.enable_transaction(3, 0)
    m.t2_out.busy = True
    with pytest.raises(BTM.TransactionActive):
        m.disable_transaction()
    assert m.servant.qos[Q.ENABLE_TRANSACTION] is True and m.transaction_status()["transaction_disable_pending"]
    m.t2_out.busy = False
    m._t2_idle()                                 # OutboundT2.on_idle: the T2 ended
    assert m.servant.qos[Q.ENABLE_TRANSACTION] is False and m.servant.extra["transaction"] is None
    assert m.tx_events == 0 and m.saved[-1] == {"tx_events": 0, "tx_timeout": 0}
    m.enable_transaction(2, 5)                   # enabled again
    m.disable_transaction()                      # idle: at once
    assert m.servant.qos[Q.ENABLE_TRANSACTION] is False


def test_a_pending_disable_that_fails_when_applied_lets_t2s_start_again(caplog: pytest.LogCaptureFixture) -> None:
    """While a disable is pending the bridge refuses new T2s (OutboundT2.draining); if applying it fails when the
    bridge becomes idle (the store is down), it is no longer pending, so the bridge's T2s are not refused for ever."""
    m = Mgmt()
    m.enable_transaction(3, 0)
    m.t2_out.busy = True
    with pytest.raises(BTM.TransactionActive):
        m.disable_transaction()
    assert m._disable_pending

    def broken(**extra: Any) -> None:
        raise RuntimeError("the store is down (injected)")
    m._save_settings = broken  # type: ignore[method-assign]
    m.t2_out.busy = False
    with caplog.at_level("ERROR", logger="nsjms.bridge"):
        m._t2_idle()
    assert not m._disable_pending and m.tx_events == 3
    assert "call it again" in caplog.text


def test_disable_clears_an_enable_transaction_the_proxy_inherited() -> None:
    m = Mgmt()
    m.servant.qos[Q.ENABLE_TRANSACTION] = True     # set on the channel before the bridge's proxy was made
    m.disable_transaction()
    assert m.servant.qos[Q.ENABLE_TRANSACTION] is False


def test_an_acknowledging_proxy_never_claims_a_t2(monkeypatch: pytest.MonkeyPatch) -> None:
    """An Ack proxy supplier pushes from its own loop (resend window), never through ``_deliver``: it must refuse
    EnableTransaction rather than accept it and deliver without a transaction."""
    rig = Rig(monkeypatch)
    rig.proxy.acknowledging = True
    assert TX.participant(rig.proxy) is None
    assert "acknowledging" in rig.proxy.status_extra()["t2_unavailable"]
    rig.proxy.qos[Q.ENABLE_TRANSACTION] = False
    with pytest.raises(Q.QoSError):
        TX.check_honoured(rig.proxy, {Q.ENABLE_TRANSACTION: True})


class InboundMgmt(Mgmt):
    """A JMS → channel bridge: the channel's pull proxy consumer drives the T2s."""

    def __init__(self, *, pull: bool = True, t2: bool = True) -> None:
        super().__init__(out=False)
        self.to_jms_direction, self.t2_out = False, None
        self.pull = pull
        self.rt = type("Rt", (), {"t2": object() if t2 else None})()
        self.servant._t2 = type("Driver", (), {"active": False})()

    def supports_transaction(self) -> bool:
        return self.pull


def test_inbound_enable_writes_the_pull_proxys_properties_and_refuses_what_nji_excludes() -> None:
    for m in (InboundMgmt(pull=False), InboundMgmt(t2=False)):
        with pytest.raises(BTM.UnsupportedTransaction):
            m.enable_transaction(5, 10)          # the bridge pushes into the channel (NJI 2.7.2), or no T2 here
        assert m.saved == [] and m.servant.qos == {}
    m = InboundMgmt()
    m.enable_transaction(5, 10)
    assert m.servant.qos == {Q.ENABLE_TRANSACTION: True}
    assert m.servant.extra == {"transaction": {"events": 5, "timeout": 10}}
    with pytest.raises(BTM.TransactionAlreadyActive):
        m.enable_transaction(5, 10)


def test_inbound_disable_during_a_t2_raises_and_no_further_t2_starts() -> None:
    m = InboundMgmt()
    m.enable_transaction(5, 10)
    m.servant._t2.active = True
    with pytest.raises(BTM.TransactionActive):
        m.disable_transaction()
    assert m.servant.qos[Q.ENABLE_TRANSACTION] is False, "the proxy reads it before its next T2"
    assert m.tx_events == 0
    m.servant._t2.active = False
    m.enable_transaction(2, 0)
    m.disable_transaction()                      # idle: at once, no exception
    assert m.servant.qos[Q.ENABLE_TRANSACTION] is False


def test_inbound_disable_reads_active_after_it_wrote_the_proxy() -> None:
    """Review finding: the driver read EnableTransaction (still TRUE) and became active while the disable was
    being written; the disable had read ``active`` before its write and returned success, and that T2 then ran.
    Now ``active`` is read after the write: the round that read the old value is reported (TransactionActive)."""
    m = InboundMgmt()
    m.enable_transaction(5, 10)
    written = m.servant.set_qos

    def set_qos(props: list[Any]) -> None:
        m.servant._t2.active = True              # the driver's round: active, read the old settings
        written(props)

    m.servant.set_qos = set_qos
    with pytest.raises(BTM.TransactionActive):
        m.disable_transaction()
    assert m.servant.qos[Q.ENABLE_TRANSACTION] is False and m.tx_events == 0


def test_send_branch_begin_failure_is_branch_unavailable_and_abort_failures_are_reported() -> None:
    broker = MemoryBroker("t2u-begin")
    with MemoryTransport(broker=broker) as transport:
        broker.inject_fault("begin", BrokerUnavailable("broker down"))
        branch = SendBranch(transport)
        with pytest.raises(BranchUnavailable, match="BEGIN"):
            branch.begin(branch_xid(new_gtrid(NodeId("n1")), "broker"))
        branch.rollback()                                   # nothing begun: nothing to roll back
    with MemoryTransport(broker=MemoryBroker("t2u-abort2")) as transport:
        branch, _ = _branch(transport)
        transport.broker.inject_fault("abort", UnconfirmedOutcome("no receipt", "abort"))
        with pytest.raises(BranchUnavailable, match="ABORT"):
            branch.rollback()                               # unknown: the coordinator leaves it to recovery


class GoneMgmt(Mgmt):
    """The bridge's proxy is gone (its channel destroyed): ``_proxy_servant`` raises as the node's does."""

    def _proxy_servant(self) -> Any:
        raise CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO)


def test_a_gone_proxy_is_handled_through_the_corba_call_boundary(caplog: pytest.LogCaptureFixture) -> None:
    """txmgmt's three CORBA clauses went behind router.corbacall: a gone proxy still reads as not enabled and not
    active, and a disable still clears the bridge's own settings (logged, not raised)."""
    m = GoneMgmt()
    assert m._proxy_enabled() is False and m._inbound_active() is False
    m.tx_events = 3
    with caplog.at_level("WARNING", logger="nsjms.bridge"):
        m._apply_disable()
    assert m.tx_events == 0 and m.saved[-1] == {"tx_events": 0, "tx_timeout": 0}
    assert "gone" in caplog.text and "could not clear EnableTransaction" in caplog.text


# ------------------------------------------------------------------------------------------------ pipelining
class GatedCommit:
    """The broker's STOMP COMMIT held until ``gate`` opens (the first ``held`` commits), recording the order."""

    def __init__(self, rig: Rig, held: int = 1) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.held = held
        self.order: list[str] = []
        self.inner = rig.transport.commit
        rig.wire.commit = self.commit  # type: ignore[method-assign]

    def commit(self, tx: str) -> None:
        self.order.append(tx)
        if len(self.order) <= self.held:
            self.entered.set()
            assert self.gate.wait(10), "the test never opened the gate"
        self.inner(tx)


def test_the_next_batch_runs_while_the_previous_t2_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pipelining: once a T2's decision is durable its phase two runs on the proxy's completer and the proxy's
    next T2 goes ahead (taken, sent, decided); the broker commits the batches in the order they were taken."""
    rig = Rig(monkeypatch, events=2)
    gated = GatedCommit(rig)
    rig.put(1, 2, 3, 4)
    first = rig.proxy.queue.take(2)
    assert rig.proxy._deliver(first) is Outcome.DELIVERED       # decided; its broker COMMIT is held
    assert gated.entered.wait(10)
    assert rig.bodies("out") == [] and rig.out.active(), "T2 1 is in phase two, nothing committed at the broker"
    assert TX.completer(rig.proxy).pending() == 1
    second = rig.proxy.queue.take(2)
    assert rig.proxy._deliver(second) is Outcome.DELIVERED      # T2 2 decided while T2 1 still commits
    decided = [g for g, t in rig.t2.log.live().items() if t.commit is not None]
    assert len(decided) == 2, "both COMMIT records are durable, neither T2 ended"
    assert len(gated.order) == 1, "T2 2's broker COMMIT waits for T2 1's phase two"
    gated.gate.set()
    assert TX.drain(rig.proxy, 10)
    assert rig.bodies("out") == ["event 1", "event 2", "event 3", "event 4"]
    assert rig.t2.log.live() == {} and rig.t2.coordinator.in_flight() == frozenset()
    assert TX.state(rig.proxy).committed == 2 and not rig.out.active()


def test_a_rollback_behind_a_committing_t2_puts_its_entries_back_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """T2 2 rolls back while T2 1 (decided) is still in phase two: T2 2's entries go back to the head of the
    queue (T2 1's are no longer there: they commit), and the next round delivers them in order."""
    rig = Rig(monkeypatch, events=2)
    gated = GatedCommit(rig)
    rig.put(1, 2, 3, 4, 5)
    assert rig.proxy._deliver(rig.proxy.queue.take(2)) is Outcome.DELIVERED
    assert gated.entered.wait(10)
    rig.running = False                                        # the bridge stops: T2 2 rolls back (an outage)
    assert rig.proxy._deliver(rig.proxy.queue.take(2)) is Outcome.RETRY
    assert [e.record.seq for e in rig.proxy.queue.take(5)] == [3, 4, 5]
    rig.put(3, 4, 5)
    rig.running = True
    gated.gate.set()
    assert TX.drain(rig.proxy, 10)
    assert rig.round() is Outcome.DELIVERED and rig.round() is Outcome.DELIVERED
    assert rig.bodies("out") == ["event 1", "event 2", "event 3", "event 4", "event 5"]


def test_stopping_the_push_loop_waits_for_phase_two(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy's push loop drains its completer before it returns (a teardown or a shutdown never leaves a
    decided T2's phase two behind it in the process)."""
    rig = Rig(monkeypatch, events=2)
    gated = GatedCommit(rig)
    rig.put(1, 2)
    assert rig.proxy._deliver(rig.proxy.queue.take(2)) is Outcome.DELIVERED
    assert gated.entered.wait(10)
    assert not TX.drain(rig.proxy, 0.01), "drain returned while phase two was held"   # no timer decides this
    assert rig.bodies("out") == []
    gated.gate.set()
    assert TX.drain(rig.proxy)                                 # what _push_loop's finally does
    assert rig.bodies("out") == ["event 1", "event 2"]


def test_a_refused_message_in_the_next_t2_leaves_the_decided_one_committed(monkeypatch: pytest.MonkeyPatch) -> None:
    """T2 1 is decided, its broker COMMIT not written yet (held); T2 2 on the same connection sends a receipt-less
    frame the broker refuses with an ERROR that has no receipt id (what the STOMP dispatcher books with
    ``frame_refused``). Only T2 2 is marked: it rolls back for its content, and T2 1 still commits at the broker
    (before: every open transaction was marked, T2 1's COMMIT became an ABORT after its decision was durable)."""
    rig = Rig(monkeypatch, events=2)
    gated = GatedCommit(rig)
    book = rig.transport._book

    def send_encoded(destination: Any, encoded: EncodedMessage, **kw: Any) -> None:
        if b"poison" in encoded.body and kw.get("confirm") is not Confirm.CONFIRMED:
            book.frame_written(kw.get("transaction"), None)            # written; the broker answers with ERROR
            book.frame_refused("User anonymous is not authorized to write", None)
            return
        rig.transport.send_encoded(destination, encoded, **kw)
    rig.wire.send_encoded = send_encoded  # type: ignore[method-assign]
    rig.put(1, 2, 7, 8)
    assert rig.proxy._deliver(rig.proxy.queue.take(2)) is Outcome.DELIVERED       # T2 1 decided, COMMIT held
    assert gated.entered.wait(10)
    assert rig.proxy._deliver(rig.proxy.queue.take(2)) is Outcome.EVENT_FAILED    # T2 2: event 7 refused
    assert rig.proxy.isolating == 2
    gated.gate.set()
    assert TX.drain(rig.proxy, 10)
    assert rig.bodies("out") == ["event 1", "event 2"]
    assert TX.state(rig.proxy).committed == 1 and rig.t2.log.live() == {}
    assert [e.record.seq for e in rig.proxy.queue.take(5)] == [7, 8]


def test_a_pending_disable_refuses_new_t2s_so_it_applies_under_steady_traffic(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A disable_transaction arrives while T2 1 is in phase two and events keep coming: the bridge refuses the next
    T2 as an outage (its events go back, nothing counts against them), so T2 1's end leaves the bridge idle and the
    disable applies (before: T2 2 joined the bridge's T2s before T2 1 ended, the bridge was never idle under a
    backlog and the disable never took effect)."""
    rig = Rig(monkeypatch, events=2)
    gated = GatedCommit(rig)
    pending = [False]
    idle: list[bool] = []
    rig.out.draining = lambda: pending[0]
    rig.out.on_idle = lambda: idle.append(pending[0])
    rig.put(1, 2, 3, 4)
    assert rig.proxy._deliver(rig.proxy.queue.take(2)) is Outcome.DELIVERED       # T2 1 in phase two
    assert gated.entered.wait(10)
    pending[0] = True                                                             # disable_transaction: pending
    assert rig.proxy._deliver(rig.proxy.queue.take(2)) is Outcome.RETRY           # no T2 2
    assert rig.proxy.isolating == 0
    assert "disable_transaction is pending" in TX.state(rig.proxy).last_rollback
    gated.gate.set()
    assert TX.drain(rig.proxy, 10)
    assert idle == [True], "T2 1's end left the bridge idle: the pending disable applies"
    assert not rig.out.active() and rig.out.rolled_back == 0
    assert rig.bodies("out") == ["event 1", "event 2"]
    back = rig.proxy.queue.take(5)
    assert [e.record.seq for e in back] == [3, 4] and [e.failures for e in back] == [0, 0]


# ------------------------------------------------------------------------------ the last frame's receipt
class GatedLastFrame:
    """The batch's last (receipted) frame held until ``release`` is set, the wire's calls recorded in order."""

    def __init__(self, rig: Rig) -> None:
        self.release = threading.Event()
        self.calls: list[str] = []
        self.rig = rig
        self.inner_send, self.inner_abort = rig.wire.send_encoded, rig.transport.abort
        rig.wire.send_encoded = self.send_encoded  # type: ignore[method-assign]
        rig.wire.abort = self.abort  # type: ignore[method-assign]

    def send_encoded(self, destination: Any, encoded: EncodedMessage, **kw: Any) -> None:
        if kw.get("confirm") is Confirm.CONFIRMED:
            assert self.release.wait(10), "the last frame was never released"
            self.calls.append("last frame receipted")
        self.inner_send(destination, encoded, **kw)

    def abort(self, tx: str) -> None:
        self.calls.append("abort" if self.release.is_set() else "abort while the last frame is held")
        self.release.set()                     # (an ABORT that did not wait: let the held frame go, the test fails)
        self.inner_abort(tx)


def release_when_awaited(monkeypatch: pytest.MonkeyPatch, release: threading.Event, *, last: bool) -> None:
    """Open ``release`` at the moment the T2's thread starts waiting for the broker branch's background frame
    (the last SEND with ``last``, else the BEGIN): a gate no timer opens, so an ABORT that does not wait for that
    frame runs while it is still held, whatever the machine's load."""
    wait = txbranch._Background.wait

    def waited(self: Any) -> BaseException | None:
        if (self.index >= 0) == last:
            release.set()
        return wait(self)
    monkeypatch.setattr(txbranch._Background, "wait", waited)


def test_postgresql_prepares_while_the_broker_takes_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The PostgreSQL branch's PREPARE runs while the last frame's receipt is outstanding; the broker branch
    votes only once that receipt is in (nothing is decided before it)."""
    rig = Rig(monkeypatch, events=3)
    gated = GatedLastFrame(rig)
    seen: list[list[str]] = []
    original = TX.PgBranch

    def branch(conn: Any, name: str) -> Any:
        b = original(conn, name)
        prepare = b.prepare

        def prepared() -> None:
            prepare()
            seen.append(list(gated.calls))               # what the wire had done when PostgreSQL was prepared
            gated.release.set()
        b.prepare = prepared
        return b

    monkeypatch.setattr(TX, "PgBranch", branch)
    rig.put(1, 2, 3)
    assert rig.round() is Outcome.DELIVERED
    assert seen == [[]], "PostgreSQL prepared before the last frame's receipt came back"
    assert gated.calls == ["last frame receipted"] and rig.bodies("out") == ["event 1", "event 2", "event 3"]


def test_a_rollback_waits_for_the_last_frame_before_its_abort(monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL votes no while the last frame is in flight: the broker branch's ABORT goes out only after that
    frame (an ABORT overtaking it would leave a SEND for a transaction the broker no longer knows)."""
    rig = Rig(monkeypatch, events=2)
    gated = GatedLastFrame(rig)
    original = TX.PgBranch

    def branch(conn: Any, name: str) -> Any:
        b = original(conn, name)

        def refuse() -> None:
            raise PrepareFailed("max_prepared_transactions reached (injected)")
        b.prepare = refuse
        return b

    monkeypatch.setattr(TX, "PgBranch", branch)
    release_when_awaited(monkeypatch, gated.release, last=True)   # released only once the rollback waits for it
    rig.put(1, 2)
    assert rig.round() is Outcome.RETRY
    assert gated.calls == ["last frame receipted", "abort"]
    assert rig.bodies("out") == [] and [e.record.seq for e in rig.proxy.queue.take(5)] == [1, 2]


def test_a_refused_last_frame_is_a_content_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker refuses the batch's last message (its receipt is awaited in the background): the broker branch
    votes no with ``content``, so the proxy isolates the batch as for any refused frame."""
    rig = Rig(monkeypatch, events=3)
    rig.put(5, 6, 7)                                    # event 7 is refused, and it is the last of the batch
    assert rig.round() is Outcome.EVENT_FAILED
    assert rig.proxy.isolating == 3 and rig.bodies("out") == []
    assert [e.record.seq for e in rig.proxy.queue.take(5)] == [5, 6, 7]


# ------------------------------------------------------------------------------------- the BEGIN's receipt
class GatedBegin:
    """The broker's STOMP BEGIN held until ``release`` is set; the wire's calls recorded in order."""

    def __init__(self, rig: Rig, error: Exception | None = None) -> None:
        self.release = threading.Event()
        self.calls: list[str] = []
        self.error = error
        self.inner_begin, self.inner_abort = rig.transport.begin, rig.transport.abort
        rig.wire.begin = self.begin  # type: ignore[method-assign]
        rig.wire.abort = self.abort  # type: ignore[method-assign]

    def begin(self) -> str:
        assert self.release.wait(10), "the BEGIN was never released"
        if self.error is not None:
            self.calls.append("begin failed")
            raise self.error
        self.calls.append("begun")
        return str(self.inner_begin())

    def abort(self, tx: str) -> None:
        self.calls.append("abort" if self.release.is_set() else "abort while the BEGIN is held")
        self.inner_abort(tx)


class ReleasingStore(FakeStore):
    """Records what the BEGIN had done when the channel deleted the batch's queue rows, then releases it."""

    def __init__(self, gated: GatedBegin, fail: bool = False) -> None:
        super().__init__()
        self.gated, self.fail = gated, fail
        self.seen: list[list[str]] = []

    def delete_deliveries(self, conn: Any, cid: int, aid: int, pid: int, ids: list[int], **ledger: Any) -> None:
        self.seen.append(list(self.gated.calls))
        if self.fail:                 # the BEGIN stays held until the rollback waits for it (release_when_awaited)
            raise RuntimeError("the database went away (injected)")
        self.gated.release.set()
        super().delete_deliveries(conn, cid, aid, pid, ids)


def test_the_broker_begin_overlaps_the_channels_sql(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker branch is enlisted first and its BEGIN's receipt is awaited in the background: the channel
    deletes the queue rows while the BEGIN is outstanding; the SENDs wait for it."""
    rig = Rig(monkeypatch, events=2)
    gated = GatedBegin(rig)
    store = rig.proxy.rt.store = ReleasingStore(gated)
    rig.put(1, 2)
    assert rig.round() is Outcome.DELIVERED
    assert store.seen == [[]], "the queue rows were deleted while the BEGIN was outstanding"
    assert rig.bodies("out") == ["event 1", "event 2"]


def test_a_failed_background_begin_is_an_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, events=2)
    gated = GatedBegin(rig, BrokerUnavailable("connection refused (injected)"))
    gated.release.set()
    rig.put(1, 2)
    assert rig.round() is Outcome.RETRY
    assert rig.proxy.isolating == 0, "an outage never isolates the batch"
    assert rig.bodies("out") == [] and [e.record.seq for e in rig.proxy.queue.take(5)] == [1, 2]
    assert rig.pg.prepared == {} and rig.t2.coordinator.in_flight() == frozenset()


def test_a_rollback_waits_for_the_background_begin_before_its_abort(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, events=2)
    gated = GatedBegin(rig)
    rig.proxy.rt.store = ReleasingStore(gated, fail=True)
    release_when_awaited(monkeypatch, gated.release, last=False)  # released only once the rollback waits for it
    rig.put(1, 2)
    try:
        assert rig.round() is Outcome.RETRY
        assert gated.calls == ["begun", "abort"]
    finally:
        gated.release.set()               # (a rollback that did not wait: let the held BEGIN end)
    assert [e.record.seq for e in rig.proxy.queue.take(5)] == [1, 2]


def test_a_phase_two_that_raises_is_handed_to_recovery_and_not_counted_committed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """txn.complete() raises on the completer (the log breaks at END): the T2 leaves the coordinator's in-flight
    set at once (recovery finishes it from its COMMIT record, its prepared PostgreSQL branch does not wait for a
    restart), the bridge no longer counts it active, and the proxy does not count it committed."""
    rig = Rig(monkeypatch, events=2)
    rig.t2.log.fail["End"] = RuntimeError("the log broke (injected)")
    rig.put(1, 2)
    assert rig.round() is Outcome.DELIVERED
    live = rig.t2.log.live()
    assert len(live) == 1 and next(iter(live.values())).commit is not None     # decided, no END: recovery's
    assert rig.t2.coordinator.in_flight() == frozenset()
    st = TX.state(rig.proxy)
    assert st.committed == 0 and st.phase_two_failed == 1 and not rig.out.active()
    assert TX.status(rig.proxy)["t2_phase_two_failed"] == 1
    assert rig.out.committed == 0 and rig.out.rolled_back == 0


def test_a_proxy_holds_at_most_two_t2s(monkeypatch: pytest.MonkeyPatch) -> None:
    """T2 1 in phase two (its COMMIT held), T2 2 decided and queued behind it: T2 3 does not begin (no session, no
    prepared transaction) until T2 1 has ended. Two T2s per proxy at most (before: T2 3 ran its phase one and was
    decided too, blocking in submit: three sessions and three prepared transactions per proxy)."""
    rig = Rig(monkeypatch, events=1)
    gated = GatedCommit(rig)
    waiting = threading.Event()
    room = getattr(TX.Completer, "wait_for_room", None)

    def wait_for_room(self: TX.Completer) -> None:
        if self.pending() > 1:
            waiting.set()
        if room is not None:
            room(self)
    monkeypatch.setattr(TX.Completer, "wait_for_room", wait_for_room, raising=False)
    rig.put(1, 2, 3)
    assert rig.proxy._deliver(rig.proxy.queue.take(1)) is Outcome.DELIVERED        # T2 1: phase two held
    assert gated.entered.wait(10)
    assert rig.proxy._deliver(rig.proxy.queue.take(1)) is Outcome.DELIVERED        # T2 2: decided, queued
    third = threading.Thread(target=lambda: rig.proxy._deliver(rig.proxy.queue.take(1)))
    third.start()
    coordinator = rig.t2.coordinator
    pause = threading.Event()
    for _ in range(1000):                          # until T2 3 waits for room, or (before) it ran its phase one
        if waiting.is_set() or len(coordinator.in_flight()) > 2:
            break
        pause.wait(0.01)
    assert len(coordinator.in_flight()) == 2 and waiting.is_set(), "a third T2 began behind two"
    gated.gate.set()
    third.join(10)
    assert TX.drain(rig.proxy, 10)
    assert rig.bodies("out") == ["event 1", "event 2", "event 3"]


def test_a_failing_phase_two_job_does_not_stop_the_completer() -> None:
    """A job that raises (a bug) is logged; the completer runs the next ones and drain() still ends."""
    completer = TX.Completer("t2-complete-test")
    ran: list[int] = []

    def bad() -> None:
        raise KeyboardInterrupt("injected")

    completer.submit(bad)
    completer.submit(lambda: ran.append(1))
    assert completer.drain(10) and ran == [1] and completer.pending() == 0


def test_a_chunk_waits_for_no_begin_receipt_mapping_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The T2's background BEGIN has no receipt yet (held until the 5th event is mapped): the chunks due after the
    2nd and 4th event are not written (writing would wait for that receipt); mapping goes on and the first chunk
    written, once the BEGIN is in, holds every frame mapped so far. Order and content are unchanged."""
    rig = Rig(monkeypatch, events=8)
    wire = _chunked(rig, 2, after_the_begin=False)
    gated = GatedBegin(rig)
    counting = rig.out.to_jms

    def releasing(event: Any, destination: Destination) -> JmsMessage:
        msg = counting(event, destination)
        if wire.mapped[0] == 5:
            gated.release.set()
        return msg

    rig.out.to_jms = releasing
    rig.put(1, 2, 3, 4, 5, 6, 8, 9)                         # (7 is refused by the broker twin)
    assert rig.round() is Outcome.DELIVERED, rig.out.status()
    assert rig.bodies("out") == [f"event {i}" for i in (1, 2, 3, 4, 5, 6, 8, 9)]
    assert wire.calls and wire.calls[0][2] >= 5 and wire.calls[0][1] >= 5, wire.calls
    assert sum(n for _, n, _ in wire.calls) == 7, "every frame but the receipted last one"


# ------------------------------------------------------------------------------------ a broker out of a resource
_STORE_FULL = BrokerError("Persistent store is Full, 100% of 1048576. Stopping producer (ID:h-1:1:1:1) to prevent "
                          "flooding queue://out. See http://activemq.apache.org/producer-flow-control.html for more "
                          "info (blocking for: 0s)",
                          "javax.jms.ResourceAllocationException: Persistent store is Full, 100% of 1048576.")
_DISK_FULL = BrokerError("No space left on device", "java.io.IOException: No space left on device")


@pytest.mark.parametrize("full", [_STORE_FULL, _DISK_FULL], ids=["store-usage-limit", "enospc"])
def test_a_full_broker_store_is_an_outage_nothing_dead_lettered_nothing_deleted(
        monkeypatch: pytest.MonkeyPatch, full: BrokerError) -> None:
    """Issue 31: ActiveMQ answers every SEND (the dead letter's too) with a resource refusal. The T2s roll back as
    an outage: the events stay queued in order, no attempt counts against them, nothing is isolated nor
    dead-lettered however long it lasts; once the broker has room again every event is delivered."""
    rig = Rig(monkeypatch, events=10)
    rig.put(5, 6, 8)
    for _ in range(POISON_ATTEMPTS + 2):
        rig.broker.inject_fault("send", full)
        assert rig.round() is Outcome.RETRY
        assert [e.record.seq for e in rig.proxy.queue._all()] == [5, 6, 8]
        assert all(e.failures == 0 for e in rig.proxy.queue._all()) and rig.proxy.isolating == 0
        assert RESOURCE_MARK in rig.proxy.failing, rig.proxy.failing
    assert rig.proxy.dead_lettered == 0 and rig.on("nsjms.DLQ") == [] and rig.on("out") == []
    assert rig.proxy.rt.store.deleted.count(105) == POISON_ATTEMPTS + 2, "each rolled-back branch, none committed"
    assert rig.round() is Outcome.DELIVERED
    assert rig.bodies("out") == ["event 5", "event 6", "event 8"] and len(rig.proxy.queue) == 0


def test_a_resource_refusal_found_at_prepare_is_not_the_batchs_content() -> None:
    """The ERROR for a receipt-less SEND arrives asynchronously and marks the transaction in the book; a resource
    refusal there votes no as an outage (content False), a refusal of the frame as content."""
    with MemoryTransport(broker=MemoryBroker("t2u-full")) as transport:
        branch, _ = _branch(transport)
        branch.send("/queue/b", _frame("one"), persistent=True, last=True)
        transport._book.mark_rollback_only(_STORE_FULL.message)
        with pytest.raises(PrepareFailed, match="Persistent store is Full") as err:
            branch.prepare()
        assert getattr(err.value, "content", None) is False and RESOURCE_MARK in str(err.value)
