//! Long-term memory (docs/memory.md): facts learned off the reply path and recalled 150 turns later,
//! "remember"/"forget", updates that replace, no duplicate after `kill -9` or a replay, deletion that
//! sticks (a message, a user's memory, the user), no DM fact in a group, nothing from a crisis message.
//! The scripted model answers the worker's extraction and summary requests by rules
//! (`companion_dev::memory_rules`).

use std::{sync::Arc, time::Duration};

use companion_dev::stub::{self, Responder, StubReply, last_user_text};
use companion_journal::State;
use companion_store::bus::event::InboundEvent;
use serde_json::{Value, json};

use crate::env::*;

/// A companion that answers "ok", calls `remember`/`forget` when the user asks (and the tool is
/// offered), and reads back a tool's result as "done".
fn model() -> Responder {
    stub::with_memory(Arc::new(|body: &Value| {
        let last = last_message(body);
        if last["role"] == "tool" {
            return StubReply::text("done");
        }
        let text = last["content"].as_str().unwrap_or_default().to_lowercase();
        let offered = |name: &str| {
            body["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| t["function"]["name"] == name)
        };
        if let Some((_, fact)) = text.split_once("remember ")
            && offered("remember")
        {
            let fact = companion_dev::memory_rules::facts_in(fact)
                .into_iter()
                .next()
                .map_or_else(|| fact.to_owned(), |(_, f)| f);
            return StubReply::tool("remember", json!({ "fact": fact }));
        }
        if let Some((_, about)) = text.split_once("forget ")
            && offered("forget")
        {
            return StubReply::tool("forget", json!({ "about": about }));
        }
        StubReply::text("ok")
    }))
}

/// `responder`, with its answers to memory's requests (extraction, summaries) `after` a delay.
fn slow_memory(responder: Responder, after: Duration) -> Responder {
    Arc::new(move |body: &Value| {
        let reply = responder(body);
        match companion_dev::memory_rules::answer(body) {
            Some(_) => StubReply::Delayed(after, Box::new(reply)),
            None => reply,
        }
    })
}

async fn memory_env(extract_after: i64) -> TestEnv {
    let env = TestEnv::with(model(), |c| {
        c.memory.extract_after = extract_after;
        c.memory.quiet_secs = 3600;
        // One user sends faster here than people do.
        c.turn.user_turns_per_minute = 0;
    })
    .await;
    env.spawn_app().await;
    env
}

/// Everything the model was sent for the latest chat request whose last user message is `text`.
fn prompt_for(env: &TestEnv, text: &str) -> String {
    env.stub
        .requests()
        .into_iter()
        .rev()
        .find(|b| {
            b["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .rev()
                .find(|m| m["role"] == "user")
                .is_some_and(|m| m["content"].as_str().is_some_and(|c| c.ends_with(text)))
        })
        .map(|b| b["messages"].to_string())
        .unwrap_or_else(|| panic!("no request for {text:?}"))
}

/// The facts kept for (user, Kaori): (topic, fact), newest first.
async fn facts(env: &TestEnv, user: &str) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT topic, fact FROM memory_facts WHERE user_id = $1 AND bot_id = $2
         ORDER BY learned_at DESC, id",
    )
    .bind(user)
    .bind(KAORI)
    .fetch_all(&env.pg.pool)
    .await
    .unwrap()
}

/// Waits until `count` facts are kept for `user`; their list.
async fn facts_eventually(env: &TestEnv, user: &str, count: usize) -> Vec<(String, String)> {
    let reached = eventually(Duration::from_secs(40), || async {
        facts(env, user).await.len() >= count
    })
    .await;
    let got = facts(env, user).await;
    assert!(reached, "{count} facts expected, got {got:?}");
    got
}

async fn say(env: &TestEnv, text: &str) -> String {
    let event = env.dm(JESS, KAORI, JESS_KAORI, text).await;
    env.turn(&event).await;
    event.message_id
}

/// How often `needle` is in any of the service's tables that could hold a user's words.
async fn traces(env: &TestEnv, needle: &str) -> Vec<(String, i64)> {
    let like = format!("%{needle}%");
    let mut out = Vec::new();
    for (table, column) in [
        ("bot_conversations", "content"),
        ("memory_facts", "fact"),
        ("memory_state", "summary"),
        ("job_steps", "output::text"),
        ("reminders", "text"),
        ("flow_states", "slots::text"),
    ] {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} WHERE {column} ILIKE $1"
        )))
        .bind(&like)
        .fetch_one(&env.pg.pool)
        .await
        .unwrap();
        if n > 0 {
            out.push((table.to_owned(), n));
        }
    }
    out
}

/// Small talk with no fact in it, as the 150 turns between.
const CHATTER: &[&str] = &[
    "lol that's sick",
    "what do you think about the new deck graphics this year",
    "it rained all day here",
    "haha no way",
    "did you see that video of the huge gap",
    "ok cool",
    "what's the difference between a slide and a grind",
    "my friends are all at school",
    "that sounds fun",
    "how long should wax last on a rail",
];

#[tokio::test]
async fn a_fact_told_in_turn_one_is_recalled_150_turns_later_and_an_unrelated_question_does_not_pull_in_every_fact()
 {
    let env = memory_env(10).await;
    say(&env, "i broke my wrist last month").await;
    say(&env, "my home park is burnside").await;
    say(&env, "i'm scared of dropping in").await;
    for i in 0..147 {
        say(&env, CHATTER[i % CHATTER.len()]).await;
    }
    let kept = facts_eventually(&env, JESS, 3).await;
    assert_eq!(kept.len(), 3, "no fact from small talk: {kept:?}");
    // The summary of what left the window has been written too.
    let summary: String =
        sqlx::query_scalar("SELECT summary FROM memory_state WHERE user_id = $1 AND bot_id = $2")
            .bind(JESS)
            .bind(KAORI)
            .fetch_one(&env.pg.pool)
            .await
            .unwrap();
    assert!(!summary.is_empty());

    let related = "my wrist feels weird when i land, should i keep riding?";
    say(&env, related).await;
    let prompt = prompt_for(&env, related);
    assert!(prompt.contains("broke their wrist last month"), "{prompt}");
    // The history window (20 messages) no longer holds turn 1.
    assert!(!prompt.contains("i broke my wrist last month"), "{prompt}");
    assert!(prompt.contains("home spot is burnside"), "pinned: {prompt}");
    assert!(
        prompt.contains("## Earlier in your chats (summary)"),
        "the summary of what left the window: {prompt}"
    );

    let unrelated = "what wax is best for cold snow";
    say(&env, unrelated).await;
    let prompt = prompt_for(&env, unrelated);
    assert!(prompt.contains("home spot is burnside"), "pinned: {prompt}");
    assert!(!prompt.contains("broke their wrist"), "{prompt}");
    assert!(!prompt.contains("scared of dropping in"), "{prompt}");
    env.finish().await;
}

