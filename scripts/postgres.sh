#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for tests and benchmarks, under <repo>/.eo/postgres.
#
#   scripts/postgres.sh start   # idempotent; prints EO_PG_URL=... and EO_PG_STARTED=0|1
#   scripts/postgres.sh stop    # stops only the cluster in our own data folder
#   scripts/postgres.sh status  # exit 0 and print EO_PG_URL when running, else exit 1
#
# Listens on 127.0.0.1 only, TCP only, with trust auth (no password exists, so none can
# leak into a URL or a log). Runs as the `postgres` user when invoked as root (postgres
# refuses to run as root). EO_PG_DIR overrides the state folder.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${EO_PG_DIR:-$ROOT/.eo/postgres}"
DATA="$STATE/data"
LOG="$STATE/postgres.log"
PORT_FILE="$STATE/port"
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
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
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

running() { [ -d "$DATA" ] && as_owner "$BIN/pg_ctl" status -D "$DATA" >/dev/null 2>&1; }

print_url() { echo "EO_PG_URL=postgresql+psycopg://$DB_USER@127.0.0.1:$(cat "$PORT_FILE")/$DB"; }

cmd_start() {
  ensure_installed
  mkdir -p "$STATE"
  if [ "$(id -u)" = 0 ]; then as_owner true; chown postgres "$STATE"; fi
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
  if running; then
    as_owner "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >&2
    log "stopped the cluster in $DATA"
  else
    log "no cluster of ours is running"
  fi
}

cmd_status() {
  BIN="$(find_bin)" || exit 1
  if running; then print_url; else exit 1; fi
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 64 ;;
esac
