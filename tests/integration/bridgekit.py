"""Helpers for the NS⇄JMS bridge integration tests: IDL endpoints, the bridge factory, and the Java JMS client.

* :func:`bridge_factory` resolves the node's ``BridgeFactory`` from the corbaloc in ``endpoints.json`` and
  narrows it with the OMG IDL stubs (``idl.generated.CosBridgeAdmin``); :func:`channel_ep` / :func:`jms_ep`
  build ``CosBridgeAdmin::ExternalEndpoint`` values;
* :class:`JavaTool` compiles ``java/JmsTool.java`` with ``javac`` against Debian's ActiveMQ client jars (a missing
  ``javac`` or jar is a test *failure* naming what to install) and runs it: ``produce``, ``consume`` (JSON lines
  parsed into dicts) and a background ``durable``/``consume`` process (:class:`JavaConsumer`);
* :func:`java_tool` is the session fixture; test modules import it so pytest finds it;
* small helpers the T2, transaction and ledger modules share: :func:`unique_name`, :func:`persistent_channel`,
  :func:`structured_supplier`, :func:`stomp_produce` (persistent SENDs with receipts, header ``n`` = the id),
  :func:`event_numbers` / :func:`dedupe_ids` of JmsTool messages, the node's ``status.json`` lines
  (:func:`bridge_status`, :func:`t2_proxy_status`) and PostgreSQL counts (:func:`pg_scalar`, :func:`prepared_gids`,
  :func:`prepared_count`, :func:`row_count`, :func:`ledger_rows`, :func:`ledger_count`, :func:`by_dedupe_id`).

The Java client speaks OpenWire to the broker; the node speaks STOMP. Nothing here imports ``router``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)
from omniORB import CORBA

import CosNotification

from idl.generated import CosBridgeAdmin as BA
from idl.generated import NsjmsAdmin

from stdclients import (
    Form,
    PushSupplierClient,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    long_,
    obtain_proxy_consumer,
    obtain_proxy_supplier,
    prop,
    short,
)

__all__ = [
    "JAVA_JARS",
    "JavaConsumer",
    "JavaTool",
    "audit_ledger",
    "bridge_factory",
    "bridge_status",
    "by_dedupe_id",
    "channel_ep",
    "dedupe_ids",
    "error_codes",
    "event_numbers",
    "inbox_count",
    "inbox_drained",
    "java_tool",
    "jms_ep",
    "ledger_count",
    "ledger_rows",
    "managed_bridge",
    "node_status",
    "persistent_channel",
    "pg_scalar",
    "prepare_foreign",
    "prepared_count",
    "prepared_gids",
    "reconnect_client",
    "row_count",
    "stomp_produce",
    "structured_consumer",
    "structured_supplier",
    "t2_bridge",
    "t2_channel",
    "t2_proxy_status",
    "unique_name",
]

JAVA_DIR = Path(__file__).resolve().parent / "java"
JAVA_JARS = tuple(Path("/usr/share/java") / f"{name}.jar" for name in (
    "activemq-client", "geronimo-jms_1.1_spec", "slf4j-api", "hawtbuf", "geronimo-j2ee-management-1.1-spec"))
JAVA_TIMEOUT_S = 120.0


# ------------------------------------------------------------------------------------------- CORBA side
def bridge_factory(client_orb: Any, server: Any) -> Any:
    """The node's CosBridgeAdmin::BridgeFactory, resolved from ``endpoints.json``'s corbaloc."""
    assert server.endpoints is not None
    obj = client_orb.orb.string_to_object(server.endpoints["bridge_factory"]["corbaloc"])
    factory = obj._narrow(BA.BridgeFactory)
    assert factory is not None, "the bridge_factory corbaloc does not name a CosBridgeAdmin::BridgeFactory"
    return factory


def reconnect_client(*refs: Any, timeout: float = 30.0) -> None:
    """After a server restart: call each of ``refs`` until a call goes through. The client ORB's cached connections
    to the killed process fail their next call with COMM_FAILURE (COMPLETED_MAYBE); later calls reconnect."""
    deadline = time.monotonic() + timeout
    for ref in refs:
        while True:
            try:
                ref._non_existent()
                break
            except (CORBA.COMM_FAILURE, CORBA.TRANSIENT):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def channel_ep(role: Any, channel_id: int, style: Any = BA.PUSH, kind: Any = BA.STRUCTURED_EVENT) -> Any:
    """An ExternalEndpoint naming event channel ``channel_id``."""
    return BA.ExternalEndpoint(role, BA.ExternalEndpointConnector(kind, channel_id), style, kind)


def jms_ep(role: Any, name: str, dest_type: Any = BA.QUEUE, style: Any = BA.PUSH, factory_name: str = "") -> Any:
    """An ExternalEndpoint naming a JMS destination."""
    dest = BA.JMSDestination(dest_type, name, factory_name)
    return BA.ExternalEndpoint(role, BA.ExternalEndpointConnector(destination=dest), style, BA.JMS_MESSAGE)


def error_codes(exc: Any) -> list[tuple[str, str]]:
    """``[(role, code), ...]`` of an InvalidExternalEndPoints, as names."""
    return [(str(e.role), str(e.code)) for e in exc.error]


def unique_name(prefix: str) -> str:
    """``prefix`` plus a random suffix: a destination no other test (or earlier run on the same broker) uses."""
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


def persistent_channel(factory: Any) -> tuple[Any, int]:
    """A new channel with EventReliability and ConnectionReliability Persistent; returns (channel, id)."""
    persistent = short(CosNotification.Persistent)
    channel, cid = factory.create_channel([prop("EventReliability", persistent),
                                           prop("ConnectionReliability", persistent)], [])
    return channel, int(cid)


def structured_supplier(channel: Any) -> PushSupplierClient:
    """A connected structured push supplier on the channel's default supplier admin."""
    proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
    client = PushSupplierClient(proxy, Form.STRUCTURED)
    client.connect()
    return client


