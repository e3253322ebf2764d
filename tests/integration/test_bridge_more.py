"""More NS⇄JMS bridge behaviour on a real node: node SIGKILL (JMS → channel), dead-lettering of unexpressible events,
BridgeTransactionMgmt, durable topic sources across stop/start, acknowledgement mapping (NJI 2.6) and the
``nsjms bridge`` command line.

Clients use only OMG IDL stubs (COS, ``CosBridgeAdmin``, the acknowledgement modules) plus the project's derived
``NsjmsAdmin::ManagedBridge`` / ``BridgeTransactionMgmt`` where a test needs them; JMS traffic is produced and
consumed by the Java JMS client over OpenWire.

Duplicates allowed in :func:`test_node_sigkill_jms_to_channel` (the *unknown-outcome windows*):

* **bridge → broker ack window**: the bridge pushes one event at a time into the channel (a structured endpoint),
  and sends the broker its ACK once the channel committed the event. A SIGKILL after the commit and before the
  broker processed that ACK makes the broker redeliver the message after the restart, and the bridge's memory of
  forwarded message ids died with the process: that message becomes a second event. ACK frames go without a
  receipt, so besides the one between commit and ACK, ACKs written to the socket but not yet read by the broker can
  be lost with the connection (a killed process's socket is reset when it holds unread MESSAGE frames, which the
  prefetch guarantees). On loopback the broker reads ACKs as they come, so this is a few at most: **2**.
* **channel → consumer window**: the channel pushes one event at a time to the (structured) consumer and deletes its
  queue row after the push returned; a kill in between makes it push that event again after the restart: **1**.

Hence at most **3** duplicates; 0 lost.
"""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from omniORB import CORBA

import CosNotification

from idl.generated import BridgeTransactionMgmt as BTM
from idl.generated import CosBridgeAdmin as BA
from idl.generated import CosNotifyCommAck, NsjmsAdmin

from bridgekit import JavaTool, bridge_factory, channel_ep, inbox_count, jms_ep, pg_scalar, reconnect_client
from conftest import NsjmsServer
from stdclients import (
    Form,
    PushSupplierClient,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    long_,
    make_event,
    obtain_proxy_consumer,
    obtain_proxy_supplier,
    prop,
    short,
    time_t,
    wait_until,
)

pytestmark = pytest.mark.integration

PERSISTENT = CosNotification.Persistent
S, Q = BA.STRUCTURED_EVENT, BA.SEQUENCE_EVENT
TIMEOUT_S = 60.0
KILL_N = 600
KILL_AT = 150
KILL_MAX_DUPS = 3          # see the module docstring
STOMP_HEADER_LIMIT = 10 * 1024


def _name(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


@pytest.fixture
def bf(nsjms_server: NsjmsServer, client_orb: Any) -> Any:
    return bridge_factory(client_orb, nsjms_server)


def _persistent_channel(factory: Any, extra: list[Any] | None = None) -> tuple[Any, int]:
    qos = [prop("EventReliability", short(PERSISTENT)), prop("ConnectionReliability", short(PERSISTENT))]
    return factory.create_channel(qos + list(extra or []), [])


def _consumer(channel: Any) -> StructuredPushConsumer:
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
    consumer = StructuredPushConsumer()
    connect_push_consumer(proxy, Form.STRUCTURED, consumer)
    return consumer


def _sequence_supplier(channel: Any, batch: int = 50) -> PushSupplierClient:
    proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.SEQUENCE, Style.PUSH)
    client = PushSupplierClient(proxy, Form.SEQUENCE, batch_size=batch)
    client.connect()
    return client


def _managed(bridge: Any) -> Any:
    managed = bridge._narrow(NsjmsAdmin.ManagedBridge)
    assert managed is not None
    return managed


def _fd_n(ev: Any) -> int:
    return int({p.name: p.value.value() for p in ev.filterable_data}["n"])


def _event_ids(messages: list[dict[str, Any]]) -> list[int]:
    return [int(m["properties"]["$event_name"]["value"][1:]) for m in messages]


