//! Runtime configuration, one section per component: environment variables (and an optional `.env`),
//! each also a flag of the same name in kebab case. A subcommand takes only the sections it uses, so its
//! `--help` lists only its settings; each component is built from its own section.
//!
//! With the `testing` feature every section also derives `serde::Serialize`, secrets exposed: the dev
//! tooling writes a child process's environment from it (`companion_dev::child_env`). A production build
//! has no way to serialize a secret.
//!
//! Names used by the existing deployment (`ATLAS_URI`, `POSTGRES_URL`, `OPENROUTER_API_KEY`,
//! `OPENROUTER_MODEL`) are accepted as they are.

use std::{path::PathBuf, time::Duration};

use clap::Args;

/// A value that must never reach a log (a key, a password): `secrecy`'s string, whose `Debug` prints a
/// placeholder and whose memory is zeroed when dropped. Read it with [`ExposeSecret::expose_secret`].
pub use secrecy::{ExposeSecret, SecretString as Secret};

/// A secret as it is, for a child process's environment (see the module's doc).
#[cfg(feature = "testing")]
fn exposed<S: serde::Serializer>(secret: &Secret, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(secret.expose_secret())
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
#[cfg_attr(
    feature = "testing",
    derive(serde::Serialize),
    serde(rename_all = "kebab-case")
)]
pub enum LogFormat {
    Text,
    Json,
}

/// NATS: servers, credentials, TLS, and the names of subjects and streams.
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "NATS")]
pub struct NatsConfig {
    /// NATS server(s), comma separated.
    #[arg(
        id = "nats-url",
        long = "nats-url",
        env = "NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    pub url: String,
    /// NATS user (with `NATS_PASSWORD`); credentials in `NATS_URL` itself are ignored by the client.
    #[arg(id = "nats-user", long = "nats-user", env = "NATS_USER")]
    pub user: Option<String>,
    #[arg(
        id = "nats-password",
        long = "nats-password",
        env = "NATS_PASSWORD",
        default_value = "",
        hide_env_values = true,
        hide_default_value = true
    )]
    #[cfg_attr(feature = "testing", serde(serialize_with = "exposed"))]
    pub password: Secret,
    /// Refuse a NATS connection without TLS (also implied by a `tls://` URL or any NATS_TLS_* file).
    #[arg(
        id = "nats-tls-required",
        long = "nats-tls-required",
        env = "NATS_TLS_REQUIRED",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub tls_required: bool,
    /// PEM file of the CA(s) that sign the NATS servers' certificates (else the system roots).
    #[arg(
        id = "nats-tls-ca-file",
        long = "nats-tls-ca-file",
        env = "NATS_TLS_CA_FILE"
    )]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate for NATS servers that verify clients (mutual TLS), with NATS_TLS_KEY_FILE.
    #[arg(
        id = "nats-tls-cert-file",
        long = "nats-tls-cert-file",
        env = "NATS_TLS_CERT_FILE",
        requires = "nats-tls-key-file"
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of NATS_TLS_CERT_FILE.
    #[arg(
        id = "nats-tls-key-file",
        long = "nats-tls-key-file",
        env = "NATS_TLS_KEY_FILE",
        requires = "nats-tls-cert-file"
    )]
    pub tls_key_file: Option<PathBuf>,
    /// TLS before the NATS protocol starts (the server needs `handshake_first: true`).
    #[arg(
        id = "nats-tls-first",
        long = "nats-tls-first",
        env = "NATS_TLS_FIRST",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub tls_first: bool,
    /// First tokens of every subject (`<prefix>.in.<botId>.<conversationId>` and so on).
    #[arg(
        id = "subject-prefix",
        long = "subject-prefix",
        env = "COMPANION_SUBJECT_PREFIX",
        default_value = "dm.bot"
    )]
    pub subject_prefix: String,
    /// Prefix of the JetStream stream names (`<prefix>_IN`, `_OUT`, `_DLQ`).
    #[arg(
        id = "stream-prefix",
        long = "stream-prefix",
        env = "COMPANION_STREAM_PREFIX",
        default_value = "DM_BOT"
    )]
    pub stream_prefix: String,
    /// Replicas of the streams (3 on a three-node JetStream cluster); applied by `companion provision`.
    #[arg(
        id = "stream-replicas",
        long = "stream-replicas",
        env = "COMPANION_STREAM_REPLICAS",
        default_value_t = 1
    )]
    pub stream_replicas: usize,
    /// How long the first connection to NATS is tried (an attempt every 2 s; the cause logged at the
    /// first failure and again only when it changes) before the command gives up, naming the server,
    /// the cause and the attempts.
    #[arg(
        id = "nats-connect-window-secs",
        long = "nats-connect-window-secs",
        env = "NATS_CONNECT_WINDOW_SECS",
        default_value_t = 60
    )]
    pub connect_window_secs: u64,
}

/// The durable consumer every worker shares. Created with these settings when missing; changed only by
/// `companion provision`.
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "Consumer (changed by `companion provision`)")]
pub struct ConsumerConfig {
    /// Durable pull consumer shared by every worker process.
    #[arg(
        id = "consumer",
        long = "consumer",
        env = "COMPANION_CONSUMER",
        default_value = "companion-worker"
    )]
    pub name: String,
    /// Deliveries of one event before it is dead-lettered.
    #[arg(
        id = "max-deliver",
        long = "max-deliver",
        env = "COMPANION_MAX_DELIVER",
        default_value_t = 5
    )]
    pub max_deliver: i64,
    /// Seconds the server waits for an ack or progress before redelivering; progress is sent at a third of it.
    #[arg(
        id = "ack-wait-secs",
        long = "ack-wait-secs",
        env = "COMPANION_ACK_WAIT_SECS",
        default_value_t = 30
    )]
    pub ack_wait_secs: u64,
    /// Unacknowledged deliveries the consumer allows across all workers (about 4 × the concurrency of one
    /// worker). Waiting messages (behind an earlier one of their conversation) count here.
    #[arg(
        id = "max-ack-pending",
        long = "max-ack-pending",
        env = "COMPANION_MAX_ACK_PENDING",
        default_value_t = 256
    )]
    pub max_ack_pending: i64,
}

