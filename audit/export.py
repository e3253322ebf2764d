"""``nsjms ledger export``: ledger rows → Parquet by day (pyarrow).

Layout: ``OUT/day=YYYY-MM-DD/part-0.parquet``, one file per UTC day of ``accepted_at`` that has rows, each
sorted by ``(accepted_at, entry_id)`` and typed as :func:`audit.synth.arrow_schema`. A window without any row is a
result too: its first day gets a file with no rows (the export's schema), so ``nsjms audit --parquet OUT`` reports
an empty window (0 obligations, exit 0) instead of failing to read an empty directory. A day's file is written
under a temporary name and renamed when complete, so a reader never sees half a day. The rows are streamed
from PostgreSQL with ``COPY … TO STDOUT`` (timestamps as epoch microseconds), never held whole in memory.
"""

from __future__ import annotations

import io
import itertools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.csv as pacsv  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
from psycopg import sql

from audit import LedgerError, UsageError
from audit.ledger import COLUMNS, TABLE, day_bounds
from audit.synth import arrow_schema

__all__ = ["ExportResult", "export_days"]


@dataclass(frozen=True)
class ExportResult:
    files: tuple[Path, ...]
    rows: int


def export_days(dsn: str, start: datetime, end: datetime, out: Path, progress: bool | None = None) -> ExportResult:
    """Export rows with ``start <= accepted_at < end`` (UTC days touched by the window, clipped to it)."""
    if start.tzinfo is None or end.tzinfo is None or end <= start:
        raise UsageError(f"--from/--to: need timezone-aware start < end, got {start} .. {end}")
    from tqdm import tqdm  # type: ignore[import-untyped]

    days = _days(start, end)
    show = sys.stdout.isatty() if progress is None else progress
    files: list[Path] = []
    total = 0
    try:
        with psycopg.connect(dsn) as conn, tqdm(total=len(days), unit="day", disable=not show,
                                                 desc="ledger export") as bar:
            for day in days:
                lo, hi = day_bounds(day)
                written = _export_day(conn, max(lo, start), min(hi, end), out / f"day={day:%Y-%m-%d}")
                if written:
                    files.append(out / f"day={day:%Y-%m-%d}" / "part-0.parquet")
                    total += written
                bar.update(1)
                bar.set_postfix(rows=total)
    except psycopg.Error as exc:
        raise LedgerError("export ledger", f"{type(exc).__name__}: {exc}") from exc
    if not files:          # an empty window: one empty day file, so the directory is an export an audit can read
        files.append(_write_empty(out / f"day={days[0]:%Y-%m-%d}"))
    return ExportResult(tuple(files), total)


def _write_empty(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tmp, path = folder / ".part-0.parquet.tmp", folder / "part-0.parquet"
    pq.write_table(arrow_schema().empty_table(), tmp)
    os.replace(tmp, path)
    return path


def _days(start: datetime, end: datetime) -> list[date]:
    first, last = start.date(), (end - timedelta(microseconds=1)).date()
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


def _copy_statement(lo: datetime, hi: datetime) -> sql.Composed:
    """COPY of one window; timestamps as epoch µs. Bounds are literals: COPY takes no bind parameters."""
    cols = [sql.SQL("(extract(epoch FROM {c}) * 1000000)::bigint AS {c}").format(c=sql.Identifier(c))
            if c.endswith("_at") else sql.Identifier(c) for c in COLUMNS]
    return sql.SQL("COPY (SELECT {} FROM {} WHERE accepted_at >= {} AND accepted_at < {} "
                   "ORDER BY accepted_at, entry_id) TO STDOUT (FORMAT csv)").format(
        sql.SQL(", ").join(cols), sql.Identifier(TABLE), sql.Literal(lo), sql.Literal(hi))


def _export_day(conn: psycopg.Connection[Any], lo: datetime, hi: datetime, folder: Path) -> int:
    schema = arrow_schema()
    raw = pa.schema([pa.field(f.name, pa.int64() if f.name.endswith("_at") else f.type) for f in schema])
    stmt = _copy_statement(lo, hi)
    rows = 0
    tmp = folder / ".part-0.parquet.tmp"
    writer: Any = None
    with conn.cursor() as cur, cur.copy(stmt) as copy:
        chunks = iter(copy)
        first = next(chunks, None)
        if first is None:  # no rows that day (pyarrow refuses an empty CSV stream)
            return 0
        reader = pacsv.open_csv(
            _ChunkStream(itertools.chain([first], chunks)),
            read_options=pacsv.ReadOptions(column_names=raw.names, block_size=8 << 20),
            convert_options=pacsv.ConvertOptions(column_types=raw, strings_can_be_null=True,
                                                 quoted_strings_can_be_null=False))
        for batch in reader:
            if batch.num_rows == 0:
                continue
            if writer is None:
                folder.mkdir(parents=True, exist_ok=True)
                writer = pq.ParquetWriter(tmp, schema)
            table = pa.Table.from_batches([batch])
            writer.write_table(pa.table([table[c].cast(schema.field(c).type) for c in schema.names], schema=schema))
            rows += batch.num_rows
    if writer is not None:
        writer.close()
        os.replace(tmp, folder / "part-0.parquet")
    return rows


class _ChunkStream(io.RawIOBase):
    """A readable binary stream over the byte chunks psycopg's ``Copy`` yields."""

    def __init__(self, chunks: Iterator[Any]) -> None:
        self._chunks, self._buf = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = bytes(next(self._chunks))
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        return n
