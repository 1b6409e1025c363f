//! Reminders: the companion promises (`schedule_reminder`), NATS keeps the timer (a message schedule), and
//! the companion writes once at the time, whichever workers run then; a cancelled one never arrives; bad
//! times are error results the model reads.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use bson::doc;
use chrono::{DateTime, Utc};
use companion_dev::stub::{Responder, StubReply};
use companion_store::bus::event::Completion;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::env::*;

/// What the scripted model did: the `at` of the reminder it set, and the id to cancel.
#[derive(Default)]
struct Script {
    at: Option<DateTime<Utc>>,
    cancel: Option<String>,
}

/// "remind me …" sets a reminder `lead` ahead; "cancel it" cancels `script.cancel`; a due reminder's note
/// is answered with "⏰ wax your board!"; anything else with a short text.
fn model(lead: Duration, script: Arc<Mutex<Script>>) -> Responder {
    Arc::new(move |body: &Value| {
        let last = last_message(body);
        let text = last["content"].as_str().unwrap_or_default();
        match last["role"].as_str() {
            Some("user") if text.contains("remind me") => {
                let at = Utc::now() + chrono::Duration::from_std(lead).unwrap();
                script.lock().unwrap().at = Some(at);
                StubReply::tool(
                    "schedule_reminder",
                    json!({"text": "wax your board", "at": at.to_rfc3339()}),
                )
            }
            Some("user") if text.contains("cancel it") => {
                let id = script.lock().unwrap().cancel.clone().unwrap_or_default();
                StubReply::tool("cancel_reminder", json!({"reminderId": id}))
            }
            Some("system") => StubReply::text("⏰ wax your board!"),
            _ => StubReply::text("got it"),
        }
    })
}

async fn env_with(lead: Duration) -> (TestEnv, Arc<Mutex<Script>>) {
    let script = Arc::new(Mutex::new(Script::default()));
    let env = TestEnv::with(model(lead, script.clone()), |c| {
        c.turn.reminder_min_lead_secs = 1;
        c.consumer.ack_wait_secs = 5;
    })
    .await;
    (env, script)
}

/// Asks for a reminder and returns its id (from the tool's result), after the turn settled.
async fn ask_for_reminder(env: &TestEnv) -> String {
    let event = env
        .dm(JESS, KAORI, JESS_KAORI, "remind me to wax my board")
        .await;
    let reply = env.turn(&event).await;
    assert_eq!(reply.content, "got it");
    let data = last_tool_result(&env.stub);
    assert_eq!(data["state"], "pending", "{data}");
    data["reminderId"].as_str().unwrap().to_owned()
}

