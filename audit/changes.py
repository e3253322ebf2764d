"""Which days of the ledger changed since the last incremental audit, without reading the ledger (issue 28).

A statement-level trigger on ``nsjms_ledger`` (:data:`INSTALL_SQL`) appends the UTC day (of ``accepted_at``) of
every row an ``INSERT``, ``UPDATE`` or ``DELETE`` statement on the ledger touched to ``nsjms_ledger_change``: one
row per statement and day, read from the statement's transition tables, in the writer's own transaction (a
routing unit of work or a T2's prepared branch: the marker becomes visible exactly when the rows do, and vanishes
with a rollback). A ``TRUNCATE`` appends ``NULL``: every day. Only appends, so writers never wait for each other on
it.

An incremental run takes the markers with one ``DELETE … RETURNING`` (:func:`take`) in its own transaction. Read
committed: the ``DELETE`` sees (and removes) exactly the markers committed before it; the day's reconciliation,
a later statement of the same transaction, sees at least those rows. A writer committing after the ``DELETE``
leaves its marker for the next run; a run that fails rolls back and leaves every marker. So a late row or a column
filled in after its day was audited (the T2 hop times of the outbox purge: an ``UPDATE``) always makes its day due,
and a run where nothing changed reads no partition of the ledger.

The audit installs the tracking itself (:func:`ensure`), in a short transaction of its own that waits at most
:data:`LOCK_TIMEOUT` for the ledger's lock (``CREATE TRIGGER`` conflicts with writers for a moment), and appends the
``NULL`` marker in the same transaction: rows written before the tracking existed are found by one full pass
(the fingerprint of every day, as before the tracking). Only the ledger's owner (the nodes' role) installs it, and
the trigger function runs with its owner's rights (``SECURITY DEFINER``), so no writer role ever fails a ledger write
on the change table. A ledger never audited incrementally pays nothing; once installed, every ledger statement
appends one marker row per day it touched, which only an incremental run removes (docs/audit.md says how to remove
the tracking). The
triggers are checked on every run (in the catalogue); missing or disabled ones are installed again, with one more
full pass. Not seen: writes with the triggers disabled and enabled again in between
(``ALTER TABLE … DISABLE TRIGGER``, ``session_replication_role = replica``) and writes straight into a partition
(``INSERT INTO nsjms_ledger_pYYYYMMDD``; every writer of nsjms writes the parent; the partition maintenance's move
of stray rows from the default partition writes the partitions, and changes no day's rows). A dropped partition
(retention) is seen in the catalogue.
"""

from __future__ import annotations

import logging
from datetime import date
from typing import Any

import psycopg

__all__ = ["CHANGE_TABLE", "INSTALL_SQL", "LOCK_TIMEOUT", "TRIGGERS", "ensure", "installed", "take"]

log = logging.getLogger(__name__)

CHANGE_TABLE = "nsjms_ledger_change"
LOCK_TIMEOUT = "2s"
TRIGGERS = ("nsjms_ledger_changed_insert", "nsjms_ledger_changed_update", "nsjms_ledger_changed_delete",
            "nsjms_ledger_changed_truncate")
_DAY = "(accepted_at AT TIME ZONE 'UTC')::date"

