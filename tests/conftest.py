"""Service fixtures for the whole suite: PostgreSQL (``pg_dsn``, ``fresh_db``) and a broker (``broker_url``).

Each service comes from, in order: an environment variable (``NSJMS_TEST_PG_DSN``, ``NSJMS_TEST_BROKER_URL``);
else the source ``NSJMS_TEST_SERVICES`` selects:

* ``containers``: testcontainers runs the images built by ``scripts/images.sh`` (``nsjms-postgres:local``,
  ``nsjms-activemq:local``; override with ``NSJMS_TEST_PG_IMAGE`` / ``NSJMS_TEST_AMQ_IMAGE``), ports published on
  127.0.0.1 only. No engine, or a missing image, makes every test that needs a service fail, naming the fix.
* ``local``: embedded instances (:mod:`router.node.services`) in a temporary directory on free ports.
* ``auto`` (default): ``containers`` when a Docker engine answers a ping, else ``local``.

A service that cannot be provided makes the test *fail*, in CI and locally: never a skip. Tests marked
``containers`` (the deploy/compose.yaml stack) need the engine itself: they are deselected, with a note in the
summary, when the services are local processes. Channel and ORB fixtures live in ``tests/integration/conftest.py``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import shutil
import socket
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from router.node.config import redact_dsn
from router.node.services import EmbeddedActiveMQ, EmbeddedPostgres, ServiceError, free_port

SERVICES_ENV = "NSJMS_TEST_SERVICES"
SERVICE_MODES = ("auto", "containers", "local")
PG_IMAGE = os.environ.get("NSJMS_TEST_PG_IMAGE", "nsjms-postgres:local")
AMQ_IMAGE = os.environ.get("NSJMS_TEST_AMQ_IMAGE", "nsjms-activemq:local")
CONTAINER_LABEL = "nsjms.test"  # every container the fixtures start carries it (CI removes leftovers by it)
LOOPBACK = "127.0.0.1"
STOMP_READY_TIMEOUT_S = 120.0
PG_READY_TIMEOUT_S = 120.0
_MODE_KEY = pytest.StashKey[str]()
_DESELECTED_KEY = pytest.StashKey[int]()


def _docker_available() -> bool:
    """True when a Docker engine answers a ping within 2 s.

    docker-py leaks its unix socket when the engine is absent; that ResourceWarning is silenced and the socket
    collected here, so "no Docker" stays quiet under ``-W error``.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            return _ping_docker()
        finally:
            gc.collect()


def _ping_docker() -> bool:
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=2)
    except DockerException:
        return False
    try:
        return bool(client.ping())
    except (DockerException, OSError):
        return False
    finally:
        client.close()


def _requested_mode() -> str:
    value = os.environ.get(SERVICES_ENV, "").strip().lower() or "auto"
    if value not in SERVICE_MODES:
        raise pytest.UsageError(f"{SERVICES_ENV}={value!r}: expected one of {', '.join(SERVICE_MODES)}")
    return value


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "containers: needs a Docker engine and the nsjms images (scripts/images.sh); deselected when the "
        f"services are local processes ({SERVICES_ENV}=local, or auto without an engine)",
    )
    requested = _requested_mode()
    if requested == "auto":
        config.stash[_MODE_KEY] = "containers" if _docker_available() else "local"
    else:
        config.stash[_MODE_KEY] = requested


def pytest_report_header(config: pytest.Config) -> str:
    mode = config.stash.get(_MODE_KEY, "?")
    detail = f"images {PG_IMAGE}, {AMQ_IMAGE}" if mode == "containers" else "embedded processes"
    return f"nsjms test services: {mode} ({detail}; {SERVICES_ENV}={os.environ.get(SERVICES_ENV, '') or 'auto'})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.stash.get(_MODE_KEY, "local") == "containers":
        return
    container_only = [item for item in items if item.get_closest_marker("containers") is not None]
    if container_only:
        config.hook.pytest_deselected(items=container_only)
        items[:] = [item for item in items if item.get_closest_marker("containers") is None]
        config.stash[_DESELECTED_KEY] = len(container_only)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    count = config.stash.get(_DESELECTED_KEY, 0)
    if count:
        why = "no Docker engine answered" if _requested_mode() == "auto" else f"{SERVICES_ENV}=local"
        terminalreporter.write_line(
            f"nsjms: {count} container-only test(s) deselected: the services are local processes ({why})"
        )


@pytest.fixture(scope="session")
def service_mode(pytestconfig: pytest.Config) -> str:
    """``containers`` or ``local``: where ``pg_dsn`` and ``broker`` come from (when not given by environment)."""
    return pytestconfig.stash.get(_MODE_KEY, "local")


def _fail(what: str, exc: BaseException) -> NoReturn:
    pytest.fail(
        f"cannot provide {what} for the tests: {type(exc).__name__}: {redact_dsn(str(exc))}", pytrace=False
    )


