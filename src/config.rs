//! Runtime configuration: environment variables (and an optional `.env`), each also a CLI flag.
//!
//! Names used by the existing deployment (`ATLAS_URI`, `POSTGRES_URL`, `OPENROUTER_API_KEY`,
//! `OPENROUTER_MODEL`) are accepted as they are.

use std::{fmt, path::PathBuf, str::FromStr, time::Duration};

use clap::Args;

/// A value that must never reach a log: `Debug` and `Display` print a placeholder.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "\"\""
        } else {
            "\"[redacted]\""
        })
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_owned()))
    }
}

/// Redacts the passwords of a connection URL (or a comma-separated list of them), for logs.
pub fn redact_url(url: &str) -> String {
    url.split(',').map(redact_one).collect::<Vec<_>>().join(",")
}

fn redact_one(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme + 3],
                    &creds[..colon],
                    &url[at..]
                ),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Everything the worker and its commands need to reach the servers and bound their work.
#[derive(Args, Clone, Debug)]
pub struct Config {
    /// NATS server(s), comma separated.
    #[arg(
        long,
        env = "NATS_URL",
        default_value = "nats://127.0.0.1:4222",
        global = true
    )]
    pub nats_url: String,
    /// NATS user (with `NATS_PASSWORD`); credentials in `NATS_URL` itself are ignored by the client.
    #[arg(long, env = "NATS_USER", global = true)]
    pub nats_user: Option<String>,
    #[arg(
        long,
        env = "NATS_PASSWORD",
        default_value = "",
        hide_env_values = true,
        hide_default_value = true,
        global = true
    )]
    pub nats_password: Secret,
    /// Replicas of the worker's streams (3 on a three-node JetStream cluster).
    #[arg(
        long,
        env = "COMPANION_STREAM_REPLICAS",
        default_value_t = 1,
        global = true
    )]
    pub stream_replicas: usize,
    /// MongoDB connection string; the database is its path (TrickList2 when absent).
    #[arg(
        long,
        env = "ATLAS_URI",
        default_value = "mongodb://127.0.0.1:27017/TrickList2?directConnection=true",
        hide_env_values = true,
        global = true
    )]
    pub atlas_uri: String,
    /// PostgreSQL connection string (history, turn journal, knowledge base).
    #[arg(
        long,
        env = "POSTGRES_URL",
        default_value = "postgres://companion:companion@127.0.0.1:5432/companion",
        hide_env_values = true,
        global = true
    )]
    pub postgres_url: String,
    /// Key for the chat API; empty means the offline scripted model is expected at LLM_BASE_URL.
    #[arg(
        long,
        env = "OPENROUTER_API_KEY",
        default_value = "",
        hide_env_values = true,
        hide_default_value = true,
        global = true
    )]
    pub openrouter_api_key: Secret,
    /// Chat model used unless a character names its own.
    #[arg(
        long,
        env = "OPENROUTER_MODEL",
        default_value = "google/gemini-2.0-flash-001",
        global = true
    )]
    pub openrouter_model: String,
    /// Base URL of any OpenAI-compatible chat API (`/chat/completions` is appended).
    #[arg(
        long,
        env = "LLM_BASE_URL",
        default_value = "https://openrouter.ai/api/v1",
        global = true
    )]
    pub llm_base_url: String,
    /// Upper bound on one chat API request, seconds.
    #[arg(long, env = "LLM_TIMEOUT_SECS", default_value_t = 60, global = true)]
    pub llm_timeout_secs: u64,
    /// `max_tokens` sent with every chat request; companions write 1-3 sentences.
    #[arg(long, env = "LLM_MAX_TOKENS", default_value_t = 600, global = true)]
    pub llm_max_tokens: u32,
    /// Sampling temperature sent with every chat request.
    #[arg(long, env = "LLM_TEMPERATURE", default_value_t = 0.8, global = true)]
    pub llm_temperature: f32,
    /// Retries of one chat request after a timeout, 429 or 5xx, within the turn.
    #[arg(long, env = "LLM_MAX_RETRIES", default_value_t = 2, global = true)]
    pub llm_max_retries: u32,
    /// First retry delay in milliseconds (doubled per retry, ±20 % jitter); `Retry-After` wins when given.
    #[arg(long, env = "LLM_RETRY_BASE_MS", default_value_t = 500, global = true)]
    pub llm_retry_base_ms: u64,
    /// Longest wait inside a turn before a retry, seconds; a longer `Retry-After` hands the turn back to the stream.
    #[arg(long, env = "LLM_RETRY_MAX_SECS", default_value_t = 20, global = true)]
    pub llm_retry_max_secs: u64,
    /// Models tried in order when the main one keeps failing or cannot use tools (comma separated).
    #[arg(
        long,
        env = "LLM_FALLBACK_MODELS",
        value_delimiter = ',',
        global = true
    )]
    pub llm_fallback_models: Vec<String>,
    /// Outbound chat requests per second from one process (a burst of the same size is allowed).
    #[arg(
        long,
        env = "LLM_REQUESTS_PER_SECOND",
        default_value_t = 50,
        global = true
    )]
    pub llm_requests_per_second: u32,
    /// Folder holding `*.json` character files.
    #[arg(
        long,
        env = "COMPANION_CHARACTERS_DIR",
        default_value = "characters",
        global = true
    )]
    pub characters_dir: PathBuf,
    /// First tokens of every subject (`<prefix>.in.<botId>.<conversationId>` and so on).
    #[arg(
        long,
        env = "COMPANION_SUBJECT_PREFIX",
        default_value = "dm.bot",
        global = true
    )]
    pub subject_prefix: String,
    /// Prefix of the JetStream stream names (`<prefix>_IN`, `_OUT`, `_DLQ`).
    #[arg(
        long,
        env = "COMPANION_STREAM_PREFIX",
        default_value = "DM_BOT",
        global = true
    )]
    pub stream_prefix: String,
    /// Durable pull consumer shared by every worker process.
    #[arg(
        long,
        env = "COMPANION_CONSUMER",
        default_value = "companion-worker",
        global = true
    )]
    pub consumer: String,
    /// Turns processed at once by one worker process.
    #[arg(
        long,
        env = "COMPANION_CONCURRENCY",
        default_value_t = 64,
        global = true
    )]
    pub concurrency: usize,
    /// Deliveries of one event before it is dead-lettered.
    #[arg(
        long,
        env = "COMPANION_MAX_DELIVER",
        default_value_t = 5,
        global = true
    )]
    pub max_deliver: i64,
    /// Seconds the server waits for an ack or progress before redelivering; progress is sent at a third of it.
    #[arg(
        long,
        env = "COMPANION_ACK_WAIT_SECS",
        default_value_t = 30,
        global = true
    )]
    pub ack_wait_secs: u64,
    /// Base delay of the NAK backoff for transient failures, seconds (doubled per delivery, capped at 60).
    #[arg(
        long,
        env = "COMPANION_RETRY_DELAY_SECS",
        default_value_t = 2,
        global = true
    )]
    pub retry_delay_secs: u64,
    /// Largest accepted event payload in bytes; larger events are dead-lettered unread.
    #[arg(long, env = "COMPANION_MAX_EVENT_BYTES", default_value_t = 64 * 1024, global = true)]
    pub max_event_bytes: usize,
    /// Largest accepted message text in characters.
    #[arg(
        long,
        env = "COMPANION_MAX_CONTENT_CHARS",
        default_value_t = 4000,
        global = true
    )]
    pub max_content_chars: usize,
    /// History messages (this user with this bot) sent to the model.
    #[arg(
        long,
        env = "COMPANION_HISTORY_LIMIT",
        default_value_t = 20,
        global = true
    )]
    pub history_limit: i64,
    /// Rounds of tool calls one turn may make before the model must answer in text.
    #[arg(
        long,
        env = "COMPANION_MAX_TOOL_ROUNDS",
        default_value_t = 3,
        global = true
    )]
    pub max_tool_rounds: u32,
    /// Things (tricklists, spot drafts) tools may create per user per rolling hour, across all workers.
    #[arg(
        long,
        env = "COMPANION_WRITES_PER_HOUR",
        default_value_t = 5,
        global = true
    )]
    pub writes_per_hour: u32,
    /// Seconds in-flight turns get to finish after SIGTERM/SIGINT before they are NAKed.
    #[arg(
        long,
        env = "COMPANION_SHUTDOWN_GRACE_SECS",
        default_value_t = 20,
        global = true
    )]
    pub shutdown_grace_secs: u64,
    /// Unacknowledged deliveries the shared consumer allows across all workers (0: 4 × concurrency).
    /// Waiting messages (behind an earlier one of their conversation) count here, not in concurrency.
    #[arg(
        long,
        env = "COMPANION_MAX_ACK_PENDING",
        default_value_t = 0,
        global = true
    )]
    pub max_ack_pending: i64,
    /// Longest a message waits for an earlier message of its conversation before going ahead anyway.
    #[arg(
        long,
        env = "COMPANION_ORDER_MAX_WAIT_SECS",
        default_value_t = 600,
        global = true
    )]
    pub order_max_wait_secs: u64,
    /// Longest reply stored and published, in characters (longer model text is cut with `…`).
    #[arg(
        long,
        env = "COMPANION_MAX_REPLY_CHARS",
        default_value_t = 4000,
        global = true
    )]
    pub max_reply_chars: usize,
    /// Later messages of a burst one turn may answer together (0: one reply per message).
    #[arg(long, env = "COMPANION_BURST_MAX", default_value_t = 8, global = true)]
    pub burst_max: usize,
    /// Turns per user per minute before the busy line answers instead of the model (0: no limit).
    #[arg(
        long,
        env = "COMPANION_USER_TURNS_PER_MINUTE",
        default_value_t = 10,
        global = true
    )]
    pub user_turns_per_minute: u32,
    /// Folder holding the embedding model (`model.onnx`, `tokenizer.json`); `deploy/local/models.sh` fills it.
    #[arg(
        long,
        env = "COMPANION_MODEL_DIR",
        default_value = ".local/models",
        global = true
    )]
    pub model_dir: PathBuf,
    /// ONNX Runtime shared library (must be 1.31.x); loaded at start-up, never downloaded.
    #[arg(
        long,
        env = "ORT_DYLIB_PATH",
        default_value = ".local/models/libonnxruntime.so.1.31.1",
        global = true
    )]
    pub ort_dylib_path: PathBuf,
    /// Intra-op threads of the embedding model (0 = one per core).
    #[arg(
        long,
        env = "COMPANION_EMBED_THREADS",
        default_value_t = 2,
        global = true
    )]
    pub embed_threads: usize,
    /// Most texts in one model run; concurrent turns' texts are batched up to this.
    #[arg(
        long,
        env = "COMPANION_EMBED_MAX_BATCH",
        default_value_t = 32,
        global = true
    )]
    pub embed_max_batch: usize,
    /// Milliseconds the embedder waits for more texts after the first before running the model; 0 runs at
    /// once, and texts that arrive while the model runs go together into the next run.
    #[arg(
        long,
        env = "COMPANION_EMBED_WINDOW_MS",
        default_value_t = 0,
        global = true
    )]
    pub embed_window_ms: u64,
    /// Lowest cosine similarity for a knowledge chunk to enter the prompt.
    #[arg(
        long,
        env = "COMPANION_RAG_THRESHOLD",
        default_value_t = 0.45,
        global = true
    )]
    pub rag_threshold: f32,
    /// Knowledge chunks put in the prompt at most.
    #[arg(long, env = "COMPANION_RAG_TOP_K", default_value_t = 3, global = true)]
    pub rag_top_k: i64,
    /// Longest chunk in tokens, [CLS] and [SEP] included (the model reads 256 at most).
    #[arg(
        long,
        env = "COMPANION_CHUNK_TOKENS",
        default_value_t = 256,
        global = true
    )]
    pub chunk_tokens: usize,
    /// Share of a chunk repeated at the start of the next one.
    #[arg(
        long,
        env = "COMPANION_CHUNK_OVERLAP",
        default_value_t = 0.15,
        global = true
    )]
    pub chunk_overlap: f32,
    /// Address of `/healthz`, `/readyz` and `/metrics` (empty: off). A port in use is logged, not fatal.
    #[arg(
        long,
        env = "COMPANION_HTTP_ADDR",
        default_value = "127.0.0.1:9090",
        global = true
    )]
    pub http_addr: String,
    /// `text` for terminals, `json` for log shippers.
    #[arg(
        long,
        env = "LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub log_format: LogFormat,

    // Operations (issue 7): usage accounting, bounds, TLS, OpenTelemetry.
    /// Prices that estimate a response's cost when the server reports none (OpenRouter reports it):
    /// `model=prompt:completion,…` in USD per million tokens. A model missing here is recorded `unpriced`.
    #[arg(
        long,
        env = "LLM_PRICES",
        default_value = "google/gemini-2.0-flash-001=0.10:0.40",
        global = true
    )]
    pub llm_prices: crate::usage::Prices,
    /// Largest chat API response body read, bytes; a larger one fails the request (not retried).
    #[arg(long, env = "LLM_MAX_RESPONSE_BYTES", default_value_t = 1024 * 1024, global = true)]
    pub llm_max_response_bytes: usize,
    /// Largest tool result sent back to the model, bytes; a longer one is cut and marked as cut.
    #[arg(
        long,
        env = "COMPANION_MAX_TOOL_RESULT_BYTES",
        default_value_t = 16 * 1024,
        global = true
    )]
    pub max_tool_result_bytes: usize,
    /// Refuse a NATS connection without TLS (also implied by a `tls://` URL or any NATS_TLS_* file).
    #[arg(
        long,
        env = "NATS_TLS_REQUIRED",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new(),
        global = true
    )]
    pub nats_tls_required: bool,
    /// PEM file of the CA(s) that sign the NATS servers' certificates (else the system roots).
    #[arg(long, env = "NATS_TLS_CA_FILE", global = true)]
    pub nats_tls_ca_file: Option<PathBuf>,
    /// PEM client certificate for NATS servers that verify clients (mutual TLS), with NATS_TLS_KEY_FILE.
    #[arg(
        long,
        env = "NATS_TLS_CERT_FILE",
        global = true,
        requires = "nats_tls_key_file"
    )]
    pub nats_tls_cert_file: Option<PathBuf>,
    /// PEM private key of NATS_TLS_CERT_FILE.
    #[arg(
        long,
        env = "NATS_TLS_KEY_FILE",
        global = true,
        requires = "nats_tls_cert_file"
    )]
    pub nats_tls_key_file: Option<PathBuf>,
    /// TLS before the NATS protocol starts (the server needs `handshake_first: true`).
    #[arg(
        long,
        env = "NATS_TLS_FIRST",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new(),
        global = true
    )]
    pub nats_tls_first: bool,
    /// OTLP/HTTP collector (e.g. `http://otel-collector:4318`) that receives the turn spans; empty = no
    /// export. Only in builds with the `otel` feature; others log a warning and ignore it.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_ENDPOINT",
        default_value = "",
        global = true
    )]
    pub otel_endpoint: String,
    /// `service.name` of the exported spans.
    #[arg(
        long,
        env = "OTEL_SERVICE_NAME",
        default_value = "companion",
        global = true
    )]
    pub otel_service_name: String,
}

