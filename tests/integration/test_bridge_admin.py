"""Bridge administration through the OMG IDL only (NJI 2.2, 2.3, 3.1), plus end-to-end flows of every endpoint kind.

The node runs as a subprocess (``nsjms serve``); the test process is a plain CORBA client holding the standard COS
stubs and ``CosBridgeAdmin`` (``NsjmsAdmin.ManagedBridge`` only for ``get_status``). JMS traffic is produced and
consumed by the Java JMS client over OpenWire, so each flow crosses STOMP (node) and OpenWire (Java) through
ActiveMQ. Every test uses its own channel and destination names.
"""

from __future__ import annotations

import json
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from omniORB import CORBA

import CosNotification

from idl.generated import CosBridgeAdmin as BA
from idl.generated import NsjmsAdmin
from router.node.services import EmbeddedActiveMQ

from bridgekit import JavaTool, bridge_factory, channel_ep, error_codes, jms_ep, reconnect_client, stomp_produce
from conftest import NsjmsServer, free_port
from stdclients import (
    Form,
    PushSupplierClient,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    make_event,
    obtain_proxy_consumer,
    obtain_proxy_supplier,
    prop,
    short,
    wait_until,
)

pytestmark = pytest.mark.integration

FLOW_N = 200
FLOW_TIMEOUT_S = 15.0
S, Q = BA.STRUCTURED_EVENT, BA.SEQUENCE_EVENT


def _name(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


@pytest.fixture
def bf(nsjms_server: NsjmsServer, client_orb: Any) -> Any:
    return bridge_factory(client_orb, nsjms_server)


def _push_events(channel: Any, ids: range, **kw: Any) -> None:
    proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.SEQUENCE, Style.PUSH)
    client = PushSupplierClient(proxy, Form.SEQUENCE, batch_size=50)
    client.connect()
    client.push_all([make_event(i, **kw) for i in ids])


def _persistent_channel(factory: Any) -> tuple[Any, int]:
    """A channel that accepts persistent events: JMS producers default to PERSISTENT, which maps to
    EventReliability Persistent, and a BestEffort channel rejects such events (NS 2.5.5.1; the bridge then
    dead-letters them)."""
    qos = [prop("EventReliability", short(CosNotification.Persistent)),
           prop("ConnectionReliability", short(CosNotification.Persistent))]
    return factory.create_channel(qos, [])


def _channel_consumer(channel: Any) -> StructuredPushConsumer:
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
    consumer = StructuredPushConsumer()
    connect_push_consumer(proxy, Form.STRUCTURED, consumer)
    return consumer


# --------------------------------------------------------------------------------------- Table 2-1 checks
def _cases(cid: int) -> list[tuple[str, Any, Any, list[tuple[str, str]]]]:
    """(label, source, sink, expected [(role, code)]) for every inconsistent pair; ``cid`` names a real channel."""
    src, snk = BA.SOURCE, BA.SINK
    mismatch, bad_ch, bad_dest = "MISMATCH_ENDPOINTROLE_NOTIFSTYLE", "INVALID_CHANNELID", "INVALID_JMSDESTINATION"
    cases = []
    for style in (BA.PUSH, BA.PULL):               # Table 2-1: channel → JMS with a PULL sink is never allowed
        for kind in (S, Q):
            cases.append((f"channel {style} {kind} -> JMS PULL", channel_ep(src, cid, style, kind),
                          jms_ep(snk, "adm.q", style=BA.PULL), [("SINK", mismatch)]))
    cases += [
        ("unknown channel source", channel_ep(src, 99_999), jms_ep(snk, "adm.q"), [("SOURCE", bad_ch)]),
        ("unknown channel sink", jms_ep(src, "adm.q"), channel_ep(snk, 99_999), [("SINK", bad_ch)]),
        ("empty destination", channel_ep(src, cid), jms_ep(snk, ""), [("SINK", bad_dest)]),
        ("destination with a line break", jms_ep(src, "a\nb"), channel_ep(snk, cid), [("SOURCE", bad_dest)]),
        ("destination with a space", channel_ep(src, cid), jms_ep(snk, "a b"), [("SINK", bad_dest)]),
        ("unknown factory profile", jms_ep(src, "adm.q", factory_name="nosuch"), channel_ep(snk, cid),
         [("SOURCE", bad_dest)]),
        ("malformed selector option", jms_ep(src, "adm.q", factory_name="default;filter=x"),
         channel_ep(snk, cid), [("SOURCE", bad_dest)]),
        ("both bad", jms_ep(src, ""), channel_ep(snk, 99_999), [("SOURCE", bad_dest), ("SINK", bad_ch)]),
        ("unknown channel and PULL sink", channel_ep(src, 99_999), jms_ep(snk, "adm.q", style=BA.PULL),
         [("SOURCE", bad_ch), ("SINK", mismatch)]),
        ("JMS to JMS", jms_ep(src, "adm.a"), jms_ep(snk, "adm.b"), [("SOURCE", bad_dest), ("SINK", bad_dest)]),
        ("channel to channel", channel_ep(src, cid), channel_ep(snk, cid), [("SOURCE", bad_ch), ("SINK", bad_ch)]),
        ("source given the SINK role", channel_ep(snk, cid), jms_ep(snk, "adm.q"), [("SINK", mismatch)]),
        ("sink given the SOURCE role", jms_ep(src, "adm.q"), channel_ep(src, cid), [("SOURCE", mismatch)]),
        # NJI Table 2-3: ConnectionReliability BestEffort has no point-to-point counterpart ("[no supported]")
        ("queue sink, BestEffort channel", channel_ep(src, cid), jms_ep(snk, "adm.q"), [("SINK", bad_dest)]),
        ("queue source, BestEffort channel", jms_ep(src, "adm.q", style=BA.PULL), channel_ep(snk, cid, BA.PULL, Q),
         [("SOURCE", bad_dest)]),
    ]
    return cases


