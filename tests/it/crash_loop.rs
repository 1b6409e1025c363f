//! Nothing lost when workers keep dying: an event whose deliveries run out because every worker that
//! took it was killed (`kill -9`, so it never NAKed) is dead-lettered and answered once, honestly, even
//! when no worker runs at the moment it runs out.

use std::time::Duration;

use crate::env::*;
use companion_dev::stub::{StubReply, always};
use companion_store::bus::event::{Completion, InboundEvent};
use serde_json::Value;

/// A stack whose model never answers in time and whose consumer gives an event `max_deliver`
/// deliveries of 2 s each, a DM to answer, and the stream of its conversation's completions.
async fn hanging(
    max_deliver: i64,
) -> (
    TestEnv,
    InboundEvent,
    impl futures::Stream<Item = Completion> + Unpin,
) {
    let hang = always(StubReply::Delayed(
        Duration::from_secs(120),
        Box::new(StubReply::text("too late")),
    ));
    let env = TestEnv::with(hang, |c| {
        c.consumer.max_deliver = max_deliver;
        c.consumer.ack_wait_secs = 2;
    })
    .await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "this one is cursed").await;
    let replies = env.completions(JESS_KAORI).await;
    (env, event, replies)
}

/// Starts a worker process and kills it (`kill -9`) once it has asked the model for delivery `n`.
async fn killed_at_delivery(env: &TestEnv, n: usize) {
    let mut worker = env.spawn_app_process(&[]);
    assert!(
        eventually(Duration::from_secs(20), || async {
            env.stub.requests().len() == n
        })
        .await,
        "delivery {n}"
    );
    kill9(&mut worker);
}

/// With a worker running, `event` gets the failure line once and one dead letter that says it had
/// `deliveries` deliveries, and the model was asked once per delivery.
async fn answered_honestly_once(
    env: &TestEnv,
    replies: &mut (impl futures::Stream<Item = Completion> + Unpin),
    event: &InboundEvent,
    deliveries: usize,
) {
    let reply = next_reply_to(replies, &event.message_id, Duration::from_secs(30)).await;
    assert_eq!(reply.content, failure_line("kaori"));
    assert!(
        eventually(Duration::from_secs(10), || async {
            env.dead_letters().await.len() == 1
        })
        .await
    );
    let dead = env.dead_letters().await;
    assert!(
        dead[0].0.contains(&format!("{deliveries} deliveries")),
        "{:?}",
        dead[0].0
    );
    assert_eq!(
        env.replies_to(&event.message_id).await.len(),
        1,
        "answered once"
    );
    assert_eq!(
        env.stub.requests().len(),
        deliveries,
        "never delivered again"
    );
}

#[tokio::test]
async fn an_event_that_outlives_its_deliveries_is_dead_lettered_and_answered_once() {
    // Every worker that takes the event is killed mid-turn.
    let (env, event, mut replies) = hanging(2).await;
    env.publish(&event).await;
    killed_at_delivery(&env, 1).await;
    killed_at_delivery(&env, 2).await;
    let mut survivor = env.spawn_app_process(&[]);
    answered_honestly_once(&env, &mut replies, &event, 2).await;
    stop(&mut survivor);
    env.finish().await;
}

/// The server gives its notice that an event ran out of deliveries once, when it would have delivered
/// it again. Given while no worker runs (the only one was killed), the notice waits in the exhausted
/// stream, and the next worker to start settles the event from it: before, the notice was a core NATS
/// message that nobody heard, and the event was never answered nor dead-lettered.
#[tokio::test]
async fn an_event_that_runs_out_while_no_worker_runs_is_settled_by_the_next_to_start() {
    let (env, event, mut replies) = hanging(1).await;
    env.publish(&event).await;
    killed_at_delivery(&env, 1).await;
    let notices = || async {
        let mut stream = env
            .bus
            .js
            .get_stream(&env.bus.names.stream_exhausted)
            .await
            .expect("the exhausted stream");
        stream.info().await.expect("stream info").state.messages
    };
    assert!(
        eventually(Duration::from_secs(20), || async { notices().await == 1 }).await,
        "the server's notice is kept while no worker runs"
    );
    assert!(env.dead_letters().await.is_empty());
    let mut next = env.spawn_app_process(&[]);
    answered_honestly_once(&env, &mut replies, &event, 1).await;
    stop(&mut next);
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
