"""JMS → channel inside the routing transaction T2 (NJI 2.7.2, 2.7.3.2, 2.7.5.2) with a real node, PostgreSQL and
ActiveMQ: the channel's pull proxy (EnableTransaction TRUE) pulls from the bridge's pull sender inside a T2.

Counted at a standard CORBA push consumer by the ``n`` header every message carries:

* every message arrives exactly once, an inbox row per message, no prepared transaction left;
* the node SIGKILLed at ``t2.after_pg_commit`` (events and inbox rows committed, the STOMP COMMIT of the acks never
  sent): after the restart the broker redelivers those messages and the inbox turns them into acks: 0 duplicates;
* the broker connection lost before the STOMP COMMIT: same;
* a T2 that cannot finish within TransactionTimeout is rolled back (nothing stored, the deliveries kept) and the
  messages arrive once it can;
* a poison message is dead-lettered inside the T2 with its reason, the messages around it flow.
"""

from __future__ import annotations

import collections
import json
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from omniORB import CORBA

from idl.generated import BridgeTransactionMgmt as BTM
from idl.generated import CosBridgeAdmin as BA
from idl.generated import NsjmsAdmin
from router.bridge.codec import MappingCodec
from router.jms.transport import open_transport

from bridgekit import bridge_factory, channel_ep, jms_ep, reconnect_client
from conftest import NsjmsServer, free_port
from stdclients import (
    Form,
    PullConsumerClient,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    long_,
    obtain_proxy_supplier,
    prop,
    short,
    wait_until,
)

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0


def _name(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


def _t2_channel(factory: Any, events: int = 10, timeout_s: int = 0) -> tuple[Any, int]:
    qos = [prop("EnableTransaction", CORBA.Any(CORBA.TC_boolean, True))]
    admin = [prop("TransactionEvents", long_(events)), prop("TransactionTimeout", CORBA.Any(CORBA.TC_ulong,
                                                                                           timeout_s))]
    channel, cid = factory.create_channel(qos, admin)
    return channel, int(cid)


def _consumer(channel: Any) -> StructuredPushConsumer:
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
    consumer = StructuredPushConsumer()
    connect_push_consumer(proxy, Form.STRUCTURED, consumer)
    return consumer


def _pull_consumer(channel: Any) -> PullConsumerClient:
    """A sequence pull consumer the test drains only after the node's restart: no event is in flight to it when
    the node is killed, so what it counts is what entered the channel (the channel's own push delivery is
    at-least-once across a crash: an event pushed just before the kill is pushed again, see test_channel_crash)."""
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.SEQUENCE, Style.PULL)
    client = PullConsumerClient(proxy, Form.SEQUENCE, 100)
    client.connect()
    return client


def _drain_ids(client: PullConsumerClient, n: int) -> collections.Counter[int]:
    got = client.drain(n, TIMEOUT_S)
    got += client.drain(n, 1.0)          # anything more is a duplicate; this pull also confirms the last batch
    return collections.Counter(int({p.name: p.value.value() for p in ev.filterable_data}["n"]) for ev in got)


def _host_port(broker_url: str) -> tuple[str, int]:
    host, port = broker_url.removeprefix("stomp://").split(":")
    return host, int(port)


def _read_until(sock: socket.socket, marker: bytes) -> None:
    got = b""
    while marker not in got:
        chunk = sock.recv(65536)
        assert chunk, f"the broker closed the connection before {marker!r}"
        assert not got.startswith(b"ERROR"), got[:500]
        got += chunk


def _produce(broker_url: str, queue: str, ids: range, extra: dict[int, bytes] | None = None) -> None:
    """SEND one persistent message per id, header ``n`` = the id, each with a receipt."""
    with socket.create_connection(_host_port(broker_url), timeout=10) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        _read_until(sock, b"CONNECTED")
        for i in ids:
            body = f"m{i}".encode()
            head = (f"SEND\ndestination:/queue/{queue}\npersistent:true\nn:{i}\nreceipt:r{i}\n".encode()
                    + (extra or {}).get(i, b"") + f"content-length:{len(body)}\n\n".encode())
            sock.sendall(head + body + b"\x00")
            _read_until(sock, f"receipt-id:r{i}".encode())
        sock.sendall(b"DISCONNECT\n\n\x00")


def _ids(consumer: StructuredPushConsumer) -> collections.Counter[int]:
    return collections.Counter(int({p.name: p.value.value() for p in ev.filterable_data}["n"])
                               for ev in consumer.snapshot())


def _sql(dsn: str, query: str, *args: Any) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, args).fetchone()
        return None if row is None else row[0]


def _inbox(dsn: str, bid: int) -> int:
    return int(_sql(dsn, "SELECT count(*) FROM nsjms_inbox WHERE bridge_id = %s", bid))


