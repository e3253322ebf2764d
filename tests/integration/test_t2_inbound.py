"""JMS → channel inside the routing transaction T2 (NJI 2.7.2, 2.7.3.2, 2.7.5.2) with a real node, PostgreSQL and
ActiveMQ: the channel's pull proxy (EnableTransaction TRUE) pulls from the bridge's pull sender inside a T2.

Counted at a standard CORBA push consumer by the ``n`` header every message carries:

* every message arrives exactly once, an inbox row per message, no prepared transaction left;
* the node SIGKILLed at ``t2.after_pg_commit`` (events and inbox rows committed, the STOMP COMMIT of the acks never
  sent): after the restart the broker redelivers those messages and the inbox turns them into acks: 0 duplicates;
* the broker connection lost before the STOMP COMMIT: same;
* a T2 that cannot finish within TransactionTimeout is rolled back (nothing stored, the deliveries kept) and the
  messages arrive once it can;
* a poison message is dead-lettered inside the T2 with its reason, the messages around it flow;
* the broker's state per message acknowledged in a STOMP transaction stays bounded (the bridge renews its
  connection, issue 31), counted in the broker's heap by ``jcmd GC.class_histogram``.
"""

from __future__ import annotations

import collections
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from idl.generated import BridgeTransactionMgmt as BTM
from idl.generated import CosBridgeAdmin as BA
from idl.generated import NsjmsAdmin
from router.bridge.brokerlink import DEFAULT_PREFETCH
from router.bridge.t2in import RENEW_AFTER
from router.jms.transport import open_transport
from router.mapping.stomp_codec import StompCodec
from router.node.services import EmbeddedPostgres

from bridgekit import (
    bridge_factory,
    bridge_status,
    channel_ep,
    inbox_count,
    inbox_drained,
    jms_ep,
    leftover,
    persistent_channel,
    prepared_count,
    reconnect_client,
    stomp_produce,
    structured_consumer,
    t2_channel,
    t2_proxy_status,
    unique_name,
)
from conftest import NsjmsServer, free_port
from stdclients import (
    Form,
    PullConsumerClient,
    StructuredPushConsumer,
    Style,
    obtain_proxy_supplier,
    prop,
    short,
    wait_until,
)

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0


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


def _ids(consumer: StructuredPushConsumer) -> collections.Counter[int]:
    return collections.Counter(int({p.name: p.value.value() for p in ev.filterable_data}["n"])
                               for ev in consumer.snapshot())


def _assert_once(counts: collections.Counter[int], ids: range, what: str) -> None:
    lost = sorted(set(ids) - set(counts))
    dups = {i: c for i, c in counts.items() if c > 1}
    assert not lost and not dups, f"{what}: lost {lost[:10]} ({len(lost)}), duplicated {dict(list(dups.items())[:10])}"
    assert set(counts) == set(ids)


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
    queue = unique_name("t2in.once")
    channel, cid = t2_channel(factory, events=25)
    consumer = structured_consumer(channel)
    stomp_produce(broker_url, queue, range(n))
    bf = bridge_factory(client_orb, nsjms_server)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, BA.PULL))
    bridge.start_bridge()
    assert wait_until(lambda: inbox_drained(fresh_db, bid, n, consumer), TIMEOUT_S), \
        f"{consumer.count()} events, {inbox_count(fresh_db, bid)} inbox rows of {n}"
    assert wait_until(lambda: t2_proxy_status(nsjms_server).get("t2_committed", 0) > 0, 10), \
        t2_proxy_status(nsjms_server)
    _assert_once(_ids(consumer), range(n), "JMS -> channel in T2")
    print(f"T2 counters: {t2_proxy_status(nsjms_server)}")
    assert inbox_count(fresh_db, bid) == n
    assert prepared_count(fresh_db) == 0
    bridge.destroy()
    left = leftover(broker_url, queue)
    assert left == 0, f"{left} message(s) still on the queue: acks were not committed"