impl ConsumerConfig {
    pub fn ack_wait(&self) -> Duration {
        Duration::from_secs(self.ack_wait_secs.max(1))
    }
}

/// MongoDB: the app's database.
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "MongoDB")]
pub struct MongoConfig {
    /// MongoDB connection string; the database is its path (TrickList2 when absent).
    #[arg(
        id = "atlas-uri",
        long = "atlas-uri",
        env = "ATLAS_URI",
        default_value = "mongodb://127.0.0.1:27017/TrickList2?directConnection=true",
        hide_env_values = true
    )]
    pub uri: String,
}

impl MongoConfig {
    /// The database named in the URI's path, `TrickList2` when there is none.
    pub fn database(&self) -> String {
        mongo_database_from_uri(&self.uri)
    }
}

/// PostgreSQL: history, the journal, the knowledge base.
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "PostgreSQL")]
pub struct PgConfig {
    /// PostgreSQL connection string.
    #[arg(
        id = "postgres-url",
        long = "postgres-url",
        env = "POSTGRES_URL",
        default_value = "postgres://companion:companion@127.0.0.1:5432/companion",
        hide_env_values = true
    )]
    pub url: String,
    /// Connections of this process's pool.
    #[arg(
        id = "postgres-pool",
        long = "postgres-pool",
        env = "POSTGRES_POOL_SIZE",
        default_value_t = 16
    )]
    pub pool_size: u32,
}

/// The OpenAI-compatible chat API.
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "Chat model")]
pub struct LlmConfig {
    /// Key for the chat API; empty means the offline scripted model is expected at LLM_BASE_URL.
    #[arg(
        id = "openrouter-api-key",
        long = "openrouter-api-key",
        env = "OPENROUTER_API_KEY",
        default_value = "",
        hide_env_values = true,
        hide_default_value = true
    )]
    #[cfg_attr(feature = "testing", serde(serialize_with = "exposed"))]
    pub api_key: Secret,
    /// Chat model used unless a character names its own.
    #[arg(
        id = "openrouter-model",
        long = "openrouter-model",
        env = "OPENROUTER_MODEL",
        default_value = "google/gemini-2.0-flash-001"
    )]
    pub model: String,
    /// Base URL of any OpenAI-compatible chat API (`/chat/completions` is appended).
    #[arg(
        id = "llm-base-url",
        long = "llm-base-url",
        env = "LLM_BASE_URL",
        default_value = "https://openrouter.ai/api/v1"
    )]
    pub base_url: String,
    /// Upper bound on one chat API request, seconds.
    #[arg(
        id = "llm-timeout-secs",
        long = "llm-timeout-secs",
        env = "LLM_TIMEOUT_SECS",
        default_value_t = 60
    )]
    pub timeout_secs: u64,
    /// `max_tokens` sent with every chat request; companions write 1-3 sentences.
    #[arg(
        id = "llm-max-tokens",
        long = "llm-max-tokens",
        env = "LLM_MAX_TOKENS",
        default_value_t = 600
    )]
    pub max_tokens: u32,
    /// Sampling temperature sent with every chat request.
    #[arg(
        id = "llm-temperature",
        long = "llm-temperature",
        env = "LLM_TEMPERATURE",
        default_value_t = 0.8
    )]
    pub temperature: f32,
    /// Retries of one chat request after a timeout, 429, 5xx or failed answer, within the turn.
    #[arg(
        id = "llm-max-retries",
        long = "llm-max-retries",
        env = "LLM_MAX_RETRIES",
        default_value_t = 2
    )]
    pub max_retries: u32,
    /// First retry delay in milliseconds (doubled per retry, ±20 % jitter); `Retry-After` wins when given.
    #[arg(
        id = "llm-retry-base-ms",
        long = "llm-retry-base-ms",
        env = "LLM_RETRY_BASE_MS",
        default_value_t = 500
    )]
    pub retry_base_ms: u64,
    /// Longest wait inside a turn before a retry, seconds; a longer `Retry-After` hands the turn back to the stream.
    #[arg(
        id = "llm-retry-max-secs",
        long = "llm-retry-max-secs",
        env = "LLM_RETRY_MAX_SECS",
        default_value_t = 20
    )]
    pub retry_max_secs: u64,
    /// Models tried in order when the main one keeps failing or cannot use tools (comma separated).
    #[arg(
        id = "llm-fallback-models",
        long = "llm-fallback-models",
        env = "LLM_FALLBACK_MODELS",
        value_delimiter = ','
    )]
    pub fallback_models: Vec<String>,
    /// Outbound chat requests per second from one process (a burst of the same size is allowed).
    #[arg(
        id = "llm-requests-per-second",
        long = "llm-requests-per-second",
        env = "LLM_REQUESTS_PER_SECOND",
        default_value_t = 50
    )]
    pub requests_per_second: u32,
    /// Prices that estimate a response's cost when the server reports none (OpenRouter reports it):
    /// `model=prompt:completion,…` in USD per million tokens. A model missing here is recorded `unpriced`.
    #[arg(
        id = "llm-prices",
        long = "llm-prices",
        env = "LLM_PRICES",
        default_value = "google/gemini-2.0-flash-001=0.10:0.40,google/gemini-2.0-flash-lite-001=0.075:0.30"
    )]
    pub prices: String,
    /// Largest chat API response body read, bytes; a larger one fails the request (not retried).
    #[arg(id = "llm-max-response-bytes",
        long = "llm-max-response-bytes", env = "LLM_MAX_RESPONSE_BYTES", default_value_t = 1024 * 1024)]
    pub max_response_bytes: usize,
}

impl LlmConfig {
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs.max(1))
    }
}

/// The companions' character files.
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "Characters")]
pub struct CharactersConfig {
    /// Folder holding `*.json` character files.
    #[arg(
        id = "characters-dir",
        long = "characters-dir",
        env = "COMPANION_CHARACTERS_DIR",
        default_value = "characters"
    )]
    pub dir: PathBuf,
    /// Folder holding the guided flows (`*.json`) the characters offer; checked at start-up.
    #[arg(
        id = "flows-dir",
        long = "flows-dir",
        env = "COMPANION_FLOWS_DIR",
        default_value = "flows"
    )]
    pub flows_dir: PathBuf,
}

