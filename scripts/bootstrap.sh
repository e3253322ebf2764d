#!/usr/bin/env bash
# Idempotent machine + virtualenv setup for nsjms (Debian 12).
#
#   bash scripts/bootstrap.sh
#
# 1. apt: omniorb-idl activemq libpostgresql-jdbc-java libjettison-java libxstream-java postgresql-15 libomniorb4-dev libcos4-dev g++ chromium systemd
#    (skipped when `dpkg -s` finds them all), default-jdk-headless only when `javac` is missing,
#    python3.11-venv only when ensurepip is missing. Root runs apt directly, others through sudo.
#    postgresql-15 is installed without creating Debian's "main" cluster: nsjms starts its own.
#    chromium: the audit report's browser test (headless screenshot).
# 2. .venv with python3.11 and `pip install -e '.[test,audit]'` (audit: pyspark, pyarrow, matplotlib, tqdm; about
#    80 s more on a fresh venv, pyspark builds its wheel from a 456 MB sdist), redone only when pyproject.toml
#    changed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

APT_PACKAGES=(omniorb-idl activemq libpostgresql-jdbc-java libjettison-java libxstream-java postgresql-15 libomniorb4-dev libcos4-dev g++ chromium systemd)
PYTHON="${PYTHON:-python3.11}"
VENV="$ROOT/.venv"
STAMP="$VENV/.nsjms-bootstrap"

log() { printf '[bootstrap] %s\n' "$*"; }
die() { printf '[bootstrap] ERROR: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root (or sudo) to run: $*"
    fi
}

missing_packages() {
    local pkg
    for pkg in "${APT_PACKAGES[@]}"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || printf '%s\n' "$pkg"
    done
    command -v javac >/dev/null 2>&1 || printf '%s\n' default-jdk-headless
    if command -v "$PYTHON" >/dev/null 2>&1; then
        "$PYTHON" -c 'import ensurepip' >/dev/null 2>&1 || printf '%s\n' python3.11-venv
    else
        printf '%s\n' python3.11 python3.11-venv
    fi
}

no_main_cluster() {
    # postgresql-common reads createcluster.d: do not create/start a system cluster on port 5432.
    as_root mkdir -p /etc/postgresql-common/createcluster.d
    printf 'create_main_cluster = false\n' | as_root tee /etc/postgresql-common/createcluster.d/nsjms.conf >/dev/null
}

install_packages() {
    local missing
    mapfile -t missing < <(missing_packages)
    if [ "${#missing[@]}" -eq 0 ]; then
        log "system packages: all present"
        return
    fi
    log "system packages: installing ${missing[*]}"
    case " ${missing[*]} " in *" postgresql-15 "*) no_main_cluster ;; esac
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
        >/dev/null
    log "system packages: done"
}

setup_venv() {
    command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found"
    if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys; assert sys.version_info[:2] == (3, 11)'; then
        log "virtualenv: creating $VENV with $PYTHON"
        "$PYTHON" -m venv "$VENV"
        rm -f "$STAMP"
    fi
    local want
    want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
    if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
        log "virtualenv: up to date"
        return
    fi
    log "virtualenv: pip install -e '.[test,audit]'"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test,audit]'
    printf '%s\n' "$want" >"$STAMP"
    log "virtualenv: done"
}

install_packages
setup_venv
log "ready"