def test_sigkill_after_pg_commit_redelivers_without_duplicates(own_server: NsjmsServer, client_orb: Any,
                                                                broker_url: str, fresh_db: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after the PostgreSQL branch of the 3rd T2 committed, before its STOMP COMMIT: the broker redelivers
    that T2's messages after the restart; the inbox acknowledges them without a second event."""
    n = 200
    queue = unique_name("t2in.kill")
    monkeypatch.setenv("NSJMS_CRASH_AT", "t2.after_pg_commit@3")
    own_server.start()
    monkeypatch.delenv("NSJMS_CRASH_AT")
    factory = client_orb.factory(own_server.ior())
    channel, cid = t2_channel(factory, events=20)
    consumer = _pull_consumer(channel)
    stomp_produce(broker_url, queue, range(n))
    bf = bridge_factory(client_orb, own_server)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, BA.PULL))
    bridge.start_bridge()
    assert own_server.proc is not None
    own_server.proc.wait(timeout=TIMEOUT_S)          # the crash point killed it
    assert own_server.proc.returncode == -9
    assert inbox_count(fresh_db, bid) >= 40, "the third T2 committed its PostgreSQL branch before the kill"
    own_server.restart()
    reconnect_client(bridge, consumer.proxy)
    assert wait_until(lambda: inbox_count(fresh_db, bid) >= n, TIMEOUT_S), \
        f"{inbox_count(fresh_db, bid)} inbox rows of {n}"
    counts = _drain_ids(consumer, n)
    _assert_once(counts, range(n), "JMS -> channel in T2 across a SIGKILL after the PostgreSQL commit")
    assert wait_until(lambda: bridge_status(own_server).get("duplicates_suppressed", 0) > 0, 10), \
        f"the broker redelivered the killed T2's messages and the inbox recognised them: {bridge_status(own_server)}"
    assert prepared_count(fresh_db) == 0
    print(f"JMS -> channel in T2, node killed at t2.after_pg_commit: {sum(counts.values())} events for "
          f"{n} messages, 0 duplicates")


def test_rollback_on_transaction_timeout_then_delivered_once(nsjms_server: NsjmsServer, factory: Any,
                                                             client_orb: Any, broker_url: str,
                                                             fresh_db: str) -> None:
    """The inbox table is locked by another session: the T2's claim waits past TransactionTimeout (1 s), the T2 is
    rolled back (nothing stored, the acks aborted); once the lock is gone the messages arrive exactly once."""
    n = 30
    queue = unique_name("t2in.timeout")
    channel, cid = t2_channel(factory, events=10, timeout_s=1)
    consumer = structured_consumer(channel)
    bf = bridge_factory(client_orb, nsjms_server)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, BA.PULL))
    bridge.start_bridge()
    with psycopg.connect(fresh_db) as blocker:
        blocker.execute("LOCK TABLE nsjms_inbox IN EXCLUSIVE MODE")
        stomp_produce(broker_url, queue, range(n))
        assert wait_until(lambda: t2_proxy_status(nsjms_server).get("t2_rolled_back", 0) >= 2, TIMEOUT_S), \
            t2_proxy_status(nsjms_server)
        assert consumer.count() == 0, "nothing is delivered from a rolled-back T2"
        blocker.rollback()
    assert wait_until(lambda: inbox_drained(fresh_db, bid, n, consumer), TIMEOUT_S), \
        f"{consumer.count()} events, {inbox_count(fresh_db, bid)} inbox rows of {n}"
    _assert_once(_ids(consumer), range(n), "JMS -> channel in T2 after rolled-back T2s")
    assert prepared_count(fresh_db) == 0
    bridge.destroy()
    assert leftover(broker_url, queue) == 0, "the aborted acks were made again in a later T2 (not stranded)"


