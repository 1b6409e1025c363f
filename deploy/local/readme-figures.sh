#!/usr/bin/env bash
# Copies the figures of the last `deploy/local/test.sh` run into README.md, so that the README quotes a
# run instead of typed numbers:
#
#   deploy/local/test.sh              writes .local/logs/last-test-run.txt when it ends
#   deploy/local/readme-figures.sh    rewrites README.md's block between these two lines:
#     <!-- figures:begin (deploy/local/readme-figures.sh writes this block) -->
#     <!-- figures:end -->
#
# The block says when and on which commit the run was, as whom, how it ended, the seconds of each phase,
# the test counts of cargo's `test result:` lines and the disk use of .local/ and target/.
# A first argument names another record. Same record, same README: running it twice changes nothing.
# No network; exit 1 with a message when the record or the markers are missing.
set -euo pipefail
ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd -P)"
RECORD="${1:-${COMPANION_LOCAL_DIR:-$ROOT/.local}/logs/last-test-run.txt}"
README="$ROOT/README.md"
BEGIN='<!-- figures:begin (deploy/local/readme-figures.sh writes this block) -->'
END='<!-- figures:end -->'

die() { printf 'readme-figures: %s\n' "$*" >&2; exit 1; }

[[ -f "$RECORD" && -r "$RECORD" ]] \
  || die "no record of a test run at $RECORD: run deploy/local/test.sh first (it writes the record when it ends)"
grep -q '^exit: ' "$RECORD" \
  || die "$RECORD has no 'exit:' line, so it is not a finished run's record: run deploy/local/test.sh again"
[[ -f "$README" ]] || die "no README.md at $README"
begin_at="$(grep -nxF -- "$BEGIN" "$README" | cut -d: -f1 | tr '\n' ' ')" || true
end_at="$(grep -nxF -- "$END" "$README" | cut -d: -f1 | tr '\n' ' ')" || true
begin_at="${begin_at% }"
end_at="${end_at% }"
if [[ -z "$begin_at" || -z "$end_at" || "$begin_at" == *' '* || "$end_at" == *' '* ]] \
  || ((begin_at >= end_at)); then
  die "README.md needs the line '$BEGIN' once, then the line '$END' once (found them at lines: '${begin_at}' and '${end_at}')"
fi

# The record: `[test] <phase> (<N>s)` lines (N: seconds since the start), cargo's `test result:` lines after
# the phase that ran them (each after the `Running` line naming its binary, when the run was not on a
# terminal), then `key: value` lines (exit, seconds, date, commit, worktree, user, root,
# disk-local, disk-target).
# The test counts, by kind of test binary (deploy/local/test-counts.awk, which test.sh's last line uses too).
TESTS="$(awk -f "$ROOT/deploy/local/test-counts.awk" "$RECORD" | sed -n 1p)"
export TESTS
block="$(awk '
  /^\[test\] / {
    line = $0
    sub(/^\[test\] /, "", line)
    if (!match(line, / \([0-9]+s\)$/)) next
    phases++
    name[phases] = substr(line, 1, RSTART - 1)
    at[phases] = substr(line, RSTART + 2, RLENGTH - 4) + 0
    next
  }
  /^[a-z-]+: / {
    key = $0; sub(/: .*/, "", key)
    value = $0; sub(/^[a-z-]+: /, "", value)
    kv[key] = value
    next
  }
  END {
    split("exit seconds date commit worktree user root disk-local disk-target", keys, " ")
    for (k in keys) if (kv[keys[k]] == "") kv[keys[k]] = "unknown"
    who = (kv["root"] == "yes") ? "as root" : "as `" kv["user"] "` (not root)"
    changes = (kv["worktree"] == "modified") ? " with uncommitted changes" : ""
    printf "The last `deploy/local/test.sh` run, as `deploy/local/readme-figures.sh` copied it:\n"
    printf "%s, commit `%s`%s, %s; exit %s after %s s.\n", kv["date"], kv["commit"], changes, who, kv["exit"], kv["seconds"]
    if (phases > 0) {
      printf "\n| phase | seconds |\n|---|---:|\n"
      if (at[1] > 0) printf "| prerequisites (`deploy/local/prereqs.sh test`) | %d |\n", at[1]
      for (i = 1; i <= phases; i++) {
        if (name[i] ~ /^done, exit /) continue
        end = (i < phases) ? at[i + 1] : kv["seconds"] + 0
        label = name[i]
        gsub(/\|/, "\\|", label)
        if (i == phases) label = label " (the run stopped here)"
        printf "| %s | %d |\n", label, end - at[i]
      }
      printf "\n"
    }
    line = ENVIRON["TESTS"]
    if (line == "") line = "no `test result:` line (the run ended before cargo test)"
    printf "Tests: %s.\n", line
    printf "Disk: `.local/` %s, `target/` %s.\n", kv["disk-local"], kv["disk-target"]
  }
' "$RECORD")"

tmp="$(mktemp "$README.figures.XXXXXX")"
trap 'rm -f -- "$tmp"' EXIT
BLOCK="$block" awk -v b="$begin_at" -v e="$end_at" '
  NR == b { print; print ENVIRON["BLOCK"]; next }
  NR > b && NR < e { next }
  { print }
' "$README" >"$tmp"
if cmp -s -- "$tmp" "$README"; then
  printf 'readme-figures: README.md already has the figures of %s\n' "$RECORD"
else
  cat -- "$tmp" >"$README"
  printf 'readme-figures: README.md now has the figures of %s\n' "$RECORD"
fi