impl Config {
    /// Configuration from the environment only (for tests and tools that have no CLI).
    pub fn from_env() -> Result<Self, clap::Error> {
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            config: Config,
        }
        use clap::Parser;
        Wrapper::try_parse_from(["companion"]).map(|w| w.config)
    }

    /// The environment that gives a child process (a worker the bench or a test starts) exactly this
    /// configuration. Every setting is listed, so a flag given to the parent is never lost on the way.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let c = self;
        let path = |p: &PathBuf| p.display().to_string();
        let log_format = match c.log_format {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        };
        let mut env = vec![
            ("NATS_URL", c.nats_url.clone()),
            ("NATS_PASSWORD", c.nats_password.expose().to_owned()),
            ("COMPANION_STREAM_REPLICAS", c.stream_replicas.to_string()),
            ("ATLAS_URI", c.atlas_uri.clone()),
            ("POSTGRES_URL", c.postgres_url.clone()),
            (
                "OPENROUTER_API_KEY",
                c.openrouter_api_key.expose().to_owned(),
            ),
            ("OPENROUTER_MODEL", c.openrouter_model.clone()),
            ("LLM_BASE_URL", c.llm_base_url.clone()),
            ("LLM_TIMEOUT_SECS", c.llm_timeout_secs.to_string()),
            ("LLM_MAX_TOKENS", c.llm_max_tokens.to_string()),
            ("LLM_TEMPERATURE", c.llm_temperature.to_string()),
            ("LLM_MAX_RETRIES", c.llm_max_retries.to_string()),
            ("LLM_RETRY_BASE_MS", c.llm_retry_base_ms.to_string()),
            ("LLM_RETRY_MAX_SECS", c.llm_retry_max_secs.to_string()),
            ("LLM_FALLBACK_MODELS", c.llm_fallback_models.join(",")),
            (
                "LLM_REQUESTS_PER_SECOND",
                c.llm_requests_per_second.to_string(),
            ),
            ("COMPANION_CHARACTERS_DIR", path(&c.characters_dir)),
            ("COMPANION_SUBJECT_PREFIX", c.subject_prefix.clone()),
            ("COMPANION_STREAM_PREFIX", c.stream_prefix.clone()),
            ("COMPANION_CONSUMER", c.consumer.clone()),
            ("COMPANION_CONCURRENCY", c.concurrency.to_string()),
            ("COMPANION_MAX_DELIVER", c.max_deliver.to_string()),
            ("COMPANION_ACK_WAIT_SECS", c.ack_wait_secs.to_string()),
            ("COMPANION_RETRY_DELAY_SECS", c.retry_delay_secs.to_string()),
            ("COMPANION_MAX_EVENT_BYTES", c.max_event_bytes.to_string()),
            (
                "COMPANION_MAX_CONTENT_CHARS",
                c.max_content_chars.to_string(),
            ),
            ("COMPANION_HISTORY_LIMIT", c.history_limit.to_string()),
            ("COMPANION_MAX_TOOL_ROUNDS", c.max_tool_rounds.to_string()),
            ("COMPANION_WRITES_PER_HOUR", c.writes_per_hour.to_string()),
            (
                "COMPANION_SHUTDOWN_GRACE_SECS",
                c.shutdown_grace_secs.to_string(),
            ),
            ("COMPANION_MAX_ACK_PENDING", c.max_ack_pending.to_string()),
            (
                "COMPANION_ORDER_MAX_WAIT_SECS",
                c.order_max_wait_secs.to_string(),
            ),
            ("COMPANION_MAX_REPLY_CHARS", c.max_reply_chars.to_string()),
            ("COMPANION_BURST_MAX", c.burst_max.to_string()),
            (
                "COMPANION_USER_TURNS_PER_MINUTE",
                c.user_turns_per_minute.to_string(),
            ),
            ("COMPANION_MODEL_DIR", path(&c.model_dir)),
            ("ORT_DYLIB_PATH", path(&c.ort_dylib_path)),
            ("COMPANION_EMBED_THREADS", c.embed_threads.to_string()),
            ("COMPANION_EMBED_MAX_BATCH", c.embed_max_batch.to_string()),
            ("COMPANION_EMBED_WINDOW_MS", c.embed_window_ms.to_string()),
            ("COMPANION_RAG_THRESHOLD", c.rag_threshold.to_string()),
            ("COMPANION_RAG_TOP_K", c.rag_top_k.to_string()),
            ("COMPANION_CHUNK_TOKENS", c.chunk_tokens.to_string()),
            ("COMPANION_CHUNK_OVERLAP", c.chunk_overlap.to_string()),
            ("COMPANION_HTTP_ADDR", c.http_addr.clone()),
            ("LOG_FORMAT", log_format.to_owned()),
            ("LLM_PRICES", c.llm_prices.to_string()),
            (
                "LLM_MAX_RESPONSE_BYTES",
                c.llm_max_response_bytes.to_string(),
            ),
            (
                "COMPANION_MAX_TOOL_RESULT_BYTES",
                c.max_tool_result_bytes.to_string(),
            ),
            ("NATS_TLS_REQUIRED", c.nats_tls_required.to_string()),
            ("NATS_TLS_FIRST", c.nats_tls_first.to_string()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", c.otel_endpoint.clone()),
            ("OTEL_SERVICE_NAME", c.otel_service_name.clone()),
        ];
        let optional = [
            ("NATS_USER", c.nats_user.clone()),
            ("NATS_TLS_CA_FILE", c.nats_tls_ca_file.as_ref().map(path)),
            (
                "NATS_TLS_CERT_FILE",
                c.nats_tls_cert_file.as_ref().map(path),
            ),
            ("NATS_TLS_KEY_FILE", c.nats_tls_key_file.as_ref().map(path)),
        ];
        env.extend(optional.into_iter().filter_map(|(k, v)| Some((k, v?))));
        env
    }

    /// The database named in `ATLAS_URI`'s path, `TrickList2` when there is none.
    pub fn mongo_database(&self) -> String {
        mongo_database_from_uri(&self.atlas_uri)
    }

    /// The size limits inbound events are parsed with.
    pub fn event_limits(&self) -> crate::bus::event::Limits {
        crate::bus::event::Limits {
            max_event_bytes: self.max_event_bytes,
            max_content_chars: self.max_content_chars,
        }
    }

    pub fn ack_wait(&self) -> Duration {
        Duration::from_secs(self.ack_wait_secs.max(1))
    }

    pub fn llm_timeout(&self) -> Duration {
        Duration::from_secs(self.llm_timeout_secs.max(1))
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }

    /// The consumer's limit on unacknowledged deliveries.
    pub fn max_ack_pending(&self) -> i64 {
        if self.max_ack_pending > 0 {
            self.max_ack_pending
        } else {
            (self.concurrency.max(1) * 4) as i64
        }
    }

    pub fn order_max_wait(&self) -> Duration {
        Duration::from_secs(self.order_max_wait_secs)
    }
}

