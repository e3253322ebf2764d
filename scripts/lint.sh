#!/usr/bin/env bash
# Static checks: `ruff check .` over the tree, `mypy --strict` over the packages (router, xa, idl, audit;
# idl/generated excluded) and import-linter's layering contracts (`lint-imports`). All read their settings from
# pyproject.toml ([tool.ruff], [tool.mypy], [tool.importlinter]).
#
#   bash scripts/lint.sh                      # both checks
#   PYTHON=/path/to/python bash scripts/lint.sh
#
# Uses .venv/bin/python when it exists, else $PYTHON, else python3; ruff and mypy come with the `test`
# extra (pip install -e '.[test]'). Exit status: 0 clean, 1 findings, 2 a tool is missing.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if [ -n "${PYTHON:-}" ]; then
    py="$PYTHON"
elif [ -x .venv/bin/python ]; then
    py=.venv/bin/python
else
    py=python3
fi

for tool in ruff mypy importlinter; do
    if ! "$py" -c "import $tool" >/dev/null 2>&1; then
        echo "[lint] ERROR: $tool is not installed for $py (pip install -e '.[test]')" >&2
        exit 2
    fi
done

status=0
echo "[lint] $py -m ruff check ."
"$py" -m ruff check . || status=1
echo "[lint] $py -m mypy --strict router xa idl audit"
"$py" -m mypy --strict router xa idl audit || status=1
echo "[lint] $py -m importlinter.cli (lint-imports: the layering contracts)"
"$py" -c 'from importlinter.cli import lint_imports_command; lint_imports_command()' || status=1
if [ "$status" -ne 0 ]; then
    echo "[lint] FAILED" >&2
fi
exit "$status"
