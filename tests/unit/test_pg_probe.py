"""router/db/health.py: PostgreSQL's probe keeps its connection and opens a new one only when that one fails, within
the probe's timeout (issue 27)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from router.db.health import PostgresProbe


class FakeConn:
    def __init__(self, fail: list[bool]) -> None:
        self.fail = fail            # shared: set fail[0] to make the next SELECT fail
        self.selects = 0
        self.closed = False

    def execute(self, sql: str) -> None:
        assert sql == "SELECT 1"
        self.selects += 1
        if self.fail[0]:
            raise psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly")

    def close(self) -> None:
        self.closed = True


class Connector:
    """Makes FakeConns; ``refuse``: the next connects fail; records each call's ``connect_timeout``."""

    def __init__(self, clock: list[float], select_cost: float = 0.0) -> None:
        self.made: list[FakeConn] = []
        self.timeouts: list[int] = []
        self.refuse = False
        self.fail = [False]
        self.clock = clock
        self.select_cost = select_cost

    def __call__(self, dsn: str, **kwargs: Any) -> FakeConn:
        assert dsn == "dbname=x" and kwargs["autocommit"] is True
        self.timeouts.append(kwargs["connect_timeout"])
        if self.refuse:
            raise psycopg.OperationalError("connection refused")
        conn = FakeConn(self.fail)
        self.made.append(conn)
        return conn


def _probe(timeout: float = 10.0) -> tuple[PostgresProbe, Connector, list[float]]:
    clock = [100.0]
    connector = Connector(clock)
    return PostgresProbe("dbname=x", timeout, connect=connector, clock=lambda: clock[0]), connector, clock


def test_checks_reuse_one_connection() -> None:
    probe, connector, _ = _probe()
    for _ in range(5):
        assert probe.check() is None
    assert len(connector.made) == 1 and connector.made[0].selects == 5
    assert connector.timeouts == [10]


def test_a_failed_kept_connection_is_replaced_and_the_new_one_answers() -> None:
    probe, connector, _ = _probe()
    assert probe.check() is None
    old = connector.made[0]
    connector.fail[0] = True
    connector.fail = [False]                   # connections made from now on answer
    assert probe.check() is None
    assert old.closed and len(connector.made) == 2 and not connector.made[1].closed
    assert probe.check() is None and len(connector.made) == 2


def test_unreachable_when_the_kept_connection_fails_and_no_new_one_can_be_made() -> None:
    probe, connector, _ = _probe()
    assert probe.check() is None
    connector.fail[0], connector.refuse = True, True
    problem = probe.check()
    assert isinstance(problem, psycopg.OperationalError) and "refused" in str(problem)
    assert connector.made[0].closed
    connector.refuse = False
    connector.fail = [False]
    assert probe.check() is None                 # back: a new connection is kept again
    assert len(connector.made) == 2


def test_a_new_connection_that_cannot_answer_is_not_kept() -> None:
    probe, connector, _ = _probe()
    connector.fail[0] = True
    assert isinstance(probe.check(), psycopg.OperationalError)
    assert connector.made[0].closed
    connector.fail[0] = False
    assert probe.check() is None and len(connector.made) == 2


def test_the_new_connection_gets_what_is_left_of_the_timeout() -> None:
    """A silent cut fails the kept connection's SELECT after the connection's tcp_user_timeout: the new connection
    then has the rest of the probe's timeout (at least 1 s), so the whole check stays within it."""
    clock = [100.0]
    connector = Connector(clock)
    probe = PostgresProbe("dbname=x", 10.0, connect=connector, clock=lambda: clock[0])
    assert probe.check() is None
    kept = connector.made[0]

    def slow_fail(sql: str) -> None:
        clock[0] += 3.4                             # the kernel gave up after tcp_user_timeout
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    kept.execute = slow_fail  # type: ignore[method-assign]
    connector.refuse = True
    assert isinstance(probe.check(), psycopg.OperationalError)
    assert connector.timeouts == [10, 6]
    clock[0] += 100.0
    connector.refuse = False
    assert probe.check() is None and connector.timeouts[-1] == 10     # nothing kept: a whole timeout


@pytest.mark.parametrize("spent", [9.5, 30.0])
def test_at_least_one_second_for_the_new_connection(spent: float) -> None:
    clock = [0.0]
    connector = Connector(clock)
    probe = PostgresProbe("dbname=x", 10.0, connect=connector, clock=lambda: clock[0])
    assert probe.check() is None

    def slow_fail(sql: str) -> None:
        clock[0] += spent
        raise psycopg.OperationalError("timeout expired")

    connector.made[0].execute = slow_fail  # type: ignore[method-assign]
    assert probe.check() is None
    assert connector.timeouts[-1] == 1


def test_close_ends_the_kept_connection() -> None:
    probe, connector, _ = _probe()
    assert probe.check() is None
    probe.close()
    assert connector.made[0].closed
    assert probe.check() is None and len(connector.made) == 2


def test_a_frozen_server_is_unreachable_within_the_probe_s_bound() -> None:
    """The review's finding: a server that acknowledges at the TCP level but answers nothing (SIGSTOP, a backend
    stuck on I/O) held the kept connection's SELECT 1 for ever (no tcp_user_timeout or keepalive fires), the
    watch thread with it, and the node kept saying PostgreSQL was reachable. Now the SELECT gives up at the
    probe's timeout (its socket shut down) and a new connection decides."""
    import socket
    import time
    from types import SimpleNamespace

    ours, server = socket.socketpair()

    class Frozen(FakeConn):
        def __init__(self) -> None:
            super().__init__([False])
            self.pgconn = SimpleNamespace(socket=ours.fileno())

        def execute(self, sql: str) -> None:
            if not ours.recv(1):                                  # the server never writes: only a shutdown ends it
                raise psycopg.OperationalError("server closed the connection unexpectedly")

    clock = [100.0]
    connector = Connector(clock)
    probe = PostgresProbe("dbname=x", 0.5, connect=connector)
    probe._conn = Frozen()  # type: ignore[assignment]
    connector.refuse = True                                       # nor does a new connection get an answer
    began = time.monotonic()
    try:
        error = probe.check()
    finally:
        ours.close()
        server.close()
    assert isinstance(error, psycopg.OperationalError) and "connection refused" in str(error)
    assert time.monotonic() - began < 30, "bounded (the probe's timeout, then the new connection's)"
    assert probe._conn is None


def test_the_frozen_select_s_error_says_why() -> None:
    import socket
    from types import SimpleNamespace

    from router.db.health import _select_one

    ours, server = socket.socketpair()

    class Frozen:
        pgconn = SimpleNamespace(socket=ours.fileno())

        def execute(self, sql: str) -> None:
            if not ours.recv(1):
                raise psycopg.OperationalError("server closed the connection unexpectedly")

    try:
        with pytest.raises(psycopg.OperationalError, match=r"did not answer SELECT 1 within 0\.2 s"):
            _select_one(Frozen(), 0.2)  # type: ignore[arg-type]
    finally:
        ours.close()
        server.close()
