"""deploy/compose.cluster.yaml (three nsjms nodes, one PostgreSQL, one broker): as docker-compose reads it, then
started for real.

1. ``docker-compose config`` (no engine needed) validates the file against its schema and interpolates it; the test
   checks what makes the three containers one cluster: distinct node ids, the same DSN and broker, one IIOP port
   each (the same inside and outside, as the references carry it), each node told the others' addresses, published
   on the loopback only, PostgreSQL not published, no default secrets.
2. The stack started (``docker-compose up -d`` under a private project on free loopback ports, leases of 1 s / 4 s
   through the file's variables): the three nodes join (``nsjms cluster status`` in a container: three live
   members); the test process, a standard-stub CORBA client (stdclients.py), creates a persistent channel and a
   channel -> queue bridge on ``node1`` (which owns them), pushes events counted at a stomp.py consumer of the
   queue; the container of ``node1`` is killed (``docker kill``, SIGKILL); a survivor takes the channel and its
   bridge over; the client pushes on through the references ``node1`` gave (their alternate addresses) and every
   event arrives: 0 lost, a duplicate only with its original's dedupe id (a push answered ``COMPLETED_MAYBE``,
   the node dying under it, may or may not have been stored). The references every node hands out carry the
   published host (``ORB_PUBLISH_HOST``) for every node, not the container's listening address.

Needs a Docker engine, ``docker-compose`` and the images of ``scripts/images.sh`` (a missing one fails the test):
marked ``containers``, so it runs in CI's containers phase and is deselected on local processes."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import stomp
from test_cluster_forward import _addresses

from omniORB import CORBA

import CosNotification
import CosNotifyChannelAdmin

from idl.generated import CosBridgeAdmin as BA
from router.security.auth import use_token

from bridgekit import channel_ep, jms_ep
from clusterkit import StompCounter
from conftest import TEST_ADMIN_TOKEN, ClientOrb, free_port
from stdclients import Form, PushSupplierClient, Style, make_event, obtain_proxy_consumer, prop, short, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.containers]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "compose.cluster.yaml"
NODES = ("nsjms1", "nsjms2", "nsjms3")
IMAGES = ("nsjms-app:local", "nsjms-postgres:local", "nsjms-activemq:local")
PERSISTENT = CosNotification.Persistent
READY_TIMEOUT_S = 120.0
BEFORE, AFTER = 30, 30              # events pushed before the kill and after it


def _compose(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is missing: apt-get install docker-compose (scripts/docker-engine.sh does)")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NSJMS_", "ORB_"))}
    return subprocess.run(["docker-compose", "-f", str(COMPOSE_FILE), "-p", "nsjmsclustercheck", *args],
                          env={**clean, **env}, capture_output=True, text=True, timeout=120, check=False)


def _services(text: str) -> dict[str, list[str]]:
    """The normalised output of ``docker-compose config``: each service's lines (its block under ``services:``)."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    in_services = False
    for line in text.splitlines():
        if not line.startswith(" "):
            in_services = line == "services:"
            current = None
            continue
        if in_services and line.startswith("  ") and not line.startswith("   "):
            current = out.setdefault(line.strip().rstrip(":"), [])
        elif current is not None:
            current.append(line.strip())
    return out


def _value(lines: list[str], key: str) -> str:
    found = [line.split(":", 1)[1].strip().strip("'\"") for line in lines if line.startswith(f"{key}:")]
    assert len(found) == 1, (key, lines)
    return found[0]


