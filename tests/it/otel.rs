//! OpenTelemetry export (feature `otel`): a real worker process, with `OTEL_EXPORTER_OTLP_ENDPOINT`
//! pointing at a collector in this test, answers a DM; after it stops, the collector holds the `turn`
//! span with the event's ids, under the configured service name.
//!
//! `cargo test --features otel --test otel` (without the feature this file compiles to nothing).

use std::sync::{Arc, Mutex};

use crate::env::*;
use axum::{Router, body::Bytes, extract::State, routing::post};
use companion::testing::telemetry::otel::{ExportedSpan, decode_export};
use companion_dev::stub::{StubReply, always};

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

#[tokio::test]
async fn a_real_turn_is_exported_as_a_turn_span_with_its_event_id() {
    let (endpoint, bodies) = collector().await;
    let env = TestEnv::new(always(StubReply::text("traced!"))).await;
    let mut worker = env.spawn_worker_process(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ("OTEL_SERVICE_NAME", "companion-test"),
    ]);
    let event = env.dm(JESS, KAORI, JESS_KAORI, "are you traced?").await;
    let reply = env.turn(&event).await;
    assert_eq!(reply.content, "traced!");
    sigterm(&worker);
    let status = wait_exit(&mut worker, std::time::Duration::from_secs(30)).await;
    assert!(status.success(), "{status}");

    let spans: Vec<ExportedSpan> = bodies
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| decode_export(b).expect("an OTLP protobuf trace export"))
        .collect();
    let turn = spans
        .iter()
        .find(|s| s.name == "turn" && s.attributes.get("event_id") == Some(&event.message_id))
        .unwrap_or_else(|| {
            panic!(
                "no `turn` span for {} among {:?}",
                event.message_id,
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            )
        });
    assert_eq!(turn.service.as_deref(), Some("companion-test"));
    assert_eq!(turn.attributes["conversation_id"], JESS_KAORI);
    assert_eq!(turn.attributes["bot_id"], KAORI);
    assert_eq!(turn.attributes["delivery"], "1");
    // The spans inside the turn belong to its trace.
    let inside = spans
        .iter()
        .filter(|s| s.trace_id == turn.trace_id && s.name != "turn")
        .count();
    eprintln!(
        "{} spans exported; {inside} inside the turn's trace",
        spans.len()
    );
    assert!(inside > 0, "no span inside the turn's trace");
    env.finish().await;
}
