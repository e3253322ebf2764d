"""Numbered schema migrations, applied at start and recorded in ``nsjms_schema_version``.

Migrations are the files ``router/db/migrations/NNNN_name.sql`` (``NNNN`` = version, from 1, no gaps). At start
:func:`run` takes a PostgreSQL advisory lock (so concurrent nodes migrate one at a time), reads what the database
has, lets :func:`plan` decide, and applies the missing migrations in order in the caller's transaction, one row
``(version, name, applied_at, checksum)`` each; the caller's commit makes them all visible at once.

:func:`plan` is free of I/O. Its decisions:

* no version table and none of version 1's objects: a fresh database — create the table, apply everything;
* no version table and all of version 1's objects: a database made by nsjms before versioned migrations (it ran
  ``CREATE … IF NOT EXISTS`` at start) — record version 1 as applied without running it, apply the rest;
* no version table and only some of version 1's objects: refuse (:class:`SchemaError`, nothing changed);
* an applied migration whose checksum (SHA-256 of the file) differs from the file's: refuse;
* an applied version this code does not know (the database was migrated by a newer nsjms): refuse;
* otherwise apply the versions not applied yet, in order.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg

from router.db.errors import SchemaError

__all__ = ["ADVISORY_LOCK", "LEGACY_OBJECTS", "VERSION_TABLE", "Migration", "Plan", "load", "plan", "run"]

VERSION_TABLE = "nsjms_schema_version"
ADVISORY_LOCK = 7715000          # pg_advisory_xact_lock key, held for the migrating transaction

# What version 1 creates (tables, sequences, index): all present without a version table = adopt as version 1.
LEGACY_OBJECTS: tuple[str, ...] = (
    "nsjms_channel_id", "nsjms_channel", "nsjms_admin", "nsjms_proxy", "nsjms_event", "nsjms_queue",
    "nsjms_queue_event", "nsjms_filter_id", "nsjms_filter", "nsjms_bridge_id", "nsjms_bridge",
)

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_CREATE_VERSION_TABLE = f"""
CREATE TABLE {VERSION_TABLE} (
    version     integer PRIMARY KEY,
    name        text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    checksum    text        NOT NULL
)"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Plan:
    create_table: bool               # the version table does not exist yet
    adopt: tuple[Migration, ...]     # record as applied without running (a pre-migrations database)
    apply: tuple[Migration, ...]     # run and record, in this order


def load(files: Iterable[tuple[str, str]] | None = None) -> list[Migration]:
    """The migrations, by version; ``files`` = (file name, text) pairs, default the package's ``migrations/``.

    Raises :class:`SchemaError` for a badly named file, a duplicate version or a gap."""
    if files is None:
        root = resources.files("router.db") / "migrations"
        files = [(f.name, f.read_text(encoding="utf-8")) for f in root.iterdir() if f.name.endswith(".sql")]
    found: dict[int, Migration] = {}
    for fname, text in files:
        m = _NAME.match(fname)
        if m is None:
            raise SchemaError(f"migration file {fname!r} is not named NNNN_name.sql")
        version = int(m.group(1))
        if version in found:
            raise SchemaError(f"two migrations have version {version}")
        found[version] = Migration(version, m.group(2), text)
    versions = sorted(found)
    if versions != list(range(1, len(versions) + 1)):
        raise SchemaError(f"migration versions must be 1..N without gaps, found {versions}")
    return [found[v] for v in versions]


def plan(migrations: Sequence[Migration], applied: Mapping[int, str] | None,
         existing: Iterable[str]) -> Plan:
    """Decide what to do (no I/O).

    ``applied``: version → checksum from the version table, None when the table does not exist; ``existing``: the
    names of :data:`LEGACY_OBJECTS` found in the database."""
    if applied is None:
        present = set(existing) & set(LEGACY_OBJECTS)
        if not present:
            return Plan(True, (), tuple(migrations))
        missing = [name for name in LEGACY_OBJECTS if name not in present]
        if missing:
            raise SchemaError(
                f"the database has some of nsjms's objects but no {VERSION_TABLE} table and not all of version 1 "
                f"(missing: {', '.join(missing)}); it was not made by nsjms or is damaged; refusing to start")
        return Plan(True, tuple(migrations[:1]), tuple(migrations[1:]))
    known = {m.version: m for m in migrations}
    unknown = sorted(v for v in applied if v not in known)
    if unknown:
        raise SchemaError(f"the database has schema version(s) {unknown} this nsjms does not know (migrated by a "
                          f"newer version?); refusing to start")
    for version, checksum in sorted(applied.items()):
        m = known[version]
        if checksum != m.checksum:
            raise SchemaError(f"migration {version:04d}_{m.name}.sql differs from the one applied to this database "
                              f"(checksum {m.checksum[:12]}… here, {checksum[:12]}… recorded); a migration must not "
                              f"change once released; refusing to start")
    return Plan(False, (), tuple(m for m in migrations if m.version not in applied))


def run(conn: psycopg.Connection[Any], migrations: Sequence[Migration] | None = None) -> list[int]:
    """Bring the schema up to date in the caller's transaction (under the advisory lock); returns the versions
    run (an adopted version is not run and not returned). Raises :class:`SchemaError` and leaves the database as
    it was when :func:`plan` refuses."""
    todo = load() if migrations is None else list(migrations)
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK,))
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (VERSION_TABLE,)).fetchone()
    applied: dict[int, str] | None = None
    if row is not None and row[0]:
        applied = {int(v): str(c) for v, c in conn.execute(f"SELECT version, checksum FROM {VERSION_TABLE}")}
    existing = [name for (name,) in conn.execute(
        "SELECT name FROM unnest(%s::text[]) AS t(name) WHERE to_regclass(name) IS NOT NULL",
        (list(LEGACY_OBJECTS),))]
    decided = plan(todo, applied, existing)
    if decided.create_table:
        conn.execute(_CREATE_VERSION_TABLE)
    for m in decided.adopt:
        _record(conn, m)
    for m in decided.apply:
        conn.execute(m.sql.encode("utf-8"))
        _record(conn, m)
    return [m.version for m in decided.apply]


def _record(conn: psycopg.Connection[Any], m: Migration) -> None:
    conn.execute(f"INSERT INTO {VERSION_TABLE}(version, name, checksum) VALUES (%s, %s, %s)",
                 (m.version, m.name, m.checksum))
