"""router.node.services against the real binaries: embedded PostgreSQL and ActiveMQ lifecycles, kill -9."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import stomp

from router.node.lifecycle import stomp_probe
from router.node.services import (
    EmbeddedActiveMQ,
    EmbeddedPostgres,
    ServiceError,
    free_port,
    wait_for_port,
)
from router.node.services.process import pid_alive  # zombie-aware liveness check

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A state directory the ``postgres`` OS user can traverse (pytest's tmp_path is mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="nsjms-svc-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def one(conn: psycopg.Connection[Any], sql: str) -> Any:
    """The single value a one-row, one-column query returns."""
    row = conn.execute(sql).fetchone()
    assert row is not None, sql
    return row[0]


def supervisor(code: str, base: Path, *ports: int) -> subprocess.Popen[str]:
    """A child Python process that starts a service, prints one line, then sleeps (to be SIGKILLed)."""
    script = textwrap.dedent(code) + "\nprint(url, flush=True)\nimport time\ntime.sleep(600)\n"
    return subprocess.Popen(
        [sys.executable, "-c", script, str(base), *map(str, ports)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_supervisor(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    proc.kill()
    _, err = proc.communicate(timeout=30)
    assert line, f"supervisor printed nothing; stderr:\n{err}"
    return line


# -------------------------------------------------------------------------------------- PostgreSQL
def test_embedded_postgres_lifecycle(state_dir: Path) -> None:
    server = EmbeddedPostgres(state_dir, free_port())
    dsn = server.start()
    try:
        assert dsn.startswith("postgresql://postgres:") and dsn.endswith(f"@127.0.0.1:{server.port}/nsjms")
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert int(one(conn, "SHOW max_prepared_transactions")) > 0
            assert one(conn, "SHOW listen_addresses") == "127.0.0.1"
            conn.execute("CREATE TABLE t (v int)")
        with psycopg.connect(dsn) as conn:
            conn.execute("INSERT INTO t VALUES (1)")
            conn.execute("PREPARE TRANSACTION 'nsjms-test-1'")
        server.stop()
        assert not server.is_running()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(dsn, connect_timeout=2).close()

        assert server.start() == dsn  # same data dir, same generated password
        with psycopg.connect(dsn, autocommit=True) as conn:
            gids = [r[0] for r in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()]
            assert gids == ["nsjms-test-1"]  # the prepared transaction survived the restart
            conn.execute("COMMIT PREPARED 'nsjms-test-1'")
            assert conn.execute("SELECT v FROM t").fetchall() == [(1,)]
    finally:
        server.stop()


def test_embedded_postgres_needs_the_password(state_dir: Path) -> None:
    server = EmbeddedPostgres(state_dir, free_port())
    dsn = server.start()
    try:
        wrong = dsn.replace(dsn.split(":")[2].split("@")[0], "wrong-password")
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(wrong, connect_timeout=5).close()
        mode = (state_dir / "pg" / "password").stat().st_mode & 0o777
        assert mode == 0o600
    finally:
        server.stop()


def test_embedded_postgres_password_never_reaches_the_server_in_clear(state_dir: Path) -> None:
    """Review finding: the password was set with ``ALTER ROLE ... PASSWORD '<clear text>'`` at every start, which
    the server logs with log_statement=ddl (or when the statement fails). It now sends the SCRAM verifier."""
    server = EmbeddedPostgres(state_dir, free_port())
    dsn = server.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET log_statement = 'ddl'")
            conn.execute("SELECT pg_reload_conf()")
        server.stop()
        dsn = server.start()                                  # the start sets the password again
        password = (state_dir / "pg" / "password").read_text().strip()
        psycopg.connect(dsn, connect_timeout=5).close()       # the verifier authenticates
        log = server.log.read_text(errors="replace")
        assert "ALTER ROLE" in log, "log_statement=ddl did not log the start's ALTER ROLE: the test saw nothing"
        assert password not in log
    finally:
        server.stop()


PG_SUPERVISOR = """
    import sys
    from router.node.services import EmbeddedPostgres
    url = EmbeddedPostgres(sys.argv[1], int(sys.argv[2])).start()
