//! What a job looks like to an LLM-observability tool: the OpenTelemetry GenAI semantic conventions
//! (semconv v1.37.0, the `gen_ai.*` registry, experimental) as this worker speaks them. The one place
//! that names their spans, attributes, span events and client histograms, and decides whether a span
//! may carry message text.
//!
//! - The spans are `tracing` spans of target [`TARGET`]; the `otel` build's layer exports them
//!   (`otel.name` is the exported name, `otel.kind` its kind) and the logs leave them out. Without an
//!   exporter ([`exporting`]) they are not made at all: a worker that exports nothing pays an atomic load.
//! - `invoke_agent {agent}`: one per job (a DM's turn, a follow-up), or one per companion that speaks in a
//!   group message, with the job's outcome. `chat {model}`: one per request to the chat API (a retry or a
//!   fallback model is a request of its own). `execute_tool {tool}`: one per tool call run.
//!   `embeddings {model}`: one per request to the local embedder (which batches requests on its own
//!   thread). The knowledge lookup's `retrieval` span is the retriever's own (not a GenAI operation of
//!   the pinned version).
//! - Safety decisions are span events named `companion.safety.*` ([`Safety`]) with their category and
//!   layer, never any text.
//! - Message text goes on a span only where [`content_allowed`]: the operator turned capture on
//!   (`COMPANION_TRACE_CONTENT=true` with an exporter running) and the job said so for the code inside
//!   [`with_content`]; everywhere else, and by default, never.

use std::{
    future::Future,
    sync::atomic::{AtomicBool, Ordering},
};

use tracing::{Span, field::Empty, info_span};

use crate::metrics::{Labels, Metric, Metrics};

/// The target of every span and event here: the exporter takes them, the logs leave them out (the log
/// lines keep the `turn` span's ids, and say what the safety events say in their own words).
pub const TARGET: &str = "companion::genai";

/// `gen_ai.client.token.usage` in Prometheus form: tokens of each model call, by type (input, output).
pub(crate) const TOKEN_USAGE: Metric = Metric::new(
    "gen_ai_client_token_usage",
    "Tokens of each model call (gen_ai.client.token.usage), by gen_ai_token_type",
);
/// `gen_ai.client.operation.duration` in Prometheus form: seconds of each model call or embedder batch.
pub(crate) const OPERATION_DURATION: Metric = Metric::new(
    "gen_ai_client_operation_duration_seconds",
    "Duration of each GenAI client operation (gen_ai.client.operation.duration)",
);
/// The conventions' advised bucket bounds for the token histogram.
pub(crate) const TOKEN_BUCKETS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
];
/// The conventions' advised bucket bounds for the duration histogram, seconds.
pub(crate) const DURATION_BUCKETS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// One model call or embedder batch, for the client histograms.
pub struct Operation<'a> {
    /// `chat` or `embeddings`.
    pub name: &'static str,
    pub provider: &'a str,
    pub request_model: &'a str,
    /// The model that answered, when one did.
    pub response_model: Option<&'a str>,
    /// The error's class when the call failed.
    pub error: Option<&'a str>,
}

impl Operation<'_> {
    /// Records the call's duration and, when it answered, its input and output tokens.
    pub fn observe(&self, metrics: &Metrics, seconds: f64, tokens: Option<(u64, u64)>) {
        let response = self.response_model.unwrap_or("");
        let mut labels: Vec<(&'static str, &str)> = vec![
            ("gen_ai_operation_name", self.name),
            ("gen_ai_provider_name", self.provider),
            ("gen_ai_request_model", self.request_model),
            ("gen_ai_response_model", response),
        ];
        if let Some(e) = self.error {
            labels.push(("error_type", e));
        }
        metrics.observe(&OPERATION_DURATION, DURATION_BUCKETS, &labels, seconds);
        if let Some((input, output)) = tokens {
            for (kind, n) in [("input", input), ("output", output)] {
                let mut l = labels.clone();
                l.push(("gen_ai_token_type", kind));
                metrics.observe(&TOKEN_USAGE, TOKEN_BUCKETS, &l as Labels<'_>, n as f64);
            }
        }
    }
}

/// The span of one job of companion `agent` (its display name) in `conversation`; the job's kind
/// (`dm`, `group`, `follow_up`) and, when it settles, its outcome ([`outcome`]).
pub fn agent(
    agent: &str,
    agent_id: &dyn std::fmt::Display,
    conversation: &str,
    kind: &str,
) -> Span {
    if !exporting() {
        return Span::none();
    }
    info_span!(
        target: TARGET,
        "invoke_agent",
        otel.name = %format_args!("invoke_agent {agent}"),
        otel.kind = "internal",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = agent,
        gen_ai.agent.id = %agent_id,
        gen_ai.conversation.id = conversation,
        companion.job.kind = kind,
        companion.job.outcome = Empty,
        companion.job.reason = Empty,
        error.type = Empty,
    )
}

