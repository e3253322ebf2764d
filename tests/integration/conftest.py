"""Fixtures for the channel integration tests: the ``nsjms serve`` subprocess and a client ORB in the test process.

* :class:`NsjmsServer` runs ``python -m router.cli serve`` on a free 127.0.0.1 port with a private state directory
  and a brand-new database (``fresh_db`` from ``tests/conftest.py``); it waits for ``endpoints.json`` (written by the
  server when ready), and can ``kill`` it with any signal, ``restart`` it with the same directory, DSN and port,
  and ``stop`` it (SIGTERM, then SIGKILL). The server's stdout/stderr go to files in the state directory; their
  tail is put in every start failure message.
* ``client_orb`` (session): one omniORB ORB for the test process, listening on 127.0.0.1 only, RootPOA active,
  with a client call timeout so a dead or hung server never blocks a test forever.
* ``nsjms_server`` (function): a started server, stopped afterwards. ``factory`` narrows its factory reference.
* ``module_server`` (module) and ``shared_factory``: one node for the tests of a module that only use channels of
  their own (no node restart, no assertion over the node's whole state): saves a node start per test.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)
from omniORB import CORBA

import CosNotifyChannelAdmin

from router.security.auth import Role, install_client, install_token, use_token

#: The test process's admin credential (docs/security.md): registered in every node's state directory before it
#: starts, presented by the session's client ORB.
TEST_ADMIN_TOKEN = "nsjms-tests:" + secrets.token_urlsafe(24)
assert install_client(), "the admin credential interceptor must be registered before the first ORB_init"
use_token(TEST_ADMIN_TOKEN)

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # makes ``import stdclients`` work in the test modules under any import mode
    sys.path.insert(0, _HERE)

# omniORB's scavenger thread wakes every ORBscanGranularity seconds (default 5) and ORB::destroy waits for it: a
# node's clean stop (SIGTERM) spent about 4 of its 6 s there, on every node a test stopped. 1 s keeps the scan (the
# idle-connection periods are unchanged) and ends a stop in about 1 s. omniORB reads ORB parameters from the
# environment, so this reaches every node, CLI and client ORB the tests start (set before the session's ORB_init).
os.environ.setdefault("ORBscanGranularity", "1")

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
CLIENT_CALL_TIMEOUT_MS = 30_000
ENDPOINTS_FILE = "endpoints.json"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def restart_port() -> int:
    """A free TCP port on 127.0.0.1 BELOW the kernel's ephemeral range, for a server that is killed and restarted
    on the same port many times while other processes run (CI runs two phases at once): a port from the ephemeral
    range (``free_port``) can be taken, while its server is down, as the local port of any outgoing connection or by
    a container's published port, and the restart then fails with "address in use"."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, max(low, 20001))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


def tail(path: Path, limit: int = 4000) -> str:
    """The last ``limit`` characters of a log file (empty if missing)."""
    try:
        return path.read_text(errors="replace")[-limit:]
    except FileNotFoundError:
        return ""