/// Memory hears of a turn through a step of the turn's journal: a crash after the reply went out and
/// before the job settled publishes the extraction signal on the retry, so the fact is still learned,
/// and the reply is not sent twice.
#[tokio::test]
async fn a_crash_after_the_reply_went_out_still_triggers_the_extraction() {
    let env = memory_env(1).await;
    let event = env
        .dm(JESS, KAORI, JESS_KAORI, "i broke my wrist last month")
        .await;
    companion_core::fault::panic_at(&event.message_id, "memory_trigger", 1);
    env.turn(&event).await;
    let record = env.settled(&event.message_id).await;
    assert_eq!(
        record.attempts, 2,
        "the attempt that crashed, then the retry: {record:?}"
    );
    let kept = facts_eventually(&env, JESS, 1).await;
    assert!(kept.iter().any(|(_, f)| f.contains("wrist")), "{kept:?}");
    assert_eq!(env.replies_to(&event.message_id).await.len(), 1);
    env.finish().await;
}

#[tokio::test]
async fn remember_is_in_the_next_prompt_and_forget_removes_it() {
    let env = memory_env(100).await;
    say(&env, "remember i ride goofy").await;
    let result = last_tool_result(&env.stub);
    assert_eq!(result["remembered"], "rides goofy", "{result}");
    assert_eq!(
        facts(&env, JESS).await,
        [("stance".into(), "rides goofy".into())]
    );
    say(&env, "which foot should be in front for a drop in?").await;
    let prompt = prompt_for(&env, "which foot should be in front for a drop in?");
    assert!(prompt.contains("- stance: rides goofy"), "{prompt}");

    say(&env, "forget that i ride goofy").await;
    let result = last_tool_result(&env.stub);
    assert_eq!(result["forgotten"], json!(["rides goofy"]), "{result}");
    assert!(facts(&env, JESS).await.is_empty());
    say(&env, "and for a kickturn?").await;
    // Gone from what the companion remembers (the chat itself still shows what was said).
    let prompt = prompt_for(&env, "and for a kickturn?");
    assert!(!prompt.contains("- stance: rides goofy"), "{prompt}");
    env.finish().await;
}

/// Jess's facts with Kaori, sorted.
async fn kept(env: &TestEnv) -> Vec<String> {
    let mut f: Vec<String> = facts(env, JESS).await.into_iter().map(|(_, f)| f).collect();
    f.sort();
    f
}

