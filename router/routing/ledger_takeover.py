"""The ledger rows of a survivor's re-send of a fenced node's routing transactions (docs/cluster.md; docs/audit.md
"Takeovers"): :func:`record_resends`, called by ``router.cluster.decisions.recover_fenced`` through
``router.routing.t2.transactions.NodeTransactions`` on the transaction that deletes the re-sent outbox rows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

from router.routing.ledger import Time, timestamp

__all__ = ["record_resends"]

_RESENDS = sql.SQL("""
    INSERT INTO nsjms_ledger (event_id, jms_message_id, dedupe_id, channel_id, proxy_id, bridge_id, destination,
                              direction, gtrid, accepted_at, dispatched_at, prepared_at, decided_at,
                              broker_committed_at, acknowledged_at, outcome, failure_reason, node_id)
    SELECT l.event_id, l.jms_message_id, l.dedupe_id, l.channel_id, l.proxy_id, l.bridge_id, l.destination,
           l.direction, l.gtrid, l.accepted_at, l.dispatched_at, l.prepared_at, l.decided_at, r.at, NULL,
           'delivered', NULL, %s
    FROM unnest(%s::text[], %s::timestamptz[]) AS r(gtrid, at)
    JOIN nsjms_ledger l ON l.gtrid = r.gtrid
    WHERE l.outcome = 'delivered' AND l.direction = 'channel_to_jms'
      AND EXISTS (SELECT 1 FROM nsjms_outbox o WHERE o.gtrid = r.gtrid AND o.dedupe_id = l.jms_message_id)""")


def record_resends(conn: psycopg.Connection[Any], node_id: str, resent_at: Mapping[str, Time]) -> int:
    """Record that ``node_id``, a survivor finishing a fenced node's routing transactions
    (``router.cluster.decisions.recover_fenced``), re-sent their outbox rows at the broker: for each message of each
    transaction of ``resent_at`` (gtrid -> when the re-send was committed at the broker) that has a ``delivered``
    channel → JMS row (the dead node's, written in its branch), a second ``delivered`` row: the same obligation,
    transaction and ``jms_message_id`` (the message's ``nsjms_dedupe_id``), written by ``node_id``, with
    ``broker_committed_at`` = the re-send's commit and no acknowledgement. ONE statement on the caller's
    transaction, which must still hold the outbox rows (the re-sent messages: a dead letter's row is not copied)
    and delete them in the same commit: a transaction is recorded as re-sent exactly when its outbox rows go.

    The audit counts such a pair (one row by the transaction's node, one by another, one message) as ``resent``:
    the documented re-send of a takeover, not a duplicate (``audit.transforms.resend_rule``). Returns the rows."""
    if not resent_at:
        return 0
    gtrids = sorted(resent_at)
    cur = conn.execute(_RESENDS, (node_id, gtrids, [timestamp(resent_at[g]) for g in gtrids]))
    return max(cur.rowcount, 0)
