"""Bridge lifecycle against a real node and a real ActiveMQ: broker outages of any length, node SIGKILL with a
pull-style JMS → channel bridge, and what ``stop_bridge`` / ``destroy`` do to the JMS subscription (NJI 2.3).

* **Outage longer than Retries * RetryInterval.** On an Acknowledgment channel the bridge's proxy is an Ack proxy:
  every TRANSIENT answer while the broker is away counts against ``Retries`` and, once they run out, the channel
  STOPS that logical connection. The bridge must resume it by itself when the broker is back (it used to stay
  stopped until an operator called ``resume_connection``, and the events queued meanwhile never left).
* **Pull-style JMS → channel across SIGKILL.** After a restart the channel's pull proxy pulls from the bridge while
  the bridge (re)subscribes: two subscriptions could be made, the second one's prefetch (up to 100 messages) stayed
  un-acked and undelivered. Every message must arrive (0 lost) and none may stay on the queue.
* **stop keeps the subscription** (JMS ``Connection.stop``): a non-durable topic source keeps what is published while
  the bridge is stopped; **destroy removes a durable subscription** (the broker stops keeping messages for it).
"""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import CosNotification

from idl.generated import CosBridgeAdmin as BA
from idl.generated import CosNotifyCommAck

from bridgekit import JavaTool, bridge_factory, channel_ep, jms_ep, reconnect_client
from conftest import NsjmsServer, Rig
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
S = BA.STRUCTURED_EVENT
TIMEOUT_S = 60.0
RETRIES = 2
RETRY_INTERVAL_S = 0.5