/// Jess's facts with Kaori, replaced by: the stance, the home spot, two goals and a fear.
async fn seed_facts(env: &TestEnv) {
    use companion_memory::{How, Memory, NewFact, Topic};
    sqlx::query("DELETE FROM memory_facts WHERE user_id = $1")
        .bind(JESS)
        .execute(&env.pg.pool)
        .await
        .unwrap();
    let now = chrono::Utc::now();
    let mut tx = env.pg.pool.begin().await.unwrap();
    for (n, (topic, fact)) in [
        (Topic::Stance, "rides goofy"),
        (Topic::HomeSpot, "home park is glenhaven"),
        (Topic::Goal, "wants to learn a kickflip"),
        (Topic::Goal, "wants to land a tre flip this summer"),
        (Topic::Fear, "scared of dropping in"),
    ]
    .into_iter()
    .enumerate()
    {
        let new = NewFact {
            id: format!("seed-{n}"),
            topic,
            fact: fact.into(),
            sources: vec![],
            how: How::Remembered,
            said_at: now,
        };
        Memory::keep(&mut tx, JESS, KAORI, &new, None, 50)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn forget_finds_a_topic_named_alone_or_a_fact_by_its_words_and_says_when_nothing_matches() {
    let env = memory_env(100).await;
    let without = |gone: &[&str]| -> Vec<String> {
        [
            "rides goofy",
            "home park is glenhaven",
            "wants to learn a kickflip",
            "wants to land a tre flip this summer",
            "scared of dropping in",
        ]
        .into_iter()
        .filter(|f| !gone.contains(f))
        .map(str::to_owned)
        .collect()
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    for asked in [
        "forget my stance",
        "forget what i told you about my stance",
        "forget that i ride goofy",
    ] {
        seed_facts(&env).await;
        say(&env, asked).await;
        let result = last_tool_result(&env.stub);
        assert_eq!(
            result["forgotten"],
            json!(["rides goofy"]),
            "{asked}: {result}"
        );
        assert_eq!(
            kept(&env).await,
            sorted(without(&["rides goofy"])),
            "{asked}"
        );
    }

    seed_facts(&env).await;
    say(&env, "forget my goals").await;
    let result = last_tool_result(&env.stub);
    assert_eq!(result["count"], 2, "{result}");
    assert_eq!(
        kept(&env).await,
        sorted(without(&[
            "wants to learn a kickflip",
            "wants to land a tre flip this summer"
        ]))
    );

    seed_facts(&env).await;
    say(&env, "forget my cat").await;
    let result = last_tool_result(&env.stub);
    assert_eq!(result["count"], 0, "{result}");
    assert!(
        result["note"]
            .as_str()
            .is_some_and(|n| n.contains("nothing was forgotten")),
        "{result}"
    );
    let listed: Vec<&str> = result["remembered"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["fact"].as_str())
        .collect();
    assert_eq!(listed.len(), 5, "what is remembered is listed: {result}");
    assert!(listed.contains(&"rides goofy"));
    assert_eq!(kept(&env).await.len(), 5, "nothing was removed");
    env.finish().await;
}

#[tokio::test]
async fn a_remembered_statement_with_two_topics_is_two_facts_and_forgetting_one_keeps_the_other() {
    let base = model();
    let two: Responder = Arc::new(move |body: &Value| {
        let last = last_message(body);
        if last["role"] == "user" && last_user_text(body).contains("remember that i ride goofy") {
            return StubReply::tool(
                "remember",
                json!({ "fact": "rides goofy and home park is glenhaven" }),
            );
        }
        base(body)
    });
    let env = TestEnv::with(two, |c| {
        c.memory.extract_after = 100;
        c.memory.quiet_secs = 3600;
    })
    .await;
    env.spawn_app().await;
    say(
        &env,
        "remember that i ride goofy and my home park is glenhaven",
    )
    .await;
    let result = last_tool_result(&env.stub);
    assert_eq!(
        result["remembered"].as_array().map(Vec::len),
        Some(2),
        "{result}"
    );
    assert_eq!(
        kept(&env).await,
        ["home park is glenhaven", "rides goofy"],
        "one fact per topic"
    );
    say(&env, "forget my stance").await;
    assert_eq!(kept(&env).await, ["home park is glenhaven"]);
    env.finish().await;
}

#[tokio::test]
async fn a_superseding_fact_replaces_the_old_one_whether_remembered_or_learned() {
    let env = memory_env(1).await;
    say(&env, "remember i ride goofy").await;
    say(&env, "remember i switched to regular stance").await;
    assert_eq!(
        facts(&env, JESS).await,
        [("stance".into(), "rides regular".into())]
    );
    // The same by extraction (one user message per run): an update, and a repeat kept once.
    say(&env, "i'm scared of dropping in").await;
    say(&env, "my home park is burnside").await;
    let _ = facts_eventually(&env, JESS, 3).await;
    say(&env, "my home park is lincoln city now").await;
    say(&env, "i'm scared of dropping in").await;
    let reached = eventually(Duration::from_secs(30), || async {
        facts(&env, JESS)
            .await
            .contains(&("home_spot".into(), "home spot is lincoln city now".into()))
    })
    .await;
    let kept = facts(&env, JESS).await;
    assert!(reached, "{kept:?}");
    let mut kept = kept;
    kept.sort();
    assert_eq!(
        kept,
        [
            ("fear".into(), "is scared of dropping in".into()),
            ("home_spot".into(), "home spot is lincoln city now".into()),
            ("stance".into(), "rides regular".into()),
        ]
    );
    env.finish().await;
}

/// A `remember` and an extraction keep a fact of one one-value topic at the same moment, each in its
/// own transaction, held open past the write: the second waits for the first and replaces it (or is
/// older and stays out), so one value is kept. Without the per-(user, companion) lock both found nothing
/// to replace and both were inserted (seen once in a loaded CI run of the test above).
#[tokio::test]
async fn two_writers_of_one_topic_at_once_keep_one_value() {
    use companion_memory::{How, Memory, NewFact, Topic};
    let env = TestEnv::new(stub::always(StubReply::text("ok"))).await;
    let now = chrono::Utc::now();
    let write = |id: &'static str, fact: &'static str, how: How, said_secs: i64| {
        let pool = env.pg.pool.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            let new = NewFact {
                id: id.into(),
                topic: Topic::Stance,
                fact: fact.into(),
                sources: vec![],
                how,
                said_at: now + chrono::Duration::seconds(said_secs),
            };
            Memory::keep(&mut tx, JESS, KAORI, &new, None, 50)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            tx.commit().await.unwrap();
        }
    };
    tokio::join!(
        write("race-goofy", "rides goofy", How::Extracted, 0),
        write("race-regular", "rides regular", How::Remembered, 1),
    );
    assert_eq!(
        facts(&env, JESS).await,
        [("stance".into(), "rides regular".into())]
    );
    env.finish().await;
}

#[tokio::test]
async fn a_crisis_message_yields_no_fact() {
    let env = memory_env(1).await;
    let crisis = env
        .dm(
            JESS,
            KAORI,
            JESS_KAORI,
            "i broke my wrist last month and honestly i just want to die, i don't see the point anymore",
        )
        .await;
    env.publish(&crisis).await;
    env.settled(&crisis.message_id).await;
    say(&env, "my home park is burnside").await;
    let kept = facts_eventually(&env, JESS, 1).await;
    assert_eq!(kept, [("home_spot".into(), "home spot is burnside".into())]);
    // Nor is it kept when asked: the message is a crisis (the referral, no tools), and the next run
    // skips it.
    let asked = env
        .dm(JESS, KAORI, JESS_KAORI, "remember i just want to die")
        .await;
    env.publish(&asked).await;
    env.settled(&asked.message_id).await;
    say(&env, "i want to learn kickflips").await;
    let kept = facts_eventually(&env, JESS, 2).await;
    assert!(kept.iter().all(|(_, f)| !f.contains("die")), "{kept:?}");
    assert_eq!(kept.len(), 2, "{kept:?}");
    env.finish().await;
}

#[tokio::test]
async fn a_dm_fact_never_appears_in_a_group_prompt_and_remember_there_says_why_not() {
    let env = memory_env(100).await;
    say(&env, "remember i ride goofy").await;
    let group =
        companion_dev::backend::create_group(&env.mongo, &[oid(JESS), oid(SAM)], &[oid(KAORI)])
            .await
            .expect("group created")
            .to_hex();
    let mut replies = env.completions(&group).await;
    for text in [
        "kaori, which foot forward for me?",
        "kaori remember i ride goofy",
    ] {
        let e =
            companion_dev::backend::store_group_message(&env.mongo, oid(&group), oid(JESS), text)
                .await
                .expect("stored");
        companion_dev::backend::publish_group_message(&env.bus, &e)
            .await
            .expect("published");
        let answered = eventually(Duration::from_secs(30), || async {
            env.stub
                .requests()
                .iter()
                .any(|b| b["messages"].to_string().contains(text))
        })
        .await;
        assert!(answered, "the group message was answered");
        let _ = tokio::time::timeout(
            Duration::from_secs(10),
            futures::StreamExt::next(&mut replies),
        )
        .await;
    }
    let prompt = prompt_for(&env, "which foot forward for me?");
    assert!(
        !prompt.contains("goofy"),
        "a DM fact in a group prompt: {prompt}"
    );
    let refused = env
        .stub
        .requests()
        .into_iter()
        .rev()
        .find_map(|b| {
            let last = last_message(&b);
            (last["role"] == "tool")
                .then(|| last["content"].as_str().unwrap_or_default().to_owned())
        })
        .expect("the tool result");
    assert!(refused.contains("group chat"), "{refused}");
    assert_eq!(
        facts(&env, JESS).await.len(),
        1,
        "nothing kept from the group"
    );
    env.finish().await;
}

#[tokio::test]
async fn kill_9_during_extraction_and_a_replay_of_its_job_leave_no_duplicate() {
    // Extraction answers take 4 s: long enough to kill the worker while one waits.
    let delayed = slow_memory(
        stub::with_memory(Arc::new(|_| StubReply::text("ok"))),
        Duration::from_secs(4),
    );
    let env = TestEnv::with(delayed, |c| {
        c.memory.extract_after = 2;
        c.memory.quiet_secs = 3600;
        c.consumer.ack_wait_secs = 3;
    })
    .await;
    let mut worker = env.spawn_app_process(&[]);
    for text in ["my home park is burnside", "i'm scared of dropping in"] {
        let e = env.dm(JESS, KAORI, JESS_KAORI, text).await;
        env.publish(&e).await;
        env.settled(&e.message_id).await;
    }
    let asked = eventually(Duration::from_secs(20), || async {
        env.stub
            .requests()
            .iter()
            .any(|b| companion_dev::memory_rules::answer(b).is_some())
    })
    .await;
    assert!(asked, "the extraction asked the model");
    worker.kill().expect("kill -9");
    let _ = worker.wait();
    assert!(
        facts(&env, JESS).await.is_empty(),
        "killed before anything was kept"
    );
    let _worker = env.spawn_app_process(&[]);
    let kept = facts_eventually(&env, JESS, 2).await;
    assert_eq!(kept.len(), 2, "{kept:?}");

    // The extraction signal again (another id), and the job forced to run again: nothing doubles.
    let jobs: Vec<String> =
        sqlx::query_scalar("SELECT id FROM jobs WHERE kind = 'memory' ORDER BY created_at")
            .fetch_all(&env.pg.pool)
            .await
            .unwrap();
    let first = jobs.first().expect("an extraction job").clone();
    env.journal().reopen(&first, &[]).await.expect("reopened");
    sqlx::query(
        "UPDATE memory_state SET extracted_through = 0, summarized_through = 0 WHERE user_id = $1",
    )
    .bind(JESS)
    .execute(&env.pg.pool)
    .await
    .unwrap();
    env.publish_raw(env.bus.names.memory(JESS, KAORI), "again-1", "")
        .await;
    let rerun = eventually(Duration::from_secs(30), || async {
        env.journal()
            .get(&first)
            .await
            .unwrap()
            .is_some_and(|j| j.state.is_settled())
    })
    .await;
    assert!(rerun, "the reopened job ran again");
    // Every signal settled, the second extraction signal too: nothing is still running.
    env.drained(Drained::Signals).await;
    let again = facts(&env, JESS).await;
    assert_eq!(again.len(), 2, "{again:?}");
    env.finish().await;
}

/// [`model`], with the chat requests `asked` picks (one about the locker code 4471) answered after 4 s
/// with an answer that repeats the code, as a model would: its record must not keep it either. Memory's
/// own requests are not slowed.
fn slow_on_the_code(asked: fn(&Value) -> bool) -> Responder {
    let base = model();
    Arc::new(move |body: &Value| {
        let chat = companion_dev::memory_rules::answer(body).is_none();
        match chat && asked(body) {
            true => StubReply::Delayed(
                Duration::from_secs(4),
                Box::new(StubReply::text("got it, 4471 is safe with me")),
            ),
            false => base(body),
        }
    })
}

/// Jess tells Kaori her locker code; returns once the turn has asked the model (which, with
/// [`slow_on_the_code`], then waits).
async fn locker_code_asked(env: &TestEnv) -> InboundEvent {
    let e = env
        .dm(JESS, KAORI, JESS_KAORI, "my locker code is 4471")
        .await;
    env.publish(&e).await;
    let waiting = eventually(Duration::from_secs(30), || async {
        env.stub
            .requests()
            .iter()
            .any(|b| last_user_text(b).contains("4471"))
    })
    .await;
    assert!(waiting, "the turn asked the model");
    e
}

/// Returns once an extraction has asked the model.
async fn extraction_asked(env: &TestEnv) {
    let extracting = eventually(Duration::from_secs(30), || async {
        env.stub
            .requests()
            .iter()
            .any(|b| companion_dev::memory_rules::answer(b).is_some())
    })
    .await;
    assert!(extracting, "an extraction asked the model");
}

#[tokio::test]
async fn a_message_deleted_while_its_turn_waits_on_the_model_is_in_no_history_and_no_later_prompt()
{
    // The turn of the locker code waits 4 s on the model; memory's own requests do not.
    let slow = slow_on_the_code(|body| last_user_text(body).contains("4471"));
    let env = TestEnv::with(slow, |c| {
        c.memory.extract_after = 1;
        c.memory.quiet_secs = 3600;
        c.turn.user_turns_per_minute = 0;
    })
    .await;
    env.spawn_app().await;
    let e = locker_code_asked(&env).await;
    // Deleted while its turn waits on the model; the deletion settles first.
    env.signal(
        "message_deleted",
        &e.message_id,
        &format!("del-{}", e.message_id),
        "",
    )
    .await;
    env.drained(Drained::Signals).await;
    let record = env.settled(&e.message_id).await;
    assert_eq!(
        (record.state, record.reason.as_deref()),
        (State::Dropped, Some("deleted")),
        "{record:?}"
    );
    env.drained(Drained::Signals).await;
    assert!(
        env.replies_to(&e.message_id).await.is_empty(),
        "no reply is written to a deleted message"
    );
    // Stopped by the check before delivery (read with the reply's record), not withdrawn after it.
    let delivered: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM job_records WHERE job = $1 AND name IN ('store_reply', 'withdraw')",
    )
    .bind(&e.message_id)
    .fetch_all(&env.pg.pool)
    .await
    .unwrap();
    assert!(delivered.is_empty(), "{delivered:?}");
    assert!(
        traces(&env, "4471").await.is_empty(),
        "{:?}",
        traces(&env, "4471").await
    );
    let history: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM bot_conversations WHERE content ILIKE '%4471%' OR message_id = $1",
    )
    .bind(&e.message_id)
    .fetch_one(&env.pg.pool)
    .await
    .unwrap();
    assert_eq!(history, 0, "the deleted message came back into the history");
    assert!(
        facts(&env, JESS)
            .await
            .iter()
            .all(|(_, f)| !f.contains("4471")),
        "nor into memory"
    );
    say(&env, "what's a good first trick").await;
    let prompt = prompt_for(&env, "what's a good first trick");
    assert!(!prompt.is_empty());
    assert!(!prompt.contains("4471"), "in a later prompt: {prompt}");
    env.finish().await;
}

