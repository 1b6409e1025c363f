//! The worker's own per-turn timings: a real turn with one tool round shows up in the stage histograms
//! of `/metrics` (every stage it went through, the model wait, the overhead and the MongoDB wait), and
//! MongoDB commands are attributed to the turn that sent them.

use crate::env::*;
use companion_core::timing::{self, Stage};
use companion_dev::stub::{StubReply, scripted};
use serde_json::json;

/// `companion_turn_stage_seconds_count{stage="…"}` in a metrics text.
fn stage_count(metrics: &str, stage: &str) -> Option<u64> {
    let key = format!("companion_turn_stage_seconds_count{{stage=\"{stage}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn a_tool_turn_reports_its_stages_on_metrics() {
    let env = TestEnv::new(scripted(
        vec![StubReply::tool(
            "search_trickipedia",
            json!({"query": "kickflip"}),
        )],
        StubReply::text("flick it!"),
    ))
    .await;
    let worker = env.spawn_app().await;

    let event = env.dm(JESS, KAORI, JESS_KAORI, "how do I kickflip?").await;
    let reply = env.turn(&event).await;
    assert_eq!(reply.content, "flick it!");

    // The turn's timings are reported after its ack: wait for them.
    eventually(std::time::Duration::from_secs(10), || async {
        stage_count(&worker.metrics().await, "overhead") == Some(1)
    })
    .await;
    let metrics = worker.metrics().await;
    assert_eq!(stage_count(&metrics, "overhead"), Some(1), "{metrics}");
    for stage in [
        "parse", "admit", "journal", "context", "embed", "retrieve", "prompt", "llm", "steps",
        "tools", "writes", "publish", "ack", "mongo",
    ] {
        assert_eq!(stage_count(&metrics, stage), Some(1), "{stage}: {metrics}");
    }
    // The embedder ran one model run of one text for this turn's retrieval.
    assert!(
        metrics.contains("companion_embed_batch_size_bucket{le=\"1\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("companion_embed_batch_size_count 1"),
        "{metrics}"
    );

    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn mongodb_commands_count_for_the_turn_that_sent_them() {
    let env = TestEnv::new(scripted(Vec::new(), StubReply::text("-"))).await;
    let t = timing::scope(async {
        env.mongo.user_profile(oid(JESS)).await.unwrap().unwrap();
        timing::stage(Stage::Context, env.mongo.user_tricklists(oid(JESS), 10))
            .await
            .unwrap();
        timing::snapshot().unwrap()
    })
    .await;
    // user_profile: one find; tricklists: the lists, then the trick names.
    assert_eq!(t.mongo_commands, 3, "{t:?}");
    assert!(t.mongo_ms > 0.0 && t.mongo_ms <= t.total_ms, "{t:?}");
    assert!(t.stage_ms(Stage::Context) > 0.0);
    // Outside a turn nothing is attributed.
    env.mongo.user_profile(oid(JESS)).await.unwrap();
    assert!(timing::snapshot().is_none());
    env.finish().await;
}

/// A turn with one tool round reads the app's data in one round trip: the admission aggregate (the
/// conversation, the profile and the tricklists together), the tool's query, the reply and the
/// conversation's touch; trick names come once, then from the cache.
#[tokio::test]
async fn a_tool_turn_sends_four_mongodb_commands_once_trick_names_are_cached() {
    // Every turn: one tool round, then text.
    let env = TestEnv::new(std::sync::Arc::new(|body: &serde_json::Value| {
        if last_message(body)["role"] == "tool" {
            StubReply::text("flick it!")
        } else {
            StubReply::tool("search_trickipedia", json!({"query": "kickflip"}))
        }
    }))
    .await;
    let c = env.spawn_app().await;
    let mut commands = Vec::new();
    for text in ["how do I kickflip?", "and a heelflip?"] {
        let event = dm_event(&env.dm(JESS, KAORI, JESS_KAORI, text).await);
        let t = timing::scope(async {
            c.pipeline.process_dm(&event).await.expect("the turn");
            timing::snapshot().unwrap()
        })
        .await;
        commands.push(t.mongo_commands);
    }
    // admission 1 + trick names 1 (first turn only) + search 1 + reply 1 + touch 1
    assert_eq!(commands, [5, 4], "MongoDB commands per turn");
    env.finish().await;
}