/// The prompt budget (docs/prompt.md): a cap in estimated tokens per block of what a turn sends the
/// model, and one on the whole first request (tools, system prompt, history, the new messages). Over its
/// cap a block loses its last lines; over the total, history goes oldest first, then knowledge.
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "Prompt budget")]
pub struct PromptConfig {
    /// The whole first request of a turn.
    #[arg(
        id = "prompt-max-tokens",
        long = "prompt-max-tokens",
        env = "COMPANION_PROMPT_MAX_TOKENS",
        default_value_t = 3000
    )]
    pub max_tokens: usize,
    /// Who the companion is: bio, backstory, personality, style, topics, examples.
    #[arg(
        id = "prompt-character-tokens",
        long = "prompt-character-tokens",
        env = "COMPANION_PROMPT_CHARACTER_TOKENS",
        default_value_t = 550
    )]
    pub character_tokens: usize,
    /// The rules every companion follows.
    #[arg(
        id = "prompt-rules-tokens",
        long = "prompt-rules-tokens",
        env = "COMPANION_PROMPT_RULES_TOKENS",
        default_value_t = 250
    )]
    pub rules_tokens: usize,
    /// The user's profile, tricklists and pending reminders.
    #[arg(
        id = "prompt-user-tokens",
        long = "prompt-user-tokens",
        env = "COMPANION_PROMPT_USER_TOKENS",
        default_value_t = 350
    )]
    pub user_tokens: usize,
    /// Knowledge chunks retrieved for the message.
    #[arg(
        id = "prompt-knowledge-tokens",
        long = "prompt-knowledge-tokens",
        env = "COMPANION_PROMPT_KNOWLEDGE_TOKENS",
        default_value_t = 300
    )]
    pub knowledge_tokens: usize,
    /// Guided flows: the one in progress, or those on offer when the message asks for one.
    #[arg(
        id = "prompt-flow-tokens",
        long = "prompt-flow-tokens",
        env = "COMPANION_PROMPT_FLOW_TOKENS",
        default_value_t = 300
    )]
    pub flow_tokens: usize,
    /// Offer each turn the tools its messages call for (and `more_tools`); false offers every tool on
    /// every turn: a longer prompt, but one prefix for all turns of a companion.
    #[arg(id = "prompt-tools-by-turn", long = "prompt-tools-by-turn", env = "COMPANION_PROMPT_TOOLS_BY_TURN", default_value_t = true, action = clap::ArgAction::Set)]
    pub tools_by_turn: bool,
    /// The conversation before the new messages (within `COMPANION_HISTORY_LIMIT` messages).
    #[arg(
        id = "prompt-history-tokens",
        long = "prompt-history-tokens",
        env = "COMPANION_PROMPT_HISTORY_TOKENS",
        default_value_t = 1000
    )]
    pub history_tokens: usize,
    /// The history window begins at an anchor (about one message in this many, the same on every turn)
    /// and moves in steps, so a conversation's turns share their history prefix, which a provider's
    /// prompt cache serves at its cached-read price; 1 slides it one message a turn (no cache across
    /// turns, on average `step / 2` messages more in the window).
    #[arg(
        id = "prompt-history-step",
        long = "prompt-history-step",
        env = "COMPANION_PROMPT_HISTORY_STEP",
        default_value_t = 8
    )]
    pub history_step: usize,
    /// What the companion remembers about the user: pinned facts and those nearest the message.
    #[arg(
        id = "prompt-memory-tokens",
        long = "prompt-memory-tokens",
        env = "COMPANION_PROMPT_MEMORY_TOKENS",
        default_value_t = 300
    )]
    pub memory_tokens: usize,
    /// The rolling summary of the conversation before the history window.
    #[arg(
        id = "prompt-summary-tokens",
        long = "prompt-summary-tokens",
        env = "COMPANION_PROMPT_SUMMARY_TOKENS",
        default_value_t = 200
    )]
    pub summary_tokens: usize,
}