def _prepared(dsn: str) -> int:
    return int(_sql(dsn, "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()"))


def _t2_status(server: NsjmsServer) -> dict[str, Any]:
    """The bridge proxy's T2 counters from the node's status.json (empty until a T2 ran)."""
    try:
        data = json.loads((server.state_dir / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    for ch in data.get("channels", []):
        for pc in ch.get("proxy_consumers", []):
            if "t2_committed" in pc:
                return dict(pc)
    return {}


def _bridge_status(server: NsjmsServer) -> dict[str, Any]:
    try:
        data = json.loads((server.state_dir / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    bridges = data.get("bridges", [])
    return dict(bridges[0]) if bridges else {}


def _assert_once(counts: collections.Counter[int], ids: range, what: str) -> None:
    lost = sorted(set(ids) - set(counts))
    dups = {i: c for i, c in counts.items() if c > 1}
    assert not lost and not dups, f"{what}: lost {lost[:10]} ({len(lost)}), duplicated {dict(list(dups.items())[:10])}"
    assert set(counts) == set(ids)


def _drained(dsn: str, bid: int, n: int, consumer: StructuredPushConsumer) -> bool:
    return consumer.count() >= n and _inbox(dsn, bid) >= n


@pytest.fixture
def own_server(tmp_path: Any, fresh_db: str, broker_url: str) -> Iterator[NsjmsServer]:
    """A node that the test starts itself (so it can set NSJMS_CRASH_AT first)."""
    state = tmp_path / "state"
    state.mkdir()
    server = NsjmsServer(state_dir=state, pg_dsn=fresh_db, broker_url=broker_url, port=free_port())
    try:
        yield server
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------------- the tests
def test_messages_arrive_exactly_once_inside_t2(nsjms_server: NsjmsServer, factory: Any, client_orb: Any,
                                                broker_url: str, fresh_db: str) -> None:
    n = 300
    queue = _name("t2in.once")
    channel, cid = _t2_channel(factory, events=25)
    consumer = _consumer(channel)
    _produce(broker_url, queue, range(n))
    bf = bridge_factory(client_orb, nsjms_server)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, BA.PULL))
    bridge.start_bridge()
    assert wait_until(lambda: _drained(fresh_db, bid, n, consumer), TIMEOUT_S), \
        f"{consumer.count()} events, {_inbox(fresh_db, bid)} inbox rows of {n}"
    assert wait_until(lambda: _t2_status(nsjms_server).get("t2_committed", 0) > 0, 10), _t2_status(nsjms_server)
    _assert_once(_ids(consumer), range(n), "JMS -> channel in T2")
    print(f"T2 counters: {_t2_status(nsjms_server)}")
    assert _inbox(fresh_db, bid) == n
    assert _prepared(fresh_db) == 0
    bridge.destroy()
    left = _leftover(broker_url, queue)
    assert left == 0, f"{left} message(s) still on the queue: acks were not committed"


def _leftover(broker_url: str, queue: str) -> int:
    t = open_transport(broker_url, codec=MappingCodec())
    t.connect()
    try:
        sub = t.subscribe(f"/queue/{queue}")
        count = 0
        while sub.receive(1.0) is not None:
            count += 1
        return count
    finally:
        t.close()


def test_sigkill_after_pg_commit_redelivers_without_duplicates(own_server: NsjmsServer, client_orb: Any,
                                                                broker_url: str, fresh_db: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after the PostgreSQL branch of the 3rd T2 committed, before its STOMP COMMIT: the broker redelivers
    that T2's messages after the restart; the inbox acknowledges them without a second event."""
    n = 200
    queue = _name("t2in.kill")
    monkeypatch.setenv("NSJMS_CRASH_AT", "t2.after_pg_commit@3")
    own_server.start()
    monkeypatch.delenv("NSJMS_CRASH_AT")
    factory = client_orb.factory(own_server.ior())
    channel, cid = _t2_channel(factory, events=20)
    consumer = _pull_consumer(channel)
    _produce(broker_url, queue, range(n))
    bf = bridge_factory(client_orb, own_server)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, BA.PULL))
    bridge.start_bridge()
    assert own_server.proc is not None
    own_server.proc.wait(timeout=TIMEOUT_S)          # the crash point killed it
    assert own_server.proc.returncode == -9
    assert _inbox(fresh_db, bid) >= 40, "the third T2 committed its PostgreSQL branch before the kill"
    own_server.restart()
    reconnect_client(bridge, consumer.proxy)
    assert wait_until(lambda: _inbox(fresh_db, bid) >= n, TIMEOUT_S), f"{_inbox(fresh_db, bid)} inbox rows of {n}"
    counts = _drain_ids(consumer, n)
    _assert_once(counts, range(n), "JMS -> channel in T2 across a SIGKILL after the PostgreSQL commit")
    assert wait_until(lambda: _bridge_status(own_server).get("duplicates_suppressed", 0) > 0, 10), \
        f"the broker redelivered the killed T2's messages and the inbox recognised them: {_bridge_status(own_server)}"
    assert _prepared(fresh_db) == 0
    print(f"JMS -> channel in T2, node killed at t2.after_pg_commit: {sum(counts.values())} events for "
          f"{n} messages, 0 duplicates")


def test_rollback_on_transaction_timeout_then_delivered_once(nsjms_server: NsjmsServer, factory: Any,
                                                             client_orb: Any, broker_url: str,
                                                             fresh_db: str) -> None:
    """The inbox table is locked by another session: the T2's claim waits past TransactionTimeout (1 s), the T2 is
    rolled back (nothing stored, the acks aborted); once the lock is gone the messages arrive exactly once."""
    n = 30
    queue = _name("t2in.timeout")
    channel, cid = _t2_channel(factory, events=10, timeout_s=1)
    consumer = _consumer(channel)
    bf = bridge_factory(client_orb, nsjms_server)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, BA.PULL))
    bridge.start_bridge()
    with psycopg.connect(fresh_db) as blocker:
        blocker.execute("LOCK TABLE nsjms_inbox IN EXCLUSIVE MODE")
        _produce(broker_url, queue, range(n))
        assert wait_until(lambda: _t2_status(nsjms_server).get("t2_rolled_back", 0) >= 2, TIMEOUT_S), \
            _t2_status(nsjms_server)
        assert consumer.count() == 0, "nothing is delivered from a rolled-back T2"
        blocker.rollback()
    assert wait_until(lambda: _drained(fresh_db, bid, n, consumer), TIMEOUT_S), \
        f"{consumer.count()} events, {_inbox(fresh_db, bid)} inbox rows of {n}"
    _assert_once(_ids(consumer), range(n), "JMS -> channel in T2 after rolled-back T2s")
    assert _prepared(fresh_db) == 0
    bridge.destroy()
    assert _leftover(broker_url, queue) == 0, "the aborted acks were made again in a later T2 (not stranded)"


