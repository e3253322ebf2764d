"""``nsjms serve`` with its embedded PostgreSQL and ActiveMQ (issue 7, "Node lifecycle" and "Security"): the state
directory lock, private files, broker credentials, reachability in ``status``, supervision of the embedded services,
reuse of a leftover broker, and the broker dead-lettering non-persistent messages.

One node (``embedded_node``, module scope: an ActiveMQ start costs 15-30 s here) runs on free ports in a private
state directory; the tests use it in file order and each leaves it serving, except the last (``stop-services``),
which leaves it stopped. Real services throughout.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import stomp

from router.node.lifecycle import stomp_probe
from router.node.services import EmbeddedActiveMQ, EmbeddedPostgres, free_port
from router.node.services.process import pid_alive
from router.security.auth import Role, install_token, token_path, use_token

from bridgekit import JavaTool
from conftest import TEST_ADMIN_TOKEN, ClientOrb
from stdclients import Form, PushSupplierClient, Style, make_event, obtain_proxy_consumer, persistent_qos, wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 180.0  # embedded PostgreSQL + ActiveMQ on a loaded 2-core machine
EXIT_LOCKED, EXIT_UNREACHABLE = 5, 6


@dataclass
class EmbeddedNode:
    """``nsjms serve`` with embedded services on free ports; restartable on the same state directory."""

    state_dir: Path
    orb_port: int = field(default_factory=free_port)
    pg_port: int = field(default_factory=free_port)
    stomp_port: int = field(default_factory=free_port)
    openwire_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    runs: int = 0

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NSJMS_")}
        return dict(env, PYTHONUNBUFFERED="1", NSJMS_POSTGRES_EMBEDDED_PORT=str(self.pg_port),
                    NSJMS_BROKER_EMBEDDED_STOMP_PORT=str(self.stomp_port),
                    NSJMS_BROKER_EMBEDDED_OPENWIRE_PORT=str(self.openwire_port))

    def command(self, orb_port: int | None = None) -> list[str]:
        return [sys.executable, "-m", "router.cli", "serve", "--state-dir", str(self.state_dir),
                "--orb-port", str(orb_port or self.orb_port)]

    @property
    def logs(self) -> Path:
        return self.state_dir.parent / "logs"

    def start(self) -> dict[str, Any]:
        self.runs += 1
        self.logs.mkdir(exist_ok=True)
        self.state_dir.mkdir(mode=0o700, exist_ok=True)
        install_token(self.state_dir, TEST_ADMIN_TOKEN, Role.OPERATOR)   # the test process is an operator
        out = open(self.logs / f"stdout.{self.runs}", "wb")  # noqa: SIM115 — kept open for the child's life
        err = open(self.logs / f"stderr.{self.runs}", "wb")  # noqa: SIM115
        with out, err:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         env=self.env(), cwd=REPO)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"nsjms serve exited with {self.proc.returncode}:\n{self.stderr()}"
            data = self.endpoints()
            if data.get("pid") == self.proc.pid:
                return data
            time.sleep(0.1)
        pytest.fail(f"nsjms serve not ready within {READY_TIMEOUT_S:.0f} s:\n{self.stderr()}")

    def endpoints(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.state_dir / "endpoints.json").read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def status_json(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.state_dir / "status.json").read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def stderr(self) -> str:
        return (self.logs / f"stderr.{self.runs}").read_text(errors="replace")[-6000:]

    def all_output(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.logs.iterdir()))

    def run_cli(self, *args: str, orb_port: int | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.command(orb_port)[:3], *args], capture_output=True, text=True, check=False,
                              timeout=300, stdin=subprocess.DEVNULL, env=self.env(), cwd=REPO)

    def serve_again(self, orb_port: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(orb_port), capture_output=True, text=True, check=False, timeout=300,
                              stdin=subprocess.DEVNULL, env=self.env(), cwd=REPO)

    def credentials(self) -> tuple[str, str]:
        login, passcode = (self.state_dir / "activemq" / "credentials").read_text().split("\n")[:2]
        return login, passcode

    def broker_pid(self) -> int:
        return int((self.state_dir / "activemq" / "broker.pid").read_text())

    def pg_pid(self) -> int:
        return int((self.state_dir / "pg" / "data" / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        # whatever a failed test left running (the node's own stop() normally did this)
        EmbeddedActiveMQ(self.state_dir, self.stomp_port, self.openwire_port).stop()
        EmbeddedPostgres(self.state_dir, self.pg_port).stop()


@pytest.fixture(scope="module")
def embedded_node() -> Iterator[EmbeddedNode]:
    base = Path(tempfile.mkdtemp(prefix="nsjms-node-"))
    base.chmod(0o711)  # the postgres OS user must traverse it
    node = EmbeddedNode(base / "state")
    try:
        node.start()
        yield node
    finally:
        node.stop()
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------------------------------ STOMP client
class Frames(stomp.ConnectionListener):  # type: ignore[misc]  # stomp.py ships no type hints
    """Hands frames to a queue and does nothing else on the receiver thread."""

    def __init__(self) -> None:
        self.frames: queue.Queue[Any] = queue.Queue()

    def on_message(self, frame: Any) -> None:
        self.frames.put(frame)


def stomp_client(node: EmbeddedNode) -> tuple[stomp.Connection12, Frames]:
    login, passcode = node.credentials()
    conn = stomp.Connection12([("127.0.0.1", node.stomp_port)], auto_content_length=False)
    listener = Frames()
    conn.set_listener("frames", listener)
    conn.connect(login, passcode, wait=True)
    return conn, listener


def receive_matching(listener: Frames, marker: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            frame = listener.frames.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if marker in (frame.body or ""):
            return frame
    return None


# ---------------------------------------------------------------------------------------------- 1. the lock
def test_second_serve_on_a_live_state_dir_is_refused_and_touches_nothing(embedded_node: EmbeddedNode,
                                                                         client_orb: ClientOrb) -> None:
    node = embedded_node
    endpoints_before = (node.state_dir / "endpoints.json").read_text()
    broker_pid, pg_pid = node.broker_pid(), node.pg_pid()
    assert node.proc is not None
    for orb_port in (node.orb_port, free_port()):           # same and another ORB port
        second = node.serve_again(orb_port)
        assert second.returncode == EXIT_LOCKED, second.stdout + second.stderr
        assert f"state directory {node.state_dir} is in use by a running nsjms node (pid {node.proc.pid}" \
            in second.stderr, second.stderr
        assert "serving" not in second.stdout
    assert node.proc.poll() is None, "the first node still runs"
    assert pid_alive(broker_pid) and node.broker_pid() == broker_pid, "its ActiveMQ was left alone"
    assert pid_alive(pg_pid) and node.pg_pid() == pg_pid, "its PostgreSQL was left alone"
    assert (node.state_dir / "endpoints.json").read_text() == endpoints_before
    factory = client_orb.factory(json.loads(endpoints_before)["event_channel_factory"]["ior"])
    _, cid = factory.create_channel([], [])
    assert cid in list(factory.get_all_channels()), "a CORBA call still works"


# ------------------------------------------------------------------------------------------- 2. security
def test_state_dir_is_private(embedded_node: EmbeddedNode) -> None:
    state = embedded_node.state_dir
    top = state.stat().st_mode & 0o777
    assert top in (0o700, 0o710), oct(top)  # 0710 root:postgres when the embedded PostgreSQL runs as postgres
    if top == 0o710:
        assert state.stat().st_gid == __import__("grp").getgrnam("postgres").gr_gid
    leaks = []
    for directory, dirs, files in os.walk(state):
        for name in (*dirs, *files):
            path = Path(directory) / name
            st = path.lstat()
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                leaks.append(f"{path.relative_to(state)} {oct(st.st_mode & 0o777)}")
    assert leaks == [], "files readable by group/other:\n" + "\n".join(leaks)
    journal = list((state / "activemq" / "data" / "kahadb").glob("*"))
    assert journal, "the broker's journal exists (and was checked above)"
    pg = state / "pg"
    if os.geteuid() == 0:
        assert pg.stat().st_uid == __import__("pwd").getpwnam("postgres").pw_uid


def test_embedded_broker_refuses_connections_without_credentials(embedded_node: EmbeddedNode) -> None:
    login, passcode = embedded_node.credentials()
    assert login and len(passcode) >= 24
    refused = stomp_probe("127.0.0.1", embedded_node.stomp_port, "", "", 10)
    assert refused is not None and "refused the STOMP login" in refused, refused
    wrong = stomp_probe("127.0.0.1", embedded_node.stomp_port, login, "wrong", 10)
    assert wrong is not None and "refused the STOMP login" in wrong, wrong
    assert stomp_probe("127.0.0.1", embedded_node.stomp_port, login, passcode, 10) is None
    mode = (embedded_node.state_dir / "activemq" / "credentials").stat().st_mode & 0o777
    assert mode == 0o600


def test_embedded_broker_refuses_openwire_without_credentials(embedded_node: EmbeddedNode,
                                                              java_tool: JavaTool) -> None:
    """A Java JMS client (OpenWire) needs the generated credentials too; with them it reaches STOMP consumers."""
    url = f"tcp://127.0.0.1:{embedded_node.openwire_port}"
    name = f"nsjms.lifecycle.openwire.{uuid.uuid4().hex[:8]}"
    with pytest.raises(AssertionError, match="JmsTool produce failed"):
        java_tool.with_url(url).produce("queue", name, 1)
    login, passcode = embedded_node.credentials()
    java_tool.with_url(f"{url}?jms.userName={login}&jms.password={passcode}").produce("queue", name, 1)
    conn, listener = stomp_client(embedded_node)
    try:
        conn.subscribe(f"/queue/{name}", id="1", ack="auto")
        frame = listener.frames.get(timeout=30)
        assert frame.headers["destination"] == f"/queue/{name}"
    finally:
        conn.disconnect()


def test_status_shows_reachability_and_no_secret(embedded_node: EmbeddedNode) -> None:
    done = embedded_node.run_cli("status", "--state-dir", str(embedded_node.state_dir), "--json")
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["snapshot"]["services"]
    assert services["postgres"]["reachable"] is True and services["postgres"]["embedded"] is True
    assert services["broker"]["reachable"] is True and services["broker"]["key"] == "broker.url"
    text = embedded_node.run_cli("status", "--state-dir", str(embedded_node.state_dir))
    assert "postgres    reachable: postgres.dsn postgresql://postgres:***@127.0.0.1:" in text.stdout, text.stdout
    assert f"broker      reachable: broker.url stomp://127.0.0.1:{embedded_node.stomp_port}" in text.stdout
    _assert_no_secret(embedded_node, done.stdout + text.stdout)


def _assert_no_secret(node: EmbeddedNode, extra: str = "", *, more: tuple[str, ...] = ()) -> None:
    secrets = [node.credentials()[1], (node.state_dir / "pg" / "password").read_text().strip(), *more,
               *(token_path(node.state_dir, name).read_text().strip().partition(":")[2]
                 for name in ("operator", "reader"))]
    places = {"node output": node.all_output(), "cli output": extra,
              "status.json": (node.state_dir / "status.json").read_text(),
              "endpoints.json": (node.state_dir / "endpoints.json").read_text()}
    for log in [*(node.state_dir / "activemq").rglob("*.log"), node.state_dir / "pg" / "server.log"]:
        places[str(log)] = log.read_text(errors="replace")
    for secret in secrets:
        assert len(secret) >= 24
        found = [where for where, text in places.items() if secret in text]
        assert found == [], f"a secret appears in {found}"


def test_broker_jvm_is_not_root_and_admin_credentials_rotate_unlogged(embedded_node: EmbeddedNode,
                                                                     client_orb: ClientOrb) -> None:
    """docs/security.md: the embedded broker's JVM runs as ``activemq`` when the node runs as root; ``nsjms
    credentials rotate`` replaces every admin secret at once (the old one is refused, the CLI uses the new one);
    no secret, old or new, appears in the node's output, the CLI's or the services' logs."""
    from omniORB import CORBA

    from idl.generated import CosBridgeAdmin as BA

    node = embedded_node
    if os.geteuid() == 0:
        uid = int(next(line for line in Path(f"/proc/{node.broker_pid()}/status").read_text().splitlines()
                       if line.startswith("Uid:")).split()[1])
        assert uid == __import__("pwd").getpwnam("activemq").pw_uid, uid
        assert (node.state_dir / "activemq" / "data" / "kahadb").stat().st_uid == uid
    old = token_path(node.state_dir, "operator").read_text().strip()
    rotated = node.run_cli("credentials", "rotate", "--state-dir", str(node.state_dir))
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    new = token_path(node.state_dir, "operator").read_text().strip()
    assert new != old
    listed = node.run_cli("bridge", "list", "--state-dir", str(node.state_dir))
    assert listed.returncode == 0, listed.stdout + listed.stderr
    endpoints = json.loads((node.state_dir / "endpoints.json").read_text())
    bf = client_orb.orb.string_to_object(endpoints["bridge_factory"]["corbaloc"])._narrow(BA.BridgeFactory)
    use_token(old)
    try:
        with pytest.raises(CORBA.NO_PERMISSION):
            bf.get_all_bridges()
    finally:
        use_token(TEST_ADMIN_TOKEN)
    with pytest.raises(CORBA.NO_PERMISSION):      # every principal was rotated, the test harness's too
        bf.get_all_bridges()
    install_token(node.state_dir, TEST_ADMIN_TOKEN, Role.OPERATOR)   # what the harness does before a start
    assert bf.get_all_bridges() == []
    _assert_no_secret(node, rotated.stdout + rotated.stderr + listed.stdout + listed.stderr,
                      more=(old.partition(":")[2], TEST_ADMIN_TOKEN.partition(":")[2]))


