//! The traces in a real LLM-observability server (feature `otel`): Arize Phoenix, installed from PyPI by
//! deploy/local/phoenix.sh, started here on its own SQLite folder. Real worker processes export to it;
//! the test reads the spans back through Phoenix's REST API and checks what Phoenix made of them: the
//! agent, its two model calls with their token counts and its tool call, no text with content capture
//! off, the text with it on, except in a crisis-flagged conversation.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use crate::{
    env::*,
    otel::{holds_text, job, tool_then_text, worker_while},
    servers::*,
};
use companion::testing::telemetry::otel::ExportedSpan;
use serde_json::Value;

/// `PHOENIX_BIN` (deploy/local/test.sh sets it), else `.local/phoenix/venv/bin`.
fn phoenix_bin() -> PathBuf {
    let dir = std::env::var_os("PHOENIX_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| local_dir().join("phoenix/venv/bin"));
    assert!(
        dir.join("phoenix").is_file(),
        "Phoenix is not installed in {}: run deploy/local/phoenix.sh (deploy/local/test.sh does)",
        dir.display()
    );
    dir
}

/// A Phoenix server of this test: its base URL; stopped when dropped.
struct Phoenix {
    base: String,
    _server: Server,
}

impl Phoenix {
    async fn start(dir: &TempDir) -> Self {
        // The tests' reqwest is built without a default crypto provider.
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let [http, grpc] = free_ports::<2>();
        let log = std::fs::File::create(dir.0.join("phoenix.log")).unwrap();
        let child = std::process::Command::new(phoenix_bin().join("phoenix"))
            .arg("serve")
            .env("PHOENIX_WORKING_DIR", &dir.0)
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", http.to_string())
            .env("PHOENIX_GRPC_PORT", grpc.to_string())
            .env("PHOENIX_ALLOW_EXTERNAL_RESOURCES", "false")
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .env("PHOENIX_LOG_MIGRATIONS", "false")
            // Its pid files go under the temp dir, not the shared one.
            .env("TMPDIR", &dir.0)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("phoenix starts");
        let phoenix = Self {
            base: format!("http://127.0.0.1:{http}"),
            _server: Server(child),
        };
        let ready = format!("{}/readyz", phoenix.base);
        let up = eventually(Duration::from_secs(90), || async {
            reqwest::get(&ready)
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        let log = std::fs::read_to_string(dir.0.join("phoenix.log")).unwrap_or_default();
        assert!(up, "Phoenix not ready within 90 s:\n{log}");
        phoenix
    }

    /// Every span of project `default`, oldest first, as the test's collector decodes them; Phoenix's own
    /// span kind is added as attribute `phoenix.span_kind`.
    async fn spans(&self) -> Vec<ExportedSpan> {
        let http = reqwest::Client::new();
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut url = format!(
                "{}/v1/projects/default/spans?sort=start_time&order=asc&limit=1000",
                self.base
            );
            if let Some(c) = &cursor {
                url.push_str(&format!("&cursor={c}"));
            }
            let response = http.get(&url).send().await.unwrap();
            // The project exists from its first span on.
            if response.status() == 404 {
                return out;
            }
            let page: Value = response.error_for_status().unwrap().json().await.unwrap();
            out.extend(page["data"].as_array().unwrap().iter().map(span));
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => return out,
            }
        }
    }
}

/// A span of Phoenix's REST API in the collector's terms.
fn span(v: &Value) -> ExportedSpan {
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let attributes = |v: &Value| -> BTreeMap<String, String> {
        v.as_object()
            .map(|o| o.iter().map(|(k, v)| (k.clone(), text(v))).collect())
            .unwrap_or_default()
    };
    let mut attrs = attributes(&v["attributes"]);
    attrs.insert("phoenix.span_kind".into(), text(&v["span_kind"]));
    ExportedSpan {
        service: None,
        name: text(&v["name"]),
        trace_id: text(&v["context"]["trace_id"]),
        span_id: text(&v["context"]["span_id"]),
        parent_id: v["parent_id"].as_str().unwrap_or_default().to_owned(),
        attributes: attrs,
        events: v["events"]
            .as_array()
            .map(|es| {
                es.iter()
                    .map(|e| (text(&e["name"]), attributes(&e["attributes"])))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

#[tokio::test]
async fn phoenix_shows_the_agent_its_model_calls_and_its_tool_call_and_text_only_where_allowed() {
    let dir = TempDir::new("companion-phoenix");
    let phoenix = Phoenix::start(&dir).await;
    let env = TestEnv::new(tool_then_text()).await;

    let secret = env
        .dm(
            JESS,
            KAORI,
            JESS_KAORI,
            "spots in portland? my locker code is 7391",
        )
        .await;
    let settings = |content| {
        [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix.base.as_str()),
            ("COMPANION_TRACE_CONTENT", content),
        ]
    };
    worker_while(&env, &settings("false"), async || {
        env.turn(&secret).await;
    })
    .await;
    let sam = env.conversation(SAM, KAORI).await;
    let plain = env
        .dm(JESS, KAORI, JESS_KAORI, "and near 4471 main st?")
        .await;
    let crisis = env.dm(SAM, KAORI, &sam, CRISIS_TEXT).await;
    worker_while(&env, &settings("true"), async || {
        env.turn(&plain).await;
        env.turn(&crisis).await;
        env.settled(&crisis.message_id).await;
    })
    .await;

    // Phoenix stores what the exporter flushed at exit within a moment.
    let ids = [&secret, &plain, &crisis].map(|e| e.message_id.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let spans = loop {
        let spans = phoenix.spans().await;
        let stored = ids.iter().all(|id| {
            spans
                .iter()
                .any(|s| s.name == "turn" && s.attributes.get("event_id") == Some(id))
        });
        if stored {
            break spans;
        }
        let late = tokio::time::Instant::now() > deadline;
        assert!(
            !late,
            "not every turn reached Phoenix: {} spans",
            spans.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // The DM with a tool call, as Phoenix shows it.
    let (agent, under) = job(&spans, &secret.message_id);
    assert_eq!(agent.name, "invoke_agent Kaori");
    assert_eq!(agent.attributes["phoenix.span_kind"], "AGENT");
    assert_eq!(agent.attributes["gen_ai.agent.name"], "Kaori");
    assert_eq!(agent.attributes["gen_ai.conversation.id"], JESS_KAORI);
    // Phoenix groups a conversation's traces as a session.
    assert_eq!(agent.attributes["session.id"], JESS_KAORI);
    let model = &env.config.llm.model;
    let chats: Vec<_> = under
        .iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    assert_eq!(chats.len(), 2);
    for chat in &chats {
        let a = &chat.attributes;
        assert_eq!(chat.name, format!("chat {model}"));
        assert_eq!(a["phoenix.span_kind"], "LLM");
        assert_eq!(&a["llm.model_name"], model);
        for (ours, theirs) in [
            ("gen_ai.usage.input_tokens", "llm.token_count.prompt"),
            ("gen_ai.usage.output_tokens", "llm.token_count.completion"),
        ] {
            let n: u64 = a[theirs].parse().unwrap();
            assert!(n > 0, "{theirs} = {n}");
            assert_eq!(a[ours], a[theirs], "Phoenix's count is ours");
        }
    }
    let tools: Vec<_> = under
        .iter()
        .filter(|s| s.name.starts_with("execute_tool "))
        .collect();
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].name, "execute_tool search_spots");
    assert_eq!(tools[0].attributes["phoenix.span_kind"], "TOOL");
    assert_eq!(tools[0].attributes["tool.name"], "search_spots");
    assert_eq!(holds_text(&under, "7391"), None, "content capture off");

    // With content capture on: the text of a plain DM, as Phoenix reads it.
    let (_, under) = job(&spans, &plain.message_id);
    let first = under.iter().find(|s| s.name.starts_with("chat ")).unwrap();
    let inputs: Vec<_> = first
        .attributes
        .iter()
        .filter(|(k, _)| k.starts_with("llm.input_messages."))
        .map(|(_, v)| v.as_str())
        .collect();
    assert!(
        inputs.iter().any(|v| v.contains("and near 4471 main st?")),
        "{inputs:?}"
    );
    // …and none of the crisis-flagged message, whose screen's layer is shown.
    let (_, under) = job(&spans, &crisis.message_id);
    assert_eq!(holds_text(&under, "want to die"), None);
    let flagged = under
        .iter()
        .flat_map(|s| &s.events)
        .find(|(name, _)| name == "companion.safety.flagged")
        .expect("the flag as an event");
    assert_eq!(flagged.1["companion.safety.layer"], "rules");
    env.finish().await;
}