def test_poison_message_is_dead_lettered_inside_t2(nsjms_server: NsjmsServer, factory: Any, client_orb: Any,
                                                    broker_url: str, fresh_db: str) -> None:
    n = 5
    queue = unique_name("t2in.poison")
    channel, cid = t2_channel(factory, events=10)
    consumer = structured_consumer(channel)
    stomp_produce(broker_url, queue, range(n), extra={2: b"expires:-5\n"})
    bf = bridge_factory(client_orb, nsjms_server)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, BA.PULL))
    bridge.start_bridge()
    good = [0, 1, 3, 4]
    assert wait_until(lambda: consumer.count() >= len(good), TIMEOUT_S), f"{consumer.count()} events"
    assert sorted(_ids(consumer)) == good
    t = open_transport(broker_url, codec=StompCodec())
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
    assert inbox_count(fresh_db, bid) == len(good), "a dead-lettered message keeps no inbox row"
    assert wait_until(lambda: t2_proxy_status(nsjms_server).get("t2_committed", 0) > 0, 10)
    bridge.destroy()
    assert leftover(broker_url, queue) == 0
    assert prepared_count(fresh_db) == 0


# ------------------------------------------------------------------------------------------- without a T2
@pytest.mark.parametrize("style", ["PULL", "PUSH"])
def test_without_t2_a_local_unit_of_work_is_exactly_once_across_a_sigkill(
        own_server: NsjmsServer, client_orb: Any, broker_url: str, fresh_db: str,
        monkeypatch: pytest.MonkeyPatch, style: str) -> None:
    """EnableTransaction FALSE, Persistent channel, the channel pulls from a bridge of its node (or the bridge
    pushes into it): the events and the inbox ids are committed in one local transaction, the acks written after
    it. Killed between the commit and the acks of the 3rd round: the broker redelivers, the inbox recognises,
    0 duplicates."""
    n = 300
    queue = unique_name(f"t2in.local.{style}")
    monkeypatch.setenv("NSJMS_CRASH_AT", "in.local.after_commit@3")
    own_server.start()
    monkeypatch.delenv("NSJMS_CRASH_AT")
    factory = client_orb.factory(own_server.ior())
    channel, cid = persistent_channel(factory)
    consumer = _pull_consumer(channel)
    stomp_produce(broker_url, queue, range(n))
    bf = bridge_factory(client_orb, own_server)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, getattr(BA, style)))
    bridge.start_bridge()
    assert own_server.proc is not None
    own_server.proc.wait(timeout=TIMEOUT_S)
    assert own_server.proc.returncode == -9
    assert inbox_count(fresh_db, bid) > 0
    own_server.restart()
    reconnect_client(bridge, consumer.proxy)
    assert wait_until(lambda: inbox_count(fresh_db, bid) >= n, TIMEOUT_S), \
        f"{inbox_count(fresh_db, bid)} inbox rows of {n}"
    _assert_once(_drain_ids(consumer, n), range(n),
                 "JMS -> channel without T2 across a SIGKILL after the local commit")
    assert wait_until(lambda: bridge_status(own_server).get("duplicates_suppressed", 0) > 0, 10), \
        bridge_status(own_server)
    assert t2_proxy_status(own_server).get("t2_committed", 0) == 0, "no T2 ran"
    bridge.destroy()
    assert leftover(broker_url, queue) == 0


# ------------------------------------------------------------------------------------------- broker killed
def test_broker_killed_mid_stream_in_t2_loses_nothing_and_duplicates_nothing(rig: Any, fresh_db: str) -> None:
    """ActiveMQ SIGKILLed while T2s run: connections die at every step, also between the PostgreSQL commit and the
    STOMP COMMIT (the broker then rolls the acks back and redelivers after its restart; the inbox recognises)."""
    n = 600
    queue = unique_name("t2in.broker")
    channel, cid = t2_channel(rig.factory, events=20)
    consumer = structured_consumer(channel)
    stomp_produce(rig.broker.url, queue, range(n))
    bridge, bid = rig.bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, BA.PULL))
    bridge.start_bridge()
    assert wait_until(lambda: consumer.count() >= 150, TIMEOUT_S), f"no progress: {consumer.count()}"
    rig.kill_broker()
    assert consumer.count() < n, "the kill did not land mid-stream"
    rig.broker.start()
    assert wait_until(lambda: bridge_status(rig.server).get("active") is True, 90), "Active after the restart"
    assert wait_until(lambda: inbox_drained(fresh_db, bid, n, consumer), TIMEOUT_S * 2), \
        f"{consumer.count()} events, {inbox_count(fresh_db, bid)} inbox rows of {n}"
    _assert_once(_ids(consumer), range(n), "JMS -> channel in T2 across a broker SIGKILL")
    assert prepared_count(fresh_db) == 0
    bridge.destroy()
    assert leftover(rig.broker.url, queue) == 0
    print(f"JMS -> channel in T2, broker killed: {consumer.count()} events for {n} messages, 0 duplicates")


