//! The embedder computes what sentence-transformers computes: both graphs checked against fp32 reference
//! embeddings of all-MiniLM-L6-v2, one text at a time and as one padded batch, and batching of
//! concurrent requests is visible in the counters.

use companion::rag::embed::{DIM, cosine};
use serde::Deserialize;

#[derive(Deserialize)]
struct Line {
    text: String,
    embedding: Vec<f32>,
}

fn fixture() -> Vec<Line> {
    let text = include_str!("../fixtures/embeddings-public.jsonl");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("fixture line"))
        .collect()
}

/// The fp32 graph computes the reference (float32 against a float64 pass, 6 decimals).
const FP32_MIN_COSINE: f32 = 0.9999;
/// The int8 graph, the worker's default, on every line.
const INT8_MIN_COSINE: f32 = 0.995;

/// Checks one graph against the reference, one text at a time and as one padded batch; returns the
/// smallest cosines (single, batched).
async fn parity(model_file: &str, min: f32) -> (f32, f32) {
    let lines = fixture();
    assert!(lines.len() >= 20);
    let mut cfg = crate::env::embed_config();
    cfg.model_file = model_file.into();
    let embedder = crate::env::embedder_with(&cfg);
    let mut worst = (1.0f32, String::new());
    for l in &lines {
        let v = embedder.embed_one(&l.text).await.unwrap();
        assert_eq!(v.len(), DIM);
        let c = cosine(&v, &l.embedding);
        if c < worst.0 {
            worst = (c, l.text.clone());
        }
        assert!(c >= min, "{model_file} single: cosine {c} for {:?}", l.text);
    }
    let batch = embedder
        .embed(lines.iter().map(|l| l.text.clone()).collect())
        .await
        .unwrap();
    let mut worst_batch = 1.0f32;
    for (v, l) in batch.iter().zip(&lines) {
        let c = cosine(v, &l.embedding);
        worst_batch = worst_batch.min(c);
        assert!(
            c >= min,
            "{model_file} batched: cosine {c} for {:?}",
            l.text
        );
    }
    println!(
        "parity {model_file}: min cosine single {:.5} ({:?}), batched {worst_batch:.5}",
        worst.0, worst.1
    );
    (worst.0, worst_batch)
}

#[tokio::test]
async fn the_fp32_graph_matches_the_reference_one_at_a_time_and_batched() {
    parity("model.onnx", FP32_MIN_COSINE).await;
}

#[tokio::test]
async fn the_int8_graph_stays_within_0_995_of_the_reference_on_every_line() {
    let (single, batched) = parity("model-int8.onnx", INT8_MIN_COSINE).await;
    // It is a different computation, not the fp32 one under another name.
    assert!(single < 0.9999 || batched < 0.9999);
}

#[tokio::test]
async fn concurrent_requests_share_model_runs() {
    let mut cfg = crate::env::embed_config();
    // A long window so every request of the burst lands in the same batch.
    cfg.window = std::time::Duration::from_millis(300);
    cfg.max_batch = 64;
    let embedder = crate::env::embedder_with(&cfg);
    let before = embedder.counts();
    let texts: Vec<String> = (0..16)
        .map(|i| format!("how do I carve turn number {i} on my snowboard?"))
        .collect();
    let results = futures::future::join_all(texts.iter().map(|t| embedder.embed_one(t))).await;
    for r in &results {
        assert_eq!(r.as_ref().unwrap().len(), DIM);
    }
    let after = embedder.counts();
    assert_eq!(after.requests - before.requests, 16);
    assert_eq!(after.texts - before.texts, 16);
    let runs = after.model_runs - before.model_runs;
    assert!(runs < 16, "16 concurrent requests took {runs} model runs");
    // Batched results equal the single ones (the int8 graph quantises each run's activations as one
    // tensor, so its vectors move slightly with their batch mates).
    let alone = embedder.embed_one(&texts[3]).await.unwrap();
    let c = cosine(&alone, results[3].as_ref().unwrap());
    let min = if cfg.model_file == "model.onnx" {
        FP32_MIN_COSINE
    } else {
        INT8_MIN_COSINE
    };
    assert!(c >= min, "alone vs batched: {c}");
    let mut fp32 = cfg.clone();
    fp32.model_file = "model.onnx".into();
    let exact = crate::env::embedder_with(&fp32);
    let batch = exact.embed(texts.clone()).await.unwrap();
    let alone = exact.embed_one(&texts[3]).await.unwrap();
    assert!(cosine(&alone, &batch[3]) > FP32_MIN_COSINE);
}
