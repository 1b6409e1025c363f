"""Builds the int8 embedding graph the worker runs by default, from the fused fp32 graph build_model.py wrote:

    python quantize_model.py MODELS_DIR

reads MODELS_DIR/model.onnx (+ model.onnx.data) and tokenizer.json, writes MODELS_DIR/model-int8.onnx
(+ model-int8.onnx.data, memory-mapped like the fp32 weights).

Plain dynamic int8 (ONNX Runtime's quantize_dynamic, per-channel weights) reaches only cosine 0.989 against
the fp32 reference on this project's parity fixture: BERT's activations have a few channels far larger
than the rest, and one scale per tensor spends the 8 bits on them. So, as SmoothQuant does, each quantised
MatMul/Attention input channel j is divided by s_j = amax_j^ALPHA / wmax_j^(1-ALPHA) (amax from a
calibration run, wmax the weight row's largest magnitude) and the weight row multiplied by it: the same
function, with the outliers moved into the weights, which are quantised per output channel. The first
layer's FFN output projection (the most sensitive) stays fp32. Weights use 7 bits (reduce_range): CPUs
without VNNI multiply u8 x s8 pairs with a saturating 16-bit add.

Calibration texts are the demo knowledge base's paragraphs and the seed's chat lines (never the parity
fixture). Prints the smallest cosine between the two graphs on those texts. Needs numpy, onnx,
onnxruntime and tokenizers.
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
from tokenizers import Tokenizer

ALPHA = 0.7
KEEP_FP32 = ["l0_ffn_out"]
HERE = os.path.dirname(os.path.abspath(__file__))


def calibration_texts():
    texts = []
    for path in sorted(glob.glob(os.path.join(HERE, "knowledge", "**", "*.md"), recursive=True)):
        body = open(path, encoding="utf-8").read().split("\n---\n", 1)[-1]
        texts += [p.strip() for p in body.split("\n\n") if len(p.strip()) > 20]

    def walk(v):
        if isinstance(v, dict):
            for k, x in v.items():
                if k in ("content", "text", "description", "name") and isinstance(x, str) and len(x) >= 10:
                    texts.append(x)
                else:
                    walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for path in sorted(glob.glob(os.path.join(HERE, "seed", "*.json"))):
        walk(json.load(open(path, encoding="utf-8")))
    return texts


def feeds(tok, text):
    e = tok.encode(text)
    return {
        "input_ids": np.array([e.ids], np.int64),
        "attention_mask": np.array([e.attention_mask], np.int64),
    }


def session(model, outputs=None):
    o = ort.SessionOptions()
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    o.intra_op_num_threads = 1
    return ort.InferenceSession(model, o, providers=["CPUExecutionProvider"])


def pooled(hidden):
    v = hidden[0].mean(0)
    return v / np.linalg.norm(v)


def main():
    models = sys.argv[1]
    src = os.path.join(models, "model.onnx")
    tok = Tokenizer.from_file(os.path.join(models, "tokenizer.json"))
    tok.enable_truncation(256)
    tok.no_padding()
    texts = calibration_texts()

    m = onnx.load(src)
    targets = [n for n in m.graph.node if n.op_type in ("MatMul", "Attention") and n.name not in KEEP_FP32]
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    for n in targets:
        probe.graph.output.append(helper.make_tensor_value_info(n.input[0], onnx.TensorProto.FLOAT, None))
    s = session(probe.SerializeToString())
    amax = {}
    for t in texts:
        outs = s.run([n.input[0] for n in targets], feeds(tok, t))
        for n, x in zip(targets, outs):
            a = np.abs(x).reshape(-1, x.shape[-1]).max(0)
            amax[n.name] = np.maximum(amax.get(n.name, a), a)

    inits = {i.name: i for i in m.graph.initializer}
    nodes = []
    for n in m.graph.node:
        if n in targets:
            w = numpy_helper.to_array(inits[n.input[1]])
            scale = np.maximum(amax[n.name], 1e-5) ** ALPHA / np.maximum(np.abs(w).max(1), 1e-5) ** (1 - ALPHA)
            scale = scale.astype(np.float32)
            inits[n.input[1]].CopyFrom(numpy_helper.from_array((w * scale[:, None]).astype(np.float32), n.input[1]))
            inv, smoothed = f"{n.name}_smooth", f"{n.name}_smoothed_in"
            m.graph.initializer.append(numpy_helper.from_array((1.0 / scale).astype(np.float32), inv))
            nodes.append(helper.make_node("Mul", [n.input[0], inv], [smoothed], name=f"{n.name}_smooth"))
            n.input[0] = smoothed
        nodes.append(n)
    del m.graph.node[:]
    m.graph.node.extend(nodes)

    work = os.path.join(models, ".quantize-model")
    os.makedirs(work, exist_ok=True)
    smoothed_path = os.path.join(work, "smoothed.onnx")
    onnx.save_model(m, smoothed_path, save_as_external_data=True, location="smoothed.onnx.data")
    out = os.path.join(work, "model-int8.onnx")
    quantize_dynamic(
        smoothed_path, out, weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
        op_types_to_quantize=["MatMul", "Attention"], nodes_to_exclude=KEEP_FP32,
        extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    # Weights apart (the 47 MB word table stays on disk except the rows used), like the fp32 graph.
    q = onnx.load(out)
    onnx.save_model(
        q, out, save_as_external_data=True, all_tensors_to_one_file=True,
        location="model-int8.onnx.data", size_threshold=1024,
    )

    fp32, int8 = session(src), session(out)
    worst = min(
        float(np.dot(pooled(fp32.run(["last_hidden_state"], feeds(tok, t))[0]),
                     pooled(int8.run(["last_hidden_state"], feeds(tok, t))[0])))
        for t in texts
    )
    # Data first, then the graph: a process that has the old files mapped keeps them.
    for name in ("model-int8.onnx.data", "model-int8.onnx"):
        os.chmod(os.path.join(work, name), 0o644)
        os.replace(os.path.join(work, name), os.path.join(models, name))
    for f in glob.glob(os.path.join(work, "*")):
        os.remove(f)
    os.rmdir(work)
    print(f"int8 graph: {len(targets)} operators quantised, {len(texts)} calibration texts, "
          f"smallest cosine to fp32 {worst:.5f}")


if __name__ == "__main__":
    main()
