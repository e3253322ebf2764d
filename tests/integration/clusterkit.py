"""What the cluster tests share (tests/integration/test_cluster_*.py; docs/cluster.md): nodes started with short
leases, the independent clients that count traffic both ways, PostgreSQL look-ups, the ``db`` fixture of the
PostgreSQL-only modules and the two-link PostgreSQL in a network namespace of the cut test.

* :func:`start_node`: an ``nsjms serve`` process of node ``name`` (state directory ``tmp_path/name``), renewing its
  lease every :data:`RENEW_S` s, expiring after :data:`EXPIRY_S` s; optionally armed with a crash point or told
  its peers' ORB addresses;
* clients: :class:`StompCounter` (a stomp.py consumer recording every message's event name and dedupe id),
  :class:`Supplier` (a standard-stub push supplier that follows its channel to the node owning it),
  :class:`StompProducer` (stomp.py, m<i> with header n = i); :func:`check_once` counts both flows;
* PostgreSQL: :func:`rows`, :func:`ownership`; :func:`cli` runs ``nsjms cluster ...``;
* the fixture ``db`` (:func:`db_fixture`: modules import that name so pytest finds the fixture), :func:`join`;
* the fixture ``two_links`` (:func:`two_links_fixture`, imported likewise): PostgreSQL in a network namespace
  reached over two veth links, the second one cut on request (needs root; a machine without network namespaces
  fails, never skips).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import stomp
from netcut import Link, add_link, add_namespace, remove
from test_db_network_cut import NetnsPostgres

import omniORB
from omniORB import CORBA

import CosNotification
import CosNotifyChannelAdmin

from idl.generated import CosBridgeAdmin as BA
from router.cluster import members as M
from router.cluster.lease import LeaseSettings
from router.db import Database

from bridgekit import (
    bridge_factory,
    channel_ep,
    jms_ep,
    managed_bridge,
    persistent_channel,
    prepared_count,
    structured_consumer,
    unique_name,
)
from conftest import ClientOrb, NsjmsServer, free_port, restart_port
from stdclients import (
    Form,
    PushSupplierClient,
    StructuredPushConsumer,
    Style,
    long_,
    make_event,
    obtain_proxy_consumer,
    prop,
    short,
    wait_until,
)

__all__ = ["EXPIRY_S", "LONG", "PERSISTENT", "RENEW_S", "Cluster", "Flows", "Links", "Routes", "StompCounter",
           "StompProducer", "Supplier", "TwoLinkPostgres", "check_once", "cli", "cluster_fixture", "db_fixture",
           "join", "make_routes", "module_cluster_fixture", "numbers", "ownership", "rows", "start_node",
           "start_nodes", "stop_nodes", "t2_persistent_channel", "two_links_fixture"]

RENEW_S, EXPIRY_S = 1, 4
PERSISTENT = CosNotification.Persistent
LONG = LeaseSettings(renew_s=1.0, expiry_s=60.0)


# ------------------------------------------------------------------------------------------------------- nodes
def _node_env(mp: pytest.MonkeyPatch, name: str, crash_at: str | None, peers: str | None) -> None:
    mp.setenv("NSJMS_NODE_NODE_ID", name)
    mp.setenv("NSJMS_CLUSTER_RENEW_S", str(RENEW_S))
    mp.setenv("NSJMS_CLUSTER_EXPIRY_S", str(EXPIRY_S))
    if peers is not None:
        mp.setenv("NSJMS_CLUSTER_PEERS", peers)
    if crash_at:
        mp.setenv("NSJMS_CRASH_AT", crash_at)


def _server(tmp_path: Path, name: str, dsn: str, broker_url: str, port: int | None) -> NsjmsServer:
    state = tmp_path / name
    state.mkdir(exist_ok=True)
    return NsjmsServer(state_dir=state, pg_dsn=dsn, broker_url=broker_url, port=free_port() if port is None else port)


def start_node(tmp_path: Path, name: str, dsn: str, broker_url: str, monkeypatch: pytest.MonkeyPatch, *,
               crash_at: str | None = None, port: int | None = None, peers: str | None = None) -> NsjmsServer:
    """Node ``name`` (state directory ``tmp_path/name``) with the short leases of the cluster tests; ``crash_at``
    arms ``NSJMS_CRASH_AT`` for this process only; ``peers``: ``cluster.peers``."""
    _node_env(monkeypatch, name, crash_at, peers)
    server = _server(tmp_path, name, dsn, broker_url, port)
    try:
        server.start()
    finally:
        monkeypatch.delenv("NSJMS_CRASH_AT", raising=False)
    return server


def start_nodes(tmp_path: Path, names: Sequence[str], dsn: str, broker_url: str, *,
                crash_at: Mapping[str, str] | None = None, peers: bool = False, dsns: Mapping[str, str] | None = None,
                env: Mapping[str, str] | None = None) -> list[NsjmsServer]:
    """Nodes ``names`` as :func:`start_node` makes them, launched one after the other and then waited for (they
    start side by side); ``crash_at``: name -> crash point; ``peers``: each node told the others' ORB addresses
    (``cluster.peers``); ``dsns``: name -> its own DSN (``dsn`` otherwise); ``env``: more settings for each. The
    test's environment is left as it was. A node that does not start stops the others and fails the test."""
    ports = {n: free_port() for n in names}
    servers: list[NsjmsServer] = []
    try:
        for name in names:
            server = _server(tmp_path, name, (dsns or {}).get(name, dsn), broker_url, ports[name])
            with pytest.MonkeyPatch.context() as mp:
                _node_env(mp, name, (crash_at or {}).get(name),
                          ",".join(f"127.0.0.1:{ports[o]}" for o in names if o != name) if peers else None)
                for key, value in (env or {}).items():
                    mp.setenv(key, value)
                server.launch()
            servers.append(server)
        for server in servers:
            server.wait_ready()
    except BaseException:
        stop_nodes(servers)
        raise
    return servers