def test_poison_message_is_dead_lettered_inside_t2(nsjms_server: NsjmsServer, factory: Any, client_orb: Any,
                                                    broker_url: str, fresh_db: str) -> None:
    n = 5
    queue = _name("t2in.poison")
    channel, cid = _t2_channel(factory, events=10)
    consumer = _consumer(channel)
    _produce(broker_url, queue, range(n), extra={2: b"expires:-5\n"})
    bf = bridge_factory(client_orb, nsjms_server)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, BA.PULL))
    bridge.start_bridge()
    good = [0, 1, 3, 4]
    assert wait_until(lambda: consumer.count() >= len(good), TIMEOUT_S), f"{consumer.count()} events"
    assert sorted(_ids(consumer)) == good
    t = open_transport(broker_url, codec=MappingCodec())
    t.connect()
    try:
        sub = t.subscribe("/queue/nsjms.DLQ", selector=f"nsjms_dlq_destination = '/queue/{queue}'")
        dead = sub.receive(TIMEOUT_S)
        assert dead is not None, "no dead letter for the expired message"
        t.ack(dead)
        assert "expired" in dead.headers["nsjms_dlq_reason"], dead.headers
        assert sub.receive(1.0) is None, "one dead letter only"
    finally:
        t.close()
    assert _inbox(fresh_db, bid) == len(good), "a dead-lettered message keeps no inbox row"
    assert wait_until(lambda: _t2_status(nsjms_server).get("t2_committed", 0) > 0, 10)
    bridge.destroy()
    assert _leftover(broker_url, queue) == 0
    assert _prepared(fresh_db) == 0


# ------------------------------------------------------------------------------------------- without a T2
def _persistent_channel(factory: Any) -> tuple[Any, int]:
    from stdclients import short

    qos = [prop("EventReliability", short(1)), prop("ConnectionReliability", short(1))]
    channel, cid = factory.create_channel(qos, [])
    return channel, int(cid)