def _service_dir(prefix: str) -> Path:
    """A temporary directory the ``postgres`` OS user can traverse (pytest's own tmp dirs are mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o711)
    return path


# -------------------------------------------------------------------------------------- PostgreSQL
@pytest.fixture(scope="session")
def pg_dsn(service_mode: str) -> Iterator[str]:
    """DSN of a PostgreSQL 15 server with ``max_prepared_transactions`` > 0 (a database the tests may use)."""
    given = os.environ.get("NSJMS_TEST_PG_DSN", "")
    if given:
        _check_pg(given)
        yield given
        return
    with contextlib.closing(_pg_container() if service_mode == "containers" else _pg_embedded()) as source:
        for dsn in source:
            _check_pg(dsn)
            yield dsn


def _check_pg(dsn: str) -> None:
    """Fail early and clearly when the server is unreachable or cannot prepare transactions."""
    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn:
            row = conn.execute("SHOW max_prepared_transactions").fetchone()
    except psycopg.Error as exc:
        _fail(f"PostgreSQL at {redact_dsn(dsn)}", exc)
    if row is None or int(row[0]) < 1:
        pytest.fail(
            f"PostgreSQL at {redact_dsn(dsn)} has max_prepared_transactions = 0; "
            "restart it with -c max_prepared_transactions=64",
            pytrace=False,
        )


def _container(image: str, ports: tuple[int, ...], env: dict[str, str]) -> Any:
    """A testcontainers container of a local nsjms image (never pulled), ``ports`` published on 127.0.0.1 only."""
    from docker.errors import DockerException, ImageNotFound
    from testcontainers.core.config import testcontainers_config
    from testcontainers.core.container import DockerContainer

    testcontainers_config.ryuk_disabled = True  # its reaper image cannot be pulled here; stop() removes ours
    try:
        import docker

        client = docker.from_env(timeout=10)
        try:
            client.images.get(image)
        finally:
            client.close()
    except ImageNotFound:
        pytest.fail(
            f"container image {image} is missing: build it with `bash scripts/images.sh` "
            f"(or run the tests on local processes: {SERVICES_ENV}=local)",
            pytrace=False,
        )
    except DockerException as exc:
        _fail(f"the Docker engine ({SERVICES_ENV}=containers needs one)", exc)
    container = DockerContainer(image).with_kwargs(labels={CONTAINER_LABEL: "1"})
    for port in ports:
        # docker-py: a 1-tuple (address,) = that address, an ephemeral port; testcontainers' own API binds 0.0.0.0
        container.ports[f"{port}/tcp"] = (LOOPBACK,)  # type: ignore[assignment]  # docker-py accepts it
    for key, value in env.items():
        container.with_env(key, value)
    return container


def _published_here(port: int) -> None:
    """Fail at once when the engine publishes its ports in another network namespace (tests/portcheck.py)."""
    from portcheck import unpublished_problem

    problem = unpublished_problem(port)
    if problem is not None:
        raise ServiceError(problem)


def _container_logs(container: Any) -> str:
    try:
        out, err = container.get_logs()
    except Exception as exc:  # noqa: BLE001 - only for a failure message; the container may be gone
        return f"(no logs: {type(exc).__name__})"
    return redact_dsn((out + err).decode(errors="replace")[-3000:])


def _container_exited(container: Any) -> str | None:
    wrapped = container.get_wrapped_container()
    wrapped.reload()
    if wrapped.status in ("exited", "dead"):
        return f"the container exited (status {wrapped.attrs['State'].get('ExitCode')})"
    return None


def _start_container(container: Any, what: str, ready: Callable[[], None]) -> None:
    """Start it and wait for ``ready``; on any failure remove it and fail the test with its log."""
    try:
        container.start()
        ready()
    except Exception as exc:  # noqa: BLE001 - docker/testcontainers/readiness raise many types; all fail the test
        logs = _container_logs(container) if container.get_wrapped_container() is not None else ""
        with contextlib.suppress(Exception):
            container.stop()
        pytest.fail(
            f"cannot provide {what} for the tests: {type(exc).__name__}: {redact_dsn(str(exc))}\n"
            f"--- container log ---\n{logs}",
            pytrace=False,
        )


def _pg_container() -> Generator[str, None, None]:
    password = secrets.token_urlsafe(18)
    container = _container(PG_IMAGE, (5432,), {"POSTGRES_PASSWORD": password, "POSTGRES_DB": "nsjms"})
    dsn = ""

    def ready() -> None:
        nonlocal dsn
        port = int(container.get_exposed_port(5432))
        _published_here(port)
        dsn = f"postgresql://postgres:{password}@{LOOPBACK}:{port}/nsjms"
        _wait_for_pg(dsn, PG_READY_TIMEOUT_S, lambda: _container_exited(container))

    _start_container(container, f"a PostgreSQL container ({PG_IMAGE})", ready)
    try:
        yield dsn
    finally:
        container.stop()


def _wait_for_pg(dsn: str, timeout: float, exited: Callable[[], str | None]) -> None:
    """Until a connection succeeds (the mapped port accepts TCP before the server inside is up)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=5):
                return
        except psycopg.OperationalError as exc:
            last: BaseException = exc
        reason = exited()
        if reason:
            raise ServiceError(reason)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"PostgreSQL at {redact_dsn(dsn)} not answering within {timeout:.0f} s: {last}")
        time.sleep(0.3)


