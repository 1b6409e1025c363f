//! Graceful shutdown of a real `companion worker` process: SIGTERM stops pulling, lets the in-flight turn
//! finish within the grace period and exits 0; a turn that outlives the grace period goes back to the
//! stream and is answered once by the next worker.

use std::time::Duration;

use crate::env::*;
use companion_dev::stub::{StubReply, always};

#[tokio::test]
async fn sigterm_finishes_the_turn_in_flight_and_exits_zero() {
    let env = TestEnv::new(always(StubReply::Delayed(
        Duration::from_secs(2),
        Box::new(StubReply::text("made it")),
    )))
    .await;
    let mut worker = env.spawn_app_process(&[("COMPANION_SHUTDOWN_GRACE_SECS", "10")]);
    let event = env.dm(JESS, KAORI, JESS_KAORI, "quick question").await;
    let mut replies = env.completions(JESS_KAORI).await;
    env.publish(&event).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            !env.stub.requests().is_empty()
        })
        .await,
        "turn started"
    );
    sigterm(&worker);
    let reply = next_reply_to(&mut replies, &event.message_id, Duration::from_secs(10)).await;
    assert_eq!(reply.content, "made it");
    let status = wait_exit(&mut worker, Duration::from_secs(15)).await;
    assert!(status.success(), "exit status {status:?}");
    assert_eq!(env.replies_to(&event.message_id).await.len(), 1);
    env.finish().await;
}

#[tokio::test]
async fn a_turn_longer_than_the_grace_period_is_returned_and_answered_once_by_the_next_worker() {
    let env = TestEnv::new(always(StubReply::Delayed(
        Duration::from_secs(4),
        Box::new(StubReply::text("slow but sure")),
    )))
    .await;
    let mut first = env.spawn_app_process(&[("COMPANION_SHUTDOWN_GRACE_SECS", "1")]);
    let event = env.dm(JESS, KAORI, JESS_KAORI, "take your time").await;
    let mut replies = env.completions(JESS_KAORI).await;
    env.publish(&event).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            !env.stub.requests().is_empty()
        })
        .await,
        "turn started"
    );
    sigterm(&first);
    let status = wait_exit(&mut first, Duration::from_secs(10)).await;
    assert!(status.success(), "exit status {status:?}");
    assert!(
        env.replies_to(&event.message_id).await.is_empty(),
        "the cut-off turn wrote nothing"
    );

    let mut second = env.spawn_app_process(&[]);
    let reply = next_reply_to(&mut replies, &event.message_id, Duration::from_secs(30)).await;
    assert_eq!(reply.content, "slow but sure");
    assert_eq!(env.replies_to(&event.message_id).await.len(), 1);
    sigterm(&second);
    assert!(
        wait_exit(&mut second, Duration::from_secs(15))
            .await
            .success()
    );
    env.finish().await;
}