/// Records how the job of agent span `span` ended: `answered`, `limited`, `dropped` (with the reason),
/// `held`, `already_done` or `failed` (with the error's class as `error.type`).
pub fn outcome(span: &Span, outcome: &str, reason: Option<&str>) {
    span.record("companion.job.outcome", outcome);
    if let Some(r) = reason {
        span.record("companion.job.reason", r);
    }
    if outcome == "failed" {
        span.record("error.type", reason.unwrap_or("failed"));
    }
}

/// The span of one request to the chat API; the response's attributes are added by [`ChatSpan`].
pub fn chat(
    provider: &str,
    model: &str,
    max_tokens: Option<u32>,
    temperature: Option<f32>,
) -> Span {
    if !exporting() {
        return Span::none();
    }
    info_span!(
        target: TARGET,
        "chat",
        otel.name = %format_args!("chat {model}"),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider,
        gen_ai.request.model = model,
        gen_ai.request.max_tokens = max_tokens,
        gen_ai.request.temperature = temperature.map(f64::from),
        gen_ai.response.model = Empty,
        gen_ai.response.id = Empty,
        gen_ai.response.finish_reasons = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.usage.cache_read.input_tokens = Empty,
        companion.cost_usd = Empty,
        companion.tools_offered = Empty,
        gen_ai.system_instructions = Empty,
        gen_ai.input.messages = Empty,
        gen_ai.output.messages = Empty,
        error.type = Empty,
        otel.status_code = Empty,
    )
}

/// What a chat call's answer adds to its span.
#[derive(Default)]
pub struct ChatAnswer<'a> {
    pub response_model: Option<&'a str>,
    pub response_id: Option<&'a str>,
    /// The choices' finish reasons.
    pub finish_reasons: Vec<&'a str>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// Prompt tokens the provider served from its cache, when it says.
    pub cached_tokens: Option<u64>,
    pub cost_usd: Option<f64>,
}

/// Records the answer of the chat call of `span`.
pub fn answered(span: &Span, a: &ChatAnswer<'_>) {
    if let Some(m) = a.response_model {
        span.record("gen_ai.response.model", m);
    }
    if let Some(id) = a.response_id {
        span.record("gen_ai.response.id", id);
    }
    if !a.finish_reasons.is_empty() {
        string_array(span, "gen_ai.response.finish_reasons", &a.finish_reasons);
    }
    if let Some(n) = a.input_tokens {
        span.record("gen_ai.usage.input_tokens", n);
    }
    if let Some(n) = a.output_tokens {
        span.record("gen_ai.usage.output_tokens", n);
    }
    if let Some(n) = a.cached_tokens {
        span.record("gen_ai.usage.cache_read.input_tokens", n);
    }
    if let Some(usd) = a.cost_usd {
        span.record("companion.cost_usd", usd);
    }
}

/// Sets attribute `key` of `span` to a string array: typed on the exported span (feature `otel`); in the
/// logs, and in a build without the exporter, its JSON text.
fn string_array(span: &Span, key: &'static str, values: &[&str]) {
    #[cfg(feature = "otel")]
    {
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        let values = values.iter().map(|v| v.to_string().into()).collect();
        span.set_attribute(
            key,
            opentelemetry::Value::Array(opentelemetry::Array::String(values)),
        );
    }
    #[cfg(not(feature = "otel"))]
    span.record(key, serde_json::json!(values).to_string().as_str());
}

/// Records that the operation of `span` failed, with the error's class.
pub fn failed(span: &Span, error_type: &str) {
    span.record("error.type", error_type);
    span.record("otel.status_code", "error");
}

/// The span of one tool call (`outcome`: `ok`, `error`, recorded when it ends).
pub fn tool(name: &str, call_id: &str) -> Span {
    if !exporting() {
        return Span::none();
    }
    info_span!(
        target: TARGET,
        "execute_tool",
        otel.name = %format_args!("execute_tool {name}"),
        otel.kind = "internal",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = name,
        gen_ai.tool.call.id = call_id,
        gen_ai.tool.type = "function",
        companion.tool.outcome = Empty,
        error.type = Empty,
        otel.status_code = Empty,
    )
}

/// The span of one batch of the local embedder.
pub fn embeddings(model: &str, inputs: usize) -> Span {
    if !exporting() {
        return Span::none();
    }
    info_span!(
        target: TARGET,
        "embeddings",
        otel.name = %format_args!("embeddings {model}"),
        otel.kind = "internal",
        gen_ai.operation.name = "embeddings",
        gen_ai.provider.name = "local",
        gen_ai.request.model = model,
        companion.embeddings.inputs = inputs,
        error.type = Empty,
        otel.status_code = Empty,
    )
}

