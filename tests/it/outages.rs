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

/// A model that answers `re: <the user's last message>` after `delay` (turns are in flight when a
/// server goes away).
fn echo_after(delay: Duration) -> Responder {
    Arc::new(move |body: &Value| {
        StubReply::Delayed(
            delay,
            Box::new(StubReply::text(format!("re: {}", last_user_text(body)))),
        )
    })
}

/// Event `n` of a test: `event n`, from the user of conversation `n` (round robin) to Kaori.
fn nth_event(conversations: &[(String, String)], n: usize) -> InboundEvent {
    let (user, conversation) = &conversations[n % conversations.len()];
    InboundEvent {
        message_id: ObjectId::new().to_hex(),
        conversation_id: conversation.clone(),
        sender_id: user.clone(),
        bot_id: KAORI.into(),
        content: format!("event {n}"),
        attachments: Vec::new(),
        sent_at: Utc::now(),
    }
}

/// How many completions answer each message, by its reply or as part of a burst (`covers`).
fn answers(completions: &[Completion]) -> HashMap<String, usize> {
    let mut answered: HashMap<String, usize> = HashMap::new();
    for c in completions {
        for id in c.in_reply_to.iter().chain(&c.covers) {
            *answered.entry(id.clone()).or_default() += 1;
        }
    }
    answered
}

async fn steady_stream_through_an_outage(server: &str) {
    let stack = PrivateStack::start().await;
    let env = TestEnv::on(
        &stack.servers,
        echo_after(Duration::from_millis(300)),
        |c| {
            c.consumer.max_deliver = 10;
            c.worker.retry_delay_secs = 1;
            c.consumer.ack_wait_secs = 5;
            c.llm.max_retries = 0;
            c.turn.user_turns_per_minute = 0;
            // A request the restarted server accepted and never answered ends here, not at 300 s.
            c.turn.turn_timeout_secs = 20;
        },
    )
    .await;
    let conversations = env.new_conversations(KAORI, CONVERSATIONS).await;
    let mut worker = env.spawn_app_process(&[]);
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
            let event = nth_event(&conversations, n);
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
        let answered = answers(&stored_completions(&env).await);
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

/// How a long outage looks.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// SIGSTOP: connections stay open and nothing answers, as a stall or a failover looks.
    Frozen,
    /// Stopped, and started again on the same data.
    Restarted,
}

/// Longer than the delivery budget these tests give the worker (3 deliveries, backoff 1 s then 2 s, a
/// 5 s ack wait, a failed turn meeting the pools' 5 s timeouts): without waiting it out, every delivery
/// of a message would be spent in it.
const LONG_DOWN_FOR: Duration = Duration::from_secs(35);
const LONG_CONVERSATIONS: usize = 4;
/// Four before the outage, eight during it.
const LONG_MESSAGES: usize = 12;

