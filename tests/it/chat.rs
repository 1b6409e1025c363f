//! The terminal chat (`companion-dev chat`, what `deploy/local/chat.sh` and the demo run): it shows a
//! message's whole turn, however many messages it has and however far apart they come, and knows the
//! turn is over from the worker's journal, not from a pause.

use std::{sync::Arc, time::Duration};

use companion_dev::{
    chat::{ChatConfig, GroupSession, Session, explain_id},
    stub::{Responder, StubReply},
};
use companion_journal::State;
use serde_json::Value;

use crate::env::*;

fn chat_config(env: &TestEnv) -> ChatConfig {
    ChatConfig {
        nats: env.config.nats.clone(),
        mongo: env.config.mongo.clone(),
        pg: env.config.pg.clone(),
        characters: env.config.characters.clone(),
        raw_cards: false,
        ids: true,
    }
}

/// Each companion says who it is (the name after "You are " in its system prompt), `after` a pause.
fn introduce_after(after: Duration) -> Responder {
    Arc::new(move |body: &Value| {
        let system = body["messages"][0]["content"].as_str().unwrap_or_default();
        let name = system
            .strip_prefix("You are ")
            .and_then(|s| s.split([' ', ',']).next())
            .unwrap_or_default()
            .to_lowercase();
        StubReply::Delayed(after, Box::new(StubReply::text(format!("{name} here"))))
    })
}

/// A crisis message's turn has two messages: the referral, at once, and the companion's own reply, which
/// waits for the model (here 3 s). The chat shows both, each with the message's id, and returns once the
/// job is settled: not when the first one arrives.
#[tokio::test]
async fn the_chat_shows_a_crisis_turn_whole_the_referral_and_the_companion_s_reply() {
    let env = TestEnv::new(Arc::new(|_: &Value| {
        StubReply::Delayed(
            Duration::from_secs(3),
            Box::new(StubReply::text("i'm really glad you told me.")),
        )
    }))
    .await;
    let worker = env.spawn_app().await;
    let session = Session::open(&chat_config(&env), "jess", "kaori")
        .await
        .expect("a chat session");
    let mut shown = Vec::new();
    let turn = session
        .say_showing(CRISIS_TEXT, &[], Some(Duration::from_secs(30)), |c| {
            shown.push(c.message_id.clone())
        })
        .await
        .expect("the turn");
    let job = turn
        .job
        .as_ref()
        .expect("the job as the journal settled it");
    assert_eq!(job.state, State::Done, "{job:?}");
    assert_eq!(turn.replies.len(), 2, "{:?}", turn.replies);
    let referral = turn
        .replies
        .iter()
        .find(|c| c.marks.safety.is_some())
        .unwrap_or_else(|| panic!("a referral among {:?}", turn.replies));
    assert!(!referral.content.is_empty());
    assert!(
        turn.replies
            .iter()
            .any(|c| c.content == "i'm really glad you told me."),
        "the companion's own reply: {:?}",
        turn.replies
    );
    let in_turn: Vec<&String> = turn.replies.iter().map(|c| &c.message_id).collect();
    assert_eq!(
        shown.iter().collect::<Vec<_>>(),
        in_turn,
        "each shown as it came"
    );
    for c in &turn.replies {
        assert_eq!(explain_id(c).as_deref(), Some(turn.message.as_str()));
    }
    assert_eq!(session.note(&turn).await, None, "answered: nothing to add");
    worker.stop().await;
    env.finish().await;
}

/// A group message that two companions answer, each after a pause longer than the chat once waited
/// for a next speaker: the chat shows both, in the order they spoke. A message no companion answers
/// ends at once, with the journal's reason.
#[tokio::test]
async fn the_group_chat_shows_every_speaker_and_says_when_nobody_answers() {
    let env = TestEnv::new(introduce_after(Duration::from_millis(2500))).await;
    let worker = env.spawn_app().await;
    let session = GroupSession::open(&chat_config(&env), "jess", "kaori,tony")
        .await
        .expect("a group session");
    let turn = session
        .say(
            "Tony and kaori: what's a good first trick?",
            Duration::from_secs(40),
        )
        .await
        .expect("the turn");
    let said: Vec<(&str, &str)> = turn
        .replies
        .iter()
        .map(|c| (c.sender_id.as_str(), c.content.as_str()))
        .collect();
    assert_eq!(said, [(TONY, "tony here"), (KAORI, "kaori here")]);
    assert_eq!(turn.job.as_ref().map(|j| j.state), Some(State::Done));

    let started = tokio::time::Instant::now();
    let quiet = session
        .say("lol nice 🔥", Duration::from_secs(40))
        .await
        .expect("the turn");
    assert!(quiet.replies.is_empty(), "{:?}", quiet.replies);
    assert_eq!(quiet.job.as_ref().map(|j| j.state), Some(State::Dropped));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "over when the journal says so, not at the wait's end: {:?}",
        started.elapsed()
    );
    worker.stop().await;
    env.finish().await;
}

/// No worker: the chat does not wait forever; the error says neither the journal nor the dead-letter
/// stream knows the message.
#[tokio::test]
async fn without_a_worker_the_chat_says_no_worker_took_the_message() {
    let env = TestEnv::new(Arc::new(|_: &Value| StubReply::text("unused"))).await;
    let session = Session::open(&chat_config(&env), "jess", "kaori")
        .await
        .expect("a chat session");
    let err = session
        .say("anyone there?", &[], Some(Duration::from_secs(2)))
        .await
        .expect_err("no worker, no turn")
        .to_string();
    assert!(
        err.contains(
            "neither the journal nor the dead-letter stream knows the message; is a worker running?"
        ),
        "{err}"
    );
    env.finish().await;
}

/// A message a worker dead-lettered (here: the test, as the worker's settlement does, once the message
/// is in the stream): the chat says so, why, after how many attempts, and how to bring it back, instead
/// of guessing about workers.
#[tokio::test]
async fn a_dead_lettered_message_is_named_so_with_its_reason_and_attempts() {
    use futures::StreamExt;
    let env = TestEnv::new(Arc::new(|_: &Value| StubReply::text("unused"))).await;
    let session = Session::open(&chat_config(&env), "jess", "kaori")
        .await
        .expect("a chat session");
    let subject = env
        .bus
        .names
        .inbound(&session.bot.to_hex(), &session.conversation.to_hex());
    let mut inbound = env.bus.client.subscribe(subject.clone()).await.unwrap();
    let bus = env.bus.clone();
    let worker = tokio::spawn(async move {
        let m = inbound.next().await.expect("the message is published");
        bus.dead_letter_raw(
            &subject,
            1,
            m.payload,
            "order floor unavailable: PostgreSQL: pool timed out while waiting for an open connection",
            5,
        )
        .await
        .expect("dead-lettered");
    });
    let err = session
        .say("anyone there?", &[], Some(Duration::from_secs(3)))
        .await
        .expect_err("dead-lettered, no reply")
        .to_string();
    worker.await.unwrap();
    assert!(
        err.contains(
            "dead-lettered after 5 attempts: order floor unavailable: PostgreSQL: pool timed out"
        ),
        "{err}"
    );
    assert!(
        err.contains("`companion replay --dlq` brings it back"),
        "{err}"
    );
    assert!(!err.contains("is a worker running"), "{err}");
    env.finish().await;
}
