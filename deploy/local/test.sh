#!/usr/bin/env bash
# Runs every check and test against the real local stack, installing and starting it if needed.
# `.ci/run` calls exactly this. One `[test]` line per phase; cargo shows its own progress on a terminal.
set -euo pipefail
ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd -P)"
cd "$ROOT"
started=$SECONDS

# The run's record, for deploy/local/readme-figures.sh: each phase line, cargo's `test result:` lines, then
# how it ended, the date, the commit, the user and the disk use. Best effort: when the record cannot be
# written the run and its output are the same, and its exit status never depends on it.
LOCAL_DIR="${COMPANION_LOCAL_DIR:-$ROOT/.local}"
LOGS="$LOCAL_DIR/logs"
# Tools' caches into .local/cache (deploy/local/caches.sh).
source "$ROOT/deploy/local/caches.sh"
record=""
{ mkdir -p -- "$LOGS" && record="$(mktemp "$LOGS/.last-test-run.XXXXXX")"; } 2>/dev/null || record=""
note() { [[ -z "$record" ]] || { printf '%s\n' "$@" >>"$record"; } 2>/dev/null || true; }
finish_record() {
  local rc=$?
  set +e
  stop_ticker
  last_line "$rc"
  [[ -n "$record" ]] || return 0
  local size
  {
    printf 'exit: %s\n' "$rc"
    printf 'seconds: %s\n' "$((SECONDS - started))"
    printf 'date: %s\n' "$(date -u '+%Y-%m-%d %H:%M UTC')"
    printf 'commit: %s\n' "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
      printf 'worktree: modified\n'
    else
      printf 'worktree: clean\n'
    fi
    printf 'user: %s\n' "$(id -un 2>/dev/null || id -u)"
    if [[ "$(id -u)" -eq 0 ]]; then printf 'root: yes\n'; else printf 'root: no\n'; fi
    size="$(du -sh -- "$LOCAL_DIR" 2>/dev/null | cut -f1)"
    printf 'disk-local: %s\n' "${size:-unknown}"
    size="$(du -sh -- "${CARGO_TARGET_DIR:-$ROOT/target}" 2>/dev/null | cut -f1)"
    printf 'disk-target: %s\n' "${size:-unknown}"
  } >>"$record" 2>/dev/null && mv -f -- "$record" "$LOGS/last-test-run.txt" 2>/dev/null
  rm -f -- "$record" 2>/dev/null
  return 0
}
note "# deploy/local/test.sh's last run; deploy/local/readme-figures.sh copies its figures into README.md."
trap finish_record EXIT

# The run's last line, however it ends: the exit status, the seconds, the phase it stopped in (when it
# did not get to the end), the test counts by kind of test binary (deploy/local/test-counts.awk, read
# from the record) and, last, the plain `N passed, N failed`.
current=""
last_line() {
  local rc="$1" counts kinds total where=""
  [[ "$current" == "done" ]] || where=", stopped in: ${current:-the prerequisites}"
  if [[ -n "$record" ]] && counts="$(awk -f "$ROOT/deploy/local/test-counts.awk" -- "$record" 2>/dev/null)"; then
    kinds="$(sed -n 1p <<<"$counts")"
    total="$(sed -n 2p <<<"$counts")"
    # N passed, N failed, N ignored: the ignored ones are in their kind's count.
    total="${total%, * ignored}"
    [[ -n "$kinds" ]] || kinds="no test ran"
  else
    kinds="the counts are unknown (no record in $LOGS)"
    total="? passed, ? failed"
  fi
  printf '[test] done, exit %s (%ds)%s: %s; in all: %s\n' "$rc" "$((SECONDS - started))" "$where" "$kinds" "$total"
}

# Not on a terminal (CI, a pipe), a line every 30 s says which phase is still running, so a long build is
# not taken for a hang.
ticker=""
stop_ticker() { [[ -z "$ticker" ]] || kill "$ticker" 2>/dev/null || true; ticker=""; }
phase() {
  local line
  current="$*"
  printf -v line '[test] %s (%ds)' "$*" "$((SECONDS - started))"
  printf '%s\n' "$line"
  note "$line"
  stop_ticker
  if [[ ! -t 1 ]]; then
    local what="$*"
    # A subshell's SECONDS counts from this script's start, like `phase`'s.
    (while sleep 30; do printf '[test] … still: %s (%ds)\n' "$what" "$((SECONDS - started))"; done) &
    ticker=$!
  fi
}
# cargo test with the output it always had; its `test result:` lines, each after the `Running` line naming
# its test binary, also go to the record. stdout and stderr go through one pipe, so that each `Running`
# line (stderr) comes before its binary's result (stdout). On a terminal cargo is told to keep its colours
# and its progress bar although it writes to a pipe (CARGO_TERM_COLOR, CARGO_TERM_PROGRESS_*); the tests
# print their results without colour. The record keeps the lines without colours or progress bar.
cargo_test() {
  local out rc
  if [[ -z "$record" ]] || ! out="$(mktemp "$LOGS/.cargo-test.XXXXXX" 2>/dev/null)"; then
    "$@" 2>&1
    return
  fi
  if [[ -t 1 ]]; then
    CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-always}" CARGO_TERM_PROGRESS_WHEN="${CARGO_TERM_PROGRESS_WHEN:-always}" \
      CARGO_TERM_PROGRESS_WIDTH="${CARGO_TERM_PROGRESS_WIDTH:-$(tput cols 2>/dev/null || echo 80)}" \
      "$@" 2>&1 | tee -a -- "$out" 2>/dev/null
  else
    "$@" 2>&1 | tee -a -- "$out" 2>/dev/null
  fi
  rc=${PIPESTATUS[0]}
  { sed -e 's/\x1b\[[0-9;]*[A-Za-z]//g' -e 's/\r*$//' -e 's/.*\r//' -- "$out" \
      | grep -aE '^ +Running |test result:' >>"$record"; } 2>/dev/null || true
  rm -f -- "$out" 2>/dev/null || true
  return "$rc"
}
# cargo's progress bar on a terminal; quiet in logs (CI), where the phase lines say what runs.
quiet=(--quiet)
if [[ -t 2 ]]; then quiet=(); fi

