# The test counts of a deploy/local/test.sh record (or of its output): cargo's `test result:` lines, each
# given to the binary its `Running` line named and to the phase its `[test]` line began. Two lines out:
#   unit (8 crates) 140 passed; integration 189 passed, 1 ignored; dev 24 passed; otel 5 passed
#   358 passed, 0 failed, 1 ignored
# The first is empty when there is no `test result:` line. Used by test.sh (its last line) and
# readme-figures.sh (the README's figures):  awk -f deploy/local/test-counts.awk RECORD
function count(line, word,   s) {
  if (match(line, "[0-9]+ " word)) { s = substr(line, RSTART, RLENGTH); sub(/ .*/, "", s); return s + 0 }
  return 0
}
function tests(label, i,   s) {
  s = label " " passed[i] " passed"
  if (failed[i] > 0) s = s ", " failed[i] " failed"
  if (ignored[i] > 0) s = s ", " ignored[i] " ignored"
  return s
}
{
  # Colours and a progress bar's carriage returns (a run on a terminal) are not part of a line.
  gsub(/\033\[[0-9;]*[A-Za-z]/, "")
  sub(/\r+$/, "")
  sub(/.*\r/, "")
}
/^\[test\] / { otel_phase = ($0 ~ /otel/); next }
/^ +Running / {
  # The binary of the next result: the integration tests, the dev tooling, or a crate's unit tests.
  running = ($0 ~ /tests\/it\//) ? "integration" : ($0 ~ /companion_dev-/) ? "dev" : ($0 ~ /unittests src\/lib\.rs/) ? "unit" : "other"
  next
}
/test result:/ {
  results++
  kind[results] = running
  running = ""
  otel[results] = otel_phase
  passed[results] = count($0, "passed")
  failed[results] = count($0, "failed")
  ignored[results] = count($0, "ignored")
  next
}
END {
  # cargo test --workspace prints one line per test binary: the unit tests of each crate (src/lib.rs), the
  # worker binary, the integration tests (tests/it), companion-dev, its binary. Binaries without tests
  # are left out. With the `Running` lines, the unit tests of all crates are summed; without them (an
  # older record of a run on a terminal), the lines are numbered.
  kept = 0; named = 1
  for (i = 1; i <= results; i++)
    if (!otel[i] && passed[i] + failed[i] + ignored[i] > 0) {
      keep[++kept] = i
      if (kind[i] == "") named = 0
    }
  line = ""
  if (named) {
    split("unit integration dev other", kinds, " ")
    for (k = 1; k <= 4; k++) {
      # Index 0 holds the sum of one kind.
      n = 0; passed[0] = 0; failed[0] = 0; ignored[0] = 0
      for (j = 1; j <= kept; j++) {
        i = keep[j]
        if (kind[i] != kinds[k]) continue
        n++
        passed[0] += passed[i]; failed[0] += failed[i]; ignored[0] += ignored[i]
      }
      if (n > 0) line = line (line == "" ? "" : "; ") tests(kinds[k] (n > 1 ? " (" n " crates)" : ""), 0)
    }
  } else {
    for (k = 1; k <= kept; k++) {
      label = (kept == 3) ? ((k == 1) ? "unit" : (k == 2) ? "integration" : "dev") : "binary " k ":"
      line = line (line == "" ? "" : "; ") tests(label, keep[k])
    }
  }
  for (i = 1; i <= results; i++)
    if (otel[i]) line = line (line == "" ? "" : "; ") tests("otel", i)
  p = 0; f = 0; g = 0
  for (i = 1; i <= results; i++) { p += passed[i]; f += failed[i]; g += ignored[i] }
  print line
  printf "%d passed, %d failed, %d ignored\n", p, f, g
}
