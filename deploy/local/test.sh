#!/usr/bin/env bash
# Runs every check and test against the real local stack, installing and starting it if needed.
# `.ci/run` calls exactly this.
set -euo pipefail
ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd -P)"
cd "$ROOT"

deploy/local/stack.sh up
if [[ -x deploy/local/models.sh ]]; then deploy/local/models.sh; fi
eval "$(deploy/local/stack.sh env)"

# The TB-Backend bridge (nats.js) that tests/tb_backend_bridge.rs runs.
npm ci --prefix deploy/tb-backend --no-audit --no-fund --loglevel=error
# The least-privilege NATS users of deploy/nats/auth.conf, proven against a throwaway server.
deploy/nats/test-permissions.sh

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
# The `otel` feature: the library, the binary and the test binary (its `otel` module).
cargo clippy --features otel --lib --bins --test it --quiet -- -D warnings
status=0
cargo test --workspace --all-targets --no-fail-fast 2>&1 || status=$?
cargo test --features otel --test it otel:: 2>&1 || status=$?
exit "$status"