# --------------------------------------------------------------------------- 3. non-persistent dead letters
def test_embedded_broker_dead_letters_a_nacked_non_persistent_message(embedded_node: EmbeddedNode) -> None:
    name, marker = f"/queue/nsjms.lifecycle.np.{uuid.uuid4().hex[:8]}", f"np-{uuid.uuid4().hex}"
    conn, listener = stomp_client(embedded_node)
    try:
        conn.send(name, marker, headers={"persistent": "false"})
        conn.subscribe(name, id="src", ack="client-individual")
        frame = receive_matching(listener, marker, 30)
        assert frame is not None, "the message arrived"
        conn.nack(frame.headers["ack"])
        conn.unsubscribe("src")
        conn.subscribe("/queue/ActiveMQ.DLQ", id="dlq", ack="auto")
        dead = receive_matching(listener, marker, 30)
        assert dead is not None, "a NACKed non-persistent message must reach ActiveMQ.DLQ, not vanish"
        assert dead.body == marker
    finally:
        conn.disconnect()


# ------------------------------------------------------------------------------------------- 4. supervision
def _bridge_to_queue(node: EmbeddedNode, client_orb: ClientOrb) -> tuple[PushSupplierClient, str]:
    factory = client_orb.factory(node.endpoints()["event_channel_factory"]["ior"])
    channel, cid = factory.create_channel(persistent_qos(), [])
    dest = f"nsjms.lifecycle.bridge.{uuid.uuid4().hex[:8]}"
    done = node.run_cli("bridge", "--state-dir", str(node.state_dir), "create", "--from", f"channel:{cid}",
                        "--to", f"queue:{dest}")
    assert done.returncode == 0, done.stdout + done.stderr
    proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
    supplier = PushSupplierClient(proxy, Form.STRUCTURED)
    supplier.connect()
    return supplier, dest


