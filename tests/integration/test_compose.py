"""deploy/compose.yaml end to end: nsjms, PostgreSQL and ActiveMQ in their own containers, driven from the host.

The stack runs under a private compose project on free loopback ports (nsjms's IIOP port, STOMP, OpenWire). The
test process is a standard CORBA client (the omniORB stubs, nothing from ``router``): it resolves the factories
by corbaloc through the published IIOP port, creates a persistent channel and a bridge channel → queue, pushes
structured events with a standard push supplier, and a STOMP consumer on the host reads the queue. Half-way the
nsjms container is restarted (``docker-compose restart nsjms``: SIGTERM, same volumes); the object references
taken before keep working, and every event pushed arrives exactly once (count in = count out).

Needs a Docker engine, ``docker-compose`` and the images of ``scripts/images.sh``: marked ``containers``, so it is
deselected when the suite runs on local processes (``NSJMS_TEST_SERVICES=local``).
"""

from __future__ import annotations

import collections
import os
import secrets
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import stomp

from omniORB import CORBA

import CosNotification
import CosNotifyChannelAdmin

from idl.generated import CosBridgeAdmin as BA
from idl.generated import NsjmsAdmin
from router.security.auth import use_token

from bridgekit import channel_ep, jms_ep, reconnect_client
from conftest import TEST_ADMIN_TOKEN, ClientOrb, free_port
from stdclients import Form, PushSupplierClient, Style, make_event, obtain_proxy_consumer, prop, short, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.containers]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "compose.yaml"
IMAGES = ("nsjms-app:local", "nsjms-postgres:local", "nsjms-activemq:local")
N = 200
UP_TIMEOUT_S = 300.0
READY_TIMEOUT_S = 180.0
DELIVERY_TIMEOUT_S = 120.0
PERSISTENT = CosNotification.Persistent


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    iiop_port: int
    stomp_port: int
    login: str
    passcode: str

    def compose(self, *args: str, timeout: float = UP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker-compose", "-f", str(COMPOSE_FILE), "-p", self.project, *args],
            env=self.env, capture_output=True, text=True, timeout=timeout, check=False,
        )

    def logs(self) -> str:
        out = self.compose("logs", "--no-color", "--tail", "40", timeout=60)
        text = out.stdout + out.stderr
        for secret in (self.passcode, self.env["NSJMS_PG_PASSWORD"]):
            text = text.replace(secret, "***")
        return text

    def corbaloc(self, key: str) -> str:
        return f"corbaloc::127.0.0.1:{self.iiop_port}/{key}"


@pytest.fixture
def stack() -> Iterator[Stack]:
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is missing: apt-get install docker-compose (scripts/docker-engine.sh does)")
    missing = [image for image in IMAGES
               if subprocess.run(["docker", "image", "inspect", image], capture_output=True, check=False).returncode]
    if missing:
        pytest.fail(f"images {', '.join(missing)} are missing: build them with `bash scripts/images.sh`")
    passcode = secrets.token_urlsafe(18)
    env = {**os.environ,
           "NSJMS_PG_PASSWORD": secrets.token_urlsafe(18), "NSJMS_BROKER_PASSCODE": passcode,
           "NSJMS_IIOP_PORT": str(free_port()), "NSJMS_STOMP_PORT": str(free_port()),
           "NSJMS_OPENWIRE_PORT": str(free_port())}
    s = Stack(f"nsjmstest{uuid.uuid4().hex[:10]}", env, int(env["NSJMS_IIOP_PORT"]), int(env["NSJMS_STOMP_PORT"]),
              "nsjms", passcode)
    try:
        up = s.compose("up", "-d")
        assert up.returncode == 0, f"docker-compose up failed:\n{up.stderr[-3000:]}\n{s.logs()}"
        yield s
    finally:
        down = s.compose("down", "-v", "--remove-orphans", "-t", "30")
        assert down.returncode == 0, f"docker-compose down failed:\n{down.stderr[-3000:]}"