#[tokio::test]
async fn a_burst_follower_deleted_while_the_turn_waits_on_the_model_is_in_no_history_and_no_later_prompt()
 {
    let slow = slow_on_the_code(|body| body["messages"].to_string().contains("4471"));
    let env = TestEnv::with(slow, |c| {
        c.memory.extract_after = 100;
        c.memory.quiet_secs = 3600;
    })
    .await;
    // Both in the stream before a worker runs: one turn answers them together.
    let head = env.dm(JESS, KAORI, JESS_KAORI, "hey quick thing").await;
    let follower = env
        .dm(JESS, KAORI, JESS_KAORI, "my locker code is 4471")
        .await;
    env.publish(&head).await;
    env.publish(&follower).await;
    env.spawn_app().await;
    let waiting = eventually(Duration::from_secs(30), || async {
        env.stub
            .requests()
            .iter()
            .any(|b| b["messages"].to_string().contains("4471"))
    })
    .await;
    assert!(waiting, "the burst's turn asked the model");
    env.signal(
        "message_deleted",
        &follower.message_id,
        &format!("del-{}", follower.message_id),
        "",
    )
    .await;
    env.drained(Drained::Signals).await;
    let record = env.settled(&head.message_id).await;
    assert_eq!(
        (record.state, record.reason.as_deref()),
        (State::Dropped, Some("deleted")),
        "{record:?}"
    );
    env.drained(Drained::Inbound).await;
    assert!(
        traces(&env, "4471").await.is_empty(),
        "{:?}",
        traces(&env, "4471").await
    );
    assert!(
        env.replies_to(&head.message_id).await.is_empty(),
        "no reply built on the deleted words"
    );
    let kept: Vec<String> =
        sqlx::query_scalar("SELECT content FROM bot_conversations WHERE user_id = $1 ORDER BY id")
            .bind(JESS)
            .fetch_all(&env.pg.pool)
            .await
            .unwrap();
    assert_eq!(kept, ["hey quick thing"], "the head stays in the history");
    say(&env, "what's a good first trick").await;
    let prompt = prompt_for(&env, "what's a good first trick");
    assert!(!prompt.is_empty());
    assert!(!prompt.contains("4471"), "in a later prompt: {prompt}");
    env.finish().await;
}

