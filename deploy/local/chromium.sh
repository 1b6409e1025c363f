#!/usr/bin/env bash
# Debian's Chromium for the chat page's browser test (tests/it/fanout.rs) and `demo.sh --web`'s check of the
# page: prints the browser's path on its last line. When it is missing, root installs it with apt-get
# (chromium, and an emoji font so the companions' emoji render); anyone else is told what to install, and
# the script fails: the browser test never skips.
#
#   deploy/local/chromium.sh            install if missing (root), print the path
#   deploy/local/chromium.sh --check    exit 0 when it is there, 1 otherwise; installs nothing
# Env: CHROMIUM  a Chromium to use instead of /usr/bin/chromium
set -euo pipefail
path="${CHROMIUM:-/usr/bin/chromium}"
if [[ -x "$path" ]]; then
  printf '%s\n' "$path"
  exit 0
fi
[[ "${1:-}" == --check ]] && exit 1
if [[ -n "${CHROMIUM:-}" ]]; then
  echo "[chromium] CHROMIUM=$CHROMIUM is not an executable" >&2
  exit 1
fi
if [[ "$(id -u)" -ne 0 ]]; then
  echo "[chromium] missing: Debian's Chromium, for the browser test. Install it once as root: sudo apt-get install chromium fonts-noto-color-emoji (or set CHROMIUM to a Chromium's path)" >&2
  exit 1
fi
echo "[chromium] installing Debian's chromium with apt-get (about 15 s, ~300 MB)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends chromium fonts-noto-color-emoji >&2
[[ -x "$path" ]] || { echo "[chromium] apt-get ran but $path is not there" >&2; exit 1; }
printf '%s\n' "$path"
