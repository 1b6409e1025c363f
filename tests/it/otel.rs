//! OpenTelemetry export (feature `otel`): a real worker process, with `OTEL_EXPORTER_OTLP_ENDPOINT`
//! pointing at a collector in this test, answers DMs; after it stops, the collector holds each job's
//! trace in the GenAI semantic conventions' shape (`invoke_agent`, `chat`, `execute_tool`, the safety
//! events), with message text only where content capture is on and allowed; `OTEL_TRACES_SAMPLER` decides
//! which traces go out.
//!
//! `cargo test --features otel --test it otel::` (without the feature this file compiles to nothing).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use crate::env::*;
use axum::{Router, body::Bytes, extract::State, routing::post};
use companion::testing::telemetry::otel::{ExportedSpan, decode_export};
use companion_dev::stub::{StubReply, scripted};
use serde_json::json;

/// An OTLP/HTTP collector that keeps every trace export request body.
async fn collector() -> (String, Arc<Mutex<Vec<Bytes>>>) {
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .route(
            "/v1/traces",
            post(
                |State(b): State<Arc<Mutex<Vec<Bytes>>>>, body: Bytes| async move {
                    b.lock().unwrap().push(body);
                    // An empty ExportTraceServiceResponse.
                    (
                        [("content-type", "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                },
            ),
        )
        .with_state(bodies.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), bodies)
}

/// Every span the collector received.
pub(crate) fn exported(bodies: &Mutex<Vec<Bytes>>) -> Vec<ExportedSpan> {
    bodies
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| decode_export(b).expect("an OTLP protobuf trace export"))
        .collect()
}

/// The agent span of the job of message `id` (the child of the `turn` span with its `event_id`), and
/// the job's spans: the agent span and every span under it.
pub(crate) fn job<'a>(
    spans: &'a [ExportedSpan],
    id: &str,
) -> (&'a ExportedSpan, Vec<&'a ExportedSpan>) {
    let names = || spans.iter().map(|s| s.name.as_str()).collect::<Vec<_>>();
    let turn = spans
        .iter()
        .find(|s| s.name == "turn" && s.attributes.get("event_id").map(String::as_str) == Some(id))
        .unwrap_or_else(|| panic!("no `turn` span for {id} among {:?}", names()));
    let agent = spans
        .iter()
        .find(|s| s.parent_id == turn.span_id && s.name.starts_with("invoke_agent "))
        .unwrap_or_else(|| panic!("no agent span under the turn among {:?}", names()));
    let mut under = vec![agent];
    let mut frontier = vec![agent.span_id.as_str()];
    while let Some(parent) = frontier.pop() {
        for s in spans.iter().filter(|s| s.parent_id == parent) {
            under.push(s);
            frontier.push(&s.span_id);
        }
    }
    (agent, under)
}

/// Whether any attribute or event of `spans` holds `text`, or any message attribute at all.
pub(crate) fn holds_text(spans: &[&ExportedSpan], text: &str) -> Option<String> {
    const MESSAGES: [&str; 3] = [
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
    ];
    let values = |a: &BTreeMap<String, String>| {
        a.iter()
            .find(|(k, v)| MESSAGES.contains(&k.as_str()) || v.contains(text))
            .map(|(k, _)| k.clone())
    };
    spans.iter().find_map(|s| {
        values(&s.attributes)
            .or_else(|| s.events.iter().find_map(|(_, a)| values(a)))
            .map(|k| format!("{}: {k}", s.name))
    })
}

/// Runs a worker process with `settings` until `turns` are done, then stops it: it flushes its spans as
/// it exits.
pub(crate) async fn worker_while<T>(
    env: &TestEnv,
    settings: &[(&str, &str)],
    turns: impl AsyncFnOnce() -> T,
) -> T {
    let mut worker = env.spawn_app_process(settings);
    let done = turns().await;
    sigterm(&worker);
    let status = wait_exit(&mut worker, std::time::Duration::from_secs(30)).await;
    assert!(status.success(), "{status}");
    done
}

pub(crate) fn tool_then_text() -> companion_dev::stub::Responder {
    scripted(
        vec![
            StubReply::tool("search_spots", json!({"query": "Portland"})),
            StubReply::text("found a couple of spots for you!"),
        ],
        StubReply::text("more?"),
    )
}

#[tokio::test]
async fn a_dm_with_a_tool_call_is_an_agent_span_with_two_chat_spans_and_a_tool_span() {
    let (endpoint, bodies) = collector().await;
    let env = TestEnv::new(tool_then_text()).await;
    let said = "any spots in portland? my secret plan is 7391";
    let event = env.dm(JESS, KAORI, JESS_KAORI, said).await;
    let settings = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_SERVICE_NAME", "companion-test"),
    ];
    worker_while(&env, &settings, async || {
        let reply = env.turn(&event).await;
        assert_eq!(reply.content, "found a couple of spots for you!");
    })
    .await;

    let spans = exported(&bodies);
    let (agent, under) = job(&spans, &event.message_id);
    assert_eq!(agent.service.as_deref(), Some("companion-test"));
    assert_eq!(agent.name, "invoke_agent Kaori");
    let a = &agent.attributes;
    assert_eq!(a["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(a["gen_ai.agent.name"], "Kaori");
    assert_eq!(a["gen_ai.agent.id"], KAORI);
    assert_eq!(a["gen_ai.conversation.id"], JESS_KAORI);
    assert_eq!(a["companion.job.kind"], "dm");
    assert_eq!(a["companion.job.outcome"], "answered");

    let model = &env.config.llm.model;
    let chats: Vec<_> = under
        .iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    assert_eq!(
        chats.len(),
        2,
        "{:?}",
        under.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    for (chat, finish) in chats.iter().zip(["[\"tool_calls\"]", "[\"stop\"]"]) {
        let c = &chat.attributes;
        assert_eq!(chat.name, format!("chat {model}"));
        assert_eq!(c["gen_ai.operation.name"], "chat");
        assert_eq!(c["gen_ai.provider.name"], "openai");
        assert_eq!(&c["gen_ai.request.model"], model);
        assert_eq!(&c["gen_ai.response.model"], model);
        assert_eq!(c["gen_ai.response.finish_reasons"], finish);
        for tokens in ["gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"] {
            let n: u64 = c[tokens].parse().unwrap();
            assert!(n > 0, "{tokens} = {n}");
        }
    }
    assert!(chats[0].attributes["companion.tools_offered"].contains("search_spots"));
    let tools: Vec<_> = under
        .iter()
        .filter(|s| s.name.starts_with("execute_tool "))
        .collect();
    assert_eq!(tools.len(), 1);
    let t = &tools[0].attributes;
    assert_eq!(tools[0].name, "execute_tool search_spots");
    assert_eq!(t["gen_ai.operation.name"], "execute_tool");
    assert_eq!(t["gen_ai.tool.name"], "search_spots");
    assert!(!t["gen_ai.tool.call.id"].is_empty());
    assert_eq!(t["companion.tool.outcome"], "ok");
    // The safety screen's decision is an event: its layer, no text.
    let screened: Vec<_> = under
        .iter()
        .flat_map(|s| &s.events)
        .filter(|(name, _)| name == "companion.safety.screened")
        .collect();
    assert_eq!(screened.len(), 1, "{screened:?}");
    assert_eq!(screened[0].1["companion.safety.layer"], "none");
    // The log lines stay in the logs: only the safety decisions (and warnings) are span events.
    let logged: Vec<_> = spans
        .iter()
        .flat_map(|s| &s.events)
        .filter(|(name, _)| !name.starts_with("companion.safety."))
        .collect();
    assert!(logged.is_empty(), "{logged:?}");
    // Content capture is off: no message text anywhere.
    let all: Vec<&ExportedSpan> = spans.iter().collect();
    assert_eq!(holds_text(&all, "7391"), None);
    env.finish().await;
}

#[tokio::test]
async fn with_content_capture_the_messages_are_on_the_spans_except_in_a_crisis_conversation() {
    let (endpoint, bodies) = collector().await;
    let env = TestEnv::new(tool_then_text()).await;
    let settings = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("COMPANION_TRACE_CONTENT", "true"),
    ];
    let (plain, crisis, later) = worker_while(&env, &settings, async || {
        let plain = env
            .dm(JESS, KAORI, JESS_KAORI, "spots near 4471 main st?")
            .await;
        env.turn(&plain).await;
        let sam = env.conversation(SAM, KAORI).await;
        let crisis = env.dm(SAM, KAORI, &sam, CRISIS_TEXT).await;
        // The referral's completion comes first; the job settles after the companion's own answer.
        env.turn(&crisis).await;
        env.settled(&crisis.message_id).await;
        // A later message of the flagged conversation brings the flagged one back as history.
        let later = env
            .dm(SAM, KAORI, &sam, "anyway, spots near 5582 oak ave?")
            .await;
        env.turn(&later).await;
        (plain, crisis, later)
    })
    .await;

    let spans = exported(&bodies);
    let (_, under) = job(&spans, &plain.message_id);
    let chats: Vec<_> = under
        .iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    assert_eq!(chats.len(), 2);
    let input = &chats[0].attributes["gen_ai.input.messages"];
    let input: serde_json::Value = serde_json::from_str(input).unwrap();
    assert!(
        input.to_string().contains("spots near 4471 main st?"),
        "{input}"
    );
    let output: serde_json::Value =
        serde_json::from_str(&chats[1].attributes["gen_ai.output.messages"]).unwrap();
    assert_eq!(
        output[0]["parts"][0],
        json!({"type": "text", "content": "found a couple of spots for you!"})
    );
    assert!(
        chats[0]
            .attributes
            .contains_key("gen_ai.system_instructions")
    );

    // The crisis message's job: flagged (by the rules, no text), and no message on any span.
    let (_, under) = job(&spans, &crisis.message_id);
    let flagged: Vec<_> = under
        .iter()
        .flat_map(|s| &s.events)
        .filter(|(name, _)| name == "companion.safety.flagged")
        .collect();
    assert_eq!(flagged.len(), 1, "{flagged:?}");
    assert_eq!(flagged[0].1["companion.safety.layer"], "rules");
    assert_eq!(flagged[0].1["companion.safety.category"], "self_harm");
    assert_eq!(holds_text(&under, "want to die"), None);
    let (_, under) = job(&spans, &later.message_id);
    assert!(under.iter().any(|s| s.name.starts_with("chat ")));
    assert_eq!(holds_text(&under, "want to die"), None);
    assert_eq!(holds_text(&under, "5582 oak"), None);
    env.finish().await;
}

#[tokio::test]
async fn the_standard_sampler_setting_is_respected() {
    let (endpoint, bodies) = collector().await;
    let env = TestEnv::new(tool_then_text()).await;
    let settings = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_TRACES_SAMPLER", "always_off"),
    ];
    let event = env.dm(JESS, KAORI, JESS_KAORI, "spots in portland?").await;
    worker_while(&env, &settings, async || {
        env.turn(&event).await;
    })
    .await;
    let spans = exported(&bodies);
    assert!(
        spans.is_empty(),
        "{:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    env.finish().await;
}

#[tokio::test]
async fn a_group_message_is_one_agent_span_per_companion_that_speaks_under_its_turn() {
    let (endpoint, bodies) = collector().await;
    let env = TestEnv::new(companion_dev::stub::always(StubReply::text("here!"))).await;
    let settings = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())];
    let e = worker_while(&env, &settings, async || {
        let e = env
            .group_message(&[KAORI, TONY, ZOE], "Tony and kaori: first trick?")
            .await;
        env.settled(&e.message_id).await;
        e
    })
    .await;

    let spans = exported(&bodies);
    let turn = spans
        .iter()
        .find(|s| s.name == "turn" && s.attributes.get("event_id") == Some(&e.message_id))
        .expect("the group message's turn span");
    let agents: Vec<_> = spans
        .iter()
        .filter(|s| s.parent_id == turn.span_id && s.name.starts_with("invoke_agent "))
        .collect();
    let names: Vec<_> = agents.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["invoke_agent Tony", "invoke_agent Kaori"],
        "in the order they spoke"
    );
    for agent in agents {
        assert_eq!(agent.attributes["companion.job.kind"], "group");
        assert_eq!(agent.attributes["companion.job.outcome"], "answered");
        assert_eq!(
            agent.attributes["gen_ai.conversation.id"],
            e.conversation_id
        );
        let chats = spans
            .iter()
            .filter(|s| s.parent_id == agent.span_id && s.name.starts_with("chat "))
            .count();
        assert_eq!(chats, 1, "{}: its own model call", agent.name);
    }
    env.finish().await;
}