def test_create_bridge_rejects_every_inconsistent_pair(bf: Any, factory: Any) -> None:
    channel, cid = factory.create_channel([], [])          # ConnectionReliability BestEffort (the default)
    admins_before = (sorted(channel.get_all_consumeradmins()), sorted(channel.get_all_supplieradmins()))
    for label, source, sink, expected in _cases(cid):
        with pytest.raises(BA.InvalidExternalEndPoints) as info:
            bf.create_bridge(source, sink)
        assert error_codes(info.value) == expected, label
    assert list(bf.get_all_bridges()) == []
    assert (sorted(channel.get_all_consumeradmins()), sorted(channel.get_all_supplieradmins())) == admins_before


def test_every_allowed_pair_is_created(bf: Any, factory: Any) -> None:
    """Table 2-1 "yes" and "implementation dependent" cells, both forms, queue and topic; Table 2-3: a BestEffort
    channel takes topics only."""
    _, best_effort = factory.create_channel([], [])
    for src, snk in ((channel_ep(BA.SOURCE, best_effort), jms_ep(BA.SINK, "adm.t", BA.TOPIC)),
                     (jms_ep(BA.SOURCE, "adm.t", BA.TOPIC), channel_ep(BA.SINK, best_effort))):
        bf.create_bridge(src, snk)[0].destroy()
    _, cid = _persistent_channel(factory)
    made = []
    for kind in (S, Q):
        for ch_style in (BA.PUSH, BA.PULL):
            made.append(bf.create_bridge(channel_ep(BA.SOURCE, cid, ch_style, kind), jms_ep(BA.SINK, "adm.q")))
            for jms_style in (BA.PUSH, BA.PULL):
                made.append(bf.create_bridge(jms_ep(BA.SOURCE, "adm.t", BA.TOPIC, jms_style),
                                             channel_ep(BA.SINK, cid, ch_style, kind)))
    ids = [bid for _, bid in made]
    assert len(set(ids)) == 12 and sorted(bf.get_all_bridges()) == sorted(ids)


# ----------------------------------------------------------------------------------- lookup and lifecycle
def _assert_endpoint(got: Any, given: Any) -> None:
    assert (got.role, got.style, got.type) == (given.role, given.style, given.type)
    assert got.connector._d == given.connector._d
    if given.type == BA.JMS_MESSAGE:
        g, w = got.connector.destination, given.connector.destination
        assert (g.destination_type, g.destination_name, g.factory_name) == \
            (w.destination_type, w.destination_name, w.factory_name)
    else:
        assert got.connector.channel_id == given.connector.channel_id


