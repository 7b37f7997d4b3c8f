#!/usr/bin/env bash
# A local PostgreSQL server for the tests (tests/test_postgres.py), on Debian, run as root.
# Installs the `postgresql` package if missing, starts its cluster with Debian's cluster tools
# (they handle the data directory, socket directory and postgres user for us), and creates a
# role and database. Safe to run again: every step checks first. Every wait is bounded.
# Progress goes to stderr; the one line on stdout is the SQLAlchemy URL for the tests.
set -euo pipefail
# Every tool below may chat on stdout (pg_ctlcluster prints "Removed stale pid file." after an
# unclean shutdown), so stdout goes to stderr for the whole script; fd 3 keeps the real stdout
# for the URL alone.
exec 3>&1 1>&2

ROLE=tuner PASSWORD=tuner DB=tune_test CLUSTER=main

log() { echo "postgres.sh: $*" >&2; }
as_postgres() { runuser -u postgres -- "$@"; }

[ "$(id -u)" = 0 ] || { log "must run as root (installs packages, runs as postgres)"; exit 1; }

if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    log "installing postgresql"
    export DEBIAN_FRONTEND=noninteractive
    timeout 600 apt-get update -qq
    timeout 900 apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi

# The newest installed server; its cluster may be missing where the package's post-install
# was told not to create one, so create it here (C.UTF-8: the one locale Debian always has).
VERSION=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
if ! pg_lsclusters -h "$VERSION" "$CLUSTER" >/dev/null 2>&1; then
    log "creating cluster $VERSION/$CLUSTER"
    pg_createcluster --locale C.UTF-8 "$VERSION" "$CLUSTER" >/dev/null
fi
# Only local clients: the tests connect over TCP to 127.0.0.1 (password auth per Debian's
# pg_hba.conf). Takes effect at the next start.
pg_conftool "$VERSION" "$CLUSTER" set listen_addresses localhost

PORT=$(pg_conftool -s "$VERSION" "$CLUSTER" show port)
# Start the server when it is not running, and again if it dies while we wait (after an
# unclean shutdown, a status check can catch the old server's last moments).
for _ in $(seq 60); do
    pg_isready -q -h 127.0.0.1 -p "$PORT" && break
    if ! pg_ctlcluster "$VERSION" "$CLUSTER" status >/dev/null 2>&1; then
        log "starting cluster $VERSION/$CLUSTER"
        # pg_ctl waits for the server itself; the outer timeout covers a hung start anyway.
        # 3>&-: the server must not inherit fd 3, or the caller's $(...) never sees end of file.
        timeout 120 pg_ctlcluster "$VERSION" "$CLUSTER" start -- --timeout=60 3>&- || true
    fi
    sleep 1
done
pg_isready -h 127.0.0.1 -p "$PORT" >&2 || { log "server not ready after 60 s"; exit 1; }

# CREATEDB: each test makes (and drops) a database of its own so runs never collide.
psql_admin() { as_postgres psql -p "$PORT" -X -q -v ON_ERROR_STOP=1 "$@"; }
if [ -z "$(psql_admin -tAc "SELECT 1 FROM pg_roles WHERE rolname = '$ROLE'")" ]; then
    psql_admin -c "CREATE ROLE $ROLE LOGIN CREATEDB"
fi
psql_admin -c "ALTER ROLE $ROLE WITH LOGIN CREATEDB PASSWORD '$PASSWORD'"
if [ -z "$(psql_admin -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'")" ]; then
    psql_admin -c "CREATE DATABASE $DB OWNER $ROLE"
fi

URL="postgresql+psycopg://$ROLE:$PASSWORD@127.0.0.1:$PORT/$DB"
log "ready: $URL"
echo "$URL" >&3