@pytest.mark.parametrize("style", ["PULL", "PUSH"])
def test_without_t2_a_local_unit_of_work_is_exactly_once_across_a_sigkill(
        own_server: NsjmsServer, client_orb: Any, broker_url: str, fresh_db: str,
        monkeypatch: pytest.MonkeyPatch, style: str) -> None:
    """EnableTransaction FALSE, Persistent channel, the channel pulls from a bridge of its node (or the bridge
    pushes into it): the events and the inbox ids are committed in one local transaction, the acks written after
    it. Killed between the commit and the acks of the 3rd round: the broker redelivers, the inbox recognises,
    0 duplicates."""
    n = 300
    queue = _name(f"t2in.local.{style}")
    monkeypatch.setenv("NSJMS_CRASH_AT", "in.local.after_commit@3")
    own_server.start()
    monkeypatch.delenv("NSJMS_CRASH_AT")
    factory = client_orb.factory(own_server.ior())
    channel, cid = _persistent_channel(factory)
    consumer = _pull_consumer(channel)
    _produce(broker_url, queue, range(n))
    bf = bridge_factory(client_orb, own_server)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, getattr(BA, style)))
    bridge.start_bridge()
    assert own_server.proc is not None
    own_server.proc.wait(timeout=TIMEOUT_S)
    assert own_server.proc.returncode == -9
    assert _inbox(fresh_db, bid) > 0
    own_server.restart()
    reconnect_client(bridge, consumer.proxy)
    assert wait_until(lambda: _inbox(fresh_db, bid) >= n, TIMEOUT_S), f"{_inbox(fresh_db, bid)} inbox rows of {n}"
    _assert_once(_drain_ids(consumer, n), range(n),
                 "JMS -> channel without T2 across a SIGKILL after the local commit")
    assert wait_until(lambda: _bridge_status(own_server).get("duplicates_suppressed", 0) > 0, 10), \
        _bridge_status(own_server)
    assert _t2_status(own_server).get("t2_committed", 0) == 0, "no T2 ran"
    bridge.destroy()
    assert _leftover(broker_url, queue) == 0


# ------------------------------------------------------------------------------------------- broker killed
def test_broker_killed_mid_stream_in_t2_loses_nothing_and_duplicates_nothing(rig: Any, fresh_db: str) -> None:
    """ActiveMQ SIGKILLed while T2s run: connections die at every step, also between the PostgreSQL commit and the
    STOMP COMMIT (the broker then rolls the acks back and redelivers after its restart; the inbox recognises)."""
    n = 600
    queue = _name("t2in.broker")
    channel, cid = _t2_channel(rig.factory, events=20)
    consumer = _consumer(channel)
    _produce(rig.broker.url, queue, range(n))
    bridge, bid = rig.bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, BA.PULL))
    bridge.start_bridge()
    assert wait_until(lambda: consumer.count() >= 150, TIMEOUT_S), f"no progress: {consumer.count()}"
    rig.kill_broker()
    assert consumer.count() < n, "the kill did not land mid-stream"
    rig.broker.start()
    assert wait_until(lambda: _bridge_status(rig.server).get("active") is True, 90), "Active after the restart"
    assert wait_until(lambda: _drained(fresh_db, bid, n, consumer), TIMEOUT_S * 2), \
        f"{consumer.count()} events, {_inbox(fresh_db, bid)} inbox rows of {n}"
    _assert_once(_ids(consumer), range(n), "JMS -> channel in T2 across a broker SIGKILL")
    assert _prepared(fresh_db) == 0
    bridge.destroy()
    assert _leftover(rig.broker.url, queue) == 0
    print(f"JMS -> channel in T2, broker killed: {consumer.count()} events for {n} messages, 0 duplicates")


def test_enable_transaction_on_a_pull_bridge_switches_its_proxy_to_t2(nsjms_server: NsjmsServer, factory: Any,
                                                                      client_orb: Any, broker_url: str,
                                                                      fresh_db: str) -> None:
    """BridgeTransactionMgmt for JMS -> channel: enable_transaction writes EnableTransaction and TransactionEvents
    on the bridge's pull proxy consumer of a Persistent channel that has no transaction settings of its own; the
    messages then arrive exactly once, each batch in a T2."""
    persistent = short(1)
    channel, cid = factory.create_channel([prop("EventReliability", persistent),
                                           prop("ConnectionReliability", persistent)], [])
    consumer = _consumer(channel)
    queue = _name("t2in.mgmt")
    bf = bridge_factory(client_orb, nsjms_server)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, int(cid), BA.PULL))
    managed = bridge._narrow(NsjmsAdmin.ManagedBridge)
    managed.enable_transaction(20, 0)
    with pytest.raises(BTM.TransactionAlreadyActive):
        managed.enable_transaction(20, 0)
    n = 120
    _produce(broker_url, queue, range(n))
    bridge.start_bridge()
    assert wait_until(lambda: _drained(fresh_db, bid, n, consumer), TIMEOUT_S), \
        f"{consumer.count()} events, {_inbox(fresh_db, bid)} inbox rows of {n}"
    assert wait_until(lambda: _t2_status(nsjms_server).get("t2_committed", 0) >= n // 20, 10), \
        _t2_status(nsjms_server)
    _assert_once(_ids(consumer), range(n), "JMS -> channel in T2 enabled by enable_transaction")
    assert _prepared(fresh_db) == 0