def _delivered(node: EmbeddedNode, supplier: PushSupplierClient, dest: str, i: int, timeout: float) -> bool:
    """Push event ``i`` and wait for it on the queue (pushed again while the bridge has not delivered it)."""
    conn, listener = stomp_client(node)
    try:
        conn.subscribe(f"/queue/{dest}", id="1", ack="auto")
        supplier.push_one(make_event(i))
        return receive_matching(listener, f"payload-{i:06d}", timeout) is not None
    finally:
        conn.disconnect()


def _broker_health(node: EmbeddedNode) -> dict[str, Any]:
    return dict(node.status_json().get("services", {}).get("broker", {}))


def test_killed_embedded_broker_is_restarted_and_a_bridge_delivers_again(embedded_node: EmbeddedNode,
                                                                         client_orb: ClientOrb) -> None:
    node = embedded_node
    supplier, dest = _bridge_to_queue(node, client_orb)
    assert _delivered(node, supplier, dest, 1, 60), "the bridge delivers before the crash"
    old = node.broker_pid()
    os.kill(old, signal.SIGKILL)
    assert wait_until(lambda: _broker_health(node).get("restarts", 0) >= 1
                      and _broker_health(node).get("reachable") is True, READY_TIMEOUT_S, 0.5), _broker_health(node)
    new = node.broker_pid()
    assert new != old and pid_alive(new)
    assert _broker_health(node)["pid"] == new and _broker_health(node)["last_restart"]
    assert "embedded ActiveMQ (broker.url) is not running; restarting it" in node.stderr()
    assert "embedded ActiveMQ restarted" in node.stderr()
    text = node.run_cli("status", "--state-dir", str(node.state_dir)).stdout
    assert "restarts 1, last restart" in text, text
    assert _delivered(node, supplier, dest, 2, 120), "the bridge delivers again after the broker came back"


