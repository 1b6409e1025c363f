//! `companion-dev parity`: how closely one embedding graph follows another on text the int8 graph's
//! calibration never saw. Two figures, both against the reference graph's own vectors:
//!
//! - **Cosine** of each held-out text's vector (`tests/fixtures/heldout/parity.jsonl`: chat messages,
//!   questions, other topics, Japanese, Spanish, Portuguese, French and German lines, paragraphs of 200
//!   to 400 WordPiece tokens, which the embedder truncates at 256), embedded one at a time and as one
//!   batch (the embedder sorts a batch by length and pads each run to its longest text; the int8 graph
//!   quantises a run's activations as one tensor, so batch mates move its vectors slightly).
//! - **Retrieval agreement**: the demo knowledge (`deploy/local/knowledge`) chunked as `companion ingest`
//!   chunks it and embedded by each graph, then each held-out query (`tests/fixtures/heldout/queries.txt`,
//!   embedded one at a time, as a turn does) ranks the chunks by cosine. A query agrees when both graphs
//!   give the same set of top-k chunk ids; top-1 agreement and the mean overlap of the two top-k sets are
//!   reported too, and the agreement of what a turn would put in the prompt (top-k above the threshold).
//!
//! The calibration text of `deploy/local/quantize_model.py` must not contain any of these lines:
//! [`calibration_texts`] reads the same sources, and the integration test checks they are disjoint.

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::Context;
use companion_knowledge::rag::{
    ChunkConfig, EmbedConfig, EmbedError, Embedder, MAX_TOKENS, chunk_article, cosine,
    count_tokens, read_articles,
};
use serde::Deserialize;

/// The held-out texts, relative to the repository root.
pub const HELDOUT: &str = "tests/fixtures/heldout/parity.jsonl";
/// The held-out retrieval queries.
pub const QUERIES: &str = "tests/fixtures/heldout/queries.txt";
/// The demo knowledge the queries rank.
pub const KNOWLEDGE: &str = "deploy/local/knowledge";
/// The public parity fixture (fp32 reference vectors); also kept out of calibration.
pub const PUBLIC_FIXTURE: &str = "tests/fixtures/embeddings-public.jsonl";

/// `companion-dev parity` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct ParityArgs {
    /// The graph under test, in `--model-dir`.
    #[arg(long, default_value = "model-int8.onnx")]
    pub model: String,
    /// The graph it is compared with (the fp32 graph equals the sentence-transformers reference).
    #[arg(long, default_value = "model.onnx")]
    pub reference: String,
    /// Folder holding both graphs and `tokenizer.json`.
    #[arg(long, env = "COMPANION_MODEL_DIR", default_value = ".local/models")]
    pub model_dir: PathBuf,
    /// ONNX Runtime 1.31 shared library.
    #[arg(
        long,
        env = "ORT_DYLIB_PATH",
        default_value = ".local/models/libonnxruntime.so.1.31.1"
    )]
    pub ort_dylib_path: PathBuf,
    /// Held-out texts (JSON lines with `text` and `kind`).
    #[arg(long, default_value = HELDOUT)]
    pub texts: PathBuf,
    /// Held-out queries, one per line.
    #[arg(long, default_value = QUERIES)]
    pub queries: PathBuf,
    /// Knowledge folder the queries rank (chunked as `companion ingest` does).
    #[arg(long, default_value = KNOWLEDGE)]
    pub knowledge: PathBuf,
    /// Chunks compared per query.
    #[arg(long, default_value_t = 3)]
    pub top_k: usize,
    /// The turn's similarity threshold, for the agreement of what enters the prompt.
    #[arg(long, default_value_t = 0.45)]
    pub threshold: f32,
    /// Queries whose top-k sets differ, printed at most.
    #[arg(long, default_value_t = 10)]
    pub show: usize,
}

/// One held-out text.
#[derive(Clone, Debug, Deserialize)]
pub struct HeldOut {
    pub text: String,
    /// `chat`, `question`, `other-topic`, `ja`, `es`, `pt`, `other-language` or `paragraph`.
    pub kind: String,
}

