"""``nsjms audit --incremental`` on a real PostgreSQL (issue 28): only new or changed days are reconciled, a late
row and a column filled in after its day was audited are both picked up, an obligation crossing midnight is carried
(no false loss, and a loss once its grace has passed with no row written), per-node figures from the gtrid, the
metrics textfile, the empty window. No Spark: the incremental audit runs in PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from audit.changes import installed
from audit.cli import EXIT_OK, EXIT_VIOLATION, main
from audit.incremental import DAY_TABLE, FINGERPRINT_SQL, IncrementalResult, run_incremental
from audit.ledger import TABLE, ensure_partitions, install_schema, partition_name

pytestmark = pytest.mark.integration

D1, D2, D3 = date(2026, 3, 1), date(2026, 3, 2), date(2026, 3, 3)
GRACE = timedelta(seconds=300)


def at(day: date, hh: int, mm: int = 0, ss: int = 0) -> datetime:
    return datetime(day.year, day.month, day.day, hh, mm, ss, tzinfo=UTC)


def row(conn: psycopg.Connection[Any], dedupe: str, accepted: datetime, outcome: str, *, bridge: int | None = 7,
        gtrid: str | None = None, decided: datetime | None = None, prepared: datetime | None = None) -> None:
    conn.execute(f"INSERT INTO {TABLE} (dedupe_id, channel_id, bridge_id, direction, gtrid, accepted_at, "
                 "prepared_at, decided_at, outcome) VALUES (%s, 1, %s, 'channel_to_jms', %s, %s, %s, %s, %s)",
                 (dedupe, bridge, gtrid, accepted, prepared, decided, outcome))


def obligation(conn: psycopg.Connection[Any], dedupe: str, accepted: datetime, *, delivered: bool = True,
               gtrid: str | None = "n1:0001") -> None:
    row(conn, dedupe, accepted, "accepted")
    if delivered:
        row(conn, dedupe, accepted, "delivered", gtrid=gtrid)


@pytest.fixture
def ledger_db(fresh_db: str) -> str:
    with psycopg.connect(fresh_db) as conn:
        install_schema(conn)
        ensure_partitions(conn, D1, 3)
    return fresh_db


def run(dsn: str, as_of: datetime, **kw: Any) -> IncrementalResult:
    return run_incremental(dsn, as_of=as_of, grace=GRACE, **kw)


def day(result: IncrementalResult, d: date) -> Any:
    return next(x for x in result.days if x.day == d)


def test_three_days_late_row_filled_in_column_and_midnight(ledger_db: str) -> None:
    with psycopg.connect(ledger_db) as conn:
        obligation(conn, "a", at(D1, 10))
        obligation(conn, "b", at(D1, 23, 59, 58), delivered=False)    # accepted just before midnight
    # just after midnight: b is within its grace -> open, not lost
    r1 = run(ledger_db, at(D2, 0, 0, 30))
    assert [(d.day, d.verdict, d.audited) for d in r1.days] == [(D1, "open", True)]
    assert day(r1, D1).count("in_flight") == 1 and r1.count("lost") == 0
    assert day(r1, D1).recheck_at == at(D1, 23, 59, 58) + GRACE

    with psycopg.connect(ledger_db) as conn:
        row(conn, "b", at(D1, 23, 59, 58), "delivered", gtrid="n2:0002")  # b's delivery: a late row of day 1
        obligation(conn, "c", at(D2, 9))
    r2 = run(ledger_db, at(D2, 0, 3))
    assert [(d.day, d.verdict, d.audited) for d in r2.days] == [(D1, "pass", True), (D2, "pass", True)]
    assert r2.count("delivered") == 3 and r2.count("lost") == 0   # no loss at the midnight

    with psycopg.connect(ledger_db) as conn:
        obligation(conn, "e", at(D3, 9), gtrid="n2:0003")
        obligation(conn, "f", at(D3, 8), delivered=False)             # never delivered
    r3 = run(ledger_db, at(D3, 12))
    assert [(d.day, d.verdict, d.audited) for d in r3.days] == [
        (D1, "pass", False), (D2, "pass", False), (D3, "fail", True)]
    lost = [g for g in day(r3, D3).groups if g.status == "lost"]
    assert [(g.ids, g.node, g.bridge_id) for g in lost] == [(("f",), "-", 7)]
    nodes: dict[tuple[str, str], int] = {}
    for g in (g for d in r3.days for g in d.groups):
        nodes[(g.node, g.status)] = nodes.get((g.node, g.status), 0) + g.obligations
    assert nodes == {("n1", "delivered"): 2, ("n2", "delivered"): 2, ("-", "lost"): 1}

    # the T2 hop times filled in after day 3 was audited (as the outbox purge does): day 3 again, only day 3
    with psycopg.connect(ledger_db) as conn:
        conn.execute(f"UPDATE {TABLE} SET decided_at = %s WHERE dedupe_id = 'e' AND outcome = 'delivered'",
                     (at(D3, 9, 0, 1),))
        stamp = conn.execute(f"SELECT audited_at FROM {DAY_TABLE} WHERE day = %s", (D3,)).fetchone()
    r4 = run(ledger_db, at(D3, 12, 5))
    assert [d.day for d in r4.audited] == [D3]
    with psycopg.connect(ledger_db) as conn:
        stored = conn.execute(f"SELECT audited_at, verdict, as_of FROM {DAY_TABLE} WHERE day = %s", (D3,)).fetchone()
    assert stamp is not None and stored is not None
    assert stored[0] > stamp[0] and stored[1:] == ("fail", at(D3, 12, 5))
    # nothing changed: nothing reconciled, the stored verdicts kept
    r5 = run(ledger_db, at(D3, 12, 6))
    assert r5.audited == () and [d.verdict for d in r5.days] == ["pass", "pass", "fail"]
    assert r5.count("lost") == 1 and r5.count("delivered") == 4


def test_an_open_obligation_turns_lost_after_its_grace_with_no_row_written(ledger_db: str) -> None:
    with psycopg.connect(ledger_db) as conn:
        obligation(conn, "m", at(D1, 23, 59, 59), delivered=False)
    assert day(run(ledger_db, at(D2, 0, 1)), D1).verdict == "open"
    assert run(ledger_db, at(D2, 0, 2)).audited == ()                 # before its recheck time: kept
    late = run(ledger_db, at(D2, 0, 5))                               # grace passed, nothing written: lost
    assert [(d.day, d.verdict, d.audited) for d in late.days] == [(D1, "fail", True)]
    assert late.count("lost") == 1


def test_in_doubt_resolved_on_another_day_and_a_duplicate(ledger_db: str) -> None:
    with psycopg.connect(ledger_db) as conn:
        row(conn, "x", at(D1, 12), "accepted")
        row(conn, "x", at(D1, 12), "in_doubt", gtrid="n1:00aa", prepared=at(D1, 12, 0, 1))
        row(conn, "y", at(D2, 12), "accepted")                       # the same transaction resolves on day 2
        row(conn, "y", at(D2, 12), "in_doubt", gtrid="n1:00aa", prepared=at(D2, 12, 0, 1))
        obligation(conn, "z", at(D2, 13))
        row(conn, "z", at(D2, 13), "delivered", gtrid="n1:00bb")      # delivered twice
    r1 = run(ledger_db, at(D2, 12, 1))
    assert (r1.count("in_doubt"), r1.count("duplicated")) == (2, 1)
    assert day(r1, D1).verdict == "open" and day(r1, D2).verdict == "fail"
    with psycopg.connect(ledger_db) as conn:
        row(conn, "y", at(D2, 12), "delivered", gtrid="n1:00aa")
    # day 1 has no new row but its doubt is resolved by day 2's: re-checked by its recheck time (prepared + grace)
    r2 = run(ledger_db, at(D2, 12, 10))
    assert [d.day for d in r2.audited] == [D1, D2]
    assert r2.count("in_doubt") == 0 and day(r2, D1).count("lost") == 1   # x's transaction resolved without x


def test_cli_writes_metrics_atomically_and_exits_on_a_violation(ledger_db: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with psycopg.connect(ledger_db) as conn:
        obligation(conn, "a", at(D1, 10))
        obligation(conn, "f", at(D1, 8), delivered=False)
        row(conn, "c", at(D1, 11, 59), "accepted", bridge=9)
    metrics = tmp_path / "nsjms_audit.prom"
    code = main(["audit", "--incremental", "--pg-dsn", ledger_db, "--as-of", "2026-03-01T12:00:00",
                 "--metrics-file", str(metrics), "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == EXIT_VIOLATION and "per bridge:" in out
    text = metrics.read_text()
    assert 'nsjms_audit_lost_obligations{direction="channel_to_jms",bridge="7",node="-"} 1' in text
    assert 'nsjms_audit_in_flight_obligations{direction="channel_to_jms",bridge="9",node="-"} 1' in text
    assert 'nsjms_audit_oldest_open_seconds{direction="channel_to_jms",bridge="9",node="-"} 60.000' in text
    assert 'nsjms_audit_days{verdict="fail"} 1' in text
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []   # no temporary file left
    assert ledger_db not in out
    assert main(["audit", "--incremental", "--pg-dsn", ledger_db, "--as-of", "2026-03-01T12:00:00",
                 "--max-lost", "1"]) == EXIT_OK


def test_empty_window_is_a_clear_result(ledger_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    metrics = tmp_path / "m.prom"
    code = main(["audit", "--incremental", "--pg-dsn", ledger_db, "--from", "2026-03-01", "--to", "2026-03-02",
                 "--metrics-file", str(metrics)])
    assert code == EXIT_OK
    assert "the window has no ledger rows: 0 obligations" in capsys.readouterr().out
    text = metrics.read_text()
    assert "nsjms_audit_days_reconciled 0" in text and 'nsjms_audit_days{verdict="fail"} 0' in text


def test_stored_verdicts_are_read_back_newest_first(ledger_db: str) -> None:
    """What the console's ledger audit page shows: the verdicts the last run stored, read back (read only)."""
    from audit.incremental import stored_verdicts

    with psycopg.connect(ledger_db) as conn:
        obligation(conn, "a", at(D1, 10))
        obligation(conn, "f", at(D2, 8), delivered=False)                  # never delivered: lost
    ran = run(ledger_db, at(D3, 12))
    stored = stored_verdicts(ledger_db)
    assert [(s.result.day, s.result.verdict, s.result.rows, s.as_of, s.grace_s, s.result.audited)
            for s in stored] == [(D2, "fail", 1, at(D3, 12), 300.0, False), (D1, "pass", 2, at(D3, 12), 300.0, False)]
    assert stored[0].result.groups == day(ran, D2).groups and stored[0].result.count("lost") == 1
    assert [s.result.day for s in stored_verdicts(ledger_db, limit=1)] == [D2]