async fn next_proactive(
    replies: &mut (impl futures::Stream<Item = Completion> + Unpin),
    within: Duration,
) -> Option<(Completion, DateTime<Utc>)> {
    tokio::time::timeout(within, async {
        while let Some(c) = replies.next().await {
            if c.proactive {
                return Some((c, Utc::now()));
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
}

async fn messages_for(env: &TestEnv, id: &str) -> u64 {
    env.mongo
        .collection("dm_messages")
        .count_documents(doc! { "trigger.id": id })
        .await
        .unwrap()
}

/// Where the reminder stands: pending or cancelled (its row), sent or dropped (its job).
async fn reminder_state(env: &TestEnv, id: &str) -> String {
    let r = env.pg.reminder(id).await.unwrap().expect("the reminder");
    r.state.as_str().to_owned()
}

#[tokio::test]
async fn a_reminder_fires_once_at_its_time_with_two_workers_running() {
    let (env, script) = env_with(Duration::from_secs(3)).await;
    let mut workers = [env.spawn_app_process(&[]), env.spawn_app_process(&[])];
    let mut replies = env.completions(JESS_KAORI).await;
    let id = ask_for_reminder(&env).await;
    let at = script.lock().unwrap().at.unwrap();

    let (c, arrived) = next_proactive(&mut replies, Duration::from_secs(30))
        .await
        .expect("the reminder arrives");
    assert!(arrived >= at, "arrived {arrived}, due {at}");
    assert_eq!(c.content, "⏰ wax your board!");
    assert_eq!(c.sender_id, KAORI);
    let trigger = c.trigger.unwrap();
    assert_eq!(
        (trigger.kind.as_str(), trigger.id.as_str()),
        ("reminder", id.as_str())
    );
    // The model knew what it had promised.
    let brief = last_message(env.stub.requests().last().unwrap())["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(brief.contains("wax your board"), "{brief}");

    assert!(
        next_proactive(&mut replies, Duration::from_secs(4))
            .await
            .is_none(),
        "nothing more"
    );
    assert_eq!(messages_for(&env, &id).await, 1);
    assert_eq!(reminder_state(&env, &id).await, "sent");
    for w in &mut workers {
        stop(w);
    }
    env.finish().await;
}

#[tokio::test]
async fn a_reminder_due_while_every_worker_is_stopped_fires_once_when_one_starts() {
    let (env, script) = env_with(Duration::from_secs(3)).await;
    let mut first = env.spawn_app_process(&[]);
    let mut second = env.spawn_app_process(&[]);
    let mut replies = env.completions(JESS_KAORI).await;
    let id = ask_for_reminder(&env).await;
    stop(&mut first);
    stop(&mut second);
    let at = script.lock().unwrap().at.unwrap();
    let wait = (at - Utc::now()).to_std().unwrap_or_default() + Duration::from_secs(3);
    assert!(
        next_proactive(&mut replies, wait).await.is_none(),
        "no worker, no message (yet)"
    );
    assert_eq!(reminder_state(&env, &id).await, "pending");

    let mut later = env.spawn_app_process(&[]);
    let (c, _) = next_proactive(&mut replies, Duration::from_secs(30))
        .await
        .expect("the reminder arrives once a worker runs");
    assert_eq!(c.trigger.unwrap().id, id);
    assert!(
        next_proactive(&mut replies, Duration::from_secs(3))
            .await
            .is_none()
    );
    assert_eq!(messages_for(&env, &id).await, 1);
    stop(&mut later);
    env.finish().await;
}

#[tokio::test]
async fn a_cancelled_reminder_never_arrives() {
    let (env, script) = env_with(Duration::from_secs(4)).await;
    env.spawn_app().await;
    let mut replies = env.completions(JESS_KAORI).await;
    let id = ask_for_reminder(&env).await;
    script.lock().unwrap().cancel = Some(id.clone());
    let cancel = env.dm(JESS, KAORI, JESS_KAORI, "actually cancel it").await;
    env.turn(&cancel).await;
    assert_eq!(reminder_state(&env, &id).await, "cancelled");
    // The companion saw the pending reminder in its context when asked to cancel it.
    let asked: Vec<Value> = env.stub.requests();
    let system = asked
        .iter()
        .rev()
        .find(|r| last_message(r)["content"] == "actually cancel it")
        .expect("the cancel turn asked the model")["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        system.contains("Reminders you promised them")
            && system.contains(&id)
            && system.contains("wax your board"),
        "{system}"
    );

    let at = script.lock().unwrap().at.unwrap();
    let wait = (at - Utc::now()).to_std().unwrap_or_default() + Duration::from_secs(4);
    assert!(
        next_proactive(&mut replies, wait).await.is_none(),
        "never arrives"
    );
    // The schedule did fire, and its job was dropped.
    let journal = env.journal();
    assert!(
        eventually(Duration::from_secs(10), || async {
            journal
                .get(&format!("reminder:{id}"))
                .await
                .unwrap()
                .is_some_and(|j| j.state == companion_journal::State::Dropped)
        })
        .await
    );
    assert_eq!(messages_for(&env, &id).await, 0);
    env.finish().await;
}

#[tokio::test]
async fn bad_times_and_too_many_reminders_are_error_results() {
    let env = TestEnv::new(companion_dev::stub::always(StubReply::text("x"))).await;
    let tj = env.tool_job(JESS).await;
    let tools = &tj.tools;
    let call = |args: Value| {
        let ctx = tj.ctx();
        async move {
            tools
                .dispatch("schedule_reminder", &args.to_string(), &ctx)
                .await
        }
    };
    let now = Utc::now();
    let rfc = |d: chrono::Duration| (now + d).to_rfc3339();
    for (args, field, says) in [
        (
            json!({"text": "x", "at": rfc(chrono::Duration::minutes(-5))}),
            "at",
            "at least 60 seconds",
        ),
        (
            json!({"text": "x", "at": rfc(chrono::Duration::seconds(20))}),
            "at",
            "at least 60 seconds",
        ),
        (
            json!({"text": "x", "at": rfc(chrono::Duration::days(31))}),
            "at",
            "at most 30 days",
        ),
        (
            json!({"text": "x", "at": "2026-11-28T09:00:00"}),
            "at",
            "RFC 3339",
        ),
        (
            json!({"text": "x", "at": "next tuesday at nine"}),
            "at",
            "RFC 3339",
        ),
        (
            json!({"text": "   ", "at": rfc(chrono::Duration::hours(2))}),
            "text",
            "",
        ),
        (
            json!({"text": "x".repeat(201), "at": rfc(chrono::Duration::hours(2))}),
            "text",
            "",
        ),
        (
            json!({"text": "x", "at": rfc(chrono::Duration::hours(2)), "user": SAM}),
            "",
            "never for anyone else",
        ),
    ] {
        let r = call(args.clone()).await;
        let e = r.outcome.as_ref().expect_err(&format!("{args} is refused"));
        let model = e.to_model();
        if !field.is_empty() {
            assert_eq!(model["field"], field, "{args}: {model}");
        }
        assert!(
            model["error"].as_str().unwrap().contains(says),
            "{args}: {model}"
        );
    }
    let none: i64 = sqlx::query_scalar("SELECT count(*) FROM reminders")
        .fetch_one(&env.pg.pool)
        .await
        .unwrap();
    assert_eq!(none, 0, "nothing stored for a refused call");

    // Ten pending at most (the write quota is 5 per hour: two turns' worth of jobs).
    let mut made = 0;
    for _ in 0..2 {
        let tj = env.tool_job(JESS).await;
        for _ in 0..5 {
            let r = tj
                .tools
                .dispatch(
                    "schedule_reminder",
                    &json!({"text": "x", "at": rfc(chrono::Duration::hours(2))}).to_string(),
                    &tj.ctx(),
                )
                .await;
            if r.outcome.is_ok() {
                made += 1;
            }
        }
    }
    assert_eq!(made, 5, "the write quota counts reminders");
    sqlx::query("DELETE FROM job_steps WHERE tally IS NOT NULL")
        .execute(&env.pg.pool)
        .await
        .unwrap();
    for _ in 0..5 {
        let r = call(json!({"text": "x", "at": rfc(chrono::Duration::hours(2))})).await;
        assert!(r.outcome.is_ok(), "{:?}", r.outcome.err());
    }
    let r = call(json!({"text": "x", "at": rfc(chrono::Duration::hours(2))})).await;
    let e = r.outcome.expect_err("the eleventh is refused").to_model();
    assert!(e["error"].as_str().unwrap().contains("10 pending"), "{e}");
    env.finish().await;
}

/// The terminal chat (piped) shows a follow-up that comes after its last line: it waits for the
/// reminders due within its wait, and prints each as it arrives.
#[tokio::test]
async fn the_piped_chat_waits_for_a_reminder_due_soon_and_shows_it() {
    let (env, _) = env_with(Duration::from_secs(3)).await;
    let worker = env.spawn_app().await;
    let config = companion_dev::chat::ChatConfig {
        nats: env.config.nats.clone(),
        mongo: env.config.mongo.clone(),
        pg: env.config.pg.clone(),
        characters: env.config.characters.clone(),
        raw_cards: false,
        ids: false,
    };
    let session = companion_dev::chat::Session::open(&config, "jess", "kaori")
        .await
        .expect("a chat session");
    let mut follow_ups = companion_dev::chat::FollowUps::listen(&session, false)
        .await
        .expect("listening");
    let turn = session
        .say(
            "remind me to wax my board",
            &[],
            Some(Duration::from_secs(30)),
        )
        .await
        .expect("a reply");
    let said: Vec<&str> = turn.replies.iter().map(|r| r.content.as_str()).collect();
    assert_eq!(said, ["got it"]);
    let came = follow_ups
        .linger(&session, Duration::from_secs(30))
        .await
        .expect("lingered");
    assert_eq!(came, 1, "the reminder came while the chat waited");
    // It came already: the next wait returns at once (well within its minute).
    let again = tokio::time::timeout(
        Duration::from_secs(10),
        follow_ups.linger(&session, Duration::from_secs(60)),
    )
    .await
    .expect("no wait for a reminder already shown")
    .unwrap();
    assert_eq!(again, 1);
    worker.stop().await;
    env.finish().await;
}
