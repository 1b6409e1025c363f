//! The learned layer of the crisis screen and of the output check: a linear classifier (softmax
//! regression) over two views of a message, the hashed character and word n-grams of its normalized text
//! (any script, so it reads languages the rules do not) and, when one was computed, its MiniLM sentence
//! embedding. It was trained with and without the embedding, so it still decides when the embedder is
//! not installed.
//!
//! Beside it, the vector head ([`VectorHead`]): a small network over the embedding alone, for a message
//! in a language neither the rules nor the tuning lines cover (its n-grams carry nothing there; the
//! multilingual vector does).
//!
//! The weights are trained by `companion-dev safety-train` on the tuning lines of
//! `tests/fixtures/safety/tuning/`, written apart from the frozen evaluation sets, and compiled in
//! (`screen-input.bin`, `screen-output.bin`). The threshold in each file was chosen on those tuning lines
//! (out-of-fold), never on the frozen sets.

use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

/// Hash buckets of the n-gram view.
pub const BUCKETS: usize = 1 << 15;
/// Width of the embedding view (MiniLM).
pub const DIM: usize = 384;
const MAGIC: &[u8; 4] = b"CSL1";

/// The two views of one message, each of unit length.
#[derive(Clone, Debug, Default)]
pub struct Features {
    /// Sorted, distinct buckets, each with the same weight.
    pub buckets: Vec<u32>,
    /// Each bucket's value (1 / sqrt(buckets)).
    pub weight: f32,
    /// The sentence embedding, when one was computed.
    pub embedding: Option<Vec<f32>>,
}

/// The features of `text` (with its embedding, when there is one).
pub fn features(text: &str, embedding: Option<&[f32]>) -> Features {
    let normalized = super::screen::normalize(text);
    let mut buckets = Vec::with_capacity(normalized.len() * 3);
    let chars: Vec<char> = std::iter::once(' ')
        .chain(normalized.chars())
        .chain(std::iter::once(' '))
        .collect();
    let mut buf = [0u8; 16];
    for n in 2..=4 {
        for w in chars.windows(n) {
            let mut h = seed(n as u64);
            for c in w {
                h = fnv(h, c.encode_utf8(&mut buf).as_bytes());
            }
            buckets.push((h % BUCKETS as u64) as u32);
        }
    }
    let words: Vec<&str> = normalized
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    for w in &words {
        buckets.push((fnv(seed(11), w.as_bytes()) % BUCKETS as u64) as u32);
    }
    for pair in words.windows(2) {
        let h = fnv(fnv(seed(12), pair[0].as_bytes()), pair[1].as_bytes());
        buckets.push((h % BUCKETS as u64) as u32);
    }
    buckets.sort_unstable();
    buckets.dedup();
    let weight = match buckets.len() {
        0 => 0.0,
        n => 1.0 / (n as f32).sqrt(),
    };
    Features {
        buckets,
        weight,
        embedding: embedding.filter(|e| e.len() == DIM).map(<[f32]>::to_vec),
    }
}

fn seed(n: u64) -> u64 {
    0xcbf2_9ce4_8422_2325 ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// What a model file says of itself.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Header {
    /// The classes, `none` first.
    pub classes: Vec<String>,
    /// A message is flagged when 1 − p(none) is at least this.
    pub threshold: f32,
    /// What it was trained on (the tuning files' sha256) and how well it did out of fold, for the record.
    pub trained_on: String,
    pub note: String,
    /// Input model: a sure rule is overruled when the whole message scores under this (chosen out of
    /// fold on the tuning lines; absent in older files: never).
    #[serde(default)]
    pub veto: Option<f32>,
    /// Output model: the classes whose verdict blocks a reply on its own, without the harm-context
    /// condition (absent in older files: none).
    #[serde(default)]
    pub context_free: Vec<String>,
    /// The encoder whose vectors it was trained on (absent in older files: all-MiniLM-L6-v2). Another
    /// encoder's vectors mean nothing to it: the worker then gives it the n-grams only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoder: Option<String>,
}

impl Header {
    /// The encoder whose vectors the model reads.
    pub(crate) fn encoder(&self) -> &str {
        self.encoder.as_deref().unwrap_or("all-MiniLM-L6-v2")
    }
}

/// A trained classifier: per class, int8 weights with one scale, and a bias.
#[derive(Clone, Debug)]
pub struct Model {
    pub header: Header,
    rows: Vec<Vec<i8>>,
    scales: Vec<f32>,
    bias: Vec<f32>,
}

