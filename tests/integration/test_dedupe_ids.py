"""Channel -> JMS without T2 carries a dedupe id on every message (issue 31, router.channel.dedupe).

A push bridge (fed in-process in batches by its proxy), a pull bridge (it pulls its proxy over CORBA) and a push
bridge of an Acknowledgment channel (its Ack proxy pushes over CORBA), each of a Persistent channel on a real node:
every message read by a consumer of its own (the router's STOMP transport, auto-ack) carries ``nsjms_dedupe_id``,
distinct per event, and equal to the ledger's ``dedupe_id`` of the event's delivery to that bridge's proxy
(``e<event>/c<channel>/a<admin>/p<proxy>``): the id names the obligation, so a re-send of the same event to the same
bridge carries it again. The variable-header entry that carried it over CORBA is not in the message (no
``$ohf_nsjms_dedupe_id``).

The three share one node (``module_server``): each has its own channel, bridge and queue, and reads only its
bridge's ledger rows.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

import CosNotification

from idl.generated import CosBridgeAdmin as BA
from idl.generated import CosNotifyCommAck
from router.jms.transport import open_transport
from router.mapping.stomp_codec import StompCodec

from bridgekit import bridge_factory, channel_ep, jms_ep, structured_supplier, unique_name
from conftest import NsjmsServer
from stdclients import make_event, prop, short

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0
N = 5


def _read(broker_url: str, queue: str, n: int) -> list[dict[str, str]]:
    t = open_transport(broker_url, codec=StompCodec())
    t.connect()
    got: list[dict[str, str]] = []
    try:
        sub = t.subscribe(f"/queue/{queue}", ack="auto")
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < n and time.monotonic() < deadline:
            d = sub.receive(1.0)
            if d is not None:
                got.append(dict(d.headers))
    finally:
        t.close()
    return got


@pytest.mark.parametrize("style", ["push", "pull", "ack"])
def test_every_message_carries_the_ledger_dedupe_id_of_its_event(
        style: str, module_server: NsjmsServer, client_orb: Any, shared_factory: Any, broker_url: str) -> None:
    bf = bridge_factory(client_orb, module_server)
    queue = unique_name(f"dedupe.{style}")
    persistent = short(CosNotification.Persistent)
    qos = [prop("EventReliability", persistent), prop("ConnectionReliability", persistent)]
    if style == "ack":
        qos.append(prop("DeliveryReliability", short(CosNotifyCommAck.Acknowledgment)))
    channel, cid = shared_factory.create_channel(qos, [])
    source = channel_ep(BA.SOURCE, cid, BA.PULL if style == "pull" else BA.PUSH)
    bridge, bid = bf.create_bridge(source, jms_ep(BA.SINK, queue))
    bridge.start_bridge()
    supplier = structured_supplier(channel)
    for i in range(N):
        supplier.push_one(make_event(i, reliability=CosNotification.Persistent))
    got = _read(broker_url, queue, N)
    assert sorted(int(h["$event_name"][1:]) for h in got) == list(range(N))
    ids = [h.get("nsjms_dedupe_id", "") for h in got]
    assert all(ids) and len(set(ids)) == N, ids
    assert not [h for h in got if "$ohf_nsjms_dedupe_id" in h]
    deadline = time.monotonic() + TIMEOUT_S
    ledgered: set[str] = set()
    while time.monotonic() < deadline:      # the delivered rows are written once the proxy's deletes flush
        with psycopg.connect(module_server.pg_dsn, autocommit=True) as conn:
            ledgered = {r[0] for r in conn.execute(
                "SELECT dedupe_id FROM nsjms_ledger WHERE bridge_id = %s AND outcome = 'delivered'", (bid,))}
        if len(ledgered) >= N:
            break
        time.sleep(0.2)
    assert ledgered == set(ids), (ledgered, ids)
    assert all(d.startswith("e") and d.split("/")[1] == f"c{cid}" for d in ids), ids
