"""The outbox of channel → JMS routing transactions (T2) and its re-sender: recovery's callback for the broker
branches (split from ``router.routing.t2.transactions``, which re-exports these names; issue 24: the outbox lives
with the routing layer).

* :class:`OutboxRow`, :func:`outbox_insert` / :func:`outbox_rows` / :func:`outbox_rows_many` /
  :func:`outbox_delete`: table ``nsjms_outbox``, one statement each on the caller's connection (the T2's
  PostgreSQL branch). A row holds a message's encoding as sent (headers + body; ``persistent`` among the headers)
  and the name of the codec that made it (``MessageCodec.name``; migration 0011, default ``stomp-activemq`` for the
  rows written before it).
* :class:`OutboxResender`: re-sends the rows of a T2 whose broker commit is not known to have happened, each
  through the codec it names (:meth:`OutboxResender._send_row`), with the same dedupe ids; a row no codec of this
  node can read is dead-lettered with the reason, never dropped. The node's recovery, a takeover of a fenced node
  (``NodeTransactions.recover_fenced``) and ``nsjms txn`` offline all use it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg

from router.jms.model import BodyType, DeliveryMode, Destination, JmsMessage, JmsType, Typed
from router.jms.transport import Confirm, EncodedMessage, MessageCodec, Transport, TransportError
from router.routing.crashpoints import crashpoint
from xa.records import Participant

__all__ = [
    "ACK_MANAGER", "DEFAULT_RESEND_BATCH", "OUTBOX_DEAD_LETTER", "OUTBOX_DEFAULT_CODEC", "SEND_MANAGER",
    "OutboxResender", "OutboxRow", "outbox_delete", "outbox_insert", "outbox_rows", "outbox_rows_many",
]

log = logging.getLogger("nsjms.t2")

#: The one-phase broker branches' managers in the recovery log (names kept from the first version: recovery
#: matches them): the send branch's outcome is recovered by re-sending the outbox; the ack branch needs nothing.
SEND_MANAGER = "stomp-send"
ACK_MANAGER = "stomp-ack"
DEFAULT_RESEND_BATCH = 2000      # messages per broker transaction when recovery re-sends many T2s
#: The codec of an outbox row that names none: every row written before migration 0011 (the STOMP codec's
#: ``MessageCodec.name``, ``router.mapping.stomp_codec.STOMP_CODEC``; the column's default says the same).
OUTBOX_DEFAULT_CODEC = "stomp-activemq"
#: Where recovery dead-letters an outbox row it cannot re-send as it was written (its codec is not one this node
#: has) when the node names no other (the bridges' default, ``router.bridge.core.DEFAULT_DLQ``).
OUTBOX_DEAD_LETTER = Destination("queue", "nsjms.DLQ")
#: The stored headers of such a row go in one String property of the dead letter, cut at this many characters
#: (a STOMP header line above 10 KiB closes the connection: the dead letter must be sendable).
_DLQ_HEADERS_MAX = 4000      # JSON is ASCII; STOMP escaping at most doubles it: under the broker's 10 KiB header line
#: The JMS property that carries a message's dedupe id (``router.bridge.txout.DEDUPE_PROPERTY``; not imported from
#: ``router.mapping.dedupe``: the mapping package loads the ORB, which the bridge core never imports).
DEDUPE_PROPERTY = "nsjms_dedupe_id"


Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class OutboxRow:
    """One message of a T2 as sent to the broker: its encoding (headers + body, with ``persistent`` among the
    headers) by the codec named ``codec`` (``MessageCodec.name``), and its dedupe id."""

    gtrid: str
    idx: int
    dedupe_id: str
    bridge_id: int
    destination: str
    headers: Mapping[str, str]
    body: bytes
    codec: str = OUTBOX_DEFAULT_CODEC

    @property
    def persistent(self) -> bool:
        return self.headers.get("persistent", "true") == "true"


def outbox_insert(conn: Conn, rows: Sequence[OutboxRow]) -> None:
    """Insert ``rows`` in the caller's branch (one statement). The arrays go in binary format (``%b``): the text
    format quotes and escapes every element of a text array in Python (a regular expression per element), which
    cost more than the round trip for a batch of 100 1 KB frames."""
    if not rows:
        return
    conn.execute(
        "INSERT INTO nsjms_outbox(gtrid, idx, dedupe_id, bridge_id, destination, headers, body, codec) "
        "SELECT * FROM unnest(%b::text[], %b::int[], %b::text[], %b::int[], %b::text[], %b::text[]::jsonb[], "
        "%b::bytea[], %b::text[])",
        ([r.gtrid for r in rows], [r.idx for r in rows], [r.dedupe_id for r in rows], [r.bridge_id for r in rows],
         [r.destination for r in rows], [json.dumps(dict(r.headers)) for r in rows], [r.body for r in rows],
         [r.codec for r in rows]))


def outbox_rows(conn: Conn, gtrid: str) -> list[OutboxRow]:
    """The committed rows of ``gtrid`` in send order."""
    rows = conn.execute(f"SELECT {_OUTBOX_COLUMNS} FROM nsjms_outbox WHERE gtrid = %s ORDER BY idx",
                        (gtrid,)).fetchall()
    return [_outbox_row(r) for r in rows]


def outbox_rows_many(conn: Conn, gtrids: Sequence[str]) -> dict[str, list[OutboxRow]]:
    """The committed rows of each of ``gtrids`` in send order (one statement); a gtrid without rows is absent."""
    out: dict[str, list[OutboxRow]] = {}
    if not gtrids:
        return out
    rows = conn.execute(f"SELECT {_OUTBOX_COLUMNS} FROM nsjms_outbox WHERE gtrid = ANY(%s) ORDER BY gtrid, idx",
                        (list(gtrids),)).fetchall()
    for r in rows:
        row = _outbox_row(r)
        out.setdefault(row.gtrid, []).append(row)
    return out


_OUTBOX_COLUMNS = "gtrid, idx, dedupe_id, bridge_id, destination, headers, body, codec"


def _outbox_row(r: Sequence[Any]) -> OutboxRow:
    g, i, d, b, dest, h, body, codec = r
    return OutboxRow(g, int(i), d, int(b), dest, {str(k): str(v) for k, v in h.items()}, bytes(body), str(codec))


def outbox_delete(conn: Conn, gtrids: Sequence[str]) -> None:
    """Delete the rows of transactions that ended (their broker commit is confirmed)."""
    if gtrids:
        conn.execute("DELETE FROM nsjms_outbox WHERE gtrid = ANY(%s)", (list(gtrids),))


# ------------------------------------------------------------------------------------------------ re-sending
class OutboxResender:
    """Recovery's callback for one-phase branches: ``stomp-send`` re-sends the transaction's outbox rows in one
    broker transaction with their stored headers (same dedupe ids); ``stomp-ack`` needs nothing (the broker
    redelivers un-acknowledged messages; the inbox turns each into an ack without a second event).

    Any failure raises: recovery records it and the next pass tries again (a re-send whose COMMIT receipt was lost
    is re-sent again: a duplicate with the same dedupe id, never a loss)."""

    def __init__(self, rows_of: Callable[[str], list[OutboxRow]], transport: Callable[[], Transport], *,
                 rows_of_many: Callable[[Sequence[str]], dict[str, list[OutboxRow]]] | None = None,
                 batch_messages: int = DEFAULT_RESEND_BATCH, codecs: Sequence[MessageCodec] = (),
                 dead_letter: Destination = OUTBOX_DEAD_LETTER) -> None:
        """``codecs``: those this node has besides its broker connection's own (``Transport.codec``), by
        ``MessageCodec.name``; ``dead_letter``: where a row no codec of the node can read goes (:meth:`_send_row`)."""
        self._rows_of = rows_of
        self._rows_of_many = rows_of_many
        self._transport = transport
        self._codecs = {c.name: c for c in codecs}
        self.dead_letter = dead_letter
        self._lock = threading.Lock()
        self.batch_messages = max(1, batch_messages)
        self.committed_at: dict[str, float] = {}   # gtrid -> when a re-send of its rows was committed (ledger)
        self.dead_lettered = 0                     # rows re-sent to ``dead_letter`` (their codec unknown here)

    def __call__(self, gtrid: str, participant: Participant) -> None:
        if participant.manager == ACK_MANAGER:
            return
        if participant.manager != SEND_MANAGER:
            raise ValueError(f"no re-send for one-phase manager {participant.manager!r}")
        rows = self._rows_of(gtrid)
        if not rows:
            return                                   # nothing was sent in it (or it was already cleaned up)
        self._send_frames(rows)
        log.warning("T2 %s: re-sent %d message(s) whose broker commit was not confirmed (same dedupe ids)",
                    gtrid, len(rows))

    def _send_frames(self, frames: Sequence[OutboxRow]) -> None:
        """``frames`` in ONE broker transaction, committed with a receipt; ABORT (best effort) and re-raise on any
        failure before the COMMIT."""
        with self._lock:
            transport = self._transport()
            tx = transport.begin()
            try:
                for r in frames:
                    self._send_row(transport, tx, r)
            except BaseException:
                try:
                    transport.abort(tx)
                except TransportError:
                    pass
                raise
            transport.commit(tx)
            self.committed_at.update(dict.fromkeys({r.gtrid for r in frames}, time.time()))
        crashpoint("t2.recovery.after_resend")

    def _send_row(self, transport: Transport, tx: str, row: OutboxRow) -> None:
        """Re-send ``row`` in ``tx`` through the codec it names: written by the connection's own codec, the stored
        encoding as it is (the same bytes, the same dedupe id); by another codec of this node, decoded by that
        codec and sent as the message (its ``nsjms_dedupe_id`` property kept); else, or when that codec cannot
        decode it, a dead letter with the reason (never dropped: :meth:`_dead_letter`)."""
        own = transport.codec.name
        if row.codec == own:
            transport.send_encoded(row.destination, EncodedMessage(dict(row.headers), row.body),
                                   persistent=row.persistent, transaction=tx, confirm=Confirm.PIPELINED)
            return
        codec = self._codecs.get(row.codec)
        if codec is None:
            known = ", ".join(sorted({own, *self._codecs}))
            reason = (f"outbox row {row.gtrid}#{row.idx} was encoded by codec {row.codec!r}, which this node does "
                      f"not have (it has: {known})")
        else:
            try:
                message = codec.decode(row.headers, row.body)
            except Exception as exc:  # noqa: BLE001 - any codec's failure to read the row: dead-lettered with it
                reason = (f"outbox row {row.gtrid}#{row.idx} cannot be decoded by its codec {row.codec!r}: "
                          f"{type(exc).__name__}: {exc}")
            else:
                props = {**message.properties, DEDUPE_PROPERTY: Typed(JmsType.STRING, row.dedupe_id)}
                transport.send(row.destination, replace(message, properties=props), transaction=tx,
                               confirm=Confirm.PIPELINED)
                return
        self._dead_letter(transport, tx, row, reason)

    def _dead_letter(self, transport: Transport, tx: str, row: OutboxRow, reason: str) -> None:
        """``row`` as a BytesMessage to :attr:`dead_letter` in ``tx``: its stored body, the reason, the codec, the
        destination and the stored headers (JSON, cut at :data:`_DLQ_HEADERS_MAX` characters) as properties, its
        dedupe id as ``nsjms_dedupe_id``. The ledger's row for the message is not changed (it says delivered)."""
        headers = json.dumps(dict(row.headers), separators=(",", ":"))
        if len(headers) > _DLQ_HEADERS_MAX:
            headers = headers[:_DLQ_HEADERS_MAX] + "...(cut)"
        text = {"nsjms_dlq_reason": reason[:1000], "nsjms_dlq_origin": "outbox", "nsjms_dlq_codec": row.codec,
                "nsjms_dlq_destination": row.destination, "nsjms_dlq_headers": headers,
                DEDUPE_PROPERTY: row.dedupe_id}
        props = {k: Typed(JmsType.STRING, v) for k, v in text.items()}
        props["nsjms_dlq_bridge"] = Typed(JmsType.INT, row.bridge_id)
        log.error("T2 %s: outbox row %d dead-lettered to %s: %s", row.gtrid, row.idx, self.dead_letter.stomp(),
                  reason)
        transport.send(self.dead_letter, JmsMessage(BodyType.BYTES, row.body, destination=self.dead_letter,
                                                    delivery_mode=DeliveryMode.PERSISTENT, properties=props),
                       transaction=tx, confirm=Confirm.PIPELINED)
        self.dead_lettered += 1

    def many(self, items: Sequence[tuple[str, Participant]]) -> list[Exception | None]:
        """The re-sends of many transactions: their outbox rows read with one SELECT, sent in broker
        transactions of up to ``batch_messages`` messages (whole T2s: a T2's rows never straddle two), each
        committed with one receipt. A failed broker transaction fails exactly the T2s it held (the next pass
        re-sends them; any already delivered then arrive twice with the same dedupe ids, never lost)."""
        out: list[Exception | None] = [None] * len(items)
        sends: list[int] = []
        for i, (_, participant) in enumerate(items):
            if participant.manager == SEND_MANAGER:
                sends.append(i)
            elif participant.manager != ACK_MANAGER:
                out[i] = ValueError(f"no re-send for one-phase manager {participant.manager!r}")
        if not sends:
            return out
        if self._rows_of_many is None:
            for i in sends:
                try:
                    self(*items[i])
                except Exception as exc:  # noqa: BLE001 - reported per transaction
                    out[i] = exc
            return out
        try:
            rows = self._rows_of_many(sorted({items[i][0] for i in sends}))
        except Exception as exc:  # noqa: BLE001 - every re-send of this pass failed; the next pass retries
            for i in sends:
                out[i] = exc
            return out
        batch: list[int] = []
        size = 0
        sent = 0
        for i in sends:
            n = len(rows.get(items[i][0], ()))
            if batch and size + n > self.batch_messages:
                sent += self._send_batch(items, batch, rows, out)
                batch, size = [], 0
            batch.append(i)
            size += n
        if batch:
            sent += self._send_batch(items, batch, rows, out)
        if sent:
            log.warning("T2 recovery: re-sent %d message(s) of %d transaction(s) whose broker commit was not "
                        "confirmed (same dedupe ids)", sent, sum(1 for i in sends if out[i] is None))
        return out

    def _send_batch(self, items: Sequence[tuple[str, Participant]], batch: list[int],
                    rows: Mapping[str, list[OutboxRow]], out: list[Exception | None]) -> int:
        frames = [r for i in batch for r in rows.get(items[i][0], ())]
        if not frames:
            return 0                                 # nothing was sent in them (or they were cleaned up)
        try:
            self._send_frames(frames)
        except Exception as exc:  # noqa: BLE001 - these T2s are re-sent by the next pass
            for i in batch:
                out[i] = exc
            return 0
        crashpoint("t2.recovery.after_resend")
        return len(frames)