def _name(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


def _persistent_channel(factory: Any, extra: list[Any] | None = None) -> tuple[Any, int]:
    qos = [prop("EventReliability", short(PERSISTENT)), prop("ConnectionReliability", short(PERSISTENT))]
    return factory.create_channel(qos + list(extra or []), [])


def _consumer(channel: Any) -> StructuredPushConsumer:
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
    consumer = StructuredPushConsumer()
    connect_push_consumer(proxy, Form.STRUCTURED, consumer)
    return consumer


def _fd_n(ev: Any) -> int:
    return int({p.name: p.value.value() for p in ev.filterable_data}["n"])


def _event_ids(messages: list[dict[str, Any]]) -> list[int]:
    return [int(m["properties"]["$event_name"]["value"][1:]) for m in messages]


def _stopped_connections(client_orb: Any, server: NsjmsServer) -> list[str]:
    """Names of the node's stopped logical connections (``corbaloc::…/NsjmsStatus``, a QoSAdmin)."""
    assert server.endpoints is not None
    corbaloc = server.endpoints["event_channel_factory"]["corbaloc"].rsplit("/", 1)[0] + "/NsjmsStatus"
    status = client_orb.orb.string_to_object(corbaloc)._narrow(CosNotification.QoSAdmin)
    return [p.name for p in status.get_qos()]


# ------------------------------------------------------------------------------------ a broker of the test
def test_bridges_resume_by_themselves_after_an_outage_longer_than_retries(rig: Rig, client_orb: Any) -> None:
    ack = [prop("DeliveryReliability", short(CosNotifyCommAck.Acknowledgment)), prop("Retries", long_(RETRIES)),
           prop("RetryInterval", time_t(RETRY_INTERVAL_S))]
    channel, cid = _persistent_channel(rig.factory, ack)
    queues = {}
    for style in (BA.PUSH, BA.PULL):
        queues[str(style)] = _name(f"outage.{style}")
        bridge, _ = rig.bf.create_bridge(channel_ep(BA.SOURCE, cid, style, S), jms_ep(BA.SINK, queues[str(style)]))
        bridge.start_bridge()
    proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
    supplier = PushSupplierClient(proxy, Form.STRUCTURED)
    supplier.connect()
    for i in range(10):
        supplier.push_one(make_event(i, reliability=PERSISTENT))
    for label, queue in queues.items():
        got = rig.java.consume("queue", queue, 10, 30)
        assert sorted(_event_ids(got)) == list(range(10)), f"{label} before the outage: {len(got)}"

    rig.kill_broker()
    for i in range(10, 30):                         # the channel keeps accepting while the broker is away
        supplier.push_one(make_event(i, reliability=PERSISTENT))
    # Longer than Retries x RetryInterval: the channel has stopped the bridge's Ack connection(s) by now.
    assert wait_until(lambda: len(_stopped_connections(client_orb, rig.server)) >= 1, 60), \
        "the outage did not exhaust the Ack proxy's retries"
    rig.broker.start()
    for label, queue in queues.items():
        got = rig.java.consume("queue", queue, 20, TIMEOUT_S)
        counts = collections.Counter(_event_ids(got))
        missing = sorted(set(range(10, 30)) - set(counts))
        assert not missing, f"{label}: after the outage {len(missing)} event(s) never arrived, e.g. {missing[:5]}"
    assert wait_until(lambda: _stopped_connections(client_orb, rig.server) == [], 30), \
        "a stopped connection is still reported after the bridge resumed"
    for i in range(30, 35):
        supplier.push_one(make_event(i, reliability=PERSISTENT))
    for label, queue in queues.items():
        got = rig.java.consume("queue", queue, 5, 30)
        assert set(range(30, 35)) <= set(_event_ids(got)), f"{label}: delivery goes on"


# ------------------------------------------------------------------------------------ the session broker
@pytest.fixture
def bf(nsjms_server: NsjmsServer, client_orb: Any) -> Any:
    return bridge_factory(client_orb, nsjms_server)


KILL_N = 400
KILL_AT = 60
KILL_MAX_DUPS = 3          # as test_bridge_more.test_node_sigkill_jms_to_channel: ack window 2 + channel window 1


def _cli(state_dir: Path, *args: str, ok: tuple[int, ...] = (0,)) -> str:
    argv = [sys.executable, "-m", "router.cli", *args, "--state-dir", str(state_dir)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode in ok, done.stdout + done.stderr
    return done.stdout


def _exit(state_dir: Path, *args: str) -> int:
    argv = [sys.executable, "-m", "router.cli", *args, "--state-dir", str(state_dir)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL).returncode


def test_broker_down_is_inactive_with_the_reason_in_bridge_list_and_status(rig: Rig) -> None:
    """A started bridge whose broker is down is Inactive (NJI 2.3). ``bridge list`` used to print ``[active]`` for
    it (it read the administrative ``get_status``); both commands now render the node's state and reason."""
    _, cid = _persistent_channel(rig.factory)
    bridge, bid = rig.bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, _name("vocab")))
    bridge.start_bridge()
    state = rig.server.state_dir

    def line(*args: str) -> str:       # `status` exits 8 while the broker is down (degraded, docs/cli.md)
        ok = (0, 8) if args[0] == "status" else (0,)
        return next((ln for ln in _cli(state, *args, ok=ok).splitlines() if ln.startswith(f"bridge {bid}:")), "")

    assert wait_until(lambda: "[active]" in line("status"), TIMEOUT_S), line("status")
    assert "[active]" in line("bridge", "list")
    rig.kill_broker()
    down = "[inactive] started, broker down; reconnecting"
    assert wait_until(lambda: down in line("bridge", "list"), TIMEOUT_S), line("bridge", "list")
    assert wait_until(lambda: down in line("status"), TIMEOUT_S), line("status")
    assert wait_until(lambda: _exit(state, "status") == 8, TIMEOUT_S), "status never said degraded (exit 8)"
    rig.broker.start()
    assert wait_until(lambda: "[active]" in line("status"), 2 * TIMEOUT_S), line("status")
    assert "[active]" in line("bridge", "list")
    assert wait_until(lambda: _exit(state, "status") == 0, TIMEOUT_S), "status stays degraded"
    bridge.stop_bridge()
    assert "[inactive] stopped" in line("bridge", "list")


def test_pull_style_jms_to_channel_loses_nothing_across_sigkill(nsjms_server: NsjmsServer, bf: Any, factory: Any,
                                                                java_tool: JavaTool) -> None:
    channel, cid = _persistent_channel(factory)
    queue = _name("lifecycle.pull.kill")
    consumer = _consumer(channel)
    java_tool.produce("queue", queue, KILL_N, "text")
    bridge, _ = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, BA.PULL, S))
    bridge.start_bridge()
    assert wait_until(lambda: consumer.count() >= KILL_AT, TIMEOUT_S), f"no progress: {consumer.count()}"
    nsjms_server.kill(signal.SIGKILL)
    at_kill = consumer.count()
    assert at_kill < KILL_N, "the kill did not land mid-stream"
    nsjms_server.restart()
    reconnect_client(bridge)

    def distinct() -> int:
        return len({_fd_n(ev) for ev in consumer.snapshot()})

    assert wait_until(lambda: distinct() >= KILL_N, TIMEOUT_S), \
        f"{distinct()} of {KILL_N} distinct events: messages stranded after the restart"
    counts = collections.Counter(_fd_n(ev) for ev in consumer.snapshot())
    assert set(counts) == set(range(KILL_N))
    dups = sum(c - 1 for c in counts.values())
    assert dups <= KILL_MAX_DUPS, f"{dups} duplicates"
    bridge.destroy()
    left = java_tool.consume("queue", queue, KILL_N, 2)
    assert left == [], f"{len(left)} message(s) left un-acknowledged on the queue"
    print(f"pull-style JMS -> channel, node killed after {at_kill}: {sum(counts.values())} events in, "
          f"{KILL_N} messages out, {dups} duplicate(s), 0 lost")