/// A server away for longer than the delivery budget while messages arrive: the worker waits it out
/// (`/readyz` says so, the time is counted), and once the server is back every message is answered by
/// the model once, in its conversation's order: no dead letter, no failure line, no duplicate.
async fn a_long_outage_is_waited_out(server: &str, fault: Fault) {
    let dependency = if server == "mongo" { "mongodb" } else { server };
    // The tests' reqwest has no default crypto provider (plain HTTP needs none, but a client needs one).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let stack = PrivateStack::start().await;
    let env = TestEnv::on(
        &stack.servers,
        echo_after(Duration::from_millis(200)),
        |c| {
            c.consumer.max_deliver = 3;
            c.worker.retry_delay_secs = 1;
            c.consumer.ack_wait_secs = 5;
            c.llm.max_retries = 0;
            c.turn.user_turns_per_minute = 0;
            c.turn.turn_timeout_secs = 60;
        },
    )
    .await;
    let conversations = env.new_conversations(KAORI, LONG_CONVERSATIONS).await;
    let http = format!("127.0.0.1:{}", crate::servers::free_port());
    let mut worker = env.spawn_app_process(&[("COMPANION_HTTP_ADDR", &http)]);
    assert!(
        env.wait_worker_pulling(Duration::from_secs(60)).await,
        "the worker started"
    );

    let mut published: Vec<(usize, String)> = Vec::new();
    let publish = |n: usize| nth_event(&conversations, n);
    for n in 0..4 {
        let event = publish(n);
        backend::publish_event(&env.bus, &event).await.unwrap();
        published.push((n, event.message_id));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    match fault {
        Fault::Frozen => stack.freeze(server).await,
        Fault::Restarted => stack.stop(server).await,
    }
    let down = Instant::now();
    for n in 4..LONG_MESSAGES {
        let event = publish(n);
        backend::publish_event(&env.bus, &event).await.unwrap();
        published.push((n, event.message_id));
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let readyz = format!("http://{http}/readyz");
    let waiting = format!("waiting out an outage of {dependency} since ");
    let said = std::sync::Mutex::new(String::new());
    let named = eventually(LONG_DOWN_FOR.saturating_sub(down.elapsed()), || async {
        let body = match reqwest::get(&readyz).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let named = body.contains(&waiting);
        *said.lock().unwrap() = body;
        named
    })
    .await;
    let said = said.into_inner().unwrap();
    tokio::time::sleep(LONG_DOWN_FOR.saturating_sub(down.elapsed())).await;
    match fault {
        Fault::Frozen => stack.thaw(server).await,
        Fault::Restarted => stack.up().await,
    }
    eprintln!("{server} was {fault:?} for {:?}", down.elapsed());

    let ids: HashMap<&str, usize> = published.iter().map(|(n, id)| (id.as_str(), *n)).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let (completions, answered) = loop {
        let completions = stored_completions(&env).await;
        let answered = answers(&completions);
        if ids.keys().all(|id| answered.contains_key(*id)) || Instant::now() > deadline {
            break (completions, answered);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let missing: Vec<usize> = published
        .iter()
        .filter(|(_, id)| !answered.contains_key(id))
        .map(|(n, _)| *n)
        .collect();
    if !missing.is_empty() {
        let log = worker.log();
        let tail: Vec<&str> = log.lines().rev().take(60).collect();
        eprintln!(
            "worker log, last lines:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    assert!(missing.is_empty(), "never answered: events {missing:?}");
    let twice: Vec<_> = answered.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "answered more than once: {twice:?}");
    assert_eq!(answered.len(), published.len(), "nothing else answered");
    for c in &completions {
        assert!(
            c.content.starts_with("re: event "),
            "every reply is the model's answer, none a failure line: {:?}",
            c.content
        );
    }
    // In each conversation the replies come in the order of the messages they answer.
    let mut last: HashMap<&str, usize> = HashMap::new();
    for c in &completions {
        let n = ids[c.in_reply_to.as_deref().expect("a reply")];
        if let Some(before) = last.insert(c.conversation_id.as_str(), n) {
            assert!(before < n, "event {n} was answered after event {before}");
        }
    }
    assert!(env.dead_letters().await.is_empty(), "nothing dead-lettered");
    assert!(named, "/readyz names the outage; it said: {said}");
    let metrics = reqwest::get(format!("http://{http}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counted = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!(
                "companion_outage_wait_milliseconds_total{{dependency=\"{dependency}\"}} "
            ))
        })
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(
        counted >= 1_000.0,
        "the time waited is counted: {counted} ms"
    );
    assert!(
        worker.try_wait().expect("worker status").is_none(),
        "the worker kept running"
    );
    eprintln!(
        "{} messages answered by {} replies through {server} {fault:?} for {LONG_DOWN_FOR:?}; {counted} ms waited",
        published.len(),
        completions.len()
    );
    stop(&mut worker);
    env.finish().await;
}

#[tokio::test]
async fn postgresql_frozen_longer_than_the_delivery_budget() {
    a_long_outage_is_waited_out("postgres", Fault::Frozen).await;
}

#[tokio::test]
async fn postgresql_restarted_after_longer_than_the_delivery_budget() {
    a_long_outage_is_waited_out("postgres", Fault::Restarted).await;
}

#[tokio::test]
async fn mongodb_frozen_longer_than_the_delivery_budget() {
    a_long_outage_is_waited_out("mongo", Fault::Frozen).await;
}

#[tokio::test]
async fn mongodb_restarted_after_longer_than_the_delivery_budget() {
    a_long_outage_is_waited_out("mongo", Fault::Restarted).await;
}

/// NATS frozen for 10 s under load with two workers: every completion reaches a core subscriber of the
/// outbound subjects once (the way docs/tb-backend.md has TB-Backend consume them). A publish whose ack
/// was lost in the stall was stored all the same; the retried turn looks it up instead of publishing it
/// again.
#[tokio::test]
async fn a_nats_stall_publishes_each_completion_once() {
    use futures::{FutureExt, StreamExt};
    let stack = PrivateStack::start().await;
    let env = TestEnv::on(
        &stack.servers,
        echo_after(Duration::from_millis(300)),
        |c| {
            c.worker.retry_delay_secs = 1;
            // The default ack wait: the stall is shorter, so no delivery is handed to the other worker while the
            // first still holds it (a stall longer than the ack wait is another fault: docs/operations.md).
            c.consumer.ack_wait_secs = 30;
            c.llm.max_retries = 0;
            c.turn.user_turns_per_minute = 0;
            c.turn.turn_timeout_secs = 30;
        },
    )
    .await;
    let conversations = env.new_conversations(KAORI, 13).await;
    let mut workers = [env.spawn_app_process(&[]), env.spawn_app_process(&[])];
    assert!(
        env.wait_worker_pulling(Duration::from_secs(60)).await,
        "the workers started"
    );
    // TB-Backend's side: a core subscription, counting each reply it is handed.
    let client = async_nats::connect(&stack.servers.nats_url).await.unwrap();
    let mut outbound = client
        .subscribe(format!("{}.out.>", env.bus.names.prefix))
        .await
        .unwrap();

    let bus = env.bus.clone();
    let publisher = tokio::spawn(async move {
        let mut published = Vec::new();
        for n in 0..104 {
            let event = nth_event(&conversations, n);
            while backend::publish_event(&bus, &event).await.is_err() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            published.push(event.message_id);
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
        published
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    stack.freeze("nats").await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    stack.thaw("nats").await;
    let published = publisher.await.expect("publisher");

    let all_answered = eventually(Duration::from_secs(120), || async {
        let answered = answers(&stored_completions(&env).await);
        published.iter().all(|id| answered.contains_key(id))
    })
    .await;
    assert!(all_answered, "every event answered");
    // Nothing more can be published once no worker holds an event (a turn publishes before its ack, on
    // the same connection); a round trip of the subscriber's connection then brings in what the server
    // routed to it before.
    assert!(
        eventually(Duration::from_secs(60), || async {
            env.consumer_info()
                .await
                .is_some_and(|i| i.num_pending == 0 && i.num_ack_pending == 0)
        })
        .await,
        "every event settled"
    );
    client.flush().await.unwrap();
    let mut seen: HashMap<String, usize> = HashMap::new();
    while let Some(Some(m)) = outbound.next().now_or_never() {
        if let Ok(c) = serde_json::from_slice::<Completion>(&m.payload) {
            *seen.entry(c.message_id).or_default() += 1;
        }
    }
    let stored = stored_completions(&env).await;
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    eprintln!(
        "{} events, {} completions stored, {} seen by the core subscriber, {} of them more than once",
        published.len(),
        stored.len(),
        seen.len(),
        twice.len()
    );
    assert!(
        twice.is_empty(),
        "completions a core subscriber got more than once: {twice:?}"
    );
    assert_eq!(seen.len(), stored.len(), "each stored completion was seen");
    for w in &mut workers {
        assert!(w.try_wait().unwrap().is_none(), "the worker kept running");
        stop(w);
    }
    env.finish().await;
}

/// An outage longer than `COMPANION_OUTAGE_MAX_SECS` (here 6 s; MongoDB stopped for 25 s): the messages
/// held past the bound are dead-lettered with the reason, the rest wait in the stream; once MongoDB is
/// back, those are answered, and `companion replay --dlq` answers the dead-lettered ones: every message
/// once.
#[tokio::test]
async fn past_the_outage_bound_a_held_message_is_dead_lettered_and_replay_answers_it() {
    let stack = PrivateStack::start().await;
    let env = TestEnv::on(&stack.servers, echo_after(Duration::ZERO), |c| {
        c.consumer.max_deliver = 3;
        c.worker.retry_delay_secs = 1;
        c.consumer.ack_wait_secs = 5;
        c.llm.max_retries = 0;
        c.turn.user_turns_per_minute = 0;
        c.worker.outage_max_secs = 6;
    })
    .await;
    let conversations = env.new_conversations(KAORI, 3).await;
    let mut worker = env.spawn_app_process(&[]);
    assert!(
        env.wait_worker_pulling(Duration::from_secs(60)).await,
        "the worker started"
    );
    stack.stop("mongo").await;
    let down = Instant::now();
    let mut published = Vec::new();
    for n in 0..conversations.len() {
        let event = nth_event(&conversations, n);
        backend::publish_event(&env.bus, &event).await.unwrap();
        published.push(event.message_id);
    }
    let dead_lettered = eventually(Duration::from_secs(25), || async {
        !env.dead_letters().await.is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(25).saturating_sub(down.elapsed())).await;
    let reasons = env.dead_letter_reasons().await;
    stack.up().await;
    assert!(
        dead_lettered,
        "a message held past the bound is dead-lettered"
    );
    assert!(
        reasons
            .iter()
            .all(|r| r.contains("mongodb did not answer within COMPANION_OUTAGE_MAX_SECS (6 s")),
        "the dead letters say why: {reasons:?}"
    );
    // The messages never taken are answered once MongoDB is back; then the dead-lettered ones by replay.
    let waiting = published.len() - reasons.len();
    assert!(
        eventually(Duration::from_secs(60), || async {
            answers(&stored_completions(&env).await).len() >= waiting
        })
        .await,
        "the {waiting} messages not dead-lettered are answered once MongoDB is back"
    );
    let (ok, out, err) = env.run_companion(&["replay", "--dlq"]).await;
    assert!(ok, "replay --dlq: {out}{err}");
    let answered = answers(&stored_completions(&env).await);
    for id in &published {
        assert_eq!(
            answered.get(id),
            Some(&1),
            "{id} answered once: {answered:?}\n{out}"
        );
    }
    for c in stored_completions(&env).await {
        assert!(c.content.starts_with("re: event "), "{:?}", c.content);
    }
    eprintln!(
        "{} messages: {} dead-lettered past the bound, then answered by replay --dlq; {waiting} answered once MongoDB was back",
        published.len(),
        reasons.len()
    );
    stop(&mut worker);
    env.finish().await;
}