def test_per_node_figures_come_from_the_node_column_and_a_handover_is_counted(ledger_db: str) -> None:
    """Rows carry the node that wrote them (node_id, migration 0009): an obligation is its accepted row's node; one
    accepted by n2 and delivered by n1 is n2's and counted as multi-node; rows from before the column (NULL) still
    fall back to the gtrid's node."""
    def r(dedupe: str, outcome: str, node: str | None, gtrid: str | None = None) -> None:
        with psycopg.connect(ledger_db) as conn:
            conn.execute(f"INSERT INTO {TABLE} (dedupe_id, channel_id, bridge_id, direction, gtrid, accepted_at, "
                         "outcome, node_id) VALUES (%s, 1, 7, 'channel_to_jms', %s, %s, %s, %s)",
                         (dedupe, gtrid, at(D1, 10), outcome, node))

    r("same", "accepted", "n1")
    r("same", "delivered", "n1", "n1:1")
    r("moved", "accepted", "n2")
    r("moved", "delivered", "n1", "n1:2")
    r("old", "accepted", None)
    r("old", "delivered", None, "n3:3")
    r("gone", "accepted", "n2")
    result = run(ledger_db, at(D1, 12))
    groups = day(result, D1).groups
    got = {(g.node, g.status): (g.obligations, g.multi_node) for g in groups}
    assert got == {("n1", "delivered"): (1, 0), ("n2", "delivered"): (1, 1), ("n3", "delivered"): (1, 0),
                   ("n2", "lost"): (1, 0)}
    with psycopg.connect(ledger_db) as conn:   # stored and read back with the figures
        stored = conn.execute(f"SELECT figures FROM {DAY_TABLE} WHERE day = %s", (D1,)).fetchone()
    assert stored is not None and {(g["node"], g["multi_node"]) for g in stored[0]["groups"]} >= {("n2", 1)}