"""


def test_embedded_postgres_restart_after_sigkill_of_supervisor(state_dir: Path) -> None:
    port = free_port()
    dsn = kill_supervisor(supervisor(PG_SUPERVISOR, state_dir, port))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE survived (v int)")
    server = EmbeddedPostgres(state_dir, port)
    try:
        assert server.start() == dsn  # the running instance of that directory is reused
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM survived").fetchone() == (0,)
    finally:
        server.stop()
    assert not server.is_running()


def test_embedded_postgres_restart_after_sigkill_of_postmaster(state_dir: Path) -> None:
    server = EmbeddedPostgres(state_dir, free_port())
    dsn = server.start()
    try:
        pid = int((state_dir / "pg" / "data" / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)  # leaves a stale postmaster.pid behind
        deadline = time.monotonic() + 10
        while server.is_running() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not server.is_running()
        assert server.start() == dsn
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()


def test_embedded_postgres_on_another_port_restarts_the_leftover(state_dir: Path) -> None:
    first = EmbeddedPostgres(state_dir, free_port())
    first.start()
    second = EmbeddedPostgres(state_dir, free_port())
    try:
        dsn = second.start()
        assert f":{second.port}/" in dsn
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SHOW port").fetchone() == (str(second.port),)
    finally:
        second.stop()


def test_embedded_postgres_busy_port(state_dir: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        key = "postgres.embedded_port"
        with pytest.raises(ServiceError, match=f"{key}: port {port} .* already in use; set {key} "):
            EmbeddedPostgres(state_dir, port).start()


def test_embedded_postgres_missing_binaries(state_dir: Path) -> None:
    with pytest.raises(ServiceError, match="apt-get install postgresql-15"):
        EmbeddedPostgres(state_dir, free_port(), bin_dir=state_dir / "nowhere").start()


def test_wait_for_port_times_out_and_aborts() -> None:
    port = free_port()
    with pytest.raises(ServiceError, match=f"127.0.0.1:{port} did not accept connections"):
        wait_for_port("127.0.0.1", port, 0.3)
    with pytest.raises(ServiceError, match="gave up"):
        wait_for_port("127.0.0.1", port, 30, abort=lambda: "gave up")


# ---------------------------------------------------------------------------------------- ActiveMQ
class Collector(stomp.ConnectionListener):
    """Hands frames to a queue and does nothing else on the receiver thread."""

    def __init__(self) -> None:
        self.frames: queue.Queue[stomp.utils.Frame] = queue.Queue()

    def on_message(self, frame: stomp.utils.Frame) -> None:
        self.frames.put(frame)

    def on_error(self, frame: stomp.utils.Frame) -> None:
        self.frames.put(frame)


def stomp_round_trip(port: int) -> None:
    conn = stomp.Connection([("127.0.0.1", port)], auto_content_length=False)
    listener = Collector()
    conn.set_listener("collector", listener)
    conn.connect(wait=True)
    try:
        conn.subscribe("/queue/nsjms.services.text", id="1", ack="auto")
        conn.send("/queue/nsjms.services.text", "hello", headers={"persistent": "true"})
        frame = listener.frames.get(timeout=15)
        assert (frame.cmd, frame.body) == ("MESSAGE", "hello")
        # jms-map-json needs the jettison/xstream jars the supervisor links into the broker's lib dir
        conn.subscribe(
            "/queue/nsjms.services.map", id="2", ack="auto", headers={"transformation": "jms-map-json"}
        )
        body = '{"map":{"entry":[{"string":"count","int":42}]}}'
        conn.send("/queue/nsjms.services.map", body, headers={"transformation": "jms-map-json"})
        frame = listener.frames.get(timeout=15)
        assert frame.cmd == "MESSAGE" and '"int":42' in frame.body
    finally:
        conn.disconnect()


AMQ_SUPERVISOR = """
    import sys
    from router.node.services import EmbeddedActiveMQ
    url = EmbeddedActiveMQ(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])).start()