def _bridge_status(server: NsjmsServer, bid: int) -> dict[str, Any]:
    """The bridge's line of the node's ``status.json`` (rewritten every 2 s)."""
    try:
        data = json.loads((Path(server.state_dir) / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return next((b for b in data.get("bridges", []) if b["id"] == bid), {})


# --------------------------------------------------------------------------- 1. node SIGKILL, JMS → channel
def test_node_sigkill_jms_to_channel(nsjms_server: NsjmsServer, bf: Any, factory: Any,
                                     java_tool: JavaTool) -> None:
    channel, cid = _persistent_channel(factory)
    queue = _name("more.kill.in")
    consumer = _consumer(channel)
    java_tool.produce("queue", queue, KILL_N, "text")              # persistent messages, queued before the bridge
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid))
    bridge.start_bridge()
    assert wait_until(lambda: consumer.count() >= KILL_AT, TIMEOUT_S), f"no progress: {consumer.count()}"
    nsjms_server.kill(signal.SIGKILL)
    at_kill = consumer.count()
    assert at_kill < KILL_N, "the kill did not land mid-stream"
    nsjms_server.restart()
    reconnect_client(bridge)
    assert wait_until(lambda: _managed(bridge).get_status() == NsjmsAdmin.started, 30), "the bridge resumes"

    def distinct() -> int:
        return len({_fd_n(ev) for ev in consumer.snapshot()})

    assert wait_until(lambda: distinct() >= KILL_N, TIMEOUT_S), f"{distinct()} of {KILL_N} distinct events"
    # no more can come: every message is in the inbox (a redelivery is acknowledged without an event) and the
    # channel holds nothing more for the consumer
    dsn = nsjms_server.pg_dsn
    assert wait_until(lambda: inbox_count(dsn, bid) >= KILL_N
                      and pg_scalar(dsn, "SELECT count(*) FROM nsjms_queue WHERE channel_id = %s", cid) == 0,
                      TIMEOUT_S), (inbox_count(dsn, bid), consumer.count())
    counts = collections.Counter(_fd_n(ev) for ev in consumer.snapshot())
    lost = sorted(set(range(KILL_N)) - set(counts))
    assert not lost, f"lost {len(lost)}, e.g. {lost[:10]}"
    assert set(counts) == set(range(KILL_N))
    dups = sum(c - 1 for c in counts.values())
    assert dups <= KILL_MAX_DUPS, f"{dups} duplicates: more than the unknown-outcome windows allow"
    assert java_tool.consume("queue", queue, 1, 1.5) == [], "every message was acknowledged to the broker"
    print(f"JMS -> channel, node killed after {at_kill} events: {sum(counts.values())} events, {dups} duplicate(s)")


# --------------------------------------------------------------------------- 2. channel → JMS dead letter
def test_unexpressible_event_is_dead_lettered_and_order_kept(bf: Any, factory: Any, java_tool: JavaTool) -> None:
    """A filterable_data string longer than a STOMP header may be (ActiveMQ refuses header lines above 10 KiB and
    drops the connection): the event cannot be expressed as a STOMP message for this broker, so it goes to
    ``nsjms.DLQ`` with the reason, and the events around it arrive in order."""
    channel, cid = _persistent_channel(factory)             # a queue needs a Persistent channel (NJI Table 2-3)
    queue = _name("more.dlq.out")
    bridge, bid = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, queue))
    bridge.start_bridge()
    bad = make_event(5)
    bad.filterable_data.append(prop("huge", CORBA.Any(CORBA.TC_string, "x" * (2 * STOMP_HEADER_LIMIT))))
    events = [make_event(i) for i in range(5)] + [bad] + [make_event(i) for i in range(6, 11)]
    proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
    supplier = PushSupplierClient(proxy, Form.STRUCTURED)
    supplier.connect()
    supplier.push_all(events)
    got = java_tool.consume("queue", queue, 10, 20)
    got += java_tool.consume("queue", queue, 1, 1.5)
    assert _event_ids(got) == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10], "events before and after it arrive, in order"
    mine = f"nsjms_dlq_bridge = '{bid}' AND nsjms_dlq_origin = 'event' AND nsjms_dlq_reason LIKE '%fd_huge%'"
    dead = java_tool.consume("queue", "nsjms.DLQ", 1, 10, mine)
    dead += java_tool.consume("queue", "nsjms.DLQ", 1, 1.5, mine)
    assert len(dead) == 1, dead
    props = dead[0]["properties"]
    assert props["nsjms_dlq_origin"]["value"] == "event"
    assert "huge" in props["nsjms_dlq_reason"]["value"], props["nsjms_dlq_reason"]
    assert dead[0]["class"] == "ActiveMQBytesMessage", "the event's CDR encapsulation"
    assert _managed(bridge).get_status() == NsjmsAdmin.started