# A clean build gains nothing from incremental compilation and its cache is ~2 GB of the ~6 GB a run
# writes; a caller who wants it sets CARGO_INCREMENTAL=1.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

deploy/local/prereqs.sh test
phase "local stack: NATS, PostgreSQL, the MongoDB-wire server (deploy/local/stack.sh up)"
deploy/local/stack.sh up
phase "embedding model and ONNX Runtime (deploy/local/models.sh)"
deploy/local/models.sh
phase "Prometheus and promtool (deploy/local/prometheus.sh)"
PROMETHEUS_BIN="$(deploy/local/prometheus.sh | tail -n 1)"
export PROMETHEUS_BIN
phase "Arize Phoenix, the LLM-observability server the trace test exports to (deploy/local/phoenix.sh)"
PHOENIX_BIN="$(deploy/local/phoenix.sh | tail -n 1)"
export PHOENIX_BIN
eval "$(deploy/local/stack.sh env)"

phase "the TB-Backend service's packages: nats.js, Express, Socket.IO, jsonwebtoken, the MongoDB driver (npm ci)"
# Node trusts only its own CA list; the system's (which curl and pip use, and which holds a TLS-inspecting
# proxy's CA where there is one) is added unless the user chose otherwise.
if [[ -z "${NODE_EXTRA_CA_CERTS:-}" && -r /etc/ssl/certs/ca-certificates.crt ]]; then
  export NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
fi
npm ci --prefix deploy/tb-backend --no-audit --no-fund --loglevel=error
phase "Debian's Chromium for the chat page's browser test (deploy/local/chromium.sh)"
CHROMIUM="$(deploy/local/chromium.sh | tail -n 1)"
export CHROMIUM
phase "least-privilege NATS users (deploy/nats/test-permissions.sh)"
deploy/nats/test-permissions.sh
phase "alert rules (promtool check rules, promtool test rules)"
"$PROMETHEUS_BIN/promtool" check rules deploy/prometheus/alerts.yml
"$PROMETHEUS_BIN/promtool" test rules deploy/prometheus/alerts-test.yml

phase "cargo fmt --check"
cargo fmt --all -- --check
phase "cargo clippy -D warnings (first build of everything: several minutes)"
cargo clippy --workspace --all-targets "${quiet[@]}" -- -D warnings
# The `otel` feature: the library, the binary and the test binary (its `otel` module).
phase "cargo clippy -D warnings, feature otel"
cargo clippy --features otel --lib --bins --test it "${quiet[@]}" -- -D warnings
# The worker as it ships (the Dockerfile's and the demo's build): without `testing`, which the workspace's
# other runs unify in through `companion-dev`, so a re-export or an item gated on it is checked both ways.
phase "cargo clippy -D warnings, the worker without testing"
cargo clippy -p companion --lib --bins "${quiet[@]}" -- -D warnings
status=0
# What the tests write to the temp folder (worker logs, throwaway stacks, certificates, bench runs) goes
# into one folder of it, removed after a passing run with the per-test databases; a failing run keeps both
# for a look and says where. (A short path: the throwaway stacks' PostgreSQL sockets live under it.)
SYSTEM_TMP="${TMPDIR:-/tmp}"
TEST_TMP="$(mktemp -d "$SYSTEM_TMP/companion-test.XXXXXX")"
export TMPDIR="$TEST_TMP"
phase "cargo test (unit tests and the integration tests against the stack)"
cargo_test cargo test --workspace --all-targets --no-fail-fast || status=$?
phase "cargo test, feature otel (the spans, in a collector and in Phoenix)"
cargo_test cargo test --features otel --test it -- otel:: phoenix:: || status=$?
export TMPDIR="$SYSTEM_TMP"
if [[ "$status" -eq 0 ]]; then
  rm -rf -- "$TEST_TMP"
  deploy/local/stack.sh sweep || true
else
  printf '[test] kept for a look: the tests'"'"' temporary files in %s, and their databases (deploy/local/stack.sh sweep drops them)\n' "$TEST_TMP"
fi
# The record's last phase line (readme-figures.sh times the phase before it); the output's last line is
# last_line's, with the counts.
current=done
note "[test] done, exit $status ($((SECONDS - started))s)"
exit "$status"
