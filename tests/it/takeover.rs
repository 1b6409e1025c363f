//! A moderator's takeover on the real stack: TB-Backend's admin tool publishes a pause or a resume on
//! `<prefix>.signal.takeover.<conversationId>`; while paused a DM is held (kept in history, no reply), the
//! resume answers the latest held message once (whatever is published again or redelivered), or none with
//! `catchUp: false`; an older resume changes nothing; what a moderator wrote meanwhile is in the history
//! the model reads on resume; a malformed signal is dead-lettered.

use std::time::Duration;

use bson::{doc, oid::ObjectId};
use chrono::{SecondsFormat, Utc};
use companion::testing::takeover::{self, Action};
use companion_dev::stub::{StubReply, always};
use companion_journal::State;
use companion_store::bus::event::Completion;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::env::*;

/// The moderator: not a participant of any conversation.
const MODERATOR: &str = "6650f1a2b3c4d5e6f7a8ffff";
const WELCOME: &str = "hey, i'm back! what's up?";

/// `at` as the admin tool writes it: now, moved by `secs`, RFC 3339 in milliseconds.
fn at(secs: i64) -> String {
    (Utc::now() + chrono::Duration::seconds(secs)).to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The body of a signal.
fn body(action: &str, at: &str) -> Value {
    json!({"action": action, "by": MODERATOR, "at": at, "reason": "checking in"})
}

/// Publishes a takeover signal as the admin tool does (`Nats-Msg-Id: <conversationId>:<action>:<at>`,
/// unless `msg_id` is given).
async fn signal(env: &TestEnv, conversation: &str, body: &Value, msg_id: Option<&str>) {
    let id = msg_id.map_or_else(
        || {
            format!(
                "{conversation}:{}:{}",
                body["action"].as_str().unwrap(),
                body["at"].as_str().unwrap()
            )
        },
        str::to_owned,
    );
    env.publish_raw(
        env.bus.names.takeover(conversation),
        &id,
        serde_json::to_vec(body).unwrap(),
    )
    .await;
}

/// The job of a signal.
fn job(conversation: &str, action: Action, at: &str) -> String {
    let at = chrono::DateTime::parse_from_rfc3339(at).unwrap().to_utc();
    takeover::job_id(conversation, action, at)
}

/// Waits until job `id` is settled; its state.
async fn settled(env: &TestEnv, id: &str) -> State {
    env.settled(id).await.state
}

/// Pauses the conversation and waits until the pause is in force.
async fn pause(env: &TestEnv, conversation: &str) -> String {
    let when = at(0);
    signal(env, conversation, &body("pause", &when), None).await;
    let id = job(conversation, Action::Pause, &when);
    assert_eq!(settled(env, &id).await, State::Done);
    assert!(env.pg.paused(conversation).await.unwrap());
    when
}

/// A DM from Jess to Kaori while paused: held, its text in history.
async fn held_dm(env: &TestEnv, text: &str) -> String {
    let e = env.dm(JESS, KAORI, JESS_KAORI, text).await;
    env.publish(&e).await;
    assert_eq!(settled(env, &e.message_id).await, State::Held, "{text}");
    let kept: Vec<String> =
        sqlx::query_scalar("SELECT content FROM bot_conversations WHERE message_id = $1")
            .bind(&e.message_id)
            .fetch_all(&env.pg.pool)
            .await
            .unwrap();
    assert_eq!(
        kept,
        vec![text.to_owned()],
        "the held message is in history"
    );
    e.message_id
}

/// No completion more, once every message and signal published so far is settled (a completion is
/// published before its message is acknowledged).
async fn nothing_more(
    env: &TestEnv,
    replies: &mut (impl futures::Stream<Item = Completion> + Unpin),
) {
    env.drained(Drained::Inbound).await;
    env.drained(Drained::Signals).await;
    if let Ok(Some(c)) = tokio::time::timeout(Duration::from_millis(200), replies.next()).await {
        panic!("unexpected completion {c:?}");
    }
}

#[tokio::test]
async fn a_paused_dm_is_held_and_the_resume_answers_the_latest_once() {
    let env = TestEnv::new(always(StubReply::text(WELCOME))).await;
    let worker = env.spawn_app().await;
    let mut replies = env.completions(JESS_KAORI).await;
    pause(&env, JESS_KAORI).await;
    let first = held_dm(&env, "hello?").await;
    let second = held_dm(&env, "anyone there?").await;
    assert!(env.stub.requests().is_empty(), "no model call while paused");

    let when = at(0);
    let resume = body("resume", &when);
    signal(&env, JESS_KAORI, &resume, None).await;
    let reply = next_reply_to(&mut replies, &second, Duration::from_secs(30)).await;
    assert_eq!(reply.content, WELCOME);
    let id = job(JESS_KAORI, Action::Resume, &when);
    assert_eq!(settled(&env, &id).await, State::Done);
    assert!(!env.pg.paused(JESS_KAORI).await.unwrap());

    // The same resume again (a duplicate for JetStream), and a copy under another message id, which
    // reaches the worker like a redelivery: its job is settled, nothing more is answered.
    signal(&env, JESS_KAORI, &resume, None).await;
    signal(&env, JESS_KAORI, &resume, Some("redelivered-resume")).await;
    let journal = env.journal();
    assert!(
        eventually(Duration::from_secs(20), || async {
            journal.get(&id).await.unwrap().unwrap().attempts >= 2
        })
        .await,
        "the second copy reached the worker"
    );
    nothing_more(&env, &mut replies).await;
    assert_eq!(env.replies_to(&second).await.len(), 1, "one reply");
    assert!(
        env.replies_to(&first).await.is_empty(),
        "the earlier held message stays unanswered"
    );
    assert_eq!(
        journal.get(&first).await.unwrap().unwrap().state,
        State::Held
    );
    assert_eq!(
        journal.get(&second).await.unwrap().unwrap().state,
        State::Done
    );
    assert_eq!(env.stub.requests().len(), 1, "one model call");
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_resume_older_than_the_pause_changes_nothing() {
    let env = TestEnv::new(always(StubReply::text(WELCOME))).await;
    let worker = env.spawn_app().await;
    let mut replies = env.completions(JESS_KAORI).await;
    pause(&env, JESS_KAORI).await;
    let stale = at(-60);
    signal(&env, JESS_KAORI, &body("resume", &stale), None).await;
    let id = job(JESS_KAORI, Action::Resume, &stale);
    assert_eq!(settled(&env, &id).await, State::Done);
    assert!(env.pg.paused(JESS_KAORI).await.unwrap(), "still paused");

    held_dm(&env, "still there?").await;
    nothing_more(&env, &mut replies).await;
    assert!(env.stub.requests().is_empty());
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_resume_without_catch_up_answers_nothing() {
    let env = TestEnv::new(always(StubReply::text(WELCOME))).await;
    let worker = env.spawn_app().await;
    let mut replies = env.completions(JESS_KAORI).await;
    pause(&env, JESS_KAORI).await;
    let held = held_dm(&env, "you there?").await;

    let when = at(0);
    let mut resume = body("resume", &when);
    resume["catchUp"] = false.into();
    signal(&env, JESS_KAORI, &resume, None).await;
    let id = job(JESS_KAORI, Action::Resume, &when);
    assert_eq!(settled(&env, &id).await, State::Done);
    assert!(!env.pg.paused(JESS_KAORI).await.unwrap(), "resumed");
    nothing_more(&env, &mut replies).await;
    assert_eq!(
        env.journal().get(&held).await.unwrap().unwrap().state,
        State::Held
    );
    assert!(env.stub.requests().is_empty());

    // The next message is answered as usual.
    let next = env.dm(JESS, KAORI, JESS_KAORI, "ok cool").await;
    env.publish(&next).await;
    let reply = next_reply_to(&mut replies, &next.message_id, Duration::from_secs(30)).await;
    assert_eq!(reply.content, WELCOME);
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn what_a_moderator_wrote_during_the_pause_is_in_the_history_the_model_reads() {
    const MOD_TEXT: &str = "Hi Jess, a TrickBook moderator here: just checking you're ok.";
    let env = TestEnv::new(always(StubReply::text(WELCOME))).await;
    let worker = env.spawn_app().await;
    let mut replies = env.completions(JESS_KAORI).await;
    pause(&env, JESS_KAORI).await;
    let held = held_dm(&env, "who is this?").await;
    // The app stores the moderator's message; the moderator is not a participant.
    let written = ObjectId::new();
    env.mongo
        .collection("dm_messages")
        .insert_one(doc! {
            "_id": written, "conversationId": oid(JESS_KAORI), "senderId": MODERATOR,
            "content": MOD_TEXT, "timestamp": bson::DateTime::now(), "read": false,
        })
        .await
        .unwrap();

    signal(&env, JESS_KAORI, &body("resume", &at(1)), None).await;
    let reply = next_reply_to(&mut replies, &held, Duration::from_secs(30)).await;
    assert_eq!(reply.content, WELCOME);
    let requests = env.stub.requests();
    assert_eq!(requests.len(), 1);
    let texts: Vec<&str> = requests[0]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert!(
        texts
            .iter()
            .any(|t| t.contains(MOD_TEXT) && t.contains("moderator")),
        "the model sees the moderator's message, labelled: {texts:?}"
    );
    assert_eq!(
        texts.iter().filter(|t| **t == "who is this?").count(),
        1,
        "the held message once, as the message answered: {texts:?}"
    );
    let moderator = texts.iter().position(|t| t.contains(MOD_TEXT)).unwrap();
    let asked = texts.iter().position(|t| *t == "who is this?").unwrap();
    assert!(
        moderator < asked,
        "the moderator's line comes before: {texts:?}"
    );
    let row: (String, String, String) =
        sqlx::query_as("SELECT role, user_id, bot_id FROM bot_conversations WHERE message_id = $1")
            .bind(written.to_hex())
            .fetch_one(&env.pg.pool)
            .await
            .unwrap();
    assert_eq!(row, ("moderator".into(), JESS.into(), KAORI.into()));
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_malformed_takeover_signal_is_dead_lettered_and_changes_nothing() {
    let env = TestEnv::new(always(StubReply::text(WELCOME))).await;
    let worker = env.spawn_app().await;
    signal(&env, JESS_KAORI, &body("stop", &at(0)), Some("bad-action")).await;
    signal(
        &env,
        JESS_KAORI,
        &body("pause", "yesterday"),
        Some("bad-at"),
    )
    .await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            env.dead_letters().await.len() == 2
        })
        .await,
        "both dead-lettered"
    );
    let reasons = env.dead_letter_reasons().await;
    assert!(
        reasons.iter().any(|r| r.contains("`action`")),
        "{reasons:?}"
    );
    assert!(reasons.iter().any(|r| r.contains("`at`")), "{reasons:?}");
    assert!(!env.pg.paused(JESS_KAORI).await.unwrap());
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn the_guide_s_node_code_pauses_a_conversation_once() {
    let env = TestEnv::new(always(StubReply::text(WELCOME))).await;
    let worker = env.spawn_app().await;
    let when = at(0);
    let pause =
        json!({"conversationId": JESS_KAORI, "action": "pause", "by": MODERATOR, "at": when})
            .to_string();
    let out = crate::tb_backend_bridge::bridge(&env, &["--takeover", &pause]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ack: Value = serde_json::from_slice(&out.stdout).expect("the PubAck as JSON");
    assert_eq!(ack["stream"], env.bus.names.stream_signal.as_str());
    assert_eq!(ack["duplicate"], false);
    assert_eq!(ack["msgID"], format!("{JESS_KAORI}:pause:{when}"));
    assert_eq!(ack["subject"], env.bus.names.takeover(JESS_KAORI));
    let id = job(JESS_KAORI, Action::Pause, &when);
    assert_eq!(settled(&env, &id).await, State::Done);
    assert!(env.pg.paused(JESS_KAORI).await.unwrap());

    let again = crate::tb_backend_bridge::bridge(&env, &["--takeover", &pause]).await;
    let ack: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(
        ack["duplicate"], true,
        "the same action again is a duplicate"
    );
    let bad = json!({"conversationId": JESS_KAORI, "action": "stop", "by": MODERATOR}).to_string();
    let out = crate::tb_backend_bridge::bridge(&env, &["--takeover", &bad]).await;
    assert_eq!(
        out.status.code(),
        Some(2),
        "refused before anything is published"
    );
    worker.stop().await;
    env.finish().await;
}

/// The history rows of conversation Jess–Kaori, oldest first: (role, message id).
async fn jess_kaori_history(env: &TestEnv) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT role, message_id FROM bot_conversations WHERE conversation_id = $1
         ORDER BY created_at, id",
    )
    .bind(JESS_KAORI)
    .fetch_all(&env.pg.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_reply_recorded_with_its_history_and_held_on_its_retry_leaves_no_word_of_it_in_history() {
    let env = TestEnv::new(always(StubReply::text("sure, here you go"))).await;
    let svc = env.spawn_app().await;
    let before = jess_kaori_history(&env).await.len();
    let e = env.dm(JESS, KAORI, JESS_KAORI, "got a minute?").await;
    let event = dm_event(&e);
    // The first attempt checks (the way is clear), records the reply with its history, and panics
    // before the reply's document.
    companion_core::fault::panic_at(&e.message_id, "store_reply", 1);
    let first = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(
        svc.pipeline.process_dm(&event),
    ))
    .await;
    assert!(first.is_err(), "the first attempt panicked");
    let reply_id: String = sqlx::query_scalar(
        "SELECT output ->> 'id' FROM job_steps WHERE job = $1 AND name = 'reply'",
    )
    .bind(&e.message_id)
    .fetch_one(&env.pg.pool)
    .await
    .unwrap();
    let said = |role: &str, id: &str| (role.to_owned(), id.to_owned());
    assert_eq!(
        jess_kaori_history(&env).await[before..],
        [said("user", &e.message_id), said("assistant", &reply_id)],
        "the reply's history was written with its record"
    );
    // A moderator pauses the conversation before the retry: the retry holds the message.
    stored_pause(&env, JESS_KAORI).await;
    let second = svc.pipeline.process_dm(&event).await;
    assert!(
        matches!(&second, Ok(companion::testing::pipeline::Outcome::Held)),
        "{second:?}"
    );
    assert!(env.replies_to(&e.message_id).await.is_empty());
    assert_eq!(
        jess_kaori_history(&env).await[before..],
        [said("user", &e.message_id)],
        "history holds the held message, and nothing of a reply never sent"
    );
    env.finish().await;
}
