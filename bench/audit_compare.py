"""Compare two ``nsjms audit`` output directories: every Parquet table row by row and the JSON summary.

Run: ``python bench/audit_compare.py OUT_BEFORE OUT_AFTER`` (two audits of the same ledger with the same
``--as-of``). Tables are compared as sorted lists of rows with their Arrow schema; the summaries as JSON without
``generated_at``. Exit 0 when everything is equal, 1 (and what differs) otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq  # type: ignore[import-untyped]

#: Summary keys that differ between two runs of the same audit by design.
VOLATILE = ("generated_at",)


def _table(path: Path) -> tuple[str, list[tuple[Any, ...]]]:
    table = pq.read_table(path)
    rows = [tuple(r.values()) for r in table.to_pylist()]
    return str(table.schema), sorted(rows, key=repr)


def _summary(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((path / "summary.json").read_text())
    for key in VOLATILE:
        data.pop(key, None)
    return data


def compare(before: Path, after: Path) -> list[str]:
    """What differs between two audit outputs (empty: equal)."""
    diffs = []
    names = sorted({p.name for p in (before / "tables").iterdir()} | {p.name for p in (after / "tables").iterdir()})
    for name in names:
        a, b = before / "tables" / name, after / "tables" / name
        if not (a.is_dir() and b.is_dir()):
            diffs.append(f"{name}: only in {'after' if b.is_dir() else 'before'}")
            continue
        (sa, ra), (sb, rb) = _table(a), _table(b)
        if sa != sb:
            diffs.append(f"{name}: schema differs:\n{sa}\n---\n{sb}")
        if ra != rb:
            extra, missing = set(rb) - set(ra), set(ra) - set(rb)
            diffs.append(f"{name}: {len(ra)} vs {len(rb)} rows; only after {sorted(extra, key=repr)[:5]}; "
                         f"only before {sorted(missing, key=repr)[:5]}")
    sa_, sb_ = _summary(before), _summary(after)
    for key in sorted(set(sa_) | set(sb_)):
        if sa_.get(key) != sb_.get(key):
            diffs.append(f"summary.{key}: {json.dumps(sa_.get(key))[:300]} vs {json.dumps(sb_.get(key))[:300]}")
    return diffs


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    diffs = compare(Path(sys.argv[1]), Path(sys.argv[2]))
    for d in diffs:
        print(d)
    print("equal" if not diffs else f"{len(diffs)} difference(s)")
    return 0 if not diffs else 1


if __name__ == "__main__":
    sys.exit(main())
