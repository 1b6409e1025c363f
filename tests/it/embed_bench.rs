//! Throughput and memory figures of the embedder (ignored by default; run with
//! `cargo test --release --test embed_bench -- --ignored --nocapture`).

use std::time::Instant;

fn sentences() -> Vec<String> {
    let fixture = include_str!("../fixtures/embeddings-public.jsonl");
    let base: Vec<String> = fixture
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["text"].as_str().map(str::to_owned))
        .filter(|t| t.len() < 200)
        .collect();
    (0..256)
        .map(|i| format!("{} #{i}", base[i % base.len()]))
        .collect()
}

fn rss_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn throughput_and_memory() {
    let texts = sentences();
    let embedder = crate::env::embedder();
    embedder
        .embed_one(companion_knowledge::rag::Role::Query, "warm up")
        .await
        .unwrap();
    println!("after load: VmRSS {} kB", rss_kb("VmRSS:"));

    let t = Instant::now();
    for s in &texts[..64] {
        embedder
            .embed_one(companion_knowledge::rag::Role::Query, s)
            .await
            .unwrap();
    }
    let single = 64.0 / t.elapsed().as_secs_f64();

    let t = Instant::now();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    embedder
        .embed(companion_knowledge::rag::Role::Query, &refs)
        .await
        .unwrap();
    let batched = texts.len() as f64 / t.elapsed().as_secs_f64();

    let before = embedder.counts();
    let t = Instant::now();
    let futures = texts
        .iter()
        .map(|s| embedder.embed_one(companion_knowledge::rag::Role::Query, s));
    futures::future::join_all(futures).await;
    let concurrent = texts.len() as f64 / t.elapsed().as_secs_f64();
    let after = embedder.counts();

    println!(
        "one at a time: {single:.0} sentences/s; one batched call: {batched:.0} sentences/s; \
         {} concurrent single requests: {concurrent:.0} sentences/s in {} model runs",
        texts.len(),
        after.model_runs - before.model_runs
    );
    println!(
        "VmRSS {} kB, VmHWM (peak) {} kB",
        rss_kb("VmRSS:"),
        rss_kb("VmHWM:")
    );
}