def test_three_nodes_one_database_one_broker() -> None:
    secrets = {"NSJMS_PG_PASSWORD": "pg-secret", "NSJMS_BROKER_PASSCODE": "mq-secret"}
    out = _compose("config", **secrets)
    assert out.returncode == 0, out.stderr
    services = _services(out.stdout)
    assert set(services) == {"postgres", "activemq", *NODES}

    ids = {n: _value(services[n], "NSJMS_NODE_NODE_ID") for n in NODES}
    assert sorted(ids.values()) == ["node1", "node2", "node3"], "distinct node ids"
    for key in ("NSJMS_POSTGRES_DSN", "NSJMS_BROKER_URL", "NSJMS_CLUSTER_RENEW_S", "NSJMS_CLUSTER_EXPIRY_S"):
        assert len({_value(services[n], key) for n in NODES}) == 1, f"{key}: one value for every node"
    assert _value(services["nsjms1"], "NSJMS_POSTGRES_DSN").endswith("@postgres:5432/nsjms")
    ports = {n: _value(services[n], "NSJMS_ORB_PORT") for n in NODES}
    assert len(set(ports.values())) == 3, ports
    for n in NODES:
        published = [line for line in services[n] if line.startswith("- 127.0.0.1:")]
        assert published == [f"- 127.0.0.1:{ports[n]}:{ports[n]}/tcp"], (n, published)
        assert any(line.startswith(f"- state{n[-1]}:/var/lib/nsjms") for line in services[n]), "own state volume"
    assert not any(line.startswith("- ") and ":5432" in line for line in services["postgres"]), \
        "PostgreSQL is not published"
    assert all(not line.startswith("- 0.0.0.0") for lines in services.values() for line in lines)
    command = " ".join(services["postgres"])
    assert "tcp_keepalives_idle=5" in command and "tcp_user_timeout=10000" in command, \
        "PostgreSQL drops a silent (cut) node's sessions within seconds"

    for n in NODES:
        others = sorted(f"127.0.0.1:{ports[o]}" for o in NODES if o != n)
        assert sorted(_value(services[n], "NSJMS_CLUSTER_PEERS").split(",")) == others, \
            f"{n} is told the others' published addresses (alternate addresses in its references)"

    moved = _compose("config", NSJMS_IIOP_PORT_2="3910", **secrets)
    assert moved.returncode == 0 and "- 127.0.0.1:3910:3910/tcp" in moved.stdout

    volumes = _compose("config", "--volumes", **secrets)
    assert set(volumes.stdout.split()) == {"pgdata", "amqdata", "state1", "state2", "state3"}


def test_no_default_secrets() -> None:
    out = _compose("config", "-q", NSJMS_BROKER_PASSCODE="mq-secret")
    assert out.returncode != 0 and "NSJMS_PG_PASSWORD" in out.stderr, out.stderr
    out = _compose("config", "-q", NSJMS_PG_PASSWORD="pg-secret")
    assert out.returncode != 0 and "NSJMS_BROKER_PASSCODE" in out.stderr, out.stderr


# ------------------------------------------------------------------------------------------ the stack, started
@dataclass
class Stack:
    project: str
    env: dict[str, str]
    ports: dict[str, int]           # service -> its IIOP port (inside and on the host's loopback)
    stomp_port: int
    passcode: str
    containers: dict[str, str] = field(default_factory=dict)   # service -> container id

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker-compose", "-f", str(COMPOSE_FILE), "-p", self.project, *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)

    def logs(self) -> str:
        out = self.compose("logs", "--no-color", "--tail", "30", timeout=60)
        text = out.stdout + out.stderr
        for secret in (self.passcode, self.env["NSJMS_PG_PASSWORD"]):
            text = text.replace(secret, "***")
        return text[-6000:]

    def exec(self, service: str, *cmd: str) -> subprocess.CompletedProcess[str]:
        """``cmd`` in ``service``'s container (``docker exec``: docker-compose's own start-up takes seconds)."""
        if service not in self.containers:
            self.containers[service] = self.compose("ps", "-q", service, timeout=60).stdout.strip()
        return subprocess.run(["docker", "exec", self.containers[service], *cmd], capture_output=True, text=True,
                              timeout=90, check=False, stdin=subprocess.DEVNULL)

    def members(self, via: str) -> dict[str, dict[str, Any]]:
        """``nsjms cluster status --json`` run in ``via``'s container: node id -> member (empty when it failed)."""
        out = self.exec(via, "nsjms", "cluster", "status", "--json")
        if out.returncode != 0:
            return {}
        return {m["node_id"]: m for m in json.loads(out.stdout)["members"]}

    def factory(self, client_orb: ClientOrb, service: str) -> Any:
        """``service``'s factory by corbaloc, once it answers (compose returns before nsjms has started)."""
        found: list[Any] = []

        def attempt() -> bool:
            try:
                ref = client_orb.orb.string_to_object(
                    f"corbaloc::127.0.0.1:{self.ports[service]}/NotifyEventChannelFactory")
                found.append(ref._narrow(CosNotifyChannelAdmin.EventChannelFactory))
            except (CORBA.TRANSIENT, CORBA.COMM_FAILURE, CORBA.OBJECT_NOT_EXIST):
                return False
            return True

        assert wait_until(attempt, READY_TIMEOUT_S, 0.5), f"{service} did not answer\n{self.logs()}"
        return found[0]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """deploy/compose.cluster.yaml up under a private project (``nsjmstest…``: CI removes what an interrupted run
    left), on free loopback ports, with 1 s / 4 s leases; down with its volumes after."""
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is missing: apt-get install docker-compose (scripts/docker-engine.sh does)")
    if subprocess.run(["docker", "info"], capture_output=True, check=False, timeout=60).returncode:
        pytest.fail("no Docker engine answers: bash scripts/docker-engine.sh")
    missing = [image for image in IMAGES
               if subprocess.run(["docker", "image", "inspect", image], capture_output=True, check=False).returncode]
    if missing:
        pytest.fail(f"images {', '.join(missing)} are missing: build them with `bash scripts/images.sh`")
    ports = {n: free_port() for n in NODES}
    passcode = secrets.token_urlsafe(18)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NSJMS_", "ORB_"))}
    env = {**clean, "NSJMS_PG_PASSWORD": secrets.token_urlsafe(18), "NSJMS_BROKER_PASSCODE": passcode,
           "NSJMS_STOMP_PORT": str(free_port()), "NSJMS_OPENWIRE_PORT": str(free_port()),
           "NSJMS_CLUSTER_RENEW_S": "1", "NSJMS_CLUSTER_EXPIRY_S": "4",
           **{f"NSJMS_IIOP_PORT_{n[-1]}": str(p) for n, p in ports.items()}}
    s = Stack(f"nsjmstest{uuid.uuid4().hex[:10]}", env, ports, int(env["NSJMS_STOMP_PORT"]), passcode)
    try:
        up = s.compose("up", "-d")
        assert up.returncode == 0, f"docker-compose up failed:\n{up.stderr[-3000:]}\n{s.logs()}"
        yield s
    finally:
        s.compose("kill", timeout=120)            # the test is over: no graceful stop to wait for
        down = s.compose("down", "-v", "--remove-orphans", "-t", "1")
        assert down.returncode == 0, f"docker-compose down failed:\n{down.stderr[-3000:]}"