#[tokio::test]
async fn a_user_erased_while_their_turn_waits_on_the_model_leaves_nothing_in_the_rows_or_the_streams()
 {
    let slow = slow_on_the_code(|body| last_user_text(body).contains("4471"));
    let env = TestEnv::with(slow, |c| {
        c.memory.extract_after = 1;
        c.memory.quiet_secs = 3600;
    })
    .await;
    env.spawn_app().await;
    let e = locker_code_asked(&env).await;
    env.signal("user_erased", JESS, "erase-during", "").await;
    env.drained(Drained::Signals).await;
    let record = env.settled(&e.message_id).await;
    assert_eq!(
        (record.state, record.reason.as_deref()),
        (State::Dropped, Some("deleted")),
        "{record:?}"
    );
    env.drained(Drained::Inbound).await;
    assert!(
        traces(&env, "4471").await.is_empty(),
        "{:?}",
        traces(&env, "4471").await
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM bot_conversations WHERE user_id = $1")
        .bind(JESS)
        .fetch_one(&env.pg.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "history rows of the erased user");
    assert!(
        !completion_stored(&env).await,
        "a completion reached the outbound stream after the erasure"
    );
    env.finish().await;
}

/// Whether the outbound stream holds a completion of Jess's conversation with Kaori.
async fn completion_stored(env: &TestEnv) -> bool {
    let out = env
        .bus
        .js
        .get_stream(&env.bus.names.stream_out)
        .await
        .unwrap();
    out.get_last_raw_message_by_subject(&env.bus.names.outbound(JESS_KAORI))
        .await
        .is_ok()
}

/// What a turn whose deletion overtook it left: its reply documents, its completions in the outbound
/// stream, and the history rows of the conversation.
async fn left_by_turn(env: &TestEnv, message: &str) -> (usize, bool, i64) {
    let replies = env.replies_to(message).await.len();
    let completion = completion_stored(env).await;
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM bot_conversations WHERE conversation_id = $1")
            .bind(JESS_KAORI)
            .fetch_one(&env.pg.pool)
            .await
            .unwrap();
    (replies, completion, rows)
}

/// A turn held after its last check (`before_delivery`), at the start of its reply's writes, while
/// `delete` (a `message_deleted` or `user_erased` signal) settles; then let go: it writes the document,
/// the history (which leaves the deleted rows out) and the completion, reads the tombstone again, and
/// withdraws the document and the completion.
async fn overtaken_after_the_last_check(kind: &str) {
    let env = TestEnv::with(model(), |c| {
        c.memory.extract_after = 100;
        c.memory.quiet_secs = 3600;
    })
    .await;
    let worker = env.spawn_app().await;
    let e = env
        .dm(JESS, KAORI, JESS_KAORI, "my locker code is 4471")
        .await;
    let held = companion_core::fault::pause_at(&e.message_id, "store_reply");
    env.publish(&e).await;
    tokio::time::timeout(Duration::from_secs(30), held.reached())
        .await
        .expect("the turn reached its reply's writes");
    let id = match kind {
        "message_deleted" => e.message_id.clone(),
        _ => JESS.to_owned(),
    };
    env.signal(kind, &id, &format!("del-{id}"), "").await;
    env.drained(Drained::Signals).await;
    held.release();
    let record = env.settled(&e.message_id).await;
    assert_eq!(
        (record.state, record.reason.as_deref()),
        (State::Dropped, Some("deleted")),
        "{record:?}"
    );
    assert_eq!(
        left_by_turn(&env, &e.message_id).await,
        (0, false, 0),
        "(reply documents, a completion, history rows) left after the {kind}"
    );
    assert!(
        traces(&env, "4471").await.is_empty(),
        "{:?}",
        traces(&env, "4471").await
    );
    let steps: Vec<String> =
        sqlx::query_scalar("SELECT name FROM job_steps WHERE job = $1 AND name = 'withdraw'")
            .bind(&e.message_id)
            .fetch_all(&env.pg.pool)
            .await
            .unwrap();
    assert_eq!(steps, ["withdraw"]);
    assert_eq!(
        worker.metric("companion_replies_withdrawn_total").await,
        Some(1.0)
    );
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_message_deleted_between_the_turns_last_check_and_its_completion_is_withdrawn() {
    overtaken_after_the_last_check("message_deleted").await;
}

#[tokio::test]
async fn a_user_erased_between_the_turns_last_check_and_its_completion_leaves_nothing() {
    overtaken_after_the_last_check("user_erased").await;
}

#[tokio::test]
async fn a_history_write_paused_between_its_check_and_its_commit_does_not_outlast_the_deletion() {
    let env = TestEnv::with(model(), |c| {
        c.memory.extract_after = 100;
        c.memory.quiet_secs = 3600;
    })
    .await;
    let worker = env.spawn_app().await;
    let e = env
        .dm(JESS, KAORI, JESS_KAORI, "my locker code is 4471")
        .await;
    // Held with its rows inserted and its locks taken, before its commit; and then again before the
    // completion, so that the deletion (which waits on the lock) commits before the turn's last read.
    let held = companion_core::fault::pause_at(&e.message_id, "history:locked");
    let then = companion_core::fault::pause_at(&e.message_id, "touch");
    env.publish(&e).await;
    tokio::time::timeout(Duration::from_secs(30), held.reached())
        .await
        .expect("the history write reached its commit");
    env.signal(
        "message_deleted",
        &e.message_id,
        &format!("del-{}", e.message_id),
        "",
    )
    .await;
    // The deletion's transaction waits on the write's lock (not on a timer).
    let waits = eventually(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))",
        )
        .fetch_one(&env.pg.pool)
        .await
        .unwrap()
    })
    .await;
    assert!(waits, "the deletion waits on the history write's lock");
    // Unheld, the same function is the whole write, one statement: its insert must read the tombstones
    // in a snapshot taken after its locks, which only a VOLATILE function does.
    // Every overload: the one over a JSON argument, and the one over arrays that stays for a rolling
    // deploy's workers of the build before.
    let volatility: Vec<String> = sqlx::query_scalar(
        "SELECT provolatile::text FROM pg_proc WHERE proname = 'append_history' ORDER BY pronargs",
    )
    .fetch_all(&env.pg.pool)
    .await
    .unwrap();
    assert_eq!(volatility, ["v", "v"], "append_history is VOLATILE");
    held.release();
    tokio::time::timeout(Duration::from_secs(30), then.reached())
        .await
        .expect("the turn went on to its completion");
    env.drained(Drained::Signals).await;
    then.release();
    let record = env.settled(&e.message_id).await;
    assert_eq!(
        (record.state, record.reason.as_deref()),
        (State::Dropped, Some("deleted")),
        "{record:?}"
    );
    assert_eq!(
        left_by_turn(&env, &e.message_id).await,
        (0, false, 0),
        "(reply documents, a completion, history rows) left after the deletion"
    );
    assert!(
        traces(&env, "4471").await.is_empty(),
        "{:?}",
        traces(&env, "4471").await
    );
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_deleted_message_leaves_no_trace_within_60_s_and_a_replay_brings_nothing_back() {
    let env = memory_env(1).await;
    let deleted = say(&env, "my home park is burnside").await;
    say(&env, "i'm scared of dropping in").await;
    let _ = facts_eventually(&env, JESS, 2).await;
    assert!(!traces(&env, "burnside").await.is_empty());

    env.signal("message_deleted", &deleted, &format!("del-{deleted}"), "")
        .await;
    let gone = eventually(Duration::from_secs(60), || async {
        traces(&env, "burnside").await.is_empty()
    })
    .await;
    assert!(gone, "left: {:?}", traces(&env, "burnside").await);
    assert_eq!(
        facts(&env, JESS).await,
        [("fear".into(), "is scared of dropping in".into())]
    );
    // Its event is gone from the inbound stream too (by its sequence).
    let seq = env
        .journal()
        .get(&deleted)
        .await
        .unwrap()
        .and_then(|j| j.stream_seq)
        .expect("the job knows its event's sequence");
    let inbound = env
        .bus
        .js
        .get_stream(&env.bus.names.stream_in)
        .await
        .unwrap();
    let deleted_at = eventually(Duration::from_secs(30), || async {
        inbound.get_raw_message(seq).await.is_err()
    })
    .await;
    assert!(
        deleted_at,
        "the deleted message's event is still in the inbound stream"
    );
    say(&env, "where should i skate today?").await;
    assert!(!prompt_for(&env, "where should i skate today?").contains("burnside"));

    // A redelivery of the deleted event, and a forced replay of the conversation: nothing comes back.
    let event = env.dm(JESS, KAORI, JESS_KAORI, "x").await;
    let mut again = event.clone();
    again.message_id = deleted.clone();
    again.content = "my home park is burnside".into();
    env.publish_raw(
        env.bus.names.inbound(KAORI, JESS_KAORI),
        &format!("redelivered-{deleted}"),
        serde_json::to_vec(&again).unwrap(),
    )
    .await;
    let (ok, out, err) = env
        .run_companion(&["replay", "--conversation", JESS_KAORI, "--force"])
        .await;
    assert!(ok, "{out}{err}");
    assert!(out.contains("deleted"), "{out}");
    // The redelivery and whatever the replay published have been settled.
    env.drained(Drained::Inbound).await;
    env.drained(Drained::Signals).await;
    assert!(
        traces(&env, "burnside").await.is_empty(),
        "{:?}",
        traces(&env, "burnside").await
    );
    assert!(
        env.replies_to(&deleted).await.len() <= 1,
        "no new reply to a deleted message"
    );
    env.finish().await;
}

