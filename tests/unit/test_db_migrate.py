"""The migration runner's decisions (pure: no database)."""

from __future__ import annotations

import pytest

from router.db.errors import SchemaError, StoreError
from router.db.migrate import LEGACY_OBJECTS, Migration, load, plan

M1 = Migration(1, "initial", "CREATE TABLE a (x int);\n")
M2 = Migration(2, "more", "ALTER TABLE a ADD COLUMN y int;\n")


def test_a_fresh_database_gets_the_version_table_and_every_migration() -> None:
    p = plan([M1, M2], None, [])
    assert p.create_table and p.adopt == () and p.apply == (M1, M2)


def test_a_database_made_before_migrations_is_adopted_as_version_1() -> None:
    p = plan([M1, M2], None, LEGACY_OBJECTS)
    assert p.create_table and p.adopt == (M1,) and p.apply == (M2,)


def test_a_half_made_old_style_database_is_refused_with_what_is_missing() -> None:
    with pytest.raises(SchemaError, match="missing: nsjms_bridge"):
        plan([M1], None, [name for name in LEGACY_OBJECTS if name != "nsjms_bridge"])


def test_an_up_to_date_database_needs_nothing() -> None:
    p = plan([M1, M2], {1: M1.checksum, 2: M2.checksum}, LEGACY_OBJECTS)
    assert not p.create_table and p.adopt == () and p.apply == ()


def test_only_the_missing_versions_are_applied_in_order() -> None:
    p = plan([M1, M2], {1: M1.checksum}, LEGACY_OBJECTS)
    assert not p.create_table and p.apply == (M2,)


def test_a_changed_applied_migration_is_refused() -> None:
    with pytest.raises(SchemaError, match=r"0001_initial\.sql differs"):
        plan([M1, M2], {1: "0" * 64}, LEGACY_OBJECTS)


def test_a_version_this_code_does_not_know_is_refused() -> None:
    with pytest.raises(SchemaError, match=r"\[3\]"):
        plan([M1, M2], {1: M1.checksum, 2: M2.checksum, 3: "x"}, LEGACY_OBJECTS)


def test_schema_errors_are_store_errors() -> None:
    assert issubclass(SchemaError, StoreError)       # the channel's boundary maps it like any refusal


def test_migration_files_must_be_numbered_without_gaps() -> None:
    assert [m.version for m in load([("0002_b.sql", ""), ("0001_a.sql", "")])] == [1, 2]
    with pytest.raises(SchemaError, match="gaps"):
        load([("0001_a.sql", ""), ("0003_c.sql", "")])
    with pytest.raises(SchemaError, match="NNNN_name"):
        load([("1_a.sql", "")])
    with pytest.raises(SchemaError, match="two migrations"):
        load([("0001_a.sql", ""), ("0001_b.sql", "")])


def test_the_shipped_migrations_load_and_start_with_the_initial_schema() -> None:
    shipped = load()
    assert shipped[0].version == 1 and shipped[0].name == "initial"
    assert "IF NOT EXISTS" not in shipped[0].sql
    for name in LEGACY_OBJECTS:
        assert name in shipped[0].sql, f"version 1 creates {name}"
