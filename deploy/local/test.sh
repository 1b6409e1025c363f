#!/usr/bin/env bash
# Runs every check and test against the real local stack, installing and starting it if needed.
# `.ci/run` calls exactly this. One `[test]` line per phase; cargo shows its own progress on a terminal.
set -euo pipefail
ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd -P)"
cd "$ROOT"
started=$SECONDS
phase() { printf '[test] %s (%ds)\n' "$*" "$((SECONDS - started))"; }
# cargo's progress bar on a terminal; quiet in logs (CI), where the phase lines say what runs.
quiet=(--quiet)
if [[ -t 2 ]]; then quiet=(); fi

deploy/local/prereqs.sh test
phase "local stack: NATS, PostgreSQL, the MongoDB-wire server (deploy/local/stack.sh up)"
deploy/local/stack.sh up
phase "embedding model and ONNX Runtime (deploy/local/models.sh)"
deploy/local/models.sh
phase "Prometheus and promtool (deploy/local/prometheus.sh)"
PROMETHEUS_BIN="$(deploy/local/prometheus.sh | tail -n 1)"
export PROMETHEUS_BIN
eval "$(deploy/local/stack.sh env)"

phase "the TB-Backend bridge's nats.js (npm ci)"
# Node trusts only its own CA list; the system's (which curl and pip use, and which holds a TLS-inspecting
# proxy's CA where there is one) is added unless the user chose otherwise.
if [[ -z "${NODE_EXTRA_CA_CERTS:-}" && -r /etc/ssl/certs/ca-certificates.crt ]]; then
  export NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
fi
npm ci --prefix deploy/tb-backend --no-audit --no-fund --loglevel=error
phase "least-privilege NATS users (deploy/nats/test-permissions.sh)"
deploy/nats/test-permissions.sh
phase "alert rules (promtool check rules)"
"$PROMETHEUS_BIN/promtool" check rules deploy/prometheus/alerts.yml

phase "cargo fmt --check"
cargo fmt --all -- --check
phase "cargo clippy -D warnings (first build of everything: several minutes)"
cargo clippy --workspace --all-targets "${quiet[@]}" -- -D warnings
# The `otel` feature: the library, the binary and the test binary (its `otel` module).
phase "cargo clippy -D warnings, feature otel"
cargo clippy --features otel --lib --bins --test it "${quiet[@]}" -- -D warnings
status=0
phase "cargo test (unit tests and the integration tests against the stack)"
cargo test --workspace --all-targets --no-fail-fast 2>&1 || status=$?
phase "cargo test, feature otel"
cargo test --features otel --test it otel:: 2>&1 || status=$?
phase "done, exit $status"
exit "$status"