/// Why a model file cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("safety model file: {0}")]
pub struct ModelError(String);

/// Width of a row: the buckets, then the embedding.
const WIDTH: usize = BUCKETS + DIM;

impl Model {
    /// A model from float weights (one row of [`BUCKETS`] + [`DIM`] per class), quantised per row.
    #[cfg(any(test, feature = "testing"))]
    pub fn quantise(header: Header, weights: &[Vec<f32>], bias: Vec<f32>) -> Self {
        let mut rows = Vec::with_capacity(weights.len());
        let mut scales = Vec::with_capacity(weights.len());
        for w in weights {
            let max = w.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
            let scale = max / 127.0;
            rows.push(w.iter().map(|x| (x / scale).round() as i8).collect());
            scales.push(scale);
        }
        Self {
            header,
            rows,
            scales,
            bias,
        }
    }

    #[cfg(any(test, feature = "testing"))]
    /// The file's bytes: magic, header length (u32 LE), header JSON, then per class its scale and bias
    /// (f32 LE) and its int8 row.
    #[cfg(any(test, feature = "testing"))]
    pub fn to_bytes(&self) -> Vec<u8> {
        let header = serde_json::to_vec(&self.header).unwrap_or_default();
        let mut out = Vec::with_capacity(8 + header.len() + self.rows.len() * (WIDTH + 8));
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        for ((row, scale), bias) in self.rows.iter().zip(&self.scales).zip(&self.bias) {
            out.extend_from_slice(&scale.to_le_bytes());
            out.extend_from_slice(&bias.to_le_bytes());
            out.extend(row.iter().map(|w| *w as u8));
        }
        out
    }

    /// Reads a model file.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Result<Self, ModelError> {
        let err = |m: &str| ModelError(m.to_owned());
        if bytes.len() < 8 || &bytes[..4] != MAGIC {
            return Err(err("not a CSL1 file"));
        }
        let len = u32::from_le_bytes(bytes[4..8].try_into().map_err(|_| err("short"))?) as usize;
        let header: Header = serde_json::from_slice(bytes.get(8..8 + len).ok_or(err("short"))?)
            .map_err(|e| ModelError(e.to_string()))?;
        let mut rest = &bytes[8 + len..];
        let n = header.classes.len();
        if n < 2 || header.classes[0] != "none" || rest.len() != n * (WIDTH + 8) {
            return Err(err("classes and weights do not agree"));
        }
        let (mut rows, mut scales, mut bias) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..n {
            let f = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            scales.push(f(&rest[..4]));
            bias.push(f(&rest[4..8]));
            rows.push(rest[8..8 + WIDTH].iter().map(|b| *b as i8).collect());
            rest = &rest[8 + WIDTH..];
        }
        Ok(Self {
            header,
            rows,
            scales,
            bias,
        })
    }

    /// Each class's probability.
    pub(crate) fn probabilities(&self, x: &Features) -> Vec<f32> {
        let logits: Vec<f32> = self
            .rows
            .iter()
            .zip(&self.scales)
            .zip(&self.bias)
            .map(|((row, scale), bias)| {
                let sparse: i32 = x.buckets.iter().map(|b| i32::from(row[*b as usize])).sum();
                let mut z = sparse as f32 * x.weight;
                if let Some(e) = &x.embedding {
                    let dense: f32 = row[BUCKETS..]
                        .iter()
                        .zip(e)
                        .map(|(w, v)| f32::from(*w) * v)
                        .sum();
                    z += dense;
                }
                z * scale + bias
            })
            .collect();
        softmax(&logits)
    }

    /// The class a message is flagged for (never `none`; none below the threshold) and its score,
    /// 1 − p(none).
    pub fn verdict(&self, x: &Features) -> (Option<&str>, f32) {
        let p = self.probabilities(x);
        let score = 1.0 - p[0];
        let class = (score >= self.header.threshold)
            .then(|| (1..p.len()).max_by(|a, b| p[*a].total_cmp(&p[*b])))
            .flatten()
            .map(|i| self.header.classes[i].as_str());
        (class, score)
    }

    /// The class a message is flagged for and its score, or None below the threshold.
    #[cfg(any(test, feature = "testing"))]
    pub fn decide(&self, x: &Features) -> Option<(&str, f32)> {
        let (class, score) = self.verdict(x);
        class.map(|c| (c, score))
    }
}

/// Hidden units of the vector head.
pub const HIDDEN: usize = 64;
const VECTOR_MAGIC: &[u8; 4] = b"CSV1";

