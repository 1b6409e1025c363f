//! The write quota holds across worker processes: two `companion worker` processes answer twelve
//! "make me a list" turns of one user at once (in four conversations, since one conversation's messages
//! are handled one at a time), and exactly five tricklists are written.

use std::{sync::Arc, time::Duration};

use crate::env::*;
use bson::doc;
use companion_dev::stub::{Responder, StubReply};
use serde_json::{Value, json};

#[tokio::test]
async fn two_worker_processes_write_exactly_five_tricklists_for_one_user() {
    // Every first call creates a list named after the user's message; the answer after it is plain text.
    let responder: Responder = Arc::new(|body: &Value| {
        let last = last_message(body);
        if last["role"] == "user" {
            let name = last["content"].as_str().unwrap_or("list").to_owned();
            StubReply::tool(
                "create_tricklist",
                json!({"name": name, "tricks": ["Ollie"], "category": "skateboard"}),
            )
        } else {
            StubReply::Delayed(
                Duration::from_millis(50),
                Box::new(StubReply::text("done (or not)")),
            )
        }
    });
    // Every message its own turn (no bursts, no flood limit): twelve turns that race for the quota.
    let env = TestEnv::with(responder, |c| {
        c.worker.concurrency = 6;
        c.turn.burst_max = 0;
        c.turn.user_turns_per_minute = 0;
    })
    .await;
    let mut workers = [env.spawn_app_process(&[]), env.spawn_app_process(&[])];
    let mut replies = env.all_completions().await;
    let mut conversations = Vec::new();
    for bot in [KAORI, TONY, RICO, ZOE] {
        conversations.push((bot, env.conversation(JESS, bot).await));
    }
    let mut events = Vec::new();
    for i in 0..12 {
        let (bot, conversation) = &conversations[i % conversations.len()];
        events.push(
            env.dm(JESS, bot, conversation, &format!("quota list {i}"))
                .await,
        );
    }
    for e in &events {
        env.publish(e).await;
    }
    let mut waiting: std::collections::HashSet<String> =
        events.iter().map(|e| e.message_id.clone()).collect();
    let all = tokio::time::timeout(Duration::from_secs(60), async {
        while !waiting.is_empty() {
            let c = futures::StreamExt::next(&mut replies)
                .await
                .expect("completions");
            waiting.remove(c.in_reply_to.as_deref().unwrap_or_default());
        }
    })
    .await;
    assert!(all.is_ok(), "every turn answered");
    let lists = env
        .mongo
        .collection("tricklists")
        .count_documents(doc! { "name": { "$regex": "^quota list " } })
        .await
        .unwrap();
    assert_eq!(lists, 5, "exactly five writes in the rolling hour");
    let refused: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM job_steps
         WHERE name = 'tool' AND output ->> 'tool' = 'create_tricklist' AND output ->> 'ok' = 'false'",
    )
    .fetch_one(&env.pg.pool)
    .await
    .unwrap();
    assert_eq!(refused, 7, "the other seven calls got an error result");
    for w in &mut workers {
        stop(w);
    }
    env.finish().await;
}