def stop_nodes(nodes: Iterable[NsjmsServer]) -> dict[str, int | None]:
    """SIGTERM to every running node at once, then each one's exit code (name -> code; None: it was not running or
    was killed after the stop timeout)."""
    running = [n for n in nodes if n.proc is not None and n.proc.poll() is None]
    for node in running:
        assert node.proc is not None
        node.proc.send_signal(signal.SIGTERM)
    return {node.state_dir.name: node.wait_stopped() for node in running}


def cli(dsn: str, state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``nsjms cluster ARGS --json`` against ``dsn``."""
    return subprocess.run([sys.executable, "-m", "router.cli", "cluster", *args, "--json", "--state-dir",
                           str(state)], env=dict(os.environ, NSJMS_POSTGRES_DSN=dsn), capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL)


# -------------------------------------------------------------------------------------------------- PostgreSQL
def rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return list(conn.execute(query, params).fetchall())


def ownership(dsn: str) -> dict[tuple[str, int], str]:
    """(kind, id) -> owning node, from ``nsjms_owner``."""
    return {(str(k), int(i)): str(n) for k, i, n in rows(dsn, "SELECT kind, object_id, node_id FROM nsjms_owner")}


@pytest.fixture(name="db")
def db_fixture(fresh_db: str) -> Iterator[Database]:
    """The node's :class:`~router.db.Database` on a fresh database (no node process)."""
    database = Database(fresh_db, 4)
    database.open()
    yield database
    database.close()


def sql_channel(db: Database, cid: int, owner: str, bridges: int = 0) -> None:
    """A channel row owned by ``owner`` with ``bridges`` bridges (ids ``cid * 100 + i``), owned likewise."""
    with db.unit_of_work() as conn:
        conn.execute("INSERT INTO nsjms_channel (id, qos, admin_props) VALUES (%s, '{}', '{}')", (cid,))
        M.assign(conn, ("channel", cid), owner)
        for i in range(bridges):
            bid = cid * 100 + i
            conn.execute("INSERT INTO nsjms_bridge (id, source, sink, state, channel_id) VALUES "
                         "(%s, '{}', '{}', 'started', %s)", (bid, cid))
            M.assign(conn, ("bridge", bid), owner)


def sql_owners(db: Database) -> dict[tuple[str, int], str]:
    """(kind, id) -> owning node, from ``nsjms_owner``."""
    with db.unit_of_work() as conn:
        return {(str(k), int(i)): str(n) for k, i, n in
                conn.execute("SELECT kind, object_id, node_id FROM nsjms_owner").fetchall()}


def join(db: Database, node: str, settings: LeaseSettings = LONG, *, address: str | None = None,
         steal: bool = False) -> int:
    """``node`` joins (address ``<node>.example:2809`` unless given); returns its epoch."""
    with db.unit_of_work() as conn:
        return M.join(conn, node, f"{node}.example:2809" if address is None else address, settings, steal=steal)


# ----------------------------------------------------------------------------------------------------- clients
class StompCounter(stomp.ConnectionListener):  # type: ignore[misc]
    """stomp.py, auto-ack: every message's event name and dedupe id."""

    def __init__(self) -> None:
        self.got: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.got.append((frame.headers.get("$event_name", ""), frame.headers.get("nsjms_dedupe_id", "")))

    def names(self) -> set[str]:
        with self.lock:
            return {n for n, _ in self.got}


class Supplier:
    """A standard-stub push supplier of one proxy consumer (channel, admin, proxy ids): pushes e<i> one after the
    other; a push refused because the channel moved (TRANSIENT, OBJECT_NOT_EXIST: ``COMPLETED_NO``, nothing was
    stored) is pushed again through the proxy of the same ids at the node that owns the channel now.
    ``call_timeout_ms``: its calls' timeout; ``follow_after_maybe``: after a push answered ``COMPLETED_MAYBE`` (its
    node died or timed out), the next one goes to the node owning the channel (``nodes``, in order)."""

    def __init__(self, client_orb: ClientOrb, nodes: list[NsjmsServer], channel: Any, cid: int, *,
                 call_timeout_ms: int | None = None, follow_after_maybe: bool = False) -> None:
        self.orb, self.nodes, self.cid = client_orb, nodes, cid
        self.call_timeout_ms, self.follow_after_maybe = call_timeout_ms, follow_after_maybe
        admin = channel.default_supplier_admin
        self.aid = int(admin.MyID)
        proxy, pid = obtain_proxy_consumer(admin, Form.STRUCTURED, Style.PUSH)
        self.client = PushSupplierClient(self._timed(proxy), Form.STRUCTURED)
        self.client.connect()
        self.pid = int(pid)
        self.pushed = 0
        self.refused: list[str] = []
        self.maybe: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="supplier", daemon=True)

    def _timed(self, ref: Any) -> Any:
        """``ref`` with this supplier's call timeout (omniORB's per-reference timeout; the client ORB's otherwise): a
        call to a paused node then ends ``TRANSIENT`` (``COMPLETED_MAYBE``) instead of waiting for its wake-up."""
        if self.call_timeout_ms is not None:
            omniORB.setClientCallTimeout(ref, self.call_timeout_ms)
        return ref

    def _reresolve(self) -> bool:
        for node in list(self.nodes):
            try:
                channel = self._timed(self._timed(self.orb.factory(node.ior())).get_event_channel(self.cid))
                proxy = self._timed(channel.get_supplieradmin(self.aid)).get_proxy_consumer(self.pid)
                narrowed = self._timed(proxy._narrow(CosNotifyChannelAdmin.StructuredProxyPushConsumer))
                narrowed._non_existent()
            except (CORBA.Exception, CosNotifyChannelAdmin.ChannelNotFound, CosNotifyChannelAdmin.AdminNotFound,
                    CosNotifyChannelAdmin.ProxyNotFound):
                continue
            self.client.proxy = narrowed
            return True
        return False

    def push(self, i: int) -> None:
        """Push e<i> until it is accepted (refused ``COMPLETED_NO``: nothing was stored, pushed again, at the
        channel's owner); one answered ``COMPLETED_MAYBE`` (a store whose outcome the node does not know) is recorded
        in ``maybe`` and not pushed again (it must arrive at most once)."""
        deadline = time.monotonic() + 90
        while True:
            try:
                self.client.push_one(make_event(i, reliability=PERSISTENT))
                self.pushed += 1
                return
            except CORBA.SystemException as exc:
                if exc.completed != CORBA.COMPLETED_NO:
                    self.maybe.append(i)
                    self.pushed += 1
                    if self.follow_after_maybe:      # the node may be gone or paused: the next push goes to the owner
                        self._reresolve()
                    return
                self.refused.append(f"e{i}: {type(exc).__name__}")
                assert time.monotonic() < deadline, f"e{i} could not be pushed anywhere: {self.refused[-5:]}"
                if not self._reresolve():
                    time.sleep(0.2)

    def _run(self, follow: bool = False) -> None:
        while follow and not self.stop.is_set() and not self._reresolve():
            time.sleep(0.2)
        while not self.stop.is_set():
            self.push(self.pushed)
            time.sleep(0.02)

    def pause(self) -> None:
        """Stop pushing after the push in flight (a counted point: ``pushed`` is final until :meth:`resume`)."""
        self.stop.set()
        self.thread.join(120)
        assert not self.thread.is_alive(), "the supplier's push in flight ended"

    def resume(self) -> None:
        """Push on (a new thread), first through the node owning the channel now (``nodes``, in order)."""
        self.stop.clear()
        self.thread = threading.Thread(target=self._run, args=(True,), name="supplier", daemon=True)
        self.thread.start()