#[tokio::test]
async fn memory_cleared_while_an_extraction_waits_on_the_model_leaves_no_fact_and_nothing_is_relearned()
 {
    let env = TestEnv::with(slow_memory(model(), Duration::from_secs(4)), |c| {
        c.memory.extract_after = 1;
        c.memory.quiet_secs = 3600;
        c.turn.user_turns_per_minute = 0;
    })
    .await;
    env.spawn_app().await;
    say(&env, "i ride goofy and my home park is glenhaven").await;
    // The extraction of that message is waiting on the model.
    extraction_asked(&env).await;
    env.signal(
        "memory_cleared",
        JESS,
        "clear-during",
        json!({"userId": JESS, "botId": KAORI}).to_string(),
    )
    .await;
    // The clear and the extraction (a signal too) have both settled.
    env.drained(Drained::Signals).await;
    assert_eq!(facts(&env, JESS).await, [], "a fact survived the clear");
    // Said after the clear: a new extraction runs and reads only what came after it.
    let before = env.stream_last(Drained::Signals).await;
    say(&env, "ok cool").await;
    env.drained_after(Drained::Signals, before).await;
    assert_eq!(
        facts(&env, JESS).await,
        [],
        "what was said before the clear is learned later"
    );
    env.finish().await;
}

#[tokio::test]
async fn user_erased_while_an_extraction_waits_on_the_model_leaves_no_fact_summary_or_record() {
    let env = TestEnv::with(slow_memory(model(), Duration::from_secs(4)), |c| {
        c.memory.extract_after = 1;
        c.memory.quiet_secs = 3600;
        c.turn.user_turns_per_minute = 0;
    })
    .await;
    env.spawn_app().await;
    say(&env, "i ride goofy and my home park is glenhaven").await;
    extraction_asked(&env).await;
    env.signal("user_erased", JESS, "erase-extracting", "")
        .await;
    // The erasure and the extraction (a signal too) have both settled.
    env.drained(Drained::Signals).await;
    assert_eq!(facts(&env, JESS).await, [], "a fact survived the erasure");
    assert!(
        traces(&env, "glenhaven").await.is_empty(),
        "{:?}",
        traces(&env, "glenhaven").await
    );
    let erasure: Vec<String> =
        sqlx::query_scalar("SELECT state FROM jobs WHERE kind = 'user_erased' AND id LIKE $1")
            .bind(format!("user_erased:{JESS}:%"))
            .fetch_all(&env.pg.pool)
            .await
            .unwrap();
    assert_eq!(erasure, ["done"], "the erasure's record");
    env.finish().await;
}

