//! `companion explain <messageId>`: the story of one message's job told from the journal alone, run as
//! the CLI against jobs real turns left: a DM with a tool call retried once, a burst and the flood limit,
//! a crisis message, a group message. Text only with `--show-text`, which is audited, and never a deleted
//! message's.

use std::{sync::Arc, time::Duration};

use companion_dev::stub::{Responder, StubReply, last_user_text};
use serde_json::{Value, json};

use crate::env::*;

/// `companion explain <args>`: its output, which must be a success.
pub(crate) async fn explain(env: &TestEnv, args: &[&str]) -> String {
    let mut all = vec!["explain"];
    all.extend_from_slice(args);
    let (ok, out, err) = env.run_companion(&all).await;
    assert!(ok, "companion explain {args:?} failed:\n{out}\n{err}");
    eprintln!("$ companion explain {}\n{out}", args.join(" "));
    out
}

/// The `--json` story's events of step `name`.
fn events<'a>(story: &'a Value, name: &str) -> Vec<&'a Value> {
    story["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["step"] == name)
        .collect()
}

/// The text-shown steps of job `job`: (key, output).
async fn audits(env: &TestEnv, job: &str) -> Vec<(String, Value)> {
    sqlx::query_as("SELECT key, output FROM job_steps WHERE job = $1 AND name = 'text_shown'")
        .bind(job)
        .fetch_all(&env.pg.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_dm_with_a_tool_call_retried_once_is_told_in_order_and_its_text_only_when_asked() {
    let responder = tool_then_one_500(
        StubReply::tool(
            "create_tricklist",
            json!({"name": "Explain Park", "tricks": ["Ollie"], "category": "skateboard"}),
        ),
        StubReply::text("your Explain Park list is ready!"),
    );
    let env = TestEnv::with(responder, |c| c.llm.max_retries = 0).await;
    let svc = env.spawn_app().await;
    let raw = env
        .dm(JESS, KAORI, JESS_KAORI, "make me a park list with an ollie")
        .await;
    let event = dm_event(&raw);
    assert!(svc.pipeline.process_dm(&event).await.is_err());
    svc.pipeline.process_dm(&event).await.expect("the retry");
    let id = raw.message_id.as_str();

    let text = explain(&env, &[id]).await;
    let at = |needle: &str| {
        text.find(needle)
            .unwrap_or_else(|| panic!("`{needle}` not in\n{text}"))
    };
    assert!(
        text.contains(&format!("companion Kaori ({KAORI})")),
        "{text}"
    );
    assert!(text.contains("delivered 2 time(s)"), "{text}");
    assert!(text.contains("crisis screen of") && text.contains("nothing found"));
    assert!(text.contains("under the flood limit"), "{text}");
    assert!(
        text.contains("tool create_tricklist (round 1): arguments") && text.contains(", ok, "),
        "{text}"
    );
    assert!(text.contains("finish tool_calls"), "{text}");
    assert!(text.contains("asked for create_tricklist"), "{text}");
    assert!(text.contains("a write counted against the user's hourly quota"));
    assert!(text.contains("clipped no, output check passed, disclosure"));
    assert!(
        text.contains("knowledge ["),
        "the recall is recorded: {text}"
    );
    // The story's order is the pipeline's.
    assert!(at("crisis screen") < at("gate: under the flood limit"));
    assert!(at("gate: under") < at("asked for create_tricklist"));
    assert!(at("asked for create_tricklist") < at("tool create_tricklist"));
    assert!(at("tool create_tricklist") < at("finish stop"));
    assert!(at("finish stop") < at("fixed:"));
    assert!(at("fixed:") < at("delivered: completion published"));
    assert!(text.contains("ended done"), "{text}");
    assert!(
        !text.contains("park list") && !text.contains("Explain Park list is ready"),
        "no text without --show-text: {text}"
    );
    assert!(audits(&env, id).await.is_empty(), "nothing to audit");

    let story: Value = serde_json::from_str(&explain(&env, &[id, "--json"]).await).unwrap();
    assert_eq!(story["deliveries"], 2);
    assert_eq!(story["state"], "done");
    let calls = events(&story, "llm");
    assert_eq!(calls.len(), 2, "{story}");
    for c in &calls {
        let f = &c["facts"];
        assert!(f["ms"].is_u64() && f["prompt_tokens"].is_u64(), "{c}");
        assert!(
            f["tools_offered"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t == "create_tricklist")),
            "{c}"
        );
    }
    let tool = &events(&story, "tool")[0]["facts"];
    assert_eq!(tool["ok"], true);
    assert!(tool["args_bytes"].as_u64().unwrap() > 20, "{tool}");

    let shown = explain(&env, &[id, "--show-text", "--operator", "alice"]).await;
    assert!(
        shown.contains("make me a park list with an ollie"),
        "{shown}"
    );
    assert!(
        shown.contains("your Explain Park list is ready!"),
        "{shown}"
    );
    let audit = audits(&env, id).await;
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert!(audit[0].0.starts_with("alice@"), "{audit:?}");
    assert_eq!(audit[0].1["shown"], true);

    let (ok, out, err) = env
        .run_companion(&["explain", "0123456789abcdef01234567"])
        .await;
    assert!(!ok, "an unknown message fails: {out}");
    assert!(
        err.contains("no job in the journal for message 0123456789abcdef01234567"),
        "{err}"
    );
    env.finish().await;
}

#[tokio::test]
async fn a_burst_follower_leads_to_its_head_and_a_limited_message_names_the_busy_line() {
    let echo: Responder =
        Arc::new(|body: &Value| StubReply::text(format!("ok: {}", last_user_text(body))));
    let env = TestEnv::with(echo, |c| c.turn.user_turns_per_minute = 1).await;
    let dm = |text: &'static str| env.dm(JESS, KAORI, JESS_KAORI, text);
    let mut replies = env.completions(JESS_KAORI).await;
    // A burst of two in the stream before a worker runs: one turn, the second covered.
    let burst = [dm("hey").await, dm("so").await];
    for e in &burst {
        env.publish(e).await;
    }
    let worker = env.spawn_app().await;
    let wait = Duration::from_secs(30);
    next_reply_to(&mut replies, &burst[0].message_id, wait).await;
    // Over the limit: the busy line, then nothing.
    let busy = dm("one more").await;
    env.publish(&busy).await;
    next_reply_to(&mut replies, &busy.message_id, wait).await;
    let quiet = dm("and more").await;
    env.publish(&quiet).await;
    env.settled(&quiet.message_id).await;

    let head = burst[0].message_id.as_str();
    let follower = explain(&env, &[&burst[1].message_id]).await;
    assert!(
        follower.contains(&format!("): answered by the reply of job {head}")),
        "{follower}"
    );
    assert!(
        follower.contains(&format!(
            "burst: answers 1 later message(s) too: {}",
            burst[1].message_id
        )),
        "{follower}"
    );
    let said_busy = explain(&env, &[&busy.message_id]).await;
    assert!(
        said_busy.contains("gate: OVER the flood limit; this job says the busy line"),
        "{said_busy}"
    );
    assert!(said_busy.contains("a fixed line (nobody speaks after it)"));
    assert!(
        !said_busy.contains("prompt tokens"),
        "no model call: {said_busy}"
    );
    assert!(said_busy.contains("ended limited"), "{said_busy}");
    let limited = explain(&env, &[&quiet.message_id]).await;
    assert!(
        limited.contains(&format!(
            "gate: OVER the flood limit; job {}'s busy line answers it",
            busy.message_id
        )),
        "{limited}"
    );
    assert!(limited.contains("kept in history without an answer of its own"));
    assert!(
        limited.contains("ended limited at")
            && limited.contains(&format!("answered by: {}", busy.message_id)),
        "{limited}"
    );
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_crisis_message_shows_the_screen_s_layer_never_its_text_and_none_once_deleted() {
    let env = TestEnv::new(Arc::new(|_: &Value| {
        StubReply::text("i'm really glad you told me.")
    }))
    .await;
    let worker = env.spawn_app().await;
    let e = env.dm(JESS, KAORI, JESS_KAORI, CRISIS_TEXT).await;
    env.publish(&e).await;
    env.settled(&e.message_id).await;
    let id = e.message_id.as_str();

    let text = explain(&env, &[id]).await;
    assert!(
        text.contains(&format!(
            "crisis screen of {id}: FLAGGED self_harm by layer rules"
        )),
        "{text}"
    );
    assert!(text.contains("crisis protocol for") && text.contains("referral owed"));
    let (screen, referral) = (
        text.find("FLAGGED").unwrap(),
        text.find("crisis referral").unwrap(),
    );
    assert!(screen < referral && referral < text.find("moderators alerted").unwrap());
    assert!(text.contains("crisis referral") && text.contains("moderators alerted"));
    assert!(
        text.contains("tools offered: none"),
        "no tools in crisis: {text}"
    );
    assert!(!text.contains("want to die"), "never the text: {text}");

    // Deleted (its tombstone): the text is withheld even when asked, and the ask recorded.
    sqlx::query("INSERT INTO tombstones (kind, id) VALUES ('message', $1)")
        .bind(id)
        .execute(&env.pg.pool)
        .await
        .unwrap();
    let asked = explain(&env, &[id, "--show-text", "--operator", "bob"]).await;
    assert!(asked.contains("text withheld"), "{asked}");
    assert!(!asked.contains("want to die"), "{asked}");
    let audit = audits(&env, id).await;
    assert!(
        audit.len() == 1 && audit[0].0.starts_with("bob@") && audit[0].1["shown"] == false,
        "{audit:?}"
    );
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_group_message_is_told_slot_by_slot_with_each_companion_s_calls() {
    // Each companion says who it is (the name after "You are " in its system prompt).
    let introduce: Responder = Arc::new(|body: &Value| {
        let system = body["messages"][0]["content"].as_str().unwrap_or_default();
        let name = system
            .strip_prefix("You are ")
            .and_then(|s| s.split([' ', ',']).next())
            .unwrap_or_default()
            .to_lowercase();
        StubReply::text(format!("{name} here"))
    });
    let env = TestEnv::new(introduce).await;
    let worker = env.spawn_app().await;
    let m = env
        .group_message(&[KAORI, TONY], "kaori and tony, which board?")
        .await;
    env.settled(&m.message_id).await;

    let text = explain(&env, &[&m.message_id]).await;
    assert!(text.contains("companion several (group)"), "{text}");
    assert!(text.contains("route: Kaori, Tony"), "{text}");
    assert!(
        text.contains("as Kaori") && text.contains("as Tony"),
        "{text}"
    );
    assert!(
        text.contains("[slot 0]") && text.contains("[slot 1]"),
        "{text}"
    );
    assert!(
        text.find("as Kaori").unwrap() < text.find("by Kaori fixed").unwrap()
            && text.find("by Kaori fixed").unwrap() < text.find("as Tony").unwrap(),
        "slot by slot: {text}"
    );
    assert!(!text.contains("kaori here"), "{text}");
    let shown = explain(&env, &[&m.message_id, "--show-text"]).await;
    assert!(
        shown.contains("which board?")
            && shown.contains("kaori here")
            && shown.contains("tony here"),
        "{shown}"
    );
    worker.stop().await;
    env.finish().await;
}

/// A crisis message whose model calls all fail: the story shows each failed request (the model, the
/// error and its class, the time it took) and why the crisis line stood in. The scripted offline model
/// (`companion-dev stub-llm`, which names itself so) is labelled scripted, with no price.
#[tokio::test]
async fn a_crisis_message_whose_model_fails_shows_each_failed_request_and_why_the_fixed_line() {
    let env = TestEnv::with(
        Arc::new(
            |body: &Value| match last_user_text(body).contains("want to die") {
                true => StubReply::Status {
                    code: 503,
                    body: "upstream down".into(),
                    retry_after: None,
                },
                false => StubReply::text("an ollie starts with the back foot"),
            },
        ),
        |c| {
            c.llm.max_retries = 1;
            c.llm.retry_base_ms = 10;
            c.llm.fallback_models = vec![];
        },
    )
    .await;
    env.stub.say_scripted();
    let worker = env.spawn_app().await;
    let e = env.dm(JESS, KAORI, JESS_KAORI, CRISIS_TEXT).await;
    env.publish(&e).await;
    env.settled(&e.message_id).await;
    let id = e.message_id.as_str();

    let text = explain(&env, &[id]).await;
    let failed: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("model request FAILED"))
        .collect();
    assert_eq!(failed.len(), 2, "the request and its one retry: {text}");
    for l in &failed {
        assert!(
            l.contains("chat API server error 503") && l.contains("transient after"),
            "{l}"
        );
    }
    let at = |needle: &str| {
        text.find(needle)
            .unwrap_or_else(|| panic!("`{needle}` not in\n{text}"))
    };
    assert!(
        text.contains(
            "fixed line: the crisis line instead of the model's answer, because the model could not \
             answer a user in crisis: chat API server error 503"
        ),
        "{text}"
    );
    assert!(at("crisis referral") < at("model request FAILED"));
    assert!(at("model request FAILED") < at("fixed line:"));
    // The reply's delivery (the referral's came before).
    assert!(at("fixed line:") < text.rfind("delivered: completion published").unwrap());
    assert!(!text.contains("want to die"), "never the text: {text}");
    let story: Value = serde_json::from_str(&explain(&env, &[id, "--json"]).await).unwrap();
    let notes = events(&story, "model_failed");
    assert_eq!(notes.len(), 2, "{story}");
    assert_eq!(notes[0]["facts"]["class"], "transient");
    assert!(notes[0]["facts"]["ms"].is_u64(), "{story}");
    assert_eq!(events(&story, "fixed_line")[0]["facts"]["line"], "crisis");

    // The next message is answered by the scripted model: named so, no price.
    let ok = env
        .dm(
            SAM,
            KAORI,
            &env.conversation(SAM, KAORI).await,
            "how do i ollie?",
        )
        .await;
    env.publish(&ok).await;
    env.settled(&ok.message_id).await;
    let text = explain(&env, &[ok.message_id.as_str()]).await;
    assert!(
        text.contains("model SCRIPTED (the offline stub, asked as ")
            && text.contains("cost none (scripted)"),
        "{text}"
    );
    assert!(!text.contains("cost $"), "no price: {text}");
    assert!(!text.contains("model request FAILED"), "{text}");
    worker.stop().await;
    env.finish().await;
}
