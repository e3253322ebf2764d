"""Service fixtures for the whole suite: PostgreSQL (``pg_dsn``, ``fresh_db``) and a broker (``broker_url``).

Each service comes from, in order: an environment variable (``NSJMS_TEST_PG_DSN``, ``NSJMS_TEST_BROKER_URL``);
a testcontainers container when a Docker engine answers; else an embedded instance (:mod:`router.services`) in
a temporary directory on free ports. A service that cannot be provided makes the test *fail*, in CI and
locally: never a skip. Channel and ORB fixtures live in ``tests/integration/conftest.py``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
import gc
import os
import shutil
import socket
import tempfile
import time
import uuid
import warnings
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, NoReturn

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from router.config import redact_dsn
from router.services import EmbeddedActiveMQ, EmbeddedPostgres, ServiceError, free_port

PG_IMAGE = "postgres:15"
AMQ_IMAGE = "apache/activemq-classic:5.18.6"
STOMP_READY_TIMEOUT_S = 120.0


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


@pytest.fixture(scope="session")
def docker_available() -> bool:
    return _docker_available()


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
def pg_dsn(docker_available: bool) -> Iterator[str]:
    """DSN of a PostgreSQL 15 server with ``max_prepared_transactions`` > 0 (a database the tests may use)."""
    given = os.environ.get("NSJMS_TEST_PG_DSN", "")
    if given:
        _check_pg(given)
        yield given
        return
    with contextlib.closing(_pg_container() if docker_available else _pg_embedded()) as source:
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


def _pg_container() -> Generator[str, None, None]:
    from testcontainers.community.postgres import PostgresContainer

    container = PostgresContainer(PG_IMAGE, driver=None).with_command(
        ["postgres", "-c", "max_prepared_transactions=64"]
    )
    try:
        container.start()
    except Exception as exc:  # noqa: BLE001 - docker/testcontainers raise many types; all become a failure
        _fail("a PostgreSQL container", exc)
    try:
        yield container.get_connection_url(driver=None)
    finally:
        container.stop()


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


@pytest.fixture
def fresh_db(pg_dsn: str) -> Iterator[str]:
    """A new, empty database on the ``pg_dsn`` server; dropped afterwards with its prepared transactions."""
    name = f"nsjms_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(pg_dsn, dbname=name)
    try:
        yield dsn
    finally:
        _drop_database(pg_dsn, dsn, name)


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
def broker(docker_available: bool) -> Iterator[Broker]:
    """An ActiveMQ Classic broker accepting anonymous STOMP and OpenWire connections."""
    given = os.environ.get("NSJMS_TEST_BROKER_URL", "")
    if given:
        yield Broker(given, os.environ.get("NSJMS_TEST_BROKER_OPENWIRE_URL", ""))
    elif docker_available:
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
    from testcontainers.core.container import DockerContainer

    container = DockerContainer(AMQ_IMAGE).with_exposed_ports(61613, 61616)
    try:
        container.start()
        host, port = container.get_container_host_ip(), int(container.get_exposed_port(61613))
        openwire = int(container.get_exposed_port(61616))
        _wait_for_stomp(host, port, STOMP_READY_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - docker/testcontainers raise many types; all become a failure
        container.stop()
        _fail("an ActiveMQ container", exc)
    try:
        yield Broker(f"stomp://{host}:{port}", f"tcp://{host}:{openwire}")
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


def _wait_for_stomp(host: str, port: int, timeout: float) -> None:
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
        time.sleep(0.5)
    raise TimeoutError(f"no STOMP CONNECTED from {host}:{port} within {timeout:.0f} s (last error: {last})")
