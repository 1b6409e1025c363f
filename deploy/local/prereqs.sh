#!/usr/bin/env bash
# Checks what the two README commands need before they start, one line per missing piece.
#
#   deploy/local/prereqs.sh demo     what deploy/local/demo.sh needs
#   deploy/local/prereqs.sh test     what deploy/local/test.sh needs (the demo's, plus Node.js/npm,
#                                    Debian's apt-get/dpkg-deb for the Prometheus checks and, for a user
#                                    who is not root, Debian's Chromium)
#   deploy/local/prereqs.sh web      what deploy/local/demo.sh --web needs (the demo's, plus Node.js/npm)
#
# Exit 0 when everything is there, 1 otherwise (after listing every missing piece).
set -uo pipefail

what="${1:-demo}"
missing=()
need() { missing+=("$*"); }
have() { command -v "$1" >/dev/null 2>&1; }

# version_at_least HAVE WANT: dotted versions, numerically.
version_at_least() {
  [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" == "$2" ]]
}

rust_min="1.94"
if ! have cargo || ! have rustc; then
  need "Rust toolchain: cargo and rustc $rust_min or newer (https://rustup.rs; this project was built with 1.95)"
else
  rv="$(rustc --version 2>/dev/null | awk '{print $2}')"
  version_at_least "${rv:-0}" "$rust_min" || need "Rust $rust_min or newer: rustc is ${rv:-unknown}"
fi
have cc || have gcc || need "a C compiler (cc/gcc) for crates that build C code (Debian: apt-get install build-essential)"

py="${PYTHON:-python3}"
if ! have "$py"; then
  need "Python 3.9 or newer as $py, with venv and pip (Debian: apt-get install python3 python3-venv python3-pip)"
else
  pv="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)"
  version_at_least "${pv:-0}" "3.9" || need "Python 3.9 or newer: $py is ${pv:-unknown}"
  "$py" -c 'import venv, ensurepip' >/dev/null 2>&1 \
    || need "Python's venv module with ensurepip (Debian: apt-get install python3-venv)"
fi
have curl || need "curl (the stack's health checks use it)"
if [[ "$(id -u)" -eq 0 ]]; then
  # PostgreSQL refuses root; stack.sh runs it as nobody through setpriv.
  have setpriv || need "setpriv (util-linux), to run PostgreSQL as nobody when started by root"
fi

if [[ "$what" == test || "$what" == web ]]; then
  if ! have node || ! have npm; then
    need "Node.js 20 or newer and npm (the TB-Backend service; Debian: apt-get install nodejs npm)"
  elif ! version_at_least "$(node --version 2>/dev/null | tr -d v)" 20; then
    need "Node.js 20 or newer: node is $(node --version 2>/dev/null)"
  fi
fi
if [[ "$what" == test ]]; then
  # The browser test needs Debian's Chromium: test.sh installs it when run as root.
  if [[ "$(id -u)" -ne 0 ]] && ! "$(dirname -- "${BASH_SOURCE[0]}")/chromium.sh" --check; then
    need "Debian's Chromium for the browser test (as root: apt-get install chromium fonts-noto-color-emoji; or set CHROMIUM to its path)"
  fi
  if ! have apt-get || ! have dpkg-deb; then
    need "apt-get and dpkg-deb (Debian's Prometheus package is fetched with apt-get download)"
  fi
fi

if ((${#missing[@]})); then
  for m in "${missing[@]}"; do
    printf '[prereqs] missing: %s\n' "$m" >&2
  done
  exit 1
fi
printf '[prereqs] ok: rust %s, python %s, curl%s\n' "${rv:-?}" "${pv:-?}" \
  "$([[ "$what" == test || "$what" == web ]] && printf ', node %s, npm %s'"$([[ "$what" == test ]] && printf ', apt-get')" "$(node --version 2>/dev/null)" "$(npm --version 2>/dev/null)")"