def test_lookup_and_endpoints(bf: Any, factory: Any) -> None:
    _, cid = _persistent_channel(factory)
    pairs = [(channel_ep(BA.SOURCE, cid, BA.PULL, Q), jms_ep(BA.SINK, "adm.look", BA.TOPIC)),
             (jms_ep(BA.SOURCE, "adm.look2", BA.QUEUE, BA.PULL, "jms-json;selector=n > 3"),
              channel_ep(BA.SINK, cid, BA.PUSH, S))]
    made = [(bf.create_bridge(src, snk), src, snk) for src, snk in pairs]
    assert sorted(bf.get_all_bridges()) == sorted(bid for (_, bid), _, _ in made)
    for (bridge, bid), src, snk in made:
        again = bf.get_bridge_with_id(bid)
        assert again._is_equivalent(bridge)
        _assert_endpoint(again.end_point_receiver, src)
        _assert_endpoint(again.end_point_sender, snk)
    with pytest.raises(BA.BridgeNotFound):
        bf.get_bridge_with_id(max(bf.get_all_bridges()) + 1000)


def _managed(bridge: Any) -> Any:
    managed = bridge._narrow(NsjmsAdmin.ManagedBridge)
    assert managed is not None
    return managed


def test_start_stop_destroy(bf: Any, factory: Any) -> None:
    channel, cid = _persistent_channel(factory)
    before = set(channel.get_all_consumeradmins())
    bridge, bid = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, _name("adm.life")))
    managed = _managed(bridge)
    assert managed.get_status() == NsjmsAdmin.stopped          # created: Inactive (NJI 2.3)
    with pytest.raises(BA.BridgeInactive):
        bridge.stop_bridge()                                     # never started
    new_admins = set(channel.get_all_consumeradmins()) - before
    assert len(new_admins) == 1, "the bridge obtains its proxy on a new ConsumerAdmin"
    admin = channel.get_consumeradmin(new_admins.pop())
    proxies = list(admin.push_suppliers)
    assert len(proxies) == 1
    proxy = admin.get_proxy_supplier(proxies[0])

    bridge.start_bridge()
    assert wait_until(lambda: managed.get_status() == NsjmsAdmin.started, 10)
    with pytest.raises(BA.BridgeAlreadyStarted):
        bridge.start_bridge()
    with pytest.raises(BA.BridgeAlreadyStarted):
        managed.start()
    bridge.stop_bridge()
    assert managed.get_status() == NsjmsAdmin.stopped
    with pytest.raises(BA.BridgeInactive):
        bridge.stop_bridge()
    with pytest.raises(BA.BridgeInactive):
        managed.stop()
    managed.start()                                              # the seed's start/stop resume the same bridge
    assert wait_until(lambda: managed.get_status() == NsjmsAdmin.started, 10)

    bridge.destroy()
    with pytest.raises(CORBA.OBJECT_NOT_EXIST):
        bridge.start_bridge()
    assert bridge._non_existent()
    with pytest.raises(BA.BridgeNotFound):
        bf.get_bridge_with_id(bid)
    assert bid not in bf.get_all_bridges()
    assert set(channel.get_all_consumeradmins()) == before, "destroy releases the bridge's admin"
    assert admin._non_existent() and proxy._non_existent(), "destroy releases the bridge's proxy"


def test_destroy_releases_the_supplier_side(bf: Any, factory: Any) -> None:
    channel, cid = _persistent_channel(factory)
    before = set(channel.get_all_supplieradmins())
    bridge, _ = bf.create_bridge(jms_ep(BA.SOURCE, _name("adm.in")), channel_ep(BA.SINK, cid, BA.PULL, Q))
    added = set(channel.get_all_supplieradmins()) - before
    assert len(added) == 1
    admin = channel.get_supplieradmin(added.pop())
    bridge.start_bridge()
    bridge.destroy()
    assert set(channel.get_all_supplieradmins()) == before
    assert admin._non_existent()