class StompProducer:
    """stomp.py: m<i> with header n = i, persistent, one after the other until stopped."""

    def __init__(self, broker_url: str, queue: str) -> None:
        host, port = broker_url.removeprefix("stomp://").split(":")
        self.conn = stomp.Connection([(host, int(port))], auto_content_length=False)
        self.conn.connect(wait=True)
        self.queue, self.sent = queue, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def send(self, i: int) -> None:
        self.conn.send(f"/queue/{self.queue}", f"m{i}", headers={"n": str(i), "persistent": "true"})
        self.sent += 1

    def _run(self) -> None:
        while not self.stop.is_set():
            self.send(self.sent)
            time.sleep(0.02)


def numbers(events: Iterable[Any]) -> list[int]:
    """The header ``n`` each message carried (stomp_produce, StompProducer, JmsTool), as the channel's events carry
    it."""
    return [int({p.name: p.value.value() for p in ev.filterable_data}["n"]) for ev in events]


def t2_persistent_channel(factory: Any, per_t2: int) -> tuple[Any, int]:
    """Persistent (events and connections) with EnableTransaction: its pull proxies pull in T2s of ``per_t2``."""
    qos = [prop("EventReliability", short(PERSISTENT)), prop("ConnectionReliability", short(PERSISTENT)),
           prop("EnableTransaction", CORBA.Any(CORBA.TC_boolean, True))]
    channel, cid = factory.create_channel(qos, [prop("TransactionEvents", long_(per_t2))])
    return channel, int(cid)