"""


def test_embedded_activemq_after_sigkill_of_supervisor_is_reused(state_dir: Path) -> None:
    """A healthy leftover broker of this directory with the same configuration keeps running (its JMS clients stay
    connected); issue 7: every restart used to stop it and start a new one."""
    stomp_port, openwire_port = free_port(), free_port()
    url = kill_supervisor(supervisor(AMQ_SUPERVISOR, state_dir, stomp_port, openwire_port))
    assert url == f"stomp://127.0.0.1:{stomp_port}"
    leftover = int((state_dir / "activemq" / "broker.pid").read_text())
    broker = EmbeddedActiveMQ(state_dir, stomp_port, openwire_port)
    assert broker.is_running()  # the orphaned broker is still there ...
    try:
        assert broker.start() == url  # ... and is adopted
        assert broker.reused and broker.pid == leftover and broker.alive()
        stomp_round_trip(stomp_port)
    finally:
        broker.stop()
    assert not broker.is_running() and not pid_alive(leftover)
    with pytest.raises(ServiceError):
        wait_for_port("127.0.0.1", stomp_port, 0.5)


def test_embedded_activemq_leftover_with_another_configuration_is_replaced(state_dir: Path) -> None:
    stomp_port, openwire_port = free_port(), free_port()
    kill_supervisor(supervisor(AMQ_SUPERVISOR, state_dir, stomp_port, openwire_port))
    leftover = int((state_dir / "activemq" / "broker.pid").read_text())
    broker = EmbeddedActiveMQ(state_dir, stomp_port, openwire_port, authenticate=True)  # now with credentials
    try:
        broker.start()
        assert not broker.reused and broker.pid != leftover and not pid_alive(leftover)
        assert stomp_probe("127.0.0.1", stomp_port, "", "", 10) is not None, "anonymous access is refused"
        assert stomp_probe("127.0.0.1", stomp_port, broker.login, broker.passcode, 10) is None
    finally:
        broker.stop()


def test_embedded_activemq_busy_port(state_dir: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        key = "broker.embedded_stomp_port"
        with pytest.raises(ServiceError, match=f"{key}: port {port} .*ActiveMQ STOMP.* already in use"):
            EmbeddedActiveMQ(state_dir, port, free_port()).start()


# ---------------------------------------------------------------------------------------- fixtures
_FRESH: dict[str, str] = {}


def test_fresh_db_fixture_is_empty_and_prepares(fresh_db: str) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        name = one(conn, "SELECT current_database()")
        assert name.startswith("nsjms_t_")
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)
        conn.execute("CREATE TABLE locked (v int)")
    with psycopg.connect(fresh_db) as conn:
        conn.execute("INSERT INTO locked VALUES (1)")
        conn.execute("PREPARE TRANSACTION 'nsjms-fixture-leftover'")  # left for the fixture to clean up
    _FRESH["name"] = name


def test_fresh_db_fixture_dropped_database_and_prepared_xacts(pg_dsn: str) -> None:
    name = _FRESH.get("name")
    assert name, "runs after test_fresh_db_fixture_is_empty_and_prepares"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,)).fetchone() == (0,)
        assert conn.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE database = %s", (name,)
        ).fetchone() == (0,)


def test_broker_url_fixture_round_trip(broker_url: str) -> None:
    host, _, port = broker_url.removeprefix("stomp://").rpartition(":")
    conn = stomp.Connection([(host, int(port))], auto_content_length=False)
    listener = Collector()
    conn.set_listener("collector", listener)
    conn.connect(wait=True)
    try:
        conn.subscribe("/queue/nsjms.fixture", id="1", ack="auto")
        conn.send("/queue/nsjms.fixture", "ping", headers={"persistent": "true"})
        frame = listener.frames.get(timeout=15)
        assert (frame.cmd, frame.body) == ("MESSAGE", "ping")
    finally:
        conn.disconnect()


class _NoTwoPhasePostgres(EmbeddedPostgres):
    """PostgreSQL as installed: ``max_prepared_transactions = 0``, its default."""

    def _server_options(self) -> str:
        return super()._server_options().replace("max_prepared_transactions=64", "max_prepared_transactions=0")


def test_serve_refuses_a_postgres_without_prepared_transactions(state_dir: Path, tmp_path: Path) -> None:
    """Issue 29: it was accepted silently, and every T2 then rolled back forever."""
    server = _NoTwoPhasePostgres(state_dir, free_port())
    dsn = server.start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NSJMS_")}
        done = subprocess.run(
            [sys.executable, "-m", "router.cli", "serve", "--state-dir", str(tmp_path / "node"), "--orb-port",
             str(free_port()), "--broker-url", f"stomp://127.0.0.1:{free_port()}"],
            capture_output=True, text=True, check=False, timeout=300, cwd=REPO, stdin=subprocess.DEVNULL,
            env=dict(env, NSJMS_POSTGRES_DSN=dsn))
    finally:
        server.stop()
    assert done.returncode == 2, done.stdout + done.stderr
    assert "nsjms serve: postgres.dsn postgresql://postgres:***@" in done.stderr, done.stderr
    assert "max_prepared_transactions is 0" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "node" / "endpoints.json").exists()