def test_killed_embedded_postgres_is_restarted(embedded_node: EmbeddedNode) -> None:
    node = embedded_node
    old = node.pg_pid()
    os.kill(old, signal.SIGKILL)

    def restarted() -> bool:
        pg = node.status_json().get("services", {}).get("postgres", {})
        return bool(pg.get("restarts", 0) >= 1 and pg.get("reachable") is True)

    assert wait_until(restarted, READY_TIMEOUT_S, 0.5), node.status_json().get("services")
    assert node.pg_pid() != old and pid_alive(node.pg_pid())
    assert "embedded PostgreSQL restarted" in node.stderr()


def test_node_killed_and_restarted_reuses_the_running_broker(embedded_node: EmbeddedNode,
                                                            client_orb: ClientOrb) -> None:
    node = embedded_node
    assert node.proc is not None
    broker_pid, pg_pid = node.broker_pid(), node.pg_pid()
    node.proc.kill()
    node.proc.wait(30)
    node.start()
    assert node.broker_pid() == broker_pid and pid_alive(broker_pid), "the healthy leftover broker is reused"
    assert node.pg_pid() == pg_pid, "and so is PostgreSQL"
    assert f"reusing the running ActiveMQ (pid {broker_pid})" in node.stderr()
    supplier, dest = _bridge_to_queue(node, client_orb)
    assert _delivered(node, supplier, dest, 3, 60), "bridges log in to the reused broker"
    _assert_no_secret(node)


