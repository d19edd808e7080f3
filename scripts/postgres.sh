#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for tests and benchmarks, under <repo>/.eo/postgres.
#
#   scripts/postgres.sh start   # idempotent; prints EO_PG_URL=..., EO_PG_STARTED=0|1, EO_PG_DIR=...
#   scripts/postgres.sh stop    # stops only the cluster in our own data folder
#   scripts/postgres.sh status  # exit 0 and print EO_PG_URL when running, else exit 1
#
# Listens on 127.0.0.1 only, TCP only, with trust auth (no password exists, so none can
# leak into a URL or a log). Runs as the `postgres` user when invoked as root (postgres
# refuses to run as root). EO_PG_DIR overrides the state folder; EO_PG_CLUSTER=NAME selects
# a separate cluster of the same checkout (folder suffix -NAME).
#
# When run as root and the clone sits where the `postgres` user cannot reach it (inside
# root's home folder, or in a `mktemp -d` folder: mode 700), the default state folder is
# /var/tmp/eo-postgres-<hash of the checkout path> instead (initdb would fail with
# "could not access directory ... Permission denied"). start, stop and status all pick the
# folder the same way, so stop always finds what start started.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DB=eo
DB_USER=eo

log() { echo "postgres.sh: $*" >&2; }

find_bin() {
  local dir
  if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then
    pg_config --bindir; return 0
  fi
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$dir/initdb" ] && { echo "$dir"; return 0; }
  done
  if command -v initdb >/dev/null 2>&1; then dirname "$(readlink -f "$(command -v initdb)")"; return 0; fi
  return 1
}

ensure_installed() {
  if ! BIN="$(find_bin)"; then
    if [ "$(id -u)" != 0 ]; then
      log "no PostgreSQL binaries found and not root: install postgresql (apt-get install -y postgresql)"
      exit 2
    fi
    log "installing postgresql with apt-get"
    apt-get -o DPkg::Lock::Timeout=300 update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq postgresql >&2
    BIN="$(find_bin)" || { log "postgresql installed but initdb not found"; exit 2; }
  fi
}

# run CMD... as the cluster owner
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    id -u postgres >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin postgres
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

free_port() {
  python3 - <<'PY'
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()
PY
}

port_busy() {
  python3 - "$1" <<'PY'
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(0)
finally:
    s.close()
sys.exit(1)
PY
}

# can the cluster owner create and use folder $1 (every parent must be traversable)?
owner_can_reach() {
  local dir="$1"
  [ "$(id -u)" != 0 ] && return 0
  while [ ! -e "$dir" ]; do dir="$(dirname "$dir")"; done
  id -u postgres >/dev/null 2>&1 || return 1  # made by as_owner on start; decide there
  runuser -u postgres -- test -x "$dir"
}

pick_state() {
  # EO_PG_CLUSTER=NAME: a second cluster of the same checkout (tests that stop their server
  # use one of their own), in a sibling folder of whichever default applies.
  local suffix="${EO_PG_CLUSTER:+-$EO_PG_CLUSTER}"
  if [ -n "${EO_PG_DIR:-}" ]; then
    STATE="${EO_PG_DIR%/}$suffix"
  else
    STATE="$ROOT/.eo/postgres$suffix"
    if ! owner_can_reach "$STATE"; then
      STATE="/var/tmp/eo-postgres-$(printf '%s' "$ROOT" | sha256sum | cut -c1-16)$suffix"
    fi
  fi
  DATA="$STATE/data"
  LOG="$STATE/postgres.log"
  PORT_FILE="$STATE/port"
}

running() { [ -d "$DATA" ] && as_owner "$BIN/pg_ctl" status -D "$DATA" >/dev/null 2>&1; }

print_url() {
  echo "EO_PG_URL=postgresql+psycopg://$DB_USER@127.0.0.1:$(cat "$PORT_FILE")/$DB"
  echo "EO_PG_DIR=$STATE"
}

cmd_start() {
  ensure_installed
  if [ "$(id -u)" = 0 ]; then as_owner true; fi  # the postgres user exists from here on
  pick_state
  mkdir -p "$STATE"
  if [ "$(id -u)" = 0 ]; then
    chown postgres "$STATE"
    if ! runuser -u postgres -- test -w "$STATE"; then
      log "the postgres user cannot use $STATE (a parent folder is not traversable by it):"
      log "set EO_PG_DIR to a folder it can reach, e.g. EO_PG_DIR=/var/tmp/eo-postgres"
      exit 5
    fi
  fi
  if running; then
    print_url; echo "EO_PG_STARTED=0"; return 0
  fi
  if [ ! -f "$DATA/PG_VERSION" ]; then
    rm -rf "$DATA"
    log "initdb in $DATA"
    as_owner "$BIN/initdb" -D "$DATA" -U "$DB_USER" --auth=trust --encoding=UTF8 --no-locale >"$STATE/initdb.log" 2>&1 \
      || { cat "$STATE/initdb.log" >&2; exit 3; }
  fi
  local port
  port="$(cat "$PORT_FILE" 2>/dev/null || true)"
  if [ -z "$port" ] || port_busy "$port"; then port="$(free_port)"; fi
  echo "$port" >"$PORT_FILE"
  as_owner "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories= -c max_connections=200" start >&2 \
    || { log "start failed; last log lines:"; tail -n 30 "$LOG" >&2 || true; exit 4; }
  if ! as_owner "$BIN/psql" -h 127.0.0.1 -p "$port" -U "$DB_USER" -d postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname='$DB'" | grep -q 1; then
    as_owner "$BIN/createdb" -h 127.0.0.1 -p "$port" -U "$DB_USER" "$DB"
  fi
  print_url; echo "EO_PG_STARTED=1"
}

cmd_stop() {
  BIN="$(find_bin)" || { log "no PostgreSQL binaries: nothing of ours can be running"; return 0; }
  pick_state
  if running; then
    as_owner "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >&2
    log "stopped the cluster in $DATA"
  else
    log "no cluster of ours is running"
  fi
}

cmd_status() {
  BIN="$(find_bin)" || exit 1
  pick_state
  if running; then print_url; else exit 1; fi
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 64 ;;
esac