def check_once(counter: StompCounter, pushed: int, consumer: Any, sent: int, maybe: Any = (), *,
               consumer_duplicates: bool = False) -> tuple[int, int]:
    """Every event at the queue (duplicates only with their original's dedupe id; ``maybe``: pushes answered
    COMPLETED_MAYBE, there or not), every message one event at the consumer (``consumer_duplicates``: at least
    one; a push consumer of a channel taken over from a live, cut node may get an event twice, docs/cluster.md)."""
    want = {f"e{i}" for i in range(pushed) if i not in set(maybe)}
    assert wait_until(lambda: want <= counter.names(), 90), sorted(want - counter.names())[:20]
    assert counter.names() - {f"e{i}" for i in maybe} == want, "channel -> JMS: no event lost, none made up"
    dedupe: dict[str, set[str]] = {}
    for name, d in counter.got:
        dedupe.setdefault(name, set()).add(d)
    assert all(len(d) == 1 for d in dedupe.values()), "a duplicate only with its original's dedupe id"
    assert wait_until(lambda: set(numbers(consumer.snapshot())) >= set(range(sent)), 90), (consumer.count(), sent)
    got = numbers(consumer.snapshot())
    if consumer_duplicates:
        assert set(got) == set(range(sent)), "JMS -> channel: no message lost, none made up"
        return len(counter.got) - len(dedupe), len(got)
    assert sorted(got) == list(range(sent)), \
        f"JMS -> channel: each message exactly one event (missing {sorted(set(range(sent)) - set(got))[:10]}, " \
        f"twice {sorted(n for n in set(got) if got.count(n) > 1)[:10]})"
    return len(counter.got) - len(dedupe), len(got)


