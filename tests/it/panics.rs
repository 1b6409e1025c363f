//! A panic inside a job is caught at its delivery's boundary and settles like a failure: NAK with delay,
//! redelivery, then the dead letter (and for a user's message the character's failure line, once); the
//! progress acks stop and the conversation's next message is not held behind it. Faults are injected
//! with `companion_core::fault`, which exists only in test builds.

use std::time::Duration;

use companion_core::fault;
use companion_dev::stub::{StubReply, always};

use crate::env::*;

const ANSWER: &str = "kickflips take a while, keep at it";

#[tokio::test]
async fn a_turn_that_panics_every_time_is_dead_lettered_with_the_failure_line_once_and_the_next_message_goes_on()
 {
    // One reply per message: the next message is not answered together with the panicking one.
    let env = TestEnv::with(always(StubReply::text(ANSWER)), |c| c.turn.burst_max = 0).await;
    let mut replies = env.completions(JESS_KAORI).await;
    let worker = env.spawn_app().await;
    let bad = env.dm(JESS, KAORI, JESS_KAORI, "this one breaks").await;
    fault::panic_at(&bad.message_id, "llm", u32::MAX);
    env.publish(&bad).await;
    let next = env
        .dm(JESS, KAORI, JESS_KAORI, "and how long for a kickflip")
        .await;
    env.publish(&next).await;

    let line = next_reply_to(&mut replies, &bad.message_id, Duration::from_secs(60)).await;
    assert_eq!(line.content, failure_line("kaori"));
    let answer = next_reply_to(&mut replies, &next.message_id, Duration::from_secs(60)).await;
    assert_eq!(answer.content, ANSWER, "the next message is answered");
    let record = env.settled(&next.message_id).await;
    assert_eq!(record.attempts, 1, "the next message ran once");

    assert!(
        eventually(Duration::from_secs(10), || async {
            env.dead_letters().await.len() == 1
        })
        .await,
        "the panicking message is dead-lettered"
    );
    let (reason, payload) = &env.dead_letters().await[0];
    assert!(
        String::from_utf8_lossy(payload).contains(&bad.message_id),
        "the dead letter is the panicking message"
    );
    assert!(reason.contains("panicked at step llm:0"), "{reason}");
    let bad_record = env.journal().get(&bad.message_id).await.unwrap().unwrap();
    assert!(
        bad_record
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("panicked at step llm:0")),
        "the journal names the step: {bad_record:?}"
    );
    assert_eq!(
        worker.metric("companion_panics_total{kind=\"turn\"}").await,
        Some(3.0),
        "each of the 3 deliveries panicked, and was settled"
    );
    assert_eq!(
        env.replies_to(&bad.message_id).await.len(),
        1,
        "the failure line once"
    );
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_turn_that_panics_once_is_answered_on_its_redelivery() {
    let env = TestEnv::new(always(StubReply::text(ANSWER))).await;
    let mut replies = env.completions(JESS_KAORI).await;
    let worker = env.spawn_app().await;
    let e = env.dm(JESS, KAORI, JESS_KAORI, "first try breaks").await;
    fault::panic_at(&e.message_id, "llm", 1);
    env.publish(&e).await;
    let reply = next_reply_to(&mut replies, &e.message_id, Duration::from_secs(60)).await;
    assert_eq!(reply.content, ANSWER);
    let record = env.settled(&e.message_id).await;
    assert_eq!(record.attempts, 2, "{record:?}");
    assert_eq!(env.replies_to(&e.message_id).await.len(), 1);
    assert_eq!(
        worker.metric("companion_panics_total{kind=\"turn\"}").await,
        Some(1.0)
    );
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_signal_that_panics_every_time_is_dead_lettered_without_a_failure_line() {
    let env = TestEnv::new(always(StubReply::text("⏰ wax your board!"))).await;
    let worker = env.spawn_app().await;
    let id = env.due_reminder("wax your board").await;
    fault::panic_at(&format!("reminder:{id}"), "reply", u32::MAX);
    let body = serde_json::json!({"reminderId": id, "fireAt": chrono::Utc::now()});
    env.publish_raw(
        env.bus.names.reminder_due(&id),
        &format!("due-{id}"),
        body.to_string(),
    )
    .await;
    assert!(
        eventually(Duration::from_secs(60), || async {
            env.dead_letters().await.len() == 1
        })
        .await,
        "the panicking signal is dead-lettered"
    );
    let panics = worker
        .metric("companion_panics_total{kind=\"signal\"}")
        .await;
    assert!(
        panics.is_some_and(|n| n >= 2.0),
        "retried first: {panics:?}"
    );
    // The dead letter is written after the last attempt's settlement, so nothing else will come.
    let said = env
        .mongo
        .collection("dm_messages")
        .count_documents(bson::doc! { "conversationId": oid(JESS_KAORI), "senderId": KAORI })
        .await
        .unwrap();
    assert_eq!(said, 0, "no failure line for a signal");
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn the_message_and_crisis_counters_move_once_after_the_commit_when_an_attempt_is_retried() {
    const CRISIS: &str = "honestly i just want to die, i don't see the point anymore";
    let env = TestEnv::new(always(StubReply::text(ANSWER))).await;
    let mut replies = env.completions(JESS_KAORI).await;
    let worker = env.spawn_app().await;
    let e = env.dm(JESS, KAORI, JESS_KAORI, CRISIS).await;
    // The first attempt screens the message and runs the crisis step's body, then dies before its
    // transaction commits: nothing of it counts.
    fault::panic_at(&e.message_id, "commit:crisis", 1);
    env.publish(&e).await;
    let reply = next_reply_to(&mut replies, &e.message_id, Duration::from_secs(60)).await;
    let record = env.settled(&e.message_id).await;
    assert_eq!(record.attempts, 2, "one attempt retried: {record:?}");
    assert!(!reply.content.is_empty());
    assert_eq!(
        worker.metric("companion_panics_total{kind=\"turn\"}").await,
        Some(1.0)
    );
    let flags = worker
        .metric("companion_crisis_flags_total{category=\"self_harm\",lang=\"en\",layer=\"rules\"}")
        .await;
    assert_eq!(flags, Some(1.0), "the flag once, after its commit");
    assert_eq!(
        worker
            .metric("companion_user_messages_total{kind=\"dm\"}")
            .await,
        Some(1.0),
        "the message once, not per attempt"
    );
    // A later message moves it once more.
    let later = env
        .dm(JESS, KAORI, JESS_KAORI, "thanks for being here")
        .await;
    env.publish(&later).await;
    next_reply_to(&mut replies, &later.message_id, Duration::from_secs(60)).await;
    env.settled(&later.message_id).await;
    assert_eq!(
        worker
            .metric("companion_user_messages_total{kind=\"dm\"}")
            .await,
        Some(2.0)
    );
    worker.stop().await;
    env.finish().await;
}