/// Safety for people (docs/safety.md): the crisis protocol, the AI disclosure, minors.
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "Safety")]
pub struct SafetyConfig {
    /// Crisis lines and referral texts (JSON, the shape of `crates/safety/src/crisis.json`); empty: the
    /// built-in ones.
    #[arg(
        id = "crisis-lines-file",
        long = "crisis-lines-file",
        env = "COMPANION_CRISIS_LINES_FILE",
        default_value = ""
    )]
    pub crisis_lines_file: String,
    /// At most one crisis referral per conversation in this many seconds (every flag is still
    /// counted and alerted).
    #[arg(
        id = "crisis-referral-window-secs",
        long = "crisis-referral-window-secs",
        env = "COMPANION_CRISIS_REFERRAL_WINDOW_SECS",
        default_value_t = 3600
    )]
    pub crisis_referral_window_secs: u64,
    /// A crisis line whose `checked` date is older than this many days is due for review: the worker
    /// warns at start-up and reports it in `companion_crisis_lines_stale` (docs/safety.md).
    #[arg(
        id = "crisis-lines-review-days",
        long = "crisis-lines-review-days",
        env = "COMPANION_CRISIS_LINES_REVIEW_DAYS",
        default_value_t = 365
    )]
    pub crisis_lines_review_days: u32,
    /// Companions say they are an AI on the first message of the user's day and every few hours of a
    /// continuing interaction (New York GBL Art. 47, California SB 243). Off only for tests of other
    /// features, or where the app itself shows an equivalent notice on every such message.
    #[arg(
        id = "ai-disclosure",
        long = "ai-disclosure",
        env = "COMPANION_AI_DISCLOSURE",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub ai_disclosure: bool,
    /// A continuing interaction is disclosed again (and a minor reminded to take a break) after this
    /// many seconds.
    #[arg(
        id = "disclosure-every-secs",
        long = "disclosure-every-secs",
        env = "COMPANION_DISCLOSURE_EVERY_SECS",
        default_value_t = 3 * 3600
    )]
    pub disclosure_every_secs: u64,
    /// A gap longer than this many seconds ends a continuing interaction.
    #[arg(
        id = "disclosure-gap-secs",
        long = "disclosure-gap-secs",
        env = "COMPANION_DISCLOSURE_GAP_SECS",
        default_value_t = 30 * 60
    )]
    pub disclosure_gap_secs: u64,
    /// Users-document field TB-Backend sets to say the user is a minor (boolean); read first.
    #[arg(
        id = "age-field-is-minor",
        long = "age-field-is-minor",
        env = "COMPANION_AGE_FIELD_IS_MINOR",
        default_value = "isMinor"
    )]
    pub field_is_minor: String,
    /// Users-document field with the age bracket (`under_13`, `13_15`, `16_17`, `adult`); read second.
    #[arg(
        id = "age-field-bracket",
        long = "age-field-bracket",
        env = "COMPANION_AGE_FIELD_BRACKET",
        default_value = "ageBracket"
    )]
    pub field_age_bracket: String,
    /// Users-document field with the birth date; read last.
    #[arg(
        id = "age-field-birthdate",
        long = "age-field-birthdate",
        env = "COMPANION_AGE_FIELD_BIRTHDATE",
        default_value = "birthdate"
    )]
    pub field_birthdate: String,
    /// A user whose age is unknown is treated as a minor.
    #[arg(
        id = "unknown-age-is-minor",
        long = "unknown-age-is-minor",
        env = "COMPANION_UNKNOWN_AGE_IS_MINOR",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub unknown_age_is_minor: bool,
    /// Start of a minor's quiet hours, local time (no follow-up or reminder goes out in them).
    #[arg(
        id = "minor-quiet-start",
        long = "minor-quiet-start",
        env = "COMPANION_MINOR_QUIET_START",
        default_value = "22:00"
    )]
    pub minor_quiet_start: chrono::NaiveTime,
    /// End of a minor's quiet hours, local time.
    #[arg(
        id = "minor-quiet-end",
        long = "minor-quiet-end",
        env = "COMPANION_MINOR_QUIET_END",
        default_value = "07:00"
    )]
    pub minor_quiet_end: chrono::NaiveTime,
    /// The one line a user under 13 gets (at most once a day): companions do not chat with them.
    #[arg(
        id = "under-13-line",
        long = "under-13-line",
        env = "COMPANION_UNDER_13_LINE",
        default_value = "hey! TrickBook's AI companions are only for riders 13 and up, so i can't chat with you here. your tricklists, spots and the rest of the app are all yours though!"
    )]
    pub under_13_line: String,
    /// The learned layer of the crisis screen and the output check (docs/safety.md); off: the rules
    /// (and the moderation endpoint, when set) alone.
    #[arg(
        id = "screen-learned",
        long = "screen-learned",
        env = "COMPANION_SCREEN_LEARNED",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub screen_learned: bool,
    /// Base URL of an OpenAI-compatible moderation API (`/moderations` is appended), e.g.
    /// `https://api.openai.com/v1`. Set, every user message's text is also sent there (docs/safety.md);
    /// empty: the local layers alone.
    #[arg(
        id = "moderation-url",
        long = "moderation-url",
        env = "COMPANION_MODERATION_URL",
        default_value = ""
    )]
    pub moderation_url: String,
    /// Key for the moderation API.
    #[arg(
        id = "moderation-api-key",
        long = "moderation-api-key",
        env = "COMPANION_MODERATION_API_KEY",
        default_value = "",
        hide_env_values = true,
        hide_default_value = true
    )]
    #[cfg_attr(feature = "testing", serde(serialize_with = "exposed"))]
    pub moderation_api_key: Secret,
    /// The moderation model.
    #[arg(
        id = "moderation-model",
        long = "moderation-model",
        env = "COMPANION_MODERATION_MODEL",
        default_value = "omni-moderation-latest"
    )]
    pub moderation_model: String,
    /// How long admission waits for the moderation API before deciding on the local layers alone, ms.
    #[arg(
        id = "moderation-timeout-ms",
        long = "moderation-timeout-ms",
        env = "COMPANION_MODERATION_TIMEOUT_MS",
        default_value_t = 1500
    )]
    pub moderation_timeout_ms: u64,
}

