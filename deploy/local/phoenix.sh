#!/usr/bin/env bash
# Installs Arize Phoenix (the LLM-observability server, PyPI `arize-phoenix`) into a venv of its own,
# .local/phoenix/venv, for the tests that export OpenTelemetry traces to it and read the spans back.
# Nothing is installed system-wide and nothing is started. Idempotent; prints the venv's bin folder (holding
# the `phoenix` executable) on its last line.
#
#   deploy/local/phoenix.sh           install if missing (or if VERSION / the lock below changed)
#   deploy/local/phoenix.sh --check   exit 0 only when installed as pinned here
#
# Starting it for a test (see the Phoenix notes): `$BIN/phoenix serve` with PHOENIX_HOST=127.0.0.1,
# PHOENIX_PORT, PHOENIX_GRPC_PORT (always bound, on all interfaces), PHOENIX_WORKING_DIR (its SQLite
# database goes there), PHOENIX_ALLOW_EXTERNAL_RESOURCES=false (no outbound requests, no telemetry),
# PHOENIX_LOG_MIGRATIONS=false; ready when GET /readyz answers 200.
#
# Environment: COMPANION_LOCAL_DIR (default <root>/.local), PYTHON (default python3).
# The install takes about a minute (2 cores) and 850 MB.
set -euo pipefail
ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd -P)"
LOCAL_DIR="${COMPANION_LOCAL_DIR:-$ROOT/.local}"
DIR="$LOCAL_DIR/phoenix"
# Tools' caches into .local/cache (deploy/local/caches.sh).
source "$ROOT/deploy/local/caches.sh"
VENV="$DIR/venv"
BIN="$VENV/bin"
PYTHON="${PYTHON:-python3}"
# 20.26.1: the newest release when this was checked (2026-11; it declares Python 3.11 to 3.14). The tests
# rely on Phoenix turning OpenTelemetry GenAI attributes (gen_ai.*) into its own span kinds (AGENT, LLM,
# TOOL), token counts (llm.token_count.*) and sessions (session.id); that mapping came with 15.10 and was
# checked on this version. Any change of version: rerun the checks in the Phoenix notes.
VERSION="20.26.1"
# The lock: every dependency as `pip freeze` listed it after installing $VERSION with Python 3.11, given to
# pip as constraints so a reinstall gets the same set (Phoenix pins few of its ~140 dependencies, and its
# web stack moves fast). Refresh it with the version: install with the lock emptied, then paste
# `$BIN/pip freeze | grep -v '^arize-phoenix=='` here. Should pip not be able to honour it (another Python,
# a version gone from the index), the install goes on with $VERSION alone and says so.
LOCK=(
  aiofile==3.12.3 aioitertools==0.13.0 aiosqlite==0.22.1 alembic==1.20.1 annotated-doc==0.0.7
  annotated-types==0.8.0 anthropic==1.17.0 anyio==4.16.0 arize-phoenix-client==3.5.0
  arize-phoenix-evals==3.9.4 arize-phoenix-otel==0.17.2 arize-phoenix-sqlean==0.2.1 attrs==26.1.0
  Authlib==1.9.10 bashkit==0.20.1 beartype==0.23.1 boto3==1.44.8 botocore==1.44.8 cachetools==8.0.2
  caio==0.12.10 certifi==2026.10.19.post1 cffi==2.1.1 charset-normalizer==3.5.3 click==8.5.1
  cross-web==0.9.0 cryptography==50.0.2 cyclopts==5.5.2 distro==1.9.0 dnspython==2.9.2
  docstring_parser==0.18.0 email-validator==2.4.0 exceptiongroup==1.3.2 fastapi==0.165.0
  fastmcp-slim==4.2.3 genai-prices==0.2.3 google-auth==2.63.0 google-genai==2.34.0
  googleapis-common-protos==1.76.0 graphql-core==3.3.2 greenlet==3.5.6 griffelib==2.4.1
  grpc-interceptor==0.15.4 grpcio==1.85.3 h11==0.16.0 h2==4.4.1 hpack==4.2.0 httpcore==1.0.9
  httpcore2==2.16.2 httpx==0.28.1 httpx2==2.16.2 hyperframe==6.1.0 idna==3.20 Jinja2==3.1.6 jiter==0.19.0
  jmespath==1.1.0 joserfc==1.8.0 jsonpath-ng==1.16.0 jsonref==1.1.0 jsonschema==4.26.0
  jsonschema-path==0.5.0 jsonschema-specifications==2025.9.1 ldap3==2.9.1 logfire-api==5.6.0 Mako==1.4.3
  markdown-it-py==4.3.0 MarkupSafe==3.0.4 mcp==2.3.0 mcp-types==2.3.0 mdurl==0.1.2 numpy==2.4.6
  openai==3.57.0 openapi-pydantic==0.6.0 openinference-instrumentation==0.1.72
  openinference-instrumentation-openai==0.1.66 openinference-semantic-conventions==0.1.42
  opentelemetry-api==1.45.2 opentelemetry-exporter-http-transport==0.66b2
  opentelemetry-exporter-otlp==1.45.2 opentelemetry-exporter-otlp-common==0.66b2
  opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-otlp-proto-grpc==1.45.2
  opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-instrumentation==0.66b2
  opentelemetry-proto==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2
  orjson==3.13.0 packaging==26.4 pandas==3.1.1 pathable==0.6.0 platformdirs==4.14.8
  prometheus_client==0.26.0 protobuf==7.36.2 psutil==7.2.2 py-key-value-aio==0.5.0 pyarrow==26.0.1
  pyasn1==0.6.5 pyasn1_modules==0.4.2 pycparser==3.12 pydantic==2.14.4 pydantic-ai-slim==2.68.0
  pydantic-graph==2.68.0 pydantic-monty==1.1.0 pydantic-monty-client==1.1.0 pydantic-monty-runtime==1.1.0
  pydantic-settings==2.16.3 pydantic_core==2.50.5 Pygments==2.21.0 PyJWT==2.15.1 pyperclip==1.11.0
  pystache==0.6.8 python-dateutil==2.9.0.post0 python-dotenv==1.2.4 python-multipart==0.0.34
  PyYAML==6.0.4 referencing==0.37.0 regex==2026.11.19 requests==2.34.2 rich==15.0.0 rich-rst==2.2.0
  rpds-py==2026.9.1 s3transfer==0.19.3 six==1.17.0 sniffio==1.3.1 snowballstemmer==3.1.1
  SQLAlchemy==2.1.9 sqlglot==30.21.0 sse-starlette==3.7.0 starlette==1.10.0 strawberry-graphql==0.335.0
  tenacity==9.1.4 tiktoken==0.14.0 tqdm==4.70.1 truststore==0.10.5 typing-inspection==0.4.5
  typing_extensions==4.16.0 uncalled-for==0.6.2 urllib3==2.8.0 uvicorn==0.54.0 watchfiles==1.3.0
  websockets==17.4 wrapt==2.5.2
)
MARKER="$VENV/.companion-phoenix.sha256"
log() { printf '[phoenix] %s\n' "$*"; }

