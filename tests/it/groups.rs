//! Group chats with several companions: who answers (mentions, best fit, silence for an
//! acknowledgement), hand-overs within their bounds, a companion's own message never answered, a crash
//! between two companions' messages, and a replay, all on the real stack.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bson::doc;
use companion_dev::{
    backend,
    stub::{Responder, StubReply},
};
use companion_store::bus::event::{Completion, GroupMessageEvent};
use futures::{StreamExt, TryStreamExt};
use serde_json::Value;

use crate::env::*;

/// The companion a request is for: the name after "You are " in its system prompt.
fn speaker(body: &Value) -> String {
    let system = body["messages"][0]["content"].as_str().unwrap_or_default();
    system
        .strip_prefix("You are ")
        .and_then(|s| s.split([' ', ',']).next())
        .unwrap_or_default()
        .to_owned()
}

/// Every text the model got in a request, in order.
fn texts(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str().map(str::to_owned))
        .collect()
}

/// Each companion says who it is and nothing that names another.
fn introduce() -> Responder {
    Arc::new(|body: &Value| StubReply::text(format!("{} here", speaker(body).to_lowercase())))
}

async fn group(env: &TestEnv, bots: &[&str]) -> String {
    let bots: Vec<_> = bots.iter().map(|b| oid(b)).collect();
    backend::create_group(&env.mongo, &[oid(JESS)], &bots)
        .await
        .expect("group created")
        .to_hex()
}

async fn say(env: &TestEnv, conversation: &str, text: &str) -> GroupMessageEvent {
    let e = backend::store_group_message(&env.mongo, oid(conversation), oid(JESS), text)
        .await
        .expect("stored");
    backend::publish_group_message(&env.bus, &e)
        .await
        .expect("published");
    e
}

/// The next `n` companion messages answering `message`, in the order they came.
async fn answers(
    stream: &mut (impl futures::Stream<Item = Completion> + Unpin),
    message: &str,
    n: usize,
) -> Vec<Completion> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    while out.len() < n {
        let c = tokio::time::timeout_at(deadline, stream.next())
            .await
            .unwrap_or_else(|_| panic!("{} of {n} answers to {message}: {out:?}", out.len()))
            .expect("completions stream open");
        if c.responds_to.as_deref() == Some(message)
            && !out
                .iter()
                .any(|o: &Completion| o.message_id == c.message_id)
        {
            out.push(c);
        }
    }
    out
}

/// No companion message for `message` within `wait`.
async fn no_answer(
    stream: &mut (impl futures::Stream<Item = Completion> + Unpin),
    message: &str,
    wait: Duration,
) {
    let deadline = tokio::time::Instant::now() + wait;
    while let Ok(Some(c)) = tokio::time::timeout_at(deadline, stream.next()).await {
        assert_ne!(
            c.responds_to.as_deref(),
            Some(message),
            "unexpected answer {c:?}"
        );
    }
}

/// Companion messages stored for `message`, oldest first: (sender, content).
async fn stored(env: &TestEnv, message: &str) -> Vec<(String, String)> {
    let docs: Vec<bson::Document> = env
        .mongo
        .collection("dm_messages")
        .find(doc! { "respondsTo": oid(message) })
        .sort(doc! { "timestamp": 1 })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    docs.iter()
        .map(|d| {
            (
                d.get_str("senderId").unwrap().to_owned(),
                d.get_str("content").unwrap().to_owned(),
            )
        })
        .collect()
}