/// What one turn takes in and gives out.
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "Turns")]
pub struct TurnConfig {
    /// Largest accepted event payload in bytes; larger events are dead-lettered unread.
    #[arg(id = "max-event-bytes",
        long = "max-event-bytes", env = "COMPANION_MAX_EVENT_BYTES", default_value_t = 64 * 1024)]
    pub max_event_bytes: usize,
    /// Largest accepted message text in characters.
    #[arg(
        id = "max-content-chars",
        long = "max-content-chars",
        env = "COMPANION_MAX_CONTENT_CHARS",
        default_value_t = 4000
    )]
    pub max_content_chars: usize,
    /// History messages (this user with this bot) sent to the model at most; memory's summary covers
    /// what has left them.
    #[arg(
        id = "history-limit",
        long = "history-limit",
        env = "COMPANION_HISTORY_LIMIT",
        default_value_t = 18
    )]
    pub history_limit: i64,
    /// Rounds of tool calls one turn may make before the model must answer in text.
    #[arg(
        id = "max-tool-rounds",
        long = "max-tool-rounds",
        env = "COMPANION_MAX_TOOL_ROUNDS",
        default_value_t = 3
    )]
    pub max_tool_rounds: u32,
    /// Largest tool result sent back to the model, bytes; a longer one is cut and marked as cut.
    #[arg(
        id = "max-tool-result-bytes",
        long = "max-tool-result-bytes",
        env = "COMPANION_MAX_TOOL_RESULT_BYTES",
        default_value_t = 16 * 1024
    )]
    pub max_tool_result_bytes: usize,
    /// Things (tricklists, spot drafts) tools may create per user per rolling hour, across all workers.
    #[arg(
        id = "writes-per-hour",
        long = "writes-per-hour",
        env = "COMPANION_WRITES_PER_HOUR",
        default_value_t = 5
    )]
    pub writes_per_hour: u32,
    /// Longest reply stored and published, in characters (longer model text is cut with `…`).
    #[arg(
        id = "max-reply-chars",
        long = "max-reply-chars",
        env = "COMPANION_MAX_REPLY_CHARS",
        default_value_t = 4000
    )]
    pub max_reply_chars: usize,
    /// Later messages of a burst one turn may answer together (0: one reply per message).
    #[arg(
        id = "burst-max",
        long = "burst-max",
        env = "COMPANION_BURST_MAX",
        default_value_t = 8
    )]
    pub burst_max: usize,
    /// Turns per user per minute before the busy line answers instead of the model (0: no limit).
    #[arg(
        id = "user-turns-per-minute",
        long = "user-turns-per-minute",
        env = "COMPANION_USER_TURNS_PER_MINUTE",
        default_value_t = 10
    )]
    pub user_turns_per_minute: u32,
    /// Longest one attempt at a turn may take, seconds, whatever it waits on (a server that accepted a
    /// request and never answers included); past it the attempt fails as transient and is retried.
    #[arg(
        id = "turn-timeout-secs",
        long = "turn-timeout-secs",
        env = "COMPANION_TURN_TIMEOUT_SECS",
        default_value_t = 300
    )]
    pub turn_timeout_secs: u64,
    /// Shortest time ahead a reminder may be set for, seconds (tests and the demo use a few).
    #[arg(
        id = "reminder-min-lead-secs",
        long = "reminder-min-lead-secs",
        env = "COMPANION_REMINDER_MIN_LEAD_SECS",
        default_value_t = 60
    )]
    pub reminder_min_lead_secs: u64,
    /// Requests one turn may send to the chat API, retries and fallback models included (answers replayed
    /// from the journal are free); the last one goes without tools so the turn still ends with text.
    #[arg(
        id = "max-llm-calls-per-turn",
        long = "max-llm-calls-per-turn",
        env = "COMPANION_MAX_LLM_CALLS_PER_TURN",
        default_value_t = 8
    )]
    pub max_llm_calls_per_turn: u32,
}

/// The spend budgets: what one turn, one user and the whole service may spend on the model, and the cheaper model past a budget.
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "Spend budgets")]
pub struct SpendConfig {
    /// Estimated prompt tokens one attempt at a turn may send in all (a quarter of the requests' bytes).
    #[arg(
        id = "max-prompt-tokens-per-turn",
        long = "max-prompt-tokens-per-turn",
        env = "COMPANION_MAX_PROMPT_TOKENS_PER_TURN",
        default_value_t = 64_000
    )]
    pub max_prompt_tokens_per_turn: u64,
    /// Tokens (prompt + completion) one user's turns and follow-ups may use per budget window, across
    /// all companions and workers (0: no token budget).
    #[arg(
        id = "user-daily-tokens",
        long = "user-daily-tokens",
        env = "COMPANION_USER_DAILY_TOKENS",
        default_value_t = 1_000_000
    )]
    pub user_daily_tokens: u64,
    /// USD one user's model calls may cost per budget window (reported or estimated; 0: no USD budget).
    #[arg(
        id = "user-daily-usd",
        long = "user-daily-usd",
        env = "COMPANION_USER_DAILY_USD",
        default_value_t = 0.20
    )]
    pub user_daily_usd: f64,
    /// Tokens the whole service may use per budget window (0: no service token cap).
    #[arg(
        id = "service-daily-tokens",
        long = "service-daily-tokens",
        env = "COMPANION_SERVICE_DAILY_TOKENS",
        default_value_t = 0
    )]
    pub service_daily_tokens: u64,
    /// USD the whole service may spend on the chat model per budget window (0: no service cap).
    #[arg(
        id = "service-daily-usd",
        long = "service-daily-usd",
        env = "COMPANION_SERVICE_DAILY_USD",
        default_value_t = 50.0
    )]
    pub service_daily_usd: f64,
    /// The rolling window the budgets count over, seconds (a day; tests use seconds).
    #[arg(
        id = "budget-window-secs",
        long = "budget-window-secs",
        env = "COMPANION_BUDGET_WINDOW_SECS",
        default_value_t = 86_400
    )]
    pub budget_window_secs: u64,
    /// Share of a budget after which calls go to the cheaper model (`COMPANION_BUDGET_MODEL`).
    #[arg(
        id = "budget-cheaper-at",
        long = "budget-cheaper-at",
        env = "COMPANION_BUDGET_CHEAPER_AT",
        default_value_t = 0.8
    )]
    pub budget_cheaper_at: f64,
    /// The cheaper model used near a budget (empty: the usual model until the budget is reached).
    #[arg(
        id = "budget-model",
        long = "budget-model",
        env = "COMPANION_BUDGET_MODEL",
        default_value = "google/gemini-2.0-flash-lite-001"
    )]
    pub budget_model: String,
    /// How old the service-wide spend figure a worker checks against may be, seconds (one aggregate
    /// query over the window per refresh; 0: every call).
    #[arg(
        id = "service-spend-refresh-secs",
        long = "service-spend-refresh-secs",
        env = "COMPANION_SERVICE_SPEND_REFRESH_SECS",
        default_value_t = 15
    )]
    pub service_spend_refresh_secs: u64,
}

/// Who answers in a group chat, and how far companions may talk among themselves.
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "Group chats")]
pub struct GroupConfig {
    /// Hand-overs (one companion tagging another) after the first answer to one group message.
    #[arg(
        id = "group-max-handovers",
        long = "group-max-handovers",
        env = "COMPANION_GROUP_MAX_HANDOVERS",
        default_value_t = 2
    )]
    pub max_handovers: u32,
    /// Companion messages in all for one group message (mentions and hand-overs together).
    #[arg(
        id = "group-max-messages",
        long = "group-max-messages",
        env = "COMPANION_GROUP_MAX_MESSAGES",
        default_value_t = 3
    )]
    pub max_messages: u32,
    /// How much better (cosine) another companion must fit a group message than the last speaker to
    /// take the floor from it.
    #[arg(
        id = "group-fit-margin",
        long = "group-fit-margin",
        env = "COMPANION_GROUP_FIT_MARGIN",
        default_value_t = 0.05
    )]
    pub fit_margin: f32,
}

