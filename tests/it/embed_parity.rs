//! The embedder computes what sentence-transformers computes: checked against fp32 reference
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

const MIN_COSINE: f32 = 0.995;

#[tokio::test]
async fn matches_reference_one_at_a_time_and_batched() {
    let lines = fixture();
    assert!(lines.len() >= 20);
    let embedder = crate::env::embedder();
    let mut worst = (1.0f32, String::new());
    for l in &lines {
        let v = embedder.embed_one(&l.text).await.unwrap();
        assert_eq!(v.len(), DIM);
        let c = cosine(&v, &l.embedding);
        if c < worst.0 {
            worst = (c, l.text.clone());
        }
        assert!(c >= MIN_COSINE, "single: cosine {c} for {:?}", l.text);
    }
    let batch = embedder
        .embed(lines.iter().map(|l| l.text.clone()).collect())
        .await
        .unwrap();
    let mut worst_batch = 1.0f32;
    for (v, l) in batch.iter().zip(&lines) {
        let c = cosine(v, &l.embedding);
        worst_batch = worst_batch.min(c);
        assert!(c >= MIN_COSINE, "batched: cosine {c} for {:?}", l.text);
    }
    println!(
        "parity: min cosine single {:.5} ({:?}), batched {worst_batch:.5}",
        worst.0, worst.1
    );
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
    // Batched results equal the single ones.
    let alone = embedder.embed_one(&texts[3]).await.unwrap();
    assert!(cosine(&alone, results[3].as_ref().unwrap()) > 0.9999);
}