def _resolve(client_orb: ClientOrb, stack: Stack, key: str, iface: Any) -> Any:
    """Narrow the corbaloc ``key`` once the node answers (compose returns before nsjms has started)."""
    found: list[Any] = []

    def attempt() -> bool:
        try:
            obj = client_orb.orb.string_to_object(stack.corbaloc(key))
            ref = obj._narrow(iface)
        except (CORBA.TRANSIENT, CORBA.COMM_FAILURE, CORBA.OBJECT_NOT_EXIST):
            return False
        found.append(ref)
        return True

    assert wait_until(attempt, READY_TIMEOUT_S, 0.5), f"nsjms did not answer on {stack.corbaloc(key)}\n{stack.logs()}"
    assert found[0] is not None, f"{key} is not a {iface}"
    return found[0]


@dataclass
class QueueReader(stomp.ConnectionListener):  # type: ignore[misc]
    """Counts the messages of one queue by the ``$event_name`` header the bridge writes (``e<i>``)."""

    ids: collections.Counter[int] = field(default_factory=collections.Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.ids[int(frame.headers["$event_name"][1:])] += 1

    def total(self) -> int:
        with self.lock:
            return sum(self.ids.values())

    def snapshot(self) -> collections.Counter[int]:
        with self.lock:
            return collections.Counter(self.ids)


def _operator_token(stack: Stack) -> str:
    """The node's generated operator credential, read inside its container (docs/containers.md, docs/security.md):
    creating channels and bridges needs it (issue 30)."""
    found: list[str] = []

    def attempt() -> bool:
        out = stack.compose("exec", "-T", "nsjms", "cat", "/var/lib/nsjms/credentials/operator.token", timeout=60)
        if out.returncode == 0 and ":" in out.stdout:
            found.append(out.stdout.strip())
        return bool(found)

    assert wait_until(attempt, READY_TIMEOUT_S, 0.5), f"no operator credential in the container\n{stack.logs()}"
    return found[0]


def test_compose_stack_routes_corba_to_jms_across_an_nsjms_restart(stack: Stack, client_orb: ClientOrb) -> None:
    factory = _resolve(client_orb, stack, "NotifyEventChannelFactory", CosNotifyChannelAdmin.EventChannelFactory)
    bf = _resolve(client_orb, stack, "BridgeFactory", BA.BridgeFactory)
    use_token(_operator_token(stack))               # this test is the stack's operator; restored below
    try:
        _route_across_a_restart(stack, factory, bf)
    finally:
        use_token(TEST_ADMIN_TOKEN)


def _route_across_a_restart(stack: Stack, factory: Any, bf: Any) -> None:
    qos = [prop("EventReliability", short(PERSISTENT)), prop("ConnectionReliability", short(PERSISTENT))]
    channel, cid = factory.create_channel(qos, [])
    queue = f"compose.{uuid.uuid4().hex[:8]}"
    bridge, _ = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, queue))
    bridge.start_bridge()

    reader = QueueReader()
    conn = stomp.Connection([("127.0.0.1", stack.stomp_port)], auto_content_length=False)
    conn.set_listener("reader", reader)
    conn.connect(stack.login, stack.passcode, wait=True)
    conn.subscribe(f"/queue/{queue}", id="1", ack="auto")
    try:
        proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
        supplier = PushSupplierClient(proxy, Form.STRUCTURED)
        supplier.connect()
        for i in range(N // 2):
            supplier.push_one(make_event(i, reliability=PERSISTENT))

        restart = stack.compose("restart", "-t", "30", "nsjms", timeout=120)
        assert restart.returncode == 0, f"docker-compose restart nsjms failed:\n{restart.stderr[-3000:]}"
        reconnect_client(supplier.proxy, bridge, timeout=READY_TIMEOUT_S)
        assert wait_until(lambda: bridge._narrow(NsjmsAdmin.ManagedBridge).get_status() == NsjmsAdmin.started,
                          60), "the bridge is started again after the restart"
        for i in range(N // 2, N):
            supplier.push_one(make_event(i, reliability=PERSISTENT))

        assert wait_until(lambda: reader.total() >= N, DELIVERY_TIMEOUT_S, 0.2), (
            f"{reader.total()} of {N} messages reached the queue\n{stack.logs()}")
        assert not wait_until(lambda: reader.total() > N, 2.0, 0.2), "more messages than events (duplicates)"
    finally:
        conn.disconnect()
    counts = reader.snapshot()
    assert sorted(counts) == list(range(N)), f"lost: {sorted(set(range(N)) - set(counts))[:20]}"
    assert sum(counts.values()) == N, f"duplicates: {[i for i, c in counts.items() if c > 1][:20]}"