# --------------------------------------------------------------------------- 3. BridgeTransactionMgmt
def test_transaction_management(nsjms_server: NsjmsServer, bf: Any, factory: Any, java_tool: JavaTool) -> None:
    batch = [prop("MaximumBatchSize", long_(50)), prop("PacingInterval", time_t(0.2))]
    channel, cid = _persistent_channel(factory, batch)
    queue = _name("more.tx")
    bridge, bid = bf.create_bridge(channel_ep(BA.SOURCE, cid, BA.PUSH, Q), jms_ep(BA.SINK, queue))
    managed = _managed(bridge)
    tx = bridge._narrow(BTM.TransactionManagement)
    assert tx is not None, "a bridge is a BridgeTransactionMgmt::TransactionManagement"
    with pytest.raises(BTM.UnsupportedTransaction):
        managed.enable_transaction(0, 10)                         # events = 0
    managed.enable_transaction(20, 10)
    with pytest.raises(BTM.TransactionAlreadyActive):
        managed.enable_transaction(20, 10)
    with pytest.raises(BTM.TransactionAlreadyActive):
        tx.enable_transaction(5, 1)
    bridge.start_bridge()
    supplier = _sequence_supplier(channel)
    supplier.push_all([make_event(i) for i in range(100)])
    got = java_tool.consume("queue", queue, 100, 20)
    got += java_tool.consume("queue", queue, 1, 1.0)
    assert _event_ids(got) == list(range(100)), "the transacted batches arrive complete and in order"
    assert wait_until(lambda: _bridge_status(nsjms_server, bid).get("transaction_events") == 20, 10, 0.5)

    inbound, _ = bf.create_bridge(jms_ep(BA.SOURCE, _name("more.tx.in")), channel_ep(BA.SINK, cid))
    with pytest.raises(BTM.UnsupportedTransaction):
        _managed(inbound).enable_transaction(10, 10)               # JMS → channel, the bridge pushing (NJI 2.7.2)

    managed.disable_transaction()
    managed.disable_transaction()                                  # nothing enabled: still fine
    supplier.push_all([make_event(i) for i in range(100, 150)])
    got = java_tool.consume("queue", queue, 50, 20)
    assert _event_ids(got) == list(range(100, 150)), "without a transaction the batches flow as before"
    managed.enable_transaction(7, 30)

    nsjms_server.stop()
    nsjms_server.restart()
    reconnect_client(bridge, supplier.proxy)
    with pytest.raises(BTM.TransactionAlreadyActive):
        managed.enable_transaction(20, 10)                         # the setting survived the restart
    assert wait_until(lambda: _bridge_status(nsjms_server, bid).get("transaction_events") == 7, 10, 0.5)
    assert wait_until(lambda: managed.get_status() == NsjmsAdmin.started, 30)
    supplier.push_all([make_event(i) for i in range(150, 200)])
    got = java_tool.consume("queue", queue, 50, 20)
    assert _event_ids(got) == list(range(150, 200))
    managed.disable_transaction()
    managed.enable_transaction(3, 5)


# --------------------------------------------------------------------------- 4. durable topic source
def test_durable_topic_source_keeps_messages_while_stopped(nsjms_server: NsjmsServer, bf: Any, factory: Any,
                                                           java_tool: JavaTool) -> None:
    channel, cid = _persistent_channel(factory)
    topic = _name("more.topic")
    consumer = _consumer(channel)
    bridge, _ = bf.create_bridge(jms_ep(BA.SOURCE, topic, BA.TOPIC), channel_ep(BA.SINK, cid))
    bridge.start_bridge()
    assert wait_until(lambda: _managed(bridge).get_status() == NsjmsAdmin.started, 15)
    java_tool.produce("topic", topic, 5, "text")
    assert consumer.wait_for(5, 20), f"{consumer.count()} of 5 while started"
    bridge.stop_bridge()
    # the bridge's subscription is offline. Message n=50, published last, is a marker: the durable subscription,
    # the bridge and the channel keep the order, so once it arrived every other message arrived before it
    java_tool.produce("topic", topic, 51, "text")
    time.sleep(1.0)   # stays: no flow runs while stopped, so no marker can show that nothing is forwarded
    assert consumer.count() == 5, "a stopped bridge forwards nothing"
    bridge.start_bridge()
    assert wait_until(lambda: 50 in [_fd_n(ev) for ev in consumer.snapshot()], 30), \
        f"{consumer.count()} of 56: messages published while stopped were lost"
    ids = sorted(_fd_n(ev) for ev in consumer.snapshot())
    assert ids == sorted(list(range(5)) + list(range(51))), ids


