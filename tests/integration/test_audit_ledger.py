"""The ledger in a real PostgreSQL: schema, day partitions, retention, synthetic COPY, Parquet export."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import psycopg
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from audit import LedgerError
from audit.export import export_days
from audit.ledger import (
    DEFAULT_PARTITION,
    TABLE,
    RetentionSettings,
    day_bounds,
    drop_expired_partitions,
    ensure_partitions,
    install_schema,
    list_partitions,
    maintain,
)
from audit.synth import SynthSpec, arrow_schema, copy_to_postgres, generate
from router.db.migrate import load

pytestmark = pytest.mark.integration

DAY = date(2026, 1, 1)


def _count(conn: psycopg.Connection[tuple[object, ...]], table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(str(row[0]))


def test_partitions_created_ahead_dropped_after_retention_and_stray_rows_moved(fresh_db: str) -> None:
    with psycopg.connect(fresh_db) as conn:
        install_schema(conn)
        # a row for a day without a partition lands in the default partition (the insert never fails) ...
        conn.execute(f"INSERT INTO {TABLE} (dedupe_id, channel_id, direction, accepted_at, outcome) "
                     "VALUES ('d-1', 0, 'channel_to_jms', %s, 'accepted')", (day_bounds(DAY)[0] + timedelta(hours=5),))
        assert _count(conn, DEFAULT_PARTITION) == 1
        # ... and moves into its day's partition when that is created
        assert ensure_partitions(conn, DAY - timedelta(days=2), 4) == [DAY - timedelta(days=n) for n in (2, 1, 0)] + [
            DAY + timedelta(days=1)]
        assert _count(conn, DEFAULT_PARTITION) == 0
        assert _count(conn, "nsjms_ledger_p20260101") == 1
        assert ensure_partitions(conn, DAY, 2) == []  # idempotent
        assert drop_expired_partitions(conn, retention_days=1, today=DAY + timedelta(days=1)) == [
            DAY - timedelta(days=2), DAY - timedelta(days=1)]
        assert list_partitions(conn) == [DAY, DAY + timedelta(days=1)]
        assert _count(conn, TABLE) == 1  # the kept day's row is still there
        created, dropped = maintain(conn, RetentionSettings(retention_days=1, ahead_days=1), today=DAY + timedelta(3))
        assert created == [DAY + timedelta(days=3), DAY + timedelta(days=4)]
        assert dropped == [DAY, DAY + timedelta(days=1)]
        assert _count(conn, TABLE) == 0


def test_schema_rejects_a_failure_without_reason_and_is_the_node_migration(fresh_db: str) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        assert install_schema(conn) == [m.version for m in load()]   # the node's runner: ledger included
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(f"INSERT INTO {TABLE} (dedupe_id, channel_id, direction, accepted_at, outcome) "
                         "VALUES ('d-1', 0, 'channel_to_jms', now(), 'dead_letter')")
        assert install_schema(conn) == []                            # up to date: nothing to do
        conn.execute("UPDATE nsjms_schema_version SET checksum = 'x' WHERE version = 3")
        with pytest.raises(LedgerError, match=r"install ledger schema: .*0003_ledger\.sql differs"):
            install_schema(conn)


def test_synthetic_copy_then_export_parquet_by_day(fresh_db: str, tmp_path: Path) -> None:
    start = datetime(2026, 1, 1, 23, 59, 50, tzinfo=UTC)  # 20 s at 10/s: crosses midnight
    table, _ = generate(SynthSpec(deliveries=200, rate_per_s=10.0, start=start, lost=1, dead_letters=2,
                                  in_doubt=1, duplicates=1))
    with psycopg.connect(fresh_db) as conn:
        install_schema(conn)
        ensure_partitions(conn, start.date(), 2)
        assert copy_to_postgres(table, conn) == table.num_rows
        in_db = _count(conn, TABLE)
    assert in_db == table.num_rows

    # the window starts a day earlier: an empty day writes no file (and does not fail)
    result = export_days(fresh_db, start - timedelta(days=1), start + timedelta(hours=1), tmp_path, progress=False)
    assert result.rows == table.num_rows
    assert [f.parent.name for f in result.files] == ["day=2026-01-01", "day=2026-01-02"]
    back = pq.read_table(result.files[0]).to_pylist() + pq.read_table(result.files[1]).to_pylist()
    want = sorted(table.drop_columns(["entry_id"]).to_pylist(), key=lambda r: (r["accepted_at"], r["recorded_at"]))
    got = sorted([{k: v for k, v in r.items() if k != "entry_id"} for r in back],
                 key=lambda r: (r["accepted_at"], r["recorded_at"]))
    assert got == want
    assert not list(tmp_path.rglob("*.tmp"))


def _nsjms(*args: str, dsn: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NSJMS_POSTGRES_DSN": dsn, **extra_env}  # the DSN (with its password) stays off the argv
    return subprocess.run([sys.executable, "-m", "router.cli", *args], env=env, check=False, capture_output=True,
                          text=True, timeout=120)


def test_cli_ledger_init_generate_export(fresh_db: str, tmp_path: Path) -> None:
    today = datetime.now(UTC).date()
    proc = _nsjms("ledger", "init", "--ahead-days", "1", dsn=fresh_db)
    assert proc.returncode == 0, proc.stderr
    assert f"partitions created: {today}, {today + timedelta(days=1)}; dropped: none" in proc.stdout
    proc = _nsjms("ledger", "generate", "--deliveries", "50", "--start", "2026-03-01T12:00", "--lost", "1",
                  "--to-db", dsn=fresh_db)
    assert proc.returncode == 0, proc.stderr
    assert "generated 99 rows (50 obligations): lost 1" in proc.stdout
    proc = _nsjms("ledger", "export", "--from", "2026-03-01", "--to", "2026-03-02", "--out", str(tmp_path / "x"),
                  dsn=fresh_db)
    assert proc.returncode == 0, proc.stderr
    assert "exported 99 rows into 1 day file(s)" in proc.stdout
    assert pq.read_table(tmp_path / "x" / "day=2026-03-01" / "part-0.parquet").num_rows == 99
    again = _nsjms("ledger", "init", dsn=fresh_db)   # migrations run once: a second init only maintains
    assert again.returncode == 0 and "schema migrations applied: none (up to date)" in again.stdout, again.stderr
    # without --ahead-days, `maintain` takes the node's configuration ([ledger] ahead_days)
    proc = _nsjms("ledger", "maintain", dsn=fresh_db, NSJMS_LEDGER_AHEAD_DAYS="5")
    assert proc.returncode == 0, proc.stderr
    assert f"partitions created: {', '.join(str(today + timedelta(days=n)) for n in range(4, 6))}" in proc.stdout
    assert _nsjms("ledger", "export", "--from", "2026-03-02", "--to", "2026-03-01", "--out", str(tmp_path),
                  dsn=fresh_db).returncode == 2


def test_cli_export_of_an_empty_window_says_so_and_writes_an_empty_day(fresh_db: str, tmp_path: Path) -> None:
    assert _nsjms("ledger", "init", dsn=fresh_db).returncode == 0
    proc = _nsjms("ledger", "export", "--from", "2025-01-01", "--to", "2025-01-03", "--out", str(tmp_path / "x"),
                  dsn=fresh_db)
    assert proc.returncode == 0, proc.stderr
    assert "has no ledger rows: wrote one empty day file" in proc.stdout
    table = pq.read_table(tmp_path / "x" / "day=2025-01-01" / "part-0.parquet")
    assert table.num_rows == 0 and table.schema.remove_metadata().equals(arrow_schema())
