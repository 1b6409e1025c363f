//! Tracing setup: readable lines on a terminal, JSON lines when configured, and, in builds with the
//! `otel` feature, the spans (every `turn` with its `event_id`, `conversation_id`, `bot_id`, `delivery`,
//! `seq`, and the spans inside it) exported to an OTLP/HTTP collector when `OTEL_EXPORTER_OTLP_ENDPOINT`
//! is set. Off by default; the default build carries no OpenTelemetry code.

use std::io::IsTerminal;

use tracing_subscriber::{EnvFilter, filter::filter_fn, fmt, prelude::*};

use crate::config::{LogConfig, LogFormat};

/// Keeps the span exporter alive; dropping it flushes the spans not yet sent (bounded by the
/// exporter's timeout).
#[must_use = "dropping the guard stops the span export"]
pub struct Telemetry {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        #[cfg(feature = "otel")]
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("OpenTelemetry: spans not flushed at exit: {e}");
        }
    }
}

/// Installs the global subscriber; `RUST_LOG` overrides the default filter.
pub fn init(config: &LogConfig) -> Telemetry {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new("info,async_nats=warn,mongodb=warn,sqlx=warn,hyper=warn,reqwest=warn")
    });
    #[cfg(feature = "otel")]
    let (provider, otel_error) = match otel::provider(config) {
        Ok(p) => (p, None),
        Err(e) => (None, Some(e)),
    };
    #[cfg(feature = "otel")]
    let otel_layer = provider.as_ref().map(otel::layer);
    #[cfg(not(feature = "otel"))]
    let otel_layer: Option<tracing_subscriber::layer::Identity> = None;

    let registry = tracing_subscriber::registry().with(filter).with(otel_layer);
    // Colour only on a terminal: a log file or a pipe gets plain text.
    let ansi = std::io::stderr().is_terminal();
    // The GenAI spans and events are for the exporter; a log line keeps its `turn` span's ids.
    let logged = || filter_fn(|m| m.target() != crate::genai::TARGET);
    let result = match config.format {
        LogFormat::Text => registry
            .with(
                fmt::layer()
                    .with_ansi(ansi)
                    .with_writer(std::io::stderr)
                    .with_filter(logged()),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_writer(std::io::stderr)
                    .with_filter(logged()),
            )
            .try_init(),
    };
    // A second init (tests, embedded use) keeps the first subscriber.
    let _ = result;

    let endpoint = config.otel_endpoint.trim();
    #[cfg(feature = "otel")]
    match (&provider, otel_error) {
        (Some(_), _) => {
            crate::genai::set_exporting(true);
            crate::genai::set_capture(config.trace_content);
            tracing::info!(
                endpoint,
                service = %config.otel_service_name,
                content = config.trace_content,
                "exporting spans over OTLP/HTTP"
            );
            if config.trace_content {
                tracing::warn!(
                    "COMPANION_TRACE_CONTENT is on: message text goes on the exported spans, beyond the reach of a later deletion (staging only)"
                );
            }
        }
        (None, Some(e)) => tracing::error!(error = %e, "span export not started"),
        (None, None) => {}
    }
    #[cfg(not(feature = "otel"))]
    if !endpoint.is_empty() {
        tracing::warn!(
            endpoint,
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but this build has no `otel` feature; spans are not exported"
        );
    }
    Telemetry {
        #[cfg(feature = "otel")]
        provider,
    }
}

#[cfg(feature = "otel")]
pub(crate) mod otel {
    //! The OTLP/HTTP (protobuf) span exporter: batched on its own thread with a blocking HTTP client, so
    //! no export ever waits on the worker's runtime. The SDK bounds it: at most 2048 spans queued
    //! (later ones are dropped and counted by the SDK), 512 per request, sent every 5 s and at exit.

    use std::time::Duration;

    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    use opentelemetry_sdk::{Resource, trace::SdkTracerProvider};

    use crate::config::LogConfig;