def test_stop_keeps_a_non_durable_topic_subscription(nsjms_server: NsjmsServer, bf: Any, factory: Any,
                                                      java_tool: JavaTool) -> None:
    channel, cid = factory.create_channel([], [])            # BestEffort: a non-durable topic subscriber
    topic = _name("lifecycle.topic")
    consumer = _consumer(channel)
    bridge, _ = bf.create_bridge(jms_ep(BA.SOURCE, topic, BA.TOPIC), channel_ep(BA.SINK, cid))
    bridge.start_bridge()
    java_tool.produce("topic", topic, 5, "text", persistent=False)
    assert consumer.wait_for(5, 30), f"{consumer.count()} of 5 while started"
    bridge.stop_bridge()
    java_tool.produce("topic", topic, 20, "text", persistent=False)   # published while the bridge is stopped
    assert java_tool.consume("topic", topic, 1, 0.5) == []            # (a late subscriber gets nothing: no replay)
    assert consumer.count() == 5, "a stopped bridge forwards nothing"
    bridge.start_bridge()
    assert consumer.wait_for(25, 30), f"{consumer.count()} of 25: what was published while stopped was lost"
    ids = sorted(_fd_n(ev) for ev in consumer.snapshot())
    assert ids == sorted(list(range(5)) + list(range(20))), ids


def test_destroy_removes_the_durable_subscription(nsjms_server: NsjmsServer, bf: Any, factory: Any,
                                                  java_tool: JavaTool) -> None:
    channel, cid = _persistent_channel(factory)              # Persistent: a durable topic subscriber
    topic = _name("lifecycle.durable")
    consumer = _consumer(channel)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, topic, BA.TOPIC), channel_ep(BA.SINK, cid))
    bridge.start_bridge()
    java_tool.produce("topic", topic, 3, "text")
    assert consumer.wait_for(3, 30), f"{consumer.count()} of 3"
    bridge.destroy()
    java_tool.produce("topic", topic, 7, "text")             # a durable subscription would keep these
    # Attach to the bridge's durable subscription under its own client id and name: if destroy had left it, the
    # broker would hand over the 7 messages it kept; after a removal this is a new, empty subscription.
    kept = java_tool.durable_async(f"nsjms-node1-bridge-{bid}", topic, f"nsjms-bridge-{bid}", 7, 3).finish()
    assert kept == [], f"destroy left the durable subscription: the broker kept {len(kept)} message(s) for it"


_ = time


def test_destroy_removes_the_durable_subscription_after_its_channel_is_gone(nsjms_server: NsjmsServer, bf: Any,
                                                                              factory: Any,
                                                                              java_tool: JavaTool) -> None:
    """The durable name is stored with the bridge when it subscribes: with the channel destroyed nothing else tells
    that the subscription was durable, and destroy used to leave it on the broker."""
    channel, cid = _persistent_channel(factory)
    topic = _name("lifecycle.durable-gone")
    consumer = _consumer(channel)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, topic, BA.TOPIC), channel_ep(BA.SINK, cid))
    bridge.start_bridge()
    java_tool.produce("topic", topic, 3, "text")
    assert consumer.wait_for(3, 30), f"{consumer.count()} of 3"
    channel.destroy()
    bridge.destroy()
    java_tool.produce("topic", topic, 7, "text")
    kept = java_tool.durable_async(f"nsjms-node1-bridge-{bid}", topic, f"nsjms-bridge-{bid}", 7, 3).finish()
    assert kept == [], f"destroy left the durable subscription: the broker kept {len(kept)} message(s) for it"