# ------------------------------------------------------------------------------------- broker state over many T2s
def _stomp_ack_entries(pid: int) -> int:
    """Live ``StompAckEntry`` objects in the broker (ActiveMQ's state per delivered STOMP message): ``jcmd
    GC.class_histogram`` runs a full GC first, so only what the broker still references is counted."""
    out = subprocess.run(["jcmd", str(pid), "GC.class_histogram"], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    found = re.search(r"^\s*\d+:\s+(\d+)\s+\d+\s+org\.apache\.activemq\.transport\.stomp\.StompAckEntry\s*$", out,
                      re.M)
    return int(found.group(1)) if found else 0


def test_the_brokers_state_per_acked_message_stays_bounded_over_many_t2s(rig: Any, fresh_db: str) -> None:
    """Issue 31 (JMS -> channel collapsed after 11 minutes at 73/s): ActiveMQ 5.17 keeps every message ACKed in a
    STOMP transaction on a client-individual subscription until the connection ends (``StompSubscription``'s
    ``transactedMessages``, cleared at COMMIT only for ``client`` acks) and scans it at every COMMIT. The bridge
    renews its connection every ``RENEW_AFTER`` transacted deliveries: after 2,000 messages the broker holds at most
    that many plus a prefetch and a batch (it held all 2,000 before)."""
    n = 2 * RENEW_AFTER
    queue = unique_name("t2in.bounded")
    channel, cid = t2_channel(rig.factory, events=100)
    consumer = structured_consumer(channel)
    stomp_produce(rig.broker.url, queue, range(n))
    bridge, bid = rig.bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, BA.PULL))
    bridge.start_bridge()
    assert wait_until(lambda: inbox_drained(fresh_db, bid, n, consumer), TIMEOUT_S * 2), \
        f"{consumer.count()} events, {inbox_count(fresh_db, bid)} inbox rows of {n}"
    pid = rig.broker.pid
    assert pid is not None
    entries = _stomp_ack_entries(pid)
    bound = RENEW_AFTER + DEFAULT_PREFETCH + 100
    assert entries <= bound, f"the broker holds {entries} STOMP ack entries after {n} messages (bound {bound})"
    _assert_once(_ids(consumer), range(n), "JMS -> channel in T2 across connection renewals")
    assert prepared_count(fresh_db) == 0
    bridge.destroy()
    assert leftover(rig.broker.url, queue) == 0
    print(f"{n} messages in T2s: {entries} StompAckEntry objects in the broker (bound {bound})")


