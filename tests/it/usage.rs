//! Usage accounting: every paid chat call of a turn is recorded with the model's answer in the turn's
//! journal (its `llm` step: the model that answered, its tokens, its cost as reported, estimated from the
//! price table, or unpriced), `/metrics` counts the cost and `companion usage` sums it up.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use crate::env::*;
use companion::testing::pipeline::Outcome;
use companion_dev::stub::{Responder, StubReply, last_user_text};
use serde_json::Value;
use sqlx::Row;

const PRIMARY: &str = "test/primary";
const FALLBACK: &str = "test/fallback";

#[derive(Debug)]
struct UsageRow {
    step: i32,
    user: String,
    bot: String,
    model: String,
    prompt: i64,
    completion: i64,
    cost: Option<f64>,
    source: String,
    cached: Option<i64>,
}

async fn usage_of(env: &TestEnv, message_id: &str) -> Vec<UsageRow> {
    sqlx::query(
        "SELECT s.key::int, j.user_id, j.bot_id, s.output -> 'usage' ->> 'model',
                (s.output -> 'usage' ->> 'promptTokens')::bigint,
                (s.output -> 'usage' ->> 'completionTokens')::bigint,
                (s.output -> 'usage' ->> 'costUsd')::float8, s.output -> 'usage' ->> 'costSource',
                (s.output -> 'usage' ->> 'cachedTokens')::bigint
         FROM job_steps s JOIN jobs j ON j.id = s.job
         WHERE s.job = $1 AND s.name = 'llm' ORDER BY s.key::int",
    )
    .bind(message_id)
    .fetch_all(&env.pg.pool)
    .await
    .unwrap()
    .into_iter()
    .map(|r| UsageRow {
        step: r.get(0),
        user: r.get(1),
        bot: r.get(2),
        model: r.get(3),
        prompt: r.get(4),
        completion: r.get(5),
        cost: r.get(6),
        source: r.get(7),
        cached: r.get(8),
    })
    .collect()
}

/// The prompt tokens the stub reports for a request (a quarter of the tools' and messages' JSON length).
fn stub_prompt_tokens(body: &Value) -> i64 {
    let tools = body.get("tools").map_or(0, |t| t.to_string().len());
    let messages: usize = body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| m.to_string().len())
        .sum();
    ((tools + messages) / 4) as i64
}