/// What a vector head's file says of itself.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct VectorHeader {
    /// The classes, `none` first (the input model's).
    pub classes: Vec<String>,
    /// A message is flagged when 1 − p(none) is at least this (chosen on the tuning lines with each
    /// language left out in turn: how the head scores a language it never saw).
    pub threshold: f32,
    /// The encoder whose vectors it reads; it reads no other's.
    pub encoder: String,
    pub trained_on: String,
    pub note: String,
    /// In a language the rules cover, the score at which the head refers as well (chosen out of fold on
    /// the tuning lines with the rules and the linear layer; absent: never there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub covered: Option<f32>,
    /// The reply head's gate: a reply the rules and the n-gram layer pass is embedded for the head when
    /// the n-gram layer's score (1 − p(none)) is at least this, when it speaks of harm, or when its
    /// language is one no rule covers (chosen out of fold on the tuning replies, within a bound on how
    /// many ordinary replies are embedded; absent for the input head).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<f32>,
}

/// The vector head: standardised embedding → [`HIDDEN`] rectified units → softmax over the classes.
#[derive(Clone, Debug)]
pub struct VectorHead {
    pub header: VectorHeader,
    /// Per dimension of the embedding: its mean on the tuning lines, and one over its spread.
    mean: Vec<f32>,
    inv_sd: Vec<f32>,
    /// `DIM × HIDDEN`, row per embedding dimension.
    w1: Vec<f32>,
    b1: Vec<f32>,
    /// `HIDDEN × classes`, row per hidden unit.
    w2: Vec<f32>,
    b2: Vec<f32>,
}

/// A vector head's weights, as the trainer fits them.
#[derive(Clone, Debug, Default)]
pub struct VectorWeights {
    pub mean: Vec<f32>,
    pub inv_sd: Vec<f32>,
    pub w1: Vec<f32>,
    pub b1: Vec<f32>,
    pub w2: Vec<f32>,
    pub b2: Vec<f32>,
}

impl VectorHead {
    /// A head from its header and weights, checked for shape.
    pub fn new(header: VectorHeader, w: VectorWeights) -> Result<Self, ModelError> {
        let n = header.classes.len();
        let shapes = [
            (w.mean.len(), DIM),
            (w.inv_sd.len(), DIM),
            (w.w1.len(), DIM * HIDDEN),
            (w.b1.len(), HIDDEN),
            (w.w2.len(), HIDDEN * n),
            (w.b2.len(), n),
        ];
        if n < 2 || header.classes[0] != "none" || shapes.iter().any(|(a, b)| a != b) {
            return Err(ModelError(
                "vector head: classes and weights do not agree".into(),
            ));
        }
        Ok(Self {
            header,
            mean: w.mean,
            inv_sd: w.inv_sd,
            w1: w.w1,
            b1: w.b1,
            w2: w.w2,
            b2: w.b2,
        })
    }

    /// The file's bytes: magic, header length (u32 LE), header JSON, then the weights as f32 LE in the
    /// order of [`VectorWeights`].
    #[cfg(any(test, feature = "testing"))]
    pub fn to_bytes(&self) -> Vec<u8> {
        let header = serde_json::to_vec(&self.header).unwrap_or_default();
        let mut out = Vec::new();
        out.extend_from_slice(VECTOR_MAGIC);
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        for part in [
            &self.mean,
            &self.inv_sd,
            &self.w1,
            &self.b1,
            &self.w2,
            &self.b2,
        ] {
            out.extend(part.iter().flat_map(|x| x.to_le_bytes()));
        }
        out
    }