def test_enable_transaction_on_a_pull_bridge_switches_its_proxy_to_t2(nsjms_server: NsjmsServer, factory: Any,
                                                                      client_orb: Any, broker_url: str,
                                                                      fresh_db: str) -> None:
    """BridgeTransactionMgmt for JMS -> channel: enable_transaction writes EnableTransaction and TransactionEvents
    on the bridge's pull proxy consumer of a Persistent channel that has no transaction settings of its own; the
    messages then arrive exactly once, each batch in a T2."""
    persistent = short(1)
    channel, cid = factory.create_channel([prop("EventReliability", persistent),
                                           prop("ConnectionReliability", persistent)], [])
    consumer = structured_consumer(channel)
    queue = unique_name("t2in.mgmt")
    bf = bridge_factory(client_orb, nsjms_server)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, int(cid), BA.PULL))
    managed = bridge._narrow(NsjmsAdmin.ManagedBridge)
    managed.enable_transaction(20, 0)
    with pytest.raises(BTM.TransactionAlreadyActive):
        managed.enable_transaction(20, 0)
    n = 120
    stomp_produce(broker_url, queue, range(n))
    bridge.start_bridge()
    assert wait_until(lambda: inbox_drained(fresh_db, bid, n, consumer), TIMEOUT_S), \
        f"{consumer.count()} events, {inbox_count(fresh_db, bid)} inbox rows of {n}"
    assert wait_until(lambda: t2_proxy_status(nsjms_server).get("t2_committed", 0) >= n // 20, 10), \
        t2_proxy_status(nsjms_server)
    _assert_once(_ids(consumer), range(n), "JMS -> channel in T2 enabled by enable_transaction")
    assert prepared_count(fresh_db) == 0


def test_postgres_stopped_before_phase_two_delivers_the_t2_without_a_node_restart(
        tmp_path: Path, own_pg: EmbeddedPostgres, broker_url: str, client_orb: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31: PostgreSQL stopped at once (immediate: no shutdown checkpoint) while the 2nd T2 is decided and its
    phase two not begun: its COMMIT PREPARED meets a dead connection, so its PostgreSQL branch is not confirmed and
    recovery commits it from the COMMIT record. Before, its events then stayed in the store until the node
    restarted; now they are queued once recovery committed the branch, and every message reaches the consumer
    exactly once with the same node process."""
    n = 100
    queue = unique_name("t2in.pgstop")
    pause = tmp_path / "pause"
    pause.mkdir()
    marker = pause / "t2.in.before_phase_two.2.reached"  # router.routing.crashpoints.pausepoint
    monkeypatch.setenv("NSJMS_PAUSE_AT", "t2.in.before_phase_two@2")
    monkeypatch.setenv("NSJMS_PAUSE_DIR", str(pause))
    state = tmp_path / "state"
    state.mkdir()
    server = NsjmsServer(state_dir=state, pg_dsn=own_pg.dsn, broker_url=broker_url, port=free_port())
    try:
        server.start()
        monkeypatch.delenv("NSJMS_PAUSE_AT")
        pid = server.pid
        factory = client_orb.factory(server.ior())
        channel, cid = t2_channel(factory, events=20)
        consumer = structured_consumer(channel)
        stomp_produce(broker_url, queue, range(n))
        bf = bridge_factory(client_orb, server)
        bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, BA.PULL))
        bridge.start_bridge()
        assert wait_until(marker.exists, TIMEOUT_S), "the second T2 never reached its phase two"
        own_pg._pg_ctl("stop", "-m", "immediate")
        own_pg.start()
        (pause / "t2.in.before_phase_two.2.go").touch()   # phase two goes on, on a connection the stop broke
        assert wait_until(lambda: set(_ids(consumer)) >= set(range(n)), 2 * TIMEOUT_S), \
            f"{len(set(range(n)) - set(_ids(consumer)))} of {n} message(s) never reached the consumer"
        assert wait_until(lambda: len(consumer.snapshot()) > n, 2.0) is False, "duplicates arrived"
        _assert_once(_ids(consumer), range(n), "JMS -> channel in T2 across a PostgreSQL immediate stop")
        assert server.proc is not None and server.proc.poll() is None and server.pid == pid, "the node restarted"
        log_text = server.stderr_path.read_text(errors="replace")
        assert "recovery committed its PostgreSQL branch" in log_text, \
            "the fault did not hit the T2's phase two (its branch was confirmed): the test did not exercise it"
        assert wait_until(lambda: inbox_count(own_pg.dsn, bid) == n, TIMEOUT_S)
        with psycopg.connect(own_pg.dsn) as conn:          # each row in its message's sent-day partition (0005)
            undated = conn.execute("SELECT count(*) FROM nsjms_inbox WHERE bridge_id = %s AND sent_day = "
                                   "DATE '1970-01-01'", (bid,)).fetchone()
        assert undated == (0,), "the bridge passes each message's JMSTimestamp to the inbox"
        assert prepared_count(own_pg.dsn) == 0
        bridge.destroy()
    finally:
        if marker.exists():
            marker.unlink()
        server.stop()
