#!/usr/bin/env bash
# Bootstrap the machine, then run the whole test suite (extra arguments go to pytest).
#
#   bash scripts/test.sh                      # everything under tests/
#   bash scripts/test.sh tests/unit -x        # a subset
#
# Exit status is pytest's; "no tests collected" (5) is a failure like any other non-zero status.
# Set CI=true to make missing services fail loudly (they fail anyway: fixtures never skip).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/bootstrap.sh || exit $?

has_path=0
for arg in "$@"; do
    case "$arg" in
        -*) ;;
        *) [ -e "${arg%%::*}" ] && has_path=1 ;;
    esac
done
[ "$has_path" -eq 1 ] || set -- tests/ "$@"

# The project's bytecode, compiled once: under PYTHONDONTWRITEBYTECODE (CI's environment sets it) every Python process
# the tests start (each node, each CLI call: hundreds per run) compiled router/ from source again, about a quarter of
# its import time. compileall writes the .pyc files even then, and every later process reads them (__pycache__/ is
# ignored by git; a stale file is recompiled by its source's timestamp as usual).
.venv/bin/python -m compileall -q -j 0 router xa audit >/dev/null || echo "[test] NOTE: compileall failed (the tests still run)" >&2

echo "[test] .venv/bin/python -m pytest -q -ra $*"
.venv/bin/python -m pytest -q -ra "$@"
status=$?
if [ "$status" -eq 5 ]; then
    echo "[test] ERROR: pytest collected no tests" >&2
fi
exit "$status"