async fn job_state(env: &TestEnv, id: &str) -> Option<(String, Option<String>)> {
    sqlx::query_as("SELECT state, reason FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_optional(&env.pg.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn named_companions_answer_in_the_order_named_each_seeing_the_one_before() {
    let env = TestEnv::new(introduce()).await;
    let worker = env.spawn_app().await;
    let conv = group(&env, &[KAORI, TONY, ZOE]).await;
    let mut out = env.completions(&conv).await;

    let one = say(&env, &conv, "@zoe which skis for park?").await;
    let got = answers(&mut out, &one.message_id, 1).await;
    assert_eq!(got[0].sender_id, ZOE);
    assert_eq!(got[0].content, "zoe here");
    assert_eq!(got[0].in_reply_to.as_deref(), Some(one.message_id.as_str()));

    let two = say(&env, &conv, "Tony and kaori: what's a good first trick?").await;
    let got = answers(&mut out, &two.message_id, 2).await;
    let senders: Vec<&str> = got.iter().map(|c| c.sender_id.as_str()).collect();
    assert_eq!(senders, [TONY, KAORI], "in the order named");
    no_answer(&mut out, &two.message_id, Duration::from_secs(2)).await;
    assert_eq!(
        stored(&env, &two.message_id).await,
        vec![
            (TONY.to_owned(), "tony here".to_owned()),
            (KAORI.to_owned(), "kaori here".to_owned())
        ]
    );

    // Shared context: Kaori saw the group's history by name, the message, and Tony's answer.
    let requests = env.stub.requests();
    let kaori = requests.last().unwrap();
    assert_eq!(speaker(kaori), "Kaori");
    let seen = texts(kaori);
    let tail: Vec<&str> = seen
        .iter()
        .rev()
        .take(2)
        .rev()
        .map(String::as_str)
        .collect();
    assert_eq!(
        tail,
        [
            "Jess Rivera: Tony and kaori: what's a good first trick?",
            "Tony: tony here"
        ]
    );
    assert!(seen.iter().any(|t| t == "Zoe: zoe here"), "{seen:?}");
    assert!(seen[0].contains("group chat"), "the system prompt says so");
    assert_eq!(requests.len(), 3, "one model call per companion message");
    assert_eq!(
        worker
            .metric("companion_group_messages_total{route=\"mention\"}")
            .await,
        Some(2.0)
    );
    assert_eq!(
        worker.metric("companion_group_answers_total").await,
        Some(3.0)
    );
    worker.stop().await;
    env.finish().await;
}

/// The AI disclosure a companion's message carries is for the user: the next companion of the round
/// reads that message without it (else it answers the disclosure as if the user had said it).
#[tokio::test]
async fn the_next_companion_reads_the_one_before_without_its_ai_disclosure() {
    let env = TestEnv::with(introduce(), |c| c.safety.ai_disclosure = true).await;
    let worker = env.spawn_app().await;
    let conv = group(&env, &[KAORI, TONY]).await;
    let mut out = env.completions(&conv).await;
    let one = say(&env, &conv, "Tony and kaori: what's a good first trick?").await;
    let got = answers(&mut out, &one.message_id, 2).await;
    assert_eq!(got[0].sender_id, TONY);
    assert!(got[0].marks.ai_disclosure, "{:?}", got[0]);
    assert!(got[0].content.ends_with("tony here"), "{}", got[0].content);
    assert_ne!(got[0].content, "tony here", "the disclosure comes first");
    let kaori = env.stub.requests().last().cloned().unwrap();
    assert_eq!(speaker(&kaori), "Kaori");
    let seen = texts(&kaori);
    assert_eq!(
        seen.last().map(String::as_str),
        Some("Tony: tony here"),
        "{seen:?}"
    );
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn the_best_fit_answers_and_an_acknowledgement_gets_no_answer() {
    let env = TestEnv::new(introduce()).await;
    let worker = env.spawn_app().await;
    let conv = group(&env, &[KAORI, TONY]).await;
    let mut out = env.completions(&conv).await;

    let skate = say(
        &env,
        &conv,
        "how do i ollie higher on my skateboard at the skatepark?",
    )
    .await;
    assert_eq!(
        answers(&mut out, &skate.message_id, 1).await[0].sender_id,
        TONY
    );

    let before = env.stub.requests().len();
    let ack = say(&env, &conv, "lol nice 🔥").await;
    no_answer(&mut out, &ack.message_id, Duration::from_secs(3)).await;
    assert_eq!(
        job_state(&env, &ack.message_id).await,
        Some(("dropped".into(), Some("acknowledgement".into())))
    );
    assert_eq!(env.stub.requests().len(), before, "no model call");

    let snow = say(
        &env,
        &conv,
        "which snowboard should i ride for powder days and park laps?",
    )
    .await;
    assert_eq!(
        answers(&mut out, &snow.message_id, 1).await[0].sender_id,
        KAORI
    );
    // The acknowledgement is in the history the next companion reads.
    assert!(
        texts(&env.stub.requests()[before])
            .iter()
            .any(|t| t == "Jess Rivera: lol nice 🔥")
    );
    assert_eq!(
        worker
            .metric("companion_group_silences_total{reason=\"acknowledgement\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(
        worker
            .metric("companion_group_messages_total{route=\"fit\"}")
            .await,
        Some(2.0)
    );
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_model_that_tags_endlessly_stops_at_three_messages() {
    // Every companion hands over to the other, forever.
    let tagger: Responder = Arc::new(|body: &Value| {
        StubReply::text(match speaker(body).as_str() {
            "Kaori" => "omg yes!! tony help me out here",
            _ => "kaori you take this one",
        })
    });
    let env = TestEnv::new(tagger).await;
    let worker = env.spawn_app().await;
    let conv = group(&env, &[KAORI, TONY]).await;
    let mut out = env.completions(&conv).await;
    let e = say(
        &env,
        &conv,
        "kaori, i'm a snowboarder getting into skating, any tips?",
    )
    .await;
    let got = answers(&mut out, &e.message_id, 3).await;
    let senders: Vec<&str> = got.iter().map(|c| c.sender_id.as_str()).collect();
    assert_eq!(senders, [KAORI, TONY, KAORI]);
    no_answer(&mut out, &e.message_id, Duration::from_secs(3)).await;
    assert_eq!(env.stub.requests().len(), 3);
    assert_eq!(
        worker.metric("companion_group_handovers_total").await,
        Some(2.0)
    );

    // Delivered again (a crash before the ack would do this): nothing more.
    env.publish_raw(
        env.bus.names.group(&conv),
        &format!("{}-again", e.message_id),
        serde_json::to_vec(&e).unwrap(),
    )
    .await;
    no_answer(&mut out, &e.message_id, Duration::from_secs(3)).await;
    assert_eq!(stored(&env, &e.message_id).await.len(), 3);
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_tag_chain_stops_at_the_hand_over_bound_and_a_companion_s_message_is_never_answered() {
    let tagger: Responder = Arc::new(|body: &Value| {
        StubReply::text(match speaker(body).as_str() {
            "Kaori" => "zoe knows skis better",
            "Zoe" => "tony should weigh in",
            _ => "kaori?",
        })
    });
    let env = TestEnv::with(tagger, |c| {
        c.group.max_handovers = 1;
        c.group.max_messages = 5;
    })
    .await;
    let worker = env.spawn_app().await;
    let conv = group(&env, &[KAORI, TONY, ZOE]).await;
    let mut out = env.completions(&conv).await;
    let e = say(&env, &conv, "kaori what about skis?").await;
    let got = answers(&mut out, &e.message_id, 2).await;
    let senders: Vec<&str> = got.iter().map(|c| c.sender_id.as_str()).collect();
    assert_eq!(senders, [KAORI, ZOE], "one hand-over, then the chain stops");
    no_answer(&mut out, &e.message_id, Duration::from_secs(3)).await;

    // A companion's message published to the group (a misbehaving backend) is never answered.
    let before = env.stub.requests().len();
    let echo = backend::store_group_message(&env.mongo, oid(&conv), oid(KAORI), "tony?")
        .await
        .unwrap();
    backend::publish_group_message(&env.bus, &echo)
        .await
        .unwrap();
    no_answer(&mut out, &echo.message_id, Duration::from_secs(3)).await;
    assert_eq!(
        job_state(&env, &echo.message_id).await,
        Some(("dropped".into(), Some("companion_sender".into())))
    );
    assert_eq!(env.stub.requests().len(), before);
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_worker_killed_between_two_companions_messages_sends_the_second_and_never_the_first_again()
 {
    let tony_hangs = Arc::new(AtomicBool::new(true));
    let hang = tony_hangs.clone();
    let responder: Responder = Arc::new(move |body: &Value| {
        let who = speaker(body);
        let text = StubReply::text(format!("{} here", who.to_lowercase()));
        if who == "Tony" && hang.load(Ordering::SeqCst) {
            StubReply::Delayed(Duration::from_secs(120), Box::new(text))
        } else {
            text
        }
    });
    let env = TestEnv::with(responder, |c| {
        c.consumer.ack_wait_secs = 2;
        c.consumer.max_deliver = 5;
    })
    .await;
    let conv = group(&env, &[KAORI, TONY]).await;
    let mut out = env.completions(&conv).await;
    let mut first = env.spawn_app_process(&[]);
    let e = say(&env, &conv, "kaori and tony, park or street first?").await;
    assert_eq!(
        answers(&mut out, &e.message_id, 1).await[0].sender_id,
        KAORI
    );
    assert!(
        eventually(Duration::from_secs(20), || async {
            env.stub.requests().iter().any(|r| speaker(r) == "Tony")
        })
        .await,
        "Tony is being asked"
    );
    kill9(&mut first);
    tony_hangs.store(false, Ordering::SeqCst);

    let mut second = env.spawn_app_process(&[]);
    let got = answers(&mut out, &e.message_id, 1).await;
    assert_eq!(got[0].sender_id, TONY);
    assert_eq!(got[0].content, "tony here");
    assert!(
        eventually(Duration::from_secs(10), || async {
            job_state(&env, &e.message_id)
                .await
                .is_some_and(|(s, _)| s == "done")
        })
        .await
    );
    assert_eq!(
        stored(&env, &e.message_id).await,
        vec![
            (KAORI.to_owned(), "kaori here".to_owned()),
            (TONY.to_owned(), "tony here".to_owned())
        ],
        "each once"
    );
    let asked = |who: &str| {
        env.stub
            .requests()
            .iter()
            .filter(|r| speaker(r) == who)
            .count()
    };
    assert_eq!(
        asked("Kaori"),
        1,
        "Kaori's answer was recorded, not asked again"
    );
    assert_eq!(asked("Tony"), 2);
    stop(&mut second);
    env.finish().await;
}

#[tokio::test]
async fn a_failed_group_message_gets_one_failure_line_and_replay_answers_it() {
    let broken = Arc::new(AtomicBool::new(true));
    let b = broken.clone();
    let responder: Responder = Arc::new(move |body: &Value| {
        if b.load(Ordering::SeqCst) {
            StubReply::Status {
                code: 500,
                body: "down".into(),
                retry_after: None,
            }
        } else {
            StubReply::text(format!("{} is back", speaker(body).to_lowercase()))
        }
    });
    let env = TestEnv::with(responder, |c| {
        c.consumer.max_deliver = 2;
        c.llm.max_retries = 0;
    })
    .await;
    let worker = env.spawn_app().await;
    let conv = group(&env, &[KAORI, ZOE]).await;
    let mut out = env.completions(&conv).await;
    let e = say(&env, &conv, "zoe, moguls or park today?").await;
    let got = answers(&mut out, &e.message_id, 1).await;
    assert_eq!(
        (got[0].sender_id.as_str(), got[0].content.clone()),
        (ZOE, failure_line("zoe"))
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            env.dead_letters().await.len() == 1
        })
        .await
    );
    worker.stop().await;

    broken.store(false, Ordering::SeqCst);
    let (ok, text, err) = env
        .run_companion(&["replay", "--dlq", "--conversation", &conv])
        .await;
    assert!(ok, "{text}\n{err}");
    assert!(text.contains("1 done"), "{text}");
    let got = answers(&mut out, &e.message_id, 1).await;
    assert_eq!(
        (got[0].sender_id.as_str(), got[0].content.as_str()),
        (ZOE, "zoe is back")
    );
    let (ok, text, _) = env.run_companion(&["replay", "--dlq"]).await;
    assert!(ok && text.contains("1 skipped"), "{text}");
    assert_eq!(
        stored(&env, &e.message_id).await.len(),
        2,
        "the line, then the answer"
    );
    env.finish().await;
}