@dataclass
class NsjmsServer:
    """One ``nsjms serve`` process; restartable with the same state directory, database and port."""

    state_dir: Path
    pg_dsn: str
    broker_url: str
    port: int
    proc: subprocess.Popen[bytes] | None = None
    endpoints: dict[str, Any] | None = None

    @property
    def endpoints_path(self) -> Path:
        return self.state_dir / ENDPOINTS_FILE

    @property
    def stderr_path(self) -> Path:
        return self.state_dir / "server.stderr.log"

    def command(self) -> list[str]:
        """The command line that starts the server (the DSN, which holds a password, goes in the environment)."""
        return [sys.executable, "-m", "router.cli", "serve", "--state-dir", str(self.state_dir),
                "--orb-port", str(self.port), "--broker-url", self.broker_url]

    def start(self, timeout: float = START_TIMEOUT_S) -> dict[str, Any]:
        """Start the process and wait until it wrote ``endpoints.json`` naming its own pid."""
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the process (the environment as it is now) without waiting: :meth:`wait_ready` follows (several
        nodes launched, then waited for, start side by side)."""
        assert self.proc is None or self.proc.poll() is not None, "server already running"
        self.endpoints_path.unlink(missing_ok=True)
        install_token(self.state_dir, TEST_ADMIN_TOKEN, Role.OPERATOR)  # the test process is an operator
        env = dict(os.environ, PYTHONUNBUFFERED="1", NSJMS_POSTGRES_DSN=self.pg_dsn)
        with open(self.state_dir / "server.stdout.log", "ab") as out, open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> dict[str, Any]:
        """Wait until the launched process wrote ``endpoints.json`` naming its own pid."""
        self.endpoints = self._wait_ready(timeout)
        return self.endpoints

    def _wait_ready(self, timeout: float) -> dict[str, Any]:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._fail(f"nsjms serve exited with code {self.proc.returncode} before it was ready")
            data = self._read_endpoints()
            if data is not None and data.get("pid") == self.proc.pid:
                return data
            time.sleep(0.05)
        self._fail(f"nsjms serve wrote no {ENDPOINTS_FILE} within {timeout:.0f} s")
        raise AssertionError("unreachable")

    def _read_endpoints(self) -> dict[str, Any] | None:
        try:
            return dict(json.loads(self.endpoints_path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return None  # not written yet (the server writes it atomically, but be lenient)

    def _fail(self, why: str) -> None:
        shown = " ".join("<dsn>" if arg == self.pg_dsn else "<broker-url>" if arg == self.broker_url else arg
                         for arg in self.command())  # DSNs and URLs may hold credentials
        pytest.fail(f"{why}\ncommand: {shown}\n--- stderr tail ---\n{tail(self.stderr_path)}")

    @property
    def pid(self) -> int:
        assert self.proc is not None, "server not started"
        return self.proc.pid

    def kill(self, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` and wait for the process to end; returns its exit code."""
        assert self.proc is not None, "server not started"
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=STOP_TIMEOUT_S)

    def restart(self, timeout: float = START_TIMEOUT_S) -> dict[str, Any]:
        """Start again with the same state directory, database and port (after ``kill`` or ``stop``)."""
        return self.start(timeout)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL if it does not end within the stop timeout; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        return self.wait_stopped()

    def wait_stopped(self) -> int | None:
        """After a SIGTERM (:meth:`stop`, or several nodes signalled first): its exit code, SIGKILL if it does not
        end within the stop timeout."""
        assert self.proc is not None, "server not started"
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def ior(self) -> str:
        """The factory IOR from ``endpoints.json``."""
        assert self.endpoints is not None
        return str(self.endpoints["event_channel_factory"]["ior"])

    def corbaloc(self) -> str:
        """The factory corbaloc from ``endpoints.json``."""
        assert self.endpoints is not None
        return str(self.endpoints["event_channel_factory"]["corbaloc"])


@dataclass(frozen=True)
class ClientOrb:
    """The test process's ORB and its active RootPOA."""

    orb: Any
    poa: Any

    def factory(self, stringified: str) -> Any:
        """Resolve a stringified reference (IOR or corbaloc) and narrow it to an EventChannelFactory."""
        obj = self.orb.string_to_object(stringified)
        factory = obj._narrow(CosNotifyChannelAdmin.EventChannelFactory)
        assert factory is not None, f"{stringified[:60]} is not a CosNotifyChannelAdmin::EventChannelFactory"
        # Ports are reused between tests: the ORB may hold a connection to an earlier, killed server on the same
        # port, and the first call over it fails with COMM_FAILURE (COMPLETED_MAYBE). One harmless call clears it.
        for _ in range(3):
            try:
                factory.get_all_channels()
                break
            except (CORBA.COMM_FAILURE, CORBA.TRANSIENT):
                time.sleep(0.2)
        return factory


@pytest.fixture(scope="session")
def client_orb() -> Iterator[ClientOrb]:
    """One ORB for the test process (127.0.0.1 endpoint, bounded client calls), RootPOA activated."""
    args = ["-ORBendPoint", "giop:tcp:127.0.0.1:",
            "-ORBclientCallTimeOutPeriod", str(CLIENT_CALL_TIMEOUT_MS),
            "-ORBnativeCharCodeSet", "UTF-8"]  # like the server: IDL strings carry any Unicode (JMS text bodies)
    orb = CORBA.ORB_init(args, CORBA.ORB_ID)
    poa = orb.resolve_initial_references("RootPOA")
    poa._get_the_POAManager().activate()
    yield ClientOrb(orb, poa)
    orb.shutdown(True)
    orb.destroy()


@contextlib.contextmanager
def started_node(state: Path, dsn: str, broker_url: str) -> Iterator[NsjmsServer]:
    """A running ``nsjms serve`` on a free port with state directory ``state`` (created), database ``dsn`` and
    broker ``broker_url``; stopped after."""
    state.mkdir(parents=True)
    server = NsjmsServer(state_dir=state, pg_dsn=dsn, broker_url=broker_url, port=free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nsjms_server(tmp_path: Path, fresh_db: str, broker_url: str) -> Iterator[NsjmsServer]:
    """A running ``nsjms serve`` on a free port with its own state directory and a brand-new database."""
    with started_node(tmp_path / "state", fresh_db, broker_url) as server:
        yield server


@pytest.fixture
def factory(nsjms_server: NsjmsServer, client_orb: ClientOrb) -> Any:
    """The server's EventChannelFactory, resolved through its IOR."""
    return client_orb.factory(nsjms_server.ior())


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory, module_db: str, broker_url: str
                  ) -> Iterator[NsjmsServer]:
    """One running node for the tests of a module that need no fresh node: each makes channels of its own and
    asserts only about those (never about the node's whole state, and never stops, kills or restarts it)."""
    with started_node(tmp_path_factory.mktemp("module-node") / "state", module_db, broker_url) as server:
        yield server