/// Guided flows: how long a user's place in a flow is kept.
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "Guided flows")]
pub struct FlowConfig {
    /// Days a guided flow may sit untouched before it expires quietly.
    #[arg(
        id = "flow-idle-days",
        long = "flow-idle-days",
        env = "COMPANION_FLOW_IDLE_DAYS",
        default_value_t = 30
    )]
    pub idle_days: u32,
}

/// Follow-ups no user message triggered (spot reviews, reminders).
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "Follow-ups")]
pub struct FollowUpConfig {
    /// Proactive messages (follow-ups no user message triggered) one user gets per rolling day, across
    /// all companions and workers; the rest are dropped and counted.
    #[arg(
        id = "proactive-daily-cap",
        long = "proactive-daily-cap",
        env = "COMPANION_PROACTIVE_DAILY_CAP",
        default_value_t = 5
    )]
    pub daily_cap: u32,
}

/// One worker process: how much it runs at once, how it retries and stops, where it serves `/metrics`.
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "Worker")]
pub struct WorkerConfig {
    /// Turns processed at once by one worker process.
    #[arg(
        id = "concurrency",
        long = "concurrency",
        env = "COMPANION_CONCURRENCY",
        default_value_t = 64
    )]
    pub concurrency: usize,
    /// Signals (spot reviews, due reminders) handled at once by one worker process.
    #[arg(
        id = "signal-concurrency",
        long = "signal-concurrency",
        env = "COMPANION_SIGNAL_CONCURRENCY",
        default_value_t = 8
    )]
    pub signal_concurrency: usize,
    /// Base delay of the NAK backoff for transient failures, seconds (doubled per delivery, capped at 60).
    #[arg(
        id = "retry-delay-secs",
        long = "retry-delay-secs",
        env = "COMPANION_RETRY_DELAY_SECS",
        default_value_t = 2
    )]
    pub retry_delay_secs: u64,
    /// Seconds in-flight turns get to finish after SIGTERM/SIGINT before they are NAKed.
    #[arg(
        id = "shutdown-grace-secs",
        long = "shutdown-grace-secs",
        env = "COMPANION_SHUTDOWN_GRACE_SECS",
        default_value_t = 20
    )]
    pub shutdown_grace_secs: u64,
    /// Longest a message waits for an earlier message of its conversation before going ahead anyway.
    #[arg(
        id = "order-max-wait-secs",
        long = "order-max-wait-secs",
        env = "COMPANION_ORDER_MAX_WAIT_SECS",
        default_value_t = 600
    )]
    pub order_max_wait_secs: u64,
    /// Longest an outage of PostgreSQL, MongoDB or NATS is waited out, seconds: meanwhile the worker
    /// pulls nothing new and keeps the messages it holds; past it, each gets the failure line and a dead
    /// letter (`companion replay --dlq` brings it back). A managed database's failover takes 30-120 s.
    #[arg(
        id = "outage-max-secs",
        long = "outage-max-secs",
        env = "COMPANION_OUTAGE_MAX_SECS",
        default_value_t = 900
    )]
    pub outage_max_secs: u64,
    /// Address of `/healthz`, `/readyz` and `/metrics` (empty: off). A port in use is logged, not fatal.
    #[arg(
        id = "http-addr",
        long = "http-addr",
        env = "COMPANION_HTTP_ADDR",
        default_value = "127.0.0.1:9090"
    )]
    pub http_addr: String,
    /// Threads of the async runtime (0 = the cores the embedding model's threads leave, at least one).
    /// The model runs on threads of its own: on 2 cores, one runtime thread cost 3–11 % less worker CPU a
    /// turn than Tokio's default of two in three runs (docs/benchmark.md, 30 November).
    #[arg(
        id = "runtime-threads",
        long = "runtime-threads",
        env = "COMPANION_RUNTIME_THREADS",
        default_value_t = 0
    )]
    pub runtime_threads: usize,
}

impl WorkerConfig {
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }
    pub fn order_max_wait(&self) -> Duration {
        Duration::from_secs(self.order_max_wait_secs)
    }
    pub fn outage_max(&self) -> Duration {
        Duration::from_secs(self.outage_max_secs)
    }
}

/// The sentence-embedding model (knowledge retrieval and ingest).
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "Embedding model")]
pub struct EmbedSettings {
    /// Folder holding the embedding model (`model.onnx`, `tokenizer.json`); `deploy/local/models.sh` fills it.
    #[arg(
        id = "model-dir",
        long = "model-dir",
        env = "COMPANION_MODEL_DIR",
        default_value = ".local/models"
    )]
    pub model_dir: PathBuf,
    /// The encoder every vector comes from (the crisis screen's, retrieval's, memory's):
    /// `multilingual-e5-small` or `all-MiniLM-L6-v2`. Its name is stored beside each vector; after a
    /// change, `companion ingest --reembed` moves the stored ones over (docs/knowledge.md).
    #[arg(
        id = "encoder",
        long = "encoder",
        env = "COMPANION_ENCODER",
        default_value = "multilingual-e5-small",
        value_parser = ["all-MiniLM-L6-v2", "multilingual-e5-small"]
    )]
    pub encoder: String,
    /// The encoder's graph in that folder; empty: its int8 graph (`model-int8.onnx`,
    /// `e5-small-int8.onnx`: ~2-3x cheaper, cosine >= 0.995 to fp32), else e.g. its fp32 graph
    /// (`model.onnx`, `e5-small.onnx`). Queries and stored vectors may come from either.
    #[arg(
        id = "embed-model",
        long = "embed-model",
        env = "COMPANION_EMBED_MODEL",
        default_value = ""
    )]
    pub model_file: String,
    /// ONNX Runtime shared library (must be 1.31.x); loaded at start-up, never downloaded.
    #[arg(
        id = "ort-dylib-path",
        long = "ort-dylib-path",
        env = "ORT_DYLIB_PATH",
        default_value = ".local/models/libonnxruntime.so.1.31.1"
    )]
    pub ort_dylib_path: PathBuf,
    /// Intra-op threads of the embedding model (0 = one per core). One costs the least CPU per sentence
    /// (no hand-offs between threads); more lowers the latency of long texts.
    #[arg(
        id = "embed-threads",
        long = "embed-threads",
        env = "COMPANION_EMBED_THREADS",
        default_value_t = 1
    )]
    pub threads: usize,
    /// Most texts in one model run; concurrent turns' texts are batched up to this. A run's buffers grow
    /// with the batch and the allocator keeps them: after a burst the worker held ~4 MB more with 8 than
    /// with 4, ~10 more with 32 than with 8. Per CPU-second, 8 embeds 5–17 % more short texts than 4
    /// and 14–15 % fewer long ones (docs/bench/history.md).
    #[arg(
        id = "embed-max-batch",
        long = "embed-max-batch",
        env = "COMPANION_EMBED_MAX_BATCH",
        default_value_t = 4
    )]
    pub max_batch: usize,
    /// Milliseconds the embedder waits for more texts after the first before running the model; 0 runs at
    /// once, and texts that arrive while the model runs go together into the next run.
    #[arg(
        id = "embed-window-ms",
        long = "embed-window-ms",
        env = "COMPANION_EMBED_WINDOW_MS",
        default_value_t = 0
    )]
    pub window_ms: u64,
}