# ------------------------------------------------------------------------------ T2 traffic both ways, counted
@dataclass
class Routes:
    """The two routes of the cluster traffic tests, made on one node: channel C1 with a channel -> JMS queue bridge
    in T2 (``per_t2`` events per transaction) and T2 channel C2 with a JMS -> channel queue bridge in T2 (the channel
    pulls from the bridge) and a standard-stub push consumer of C2 (its reference is stored with the proxy: each new
    owner calls it back)."""

    c1: Any
    cid1: int
    out_bridge: Any
    bid1: int
    c2: Any
    cid2: int
    in_bridge: Any
    bid2: int
    consumer: StructuredPushConsumer

    def owned_by(self, node: str) -> dict[tuple[str, int], str]:
        """The ownership rows of both routes, all ``node``'s."""
        return {("channel", self.cid1): node, ("bridge", self.bid1): node, ("channel", self.cid2): node,
                ("bridge", self.bid2): node}

    def start(self) -> None:
        self.out_bridge.start_bridge()
        self.in_bridge.start_bridge()


def make_routes(client_orb: ClientOrb, node: NsjmsServer, q_out: str, q_in: str, per_t2: int, *,
                start: bool = True) -> Routes:
    """:class:`Routes` made through ``node`` (so it owns them), sending to queue ``q_out`` and receiving from
    ``q_in``; ``start``: both bridges started (else :meth:`Routes.start` does it)."""
    factory = client_orb.factory(node.ior())
    bf = bridge_factory(client_orb, node)
    c1, cid1 = persistent_channel(factory)
    out_bridge, bid1 = bf.create_bridge(channel_ep(BA.SOURCE, cid1), jms_ep(BA.SINK, q_out))
    managed_bridge(out_bridge).enable_transaction(per_t2, 30)
    if start:
        out_bridge.start_bridge()
    c2, cid2 = t2_persistent_channel(factory, per_t2)
    consumer = structured_consumer(c2)
    in_bridge, bid2 = bf.create_bridge(jms_ep(BA.SOURCE, q_in), channel_ep(BA.SINK, cid2, BA.PULL))
    if start:
        in_bridge.start_bridge()
    return Routes(c1, int(cid1), out_bridge, int(bid1), c2, int(cid2), in_bridge, int(bid2), consumer)