def structured_consumer(channel: Any) -> StructuredPushConsumer:
    """A structured push consumer connected to a proxy of the channel's default consumer admin."""
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
    consumer = StructuredPushConsumer()
    connect_push_consumer(proxy, Form.STRUCTURED, consumer)
    return consumer


def managed_bridge(bridge: Any) -> Any:
    """The bridge narrowed to ``NsjmsAdmin::ManagedBridge`` (BridgeTransactionMgmt)."""
    managed = bridge._narrow(NsjmsAdmin.ManagedBridge)
    assert managed is not None
    return managed


def t2_channel(factory: Any, events: int = 10, timeout_s: int = 0) -> tuple[Any, int]:
    """A channel with EnableTransaction TRUE: its pull proxies pull in T2s of ``events``, ``timeout_s`` each."""
    qos = [prop("EnableTransaction", CORBA.Any(CORBA.TC_boolean, True))]
    admin = [prop("TransactionEvents", long_(events)),
             prop("TransactionTimeout", CORBA.Any(CORBA.TC_ulong, timeout_s))]
    channel, cid = factory.create_channel(qos, admin)
    return channel, int(cid)


def t2_bridge(bf: Any, factory: Any, queue: str, events: int, timeout: int) -> tuple[Any, int, Any]:
    """A started channel -> JMS ``queue`` bridge from a new Persistent channel, transactions enabled
    (``events`` per T2, ``timeout`` s); returns (bridge, bridge id, channel)."""
    channel, cid = persistent_channel(factory)
    bridge, bid = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, queue))
    managed_bridge(bridge).enable_transaction(events, timeout)
    bridge.start_bridge()
    return bridge, bid, channel