/// Reads the held-out texts.
pub fn read_heldout(path: &Path) -> anyhow::Result<Vec<HeldOut>> {
    crate::jsonl::read(path)
}

/// Reads the queries (one per non-empty line).
pub fn read_queries(path: &Path) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

/// The texts `deploy/local/quantize_model.py` calibrates on, read as it reads them: every
/// non-comment line of `deploy/local/calibration/*.txt`, the knowledge articles' paragraphs (after the
/// front matter; not README.md) and the seed data's `content`, `text`, `description` and `name` strings
/// of 10+ characters.
pub fn calibration_texts(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut texts = Vec::new();
    let local = root.join("deploy/local");
    for path in sorted_files(&local.join("calibration"), &["txt"])? {
        let body = std::fs::read_to_string(&path)?;
        texts.extend(
            body.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned),
        );
    }
    let mut articles = Vec::new();
    collect_files(&local.join("knowledge"), &["md"], &mut articles)?;
    articles.retain(|p| p.file_name().is_some_and(|n| n != "README.md"));
    articles.sort();
    for path in articles {
        let body = std::fs::read_to_string(&path)?;
        let body = body.split_once("\n---\n").map_or(body.as_str(), |(_, b)| b);
        texts.extend(
            body.split("\n\n")
                .map(str::trim)
                .filter(|p| p.chars().count() > 20)
                .map(str::to_owned),
        );
    }
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    match x.as_str() {
                        Some(s)
                            if matches!(
                                k.as_str(),
                                "content" | "text" | "description" | "name"
                            ) && s.chars().count() >= 10 =>
                        {
                            out.push(s.to_owned())
                        }
                        _ => walk(x, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    for path in sorted_files(&local.join("seed"), &["json"])? {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
            .with_context(|| format!("parsing {}", path.display()))?;
        walk(&v, &mut texts);
    }
    Ok(texts)
}

fn sorted_files(dir: &Path, ext: &[&str]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    if dir.is_dir() {
        for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let p = e?.path();
            if p.is_file()
                && p.extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| ext.contains(&e))
            {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn collect_files(dir: &Path, ext: &[&str], out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() {
            collect_files(&p, ext, out)?;
        } else if p
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| ext.contains(&e))
        {
            out.push(p);
        }
    }
    Ok(())
}

/// Lower case, whitespace collapsed: what "the same text" means for the disjointness check.
pub fn normalize(text: &str) -> String {
    text.split_whitespace()
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Held-out texts that calibration also contains: equal after [`normalize`], or one inside the other
/// (when the inner one has 24 bytes or more). Empty when the sets are disjoint.
pub fn overlaps(heldout: &[String], calibration: &[String]) -> Vec<(String, String)> {
    let calibration: Vec<String> = calibration.iter().map(|c| normalize(c)).collect();
    let exact: HashSet<&str> = calibration.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    for h in heldout {
        let n = normalize(h);
        if exact.contains(n.as_str()) {
            out.push((h.clone(), n.clone()));
            continue;
        }
        if let Some(c) = calibration.iter().find(|c| {
            (n.len() >= 24 && c.contains(n.as_str())) || (c.len() >= 24 && n.contains(c.as_str()))
        }) {
            out.push((h.clone(), c.clone()));
        }
    }
    out
}

/// The smallest cosine of a pass and the text it was on.
#[derive(Clone, Debug)]
pub struct Worst {
    pub cosine: f32,
    pub kind: String,
    pub text: String,
}

/// Cosines of one graph's vectors to the reference's over the held-out texts.
#[derive(Clone, Debug)]
pub struct TextParity {
    pub texts: usize,
    /// Each text embedded alone.
    pub single: Worst,
    /// All texts in one call (batched by the embedder).
    pub batched: Worst,
    pub mean_single: f64,
    pub mean_batched: f64,
    /// Per kind: texts, smallest and mean cosine (single).
    pub by_kind: BTreeMap<String, (usize, f32, f64)>,
    /// Texts longer than the model's 256 tokens (truncated, as the embedder does).
    pub truncated: usize,
}

/// Compares `model` with `reference` on `lines`: the reference one text at a time, the model one at a
/// time and as one batch.
pub async fn text_parity(
    model: &Embedder,
    reference: &Embedder,
    lines: &[HeldOut],
) -> Result<TextParity, EmbedError> {
    let texts: Vec<String> = lines.iter().map(|l| l.text.clone()).collect();
    let mut exact = Vec::with_capacity(texts.len());
    let mut single = Vec::with_capacity(texts.len());
    for t in &texts {
        exact.push(
            reference
                .embed_one(companion_knowledge::rag::Role::Query, t)
                .await?,
        );
        single.push(
            model
                .embed_one(companion_knowledge::rag::Role::Query, t)
                .await?,
        );
    }
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let batched = model
        .embed(companion_knowledge::rag::Role::Query, &refs)
        .await?;
    let mut truncated = 0;
    for t in &texts {
        if count_tokens(reference.tokenizer(), t)? + 2 > MAX_TOKENS {
            truncated += 1;
        }
    }
    let cos = |vs: &[Vec<f32>]| -> Vec<f32> {
        vs.iter().zip(&exact).map(|(v, e)| cosine(v, e)).collect()
    };
    let (cs, cb) = (cos(&single), cos(&batched));
    let worst = |cs: &[f32]| {
        let (i, &c) = cs
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1))
            .expect("texts");
        Worst {
            cosine: c,
            kind: lines[i].kind.clone(),
            text: lines[i].text.clone(),
        }
    };
    let mean = |cs: &[f32]| cs.iter().map(|&c| f64::from(c)).sum::<f64>() / cs.len() as f64;
    let mut by_kind: BTreeMap<String, (usize, f32, f64)> = BTreeMap::new();
    for (l, &c) in lines.iter().zip(&cs) {
        let e = by_kind.entry(l.kind.clone()).or_insert((0, 1.0, 0.0));
        e.0 += 1;
        e.1 = e.1.min(c);
        e.2 += f64::from(c);
    }
    for e in by_kind.values_mut() {
        e.2 /= e.0 as f64;
    }
    Ok(TextParity {
        texts: lines.len(),
        single: worst(&cs),
        batched: worst(&cb),
        mean_single: mean(&cs),
        mean_batched: mean(&cb),
        by_kind,
        truncated,
    })
}

