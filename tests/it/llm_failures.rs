//! The chat API failing: retries with backoff inside the turn honouring `Retry-After`, and fallback models
//! (also for OpenRouter's "no endpoints that support tool use" 404).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use crate::env::*;
use companion_dev::stub::{Responder, StubReply, scripted};
use serde_json::Value;

#[tokio::test]
async fn a_500_then_a_429_with_retry_after_then_success_is_one_reply_in_one_delivery() {
    let times = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let script = scripted(
        vec![
            StubReply::Status {
                code: 500,
                body: "boom".into(),
                retry_after: None,
            },
            StubReply::Status {
                code: 429,
                body: "slow down".into(),
                retry_after: Some(1),
            },
        ],
        StubReply::text("third time lucky"),
    );
    let t = times.clone();
    let responder: Responder = Arc::new(move |body: &Value| {
        t.lock().unwrap().push(Instant::now());
        script(body)
    });
    let env = TestEnv::with(responder, |c| {
        c.llm.max_retries = 2;
        c.llm.retry_base_ms = 10;
    })
    .await;
    env.spawn_app().await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "hello?").await;
    let reply = env.turn(&event).await;
    assert_eq!(reply.content, "third time lucky");
    assert_eq!(env.stub.requests().len(), 3);
    let times = times.lock().unwrap().clone();
    assert!(
        times[2] - times[1] >= Duration::from_millis(950),
        "Retry-After: 1 was honoured: {:?}",
        times[2] - times[1]
    );
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM jobs WHERE id = $1")
        .bind(&event.message_id)
        .fetch_one(&env.pg.pool)
        .await
        .unwrap();
    assert_eq!(attempts, 1, "retried inside the turn, not redelivered");
    assert_eq!(env.replies_to(&event.message_id).await.len(), 1);
    env.finish().await;
}

#[tokio::test]
async fn a_model_without_tool_support_falls_back_to_the_next_model() {
    let responder: Responder = Arc::new(|body: &Value| {
        match body["model"].as_str() {
        Some("primary/no-tools") => StubReply::Status {
            code: 404,
            body: r#"{"error":{"message":"No endpoints found that support tool use. To learn more about provider routing, visit: https://openrouter.ai/docs/provider-routing","code":404}}"#.into(),
            retry_after: None,
        },
        _ => StubReply::text("fallback here!"),
    }
    });
    let env = TestEnv::with(responder, |c| {
        c.llm.model = "primary/no-tools".into();
        c.llm.fallback_models = vec!["backup/model".into()];
    })
    .await;
    env.spawn_app().await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "make me a list").await;
    let reply = env.turn(&event).await;
    assert_eq!(reply.content, "fallback here!");
    let models: Vec<String> = env
        .stub
        .requests()
        .iter()
        .map(|r| r["model"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(models, vec!["primary/no-tools", "backup/model"]);
    env.finish().await;
}

#[tokio::test]
async fn an_outage_of_every_model_ends_in_the_failure_line_after_the_last_delivery() {
    let responder: Responder = Arc::new(|_: &Value| StubReply::Status {
        code: 503,
        body: "down".into(),
        retry_after: None,
    });
    let env = TestEnv::with(responder, |c| {
        c.llm.max_retries = 1;
        c.llm.retry_base_ms = 10;
        c.llm.fallback_models = vec!["backup/model".into()];
        c.consumer.max_deliver = 2;
    })
    .await;
    env.spawn_app().await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "anyone?").await;
    let reply = env.turn(&event).await;
    assert!(
        reply.content.contains("glitching"),
        "Kaori's honest failure line: {}",
        reply.content
    );
    // 2 deliveries × 2 models × (1 try + 1 retry)
    assert_eq!(env.stub.requests().len(), 8);
    assert!(
        eventually(Duration::from_secs(10), || async {
            env.dead_letters().await.len() == 1
        })
        .await
    );
    assert_eq!(
        env.replies_to(&event.message_id).await.len(),
        1,
        "the failure line is sent once"
    );
    env.finish().await;
}

#[tokio::test]
async fn a_moderation_refusal_is_answered_honestly_once_without_the_reason() {
    // OpenRouter's 403: the prompt was flagged. Permanent for this turn: no retry, no fallback model.
    let refuse = companion_dev::stub::always(StubReply::Status {
        code: 403,
        body: r#"{"error":{"code":403,"message":"Your input was flagged","metadata":{"reasons":["violence"]}}}"#
            .into(),
        retry_after: None,
    });
    let env = TestEnv::with(refuse, |c| {
        c.llm.fallback_models = vec!["other/model".into()];
    })
    .await;
    env.spawn_app().await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "something flagged").await;
    let reply = env.turn(&event).await;
    assert_eq!(reply.content, failure_line("kaori"));
    assert!(!reply.content.contains("flagged"));
    assert_eq!(
        env.stub.requests().len(),
        1,
        "asked once: no retry, no fallback"
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            env.dead_letters().await.len() == 1
        })
        .await
    );
    let dead = env.dead_letters().await;
    assert!(
        dead[0].0.contains("403") && dead[0].0.contains("flagged"),
        "{}",
        dead[0].0
    );
    assert_eq!(env.replies_to(&event.message_id).await.len(), 1);
    env.finish().await;
}
