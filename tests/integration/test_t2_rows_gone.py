"""A channel -> JMS T2 whose events' queue rows are already gone sends none of them again (issue 31).

The case: a previous run left an undecided channel -> JMS T2 whose prepared PostgreSQL branch deleted its events'
queue rows; the start-up recovery pass failed to roll it back, so the restore loaded those rows (deleted, not
committed) into the proxy's queue. An operator then commits the branch (``nsjms txn commit --heuristic``): its
outbox re-sends the events with the old T2's dedupe ids, and the rows are gone for good. The running bridge's next
T2 takes the same events from memory; before the fix it sent them again under its own gtrid (new dedupe ids: a
duplicate no consumer can recognise). Now a T2 sends only the events whose rows it deleted itself; the others leave
memory (router.channel.txdelivery._without_gone).

The rows' disappearance is what the operator's commit does to the running node; the test deletes them directly in
PostgreSQL while the bridge is stopped (its events wait in the proxy's queue), then starts it and counts at a
stomp consumer of its own (router.jms transport): every event whose row remained arrives once, none of the others.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

import CosNotification

from router.jms.transport import open_transport
from router.mapping.stomp_codec import StompCodec

from bridgekit import bridge_factory, structured_supplier, t2_bridge, unique_name
from conftest import NsjmsServer
from stdclients import make_event

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0


def test_a_t2_does_not_send_events_whose_queue_rows_another_unit_of_work_deleted(
        nsjms_server: NsjmsServer, client_orb: Any, factory: Any, fresh_db: str, broker_url: str) -> None:
    bf = bridge_factory(client_orb, nsjms_server)
    queue = unique_name("t2.gone")
    bridge, _bid, channel = t2_bridge(bf, factory, queue, 10, 30)
    bridge.stop_bridge()                        # events wait in the proxy's queue (memory and nsjms_queue)
    supplier = structured_supplier(channel)
    for i in range(5):
        supplier.push_one(make_event(i, reliability=CosNotification.Persistent))
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        rows = [r[0] for r in conn.execute("SELECT event_id FROM nsjms_queue ORDER BY event_id")]
        assert len(rows) == 5, rows
        conn.execute("DELETE FROM nsjms_queue WHERE event_id = ANY(%s)", (rows[:3],))   # e0..e2: ended elsewhere
    bridge.start_bridge()
    for i in range(5, 7):
        supplier.push_one(make_event(i, reliability=CosNotification.Persistent))
    t = open_transport(broker_url, codec=StompCodec())
    t.connect()
    got: list[int] = []
    ids: list[str] = []
    try:
        sub = t.subscribe(f"/queue/{queue}")
        deadline = time.monotonic() + TIMEOUT_S
        while not {3, 4, 5, 6} <= set(got) and time.monotonic() < deadline:
            d = sub.receive(1.0)
            if d is not None:
                got.append(int(d.headers["$event_name"][1:]))
                ids.append(d.headers["nsjms_dedupe_id"])
                t.ack(d)
    finally:
        t.close()
    # the T2s send in queue order: had e0..e2 been sent, they would have arrived before e3
    assert got == [3, 4, 5, 6], f"arrived {got}: e0..e2 (their rows gone) must not be sent again"
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM nsjms_queue").fetchone() == (0,)
        # the ledger names each delivered event's message by the dedupe id it carried (its place in its T2)
        ledgered = {r[0] for r in conn.execute("SELECT jms_message_id FROM nsjms_ledger WHERE gtrid IS NOT NULL "
                                               "AND outcome = 'delivered'")}
    assert ledgered == set(ids), (ledgered, ids)