/// A safety decision, recorded as an event of the current span: which check, which category and which
/// layer decided; never any text.
#[derive(Clone, Copy, Debug)]
pub enum Safety<'a> {
    /// The crisis screen read a user message and `layer` decided (`none` when nothing flagged it).
    Screened { layer: &'a str },
    /// A user message flagged as a crisis of `category` by `layer`.
    Flagged { category: &'a str, layer: &'a str },
    /// The crisis referral went out for a message of `category`.
    Referral { category: &'a str },
    /// The outgoing check replaced a companion's message (`category` of what it caught).
    OutputReplaced { category: &'a str },
    /// A moderator's pause held the message.
    Held,
}

impl Safety<'_> {
    /// Adds the decision to the current span.
    pub fn record(self) {
        if !exporting() {
            return;
        }
        use tracing::{Level, event};
        match self {
            Self::Screened { layer } => event!(
                target: TARGET,
                Level::INFO,
                companion.safety.layer = layer,
                "companion.safety.screened"
            ),
            Self::Flagged { category, layer } => event!(
                target: TARGET,
                Level::INFO,
                companion.safety.category = category,
                companion.safety.layer = layer,
                "companion.safety.flagged"
            ),
            Self::Referral { category } => event!(
                target: TARGET,
                Level::INFO,
                companion.safety.category = category,
                "companion.safety.referral"
            ),
            Self::OutputReplaced { category } => event!(
                target: TARGET,
                Level::INFO,
                companion.safety.category = category,
                "companion.safety.output_replaced"
            ),
            Self::Held => event!(target: TARGET, Level::INFO, "companion.safety.held"),
        }
    }
}

/// Whether spans are exported: without an exporter the GenAI spans and events are not made at all.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Says that an exporter runs (telemetry's init, when `OTEL_EXPORTER_OTLP_ENDPOINT` is set).
pub fn set_exporting(on: bool) {
    EXPORTING.store(on, Ordering::Relaxed);
}

/// Whether the GenAI spans are made (a disabled span costs nothing, and records into it are no-ops).
pub(crate) fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Whether message text may go on spans at all: the operator's setting, with an exporter running.
static CAPTURE: AtomicBool = AtomicBool::new(false);

/// Turns content capture on or off for the process (telemetry's init, from `COMPANION_TRACE_CONTENT`).
pub fn set_capture(on: bool) {
    CAPTURE.store(on, Ordering::Relaxed);
}

/// Whether the process captures content at all (a job then decides its own, [`with_content`]).
pub fn capturing() -> bool {
    CAPTURE.load(Ordering::Relaxed)
}

tokio::task_local! {
    static ALLOWED: bool;
}

/// Runs `fut` with its model calls' text allowed on their spans when `allowed` (and the process
/// captures); outside such a scope text is never captured.
pub fn with_content<F: Future>(allowed: bool, fut: F) -> impl Future<Output = F::Output> {
    ALLOWED.scope(allowed && capturing(), fut)
}

/// Whether the code running now may put message text on a span.
pub fn content_allowed() -> bool {
    capturing() && ALLOWED.try_with(|a| *a).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn text_is_captured_only_inside_an_allowing_scope_of_a_capturing_process() {
        // One test owns the process-wide switch.
        set_capture(false);
        assert!(!with_content(true, async { content_allowed() }).await);
        set_capture(true);
        assert!(!content_allowed(), "outside any scope");
        assert!(with_content(true, async { content_allowed() }).await);
        assert!(!with_content(false, async { content_allowed() }).await);
        // A task spawned from an allowing scope does not inherit it.
        let spawned = with_content(true, async {
            tokio::spawn(async { content_allowed() }).await
        })
        .await
        .unwrap();
        assert!(!spawned);
        set_capture(false);
    }

    #[test]
    fn the_histograms_render_under_their_prometheus_names() {
        let m = Metrics::default();
        let op = Operation {
            name: "chat",
            provider: "openrouter",
            request_model: "a/model",
            response_model: Some("a/model"),
            error: None,
        };
        op.observe(&m, 0.3, Some((120, 8)));
        let text = m.render();
        for line in [
            "# TYPE gen_ai_client_operation_duration_seconds histogram",
            "# TYPE gen_ai_client_token_usage histogram",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(
            text.contains("gen_ai_client_token_usage_sum{gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"openrouter\",gen_ai_request_model=\"a/model\",gen_ai_response_model=\"a/model\",gen_ai_token_type=\"input\"} 120.0"),
            "{text}"
        );
    }
}
