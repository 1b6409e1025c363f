//! Durable turns: a turn retried after a write tool ran replays the journaled model responses, so the
//! same tool call runs again (a no-op for its keyed write) and no paid call is repeated.

mod common;

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use bson::doc;
use common::*;
use companion::{
    llm::stub::{Responder, StubReply},
    turn::{self, Outcome},
};
use serde_json::{Value, json};

#[tokio::test]
async fn a_turn_retried_after_a_write_creates_one_tricklist_and_pays_each_step_once() {
    // Step 0 always asks to create a list (with a fresh call id each time it is asked); step 1 fails once.
    let failures = Arc::new(AtomicUsize::new(0));
    let f = failures.clone();
    let responder: Responder = Arc::new(move |body: &Value| {
        let last = last_message(body);
        if last["role"] == "user" {
            StubReply::tool(
                "create_tricklist",
                json!({"name": "Retry Park", "tricks": ["Kickflip", "Ollie"], "category": "skateboard"}),
            )
        } else if f.fetch_add(1, Ordering::SeqCst) == 0 {
            StubReply::Status {
                code: 500,
                body: "upstream hiccup".into(),
                retry_after: None,
            }
        } else {
            StubReply::text("your Retry Park list is ready!")
        }
    });
    let env = TestEnv::with(responder, |c| c.llm_max_retries = 0).await;
    let svc = env.services().await;
    let raw = env
        .dm(
            JESS,
            KAORI,
            JESS_KAORI,
            "make me a park list with kickflip and ollie",
        )
        .await;
    let event = dm_event(&raw);
    let first = turn::run(&svc, &event).await;
    assert!(
        first.is_err(),
        "the first attempt fails after the write: {first:?}"
    );
    let second = turn::run(&svc, &event).await.expect("the retry completes");
    assert!(matches!(second, Outcome::Answered { .. }));

    let lists = env
        .mongo
        .collection("tricklists")
        .count_documents(doc! { "name": "Retry Park" })
        .await
        .unwrap();
    assert_eq!(lists, 1, "exactly one tricklist");
    // attempt 1: step 0 + failed step 1; attempt 2: step 1 only (step 0 replayed from the journal)
    assert_eq!(env.stub.requests().len(), 3);
    let replies = env.replies_to(&raw.message_id).await;
    assert_eq!(replies.len(), 1);
    assert_eq!(
        replies[0].get_str("content").unwrap(),
        "your Retry Park list is ready!"
    );
    assert_eq!(
        replies[0]
            .get_document("richContent")
            .unwrap()
            .get_str("type")
            .unwrap(),
        "tricklist_card"
    );
    let writes: i64 = sqlx::query_scalar("SELECT count(*) FROM tool_writes")
        .fetch_one(&env.pg.pool)
        .await
        .unwrap();
    assert_eq!(writes, 1, "the write quota counted the write once");
    env.finish().await;
}