def test_a_window_is_whole_days_and_never_drops_a_day_outside_it(ledger_db: str) -> None:
    """The incremental audit works by UTC day: ``--to`` at midnight must not take the day starting there for a day
    whose rows are gone (its stored verdict was deleted), and ``--from``/``--to`` inside a day reconcile that whole
    day (its rows and fingerprint, so a later run over every day finds it unchanged)."""
    with psycopg.connect(ledger_db) as conn:
        obligation(conn, "a", at(D1, 10))
        obligation(conn, "b", at(D2, 6))
        obligation(conn, "c", at(D2, 18))
    full = run(ledger_db, at(D3, 12))
    assert [(d.day, d.rows) for d in full.days] == [(D1, 2), (D2, 4)]
    to_midnight = run(ledger_db, at(D3, 12), end=at(D2, 0))
    assert [d.day for d in to_midnight.days] == [D1]
    with psycopg.connect(ledger_db) as conn:
        kept = [r[0] for r in conn.execute(f"SELECT day FROM {DAY_TABLE} ORDER BY day").fetchall()]
    assert kept == [D1, D2], "the day after the window keeps its stored verdict"
    inside = run(ledger_db, at(D3, 12), start=at(D2, 12), end=at(D2, 13))
    assert [(d.day, d.rows, d.count("delivered"), d.audited) for d in inside.days] == [(D2, 4, 2, False)]
    again = run(ledger_db, at(D3, 12))
    assert again.audited == (), "nothing changed: no day reconciled again"