    /// Reads a vector head's file.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Result<Self, ModelError> {
        let err = |m: &str| ModelError(format!("vector head: {m}"));
        if bytes.len() < 8 || &bytes[..4] != VECTOR_MAGIC {
            return Err(err("not a CSV1 file"));
        }
        let len = u32::from_le_bytes(bytes[4..8].try_into().map_err(|_| err("short"))?) as usize;
        let header: VectorHeader =
            serde_json::from_slice(bytes.get(8..8 + len).ok_or(err("short"))?)
                .map_err(|e| err(&e.to_string()))?;
        let n = header.classes.len();
        let mut rest = bytes.get(8 + len..).ok_or(err("short"))?;
        let mut take = |count: usize| -> Result<Vec<f32>, ModelError> {
            let part = rest.get(..count * 4).ok_or(err("short"))?;
            rest = &rest[count * 4..];
            Ok(part
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect())
        };
        let w = VectorWeights {
            mean: take(DIM)?,
            inv_sd: take(DIM)?,
            w1: take(DIM * HIDDEN)?,
            b1: take(HIDDEN)?,
            w2: take(HIDDEN * n)?,
            b2: take(n)?,
        };
        if !rest.is_empty() {
            return Err(err("trailing bytes"));
        }
        Self::new(header, w)
    }

    /// Each class's probability for the embedding `v` (of [`DIM`]).
    pub(crate) fn probabilities(&self, v: &[f32]) -> Vec<f32> {
        let mut hidden = self.b1.clone();
        for (i, x) in v.iter().enumerate().take(DIM) {
            let z = (x - self.mean[i]) * self.inv_sd[i];
            for (h, w) in hidden
                .iter_mut()
                .zip(&self.w1[i * HIDDEN..(i + 1) * HIDDEN])
            {
                *h += z * w;
            }
        }
        let n = self.b2.len();
        let mut logits = self.b2.clone();
        for (j, h) in hidden.iter().enumerate() {
            let h = h.max(0.0);
            for (l, w) in logits.iter_mut().zip(&self.w2[j * n..(j + 1) * n]) {
                *l += h * w;
            }
        }
        softmax(&logits)
    }

    /// The class the embedding is flagged for (never `none`; none below the threshold) and its score,
    /// 1 − p(none). None for a vector of another width. The screen asks at its own threshold
    /// ([`Self::verdict_at`]); this is for the tests and the dev tooling.
    #[cfg(any(test, feature = "testing"))]
    pub fn verdict(&self, v: &[f32]) -> (Option<&str>, f32) {
        self.verdict_at(v, self.header.threshold)
    }

    /// [`Self::verdict`] at another threshold.
    pub(crate) fn verdict_at(&self, v: &[f32], threshold: f32) -> (Option<&str>, f32) {
        if v.len() != DIM {
            return (None, 0.0);
        }
        let p = self.probabilities(v);
        let score = 1.0 - p[0];
        let class = (score >= threshold)
            .then(|| (1..p.len()).max_by(|a, b| p[*a].total_cmp(&p[*b])))
            .flatten()
            .map(|i| self.header.classes[i].as_str());
        (class, score)
    }
}

/// Softmax of `z`.
pub fn softmax(z: &[f32]) -> Vec<f32> {
    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = z.iter().map(|v| (v - max).exp()).collect();
    let sum: f32 = e.iter().sum();
    e.into_iter().map(|v| v / sum).collect()
}

/// Whether the input model reads the vectors of the encoder named `encoder` (none: no encoder loaded);
/// says why not when it does not (the crisis screen is then weaker: its learned layer reads the
/// n-grams only and only confirms an unsure rule).
pub(crate) fn fits(encoder: Option<&str>) -> bool {
    let Some(model) = INPUT.as_ref() else {
        return false;
    };
    match encoder {
        Some(e) if e == model.header.encoder() => true,
        Some(e) => {
            tracing::warn!(
                trained_on = model.header.encoder(),
                encoder = e,
                "the crisis screen's learned layer was trained on another encoder's vectors: it reads \
                 the messages' n-grams only (a weaker screen) until `companion-dev safety-train` \
                 trains it on this encoder's"
            );
            false
        }
        None => false,
    }
}

/// The compiled-in model of user messages (`none`, then the crisis categories).
pub static INPUT: LazyLock<Option<Model>> =
    LazyLock::new(|| load("input", include_bytes!("screen-input.bin")));
/// The compiled-in model of companion replies (`none`, `encouragement`, `sexual`).
pub static OUTPUT: LazyLock<Option<Model>> =
    LazyLock::new(|| load("output", include_bytes!("screen-output.bin")));

/// The compiled-in vector head of user messages.
pub static VECTOR: LazyLock<Option<VectorHead>> = LazyLock::new(|| {
    load_head(
        include_bytes!("screen-input-vector.bin"),
        "the crisis screen's vector head cannot be read; messages in languages no rule covers are screened by the n-grams alone",
    )
});

/// The compiled-in vector head of companion replies (`none`, `encouragement`, `sexual`), asked behind
/// its gate ([`VectorHeader::gate`]).
pub static OUTPUT_VECTOR: LazyLock<Option<VectorHead>> = LazyLock::new(|| {
    load_head(
        include_bytes!("screen-output-vector.bin"),
        "the output check's vector head cannot be read; replies are checked by the rules and the n-grams alone",
    )
});

/// A compiled-in head, or none, logged with what its absence costs.
fn load_head(bytes: &[u8], without: &'static str) -> Option<VectorHead> {
    VectorHead::from_bytes(bytes)
        .inspect_err(|e| tracing::error!(error = %e, "{without}"))
        .ok()
}