fn mongo_database_from_uri(uri: &str) -> String {
    let rest = uri.split_once("://").map(|(_, r)| r).unwrap_or(uri);
    let rest = rest.split_once('?').map(|(p, _)| p).unwrap_or(rest);
    match rest.split_once('/') {
        Some((_, db)) if !db.is_empty() => db.to_owned(),
        _ => "TrickList2".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `to_env` lists every setting, and what it lists reads back as the same configuration.
    #[test]
    fn the_environment_of_a_child_process_carries_every_setting() {
        use clap::{CommandFactory, Parser};
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            config: Config,
        }
        let mut config = Wrapper::try_parse_from(["companion"]).unwrap().config;
        config.nats_user = Some("worker".into());
        config.nats_tls_ca_file = Some("/etc/ca.pem".into());
        config.nats_tls_required = true;
        config.llm_fallback_models = vec!["a/b".into(), "c/d".into()];
        config.burst_max = 3;
        config.rag_threshold = 0.375;
        config.log_format = LogFormat::Json;
        config.llm_prices = "m/one=0.1:0.4,m/two=1:2".parse().unwrap();
        let env = config.to_env();
        let command = Wrapper::command();
        let mut args = vec!["companion".to_owned()];
        for arg in command.get_arguments() {
            let Some(name) = arg.get_env().and_then(|e| e.to_str()) else {
                continue;
            };
            let listed = env.iter().find(|(k, _)| *k == name);
            let optional = [
                "NATS_USER",
                "NATS_TLS_CA_FILE",
                "NATS_TLS_CERT_FILE",
                "NATS_TLS_KEY_FILE",
            ];
            assert!(
                listed.is_some() || optional.contains(&name),
                "{name} is missing from to_env"
            );
            if let Some((_, v)) = listed {
                args.push(format!("--{}={v}", arg.get_long().unwrap()));
            }
        }
        let back = Wrapper::try_parse_from(args).unwrap().config;
        assert_eq!(format!("{back:?}"), format!("{config:?}"));
        assert_eq!(back.nats_password.expose(), config.nats_password.expose());
    }

    #[test]
    fn database_comes_from_the_uri_path() {
        assert_eq!(
            mongo_database_from_uri("mongodb+srv://u:p@x.mongodb.net/TrickList2?retryWrites=true"),
            "TrickList2"
        );
        assert_eq!(
            mongo_database_from_uri("mongodb://127.0.0.1:27017/other"),
            "other"
        );
        assert_eq!(
            mongo_database_from_uri("mongodb://127.0.0.1:27017/?directConnection=true"),
            "TrickList2"
        );
        assert_eq!(
            mongo_database_from_uri("mongodb://127.0.0.1:27017"),
            "TrickList2"
        );
    }

    #[test]
    fn secrets_and_passwords_are_redacted() {
        assert_eq!(
            format!("{:?}", Secret::new("sk-or-v1-abc")),
            "\"[redacted]\""
        );
        assert_eq!(
            redact_url("postgres://elizaos:hunter2@localhost:5432/elizaos"),
            "postgres://elizaos:***@localhost:5432/elizaos"
        );
        assert_eq!(redact_url("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(
            redact_url("nats://w:pw@a:4222,nats://w:pw@b:4222"),
            "nats://w:***@a:4222,nats://w:***@b:4222"
        );
    }
}