class Flows:
    """T2 traffic both ways through :class:`Routes` made on ``node``, from independent clients: a standard-stub
    :class:`Supplier` pushes persistent events into C1 (following the channel over ``nodes``), counted at a stomp.py
    :class:`StompCounter` of the out queue; a stomp.py :class:`StompProducer` sends into the in queue, counted at the
    standard-stub push consumer of C2. :meth:`run` starts both clients, :meth:`moved` waits until both flows moved on,
    :meth:`stop` holds both at a counted point, :meth:`check` counts (:func:`check_once`), :meth:`close` ends all."""

    def __init__(self, client_orb: ClientOrb, broker_url: str, node: NsjmsServer, nodes: list[NsjmsServer],
                 prefix: str, per_t2: int, *, start_bridges: bool = True, follow_after_maybe: bool = False) -> None:
        host, port = broker_url.removeprefix("stomp://").split(":")
        self.counter = StompCounter()
        self.listen = stomp.Connection([(host, int(port))], auto_content_length=False)
        self.listen.set_listener("counter", self.counter)
        self.listen.connect(wait=True)
        self.producer: StompProducer | None = None
        try:
            q_out, q_in = unique_name(f"{prefix}.out"), unique_name(f"{prefix}.in")
            self.listen.subscribe(f"/queue/{q_out}", id="counter", ack="auto")
            self.routes = make_routes(client_orb, node, q_out, q_in, per_t2, start=start_bridges)
            self.supplier = Supplier(client_orb, nodes, self.routes.c1, self.routes.cid1,
                                     follow_after_maybe=follow_after_maybe)
            self.producer = StompProducer(broker_url, q_in)
        except BaseException:
            self.close()
            raise
        self.consumer = self.routes.consumer

    def run(self) -> None:
        assert self.producer is not None
        self.supplier.thread.start()
        self.producer.thread.start()

    def arrived(self) -> tuple[int, int]:
        """(distinct events at the stomp.py consumer, events at the push consumer)."""
        return len(self.counter.names()), self.consumer.count()

    def moved(self, step: int, timeout: float = 90) -> bool:
        """Both flows move ``step`` more from now: ``step`` more pushes accepted and messages sent, and as many
        more arrived at each counting client than had been pushed / sent by now (so events sent from now on
        arrive)."""
        assert self.producer is not None
        producer = self.producer
        pushed, sent = self.supplier.pushed, producer.sent
        return wait_until(lambda: self.supplier.pushed >= pushed + step and producer.sent >= sent + step
                          and len(self.counter.names()) >= pushed + step and self.consumer.count() >= sent + step,
                          timeout)

    def stop(self) -> None:
        """Hold both clients after their call in flight (a counted point: ``pushed`` and ``sent`` are final)."""
        assert self.producer is not None
        self.supplier.pause()
        self.producer.stop.set()
        self.producer.thread.join(30)
        assert not self.producer.thread.is_alive(), "the producer's send in flight ended"

    def check(self, *, consumer_duplicates: bool = False) -> tuple[int, int]:
        """:func:`check_once` of everything pushed and sent (duplicates channel -> JMS, events at the consumer)."""
        assert self.producer is not None
        return check_once(self.counter, self.supplier.pushed, self.consumer, self.producer.sent, self.supplier.maybe,
                          consumer_duplicates=consumer_duplicates)

    def per_node_out(self) -> dict[str, int]:
        """Messages at the stomp.py consumer per node of the sending transaction (its gtrid ``<node>:...`` starts
        the dedupe id)."""
        out: dict[str, int] = {}
        with self.counter.lock:
            for _, dedupe in self.counter.got:
                out[dedupe.split(":", 1)[0]] = out.get(dedupe.split(":", 1)[0], 0) + 1
        return out

    def close(self) -> None:
        if hasattr(self, "supplier"):
            self.supplier.stop.set()
        if self.producer is not None:
            self.producer.stop.set()
        self.listen.disconnect()


# --------------------------------------------------------------------------------- a module's shared cluster
@dataclass
class Cluster:
    """Nodes on one database and broker, shared by the tests of a module (:func:`module_cluster_fixture`); each
    test asks for the nodes it needs running (:meth:`up`), replaces a node it restarts (:meth:`restart`), and
    leaves nothing behind: the function fixture ``cluster`` destroys every bridge and channel after each test and
    checks that no ownership row and no prepared transaction is left."""

    base: Path
    dsn: str
    broker_url: str
    nodes: dict[str, NsjmsServer] = field(default_factory=dict)

    def running(self, name: str) -> bool:
        node = self.nodes.get(name)
        return node is not None and node.proc is not None and node.proc.poll() is None

    def __getitem__(self, name: str) -> NsjmsServer:
        assert self.running(name), f"node {name} is not running"
        return self.nodes[name]

    def up(self, *names: str, env: Mapping[str, str] | None = None) -> list[NsjmsServer]:
        """Exactly ``names`` running (in that order): missing ones started side by side, others stopped."""
        extra = [n for n in self.nodes.values() if n.state_dir.name not in names]
        codes = stop_nodes(extra)
        assert all(c == 0 for c in codes.values()), f"stopped cleanly: {codes}"
        missing = [n for n in names if not self.running(n)]
        if missing:
            started = start_nodes(self.base, missing, self.dsn, self.broker_url, env=env)
            self.nodes.update({n.state_dir.name: n for n in started})
        return [self.nodes[n] for n in names]

    def restart(self, name: str, env: Mapping[str, str] | None = None) -> NsjmsServer:
        """Node ``name`` started again (after its stop or kill): a new incarnation, a new process."""
        assert not self.running(name), f"{name} still runs"
        self.nodes[name] = start_nodes(self.base, [name], self.dsn, self.broker_url, env=env)[0]
        return self.nodes[name]

    def reset(self, client_orb: ClientOrb) -> None:
        """Every bridge and channel destroyed (through a running node: forwarded to their owners), their ownership
        rows gone with them (a destroy deletes its object's ``nsjms_owner`` row,
        ``test_cluster_drain.py::test_a_destroyed_channel_and_bridge_leave_no_ownership_row``), no prepared
        transaction left."""
        live = [n for n in self.nodes.values() if n.proc is not None and n.proc.poll() is None]
        assert live, "a running node to reset the cluster through"

        def destroyed() -> bool:
            try:
                bf = bridge_factory(client_orb, live[0])
                for bid in bf.get_all_bridges():
                    bf.get_bridge_with_id(bid).destroy()
                factory = client_orb.factory(live[0].ior())
                for cid in factory.get_all_channels():
                    factory.get_event_channel(cid).destroy()
            except (CORBA.TRANSIENT, CORBA.OBJECT_NOT_EXIST, CORBA.COMM_FAILURE):
                return False                 # a channel being taken over or handed off: again
            return rows(self.dsn, "SELECT (SELECT count(*) FROM nsjms_channel) + (SELECT count(*) FROM nsjms_bridge)"
                        ) == [(0,)]

        assert wait_until(destroyed, 90), f"left behind: {ownership(self.dsn)}"
        assert not ownership(self.dsn), f"ownership rows of destroyed objects: {ownership(self.dsn)}"
        assert wait_until(lambda: prepared_count(self.dsn) == 0, 60), "no prepared transaction left"