#[tokio::test]
async fn every_paid_call_is_recorded_with_its_cost_counted_and_summarised() {
    let flaky = Arc::new(AtomicUsize::new(0));
    let f = flaky.clone();
    let responder: Responder = Arc::new(move |body: &Value| {
        let text = last_user_text(body);
        if last_message(body)["role"] == "tool" {
            return StubReply::text("here are your lists");
        }
        if text.contains("lists") {
            return StubReply::ToolCalls(vec![("get_user_tricklists".into(), String::new())]);
        }
        if text.contains("fallback") && body["model"] == PRIMARY {
            return StubReply::Status {
                code: 404,
                body: r#"{"error":{"message":"no such model"}}"#.into(),
                retry_after: None,
            };
        }
        if text.contains("flaky") && f.fetch_add(1, Ordering::SeqCst) == 0 {
            return StubReply::Status {
                code: 503,
                body: "busy".into(),
                retry_after: None,
            };
        }
        StubReply::text("ok!")
    });
    let env = TestEnv::with(responder, |c| {
        c.llm.model = PRIMARY.into();
        c.llm.fallback_models = vec![FALLBACK.into()];
        c.llm.prices = format!("{PRIMARY}=1.5:3");
        c.llm.retry_base_ms = 10;
    })
    .await;
    let svc = env.spawn_app().await;

    // A: two paid calls (tool call, then text), cost reported by the server.
    env.stub.report_cost(Some(0.00042));
    env.stub.report_cached_tokens(Some(64));
    let a = env.dm(JESS, KAORI, JESS_KAORI, "show my lists").await;
    env.turn(&a).await;
    env.stub.report_cost(None);
    env.stub.report_cached_tokens(None);
    // B: one call, no reported cost: estimated from LLM_PRICES.
    let b = env.dm(JESS, KAORI, JESS_KAORI, "plain question").await;
    env.turn(&b).await;
    // C: the main model is unknown (404), the fallback answers and has no price.
    let c = env.dm(JESS, KAORI, JESS_KAORI, "use the fallback").await;
    env.turn(&c).await;
    // D: a 503 retried inside the turn: one failed (unpaid) request, one paid.
    let d = env.dm(JESS, KAORI, JESS_KAORI, "flaky one").await;
    env.turn(&d).await;

    let requests = env.stub.requests();
    assert_eq!(
        requests.len(),
        7,
        "2 + 1 + 2 + 2 requests reached the model"
    );

    let rows = usage_of(&env, &a.message_id).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.step, i as i32);
        assert_eq!((r.user.as_str(), r.bot.as_str()), (JESS, KAORI));
        assert_eq!(r.model, PRIMARY);
        assert_eq!(r.prompt, stub_prompt_tokens(&requests[i]), "step {i}");
        assert!(r.completion > 0);
        assert_eq!((r.cost, r.source.as_str()), (Some(0.00042), "reported"));
        assert_eq!(
            r.cached,
            Some(64),
            "the provider's cached prompt tokens are kept"
        );
    }

    let rows = usage_of(&env, &b.message_id).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let expected = (rows[0].prompt as f64 * 1.5 + rows[0].completion as f64 * 3.0) / 1e6;
    assert_eq!(rows[0].prompt, stub_prompt_tokens(&requests[2]));
    assert_eq!(rows[0].source, "estimated");
    assert_eq!(
        rows[0].cached, None,
        "no cache details reported, none recorded"
    );
    assert!((rows[0].cost.unwrap() - expected).abs() < 1e-12, "{rows:?}");
    let estimated_b = rows[0].cost.unwrap();

    let rows = usage_of(&env, &c.message_id).await;
    assert_eq!(rows.len(), 1, "only the answering model is paid: {rows:?}");
    assert_eq!(rows[0].model, FALLBACK);
    assert_eq!((rows[0].cost, rows[0].source.as_str()), (None, "unpriced"));

    let rows = usage_of(&env, &d.message_id).await;
    assert_eq!(rows.len(), 1, "the 503 is not a paid call: {rows:?}");
    assert_eq!(rows[0].source, "estimated");
    let estimated_d = rows[0].cost.unwrap();

    // /metrics: cost and unpriced responses by model, and the retry.
    let text = svc.metrics.render();
    let primary = format!("model=\"{PRIMARY}\"");
    let series = |name: &str, labels: &str| -> f64 {
        let series = format!("{name}{{{labels}}}");
        series_value(&text, &series).unwrap_or_else(|| panic!("no series {series} in\n{text}"))
    };
    let cost = series("companion_llm_cost_usd_total", &primary);
    let want = 2.0 * 0.00042 + estimated_b + estimated_d;
    assert!((cost - want).abs() < 1e-12, "{cost} != {want}");
    let fallback = format!("model=\"{FALLBACK}\"");
    assert_eq!(
        series("companion_llm_unpriced_responses_total", &fallback),
        1.0
    );
    assert_eq!(series("companion_llm_retries_total", &primary), 1.0);

    svc.stop().await;

    // `companion usage`: by day, companion (named) and model, with a total.
    let (ok, text, err) = env.run_companion(&["usage", "--days", "1"]).await;
    assert!(ok, "{text}{err}");
    eprintln!("{text}");
    let line = |model: &str| {
        text.lines()
            .find(|l| l.contains("Kaori") && l.contains(model))
            .unwrap_or_else(|| panic!("no Kaori/{model} line in\n{text}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let p = line(PRIMARY);
    assert_eq!(p[3], "4", "A (2) + B + D calls on the main model: {p:?}");
    assert_eq!(p[5], "128", "cached prompt tokens of A's two calls: {p:?}");
    assert!((p[7].parse::<f64>().unwrap() - want).abs() < 1e-6, "{p:?}");
    let f = line(FALLBACK);
    assert_eq!(f[3], "1");
    assert!(f.join(" ").contains("(1 unpriced)"), "{f:?}");
    let total = text.lines().find(|l| l.starts_with("total")).unwrap();
    assert_eq!(total.split_whitespace().nth(1), Some("5"), "{total}");
    // Per turn, over all its paid calls (not the 404 and the 503): 4 turns, 128 prompt tokens cached.
    let per_turn = text.lines().last().unwrap();
    let prompt: i64 = (0..7)
        .filter(|i| ![3, 5].contains(i))
        .map(|i| stub_prompt_tokens(&requests[i]))
        .sum();
    let billed = (prompt - 128) as f64 + 128.0 * 0.25;
    assert!(
        per_turn.starts_with("per turn (4 turns, all calls)")
            && per_turn.contains(&format!("cached {:.0},", 128.0 / 4.0))
            && per_turn.contains(&format!("billed-equivalent {:.0} ", billed / 4.0)),
        "{per_turn}"
    );
    env.finish().await;
}

#[tokio::test]
async fn a_step_replayed_from_the_journal_is_not_recorded_again() {
    // Step 0 asks for a tool; step 1 fails once, so the retry replays step 0 and pays only for step 1.
    let responder = tool_then_one_500(
        StubReply::ToolCalls(vec![("get_user_tricklists".into(), String::new())]),
        StubReply::text("your lists!"),
    );
    let env = TestEnv::with(responder, |c| c.llm.max_retries = 0).await;
    env.stub.report_cost(Some(0.001));
    let svc = env.spawn_app().await;
    let raw = env.dm(JESS, KAORI, JESS_KAORI, "my lists?").await;
    let event = dm_event(&raw);
    assert!(svc.pipeline.process_dm(&event).await.is_err());
    let rows = usage_of(&env, &raw.message_id).await;
    assert_eq!(
        rows.iter().map(|r| r.step).collect::<Vec<_>>(),
        vec![0],
        "{rows:?}"
    );
    let done = svc
        .pipeline
        .process_dm(&event)
        .await
        .expect("the retry answers");
    assert!(matches!(done, Outcome::Answered { .. }));
    let rows = usage_of(&env, &raw.message_id).await;
    assert_eq!(
        rows.iter().map(|r| r.step).collect::<Vec<_>>(),
        vec![0, 1],
        "each step paid once: {rows:?}"
    );
    assert_eq!(env.stub.requests().len(), 3);
    env.finish().await;
}

#[tokio::test]
async fn usage_for_one_user_and_the_heaviest_users() {
    let env = TestEnv::new(companion_dev::stub::always(StubReply::text("ok!"))).await;
    env.stub.report_cost(Some(0.002));
    env.spawn_app().await;
    let sam_kaori = env.conversation(SAM, KAORI).await;
    for (user, conversation, text) in [
        (JESS, JESS_KAORI, "one"),
        (JESS, JESS_KAORI, "two"),
        (SAM, sam_kaori.as_str(), "three"),
    ] {
        let event = env.dm(user, KAORI, conversation, text).await;
        env.turn(&event).await;
    }

    let (ok, text, err) = env
        .run_companion(&["usage", "--days", "1", "--user", SAM])
        .await;
    assert!(ok, "{text}{err}");
    assert!(text.starts_with(&format!("user {SAM}:")), "{text}");
    let total = text.lines().find(|l| l.starts_with("total")).unwrap();
    assert_eq!(
        total.split_whitespace().nth(1),
        Some("1"),
        "one call of Sam's: {text}"
    );
    assert!(
        text.lines()
            .last()
            .unwrap()
            .starts_with("per turn (1 turns"),
        "{text}"
    );

    let (ok, text, err) = env.run_companion(&["usage", "--top", "5"]).await;
    assert!(ok, "{text}{err}");
    let users: Vec<(String, String)> = text
        .lines()
        .skip(2)
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_owned(), f[1].to_owned())
        })
        .collect();
    assert_eq!(
        users,
        [
            (JESS.to_owned(), "2".to_owned()),
            (SAM.to_owned(), "1".to_owned())
        ],
        "heaviest first: {text}"
    );
    assert!(
        text.contains("0.004000"),
        "Jess's two calls at 0.002: {text}"
    );
    let (ok, _, err) = env
        .run_companion(&["usage", "--top", "1", "--user", SAM])
        .await;
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    env.finish().await;
}
