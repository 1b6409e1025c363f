//! Nothing lost when workers keep dying: an event whose deliveries run out because every worker that
//! took it was killed (`kill -9`, so it never NAKed) is dead-lettered and answered once, honestly.

mod common;

use std::{process::Command, time::Duration};

use common::*;
use companion::llm::stub::{StubReply, always};
use serde_json::Value;

fn kill9(child: &mut std::process::Child) {
    let _ = Command::new("kill")
        .args(["-KILL", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

#[tokio::test]
async fn an_event_that_outlives_its_deliveries_is_dead_lettered_and_answered_once() {
    // The model never answers in time: every worker that takes the event is killed mid-turn.
    let hang = always(StubReply::Delayed(
        Duration::from_secs(120),
        Box::new(StubReply::text("too late")),
    ));
    let env = TestEnv::with(hang, |c| {
        c.max_deliver = 2;
        c.ack_wait_secs = 2;
    })
    .await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "this one is cursed").await;
    let mut replies = env.completions(JESS_KAORI).await;

    let mut first = env.spawn_worker_process(&[]);
    env.publish(&event).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            env.stub.requests().len() == 1
        })
        .await,
        "delivery 1"
    );
    kill9(&mut first);
    let mut second = env.spawn_worker_process(&[]);
    assert!(
        eventually(Duration::from_secs(20), || async {
            env.stub.requests().len() == 2
        })
        .await,
        "delivery 2"
    );
    kill9(&mut second);

    let mut survivor = env.spawn_worker_process(&[]);
    let reply = next_reply_to(&mut replies, &event.message_id, Duration::from_secs(30)).await;
    let kaori: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("characters/kaori.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(reply.content, kaori["failureLine"].as_str().unwrap());
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
    let _ = Command::new("kill")
        .args(["-TERM", &survivor.id().to_string()])
        .status();
    let _ = survivor.wait();
    env.finish().await;
}
