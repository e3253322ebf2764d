#!/bin/bash
# First start: initdb with the given superuser password, TCP clients need it (scram-sha-256), create POSTGRES_DB.
# Every start: run the server as the postgres OS user, listening on all container addresses (publish the port on
# the host's loopback only: -p 127.0.0.1::5432), with max_prepared_transactions set. Extra arguments go to postgres.
set -euo pipefail
BIN=/usr/lib/postgresql/15/bin
PGDATA="${PGDATA:-/var/lib/postgresql/data}"
user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-nsjms}"
as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; }

mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 0700 "$PGDATA"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "nsjms-postgres: POSTGRES_PASSWORD must be set for the first start (it becomes $user's password)" >&2
        exit 2
    fi
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    chown postgres "$pwfile"
    as_pg "$BIN/initdb" -D "$PGDATA" -U "$user" --pwfile="$pwfile" -E UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    printf 'host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
    if [ "$db" != "postgres" ]; then
        as_pg "$BIN/pg_ctl" -D "$PGDATA" -w -o "-c listen_addresses=''" start >/dev/null
        as_pg "$BIN/createdb" -U "$user" -h /var/run/postgresql "$db"
        as_pg "$BIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
    fi
    echo "nsjms-postgres: initialised $PGDATA (superuser $user, database $db)"
fi
unset POSTGRES_PASSWORD
exec setpriv --reuid=postgres --regid=postgres --init-groups -- "$BIN/postgres" -D "$PGDATA" \
    -c listen_addresses='*' -c "max_prepared_transactions=${PG_MAX_PREPARED_TRANSACTIONS:-64}" "$@"
