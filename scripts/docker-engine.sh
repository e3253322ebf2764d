#!/usr/bin/env bash
# Make a Docker engine answer, starting one when possible. Exit 0 when an engine answers, 1 (with the reason on
# stderr) when none can be had: not root, packages not installable, or dockerd not coming up (kernel without
# overlay/iptables support, ...). Callers decide what "no engine" means (CI falls back to local processes).
#
#   bash scripts/docker-engine.sh
#
# As root with no engine answering: `apt-get install docker.io debootstrap docker-compose` when dockerd is
# missing, then `dockerd` in the background (log: /var/log/nsjms-dockerd.log), listening on $DOCKER_HOST when it
# names a unix socket (default unix:///var/run/docker.sock). Prints how long that took.
set -uo pipefail

log() { printf '[docker-engine] %s\n' "$*" >&2; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
engine_up() { command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1; }

install_missing() {  # what images.sh and the compose test need; docker.io only when no engine answers
    local need=()
    engine_up || command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
    command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
    command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
    [ "${#need[@]}" -gt 0 ] || return 0
    if [ "$(id -u)" -ne 0 ]; then
        log "missing ${need[*]} and this is not root: cannot install them"
        return 1
    fi
    local t0
    t0="$(now)"
    log "installing ${need[*]}"
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
           DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/tmp/nsjms-docker-apt.log 2>&1; }; then
        log "apt-get install ${need[*]} failed (log: /tmp/nsjms-docker-apt.log)"
        return 1
    fi
    log "packages installed in $(elapsed "$t0") s"
}

if engine_up; then
    log "a Docker engine answers"
    install_missing || log "WARNING: image builds or the compose test may fail for lack of the packages above"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    log "no Docker engine answers and this is not root: cannot start one"
    exit 1
fi
install_missing || exit 1

host="${DOCKER_HOST:-unix:///var/run/docker.sock}"
case "$host" in
    unix://*) ;;
    *) log "DOCKER_HOST=$host is not a unix socket: not starting an engine for it"; exit 1 ;;
esac
t1="$(now)"
log "starting dockerd on $host (log: /var/log/nsjms-dockerd.log)"
setsid nohup dockerd -H "$host" >/var/log/nsjms-dockerd.log 2>&1 </dev/null &
pid=$!
for _ in $(seq 1 120); do
    if engine_up; then
        log "dockerd (pid $pid) answers after $(elapsed "$t1") s"
        exit 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
done
log "dockerd did not come up; last lines of /var/log/nsjms-dockerd.log:"
tail -15 /var/log/nsjms-dockerd.log >&2
kill "$pid" 2>/dev/null
exit 1