fn load(which: &str, bytes: &[u8]) -> Option<Model> {
    match Model::from_bytes(bytes) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::error!(which, error = %e, "the learned safety layer cannot be read; the rules alone screen");
            None
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn features_are_unit_length_and_stable() {
        let a = features("i don't see the point anymore", None);
        let b = features("I  DON'T see the point anymore", None);
        assert_eq!(a.buckets, b.buckets);
        let norm = a.buckets.len() as f32 * a.weight * a.weight;
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        assert!(features("", None).buckets.len() <= 1);
        assert!(features("もう消えたい", None).buckets.len() > 5);
    }

    #[test]
    fn a_model_round_trips_through_its_file() {
        let header = Header {
            classes: vec!["none".into(), "self_harm".into()],
            threshold: 0.5,
            trained_on: "test".into(),
            note: String::new(),
            veto: None,
            context_free: Vec::new(),
            encoder: None,
        };
        let x = features("want to disappear forever", None);
        let mut w = vec![vec![0f32; WIDTH], vec![0f32; WIDTH]];
        for b in &x.buckets {
            w[1][*b as usize] = 3.0;
        }
        let m = Model::quantise(header.clone(), &w, vec![0.0, -1.0]);
        let back = Model::from_bytes(&m.to_bytes()).unwrap();
        assert_eq!(back.header, header);
        let (class, score) = back.decide(&x).unwrap();
        assert_eq!(class, "self_harm");
        assert!(score > 0.5);
        assert!(back.decide(&features("sick kickflip", None)).is_none());
        assert!(Model::from_bytes(b"nope").is_err());
    }

    /// A vector head that flags every vector as `self_harm`, sure of it.
    pub(crate) fn alarmed_head() -> VectorHead {
        let header = VectorHeader {
            classes: vec!["none".into(), "self_harm".into()],
            threshold: 0.9,
            encoder: "multilingual-e5-small".into(),
            trained_on: "test".into(),
            note: String::new(),
            covered: None,
            gate: None,
        };
        let w = VectorWeights {
            mean: vec![0.0; DIM],
            inv_sd: vec![1.0; DIM],
            w1: vec![0.0; DIM * HIDDEN],
            b1: vec![0.0; HIDDEN],
            w2: vec![0.0; HIDDEN * 2],
            b2: vec![-5.0, 5.0],
        };
        VectorHead::new(header, w).unwrap()
    }

    #[test]
    fn a_vector_head_round_trips_through_its_file_and_reads_only_its_width() {
        let head = alarmed_head();
        let back = VectorHead::from_bytes(&head.to_bytes()).unwrap();
        assert_eq!(back.header, head.header);
        let v = vec![0.05f32; DIM];
        let (class, score) = back.verdict(&v);
        assert_eq!(class, Some("self_harm"));
        assert!(score > 0.99, "{score}");
        assert_eq!(back.verdict(&v[..10]), (None, 0.0));
        // A weight learned on one dimension moves only that dimension's score.
        let mut w = VectorWeights {
            mean: vec![0.0; DIM],
            inv_sd: vec![1.0; DIM],
            w1: vec![0.0; DIM * HIDDEN],
            b1: vec![0.0; HIDDEN],
            w2: vec![0.0; HIDDEN * 2],
            b2: vec![0.0, -4.0],
        };
        w.w1[7 * HIDDEN] = 10.0;
        w.w2[1] = 1.0;
        let head = VectorHead::new(head.header.clone(), w).unwrap();
        let mut calm = vec![0f32; DIM];
        assert!(head.verdict(&calm).0.is_none());
        calm[7] = 1.0;
        assert_eq!(head.verdict(&calm).0, Some("self_harm"));
        let mut bytes = back.to_bytes();
        bytes.pop();
        assert!(VectorHead::from_bytes(&bytes).is_err());
        assert!(VectorHead::from_bytes(b"CSV1").is_err());
    }

    #[test]
    fn the_compiled_in_models_load() {
        let vector = VECTOR.as_ref().expect("the vector head loads");
        assert_eq!(vector.header.classes[0], "none");
        assert_eq!(vector.header.encoder, "multilingual-e5-small");
        let input = INPUT.as_ref().expect("the input model loads");
        assert_eq!(input.header.classes[0], "none");
        let output = OUTPUT.as_ref().expect("the output model loads");
        assert_eq!(output.header.classes[0], "none");
    }
}
