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
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
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

from router.cluster import members as M
from router.cluster.lease import LeaseSettings
from router.db import Database

from conftest import ClientOrb, NsjmsServer, free_port, restart_port
from stdclients import (
    Form,
    PushSupplierClient,
    Style,
    long_,
    make_event,
    obtain_proxy_consumer,
    prop,
    short,
    wait_until,
)

__all__ = ["EXPIRY_S", "LONG", "PERSISTENT", "RENEW_S", "Links", "StompCounter", "StompProducer", "Supplier",
           "TwoLinkPostgres", "check_once", "cli", "db_fixture", "join", "numbers", "ownership", "rows", "start_node",
           "t2_persistent_channel", "two_links_fixture"]

RENEW_S, EXPIRY_S = 1, 4
PERSISTENT = CosNotification.Persistent
LONG = LeaseSettings(renew_s=1.0, expiry_s=60.0)


# ------------------------------------------------------------------------------------------------------- nodes
def start_node(tmp_path: Path, name: str, dsn: str, broker_url: str, monkeypatch: pytest.MonkeyPatch, *,
               crash_at: str | None = None, port: int | None = None, peers: str | None = None) -> NsjmsServer:
    """Node ``name`` (state directory ``tmp_path/name``) with the short leases of the cluster tests; ``crash_at``
    arms ``NSJMS_CRASH_AT`` for this process only; ``peers``: ``cluster.peers``."""
    state = tmp_path / name
    state.mkdir(exist_ok=True)
    monkeypatch.setenv("NSJMS_NODE_NODE_ID", name)
    monkeypatch.setenv("NSJMS_CLUSTER_RENEW_S", str(RENEW_S))
    monkeypatch.setenv("NSJMS_CLUSTER_EXPIRY_S", str(EXPIRY_S))
    if peers is not None:
        monkeypatch.setenv("NSJMS_CLUSTER_PEERS", peers)
    if crash_at:
        monkeypatch.setenv("NSJMS_CRASH_AT", crash_at)
    server = NsjmsServer(state_dir=state, pg_dsn=dsn, broker_url=broker_url,
                         port=free_port() if port is None else port)
    try:
        server.start()
    finally:
        monkeypatch.delenv("NSJMS_CRASH_AT", raising=False)
    return server


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