# ------------------------------------------------------------------------------------ the node's status.json
def node_status(server: Any) -> dict[str, Any]:
    """The node's ``status.json`` (rewritten every 2 s); empty until it was written."""
    try:
        return dict(json.loads((Path(server.state_dir) / "status.json").read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def bridge_status(server: Any, bid: int | None = None) -> dict[str, Any]:
    """Bridge ``bid``'s line of ``status.json`` (the first bridge's when ``bid`` is None); empty if none."""
    bridges = node_status(server).get("bridges", [])
    return dict(next((b for b in bridges if bid is None or b["id"] == bid), {}))


def t2_proxy_status(server: Any) -> dict[str, Any]:
    """The T2 counters of the first proxy consumer that has them (a channel's T2 pull proxy); empty until a T2 ran."""
    for ch in node_status(server).get("channels", []):
        for pc in ch.get("proxy_consumers", []):
            if "t2_committed" in pc:
                return dict(pc)
    return {}


# ------------------------------------------------------------------------------------------ PostgreSQL
def pg_scalar(dsn: str, query: str, *params: Any) -> Any:
    """The first column of the first row of ``query`` (None when there is no row), in autocommit."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params or None).fetchone()
        return None if row is None else row[0]


def prepared_gids(dsn: str) -> list[str]:
    """The GIDs of the prepared transactions in ``dsn``'s database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")]


def prepare_foreign(dsn: str, xid: Any) -> str:
    """A prepared transaction with ``xid`` left in ``dsn``'s database by "someone else" (a closed session); its GID."""
    conn = psycopg.connect(dsn)
    conn.tpc_begin(xid)
    conn.execute("SELECT 1")
    conn.tpc_prepare()
    conn.close()
    return str(xid)


def prepared_count(dsn: str) -> int:
    return len(prepared_gids(dsn))


def row_count(dsn: str, table: str) -> int:
    """``count(*)`` of ``table``."""
    return int(pg_scalar(dsn, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))))  # type: ignore[arg-type]