/// A knowledge chunk: `collection/key#ord` and the text `companion ingest` embeds for it.
#[derive(Clone, Debug)]
pub struct Chunk {
    pub id: String,
    pub input: String,
}

/// The knowledge in `dir`, chunked as `companion ingest` chunks it (default chunk settings: 256
/// tokens, 15 % overlap, the title prefixed).
pub fn knowledge_chunks(embedder: &Embedder, dir: &Path) -> anyhow::Result<Vec<Chunk>> {
    let articles = read_articles(dir, None)?;
    let mut out = Vec::new();
    for a in &articles {
        let (_, inputs) = chunk_article(embedder, a, ChunkConfig::default())?;
        for (ord, input) in inputs.into_iter().enumerate() {
            out.push(Chunk {
                id: format!("{}/{}#{ord}", a.collection, a.key),
                input,
            });
        }
    }
    anyhow::ensure!(!out.is_empty(), "{}: no articles", dir.display());
    Ok(out)
}

/// A query whose top-k chunks differ between the graphs.
#[derive(Clone, Debug)]
pub struct Disagreement {
    pub query: String,
    pub model: Vec<String>,
    pub reference: Vec<String>,
}

/// How often the graphs retrieve the same chunks.
#[derive(Clone, Debug)]
pub struct Agreement {
    pub queries: usize,
    pub chunks: usize,
    pub k: usize,
    /// Queries with the same best chunk.
    pub top1: usize,
    /// Queries with the same set of top-k chunks.
    pub topk: usize,
    /// Mean of |model's top-k ∩ reference's top-k| / k.
    pub mean_overlap: f64,
    pub threshold: f32,
    /// Queries whose top-k chunks at or above the threshold (what a turn puts in the prompt) are the
    /// same set.
    pub prompt: usize,
    /// Queries with at least one chunk at or above the threshold (reference graph).
    pub with_knowledge: usize,
    pub disagreements: Vec<Disagreement>,
    /// Queries embedded one at a time per second, model and reference (wall time, this process).
    pub model_per_second: f64,
    pub reference_per_second: f64,
}