# --------------------------------------------------------------- what a run reads (the change markers, issue 28)
@contextmanager
def locked(dsn: str, *tables: str) -> Iterator[None]:
    """Another session holds ACCESS EXCLUSIVE locks on ``tables`` (the ledger, or some of its partitions): a query
    of the audit that reads one of them waits for it, and fails after the audit session's ``lock_timeout``."""
    with psycopg.connect(dsn) as other:
        for t in tables:
            other.execute(f"LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE")
        yield
        other.rollback()


def impatient(dsn: str) -> str:
    """The DSN with ``lock_timeout`` set: a read of a locked table fails (LedgerError) instead of waiting."""
    return make_conninfo(dsn, options="-c lock_timeout=3000")


def test_a_run_with_nothing_changed_reads_no_ledger_partition(ledger_db: str) -> None:
    with psycopg.connect(ledger_db) as conn:
        obligation(conn, "a", at(D1, 10))
        obligation(conn, "b", at(D2, 10))
        obligation(conn, "c", at(D3, 10), delivered=False)
    first = run(ledger_db, at(D3, 12))
    assert [(d.day, d.verdict, d.audited) for d in first.days] == [
        (D1, "pass", True), (D2, "pass", True), (D3, "fail", True)]
    with locked(ledger_db, TABLE):            # the whole ledger, every partition
        again = run(impatient(ledger_db), at(D3, 12, 1))
    assert again.audited == ()
    assert [(d.day, d.verdict, d.rows) for d in again.days] == [(D1, "pass", 2), (D2, "pass", 2), (D3, "fail", 1)]
    assert again.count("lost") == 1 and again.count("delivered") == 2


def test_a_late_row_and_a_filled_in_column_make_only_their_day_read(ledger_db: str) -> None:
    with psycopg.connect(ledger_db) as conn:
        obligation(conn, "a", at(D1, 10))
        obligation(conn, "b", at(D2, 10), delivered=False)
        obligation(conn, "c", at(D3, 10), gtrid="n1:0003")
    run(ledger_db, at(D2, 10, 1))             # b in flight: day 2 open until 10:05
    with psycopg.connect(ledger_db) as conn:
        row(conn, "b", at(D2, 10), "delivered", gtrid="n1:0002")      # b's late delivery
    with locked(ledger_db, partition_name(D1), partition_name(D3)):
        late = run(impatient(ledger_db), at(D2, 10, 2))
    assert [(d.day, d.verdict) for d in late.audited] == [(D2, "pass")]
    assert late.count("in_flight") == 0 and late.count("delivered") == 3

    with psycopg.connect(ledger_db) as conn:  # the outbox purge fills a T2 hop in after day 3 was audited
        conn.execute(f"UPDATE {TABLE} SET decided_at = %s WHERE dedupe_id = 'c' AND outcome = 'delivered'",
                     (at(D3, 10, 0, 1),))
    with locked(ledger_db, partition_name(D1), partition_name(D2)):
        filled = run(impatient(ledger_db), at(D3, 12))
    assert [d.day for d in filled.audited] == [D3]
    with psycopg.connect(ledger_db) as conn:
        stored = conn.execute(f"SELECT fingerprint FROM {DAY_TABLE} WHERE day = %s", (D3,)).fetchone()
        full = conn.execute(FINGERPRINT_SQL, {"lo": at(D3, 0), "hi": at(D3, 0) + timedelta(days=1)}).fetchone()
    assert stored is not None and full is not None
    assert stored[0] == "|".join("" if v is None else str(v) for v in full[1:]), "the stored fingerprint is current"

    # a retention drop is seen in the catalogue: the day's verdict goes, nothing is read
    with psycopg.connect(ledger_db) as conn:
        conn.execute(f"DROP TABLE {partition_name(D1)}")
    with locked(ledger_db, partition_name(D2), partition_name(D3)):
        dropped = run(impatient(ledger_db), at(D3, 12, 1))
    assert [d.day for d in dropped.days] == [D2, D3] and dropped.audited == ()