def _operator_token(stack: Stack, service: str) -> str:
    """``service``'s generated operator credential, read in its container (each node has its own)."""
    found: list[str] = []

    def attempt() -> bool:
        out = stack.exec(service, "cat", "/var/lib/nsjms/credentials/operator.token")
        if out.returncode == 0 and ":" in out.stdout:
            found.append(out.stdout.strip())
        return bool(found)

    assert wait_until(attempt, READY_TIMEOUT_S, 0.5), f"no operator credential in {service}\n{stack.logs()}"
    return found[0]


def _joined(stack: Stack, client_orb: ClientOrb) -> dict[str, Any]:
    """Each node's factory once the three nodes answer and are live members (``nsjms cluster status``)."""
    factories = {n: stack.factory(client_orb, n) for n in NODES}
    assert wait_until(lambda: sorted((k, m["state"]) for k, m in stack.members("nsjms2").items()) ==
                      [("node1", "live"), ("node2", "live"), ("node3", "live")], 60, 1.0), \
        f"three live members: {stack.members('nsjms2')}\n{stack.logs()}"
    return factories


def test_every_node_of_the_stack_publishes_the_published_host_for_every_node(
        stack: Stack, client_orb: ClientOrb) -> None:
    factories = _joined(stack, client_orb)
    use_token(_operator_token(stack, "nsjms1"))
    try:
        qos = [prop("EventReliability", short(PERSISTENT)), prop("ConnectionReliability", short(PERSISTENT))]
        channel, cid = factories["nsjms1"].create_channel(qos, [])
        try:
            published = {("127.0.0.1", p) for p in stack.ports.values()}
            members = stack.members("nsjms2")
            for n, factory in factories.items():    # a reference each node made (a corbaloc names one address)
                addresses = _addresses(client_orb.orb, channel if n == "nsjms1" else factory.get_event_channel(cid))
                assert (addresses[0], set(addresses)) == (("127.0.0.1", stack.ports[n]), published), \
                    f"{n}'s references carry every node's published address (ORB_PUBLISH_HOST): {addresses}"
                assert members[f"node{n[-1]}"]["address"] == f"127.0.0.1:{stack.ports[n]}", members
        finally:
            channel.destroy()
    finally:
        use_token(TEST_ADMIN_TOKEN)