@pytest.fixture(name="module_cluster", scope="module")
def module_cluster_fixture(tmp_path_factory: pytest.TempPathFactory, module_db: str, broker_url: str
                           ) -> Iterator[Cluster]:
    """A module's :class:`Cluster` on the module's database (no node yet: tests ask for theirs); every node stopped
    at the end, side by side."""
    cluster = Cluster(tmp_path_factory.mktemp("cluster"), module_db, broker_url)
    yield cluster
    stop_nodes(cluster.nodes.values())


@pytest.fixture(name="cluster")
def cluster_fixture(module_cluster: Cluster, client_orb: ClientOrb) -> Iterator[Cluster]:
    """The module's :class:`Cluster`, reset after the test (every bridge and channel destroyed)."""
    yield module_cluster
    module_cluster.reset(client_orb)


# ------------------------------------------------------------------------------- PostgreSQL over two veth links
class TwoLinkPostgres(NetnsPostgres):
    """:class:`NetnsPostgres` listening on two addresses (one per veth link), dropping a silent client's sessions
    within seconds."""

    def __init__(self, base: Path, port: int, ns: str, addr: str, addr2: str) -> None:
        super().__init__(base, port, ns, addr)
        self.addr2 = addr2

    def _server_options(self) -> str:
        return (super()._server_options().replace(f"listen_addresses={self.addr}",
                                                  f"listen_addresses={self.addr},{self.addr2}")
                + " -c tcp_keepalives_idle=2 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=2"
                + " -c tcp_user_timeout=3000")


@dataclass
class Links:
    pg: TwoLinkPostgres
    dsn: str                      # over link 1
    dsn2: str                     # over link 2 (the node that is cut)
    link2: Link

    def cut(self) -> None:
        self.link2.cut()

    def restore(self) -> None:
        self.link2.restore()


@pytest.fixture(name="two_links")
def two_links_fixture() -> Iterator[Links]:
    """PostgreSQL in a network namespace of its own with two veth links (nodes and the test over the first, the node
    to be cut over the second), dropping a silent client's sessions within seconds."""
    ns = f"nsjmsc3{secrets.token_hex(3)}"
    add_namespace(ns)
    links: list[Link] = []
    base = Path(tempfile.mkdtemp(prefix="nsjms-test-cluster-cut-"))
    base.chmod(0o755)
    pg: TwoLinkPostgres | None = None
    try:
        links += [add_link(ns, 232), add_link(ns, 233)]
        pg = TwoLinkPostgres(base, restart_port(), ns, links[0].addr, links[1].addr)
        pg.start()
        yield Links(pg, pg.dsn, pg.dsn.replace(f"@{links[0].addr}:", f"@{links[1].addr}:"), links[1])
    finally:
        if len(links) > 1:
            subprocess.run(["ip", "link", "set", links[1].host_if, "up"], capture_output=True, check=False)
        try:
            if pg is not None:
                pg.stop()
        finally:
            remove(ns, *links)
            shutil.rmtree(base, ignore_errors=True)