# --------------------------------------------------------------------------- 5. acknowledgement (combination 4)
ACK_RETRIES = 2
ACK_INTERVAL_S = 0.5
ACK_N = 40


def _combination4() -> list[Any]:
    return [prop("DeliveryReliability", short(CosNotifyCommAck.Acknowledgment)),
            prop("Retries", long_(ACK_RETRIES)), prop("RetryInterval", time_t(ACK_INTERVAL_S))]


def _stopped_connections(client_orb: Any, server: NsjmsServer) -> list[str]:
    """Names of the node's stopped logical connections (``corbaloc::…/NsjmsStatus``, a QoSAdmin)."""
    assert server.endpoints is not None
    corbaloc = server.endpoints["event_channel_factory"]["corbaloc"].rsplit("/", 1)[0] + "/NsjmsStatus"
    status = client_orb.orb.string_to_object(corbaloc)._narrow(CosNotification.QoSAdmin)
    return [p.name for p in status.get_qos()]


def test_acknowledgement_mapping_combination4(nsjms_server: NsjmsServer, client_orb: Any, bf: Any, factory: Any,
                                              java_tool: JavaTool) -> None:
    """Bridges of every channel-side kind on an Acknowledgment channel: each acknowledges what the broker confirmed
    (NJI 2.6.2), so nothing is resent after RetryInterval and no connection stops."""
    channel, cid = _persistent_channel(factory, _combination4())
    queues = {}
    for style in (BA.PUSH, BA.PULL):
        for kind in (S, Q):
            queue = _name(f"more.ack.{style}.{kind}")
            bridge, _ = bf.create_bridge(channel_ep(BA.SOURCE, cid, style, kind), jms_ep(BA.SINK, queue))
            bridge.start_bridge()
            queues[f"{style}/{kind}"] = queue
    supplier = _sequence_supplier(channel, batch=10)
    supplier.push_all([make_event(i, reliability=PERSISTENT) for i in range(ACK_N)])
    for label, queue in queues.items():
        got = java_tool.consume("queue", queue, ACK_N, 20)
        assert sorted(_event_ids(got)) == list(range(ACK_N)), f"{label}: {len(got)} of {ACK_N}"
    # stays: the RetryInterval (Acknowledgment QoS) must pass for an unacknowledged event to be resent
    time.sleep((ACK_RETRIES + 2) * ACK_INTERVAL_S)                # unacknowledged events would be resent by now
    for label, queue in queues.items():
        again = java_tool.consume("queue", queue, ACK_N, 1.5)
        assert again == [], f"{label}: {len(again)} event(s) resent: the bridge did not acknowledge them"
    assert _stopped_connections(client_orb, nsjms_server) == [], "no logical connection stopped"
    supplier.push_all([make_event(i, reliability=PERSISTENT) for i in range(ACK_N, ACK_N + 10)])
    for label, queue in queues.items():
        got = java_tool.consume("queue", queue, 10, 20)
        assert sorted(_event_ids(got)) == list(range(ACK_N, ACK_N + 10)), f"{label}: delivery goes on"


