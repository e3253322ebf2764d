"""docs/external-services.md, tested: a node started from ``deploy/nsjms-external.toml`` against an existing
PostgreSQL and ActiveMQ (the test session's own services, used as "external" ones) routes an event.

Only ``state_dir``, ``orb.port``, ``postgres.dsn`` (host, port, role, database) and ``broker.url`` of the example are
replaced. The database role has exactly the privileges the guide asks for: it owns its database, nothing more
(no superuser, no CREATEDB, no CREATEROLE). The password comes from ``PGPASSWORD``, the broker passcode from
``NSJMS_BROKER_PASSCODE``, as the guide says.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from conftest import free_port, tail
from stdclients import wait_until

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "deploy" / "nsjms-external.toml"
TABLES = {"nsjms_channel", "nsjms_admin", "nsjms_proxy", "nsjms_event", "nsjms_queue", "nsjms_filter", "nsjms_bridge"}


@pytest.fixture
def owner_db(pg_dsn: str) -> Iterator[tuple[str, str, str]]:
    """A role that only owns a new database (the guide's privileges): ``(role, password, database)``."""
    role, password, db = f"nsjms_r_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex, f"nsjms_x_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} NOSUPERUSER NOCREATEDB NOCREATEROLE").format(
            sql.Identifier(role), sql.Literal(password)))
        admin.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(db), sql.Identifier(role)))
    try:
        yield role, password, db
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def _substitute(text: str, key: str, value: str) -> str:
    new, n = re.subn(rf'(?m)^{key} = .*$', f"{key} = {json.dumps(value) if isinstance(value, str) else value}", text)
    assert n == 1, f"{EXAMPLE.name}: no single '{key} = …' line"
    return new


def test_example_configuration_with_existing_services_routes_an_event(
        tmp_path: Path, pg_dsn: str, broker_url: str, owner_db: tuple[str, str, str]) -> None:
    role, password, db = owner_db
    server = conninfo_to_dict(pg_dsn)
    state, port = tmp_path / "state", free_port()
    text = EXAMPLE.read_text()
    text = _substitute(text, "state_dir", str(state))
    text = re.sub(r"(?m)^port = 2809$", f"port = {port}", text)
    text = _substitute(text, "dsn", f"postgresql://{role}@{server.get('host', '127.0.0.1')}:{server['port']}/{db}")
    text = _substitute(text, "url", broker_url)
    config = tmp_path / "nsjms.toml"
    config.write_text(text)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("NSJMS_", "PG"))}
    env.update(PGPASSWORD=password, NSJMS_BROKER_PASSCODE="not-checked-by-the-test-broker", PYTHONUNBUFFERED="1")
    log = tmp_path / "serve.log"
    with open(log, "ab") as out:
        node = subprocess.Popen([sys.executable, "-m", "router.cli", "serve", "--config", str(config)],
                                stdout=out, stderr=out, stdin=subprocess.DEVNULL, cwd=REPO, env=env)
    try:
        assert wait_until(lambda: (state / "endpoints.json").exists() or node.poll() is not None, 120), tail(log)
        assert node.poll() is None, f"nsjms serve exited with {node.returncode}:\n{tail(log)}"
        demo = subprocess.run([sys.executable, "-m", "router.cli", "demo", "--config", str(config), "--count", "1",
                               "--json"], capture_output=True, text=True, timeout=120, cwd=REPO, env=env,
                              stdin=subprocess.DEVNULL)
        assert demo.returncode == 0, demo.stdout + demo.stderr + tail(log)
        result = json.loads(demo.stdout.splitlines()[-1])
        assert (result["pushed"], result["received"]) == (1, 1), result
        assert len(result["bridges"]) == 2, "the event went through the broker (channel → queue → channel)"
        assert password not in log.read_text() + demo.stdout + demo.stderr, "the password is never printed"
    finally:
        node.terminate()
        node.wait(timeout=90)
    with psycopg.connect(pg_dsn, dbname=db) as conn:
        owned = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE tableowner = %s", (role,))}
    assert owned >= TABLES, f"the node created its tables at start, owned by its role: {sorted(owned)}"