def test_the_cluster_stack_takes_a_killed_nodes_channel_over_and_loses_nothing(
        stack: Stack, client_orb: ClientOrb) -> None:
    began = time.monotonic()
    factories = _joined(stack, client_orb)
    use_token(_operator_token(stack, "nsjms1"))     # node1's operator: it creates the channel and bridge
    counter = StompCounter()
    conn = stomp.Connection([("127.0.0.1", stack.stomp_port)], auto_content_length=False)
    conn.set_listener("counter", counter)
    conn.connect("nsjms", stack.passcode, wait=True)
    try:
        qos = [prop("EventReliability", short(PERSISTENT)), prop("ConnectionReliability", short(PERSISTENT))]
        channel, cid = factories["nsjms1"].create_channel(qos, [])
        queue = f"compose.cluster.{uuid.uuid4().hex[:8]}"
        conn.subscribe(f"/queue/{queue}", id="counter", ack="auto")
        bf = client_orb.orb.string_to_object(
            f"corbaloc::127.0.0.1:{stack.ports['nsjms1']}/BridgeFactory")._narrow(BA.BridgeFactory)
        bridge, bid = bf.create_bridge(channel_ep(BA.SOURCE, int(cid)), jms_ep(BA.SINK, queue))
        bridge.start_bridge()
    finally:
        use_token(TEST_ADMIN_TOKEN)
    try:
        owns = stack.members("nsjms2")["node1"]["owns"]
        assert owns == {"channels": [int(cid)], "bridges": [int(bid)]}, owns
        proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
        supplier = PushSupplierClient(proxy, Form.STRUCTURED)     # node1's references, node1's address first
        supplier.connect()
        for i in range(BEFORE):
            supplier.push_one(make_event(i, reliability=PERSISTENT))
        assert wait_until(lambda: len(counter.names()) >= BEFORE, 60), (len(counter.names()), stack.logs())

        killed = subprocess.run(["docker", "kill", stack.containers["nsjms1"]], capture_output=True, text=True,
                                timeout=60, check=False)
        assert killed.returncode == 0, killed.stderr
        died = time.monotonic()
        maybe: list[int] = []
        seen: list[str] = []
        for i in range(BEFORE, BEFORE + AFTER):
            deadline = time.monotonic() + 90
            while True:
                try:
                    supplier.push_one(make_event(i, reliability=PERSISTENT))
                    break
                except (CORBA.TRANSIENT, CORBA.COMM_FAILURE, CORBA.OBJECT_NOT_EXIST) as exc:
                    seen.append(f"e{i}: {type(exc).__name__} completed={exc.completed}")
                    if exc.completed != CORBA.COMPLETED_NO:
                        maybe.append(i)             # the node died under it: stored or not, never pushed again
                        break
                    assert not isinstance(exc, CORBA.OBJECT_NOT_EXIST), seen[-5:]
                    assert time.monotonic() < deadline, f"e{i} could not be pushed: {seen[-5:]}\n{stack.logs()}"
                    time.sleep(0.2)
        took = time.monotonic() - died
        members = stack.members("nsjms2")
        owner = [k for k, m in members.items() if int(cid) in m["owns"]["channels"]]
        assert owner and owner[0] in ("node2", "node3"), members
        assert members[owner[0]]["owns"]["bridges"] == [int(bid)], "the bridge moved with its channel"
        assert members["node1"]["state"] == "fenced", members["node1"]

        want = {f"e{i}" for i in range(BEFORE + AFTER) if i not in maybe}
        assert wait_until(lambda: want <= counter.names(), 90), (sorted(want - counter.names())[:20], stack.logs())
        assert counter.names() - {f"e{i}" for i in maybe} == want, "no event lost, none made up"
        dedupe: dict[str, set[str]] = {}
        for name, d in counter.got:
            dedupe.setdefault(name, set()).add(d)
        assert all(len(d) == 1 for d in dedupe.values()), "a duplicate only with its original's dedupe id"
        print(f"\ncompose cluster: node1 killed, {owner[0]} took the channel over; the {AFTER} pushes after the kill "
              f"took {took:.1f} s (answers retried: {len(seen)}, COMPLETED_MAYBE {maybe}); {len(counter.got)} "
              f"messages for {len(dedupe)} events; {time.monotonic() - began:.1f} s from the stack's start")
    finally:
        conn.disconnect()
