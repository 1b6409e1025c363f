//! Outages under a steady stream of events, each on a throwaway stack of its own (so stopping a server
//! does not disturb other tests): MongoDB stopped for 10 s, PostgreSQL stopped for 10 s, NATS stopped
//! for 10 s and restarted. A real worker process keeps running through it, and once the server is back
//! every event is answered (or covered by a burst's reply) exactly once; no partial reply is visible.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::env::*;
use bson::{doc, oid::ObjectId};
use chrono::Utc;
use companion_dev::{
    backend,
    stub::{Responder, StubReply, last_user_text},
};
use companion_store::bus::event::{Completion, InboundEvent};
use serde_json::Value;

const CONVERSATIONS: usize = 10;
/// One event every this often, for `PUBLISH_FOR`.
const EVERY: Duration = Duration::from_millis(100);
const PUBLISH_FOR: Duration = Duration::from_secs(20);
/// When the server goes down after publishing starts, and for how long.
const DOWN_AT: Duration = Duration::from_secs(4);
const DOWN_FOR: Duration = Duration::from_secs(10);

/// Every completion stored in the outbound stream, in order (read there, not from a subscription that
/// a NATS restart would interrupt).
async fn stored_completions(env: &TestEnv) -> Vec<Completion> {
    let Ok(mut stream) = env.bus.js.get_stream(&env.bus.names.stream_out).await else {
        return Vec::new();
    };
    let last = match stream.info().await {
        Ok(i) => i.state.last_sequence,
        Err(_) => return Vec::new(),
    };
    let mut out = Vec::new();
    for seq in 1..=last {
        if let Ok(m) = stream.get_raw_message(seq).await
            && let Ok(c) = serde_json::from_slice::<Completion>(&m.payload)
        {
            out.push(c);
        }
    }
    out
}

async fn steady_stream_through_an_outage(server: &str) {
    let stack = PrivateStack::start().await;
    // A model that takes a moment, so turns are in flight when the server goes away.
    let echo: Responder = Arc::new(|body: &Value| {
        StubReply::Delayed(
            Duration::from_millis(300),
            Box::new(StubReply::text(format!("re: {}", last_user_text(body)))),
        )
    });
    let env = TestEnv::on(&stack.servers, echo, |c| {
        c.consumer.max_deliver = 10;
        c.worker.retry_delay_secs = 1;
        c.consumer.ack_wait_secs = 5;
        c.llm.max_retries = 0;
        c.turn.user_turns_per_minute = 0;
        // A request the restarted server accepted and never answered ends here, not at 300 s.
        c.turn.turn_timeout_secs = 20;
    })
    .await;
    let conversations = env.new_conversations(KAORI, CONVERSATIONS).await;
    let mut worker = env.spawn_worker_process(&[]);
    // The outage clock starts once the worker is up (a slow start must not meet the outage instead).
    assert!(
        env.wait_worker_pulling(Duration::from_secs(60)).await,
        "the worker started"
    );

    // TB-Backend's side: a steady stream of events; a publish that fails is retried with the same
    // message id until the server acknowledges it.
    let bus = env.bus.clone();
    let publisher = tokio::spawn(async move {
        let started = Instant::now();
        let mut published = Vec::new();
        let mut n = 0;
        while started.elapsed() < PUBLISH_FOR {
            let (user, conversation) = &conversations[n % CONVERSATIONS];
            let event = InboundEvent {
                message_id: ObjectId::new().to_hex(),
                conversation_id: conversation.clone(),
                sender_id: user.clone(),
                bot_id: KAORI.into(),
                content: format!("event {n}"),
                attachments: Vec::new(),
                sent_at: Utc::now(),
            };
            while backend::publish_event(&bus, &event).await.is_err() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            published.push(event.message_id);
            n += 1;
            tokio::time::sleep(EVERY).await;
        }
        published
    });

    tokio::time::sleep(DOWN_AT).await;
    stack.stop(server).await;
    let down = Instant::now();
    tokio::time::sleep(DOWN_FOR).await;
    stack.up().await;
    eprintln!("{server} was down for {:?}", down.elapsed());
    let published = publisher.await.expect("publisher");
    // While NATS is down nothing can be published (TB-Backend retries), so that run sends fewer.
    assert!(
        published.len() >= 50,
        "a steady stream: {} events",
        published.len()
    );

    let deadline = Instant::now() + Duration::from_secs(120);
    let (all, answered) = loop {
        let mut answered: HashMap<String, usize> = HashMap::new();
        for c in stored_completions(&env).await {
            for id in c.in_reply_to.into_iter().chain(c.covers) {
                *answered.entry(id).or_default() += 1;
            }
        }
        let all = published.iter().all(|id| answered.contains_key(id));
        if all || Instant::now() > deadline {
            break (all, answered);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let missing: Vec<&String> = published
        .iter()
        .filter(|id| !answered.contains_key(*id))
        .collect();
    if !all {
        // What the journal and the worker's log say about each one, so that a failure explains itself.
        let journal = env.journal();
        let log = worker.log();
        for id in &missing {
            eprintln!("unanswered {id}: {:?}", journal.get(id).await);
            for line in log.lines().filter(|l| l.contains(id.as_str())) {
                eprintln!("  {line}");
            }
        }
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        eprintln!(
            "worker log, last lines:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    assert!(
        all,
        "{} of {} events never answered",
        missing.len(),
        published.len()
    );
    let twice: Vec<_> = answered.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "answered more than once: {twice:?}");
    assert_eq!(
        answered.len(),
        published.len(),
        "nothing answered that was not sent"
    );

    // Exactly one reply document per completion, each whole (text and all).
    let completions = stored_completions(&env).await;
    let docs: Vec<bson::Document> = {
        use futures::TryStreamExt;
        env.mongo
            .collection("dm_messages")
            .find(doc! { "inReplyTo": { "$exists": true } })
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    };
    assert_eq!(
        docs.len(),
        completions.len(),
        "one reply document per completion"
    );
    assert!(
        docs.iter().all(|d| d
            .get_str("content")
            .is_ok_and(|c| c.starts_with("re: event "))),
        "every reply is a whole answer"
    );
    assert!(env.dead_letters().await.is_empty(), "nothing dead-lettered");
    assert!(
        worker.try_wait().expect("worker status").is_none(),
        "the worker kept running"
    );
    eprintln!(
        "{} events answered by {} replies through a {server} outage",
        published.len(),
        completions.len()
    );
    stop(&mut worker);
    env.finish().await;
}

#[tokio::test]
async fn mongodb_stopped_for_10_s_under_a_steady_stream() {
    steady_stream_through_an_outage("mongo").await;
}

#[tokio::test]
async fn postgresql_stopped_for_10_s_under_a_steady_stream() {
    steady_stream_through_an_outage("postgres").await;
}

#[tokio::test]
async fn nats_restarted_under_a_steady_stream() {
    steady_stream_through_an_outage("nats").await;
}