# ------------------------------------------------------------------------------------------ persistence
def test_bridges_come_back_in_their_last_state_after_sigkill(nsjms_server: NsjmsServer, bf: Any, factory: Any,
                                                             java_tool: JavaTool) -> None:
    channel, cid = _persistent_channel(factory)
    q_run, q_stop, q_new = _name("adm.run"), _name("adm.stopped"), _name("adm.created")
    running, rid = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, q_run))
    stopped, sid = bf.create_bridge(channel_ep(BA.SOURCE, cid, BA.PULL), jms_ep(BA.SINK, q_stop))
    created, nid = bf.create_bridge(channel_ep(BA.SOURCE, cid, BA.PUSH, Q), jms_ep(BA.SINK, q_new))
    running.start_bridge()
    stopped.start_bridge()
    stopped.stop_bridge()

    nsjms_server.kill(signal.SIGKILL)
    nsjms_server.restart()
    reconnect_client(bf, running, stopped, created)

    assert sorted(bf.get_all_bridges()) == sorted([rid, sid, nid])
    assert bf.get_bridge_with_id(rid)._is_equivalent(running)
    assert wait_until(lambda: _managed(running).get_status() == NsjmsAdmin.started, 20)
    assert _managed(stopped).get_status() == NsjmsAdmin.stopped
    assert _managed(created).get_status() == NsjmsAdmin.stopped
    with pytest.raises(BA.BridgeInactive):
        stopped.stop_bridge()
    _push_events(channel, range(50))
    got = java_tool.consume("queue", q_run, 50, 30)
    assert sorted(int(m["properties"]["$event_name"]["value"][1:]) for m in got) == list(range(50))
    for queue in (q_stop, q_new):
        assert java_tool.consume("queue", queue, 1, 2) == [], f"{queue}: a stopped bridge routed events"
    # The references from before the kill still work. A stopped bridge's proxy is suspended (NJI 2.3): the channel
    # kept the events for it, and starting the bridge again resumes the connection and forwards them all.
    stopped.start_bridge()
    _push_events(channel, range(50, 60))
    got = java_tool.consume("queue", q_stop, 60, 30)
    assert sorted(int(m["properties"]["$event_name"]["value"][1:]) for m in got) == list(range(60))


# ------------------------------------------------------------------------------------------ status
@pytest.fixture
def private_broker(tmp_path: Path) -> Iterator[tuple[EmbeddedActiveMQ, str]]:
    """A broker of this test only (it gets stopped); yields (broker, OpenWire URL)."""
    base = tmp_path / "amq"
    base.mkdir()
    openwire = free_port()
    broker = EmbeddedActiveMQ(base, free_port(), openwire, die_with_parent=True)
    broker.start()
    try:
        yield broker, f"tcp://127.0.0.1:{openwire}"
    finally:
        broker.stop()
        shutil.rmtree(base, ignore_errors=True)


def _bridge_status(server: NsjmsServer, bid: int) -> dict[str, Any]:
    """The bridge's entry in the node's ``status.json`` (rewritten every 2 s; {} until it lists the bridge)."""
    try:
        data = json.loads((server.state_dir / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return dict(next((b for b in data.get("bridges", []) if b["id"] == bid), {}))


def test_status_reports_a_started_bridge_with_a_lost_broker_as_inactive(tmp_path: Path, fresh_db: str, client_orb: Any,
                                           private_broker: tuple[EmbeddedActiveMQ, str]) -> None:
    broker, _ = private_broker
    state = tmp_path / "state"
    state.mkdir()
    server = NsjmsServer(state_dir=state, pg_dsn=fresh_db, broker_url=broker.url, port=free_port())
    server.start()
    try:
        bf = bridge_factory(client_orb, server)
        factory = client_orb.factory(server.ior())
        _, cid = _persistent_channel(factory)
        out, out_id = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, "adm.status.out"))
        inb, in_id = bf.create_bridge(jms_ep(BA.SOURCE, "adm.status.in"), channel_ep(BA.SINK, cid))
        bridges = [_managed(out), _managed(inb)]
        for b in bridges:
            b.start()
        ids = [out_id, in_id]
        assert wait_until(lambda: all(_bridge_status(server, i).get("active") for i in ids), 15)
        broker.stop()
        assert wait_until(lambda: all(_bridge_status(server, i).get("broker") == "disconnected" for i in ids), 30), \
            "a bridge whose broker connection is lost is Inactive"
        for i in ids:
            assert _bridge_status(server, i)["active"] is False and _bridge_status(server, i)["started"] is True
        # get_status is the administrative state: started, consistent with BridgeAlreadyStarted
        assert all(b.get_status() == NsjmsAdmin.started for b in bridges)
        with pytest.raises(BA.BridgeAlreadyStarted):
            bridges[0].start()
        broker.start()
        assert wait_until(lambda: all(_bridge_status(server, i).get("active") for i in ids), 90), \
            "the bridges reconnect by themselves and become Active again"
    finally:
        server.stop()