want="$(printf '%s\n' "arize-phoenix==$VERSION" "${LOCK[@]}" | sha256sum | cut -d' ' -f1)"
installed() {
  [[ -x "$BIN/phoenix" && -f "$MARKER" && "$(cat -- "$MARKER")" == "$want" ]] \
    && "$BIN/python" -c 'pass' </dev/null >/dev/null 2>&1
}
version() {
  "$BIN/python" -c 'from importlib.metadata import version; print("arize-phoenix", version("arize-phoenix"))' \
    </dev/null 2>/dev/null || echo "arize-phoenix (version unknown)"
}

if installed; then
  [[ "${1:-}" == --check ]] && exit 0
  log "installed: $(version) in $VENV"
  printf '%s\n' "$BIN"
  exit 0
fi
[[ "${1:-}" == --check ]] && exit 1

mkdir -p -- "$DIR"
if [[ ! -x "$BIN/python" ]] || ! "$BIN/python" -c 'pass' </dev/null >/dev/null 2>&1; then
  log "creating venv at $VENV ($("$PYTHON" --version 2>&1))"
  rm -rf -- "$VENV"
  "$PYTHON" -m venv "$VENV" </dev/null
fi
rm -f -- "$MARKER"
printf '%s\n' "${LOCK[@]}" >"$DIR/constraints.txt"
: >"$DIR/pip.log"
pip_install() {
  "$BIN/python" -m pip install --disable-pip-version-check --no-input -q "$@" </dev/null >>"$DIR/pip.log" 2>&1
}
started=$SECONDS
log "pip install arize-phoenix==$VERSION with its locked dependencies (about a minute)"
if ! pip_install -c "$DIR/constraints.txt" "arize-phoenix==$VERSION"; then
  log "NOTE: pip could not honour the lock (last lines of $DIR/pip.log below); installing $VERSION alone"
  tail -n 5 -- "$DIR/pip.log" | sed 's/^/[phoenix]   /'
  pip_install "arize-phoenix==$VERSION" || {
    log "ERROR: pip install arize-phoenix==$VERSION failed; last 30 lines of $DIR/pip.log:"
    tail -n 30 -- "$DIR/pip.log" >&2
    exit 1
  }
fi
# Not `phoenix --help`: importing Phoenix creates its working folder (~/.phoenix unless PHOENIX_WORKING_DIR).
[[ -x "$BIN/phoenix" ]] && "$BIN/python" -m pip check --disable-pip-version-check </dev/null >>"$DIR/pip.log" 2>&1 || {
  log "ERROR: $BIN/phoenix missing or pip check failed; last 30 lines of $DIR/pip.log:"
  tail -n 30 -- "$DIR/pip.log" >&2
  exit 1
}
"$BIN/python" -m pip freeze --disable-pip-version-check >"$DIR/installed.txt" 2>/dev/null || true
printf '%s\n' "$want" >"$MARKER"
log "installed: $(version) in $VENV ($((SECONDS - started)) s, $(du -sh -- "$VENV" | cut -f1))"
printf '%s\n' "$BIN"