def ledger_rows(dsn: str, where: str = "true", params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """The ``nsjms_ledger`` rows matching ``where`` (test-written SQL, values in ``params``), by entry id."""
    with psycopg.connect(dsn) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return list(cur.execute(f"SELECT * FROM nsjms_ledger WHERE {where} ORDER BY entry_id", params))


def ledger_count(dsn: str, where: str, params: tuple[Any, ...] = ()) -> int:
    return int(pg_scalar(dsn, f"SELECT count(*) FROM nsjms_ledger WHERE {where}", *params))


def inbox_count(dsn: str, bid: int) -> int:
    """The ``nsjms_inbox`` rows of bridge ``bid`` (one per JMS message it stored)."""
    return int(pg_scalar(dsn, "SELECT count(*) FROM nsjms_inbox WHERE bridge_id = %s", bid))


def inbox_drained(dsn: str, bid: int, n: int, consumer: StructuredPushConsumer) -> bool:
    """JMS -> channel bridge ``bid`` stored ``n`` inbox rows and ``consumer`` got ``n`` events (or more)."""
    return consumer.count() >= n and inbox_count(dsn, bid) >= n


def by_dedupe_id(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Ledger rows grouped by obligation (dedupe id), each group in entry order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["dedupe_id"], []).append(r)
    return out


AUDIT_TIMEOUT_S = 900


def audit_ledger(dsn: str, out: Path) -> dict[str, Any]:
    """Run ``nsjms audit`` (JDBC source, Spark ``local[2]``) over ``dsn``'s ledger as of an hour from now (anything
    undelivered by then counts as lost); assert it exits 0 and return its ``summary.json``."""
    as_of = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "NSJMS_POSTGRES_DSN": dsn}  # the DSN stays off the argv
    proc = subprocess.run([sys.executable, "-m", "router.cli", "audit", "--out", str(out), "--source", "jdbc",
                           "--master", "local[2]", "--as-of", as_of, "--jdbc-partitions", "2",
                           "--shuffle-partitions", "2"], check=False, capture_output=True, text=True,
                          timeout=AUDIT_TIMEOUT_S, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return dict(json.loads((out / "summary.json").read_text()))


# ------------------------------------------------------------------------------------- raw STOMP producer
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


def leftover(broker_url: str, queue: str) -> int:
    """Consume what is still on ``queue`` (auto-ack, a fresh connection, 1 s without a message ends it); how many:
    after a bridge was destroyed, the messages whose acks it never wrote come back here."""
    from router.jms.transport import open_transport
    from router.mapping.stomp_codec import StompCodec

    t = open_transport(broker_url, codec=StompCodec())
    t.connect()
    try:
        sub = t.subscribe(f"/queue/{queue}")
        count = 0
        while sub.receive(1.0) is not None:
            count += 1
        return count
    finally:
        t.close()


def stomp_produce(broker_url: str, queue: str, ids: range, extra: dict[int, bytes] | None = None,
                  kind: str = "queue") -> None:
    """SEND one persistent message per id (body ``m<id>``, header ``n`` = the id, plus ``extra[id]`` header lines),
    each with a receipt, to the queue (or, ``kind="topic"``, the topic) ``queue``: when this returns, the broker
    holds them all."""
    with socket.create_connection(_host_port(broker_url), timeout=10) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        _read_until(sock, b"CONNECTED")
        for i in ids:
            body = f"m{i}".encode()
            head = (f"SEND\ndestination:/{kind}/{queue}\npersistent:true\nn:{i}\nreceipt:r{i}\n".encode()
                    + (extra or {}).get(i, b"") + f"content-length:{len(body)}\n\n".encode())
            sock.sendall(head + body + b"\x00")
            _read_until(sock, f"receipt-id:r{i}".encode())
        sock.sendall(b"DISCONNECT\n\n\x00")


# -------------------------------------------------------------------------------------------- Java side
def event_numbers(messages: list[dict[str, Any]]) -> list[int]:
    """The event number of each JmsTool message (``$event_name`` = ``e<i>`` as ``stdclients.make_event`` names)."""
    return [int(m["properties"]["$event_name"]["value"][1:]) for m in messages]


def dedupe_ids(messages: list[dict[str, Any]]) -> list[str]:
    """The ``nsjms_dedupe_id`` property of each JmsTool message."""
    return [m["properties"]["nsjms_dedupe_id"]["value"] for m in messages]


def _require_java() -> tuple[str, str]:
    javac, java = shutil.which("javac"), shutil.which("java")
    if javac is None or java is None:
        pytest.fail("javac/java not found: install a JDK (apt-get install -y default-jdk-headless); the bridge "
                    "interop tests need a real Java JMS client", pytrace=False)
    missing = [str(j) for j in JAVA_JARS if not j.exists()]
    if missing:
        pytest.fail(f"Java JMS client jars missing: {missing}; install them with `apt-get install -y activemq`",
                    pytrace=False)
    return javac, java


@dataclass
class JavaConsumer:
    """A ``consume``/``durable`` JmsTool process running in the background; its JSON lines are collected."""

    proc: subprocess.Popen[str]
    messages: list[dict[str, Any]] = field(default_factory=list)
    done: int | None = None
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _reader: threading.Thread | None = None

    def start_reader(self) -> None:
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if not line.startswith("{"):
                continue
            item = json.loads(line)
            with self._cond:
                if set(item) == {"done"}:
                    self.done = int(item["done"])
                else:
                    self.messages.append(item)
                self._cond.notify_all()

    def count(self) -> int:
        with self._cond:
            return len(self.messages)

    def wait_for(self, n: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.messages) >= n or self.done is not None, timeout) \
                and len(self.messages) >= n

    def finish(self, timeout: float = JAVA_TIMEOUT_S) -> list[dict[str, Any]]:
        """Wait for the process to end (it stops at its count or timeout); return every message."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._close()
        with self._cond:
            return list(self.messages)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close()

    def _close(self) -> None:
        if self._reader is not None:
            self._reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@dataclass(frozen=True)
class JavaTool:
    """Runs the compiled ``JmsTool`` against one broker's OpenWire URL."""

    java: str
    classes: Path
    url: str

    def _argv(self, *args: object) -> list[str]:
        cp = ":".join([str(self.classes), *map(str, JAVA_JARS)])
        return [self.java, "-cp", cp, "JmsTool", *map(str, args)]

    def with_url(self, url: str) -> JavaTool:
        return JavaTool(self.java, self.classes, url)

    def produce(self, kind: str, name: str, count: int, kinds: str = "text", persistent: bool = True) -> None:
        """Send ``count`` messages (see JmsTool's header) to ``kind`` (queue|topic) ``name``."""
        argv = self._argv("produce", self.url, kind, name, count, kinds,
                          "persistent" if persistent else "nonpersistent")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=JAVA_TIMEOUT_S)
        assert done.returncode == 0, f"JmsTool produce failed ({done.returncode}):\n{done.stderr[-3000:]}"

    def produce_until(self, kind: str, name: str, stop_file: Path, first: int = 0, pause_ms: int = 20,
                      count: int = 1_000_000) -> subprocess.Popen[str]:
        """Send persistent text messages n = ``first``, ``first`` + 1 ... one every ``pause_ms`` in the background
        until ``stop_file`` exists (or ``count`` were sent); the process prints ``{"sent": N}`` at its end."""
        return subprocess.Popen(self._argv("produce", self.url, kind, name, count, "text", "persistent", first,
                                           pause_ms, stop_file), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, stdin=subprocess.DEVNULL)

    def consume(self, kind: str, name: str, count: int, timeout_s: float, selector: str | None = None
                ) -> list[dict[str, Any]]:
        """Receive up to ``count`` messages (client-acknowledged) within ``timeout_s``."""
        return self.consume_async(kind, name, count, timeout_s, selector).finish(timeout_s + JAVA_TIMEOUT_S)

    def consume_async(self, kind: str, name: str, count: int, timeout_s: float,
                      selector: str | None = None) -> JavaConsumer:
        extra = [selector] if selector else []
        return self._spawn("consume", self.url, kind, name, count, int(timeout_s * 1000), *extra)

    def durable_async(self, client_id: str, topic: str, subscription: str, count: int,
                      timeout_s: float) -> JavaConsumer:
        return self._spawn("durable", self.url, client_id, topic, subscription, count, int(timeout_s * 1000))

    def _spawn(self, *args: object) -> JavaConsumer:
        proc = subprocess.Popen(self._argv(*args), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                stdin=subprocess.DEVNULL)
        consumer = JavaConsumer(proc)
        consumer.start_reader()
        return consumer


_COMPILED: dict[str, Path] = {}


def compile_java(out_dir: Path) -> tuple[str, Path]:
    """Compile JmsTool.java into ``out_dir`` (once per process); returns (java, classes dir)."""
    javac, java = _require_java()
    if "classes" not in _COMPILED:
        out_dir.mkdir(parents=True, exist_ok=True)
        cp = ":".join(map(str, JAVA_JARS))
        done = subprocess.run([javac, "-nowarn", "-cp", cp, "-d", str(out_dir), str(JAVA_DIR / "JmsTool.java")],
                              capture_output=True, text=True, timeout=JAVA_TIMEOUT_S)
        if done.returncode != 0:
            pytest.fail(f"javac JmsTool.java failed:\n{done.stderr[-3000:]}", pytrace=False)
        _COMPILED["classes"] = out_dir
    return java, _COMPILED["classes"]


@pytest.fixture(scope="session")
def java_tool(tmp_path_factory: pytest.TempPathFactory, broker_openwire_url: str) -> Iterator[JavaTool]:
    """The compiled Java JMS client bound to the session broker's OpenWire URL."""
    java, classes = compile_java(tmp_path_factory.mktemp("jmstool"))
    yield JavaTool(java, classes, broker_openwire_url)
