//! Nothing lost when workers keep dying: an event whose deliveries run out because every worker that
//! took it was killed (`kill -9`, so it never NAKed) is dead-lettered and answered once, honestly.

use std::time::Duration;

use crate::env::*;
use companion_dev::stub::{StubReply, always};
use serde_json::Value;

#[tokio::test]
async fn an_event_that_outlives_its_deliveries_is_dead_lettered_and_answered_once() {
    // The model never answers in time: every worker that takes the event is killed mid-turn.
    let hang = always(StubReply::Delayed(
        Duration::from_secs(120),
        Box::new(StubReply::text("too late")),
    ));
    let env = TestEnv::with(hang, |c| {
        c.consumer.max_deliver = 2;
        c.consumer.ack_wait_secs = 2;
    })
    .await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "this one is cursed").await;
    let mut replies = env.completions(JESS_KAORI).await;

    let mut first = env.spawn_app_process(&[]);
    env.publish(&event).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            env.stub.requests().len() == 1
        })
        .await,
        "delivery 1"
    );
    kill9(&mut first);
    let mut second = env.spawn_app_process(&[]);
    assert!(
        eventually(Duration::from_secs(20), || async {
            env.stub.requests().len() == 2
        })
        .await,
        "delivery 2"
    );
    kill9(&mut second);

    let mut survivor = env.spawn_app_process(&[]);
    let reply = next_reply_to(&mut replies, &event.message_id, Duration::from_secs(30)).await;
    assert_eq!(reply.content, failure_line("kaori"));
    assert!(
        eventually(Duration::from_secs(10), || async {
            env.dead_letters().await.len() == 1
        })
        .await
    );
    let dead = env.dead_letters().await;
    assert!(dead[0].0.contains("2 deliveries"), "{:?}", dead[0].0);
    assert_eq!(
        env.replies_to(&event.message_id).await.len(),
        1,
        "answered once"
    );
    assert_eq!(env.stub.requests().len(), 2, "no third delivery");
    stop(&mut survivor);
    env.finish().await;
}

#[tokio::test]
async fn a_worker_killed_after_a_write_tool_ran_leaves_one_tricklist_and_one_reply() {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };
    // Step 0 creates a list; the first step-1 request hangs (the worker is killed meanwhile), later ones answer.
    let step1 = Arc::new(AtomicUsize::new(0));
    let s1 = step1.clone();
    let responder: companion_dev::stub::Responder = Arc::new(move |body: &Value| {
        let last = last_message(body);
        if last["role"] == "user" {
            StubReply::tool(
                "create_tricklist",
                serde_json::json!({"name": "Crash Park", "tricks": ["Kickflip", "50-50"], "category": "skateboard"}),
            )
        } else if s1.fetch_add(1, Ordering::SeqCst) == 0 {
            StubReply::Delayed(
                Duration::from_secs(120),
                Box::new(StubReply::text("too late")),
            )
        } else {
            StubReply::text("Crash Park is ready 🔥")
        }
    });
    let env = TestEnv::with(responder, |c| c.consumer.ack_wait_secs = 2).await;
    let event = env
        .dm(
            JESS,
            KAORI,
            JESS_KAORI,
            "make me a park list with kickflip and 50-50",
        )
        .await;
    let mut replies = env.completions(JESS_KAORI).await;
    let mut first = env.spawn_app_process(&[]);
    env.publish(&event).await;
    let lists = || async {
        env.mongo
            .collection("tricklists")
            .count_documents(bson::doc! { "name": "Crash Park" })
            .await
            .unwrap()
    };
    assert!(
        eventually(Duration::from_secs(20), || async { lists().await == 1 }).await,
        "the write tool ran"
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            step1.load(Ordering::SeqCst) == 1
        })
        .await
    );
    kill9(&mut first);

    let mut second = env.spawn_app_process(&[]);
    let reply = next_reply_to(&mut replies, &event.message_id, Duration::from_secs(30)).await;
    assert_eq!(reply.content, "Crash Park is ready 🔥");
    assert_eq!(
        reply.rich_content.as_ref().unwrap()["type"],
        "tricklist_card"
    );
    assert_eq!(lists().await, 1, "exactly one tricklist");
    assert_eq!(
        env.replies_to(&event.message_id).await.len(),
        1,
        "exactly one reply"
    );
    // step 0 once (replayed from the journal after the crash), step 1 twice (the killed attempt, the retry)
    assert_eq!(env.stub.requests().len(), 3);
    stop(&mut second);
    env.finish().await;
}