    /// The provider exporting to `{OTEL_EXPORTER_OTLP_ENDPOINT}/v1/traces`, or `None` when no endpoint is set.
    /// Extra headers (e.g. a collector's API key) come from `OTEL_EXPORTER_OTLP_HEADERS`.
    pub(crate) fn provider(config: &LogConfig) -> Result<Option<SdkTracerProvider>, String> {
        let base = config.otel_endpoint.trim().trim_end_matches('/');
        if base.is_empty() {
            return Ok(None);
        }
        // reqwest is built without a default crypto provider (an https collector needs one).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("{base}/v1/traces"))
            .with_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| e.to_string())?;
        let resource = Resource::builder()
            .with_service_name(config.otel_service_name.clone())
            .build();
        Ok(Some(
            SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource)
                .build(),
        ))
    }

    /// The `tracing` layer that turns spans into OpenTelemetry spans of `provider`: every span the
    /// filter lets through (the `turn`, the GenAI spans, the retrieval), and of the events inside them
    /// only the safety decisions
    /// ([`crate::genai::Safety`]) and warnings and errors; the log lines stay in the logs. Per span, only
    /// its own fields: no busy and idle time, thread, code location or target (each an attribute, and
    /// busy time a clock read on every poll), and no OpenTelemetry context made current on entry (no
    /// other OpenTelemetry instrumentation reads it).
    pub(crate) fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use tracing_subscriber::{Layer as _, filter::filter_fn};
        let exported = filter_fn(|m| {
            m.is_span() || *m.level() <= tracing::Level::WARN || m.target() == crate::genai::TARGET
        });
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("companion"))
            .with_tracked_inactivity(false)
            .with_threads(false)
            .with_location(false)
            .with_target(false)
            .with_context_activation(false)
            .with_filter(exported)
    }

    /// One span of an export request, as a collector sees it.
    #[cfg(any(test, feature = "testing"))]
    #[derive(Clone, Debug, PartialEq)]
    pub struct ExportedSpan {
        pub service: Option<String>,
        pub name: String,
        pub trace_id: String,
        pub span_id: String,
        /// Empty for a trace's root.
        pub parent_id: String,
        /// String forms of the attribute values.
        pub attributes: std::collections::BTreeMap<String, String>,
        /// The span's events: name and attributes.
        pub events: Vec<(String, std::collections::BTreeMap<String, String>)>,
    }

    /// The spans in the body of an OTLP/HTTP protobuf trace export (what a collector receives at
    /// `/v1/traces`); for tests and for checking what a worker sends.
    #[cfg(any(test, feature = "testing"))]
    pub fn decode_export(body: &[u8]) -> Result<Vec<ExportedSpan>, prost::DecodeError> {
        use opentelemetry_proto::tonic::{
            collector::trace::v1::ExportTraceServiceRequest, common::v1::any_value::Value,
        };
        use prost::Message as _;
        let text = |v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match v
            .as_ref()
            .and_then(|v| v.value.as_ref())
        {
            Some(Value::StringValue(s)) => s.clone(),
            Some(Value::IntValue(i)) => i.to_string(),
            Some(Value::BoolValue(b)) => b.to_string(),
            Some(Value::DoubleValue(d)) => d.to_string(),
            // A string array as JSON.
            Some(Value::ArrayValue(a)) => serde_json::Value::from(
                a.values
                    .iter()
                    .map(|v| match &v.value {
                        Some(Value::StringValue(s)) => s.clone(),
                        other => format!("{other:?}"),
                    })
                    .collect::<Vec<_>>(),
            )
            .to_string(),
            Some(other) => format!("{other:?}"),
            None => String::new(),
        };
        let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let attributes = |kvs: &[opentelemetry_proto::tonic::common::v1::KeyValue]| {
            kvs.iter()
                .map(|kv| (kv.key.clone(), text(&kv.value)))
                .collect()
        };
        let request = ExportTraceServiceRequest::decode(body)?;
        let mut out = Vec::new();
        for rs in request.resource_spans {
            let service = rs.resource.as_ref().and_then(|r| {
                r.attributes
                    .iter()
                    .find(|kv| kv.key == "service.name")
                    .map(|kv| text(&kv.value))
            });
            for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                out.push(ExportedSpan {
                    service: service.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_id: hex(&span.parent_span_id),
                    attributes: attributes(&span.attributes),
                    events: span
                        .events
                        .iter()
                        .map(|e| (e.name.clone(), attributes(&e.attributes)))
                        .collect(),
                    name: span.name,
                });
            }
        }
        Ok(out)
    }
}

/// A binary's `main`: runs `run` on a new Tokio runtime (with `threads` worker threads, else one per
/// core) and reports a failure on stderr as one line with its whole chain of causes (`error: a: b: c`),
/// the backtrace only with `RUST_LIB_BACKTRACE=1`.
pub fn run_main<E, F>(threads: Option<usize>, run: impl FnOnce() -> F) -> std::process::ExitCode
where
    E: std::fmt::Display + std::fmt::Debug + From<std::io::Error>,
    F: std::future::Future<Output = Result<(), E>>,
{
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = threads {
        builder.worker_threads(threads);
    }
    let result = builder
        .enable_all()
        .build()
        .map_err(E::from)
        .and_then(|rt| rt.block_on(run()));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if std::env::var_os("RUST_LIB_BACKTRACE").is_some_and(|v| v == "1") {
                eprintln!("{e:?}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