/// Knowledge retrieval and chunking.
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "Knowledge")]
pub struct RagConfig {
    /// Lowest cosine similarity for a knowledge chunk to enter the prompt; unset: the encoder's own
    /// (e5 0.80, MiniLM 0.45: docs/knowledge.md, "Thresholds").
    #[arg(
        id = "rag-threshold",
        long = "rag-threshold",
        env = "COMPANION_RAG_THRESHOLD"
    )]
    pub threshold: Option<f32>,
    /// Knowledge chunks put in the prompt at most.
    #[arg(
        id = "rag-top-k",
        long = "rag-top-k",
        env = "COMPANION_RAG_TOP_K",
        default_value_t = 3
    )]
    pub top_k: i64,
    /// Query vectors kept for texts seen lately (lower-cased, whitespace collapsed); 0 turns the cache
    /// off. Each costs about 1.6 kB.
    #[arg(
        id = "rag-query-cache",
        long = "rag-query-cache",
        env = "COMPANION_RAG_QUERY_CACHE",
        default_value_t = 1024
    )]
    pub query_cache: usize,
    /// Skip the knowledge lookup for messages without a content word ("ok thanks!", "lol 😂").
    #[arg(
        id = "rag-skip-contentless",
        long = "rag-skip-contentless",
        env = "COMPANION_RAG_SKIP_CONTENTLESS",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub skip_contentless: bool,
    /// Longest chunk in tokens, `[CLS]` and `[SEP]` included (the model reads 256 at most).
    #[arg(
        id = "chunk-tokens",
        long = "chunk-tokens",
        env = "COMPANION_CHUNK_TOKENS",
        default_value_t = 256
    )]
    pub chunk_tokens: usize,
    /// Share of a chunk repeated at the start of the next one.
    #[arg(
        id = "chunk-overlap",
        long = "chunk-overlap",
        env = "COMPANION_CHUNK_OVERLAP",
        default_value_t = 0.15
    )]
    pub chunk_overlap: f32,
}

/// Long-term memory (docs/memory.md): facts a companion keeps about its user, the rolling summary.
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "Memory")]
pub struct MemoryConfig {
    /// Keep long-term memory (facts, summaries, `remember`/`forget`); false: none is kept or recalled.
    #[arg(id = "memory", long = "memory", env = "COMPANION_MEMORY", default_value_t = true, action = clap::ArgAction::Set)]
    pub enabled: bool,
    /// Extraction runs after this many new user messages of a DM...
    #[arg(
        id = "memory-extract-after",
        long = "memory-extract-after",
        env = "COMPANION_MEMORY_EXTRACT_AFTER",
        default_value_t = 10
    )]
    pub extract_after: i64,
    /// ...or once the DM has been quiet this many seconds, whichever comes first.
    #[arg(
        id = "memory-quiet-secs",
        long = "memory-quiet-secs",
        env = "COMPANION_MEMORY_QUIET_SECS",
        default_value_t = 600
    )]
    pub quiet_secs: u64,
    /// User messages one extraction reads at most (the rest go to the next run).
    #[arg(
        id = "memory-batch-max",
        long = "memory-batch-max",
        env = "COMPANION_MEMORY_BATCH_MAX",
        default_value_t = 40
    )]
    pub batch_max: i64,
    /// The model extraction and summaries use (empty: `COMPANION_BUDGET_MODEL`, else the usual model).
    #[arg(
        id = "memory-model",
        long = "memory-model",
        env = "COMPANION_MEMORY_MODEL",
        default_value = ""
    )]
    pub model: String,
    /// Facts nearest the message recalled into the prompt, besides the pinned ones.
    #[arg(
        id = "memory-top-k",
        long = "memory-top-k",
        env = "COMPANION_MEMORY_TOP_K",
        default_value_t = 4
    )]
    pub top_k: i64,
    /// Lowest cosine similarity of a fact to the message for it to be recalled (pinned ones always are);
    /// unset: the encoder's own (e5 0.77, MiniLM 0.3: docs/knowledge.md, "Thresholds").
    #[arg(
        id = "memory-threshold",
        long = "memory-threshold",
        env = "COMPANION_MEMORY_THRESHOLD"
    )]
    pub threshold: Option<f32>,
    /// `remember` calls a user may make per rolling 24 hours (apart from the hourly write quota).
    #[arg(
        id = "memory-remember-per-day",
        long = "memory-remember-per-day",
        env = "COMPANION_MEMORY_REMEMBER_PER_DAY",
        default_value_t = 50
    )]
    pub remember_per_day: u32,
    /// Facts kept per user and companion at most: past it, the oldest extracted ones go first.
    #[arg(
        id = "memory-max-facts",
        long = "memory-max-facts",
        env = "COMPANION_MEMORY_MAX_FACTS",
        default_value_t = 200
    )]
    pub max_facts: i64,
    /// The summary is rewritten once this many messages have left the history window since it was.
    #[arg(
        id = "memory-summary-after",
        long = "memory-summary-after",
        env = "COMPANION_MEMORY_SUMMARY_AFTER",
        default_value_t = 20
    )]
    pub summary_after: i64,
}