impl Agreement {
    pub fn top1_share(&self) -> f64 {
        self.top1 as f64 / self.queries as f64
    }

    pub fn topk_share(&self) -> f64 {
        self.topk as f64 / self.queries as f64
    }
}

/// The chunks ranked for `q` (best first, ties by position), with their scores.
fn ranked(q: &[f32], chunks: &[Vec<f32>]) -> Vec<(usize, f32)> {
    let mut r: Vec<(usize, f32)> = chunks
        .iter()
        .enumerate()
        .map(|(i, c)| (i, cosine(q, c)))
        .collect();
    r.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    r
}

/// Ranks the chunks for every query with each graph's vectors (chunks embedded as one batch, as ingest
/// does; queries one at a time, as a turn does) and counts the agreements.
pub async fn retrieval_agreement(
    model: &Embedder,
    reference: &Embedder,
    chunks: &[Chunk],
    queries: &[String],
    k: usize,
    threshold: f32,
) -> Result<Agreement, EmbedError> {
    let inputs: Vec<&str> = chunks.iter().map(|c| c.input.as_str()).collect();
    let model_chunks = model
        .embed(companion_knowledge::rag::Role::Passage, &inputs)
        .await?;
    let reference_chunks = reference
        .embed(companion_knowledge::rag::Role::Passage, &inputs)
        .await?;
    let (model_queries, model_secs) = embed_queries(model, queries).await?;
    let (reference_queries, reference_secs) = embed_queries(reference, queries).await?;
    let k = k.clamp(1, chunks.len());
    let mut a = Agreement {
        queries: queries.len(),
        chunks: chunks.len(),
        k,
        top1: 0,
        topk: 0,
        mean_overlap: 0.0,
        threshold,
        prompt: 0,
        with_knowledge: 0,
        disagreements: Vec::new(),
        model_per_second: queries.len() as f64 / model_secs.max(1e-9),
        reference_per_second: queries.len() as f64 / reference_secs.max(1e-9),
    };
    let mut overlap = 0usize;
    for ((q, mv), rv) in queries.iter().zip(&model_queries).zip(&reference_queries) {
        let m = ranked(mv, &model_chunks);
        let r = ranked(rv, &reference_chunks);
        let mset: HashSet<usize> = m[..k].iter().map(|x| x.0).collect();
        let rset: HashSet<usize> = r[..k].iter().map(|x| x.0).collect();
        if m[0].0 == r[0].0 {
            a.top1 += 1;
        }
        overlap += mset.intersection(&rset).count();
        if mset == rset {
            a.topk += 1;
        } else {
            let ids = |x: &[(usize, f32)]| {
                x[..k]
                    .iter()
                    .map(|&(i, s)| format!("{} {s:.3}", chunks[i].id))
                    .collect()
            };
            a.disagreements.push(Disagreement {
                query: q.clone(),
                model: ids(&m),
                reference: ids(&r),
            });
        }
        let above = |x: &[(usize, f32)]| -> HashSet<usize> {
            x[..k]
                .iter()
                .filter(|&&(_, s)| s >= threshold)
                .map(|&(i, _)| i)
                .collect()
        };
        let (ma, ra) = (above(&m), above(&r));
        if !ra.is_empty() {
            a.with_knowledge += 1;
        }
        if ma == ra {
            a.prompt += 1;
        }
    }
    a.mean_overlap = overlap as f64 / (k * queries.len()).max(1) as f64;
    Ok(a)
}

/// Each query embedded one at a time, as a turn does, and the seconds that took.
async fn embed_queries(
    embedder: &Embedder,
    queries: &[String],
) -> Result<(Vec<Vec<f32>>, f64), EmbedError> {
    let started = Instant::now();
    let mut vectors = Vec::with_capacity(queries.len());
    for q in queries {
        vectors.push(
            embedder
                .embed_one(companion_knowledge::rag::Role::Query, q)
                .await?,
        );
    }
    Ok((vectors, started.elapsed().as_secs_f64()))
}

fn short(text: &str, max: usize) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        format!("{}…", one_line.chars().take(max).collect::<String>())
    }
}