INSTALL_SQL = (
    f"CREATE TABLE IF NOT EXISTS {CHANGE_TABLE} (day date)",
    # SECURITY DEFINER: the triggers fire in every writer's statements (the nodes' role) and append as the ledger's
    # owner, who installed them (ensure() installs only as that owner) and owns the change table; a writer role
    # without a grant on it never fails a ledger write. search_path fixed at creation (FROM CURRENT).
    f"""CREATE OR REPLACE FUNCTION nsjms_ledger_changed() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {CHANGE_TABLE} (day) SELECT DISTINCT {_DAY} FROM nsjms_new;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO {CHANGE_TABLE} (day) SELECT {_DAY} FROM nsjms_new UNION SELECT {_DAY} FROM nsjms_old;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO {CHANGE_TABLE} (day) SELECT DISTINCT {_DAY} FROM nsjms_old;
    ELSE
        INSERT INTO {CHANGE_TABLE} (day) VALUES (NULL);
    END IF;
    RETURN NULL;
END $$""",
    "REVOKE ALL ON FUNCTION nsjms_ledger_changed() FROM PUBLIC",
    "CREATE OR REPLACE TRIGGER nsjms_ledger_changed_insert AFTER INSERT ON nsjms_ledger "
    "REFERENCING NEW TABLE AS nsjms_new FOR EACH STATEMENT EXECUTE FUNCTION nsjms_ledger_changed()",
    "CREATE OR REPLACE TRIGGER nsjms_ledger_changed_update AFTER UPDATE ON nsjms_ledger "
    "REFERENCING OLD TABLE AS nsjms_old NEW TABLE AS nsjms_new "
    "FOR EACH STATEMENT EXECUTE FUNCTION nsjms_ledger_changed()",
    "CREATE OR REPLACE TRIGGER nsjms_ledger_changed_delete AFTER DELETE ON nsjms_ledger "
    "REFERENCING OLD TABLE AS nsjms_old FOR EACH STATEMENT EXECUTE FUNCTION nsjms_ledger_changed()",
    "CREATE OR REPLACE TRIGGER nsjms_ledger_changed_truncate AFTER TRUNCATE ON nsjms_ledger "
    "FOR EACH STATEMENT EXECUTE FUNCTION nsjms_ledger_changed()",
    f"INSERT INTO {CHANGE_TABLE} (day) VALUES (NULL)",
)


def installed(conn: psycopg.Connection[Any]) -> bool:
    """Whether the change table and the four triggers exist and fire (catalogue only: no lock on the ledger)."""
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL, (SELECT count(*) FROM pg_trigger t WHERE t.tgrelid = to_regclass(%s) "
        "AND t.tgname = ANY(%s) AND t.tgenabled IN ('O', 'A'))", (CHANGE_TABLE, "nsjms_ledger", list(TRIGGERS)),
    ).fetchone()
    return bool(row and row[0] and int(row[1]) == len(TRIGGERS))


def ensure(conn: psycopg.Connection[Any]) -> bool:
    """Install the tracking when it is not (its own committed transaction, at most :data:`LOCK_TIMEOUT` waiting for
    the ledger's lock), with the ``NULL`` marker (one full pass). Returns whether it is in place; False (logged:
    e.g. a lock timeout, a role that does not own the ledger) means this run uses the full pass only."""
    if installed(conn):
        conn.commit()
        return True
    row = conn.execute("SELECT pg_get_userbyid(relowner) = current_user FROM pg_class "
                       "WHERE oid = to_regclass('nsjms_ledger')").fetchone()
    if not (row and row[0]):
        conn.rollback()
        log.warning("audit: the ledger's change tracking is installed only by the ledger's owner (the nodes' role), "
                    "not by this role; this run fingerprints every day")
        return False
    try:
        conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        for statement in INSTALL_SQL:
            conn.execute(statement)
        conn.commit()
        return True
    except psycopg.Error as exc:
        conn.rollback()
        log.warning("audit: the ledger's change tracking could not be installed (%s: %s); this run fingerprints "
                    "every day", type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc) else "")
        return False


def take(conn: psycopg.Connection[Any], lo: date, hi: date, *, whole: bool) -> tuple[set[date], bool]:
    """Remove and return the changed days in ``[lo, hi)``, and whether every day must be checked (a ``NULL`` marker:
    the tracking is new, or the ledger was truncated). ``whole``: the run covers every day, so the ``NULL`` marker
    is taken too; otherwise it stays for the next run over every day (and this run checks its window in full)."""
    rows = conn.execute(f"DELETE FROM {CHANGE_TABLE} WHERE (day >= %s AND day < %s) OR (day IS NULL AND %s) "
                        "RETURNING day", (lo, hi, whole)).fetchall()
    days = {r[0] for r in rows if r[0] is not None}
    full = any(r[0] is None for r in rows)
    if not whole and not full:
        row = conn.execute(f"SELECT EXISTS (SELECT 1 FROM {CHANGE_TABLE} WHERE day IS NULL)").fetchone()
        full = bool(row and row[0])
    return days, full
