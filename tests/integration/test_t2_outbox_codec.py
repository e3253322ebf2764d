"""The outbox stores an encoded message with its codec's name (migration 0011,
router.routing.t2.transactions.OutboxResender), over a real PostgreSQL, a real ActiveMQ and the real file journal.

* a row written before the migration (the old column list: the codec column's default names the STOMP codec) is
  re-sent after it, byte for byte, with the same dedupe id;
* rows of one T2 naming the broker connection's codec, another codec of the node and a codec the node does not
  have: the first two arrive at their destination with their dedupe ids, the third at the dead-letter destination
  with the reason, its body and its dedupe id (counted at an independent consumer: nothing lost).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import stomp

from router.db import Database
from router.db.migrate import load, run
from router.jms.codec import SimpleCodec
from router.jms.model import BodyType, Destination, JmsMessage, JmsType, Typed
from router.jms.transport import open_transport
from router.mapping.stomp_codec import STOMP_CODEC, StompCodec, node_codecs
from router.routing.t2.transactions import OUTBOX_DEFAULT_CODEC, NodeTransactions, OutboxRow, outbox_insert, outbox_rows
from xa.pg import PgBranch
from xa.xid import dedupe_id

from bridgekit import row_count
from t2kit import Crash, SendBranch

pytestmark = pytest.mark.integration


def _node(tmp_path: Path, db: Database, dsn: str, broker_url: str, dead_letter: Destination) -> NodeTransactions:
    return NodeTransactions("n1", tmp_path, db, dsn, codecs=node_codecs(), dead_letter=dead_letter,
                            transport=lambda: open_transport(broker_url, codec=StompCodec()))


class _Inbox(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.frames: list[Any] = []

    def on_message(self, frame: Any) -> None:
        self.frames.append(frame)


def _consume(broker_url: str, queue: str, want: int) -> list[Any]:
    """``want`` messages of ``queue`` through stomp.py (an independent client), then none more."""
    import time

    host, port = broker_url.removeprefix("stomp://").rsplit(":", 1)
    conn = stomp.Connection12([(host, int(port))], auto_content_length=False, auto_decode=False)
    inbox = _Inbox()
    conn.set_listener("inbox", inbox)
    conn.connect(wait=True)
    try:
        conn.subscribe(f"/queue/{queue}", id="1", ack="auto")
        deadline = time.monotonic() + 30
        while len(inbox.frames) < want and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(inbox.frames) == want, f"{len(inbox.frames)} of {want} messages arrived at {queue}"
        time.sleep(0.5)                      # a duplicate would arrive right behind
        assert len(inbox.frames) == want, "more messages than re-sent"
        return list(inbox.frames)
    finally:
        conn.disconnect()


def _crash_after_broker_prepare(node: NodeTransactions, db: Database, write: Any) -> str:
    """A T2 whose PostgreSQL branch committed and whose process died at the broker commit; ``write(conn, gtrid)``
    writes its outbox rows in the branch."""
    txn = node.coordinator.begin(30)
    with db.branch() as conn:
        txn.enlist(PgBranch(conn, "pg"))
        write(conn, txn.gtrid)
        txn.enlist(SendBranch(crash="broker commit"))
        with pytest.raises(Crash):
            txn.commit()
    return txn.gtrid


def test_the_default_codec_is_the_stomp_codec() -> None:
    assert OUTBOX_DEFAULT_CODEC == STOMP_CODEC == StompCodec().name
    sql = next(m.sql for m in load() if m.version == 11)
    assert f"DEFAULT '{STOMP_CODEC}'" in sql


def test_a_row_written_before_the_migration_resends_with_the_same_dedupe_id(
        tmp_path: Path, fresh_db: str, broker_url: str) -> None:
    queue = f"codec.old.{uuid.uuid4().hex[:8]}"
    with psycopg.connect(fresh_db) as conn:
        run(conn, [m for m in load() if m.version <= 10])            # the schema before migration 0011
    db = Database(fresh_db, 4)
    db.open(migrate=False)
    try:
        node = _node(tmp_path, db, fresh_db, broker_url, Destination("queue", f"codec.dlq.{uuid.uuid4().hex[:8]}"))
        headers: dict[str, str] = {}

        def old_writer(conn: Any, gtrid: str) -> None:
            encoded = StompCodec().encode(JmsMessage(BodyType.TEXT, "before 0011", properties={
                "n": Typed(JmsType.INT, 7), "nsjms_dedupe_id": Typed(JmsType.STRING, dedupe_id(gtrid, 0))}))
            headers.update(encoded.headers, persistent="true")
            conn.execute("INSERT INTO nsjms_outbox(gtrid, idx, dedupe_id, bridge_id, destination, headers, body) "
                         "VALUES (%s, 0, %s, 7, %s, %s::jsonb, %s)",     # the column list of the code before 0011
                         (gtrid, dedupe_id(gtrid, 0), f"/queue/{queue}", json.dumps(headers), encoded.body))

        gtrid = _crash_after_broker_prepare(node, db, old_writer)
        node.log.close()
        assert db.migrate() == [m.version for m in load() if m.version >= 11]   # 0011 and every later one
        with psycopg.connect(fresh_db) as conn:
            [row] = outbox_rows(conn, gtrid)
        assert row.codec == STOMP_CODEC and dict(row.headers) == headers

        restarted = _node(tmp_path, db, fresh_db, broker_url, Destination("queue", "unused"))
        try:
            report = restarted.start(background=False)
            assert report.resent == [f"{gtrid}/stomp"] and report.errors == []
            [got] = _consume(broker_url, queue, 1)
            assert got.headers["nsjms_dedupe_id"] == dedupe_id(gtrid, 0)
            assert got.body == b"before 0011"
            message = StompCodec().decode(got.headers, got.body)
            assert message.properties["n"] == Typed(JmsType.INT, 7)          # the stored typed property, as stored
            assert restarted.resender.dead_lettered == 0
        finally:
            restarted.close()
    finally:
        db.close()


@pytest.fixture
def db(fresh_db: str) -> Iterator[Database]:
    database = Database(fresh_db, 4)
    database.open()
    yield database
    database.close()


def test_rows_are_resent_through_the_codec_they_name_and_an_unknown_codec_is_dead_lettered(
        tmp_path: Path, db: Database, fresh_db: str, broker_url: str) -> None:
    queue = f"codec.mix.{uuid.uuid4().hex[:8]}"
    dlq = f"codec.dlq.{uuid.uuid4().hex[:8]}"
    node = _node(tmp_path, db, fresh_db, broker_url, Destination("queue", dlq))

    def rows(conn: Any, gtrid: str) -> None:
        def props(i: int) -> dict[str, Typed]:
            return {"nsjms_dedupe_id": Typed(JmsType.STRING, dedupe_id(gtrid, i)),
                    "origin": Typed(JmsType.STRING, f"row {i}")}
        stomp_enc = StompCodec().encode(JmsMessage(BodyType.TEXT, "stomp row", properties=props(0)))
        simple_enc = SimpleCodec().encode(JmsMessage(BodyType.BYTES, b"simple row", properties=props(1)))
        outbox_insert(conn, [
            OutboxRow(gtrid, 0, dedupe_id(gtrid, 0), 7, f"/queue/{queue}", {**stomp_enc.headers, "persistent": "true"},
                      stomp_enc.body, STOMP_CODEC),
            OutboxRow(gtrid, 1, dedupe_id(gtrid, 1), 7, f"/queue/{queue}",
                      {**simple_enc.headers, "persistent": "true"}, simple_enc.body, SimpleCodec.name),
            OutboxRow(gtrid, 2, dedupe_id(gtrid, 2), 7, f"/queue/{queue}", {"x-wire": "opaque"}, b"\x00avro\xff",
                      "avro-v9"),
        ])

    gtrid = _crash_after_broker_prepare(node, db, rows)
    node.log.close()
    with psycopg.connect(fresh_db) as conn:
        assert [r.codec for r in outbox_rows(conn, gtrid)] == [STOMP_CODEC, "simple", "avro-v9"]

    restarted = _node(tmp_path, db, fresh_db, broker_url, Destination("queue", dlq))
    try:
        report = restarted.start(background=False)
        assert report.resent == [f"{gtrid}/stomp"] and report.errors == []
        got = _consume(broker_url, queue, 2)
        assert [f.headers["nsjms_dedupe_id"] for f in got] == [dedupe_id(gtrid, 0), dedupe_id(gtrid, 1)]
        assert [f.headers["origin"] for f in got] == ["row 0", "row 1"]
        assert got[0].body == b"stomp row"
        assert got[1].body == b"simple row" and "content-length" in got[1].headers   # a BytesMessage still
        [dead] = _consume(broker_url, dlq, 1)
        assert dead.headers["nsjms_dedupe_id"] == dedupe_id(gtrid, 2) and dead.body == b"\x00avro\xff"
        assert "'avro-v9', which this node does not have" in dead.headers["nsjms_dlq_reason"]
        assert dead.headers["nsjms_dlq_codec"] == "avro-v9"
        assert dead.headers["nsjms_dlq_destination"] == f"/queue/{queue}"
        assert json.loads(dead.headers["nsjms_dlq_headers"]) == {"x-wire": "opaque"}
        assert restarted.resender.dead_lettered == 1
        restarted.recover_now()
        restarted._purge()
        assert row_count(fresh_db, "nsjms_outbox") == 0
    finally:
        restarted.close()