def _pg_embedded() -> Generator[str, None, None]:
    base = _service_dir("nsjms-test-pg-")
    server = EmbeddedPostgres(base, free_port())
    try:
        dsn = server.start()
    except (ServiceError, OSError) as exc:
        with contextlib.suppress(ServiceError, OSError):
            server.stop()
        shutil.rmtree(base, ignore_errors=True)
        _fail("an embedded PostgreSQL", exc)
    try:
        yield dsn
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def new_database(pg_dsn: str) -> Iterator[str]:
    """A new, empty database on the ``pg_dsn`` server; dropped afterwards with its prepared transactions."""
    name = f"nsjms_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(pg_dsn, dbname=name)
    try:
        yield dsn
    finally:
        _drop_database(pg_dsn, dsn, name)


@pytest.fixture
def fresh_db(pg_dsn: str) -> Iterator[str]:
    """A new, empty database on the ``pg_dsn`` server for one test; dropped afterwards."""
    with new_database(pg_dsn) as dsn:
        yield dsn


@pytest.fixture(scope="module")
def module_db(pg_dsn: str) -> Iterator[str]:
    """A new, empty database shared by the tests of one module (a module-scoped node's); dropped afterwards."""
    with new_database(pg_dsn) as dsn:
        yield dsn


def _drop_database(admin_dsn: str, dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:  # ROLLBACK PREPARED must run in the owning database
        gids = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
        ).fetchall()
        for (gid,) in gids:
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# ------------------------------------------------------------------------------------------ broker
@dataclass(frozen=True)
class Broker:
    """A running broker: its STOMP URL (for nsjms) and OpenWire URL (for the Java JMS interop client)."""

    stomp_url: str
    openwire_url: str


@pytest.fixture(scope="session")
def broker(service_mode: str) -> Iterator[Broker]:
    """An ActiveMQ Classic broker accepting anonymous STOMP and OpenWire connections."""
    given = os.environ.get("NSJMS_TEST_BROKER_URL", "")
    if given:
        yield Broker(given, os.environ.get("NSJMS_TEST_BROKER_OPENWIRE_URL", ""))
    elif service_mode == "containers":
        yield from _broker_container()
    else:
        yield from _broker_embedded()


@pytest.fixture(scope="session")
def broker_url(broker: Broker) -> str:
    """``stomp://host:port`` of the session broker."""
    return broker.stomp_url


@pytest.fixture(scope="session")
def broker_openwire_url(broker: Broker) -> str:
    """``tcp://host:port`` (OpenWire) of the session broker; the Java JMS client connects there."""
    if not broker.openwire_url:
        pytest.fail("NSJMS_TEST_BROKER_URL is set but NSJMS_TEST_BROKER_OPENWIRE_URL is not: "
                    "the Java JMS interop tests need the broker's OpenWire URL")
    return broker.openwire_url


def _broker_container() -> Iterator[Broker]:
    container = _container(AMQ_IMAGE, (61613, 61616), {"ACTIVEMQ_ANONYMOUS": "1"})
    urls: list[str] = []

    def ready() -> None:
        stomp, openwire = int(container.get_exposed_port(61613)), int(container.get_exposed_port(61616))
        _published_here(stomp)
        _wait_for_stomp(LOOPBACK, stomp, STOMP_READY_TIMEOUT_S, lambda: _container_exited(container))
        urls[:] = [f"stomp://{LOOPBACK}:{stomp}", f"tcp://{LOOPBACK}:{openwire}"]

    _start_container(container, f"an ActiveMQ container ({AMQ_IMAGE})", ready)
    try:
        yield Broker(urls[0], urls[1])
    finally:
        container.stop()


def _broker_embedded() -> Iterator[Broker]:
    base = _service_dir("nsjms-test-amq-")
    openwire = free_port()
    broker = EmbeddedActiveMQ(base, free_port(), openwire, die_with_parent=True)
    try:
        url = broker.start()
    except (ServiceError, OSError) as exc:
        shutil.rmtree(base, ignore_errors=True)
        _fail("an embedded ActiveMQ", exc)
    try:
        yield Broker(url, f"tcp://127.0.0.1:{openwire}")
    finally:
        broker.stop()
        shutil.rmtree(base, ignore_errors=True)


def _wait_for_stomp(
    host: str, port: int, timeout: float, exited: Callable[[], str | None] = lambda: None
) -> None:
    """Wait until STOMP CONNECT gets CONNECTED (a mapped container port accepts TCP too early)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=2) as sock:
                sock.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
                if sock.recv(64).startswith(b"CONNECTED"):
                    sock.sendall(b"DISCONNECT\n\n\x00")
                    return
        except OSError as exc:
            last = exc
        reason = exited()
        if reason:
            raise ServiceError(reason)
        time.sleep(0.5)
    raise TimeoutError(f"no STOMP CONNECTED from {host}:{port} within {timeout:.0f} s (last error: {last})")