# --------------------------------------------------------------------------- 6. the nsjms bridge CLI
def _cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "router.cli", "bridge", "--state-dir", str(state_dir), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_bridge_cli(nsjms_server: NsjmsServer, bf: Any, factory: Any, java_tool: JavaTool, tmp_path: Path) -> None:
    state = nsjms_server.state_dir
    _, cid = _persistent_channel(factory)
    queue = _name("more.cli")
    done = _cli(state, "list")
    assert (done.returncode, done.stdout.strip()) == (0, "no bridges"), done.stderr

    done = _cli(state, "create", "--from", f"channel:{cid}", "--to", f"queue:{queue}")
    assert done.returncode == 0, done.stdout + done.stderr
    bid = int(done.stdout.split()[1])
    assert list(bf.get_all_bridges()) == [bid]
    bridge = bf.get_bridge_with_id(bid)
    assert wait_until(lambda: _managed(bridge).get_status() == NsjmsAdmin.started, 15)
    _sequence_supplier(factory.get_event_channel(cid)).push_all([make_event(i) for i in range(20)])
    assert sorted(_event_ids(java_tool.consume("queue", queue, 20, 20))) == list(range(20))

    assert wait_until(lambda: "[active]" in _cli(state, "list").stdout, 15), "the node's snapshot says Active"
    done = _cli(state, "list")
    assert done.returncode == 0 and f"bridge {bid}: channel:{cid}" in done.stdout and "[active]" in done.stdout, \
        done.stdout
    assert _cli(state, "stop", str(bid)).returncode == 0
    assert _managed(bridge).get_status() == NsjmsAdmin.stopped
    assert "[inactive]" in _cli(state, "list").stdout
    refused = _cli(state, "stop", str(bid))
    assert refused.returncode == 4 and "not started" in refused.stdout, refused.stdout + refused.stderr
    assert _cli(state, "start", str(bid)).returncode == 0
    assert wait_until(lambda: _managed(bridge).get_status() == NsjmsAdmin.started, 15)
    assert _cli(state, "start", str(bid)).returncode == 4, "already started"

    bad = _cli(state, "create", "--from", "chanel:1", "--to", f"queue:{queue}")
    assert bad.returncode == 2 and "--from" in bad.stderr, bad.stdout + bad.stderr
    unknown = _cli(state, "create", "--from", "channel:99999", "--to", f"queue:{queue}")
    assert unknown.returncode == 4 and "INVALID_CHANNELID" in unknown.stdout, unknown.stdout + unknown.stderr
    assert _cli(state, "destroy", str(bid + 100)).returncode == 4

    assert _cli(state, "destroy", str(bid)).returncode == 0
    assert list(bf.get_all_bridges()) == []
    assert _cli(state, "list").stdout.strip() == "no bridges"

    empty = tmp_path / "no-node"
    empty.mkdir()
    assert _cli(empty, "list").returncode == 3, "no endpoints.json: no node"
    nsjms_server.kill(signal.SIGKILL)                              # endpoints.json stays behind, the node is gone
    stale = _cli(state, "list")
    assert stale.returncode == 3, stale.stdout + stale.stderr


def test_bridge_cli_transaction(nsjms_server: NsjmsServer, bf: Any, factory: Any) -> None:
    """Issue 29: no CLI way made a bridge transactional (`bridge create --transaction EVENTS[:TIMEOUT]`, and
    `bridge transaction ID EVENTS[:TIMEOUT]|off` on an existing bridge)."""
    state = nsjms_server.state_dir
    _, cid = _persistent_channel(factory)
    queue = _name("more.cli.tx")
    done = _cli(state, "create", "--from", f"channel:{cid}", "--to", f"queue:{queue}", "--transaction", "20:30",
                "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    bid = int(json.loads(done.stdout)["id"])
    managed = _managed(bf.get_bridge_with_id(bid))
    with pytest.raises(BTM.TransactionAlreadyActive):
        managed.enable_transaction(5, 5)                           # enabled by the CLI
    assert wait_until(lambda: _bridge_status(nsjms_server, bid).get("transaction_events") == 20, 15, 0.5)

    again = _cli(state, "transaction", str(bid), "7")
    assert again.returncode == 4 and "TransactionAlreadyActive" in again.stdout, again.stdout + again.stderr
    off = _cli(state, "transaction", str(bid), "off")
    assert off.returncode == 0 and "disabled" in off.stdout, off.stdout + off.stderr
    on = _cli(state, "transaction", str(bid), "7:0")
    assert on.returncode == 0 and "7 event(s) enabled" in on.stdout, on.stdout + on.stderr
    assert wait_until(lambda: _bridge_status(nsjms_server, bid).get("transaction_events") == 7, 15, 0.5)
    assert _cli(state, "transaction", str(bid), "0").returncode == 2, "EVENTS >= 1: a usage error"

    inbound = _cli(state, "create", "--from", f"queue:{_name('more.cli.tx.in')}", "--to", f"channel:{cid}",
                   "--transaction", "10")                          # the bridge pushing to the channel: refused
    assert inbound.returncode == 4 and "UnsupportedTransaction" in inbound.stdout, inbound.stdout + inbound.stderr
    assert list(bf.get_all_bridges()) == [bid], "the refused bridge was destroyed"
    assert _cli(state, "destroy", str(bid)).returncode == 0