# ------------------------------------------------------------------- 4. starts that fail, stop-services
def _services_untouched(node: EmbeddedNode, broker_pid: int, pg_pid: int) -> None:
    assert pid_alive(broker_pid) and node.broker_pid() == broker_pid, "the leftover ActiveMQ still runs"
    assert stomp_probe("127.0.0.1", node.stomp_port, *node.credentials(), 10) is None, "and answers"
    assert pid_alive(pg_pid) and node.pg_pid() == pg_pid, "the leftover PostgreSQL still runs"
    if os.geteuid() == 0:  # and its OS user can still reach it (pg_ctl runs as postgres)
        assert node.state_dir.stat().st_mode & 0o777 == 0o710, oct(node.state_dir.stat().st_mode)


def test_a_start_that_fails_leaves_the_services_of_a_killed_node_running(embedded_node: EmbeddedNode) -> None:
    """Under systemd's Restart=on-failure a node that cannot start (PostgreSQL down, ORB port busy, bad
    configuration) is retried every few seconds: no attempt may stop (or start) the embedded broker."""
    node = embedded_node
    assert node.proc is not None
    broker_pid, pg_pid = node.broker_pid(), node.pg_pid()
    node.proc.kill()
    node.proc.wait(30)

    dead_pg = f"postgresql://nsjms:pw@127.0.0.1:{free_port()}/nsjms"
    env = dict(node.env(), NSJMS_POSTGRES_DSN=dead_pg)
    for _ in range(2):  # two restart cycles
        done = subprocess.run(node.command(free_port()), capture_output=True, text=True, check=False, timeout=300,
                              stdin=subprocess.DEVNULL, env=env, cwd=REPO)
        assert done.returncode == EXIT_UNREACHABLE, done.stdout + done.stderr
        assert "nsjms serve: postgres.dsn: cannot reach postgresql://nsjms:***@127.0.0.1:" in done.stderr
        assert "ActiveMQ" not in done.stderr, done.stderr  # neither adopted nor restarted nor stopped
        _services_untouched(node, broker_pid, pg_pid)

    with socket.socket() as busy:  # the ORB port is held by another process
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        done = node.serve_again(busy.getsockname()[1])
    assert done.returncode == 1, done.stdout + done.stderr
    assert "orb.host/orb.port: cannot listen on 127.0.0.1:" in done.stderr, done.stderr
    _services_untouched(node, broker_pid, pg_pid)

    bad = node.run_cli("serve", "--state-dir", str(node.state_dir), "--log-level", "LOUD")
    assert bad.returncode == 2 and "configuration error" in bad.stderr, bad.stderr
    _services_untouched(node, broker_pid, pg_pid)

    # what the unit's ExecStopPost runs after such a failure: they stay for the restart
    kept = subprocess.run([*node.command()[:3], "stop-services", "--state-dir", str(node.state_dir),
                           "--unless-restarting"], capture_output=True, text=True, check=False, timeout=300,
                          stdin=subprocess.DEVNULL, cwd=REPO,
                          env=dict(node.env(), SERVICE_RESULT="exit-code", EXIT_CODE="exited", EXIT_STATUS="6"))
    assert kept.returncode == 0 and "keep running" in kept.stdout, kept.stdout + kept.stderr
    _services_untouched(node, broker_pid, pg_pid)

    node.start()  # PostgreSQL back: the next start adopts them
    assert node.broker_pid() == broker_pid and node.pg_pid() == pg_pid
    assert f"reusing the running ActiveMQ (pid {broker_pid})" in node.stderr()


