#!/usr/bin/env bash
# Start a throwaway PostgreSQL server on loopback for the tests that need a real database, and
# print the line that points them at it:  eval "$(.ci/postgres.sh)"
# Needs Debian's postgresql package (installed by .ci/run). The data dir lives under /tmp.
# Stop it again with:  .ci/postgres.sh stop "$NAS_TEST_POSTGRES_DATA"   (.ci/run does, on exit)
set -euo pipefail
port=${NAS_PG_PORT:-55432}
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
as_pg() { if [ "$(id -u)" -eq 0 ]; then su postgres -s /bin/sh -c "$*"; else sh -c "$*"; fi; }
if [ "${1:-}" = stop ]; then
  as_pg "$bin/pg_ctl -D $2 -m fast stop >/dev/null 2>&1" || true
  rm -rf "$2"
  exit 0
fi
data=$(mktemp -d /tmp/nas-pg.XXXXXX)
[ "$(id -u)" -eq 0 ] && chown postgres "$data"
as_pg "$bin/initdb -D $data -A trust -U postgres >/dev/null"
as_pg "$bin/pg_ctl -D $data -l $data/server.log -w -o '-c listen_addresses=127.0.0.1 -p $port -k $data' start >/dev/null"
as_pg "$bin/createdb -h 127.0.0.1 -p $port -U postgres nas_test"
echo "export NAS_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:$port/nas_test NAS_TEST_POSTGRES_DATA=$data"
