"""Numbered schema migrations against a real PostgreSQL: fresh, adopted, idempotent, concurrent, tampered."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from router.db import Database, SchemaError
from router.db.migrate import LEGACY_OBJECTS, VERSION_TABLE, load, run

LEGACY_SQL = (Path(__file__).parent / "legacy_schema.sql").read_text(encoding="utf-8")


@pytest.fixture
def db(fresh_db: str) -> Iterator[Database]:
    database = Database(fresh_db, 2)
    database.open(migrate=False)
    try:
        yield database
    finally:
        database.close()


def versions(dsn: str) -> list[tuple[int, str, str]]:
    with psycopg.connect(dsn) as conn:
        return [(int(v), str(n), str(c)) for v, n, c in
                conn.execute(f"SELECT version, name, checksum FROM {VERSION_TABLE} ORDER BY version")]


def objects(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {name for name in LEGACY_OBJECTS
                if conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone() == (True,)}


def columns(conn: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns "
        "WHERE table_schema = %s ORDER BY table_name, column_name", (schema,)).fetchall()


def test_a_fresh_database_is_created_at_the_latest_version(db: Database, fresh_db: str) -> None:
    assert db.migrate() == [m.version for m in load()]
    assert objects(fresh_db) == set(LEGACY_OBJECTS)
    assert versions(fresh_db) == [(m.version, m.name, m.checksum) for m in load()]


def test_a_second_run_changes_nothing(db: Database, fresh_db: str) -> None:
    db.migrate()
    before = versions(fresh_db)
    assert db.migrate() == []
    assert versions(fresh_db) == before


def test_a_database_of_the_previous_version_is_adopted_with_its_rows(db: Database, fresh_db: str) -> None:
    with psycopg.connect(fresh_db) as conn:
        conn.execute(LEGACY_SQL.encode())
        conn.execute("INSERT INTO nsjms_channel(id, qos, admin_props) VALUES (7, '{}', '{}')")
    assert db.migrate() == [m.version for m in load()[1:]]      # version 1 recorded, not run again
    assert [v for v, _, _ in versions(fresh_db)] == [m.version for m in load()]
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT id FROM nsjms_channel").fetchall() == [(7,)]


def test_the_initial_migration_reproduces_the_previous_schema(fresh_db: str) -> None:
    with psycopg.connect(fresh_db) as conn:
        conn.execute("CREATE SCHEMA old; CREATE SCHEMA new")
        conn.execute("SET search_path TO old")
        conn.execute(LEGACY_SQL.encode())
        conn.execute("SET search_path TO new")
        conn.execute(load()[0].sql.encode())
        old, new = columns(conn, "old"), columns(conn, "new")
    assert old and [r[:4] for r in old] == [r[:4] for r in new]
    assert [str(r[4]).replace("old.", "") for r in old] == [str(r[4]).replace("new.", "") for r in new]


def test_a_half_made_database_is_refused_untouched(db: Database, fresh_db: str) -> None:
    with psycopg.connect(fresh_db) as conn:
        conn.execute(LEGACY_SQL.encode())
        conn.execute("DROP TABLE nsjms_bridge")
    with pytest.raises(SchemaError, match="missing: nsjms_bridge"):
        db.migrate()
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (VERSION_TABLE,)).fetchone() == (None,)


def test_concurrent_runners_apply_each_migration_once(fresh_db: str) -> None:
    start = threading.Barrier(2)
    results: list[list[int] | BaseException] = []

    def runner() -> None:
        try:
            with psycopg.connect(fresh_db) as conn:
                start.wait(10)
                results.append(run(conn))
        except BaseException as exc:  # noqa: BLE001 — reported by the assertion below
            results.append(exc)

    threads = [threading.Thread(target=runner) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(isinstance(r, list) for r in results), results
    assert sorted(str(r) for r in results) == sorted([str([]), str([m.version for m in load()])])
    assert [v for v, _, _ in versions(fresh_db)] == [m.version for m in load()]


def test_a_tampered_migration_refuses_to_start(db: Database, fresh_db: str) -> None:
    db.migrate()
    with psycopg.connect(fresh_db) as conn:
        conn.execute(f"UPDATE {VERSION_TABLE} SET checksum = %s WHERE version = 1", ("f" * 64,))
    with pytest.raises(SchemaError, match=r"0001_initial\.sql differs .* refusing to start"):
        db.migrate()
    node_db = Database(fresh_db, 2)
    try:
        with pytest.raises(SchemaError):
            node_db.open()                    # what a node's start does
    finally:
        node_db.close()


# -- through `nsjms serve` ---------------------------------------------------------------------------------------
def _server(tmp_path: Path, dsn: str, broker_url: str) -> Any:
    from conftest import NsjmsServer, free_port

    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    return NsjmsServer(state_dir=state, pg_dsn=dsn, broker_url=broker_url, port=free_port())


def test_a_node_adopts_a_pre_migration_database_and_refuses_a_tampered_one(
        tmp_path: Path, fresh_db: str, broker_url: str, client_orb: Any) -> None:
    server = _server(tmp_path, fresh_db, broker_url)
    server.start()
    try:
        _, cid = client_orb.factory(server.ior()).create_channel([], [])
    finally:
        server.stop()
    with psycopg.connect(fresh_db) as conn:       # what the previous version leaves: its tables, no version table
        conn.execute(f"DROP TABLE {VERSION_TABLE}")
        later = [r[0] for r in conn.execute(          # and none of what later migrations create
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE 'nsjms%%' "
            "AND NOT tablename = ANY(%s)", (list(LEGACY_OBJECTS),))]
        for table in later:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(table)))
    server.start()
    try:
        assert cid in client_orb.factory(server.ior()).get_all_channels()
    finally:
        server.stop()
    assert [v for v, _, _ in versions(fresh_db)] == [m.version for m in load()]
    with psycopg.connect(fresh_db) as conn:
        conn.execute(f"UPDATE {VERSION_TABLE} SET checksum = %s WHERE version = 1", ("0" * 64,))
    env = dict(os.environ, NSJMS_POSTGRES_DSN=fresh_db)
    done = subprocess.run(server.command(), env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "0001_initial.sql differs from the one applied to this database" in done.stderr
