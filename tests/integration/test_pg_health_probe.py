"""PostgreSQL's health probe on a real server (issue 27): the node's watch keeps one session instead of opening one
every ``watch_interval_s``, replaces a session the server ended, and still reports a silent network cut within the
probe's timeout.

Against the code before issue 27, the node test fails: every probe was a new session (``pg_stat_database.sessions``
grew by one per probe).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from test_db_network_cut import CutNetwork, cut_pg  # noqa: F401  (the fixture: PostgreSQL behind a veth pair)

from router.db.conninfo import STATEMENT_BOUND_S
from router.db.health import PostgresProbe

from conftest import NsjmsServer
from stdclients import wait_until

pytestmark = pytest.mark.integration

WAIT_S = 60.0


def _sessions(admin: psycopg.Connection[Any], db: str) -> int:
    row = admin.execute("SELECT sessions FROM pg_stat_database WHERE datname = %s", (db,)).fetchone()
    assert row is not None
    return int(row[0])


def _checked_at(state: Path) -> float | None:
    try:
        value = json.loads((state / "status.json").read_text())["services"]["postgres"]["checked_at"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return float(value) if value is not None else None


def test_the_nodes_postgres_watch_keeps_one_session(nsjms_server: NsjmsServer, fresh_db: str) -> None:
    state = nsjms_server.state_dir
    db = str(psycopg.conninfo.conninfo_to_dict(fresh_db)["dbname"])
    seen: set[float] = set()

    def probes(k: int) -> bool:
        at = _checked_at(state)
        if at is not None:
            seen.add(at)
        return len(seen) >= k

    assert wait_until(lambda: probes(2), WAIT_S, 0.2), "the watch never probed PostgreSQL"
    with psycopg.connect(fresh_db, autocommit=True) as admin:    # one session of the test's, made before the count
        time.sleep(1.5)                      # let the server's statistics take in the sessions made so far
        before, baseline = _sessions(admin, db), len(seen)
        assert wait_until(lambda: probes(baseline + 5), WAIT_S, 0.2), "the watch stopped probing"
        time.sleep(1.5)
        after = _sessions(admin, db)
    # at least 4 probes ran in between; before issue 27 each was a new session
    assert after - before <= 1, f"{after - before} sessions opened during {len(seen) - baseline} probes"


def test_a_probe_replaces_a_session_the_server_ended(fresh_db: str) -> None:
    made: list[psycopg.Connection[Any]] = []

    def connect(dsn: str, **kwargs: Any) -> psycopg.Connection[Any]:
        from router.db.conninfo import connect as bounded

        conn = bounded(dsn, **kwargs)
        made.append(conn)
        return conn

    probe = PostgresProbe(fresh_db, 10.0, connect=connect)
    try:
        for _ in range(3):
            assert probe.check() is None
        assert len(made) == 1
        with psycopg.connect(fresh_db, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (made[0].info.backend_pid,))
        assert wait_until(lambda: made[0].closed or _gone(fresh_db, made[0].info.backend_pid), WAIT_S, 0.05)
        assert probe.check() is None
        assert len(made) == 2 and made[0].closed
    finally:
        probe.close()


def _gone(dsn: str, pid: int) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return bool(row is not None and row[0] == 0)


def test_a_silent_cut_is_reported_within_the_probes_timeout(cut_pg: CutNetwork) -> None:  # noqa: F811
    timeout = 6.0
    probe = PostgresProbe(cut_pg.pg.dsn, timeout)
    try:
        assert probe.check() is None and probe.check() is None          # the kept session answers
        cut_pg.cut()
        try:
            began = time.monotonic()
            problem = probe.check()
            took = time.monotonic() - began
            assert isinstance(problem, psycopg.OperationalError), problem
            # the documented bound (router/db/health.py): the timeout (the new connection gets at least 1 s), with
            # a second of slack for a loaded machine; the kept session alone fails within STATEMENT_BOUND_S
            assert took <= max(timeout, STATEMENT_BOUND_S + 1.0) + 1.0, f"a cut took {took:.1f} s to report"
            assert probe.check() is not None                            # still cut: still unreachable
        finally:
            cut_pg.restore()
        assert wait_until(lambda: probe.check() is None, WAIT_S, 0.5), "reachable again after the cut"
    finally:
        probe.close()