def test_rows_written_while_the_tracking_was_off_are_found_by_one_full_pass(ledger_db: str) -> None:
    with psycopg.connect(ledger_db) as conn:
        obligation(conn, "a", at(D1, 10))
    run(ledger_db, at(D1, 12))
    assert changes_installed(ledger_db)
    with psycopg.connect(ledger_db) as conn:
        conn.execute(f"DROP TRIGGER nsjms_ledger_changed_insert ON {TABLE}")
        obligation(conn, "late", at(D1, 9), delivered=False)          # no marker written
    r = run(ledger_db, at(D1, 12, 1))           # triggers missing: installed again, every day fingerprinted
    assert [d.day for d in r.audited] == [D1] and r.count("lost") == 1
    assert changes_installed(ledger_db)
    with psycopg.connect(ledger_db) as conn:    # a truncate marks every day
        conn.execute(f"TRUNCATE {TABLE}")
    assert run(ledger_db, at(D1, 12, 2)).days == ()


def changes_installed(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        return installed(conn)


def test_a_late_row_of_a_prepared_branch_is_found_once_it_commits(ledger_db: str) -> None:
    """A T2 writes its rows in a prepared branch: its marker is invisible until COMMIT PREPARED, like its rows, so a
    run in between keeps the day's verdict and the next one after the commit reconciles the day."""
    with psycopg.connect(ledger_db) as conn:
        obligation(conn, "p", at(D1, 10), delivered=False)
    assert run(ledger_db, at(D1, 10, 1)).count("in_flight") == 1
    with psycopg.connect(ledger_db, autocommit=True) as branch:
        branch.execute("BEGIN")
        row(branch, "p", at(D1, 10), "delivered", gtrid="n1:00p1")
        branch.execute("PREPARE TRANSACTION 'audit-test-p1'")
        try:
            between = run(ledger_db, at(D1, 10, 2))
            assert between.audited == () and between.count("in_flight") == 1
        finally:
            branch.execute("COMMIT PREPARED 'audit-test-p1'")
    after = run(ledger_db, at(D1, 10, 3))
    assert [d.day for d in after.audited] == [D1] and after.count("delivered") == 1 and after.count("in_flight") == 0


def test_a_writer_role_without_a_grant_on_the_markers_still_writes_and_only_the_owner_installs(ledger_db: str) -> None:
    """Review of issue 28's merge: the trigger function ran with the writer's rights, so a node role without a grant
    on ``nsjms_ledger_change`` (the audit run as another role installed it) failed every ledger write: an outage.
    It runs with its owner's rights now, and only the ledger's owner installs it."""
    from audit.changes import ensure

    writer = f"nsjms_writer_{datetime.now(UTC):%H%M%S%f}"
    with psycopg.connect(ledger_db, autocommit=True) as su:
        su.execute(f'CREATE ROLE "{writer}"')
        su.execute(f'GRANT SELECT, INSERT ON {TABLE} TO "{writer}"')
    try:
        run(ledger_db, at(D1, 12))                           # the ledger's owner installs the tracking
        assert changes_installed(ledger_db)
        with psycopg.connect(ledger_db) as conn:
            conn.execute(f'SET ROLE "{writer}"')
            obligation(conn, "by-the-writer", at(D1, 11), delivered=False)   # the trigger appends as the owner
        r = run(ledger_db, at(D1, 12, 1))
        assert [d.day for d in r.audited] == [D1] and r.count("lost") == 1, "its marker made the day due"
        with psycopg.connect(ledger_db) as conn:            # a role that does not own the ledger installs nothing
            for name in ("insert", "update", "delete", "truncate"):
                conn.execute(f"DROP TRIGGER nsjms_ledger_changed_{name} ON {TABLE}")
            conn.commit()
            conn.execute(f'SET ROLE "{writer}"')
            assert ensure(conn) is False
        assert not changes_installed(ledger_db)
    finally:
        with psycopg.connect(ledger_db, autocommit=True) as su:
            su.execute(f'DROP OWNED BY "{writer}"')
            su.execute(f'DROP ROLE "{writer}"')
