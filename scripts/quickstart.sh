#!/usr/bin/env bash
# Quick start: install everything (system packages + .venv) and run a node with visible demo traffic.
# The node starts its own PostgreSQL and ActiveMQ under ./.nsjms; Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/nsjms serve --demo "$@"