/// The lines `companion-dev parity` prints for the text figures.
pub fn text_lines(p: &TextParity) -> Vec<String> {
    let mut out = vec![
        format!(
            "held-out texts: {} ({} longer than {MAX_TOKENS} tokens, truncated)",
            p.texts, p.truncated
        ),
        format!(
            "  min cosine single  {:.5}  [{}] {:?}",
            p.single.cosine,
            p.single.kind,
            short(&p.single.text, 70)
        ),
        format!(
            "  min cosine batched {:.5}  [{}] {:?}",
            p.batched.cosine,
            p.batched.kind,
            short(&p.batched.text, 70)
        ),
        format!(
            "  mean cosine single {:.5}, batched {:.5}",
            p.mean_single, p.mean_batched
        ),
    ];
    let kinds: Vec<String> = p
        .by_kind
        .iter()
        .map(|(k, (n, min, mean))| format!("{k} {n}: min {min:.5} mean {mean:.5}"))
        .collect();
    out.push(format!("  by kind (single): {}", kinds.join("; ")));
    out
}

/// The lines `companion-dev parity` prints for retrieval agreement.
pub fn agreement_lines(a: &Agreement, show: usize) -> Vec<String> {
    let pct = |n: usize| 100.0 * n as f64 / a.queries.max(1) as f64;
    let mut out = vec![
        format!(
            "retrieval agreement: {} queries, {} knowledge chunks, top {}",
            a.queries, a.chunks, a.k
        ),
        format!(
            "  top-1 {}/{} ({:.2} %), top-{} set {}/{} ({:.2} %), mean overlap {:.4}",
            a.top1,
            a.queries,
            pct(a.top1),
            a.k,
            a.topk,
            a.queries,
            pct(a.topk),
            a.mean_overlap
        ),
        format!(
            "  prompt (top {} at cosine >= {}): same chunks for {}/{} ({:.2} %); {} queries get knowledge",
            a.k,
            a.threshold,
            a.prompt,
            a.queries,
            pct(a.prompt),
            a.with_knowledge
        ),
    ];
    for d in a.disagreements.iter().take(show) {
        out.push(format!(
            "  differs: {:?}\n    model     {}\n    reference {}",
            short(&d.query, 70),
            d.model.join(", "),
            d.reference.join(", ")
        ));
    }
    out
}

/// `companion-dev parity`: loads both graphs and prints the figures. A report: it succeeds whatever
/// they are.
pub async fn measure(args: &ParityArgs) -> anyhow::Result<()> {
    let load = |file: &str| {
        let cfg = EmbedConfig {
            model_dir: args.model_dir.clone(),
            encoder: companion_knowledge::rag::Encoder::MINILM,
            model_file: file.to_owned(),
            ort_dylib_path: args.ort_dylib_path.clone(),
            threads: 1,
            max_batch: 32,
            window: std::time::Duration::ZERO,
        };
        Embedder::load(&cfg).with_context(|| format!("loading {}", cfg.model_path().display()))
    };
    let model = load(&args.model)?;
    let reference = load(&args.reference)?;
    println!(
        "parity of {} against {} ({})",
        args.model,
        args.reference,
        args.model_dir.display()
    );
    let lines = read_heldout(&args.texts)?;
    anyhow::ensure!(!lines.is_empty(), "{}: no texts", args.texts.display());
    let p = text_parity(&model, &reference, &lines).await?;
    for l in text_lines(&p) {
        println!("{l}");
    }
    let queries = read_queries(&args.queries)?;
    anyhow::ensure!(
        !queries.is_empty(),
        "{}: no queries",
        args.queries.display()
    );
    let chunks = knowledge_chunks(&reference, &args.knowledge)?;
    let a = retrieval_agreement(
        &model,
        &reference,
        &chunks,
        &queries,
        args.top_k,
        args.threshold,
    )
    .await?;
    for l in agreement_lines(&a, args.show) {
        println!("{l}");
    }
    println!(
        "queries one at a time: {:.0}/s model, {:.0}/s reference (wall time, one intra-op thread)",
        a.model_per_second, a.reference_per_second
    );
    Ok(())
}