def test_stop_services_is_refused_while_a_node_runs_and_stops_what_a_killed_node_left(
        embedded_node: EmbeddedNode) -> None:
    node = embedded_node
    assert node.proc is not None
    broker_pid, pg_pid = node.broker_pid(), node.pg_pid()
    endpoints = (node.state_dir / "endpoints.json").read_text()
    refused = node.run_cli("stop-services", "--state-dir", str(node.state_dir))
    assert refused.returncode == EXIT_LOCKED, refused.stdout + refused.stderr
    assert f"is in use by a running nsjms node (pid {node.proc.pid}" in refused.stderr
    _services_untouched(node, broker_pid, pg_pid)
    assert (node.state_dir / "endpoints.json").read_text() == endpoints and node.proc.poll() is None

    node.proc.kill()
    node.proc.wait(30)
    # a deliberate `systemctl stop` whose node had to be killed after TimeoutStopSec: ExecStopPost stops them
    stopped = subprocess.run([*node.command()[:3], "stop-services", "--state-dir", str(node.state_dir),
                              "--unless-restarting"], capture_output=True, text=True, check=False, timeout=300,
                             stdin=subprocess.DEVNULL, cwd=REPO,
                             env=dict(node.env(), SERVICE_RESULT="timeout", EXIT_CODE="killed", EXIT_STATUS="KILL"))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"embedded ActiveMQ (pid {broker_pid}), embedded PostgreSQL (pid {pg_pid})" in stopped.stdout
    assert not pid_alive(broker_pid) and not pid_alive(pg_pid)
    assert not (node.state_dir / "endpoints.json").exists(), "the stale endpoints are gone"
    again = node.run_cli("stop-services", "--state-dir", str(node.state_dir))
    assert again.returncode == 0 and "nothing was running" in again.stdout, again.stdout + again.stderr


def test_service_secrets_rotate_with_the_node_stopped(embedded_node: EmbeddedNode) -> None:
    """docs/security.md "Rotation": the embedded broker's passcode and PostgreSQL's password are rotated with the node
    stopped (refused while it runs) and applied at its next start: the old ones are refused, the node serves."""
    import psycopg

    node = embedded_node
    if node.proc is None or node.proc.poll() is not None:
        node.start()
    running = node.run_cli("credentials", "rotate", "--surface", "broker", "--state-dir", str(node.state_dir))
    assert running.returncode == 4 and "needs the node stopped" in running.stdout, running.stdout + running.stderr
    node.stop()
    old_passcode = node.credentials()[1]
    old_pg = (node.state_dir / "pg" / "password").read_text().strip()
    outputs = running.stdout + running.stderr
    for surface in ("broker", "postgres"):
        done = node.run_cli("credentials", "rotate", "--surface", surface, "--state-dir", str(node.state_dir))
        assert done.returncode == 0, done.stdout + done.stderr
        outputs += done.stdout + done.stderr
    node.start()
    login, passcode = node.credentials()
    new_pg = (node.state_dir / "pg" / "password").read_text().strip()
    assert passcode != old_passcode and new_pg != old_pg
    assert stomp_probe("127.0.0.1", node.stomp_port, login, old_passcode, 10) is not None
    assert stomp_probe("127.0.0.1", node.stomp_port, login, passcode, 10) is None

    def pg(password: str) -> None:
        psycopg.connect(host="127.0.0.1", port=node.pg_port, user="postgres", password=password, dbname="nsjms",
                        connect_timeout=10).close()

    with pytest.raises(psycopg.OperationalError):
        pg(old_pg)
    pg(new_pg)
    status = node.run_cli("status", "--state-dir", str(node.state_dir))
    assert status.returncode == 0, status.stdout + status.stderr
    _assert_no_secret(node, outputs + status.stdout + status.stderr, more=(old_passcode, old_pg))