# --------------------------------------------------------------------------------- flows, every kind
OUT_KINDS = [(style, kind) for style in (BA.PUSH, BA.PULL) for kind in (S, Q)]
IN_KINDS = [(jms_style, style, kind) for style in (BA.PUSH, BA.PULL) for kind in (S, Q)
            for jms_style in (BA.PUSH, BA.PULL)]


@pytest.mark.parametrize(("style", "kind"), OUT_KINDS, ids=lambda v: str(v))
def test_channel_to_jms_flow(shared_bf: Any, shared_factory: Any, java_tool: JavaTool, style: Any, kind: Any,
                             request: pytest.FixtureRequest, module_server: NsjmsServer, broker_url: str) -> None:
    channel, cid = _persistent_channel(shared_factory)
    queue = _name(f"adm.out.{style}.{kind}")
    bridge, bid = shared_bf.create_bridge(channel_ep(BA.SOURCE, cid, style, kind), jms_ep(BA.SINK, queue))
    request.addfinalizer(bridge.destroy)                   # the module's node is shared: leave no bridge running
    bridge.start_bridge()
    _push_events(channel, range(FLOW_N))
    # every message of the flow is at the broker once the bridge counts FLOW_N forwarded (a re-send would count
    # again); a marker sent to the queue after that is behind all of them (one queue, FIFO, same priority), so
    # the messages before it are exactly what the bridge sent: a duplicate would be among them
    assert wait_until(lambda: _bridge_status(module_server, bid).get("forwarded") == FLOW_N, FLOW_TIMEOUT_S), \
        _bridge_status(module_server, bid)
    stomp_produce(broker_url, queue, range(1))
    got = java_tool.consume("queue", queue, FLOW_N + 1, FLOW_TIMEOUT_S)
    assert got and "$event_name" not in got[-1]["properties"], "the marker is not the last message"
    got = got[:-1]
    names = [m["properties"]["$event_name"]["value"] for m in got]
    assert sorted(names) == sorted(f"e{i}" for i in range(FLOW_N)), f"{len(got)} of {FLOW_N} arrived"
    for m in got:
        i = int(m["properties"]["$event_name"]["value"][1:])
        assert m["class"] == "ActiveMQTextMessage" and m["JMSType"] == "Structured Event"
        assert m["body"].startswith(f"payload-{i:06d}-") and m["body"].endswith(f"-end-{i}")


@pytest.mark.parametrize(("jms_style", "style", "kind"), IN_KINDS, ids=lambda v: str(v))
def test_jms_to_channel_flow(shared_bf: Any, shared_factory: Any, java_tool: JavaTool, jms_style: Any, style: Any,
                             kind: Any, request: pytest.FixtureRequest, module_server: NsjmsServer) -> None:
    channel, cid = _persistent_channel(shared_factory)
    queue = _name(f"adm.in.{style}.{kind}")
    consumer = _channel_consumer(channel)
    bridge, bid = shared_bf.create_bridge(jms_ep(BA.SOURCE, queue, style=jms_style),
                                          channel_ep(BA.SINK, cid, style, kind))
    request.addfinalizer(bridge.destroy)                   # the module's node is shared: leave no bridge running
    bridge.start_bridge()
    java_tool.produce("queue", queue, FLOW_N, "text")
    # no more can come once the bridge's status says it forwarded (and so acknowledged) exactly FLOW_N messages: an
    # acknowledged message is not redelivered, and a message forwarded twice would count twice
    assert wait_until(lambda: consumer.count() >= FLOW_N
                      and _bridge_status(module_server, bid).get("forwarded") == FLOW_N, FLOW_TIMEOUT_S), \
        f"{consumer.count()} of {FLOW_N} arrived; bridge {_bridge_status(module_server, bid)}"
    events = consumer.snapshot()
    assert len(events) == FLOW_N, "duplicates"
    seen = []
    for ev in events:
        fixed = ev.header.fixed_header
        fd = {p.name: p.value.value() for p in ev.filterable_data}
        i = int(fd["n"])
        assert (fixed.event_type.domain_name, fixed.event_type.type_name, fixed.event_name) == \
            ("", "%TextMessage", queue)
        assert ev.remainder_of_body.value() == f"text-{i} \u00e9\u4e2d"
        seen.append(i)
    assert sorted(seen) == list(range(FLOW_N))
