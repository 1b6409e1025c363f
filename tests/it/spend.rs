//! The spend and abuse guard on the real stack: the flood limit holds across worker processes (one user,
//! several companions), the user's budget and the service's cap each go cheaper model → budget line →
//! normal service once the window rolls over, and the per-turn ceiling ends a greedy tool loop with text.

use std::{collections::HashMap, sync::Arc, time::Duration};

use crate::env::*;
use crate::flood::busy_line;
use companion_dev::stub::{Responder, StubReply, last_user_text};
use serde_json::Value;

fn budget_line(slug: &str) -> String {
    character_line(slug, "budgetLine")
}

/// The model each chat request the stub received asked for.
fn models_asked(env: &TestEnv) -> Vec<String> {
    env.stub
        .requests()
        .iter()
        .map(|b| b["model"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn three_worker_processes_admit_exactly_the_limit_for_one_user() {
    let echo: Responder = Arc::new(|body: &Value| {
        StubReply::Delayed(
            Duration::from_millis(30),
            Box::new(StubReply::text(format!("ok: {}", last_user_text(body)))),
        )
    });
    let env = TestEnv::with(echo, |c| {
        c.worker.concurrency = 4;
        c.turn.burst_max = 0;
        c.turn.user_turns_per_minute = 3;
    })
    .await;
    let mut workers = [
        env.spawn_app_process(&[]),
        env.spawn_app_process(&[]),
        env.spawn_app_process(&[]),
    ];
    let mut replies = env.all_completions().await;
    let bots = [
        (KAORI, "kaori"),
        (TONY, "tony"),
        (RICO, "rico"),
        (ZOE, "zoe"),
    ];
    let mut conversations = HashMap::new();
    for (bot, slug) in bots {
        conversations.insert(env.conversation(JESS, bot).await, (bot, slug));
    }
    // Sixteen messages, four per companion, all at once: one user, four conversations, three workers.
    let mut events = Vec::new();
    for i in 0..16 {
        let (bot, _) = bots[i % bots.len()];
        let conversation = conversations
            .iter()
            .find(|(_, (b, _))| *b == bot)
            .map(|(c, _)| c.clone())
            .unwrap();
        events.push(
            env.dm(JESS, bot, &conversation, &format!("flood {i}"))
                .await,
        );
    }
    for e in &events {
        env.publish(e).await;
    }
    let settled = eventually(Duration::from_secs(90), || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobs WHERE kind = 'turn' AND state IN ('done', 'limited')",
        )
        .fetch_one(&env.pg.pool)
        .await
        .unwrap();
        n == 16
    })
    .await;
    assert!(settled, "every message settled");
    // Every delivery settled (a stray extra reply would have been published before its ack).
    env.drained(Drained::Inbound).await;
    let mut got = Vec::new();
    while let Ok(Some(c)) = tokio::time::timeout(
        Duration::from_millis(300),
        futures::StreamExt::next(&mut replies),
    )
    .await
    {
        got.push(c);
    }
    let answered: Vec<_> = got
        .iter()
        .filter(|c| c.content.starts_with("ok: "))
        .collect();
    assert_eq!(answered.len(), 3, "exactly the limit in total: {got:#?}");
    assert_eq!(env.stub.requests().len(), 3, "no model call over the limit");
    for (conversation, (_, slug)) in &conversations {
        let here: Vec<_> = got
            .iter()
            .filter(|c| &c.conversation_id == conversation)
            .collect();
        let busy = here.iter().filter(|c| c.content == busy_line(slug)).count();
        let admitted = here
            .iter()
            .filter(|c| c.content.starts_with("ok: "))
            .count();
        // Four messages here: unless all of them were admitted, this companion said it was busy, once.
        assert_eq!(busy, usize::from(admitted < 4), "{slug}: {here:#?}");
        assert_eq!(here.len(), admitted + busy, "{slug}: nothing else");
    }
    let limited: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'limited'")
        .fetch_one(&env.pg.pool)
        .await
        .unwrap();
    assert_eq!(limited, 13);
    for w in &mut workers {
        stop(w);
    }
    env.finish().await;
}

/// The budget window of the budget tests.
const WINDOW: Duration = Duration::from_secs(8);

/// A worker whose model echoes and bills 0.011 USD an answer, with a budget of 0.02 USD for each user
/// or for the service (the other off), the cheaper stage at half of it and an eight-second window.
async fn budget_env(per_user: bool) -> (TestEnv, TestApp) {
    let echo: Responder =
        Arc::new(|body: &Value| StubReply::text(format!("ok: {}", last_user_text(body))));
    let env = TestEnv::with(echo, |c| {
        let (user, service) = if per_user { (0.02, 0.0) } else { (0.0, 0.02) };
        c.spend.user_daily_tokens = 0;
        c.spend.user_daily_usd = user;
        c.spend.service_daily_usd = service;
        c.spend.service_spend_refresh_secs = 0;
        c.spend.budget_cheaper_at = 0.5;
        c.spend.budget_model = "cheap/model".into();
        c.spend.budget_window_secs = WINDOW.as_secs();
    })
    .await;
    env.stub.report_cost(Some(0.011));
    let worker = env.spawn_app().await;
    (env, worker)
}

#[tokio::test]
async fn a_user_over_the_budget_gets_the_cheaper_model_then_the_budget_line_then_normal_service() {
    let (env, worker) = budget_env(true).await;
    let main_model = env.config.llm.model.clone();
    let sam = env.conversation(SAM, KAORI).await;

    let first = env.dm(JESS, KAORI, JESS_KAORI, "one").await;
    assert_eq!(env.turn(&first).await.content, "ok: one");
    let second = env.dm(JESS, KAORI, JESS_KAORI, "two").await;
    assert_eq!(env.turn(&second).await.content, "ok: two");
    assert_eq!(
        models_asked(&env),
        [main_model.clone(), "cheap/model".into()],
        "over half of the budget the cheaper model answers"
    );
    let third = env.dm(JESS, KAORI, JESS_KAORI, "three").await;
    let stopped = env.turn(&third).await;
    assert_eq!(stopped.content, budget_line("kaori"));
    assert_eq!(env.stub.requests().len(), 2, "no call at the budget");
    // The journal says why the budget line went out.
    let story = crate::explain::explain(&env, &[&third.message_id]).await;
    assert!(
        story.contains(
            "fixed line: the budget line instead of the model's answer, because a spend budget"
        ),
        "{story}"
    );
    // Another user is not affected.
    let other = env.dm(SAM, KAORI, &sam, "hi from sam").await;
    assert_eq!(env.turn(&other).await.content, "ok: hi from sam");
    assert_eq!(models_asked(&env)[2], main_model);

    // Once the window has rolled past the two paid answers, the usual model answers again.
    tokio::time::sleep(WINDOW + Duration::from_secs(1)).await;
    let later = env.dm(JESS, KAORI, JESS_KAORI, "four").await;
    assert_eq!(env.turn(&later).await.content, "ok: four");
    assert_eq!(models_asked(&env).last(), Some(&main_model));
    let stops = worker
        .metric("companion_budget_calls_total{scope=\"user\",stage=\"stopped\"}")
        .await;
    assert_eq!(stops, Some(1.0));
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_turns_own_first_answer_counts_toward_the_check_before_its_second() {
    // A tool round, then text, each answer billed 0.011 USD against a user budget of 0.02 with the
    // cheaper stage at half: the spending is read from the journal once, before the first call, and the
    // first answer's cost is added by the turn itself, so its second call goes to the cheaper model.
    let env = TestEnv::with(
        companion_dev::stub::scripted(
            vec![StubReply::tool(
                "search_trickipedia",
                serde_json::json!({"query": "kickflip"}),
            )],
            StubReply::text("here is how"),
        ),
        |c| {
            c.spend.user_daily_tokens = 0;
            c.spend.user_daily_usd = 0.02;
            c.spend.service_daily_usd = 0.0;
            c.spend.budget_cheaper_at = 0.5;
            c.spend.budget_model = "cheap/model".into();
            c.spend.budget_window_secs = 3600;
        },
    )
    .await;
    env.stub.report_cost(Some(0.011));
    let worker = env.spawn_app().await;
    let e = env.dm(JESS, KAORI, JESS_KAORI, "how do i kickflip").await;
    assert_eq!(env.turn(&e).await.content, "here is how");
    assert_eq!(
        models_asked(&env),
        [env.config.llm.model.clone(), "cheap/model".into()],
        "the first answer's cost counted before the second call"
    );
    // Both answers are in the journal under the user's tally (the text one rode with the reply's record).
    let recorded: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM job_steps WHERE job = $1 AND name = 'llm' AND tally IS NOT NULL",
    )
    .bind(&e.message_id)
    .fetch_one(&env.pg.pool)
    .await
    .unwrap();
    assert_eq!(recorded, 2);
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn the_service_cap_goes_cheaper_then_stops_everyone_until_the_window_rolls_over() {
    let (env, worker) = budget_env(false).await;
    let main_model = env.config.llm.model.clone();
    let sam = env.conversation(SAM, TONY).await;

    let jess = env.dm(JESS, KAORI, JESS_KAORI, "one").await;
    assert_eq!(env.turn(&jess).await.content, "ok: one");
    // Jess's spending brings Sam, who spent nothing, to the cheaper model, and then to the budget line.
    let sam1 = env.dm(SAM, TONY, &sam, "sam one").await;
    assert_eq!(env.turn(&sam1).await.content, "ok: sam one");
    assert_eq!(
        models_asked(&env),
        [main_model.clone(), "cheap/model".into()]
    );
    let sam2 = env.dm(SAM, TONY, &sam, "sam two").await;
    assert_eq!(env.turn(&sam2).await.content, budget_line("tony"));
    let jess2 = env.dm(JESS, KAORI, JESS_KAORI, "two").await;
    assert_eq!(env.turn(&jess2).await.content, budget_line("kaori"));
    assert_eq!(env.stub.requests().len(), 2, "no call at the cap");
    let ratio = worker.metric("companion_service_budget_ratio").await;
    assert!(ratio.is_some_and(|r| r >= 1.0), "{ratio:?}");

    tokio::time::sleep(WINDOW + Duration::from_secs(1)).await;
    let sam3 = env.dm(SAM, TONY, &sam, "sam three").await;
    assert_eq!(env.turn(&sam3).await.content, "ok: sam three");
    assert_eq!(models_asked(&env).last(), Some(&main_model));
    let stops = worker
        .metric("companion_budget_calls_total{scope=\"service\",stage=\"stopped\"}")
        .await;
    assert_eq!(stops, Some(2.0));
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_worker_turn_with_a_greedy_tool_model_stops_at_the_ceiling_with_text() {
    // A model that asks for a tool whenever it may.
    let greedy: Responder = Arc::new(|body: &Value| {
        if body["tools"].as_array().is_some_and(|t| !t.is_empty()) {
            StubReply::ToolCalls(vec![("get_user_tricklists".into(), String::new())])
        } else {
            StubReply::text("that's all i can look up right now")
        }
    });
    let env = TestEnv::with(greedy, |c| {
        c.turn.max_llm_calls_per_turn = 3;
    })
    .await;
    env.spawn_app().await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "look up everything").await;
    let reply = env.turn(&event).await;
    assert_eq!(reply.content, "that's all i can look up right now");
    let asked = env.stub.requests();
    assert_eq!(asked.len(), 3, "three requests, not max_rounds + 1");
    assert!(asked[..2].iter().all(|b| b.get("tools").is_some()));
    assert!(
        asked[2].get("tools").is_none(),
        "the last one without tools"
    );
    env.finish().await;
}
