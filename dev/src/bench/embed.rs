//! Embedding throughput in this process, on the fixture sentences: one text at a time (each call waits
//! for its vector), one call with many texts (batched), and many concurrent single-text calls (what
//! concurrent turns do; the embedder batches them).
//!
//! "Chat-length" is the fixture's lines under 200 characters: 20 chat messages and short statements of
//! 30–81 characters (about 9–21 tokens). The full fixture adds four long texts (276–1361 characters, up to
//! the model's 256 tokens).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use serde::Serialize;

use super::BenchError;
use companion_knowledge::rag::{EmbedConfig, Embedder};

/// Texts per batched call and per burst of concurrent calls.
const BATCH_TEXTS: usize = 256;

/// Throughput on one set of texts, sentences per second.
#[derive(Clone, Debug, Serialize)]
pub struct SetFigures {
    pub name: String,
    pub texts: usize,
    pub mean_tokens: f64,
    pub max_tokens: usize,
    pub one_at_a_time: f64,
    pub batched: f64,
    pub concurrent: f64,
    /// Sentences per CPU second of this process (all threads) in the batched measurement: what the
    /// model costs regardless of what else runs on the machine.
    pub batched_per_cpu_second: f64,
}

/// The embedding figures of a run.
#[derive(Clone, Debug, Serialize)]
pub struct EmbedFigures {
    pub model: String,
    pub threads: usize,
    pub max_batch: usize,
    pub window_ms: u64,
    /// Seconds spent on each measurement.
    pub seconds_each: f64,
    pub chat: SetFigures,
    pub full: SetFigures,
    /// Resident memory of this process after loading the model and after the measurements, MB.
    pub rss_after_load_mb: f64,
    pub rss_after_mb: f64,
}

/// The fixture's texts (`{"text": …}` per line).
pub fn fixture_texts(path: &Path) -> Result<Vec<String>, BenchError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| BenchError::Setup(format!("{}: {e}", path.display())))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["text"].as_str().map(str::to_owned))
        .collect())
}

/// Measures the embedder loaded from `cfg` on the fixture at `path`, `secs` per measurement.
pub async fn measure(
    cfg: &EmbedConfig,
    path: &Path,
    secs: f64,
) -> Result<EmbedFigures, BenchError> {
    let all = fixture_texts(path)?;
    let chat: Vec<String> = all.iter().filter(|t| t.len() < 200).cloned().collect();
    if chat.is_empty() {
        return Err(BenchError::Setup(format!(
            "{}: no fixture texts",
            path.display()
        )));
    }
    let embedder =
        Embedder::load(cfg).map_err(|e| BenchError::Setup(format!("embedding model: {e}")))?;
    let all_refs: Vec<&str> = all.iter().map(String::as_str).collect();
    embedder
        .embed(companion_knowledge::rag::Role::Query, &all_refs)
        .await
        .map_err(|e| BenchError::Setup(e.to_string()))?;
    let rss_after_load_mb = rss_mb();
    let per = Duration::from_secs_f64(secs.max(0.5));
    let chat = measure_set(&embedder, "chat-length (fixture <200 chars)", &chat, per).await?;
    let full = measure_set(&embedder, "full fixture", &all, per).await?;
    Ok(EmbedFigures {
        model: cfg.model_path().display().to_string(),
        threads: cfg.threads,
        max_batch: cfg.max_batch,
        window_ms: cfg.window.as_millis() as u64,
        seconds_each: per.as_secs_f64(),
        chat,
        full,
        rss_after_load_mb,
        rss_after_mb: rss_mb(),
    })
}

async fn measure_set(
    embedder: &Embedder,
    name: &str,
    texts: &[String],
    per: Duration,
) -> Result<SetFigures, BenchError> {
    let tokens: Vec<usize> = texts
        .iter()
        .map(|t| {
            embedder
                .tokenizer()
                .encode(t.as_str())
                .map(|ids| ids.len())
                .unwrap_or(0)
        })
        .collect();
    let err = |e: companion_knowledge::rag::EmbedError| BenchError::Setup(e.to_string());
    let many: Vec<String> = texts.iter().cycle().take(BATCH_TEXTS).cloned().collect();

    let started = Instant::now();
    let mut n = 0usize;
    while started.elapsed() < per {
        for t in texts {
            embedder
                .embed_one(companion_knowledge::rag::Role::Query, t)
                .await
                .map_err(err)?;
            n += 1;
        }
    }
    let one_at_a_time = n as f64 / started.elapsed().as_secs_f64();

    let tck = super::procs::clock_ticks_per_second();
    let cpu = || super::procs::cpu_ticks(std::process::id()).unwrap_or(0);
    let (started, cpu0) = (Instant::now(), cpu());
    let mut n = 0usize;
    while started.elapsed() < per {
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        n += embedder
            .embed(companion_knowledge::rag::Role::Query, &refs)
            .await
            .map_err(err)?
            .len();
    }
    let batched = n as f64 / started.elapsed().as_secs_f64();
    let batched_per_cpu_second = n as f64 / ((cpu() - cpu0).max(1) as f64 / tck);

    let started = Instant::now();
    let mut n = 0usize;
    while started.elapsed() < per {
        let results = futures::future::join_all(
            many.iter()
                .map(|t| embedder.embed_one(companion_knowledge::rag::Role::Query, t)),
        )
        .await;
        for r in results {
            r.map_err(err)?;
            n += 1;
        }
    }
    let concurrent = n as f64 / started.elapsed().as_secs_f64();

    Ok(SetFigures {
        name: name.to_owned(),
        texts: texts.len(),
        mean_tokens: tokens.iter().sum::<usize>() as f64 / tokens.len().max(1) as f64,
        max_tokens: tokens.iter().copied().max().unwrap_or(0),
        one_at_a_time,
        batched,
        concurrent,
        batched_per_cpu_second,
    })
}

fn rss_mb() -> f64 {
    super::procs::sample(std::process::id())
        .map(|s| s.rss_kb as f64 / 1024.0)
        .unwrap_or(0.0)
}
