#!/usr/bin/env bash
# Why did the companion say that? Tells one message's turn from the journal of the local stack:
# `companion explain` with the local stack's settings, from any folder.
#
#   deploy/local/explain.sh <messageId>                 the id a demo reply line ends with ([explain …])
#   deploy/local/explain.sh <messageId> --json          one JSON object
#   deploy/local/explain.sh <messageId> --show-text     the messages' text too (audited)
#
# Uses target/debug/companion as the demo built it (builds it the same way if it is missing). The local
# stack must be running (the demo leaves it running; deploy/local/stack.sh up starts it). What the
# story says: docs/operations.md, "Explaining one message".
set -euo pipefail
ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd -P)"
cd "$ROOT"
if [[ $# -eq 0 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  [[ $# -eq 0 ]] && exit 2
  exit 0
fi
eval "$(deploy/local/stack.sh env)"
export COMPANION_CHARACTERS_DIR="$ROOT/characters"
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/companion"
if [[ ! -x "$BIN" ]]; then
  # The demo's build of the worker (alone: without the `testing` feature companion-dev would unify into
  # it), so that the next demo does not build it again.
  printf '[explain] building companion (cargo build -p companion --bin companion; a first build takes several minutes)\n' >&2
  cargo build -p companion --bin companion --quiet
fi
status=0
"$BIN" explain "$@" || status=$?
if [[ "$status" -ne 0 ]] && ! deploy/local/stack.sh status >/dev/null 2>&1; then
  printf '[explain] the local stack is not (all) running: deploy/local/stack.sh status; start it with deploy/local/stack.sh up\n' >&2
fi
exit "$status"