@pytest.fixture
def shared_factory(module_server: NsjmsServer, client_orb: ClientOrb) -> Any:
    """The module node's EventChannelFactory; the test fails if that node died (an earlier test crashed it)."""
    assert module_server.proc is not None and module_server.proc.poll() is None, \
        f"the module's node exited with code {module_server.proc and module_server.proc.returncode}:\n" \
        f"{tail(module_server.stderr_path)}"
    return client_orb.factory(module_server.ior())


@pytest.fixture
def shared_bf(shared_factory: Any, module_server: NsjmsServer, client_orb: ClientOrb) -> Any:
    """The module node's BridgeFactory (for tests that make bridges, channels and destinations of their own)."""
    return bridge_factory(client_orb, module_server)


# The Java JMS client fixture, shared by every integration module that needs it (imported here, not in each test
# module, so the test modules do not re-bind a fixture name).
from router.node.services import EmbeddedActiveMQ, EmbeddedPostgres  # noqa: E402

from bridgekit import JavaTool, bridge_factory, java_tool  # noqa: E402, F401
from stdclients import wait_until  # noqa: E402


# --------------------------------------------------------------------- a node with a broker of its own (faults)
@dataclass
class Rig:
    broker: EmbeddedActiveMQ
    server: NsjmsServer
    java: JavaTool
    bf: Any
    factory: Any

    def kill_broker(self) -> None:
        """SIGKILL: no clean shutdown, the store keeps only what the broker had confirmed."""
        pid = int(self.broker.pid_file.read_text().strip())
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 20)
        self.broker.stop()                    # reaps the child; the next start() reuses the directory and ports


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@contextlib.contextmanager
def running_node(tmp_path: Path, fresh_db: str, client_orb: ClientOrb, java: JavaTool,
                 broker: EmbeddedActiveMQ) -> Iterator[Rig]:
    """A node (in ``tmp_path/state``, database ``fresh_db``) using ``broker``; stopped after (the broker is not)."""
    state = tmp_path / "state"
    state.mkdir()
    server = NsjmsServer(state_dir=state, pg_dsn=fresh_db, broker_url=broker.url, port=free_port())
    try:
        server.start()
        yield Rig(broker, server, java.with_url(f"tcp://127.0.0.1:{broker.openwire_port}"),
                  bridge_factory(client_orb, server), client_orb.factory(server.ior()))
    finally:
        server.stop()


@contextlib.contextmanager
def own_broker(base: Path, broker_type: type[EmbeddedActiveMQ] = EmbeddedActiveMQ) -> Iterator[EmbeddedActiveMQ]:
    """A started broker of ``broker_type`` in ``base``; stopped and removed after."""
    base.mkdir(parents=True, exist_ok=True)
    broker = broker_type(base, free_port(), free_port(), die_with_parent=True)
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def running_rig(tmp_path: Path, fresh_db: str, client_orb: ClientOrb, java: JavaTool,
                broker_type: type[EmbeddedActiveMQ] = EmbeddedActiveMQ) -> Iterator[Rig]:
    """A broker of the node's own (``broker_type``, in ``tmp_path/amq``) and a node using it; both stopped after."""
    with own_broker(tmp_path / "amq", broker_type) as broker, \
            running_node(tmp_path, fresh_db, client_orb, java, broker) as rig:
        yield rig


@pytest.fixture(scope="module")
def rig_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedActiveMQ]:
    """The broker of a module's ``rig`` tests: one start per module instead of one per test (each test has a node
    and a database of its own, and names its destinations uniquely)."""
    with own_broker(tmp_path_factory.mktemp("rig-amq")) as broker:
        yield broker


@pytest.fixture
def rig(tmp_path: Path, fresh_db: str, client_orb: ClientOrb, java_tool: JavaTool,  # noqa: F811
        rig_broker: EmbeddedActiveMQ) -> Iterator[Rig]:
    """A node of its own on the module's broker, which a test may SIGSTOP, SIGKILL and restart: each test finds it
    running (an earlier test that failed before it thawed or restarted the broker does not leave it down)."""
    pid = rig_broker.pid
    if pid is not None:
        os.kill(pid, signal.SIGCONT)
    if not rig_broker.alive():
        rig_broker.stop()
        rig_broker.start()
    with running_node(tmp_path, fresh_db, client_orb, java_tool, rig_broker) as started:
        yield started


@pytest.fixture
def own_pg() -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL cluster of the test's own (local processes), for tests that stop and restart the server; on a
    port below the ephemeral range (:func:`restart_port`), so nothing else takes it while the server is down."""
    base = Path(tempfile.mkdtemp(prefix="nsjms-test-ownpg-"))
    base.chmod(0o755)                      # the postgres OS user must reach the cluster directory
    pg = EmbeddedPostgres(base, restart_port())
    try:
        pg.start()
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)
