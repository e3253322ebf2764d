"""``nsjms serve`` with services that do not answer (issue 7, "Unreachable services"): PostgreSQL ends the start
promptly with exit code 6 naming ``postgres.dsn`` and the address (no password); an unreachable broker is reported
at start naming ``broker.url`` and shown by ``nsjms status``, while the node serves."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import NsjmsServer, free_port
from stdclients import wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SECRET = "pw-that-must-not-leak-7f3a"
EXIT_UNREACHABLE = 6


def serve(state: Path, dsn: str, broker_url: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("NSJMS_")}
    return subprocess.run(
        [sys.executable, "-m", "router.cli", "serve", "--state-dir", str(state), "--orb-port", str(free_port()),
         "--broker-url", broker_url],
        capture_output=True, text=True, check=False, timeout=300, stdin=subprocess.DEVNULL, cwd=REPO,
        env=dict(base, NSJMS_POSTGRES_DSN=dsn, **env),
    )


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never says a word (a hung or firewalled server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])


def test_refused_dsn_ends_the_start_naming_the_key_without_the_password(tmp_path: Path) -> None:
    port = free_port()
    done = serve(tmp_path / "state", f"postgresql://nsjms:{SECRET}@127.0.0.1:{port}/nsjms",
                 f"stomp://127.0.0.1:{free_port()}")
    assert done.returncode == EXIT_UNREACHABLE, done.stdout + done.stderr
    assert f"nsjms serve: postgres.dsn: cannot reach postgresql://nsjms:***@127.0.0.1:{port}/nsjms: " in done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert not (tmp_path / "state" / "endpoints.json").exists()
    assert not (tmp_path / "state" / "node.lock").read_text(), "the lock was released (no pid left in it)"


def test_silent_database_is_bounded_by_the_connect_timeout(tmp_path: Path, silent_server: int) -> None:
    done = serve(tmp_path / "state", f"host=127.0.0.1 port={silent_server} dbname=nsjms user=u password={SECRET}",
                 f"stomp://127.0.0.1:{free_port()}", NSJMS_POSTGRES_CONNECT_TIMEOUT_S="2")
    assert done.returncode == EXIT_UNREACHABLE, done.stdout + done.stderr
    assert f"postgres.dsn: cannot reach host=127.0.0.1 port={silent_server} dbname=nsjms user=u password=***" \
        in done.stderr, done.stderr
    assert "timeout" in done.stderr.lower()
    assert SECRET not in done.stdout + done.stderr


@pytest.fixture
def server_with_dead_broker(tmp_path: Path, fresh_db: str) -> Iterator[NsjmsServer]:
    state = tmp_path / "state"
    state.mkdir()
    server = NsjmsServer(state_dir=state, pg_dsn=fresh_db, broker_url=f"stomp://127.0.0.1:{free_port()}",
                         port=free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_unreachable_broker_at_start_is_reported_and_shown_by_status(server_with_dead_broker: NsjmsServer) -> None:
    server = server_with_dead_broker
    url = server.broker_url
    port = url.rpartition(":")[2]
    stdout = server.state_dir / "server.stdout.log"
    warning = f"nsjms: WARNING broker.url {url} is unreachable (cannot connect to 127.0.0.1:{port}"
    # the node prints it just after writing endpoints.json, which is what the fixture waits for
    assert wait_until(lambda: warning in stdout.read_text(), 30), stdout.read_text()
    err = server.stderr_path.read_text()
    assert f"broker.url {url} is unreachable at start" in err, err
    status = subprocess.run([sys.executable, "-m", "router.cli", "status", "--state-dir", str(server.state_dir),
                             "--json"], capture_output=True, text=True, check=False, timeout=60, cwd=REPO)
    assert status.returncode == 8, status.stdout + status.stderr  # degraded (issue 29: it was 0)
    assert json.loads(status.stdout)["degraded"] == [f"broker unreachable (broker.url {url})"]
    services = json.loads(status.stdout)["snapshot"]["services"]
    assert services["broker"]["reachable"] is False and services["broker"]["key"] == "broker.url"
    assert f"127.0.0.1:{port}" in services["broker"]["error"]
    assert services["postgres"]["reachable"] is True and services["postgres"]["embedded"] is False
    done = subprocess.run([sys.executable, "-m", "router.cli", "status", "--state-dir", str(server.state_dir)],
                          capture_output=True, text=True, check=False, timeout=60, cwd=REPO)
    text = done.stdout
    assert done.returncode == 8 and f"DEGRADED    broker unreachable (broker.url {url})" in text, text
    assert f"broker      UNREACHABLE: broker.url {url}  (external)" in text, text

    # the broker comes up on that port later: the node's probe sees it (bridges reconnect by themselves)
    with socket.socket() as fake:
        fake.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        fake.bind(("127.0.0.1", int(port)))
        fake.listen(4)
        assert wait_until(lambda: _broker_error(server) != services["broker"]["error"], 30, 0.2), \
            "the node keeps probing the broker"


def _broker_error(server: NsjmsServer) -> str:
    try:
        data = json.loads((server.state_dir / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return ""
    return str(data.get("services", {}).get("broker", {}).get("error", ""))


def _hung_node(state: Path, port: int) -> None:
    """The files a running node leaves, for a node whose process accepts connections and never answers (SIGSTOP)."""
    state.mkdir()
    loc = f"corbaloc::127.0.0.1:{port}"
    names = {"event_channel_factory": "NotifyEventChannelFactory", "bridge_factory": "BridgeFactory",
             "transaction_admin": "TransactionAdmin"}
    endpoints: dict[str, object] = {key: {"corbaloc": f"{loc}/{n}", "ior": f"{loc}/{n}"} for key, n in names.items()}
    (state / "endpoints.json").write_text(json.dumps(dict(endpoints, node_id="hung", pid=1)))


def test_a_hung_node_is_not_reachable_exit_3_for_every_command(tmp_path: Path, silent_server: int) -> None:
    """Issue 29: a SIGSTOPped node made these print a CORBA.TIMEOUT traceback and exit 1; the docs promise exit 3."""
    from router.node.lifecycle import StateLock

    state = tmp_path / "state"
    _hung_node(state, silent_server)
    lock = StateLock(state)  # the hung node holds its lock
    lock.acquire()
    # `txn list` waits for its own 60 s call timeout: tests/unit/test_cli_edges.py covers it through the same guard
    commands = [["status"], ["channel", "list"], ["bridge", "list"], ["status", "--json"]]
    try:
        procs = [subprocess.Popen([sys.executable, "-m", "router.cli", *cmd, "--state-dir", str(state)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
                 for cmd in commands]  # concurrently: each waits for its own call timeout
        done = [(cmd, *p.communicate(timeout=240), p.returncode) for cmd, p in zip(commands, procs, strict=True)]
    finally:
        lock.release()
    for cmd, out, err, code in done:
        assert code == 3, (cmd, code, out, err)
        assert "Traceback" not in out + err, (cmd, err)
        assert "node not reachable" in out + err, (cmd, out, err)
    out = done[-1][1]
    error = json.loads(out)["error"]  # --json: a JSON error object on stdout
    assert error["exit_code"] == 3 and error["command"] == "status" and "node not reachable" in error["message"]


def test_a_refused_password_says_it_does_not_match_the_servers(tmp_path: Path, fresh_db: str) -> None:
    """Issue 29: compose with new secrets over old volumes looped on a bare "password authentication failed"."""
    from psycopg.conninfo import make_conninfo

    done = serve(tmp_path / "state", make_conninfo(fresh_db, password=SECRET), f"stomp://127.0.0.1:{free_port()}")
    assert done.returncode == EXIT_UNREACHABLE, done.stdout + done.stderr
    assert "password authentication failed" in done.stderr, done.stderr
    assert "the password does not match the one the server has" in done.stderr
    assert SECRET not in done.stdout + done.stderr