/// Logs and exported spans; flags of every subcommand.
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
#[command(next_help_heading = "Logging")]
pub struct LogConfig {
    /// `text` for terminals, `json` for log shippers.
    #[arg(
        id = "log-format",
        long = "log-format",
        env = "LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub format: LogFormat,
    /// OTLP/HTTP collector (e.g. `http://otel-collector:4318`) that receives the turn spans; empty = no
    /// export. Only in builds with the `otel` feature; others log a warning and ignore it.
    #[arg(
        id = "otel-endpoint",
        long = "otel-endpoint",
        env = "OTEL_EXPORTER_OTLP_ENDPOINT",
        default_value = "",
        global = true
    )]
    pub otel_endpoint: String,
    /// `service.name` of the exported spans.
    #[arg(
        id = "otel-service-name",
        long = "otel-service-name",
        env = "OTEL_SERVICE_NAME",
        default_value = "companion",
        global = true
    )]
    pub otel_service_name: String,
    /// Put the model calls' messages on the exported spans (`gen_ai.input.messages`,
    /// `gen_ai.output.messages`). For staging only: what was exported is beyond a later deletion's
    /// reach. Never for a minor, a crisis-flagged conversation or a message answered with the safety
    /// brief (docs/operations.md, "Traces").
    #[arg(
        id = "trace-content",
        long = "trace-content",
        env = "COMPANION_TRACE_CONTENT",
        default_value_t = false,
        action = clap::ArgAction::Set,
        global = true
    )]
    pub trace_content: bool,
}

/// Every section: what a worker uses (and what the bench and the tests hand to worker processes).
#[derive(Args, Clone, Debug)]
#[cfg_attr(feature = "testing", derive(serde::Serialize))]
pub struct Config {
    #[command(flatten)]
    pub nats: NatsConfig,
    #[command(flatten)]
    pub consumer: ConsumerConfig,
    #[command(flatten)]
    pub mongo: MongoConfig,
    #[command(flatten)]
    pub pg: PgConfig,
    #[command(flatten)]
    pub llm: LlmConfig,
    #[command(flatten)]
    pub characters: CharactersConfig,
    #[command(flatten)]
    pub turn: TurnConfig,
    #[command(flatten)]
    pub spend: SpendConfig,
    #[command(flatten)]
    pub group: GroupConfig,
    #[command(flatten)]
    pub flow: FlowConfig,
    #[command(flatten)]
    pub follow_ups: FollowUpConfig,
    #[command(flatten)]
    pub safety: SafetyConfig,
    #[command(flatten)]
    pub prompt: PromptConfig,
    #[command(flatten)]
    pub worker: WorkerConfig,
    #[command(flatten)]
    pub embed: EmbedSettings,
    #[command(flatten)]
    pub rag: RagConfig,
    #[command(flatten)]
    pub memory: MemoryConfig,
    /// Parsed once for every subcommand (global flags); carried here for child processes.
    #[arg(skip)]
    #[cfg_attr(feature = "testing", serde(skip))]
    pub log: LogConfig,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            otel_endpoint: String::new(),
            otel_service_name: "companion".into(),
            trace_content: false,
        }
    }
}

/// Parses one section (or all of them) from the environment alone, as a command without flags would.
pub fn from_env<T: Args>() -> Result<T, clap::Error> {
    #[derive(clap::Parser)]
    struct Wrapper<T: Args> {
        #[command(flatten)]
        inner: T,
    }
    <Wrapper<T> as clap::Parser>::try_parse_from(["companion"]).map(|w| w.inner)
}

impl Config {
    /// Threads the worker's async runtime gets: `--runtime-threads`, else the cores (as the process
    /// may use them, cgroup quota included) less the embedding model's threads, at least one. With
    /// `--embed-threads 0` the model takes every core only while it runs: the runtime gets one per core.
    pub fn runtime_threads(&self) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        runtime_threads(self.worker.runtime_threads, self.embed.threads, cores)
    }

    /// Configuration from the environment only (for tests and tools that have no CLI).
    #[cfg(feature = "testing")]
    pub fn from_env() -> Result<Self, clap::Error> {
        let mut config: Self = from_env()?;
        config.log = from_env()?;
        Ok(config)
    }
}

fn runtime_threads(configured: usize, model: usize, cores: usize) -> usize {
    match (configured, model) {
        (0, 0) => cores,
        (0, model) => cores.saturating_sub(model).max(1),
        (configured, _) => configured,
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
    fn the_runtime_gets_the_cores_the_model_leaves() {
        assert_eq!(runtime_threads(0, 1, 2), 1);
        assert_eq!(runtime_threads(0, 2, 8), 6);
        assert_eq!(runtime_threads(0, 4, 2), 1, "never none");
        assert_eq!(
            runtime_threads(0, 0, 4),
            4,
            "a model on every core leaves them all"
        );
        assert_eq!(runtime_threads(3, 1, 2), 3, "a setting wins");
    }

    #[test]
    fn secrets_and_passwords_are_redacted() {
        assert_eq!(
            format!("{:?}", Secret::from("sk-or-v1-abc")),
            "SecretBox<str>([REDACTED])"
        );
        // A key given as a flag reaches the client whole and never the section's Debug.
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            llm: LlmConfig,
        }
        let args = ["companion", "--openrouter-api-key", "sk-or-v1-abc"];
        let llm = <Flags as clap::Parser>::try_parse_from(args).unwrap().llm;
        assert_eq!(llm.api_key.expose_secret(), "sk-or-v1-abc");
        assert!(!format!("{llm:?}").contains("sk-or-v1-abc"));
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