#[tokio::test]
async fn a_deletion_is_a_journaled_job_that_finishes_once_when_it_dies_between_two_steps() {
    let env = TestEnv::with(model(), |c| {
        c.memory.extract_after = 100;
        c.memory.quiet_secs = 3600;
    })
    .await;
    let worker = env.spawn_app().await;
    let deleted = say(&env, "my home park is burnside").await;
    say(&env, "i'm scared of dropping in").await;
    // The first attempt dies after its transaction committed, before the streams step.
    companion_core::fault::panic_at(&format!("message_deleted:{deleted}"), "erase_streams", 1);
    env.signal("message_deleted", &deleted, &format!("del-{deleted}"), "")
        .await;
    env.drained(Drained::Signals).await;
    let jobs: Vec<(String, String, i32)> = sqlx::query_as(
        "SELECT id, state, attempts FROM jobs WHERE kind = 'message_deleted' AND id LIKE $1",
    )
    .bind(format!("message_deleted:{deleted}:%"))
    .fetch_all(&env.pg.pool)
    .await
    .unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let (job, state, attempts) = &jobs[0];
    assert_eq!((state.as_str(), *attempts), ("done", 2), "{jobs:?}");
    assert_eq!(
        worker
            .metric("companion_panics_total{kind=\"signal\"}")
            .await,
        Some(1.0)
    );
    // Each step once; the transaction's record holds counts, never text.
    let steps: Vec<(String, Value)> =
        sqlx::query_as("SELECT name, output FROM job_steps WHERE job = $1 ORDER BY created_at")
            .bind(job)
            .fetch_all(&env.pg.pool)
            .await
            .unwrap();
    let names: Vec<&str> = steps.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["erase", "erase_streams", "rebuild"], "{steps:?}");
    assert_eq!(steps[0].1["removed"]["history_rows"], 2, "{steps:?}");
    assert!(!steps[0].1.to_string().contains("burnside"));
    assert!(traces(&env, "burnside").await.is_empty());
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_deletion_job_killed_9_between_two_steps_finishes_once_after_a_restart() {
    let env = TestEnv::with(model(), |c| {
        c.memory.extract_after = 100;
        c.memory.quiet_secs = 3600;
        c.consumer.ack_wait_secs = 3;
    })
    .await;
    let first = env.spawn_app_process(&[]);
    let deleted = say(&env, "my home park is burnside").await;
    say(&env, "i'm scared of dropping in").await;
    drop(first);
    // This process holds the deletion once its transaction is recorded, before its streams step.
    let hold = format!("message_deleted:{deleted}@erase_streams");
    let mut held = env.spawn_app_process(&[("COMPANION_TEST_HOLD", hold.as_str())]);
    env.signal("message_deleted", &deleted, &format!("del-{deleted}"), "")
        .await;
    let steps_of = |job: String| {
        let pool = env.pg.pool.clone();
        async move {
            sqlx::query_as::<_, (String, Value)>(
                "SELECT name, output FROM job_steps WHERE job = $1 ORDER BY created_at",
            )
            .bind(job)
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    let job_id = || async {
        sqlx::query_scalar::<_, String>("SELECT id FROM jobs WHERE id LIKE $1")
            .bind(format!("message_deleted:{deleted}:%"))
            .fetch_optional(&env.pg.pool)
            .await
            .unwrap()
    };
    let erased = eventually(Duration::from_secs(30), || async {
        match job_id().await {
            Some(job) => !steps_of(job).await.is_empty(),
            None => false,
        }
    })
    .await;
    assert!(erased, "the deletion's transaction was recorded");
    // Under the full suite's load the hold can come well after the transaction's record.
    let at_the_hold = eventually(Duration::from_secs(30), || async {
        held.log().contains("held for good")
    })
    .await;
    assert!(at_the_hold, "the process is held before its streams step");
    held.kill().expect("kill -9");
    let _ = held.wait();
    let job = job_id().await.expect("the deletion's job");
    let before: Vec<String> = steps_of(job.clone())
        .await
        .into_iter()
        .map(|s| s.0)
        .collect();
    assert_eq!(before, ["erase"], "killed between two steps");
    let _restarted = env.spawn_app_process(&[]);
    let record = env.settled(&job).await;
    assert_eq!(
        (record.state, record.attempts),
        (State::Done, 2),
        "{record:?}"
    );
    let steps = steps_of(job).await;
    let names: Vec<&str> = steps.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["erase", "erase_streams", "rebuild"], "{steps:?}");
    assert_eq!(steps[0].1["removed"]["history_rows"], 2, "{steps:?}");
    assert!(traces(&env, "burnside").await.is_empty());
    env.finish().await;
}

#[tokio::test]
async fn clearing_memory_keeps_the_account_and_does_not_relearn_old_messages() {
    let env = memory_env(1).await;
    say(&env, "my home park is burnside").await;
    let _ = facts_eventually(&env, JESS, 1).await;
    env.signal(
        "memory_cleared",
        JESS,
        "clear-1",
        json!({"userId": JESS, "botId": KAORI}).to_string(),
    )
    .await;
    let cleared = eventually(Duration::from_secs(30), || async {
        facts(&env, JESS).await.is_empty()
    })
    .await;
    assert!(cleared);
    let before = env.stream_last(Drained::Signals).await;
    say(&env, "ok cool").await;
    // The extraction signal this turn publishes has been handled.
    env.drained_after(Drained::Signals, before).await;
    assert!(
        facts(&env, JESS).await.is_empty(),
        "old messages are not read again"
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM bot_conversations WHERE user_id = $1")
        .bind(JESS)
        .fetch_one(&env.pg.pool)
        .await
        .unwrap();
    assert!(rows >= 4, "the history stays");
    let (ok, out, _) = env
        .run_companion(&["memory", "--user", JESS, "--bot", "kaori"])
        .await;
    assert!(ok && out.contains("nothing remembered"), "{out}");
    env.finish().await;
}

#[tokio::test]
async fn user_erasure_leaves_nothing_including_the_streams_and_a_replay_brings_nothing_back() {
    let env = memory_env(1).await;
    let crisis = env
        .dm(
            JESS,
            KAORI,
            JESS_KAORI,
            "honestly i just want to die, i don't see the point anymore",
        )
        .await;
    env.publish(&crisis).await;
    env.settled(&crisis.message_id).await;
    let crisis_count = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM crisis_log")
            .fetch_one(&env.pg.pool)
            .await
            .unwrap()
    };
    assert_eq!(crisis_count().await, 1);
    say(&env, "my home park is burnside").await;
    say(&env, "remember i ride goofy").await;
    let _ = facts_eventually(&env, JESS, 2).await;
    let (ok, out, _) = env.run_companion(&["memory", "--user", JESS]).await;
    assert!(
        ok && out.contains("rides goofy") && out.contains("sources"),
        "{out}"
    );
    // A malformed DM of the user's, kept in the dead-letter stream.
    let bad = json!({"messageId": "6650f1a2b3c4d5e6f7a8ffff", "conversationId": JESS_KAORI,
                     "senderId": JESS, "botId": KAORI, "content": 42});
    env.publish_raw(
        env.bus.names.inbound(KAORI, JESS_KAORI),
        "bad-1",
        bad.to_string(),
    )
    .await;
    let dead = eventually(Duration::from_secs(30), || async {
        !env.dead_letters().await.is_empty()
    })
    .await;
    assert!(dead);

    env.signal("user_erased", JESS, "erase-1", "").await;
    let gone = eventually(Duration::from_secs(60), || async {
        traces(&env, "burnside").await.is_empty() && traces(&env, "goofy").await.is_empty()
    })
    .await;
    assert!(
        gone,
        "{:?} {:?}",
        traces(&env, "burnside").await,
        traces(&env, "goofy").await
    );
    for table in [
        "memory_facts",
        "memory_state",
        "bot_conversations",
        "flow_states",
    ] {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} WHERE user_id = $1"
        )))
        .bind(JESS)
        .fetch_one(&env.pg.pool)
        .await
        .unwrap();
        assert_eq!(n, 0, "{table}");
    }
    let stream = env
        .bus
        .js
        .get_stream(&env.bus.names.stream_in)
        .await
        .unwrap();
    let left = stream
        .get_last_raw_message_by_subject(&env.bus.names.inbound(KAORI, JESS_KAORI))
        .await;
    assert!(
        left.is_err(),
        "the user's DMs are purged from the inbound stream"
    );
    assert!(
        env.dead_letters().await.is_empty(),
        "and from the dead-letter stream"
    );

    let (ok, out, err) = env
        .run_companion(&["replay", "--conversation", JESS_KAORI, "--force"])
        .await;
    assert!(ok, "{out}{err}");
    env.drained(Drained::Inbound).await;
    env.drained(Drained::Signals).await;
    assert!(traces(&env, "burnside").await.is_empty());
    let (ok, out, _) = env.run_companion(&["memory", "--user", JESS]).await;
    assert!(ok && out.contains("erased"), "{out}");
    assert_eq!(
        crisis_count().await,
        1,
        "the yearly crisis count holds no id and stays"
    );
    env.finish().await;
}

