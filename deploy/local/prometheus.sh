#!/usr/bin/env bash
# Installs Debian's Prometheus (the server and promtool) into .local/prometheus/bin, without root: the
# package is fetched with `apt-get download` and unpacked with `dpkg-deb -x`; nothing is installed
# system-wide. Idempotent; prints the bin folder on its last line.
#
#   deploy/local/prometheus.sh           install if missing
#   deploy/local/prometheus.sh --check   exit 0 only when installed
set -euo pipefail
ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd -P)"
LOCAL_DIR="${COMPANION_LOCAL_DIR:-$ROOT/.local}"
DIR="$LOCAL_DIR/prometheus"
BIN="$DIR/bin"
# The version checked here (Debian bookworm); another one is used, with a note, if this one is gone.
VERSION="2.42.0+ds-5+b6"
log() { printf '[prometheus] %s\n' "$*"; }

if [[ -x "$BIN/prometheus" && -x "$BIN/promtool" ]]; then
  [[ "${1:-}" == --check ]] && exit 0
  log "installed: $("$BIN/promtool" --version 2>&1 | head -n 1)"
  printf '%s\n' "$BIN"
  exit 0
fi
[[ "${1:-}" == --check ]] && exit 1

mkdir -p -- "$DIR/deb"
cd -- "$DIR/deb"
rm -f -- ./*.deb
log "fetching Debian's prometheus $VERSION (apt-get download)"
if ! apt-get download -q "prometheus=$VERSION" >/dev/null 2>&1; then
  if [[ "$(id -u)" -eq 0 ]] && ! apt-get download -q prometheus >/dev/null 2>&1; then
    log "package lists look stale; apt-get update"
    apt-get update -q >/dev/null
  fi
  apt-get download -q prometheus >/dev/null \
    || { log "ERROR: apt-get download prometheus failed"; exit 1; }
  log "NOTE: $VERSION is not available; using $(ls ./*.deb)"
fi
rm -rf -- "$DIR/root"
dpkg-deb -x ./*.deb "$DIR/root"
mkdir -p -- "$BIN"
install -m 0755 "$DIR/root/usr/bin/prometheus" "$DIR/root/usr/bin/promtool" "$BIN/"
rm -rf -- "$DIR/root" "$DIR/deb"
log "installed: $("$BIN/promtool" --version 2>&1 | head -n 1)"
printf '%s\n' "$BIN"