#[tokio::test]
async fn extractions_at_once_read_each_message_once_and_a_late_message_is_not_left_behind() {
    // Extraction answers take 2 s, so a second run starts while the first waits on the model.
    let slow = slow_memory(model(), Duration::from_secs(2));
    let env = TestEnv::with(slow, |c| {
        c.memory.extract_after = 1_000;
        c.memory.quiet_secs = 3600;
        c.turn.user_turns_per_minute = 0;
    })
    .await;
    env.spawn_app().await;
    for text in ["my home park is burnside", "i'm scared of dropping in"] {
        say(&env, text).await;
    }
    let app = env.spawn_app().await;
    let signals = &app.memory_signals;
    let id = format!("{JESS}.{KAORI}");
    // Runs at once (the quiet timer, the count, a redelivery), and a message that comes while the first
    // waits on the model: each message is read by one run, and the late one is not left behind.
    let first = async {
        let r = futures::future::join_all((0..3).map(|_| signals.extraction("memory", &id))).await;
        assert!(r.iter().all(Result::is_ok), "{r:?}");
    };
    let late = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        say(&env, "i want to learn kickflips").await;
        signals.extraction("memory", &id).await
    };
    let ((), late) = tokio::join!(first, late);
    assert!(late.is_ok(), "{late:?}");
    let mut kept = facts(&env, JESS).await;
    kept.sort();
    assert_eq!(
        kept,
        [
            ("fear".into(), "is scared of dropping in".into()),
            ("goal".into(), "wants to learn kickflips".into()),
            ("home_spot".into(), "home spot is burnside".into()),
        ]
    );
    let read: Vec<String> = sqlx::query_scalar(
        "SELECT s.output ->> 'kept' FROM job_steps s JOIN jobs j ON j.id = s.job
         WHERE j.kind = 'memory' AND s.name = 'memory_facts'
           AND NOT coalesce((s.output ->> 'skipped')::boolean, false)",
    )
    .fetch_all(&env.pg.pool)
    .await
    .unwrap();
    assert_eq!(
        read.len(),
        2,
        "two runs wrote, the others found the messages read: {read:?}"
    );
    env.finish().await;
}
