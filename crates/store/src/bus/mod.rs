//! NATS JetStream: subjects, streams and the shared durable consumers, and the publishes a turn makes.
//!
//! Two inbound streams: `<S>_IN` holds the DMs users send to companions (`<prefix>.in.<botId>.<conv>`)
//! and their messages to group conversations (`<prefix>.group.<conv>`); `<S>_SIGNAL` holds the signals
//! a companion acts on by itself (a spot draft's review on `<prefix>.signal.spot_draft.<draftId>`) and,
//! later, the schedules that fire them (`allow_msg_schedules`, nats-server 2.12 or newer).
//!
//! Streams and the consumer are created when missing. Their settings change only through `companion
//! provision` ([`Bus::provision`]): a worker that finds a consumer set up differently from its own
//! configuration logs each difference and goes by the consumer's (its `max_deliver` decides which
//! delivery is the last, its `ack_wait` how often progress is sent).

mod connect;
mod erase;
pub mod event;
mod lookup;

use std::time::Duration;

use async_nats::{
    HeaderMap,
    jetstream::{
        self,
        consumer::{AckPolicy, DeliverPolicy, pull},
        message::PublishMessage,
        stream::{self, DiscardPolicy, RetentionPolicy, StorageType},
    },
};
use bytes::Bytes;
use serde::Serialize;

use crate::{
    config::{ConsumerConfig, ExposeSecret, NatsConfig},
    failure::{Class, Classify},
};

pub use {
    connect::ConnectCause,
    erase::Eraser,
    event::{Completion, DmEvent, GroupEvent, Inbound, Trigger, Typing},
    lookup::Lookup,
};
// A message's dead letter as the tests and the dev tooling read it back.
#[cfg(feature = "testing")]
pub use lookup::DeadLetter;

/// How many connect attempts were made, as the tail of an error: nothing for one, ` (N attempts)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempts(pub u32);

impl std::fmt::Display for Attempts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            0 | 1 => Ok(()),
            n => write!(f, " ({n} attempts)"),
        }
    }
}

/// Header carrying the dead-letter reason.
pub const DLQ_REASON: &str = "Companion-Dlq-Reason";
/// Header carrying the subject the dead-lettered event arrived on.
pub const DLQ_SUBJECT: &str = "Companion-Original-Subject";
/// Header carrying the stream sequence of the dead-lettered event.
pub const DLQ_SEQUENCE: &str = "Companion-Original-Sequence";
/// Header carrying how many times the event was delivered.
pub(crate) const DLQ_DELIVERIES: &str = "Companion-Deliveries";

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// The server did not answer (or refused us) within the connect window.
    #[error("cannot connect to NATS at {url}: {cause}{attempts}")]
    Connect {
        /// The URL without credentials.
        url: String,
        /// What was wrong at the last attempt.
        cause: ConnectCause,
        /// How many attempts were made.
        attempts: Attempts,
    },
    #[error("JetStream stream setup failed: {0}")]
    Stream(#[from] jetstream::context::CreateStreamError),
    #[error("JetStream consumer setup failed: {0}")]
    Consumer(#[from] jetstream::stream::ConsumerError),
    #[error("JetStream consumer update failed: {0}")]
    ConsumerUpdate(#[from] jetstream::stream::ConsumerUpdateError),
    #[error("JetStream publish failed: {0}")]
    Publish(#[from] jetstream::context::PublishError),
    #[error("NATS publish failed: {0}")]
    CorePublish(#[from] async_nats::PublishError),
    #[error("cannot pull messages: {0}")]
    Pull(#[from] jetstream::consumer::StreamError),
    #[error("encoding an event: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("JetStream stream {0} is not there: {1}")]
    NoStream(String, String),
    #[error("JetStream consumer info: {0}")]
    ConsumerInfo(String),
    #[error(
        "nats-server {0} is too old: companion needs 2.12 or newer (JetStream message schedules)"
    )]
    OldServer(String),
    /// A stream operation other than the above failed (purging, deleting, reading a stored message).
    #[error("JetStream: {0}")]
    Other(String),
}

/// The oldest nats-server with everything the streams use.
const MIN_SERVER: (u64, u64) = (2, 12);

/// `major.minor[.patch…]` at least `min`.
fn version_at_least(version: &str, min: (u64, u64)) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (major, minor) >= min
}

impl Classify for BusError {
    fn class(&self) -> Class {
        match self {
            Self::Encode(_) | Self::OldServer(_) => Class::Permanent,
            _ => Class::Transient,
        }
    }
}

/// Subject and stream names, all derived from two configurable prefixes.
#[derive(Clone, Debug)]
pub struct Names {
    pub prefix: String,
    pub stream_in: String,
    pub stream_out: String,
    pub stream_dlq: String,
    pub stream_signal: String,
    /// Crisis alerts for moderators (30 days).
    pub stream_alert: String,
    /// The server's notices of events whose deliveries ran out, kept until a worker settles each.
    pub stream_exhausted: String,
}

impl Names {
    pub(crate) fn new(config: &NatsConfig) -> Self {
        let s = &config.stream_prefix;
        Self {
            prefix: config.subject_prefix.clone(),
            stream_in: format!("{s}_IN"),
            stream_out: format!("{s}_OUT"),
            stream_dlq: format!("{s}_DLQ"),
            stream_signal: format!("{s}_SIGNAL"),
            stream_alert: format!("{s}_ALERT"),
            stream_exhausted: format!("{s}_EXHAUSTED"),
        }
    }
    /// Every signal a companion acts on by itself.
    pub(crate) fn signal_all(&self) -> String {
        format!("{}.signal.>", self.prefix)
    }
    /// The review of a spot draft, published by TB-Backend.
    #[cfg(any(test, feature = "testing"))]
    pub fn spot_review(&self, draft_id: &str) -> String {
        format!("{}.signal.spot_draft.{draft_id}", self.prefix)
    }
    /// A due reminder, fired by its schedule.
    pub fn reminder_due(&self, id: &str) -> String {
        format!("{}.signal.reminder.{id}", self.prefix)
    }
    /// A moderator's pause or resume of a conversation, published by TB-Backend's admin tool.
    #[cfg(any(test, feature = "testing"))]
    pub fn takeover(&self, conversation_id: &str) -> String {
        format!("{}.signal.takeover.{conversation_id}", self.prefix)
    }
    /// A crisis alert for moderators (no message text), kept in the alert stream.
    pub fn crisis_alert(&self, conversation_id: &str) -> String {
        format!("{}.alert.crisis.{conversation_id}", self.prefix)
    }
    /// The memory extraction of a user's DM with a companion (see `memory::extract`).
    pub fn memory(&self, user_id: &str, bot_id: &str) -> String {
        format!("{}.signal.memory.{user_id}.{bot_id}", self.prefix)
    }
    /// The quiet-period timer of that extraction: each turn's schedule replaces the one before.
    pub fn memory_schedule(&self, user_id: &str, bot_id: &str) -> String {
        format!("{}.schedule.memory.{user_id}.{bot_id}", self.prefix)
    }
    /// A reminder's schedule (the timer NATS keeps).
    pub fn reminder_schedule(&self, id: &str) -> String {
        format!("{}.schedule.reminder.{id}", self.prefix)
    }
    /// `(kind, id)` of a signal subject (`<prefix>.signal.<kind>.<id>`); none for any other subject.
    pub fn signal_parts<'s>(&self, subject: &'s str) -> Option<(&'s str, &'s str)> {
        subject
            .strip_prefix(&self.prefix)?
            .strip_prefix(".signal.")?
            .split_once('.')
    }
    /// Whether `subject` is a signal's (kept in the signal stream, not in a conversation's order).
    pub fn is_signal(&self, subject: &str) -> bool {
        subject
            .strip_prefix(&self.prefix)
            .is_some_and(|t| t.starts_with(".signal."))
    }
    /// The stream an inbound subject belongs to.
    pub(crate) fn stream_of(&self, subject: &str) -> &str {
        if self.is_signal(subject) {
            &self.stream_signal
        } else {
            &self.stream_in
        }
    }
    pub fn inbound(&self, bot_id: &str, conversation_id: &str) -> String {
        format!("{}.in.{bot_id}.{conversation_id}", self.prefix)
    }
    pub(crate) fn inbound_all(&self) -> String {
        format!("{}.in.>", self.prefix)
    }
    /// A user's message to a group conversation (published once, whoever answers it).
    pub fn group(&self, conversation_id: &str) -> String {
        format!("{}.group.{conversation_id}", self.prefix)
    }
    /// Whether `subject` is a group conversation's.
    pub(crate) fn is_group(&self, subject: &str) -> bool {
        subject
            .strip_prefix(&self.prefix)
            .is_some_and(|t| t.starts_with(".group."))
    }
    /// The subjects of the inbound stream and its consumer: DMs and group messages.
    pub(crate) fn inbound_subjects(&self) -> Vec<String> {
        vec![self.inbound_all(), format!("{}.group.>", self.prefix)]
    }
    pub fn outbound(&self, conversation_id: &str) -> String {
        format!("{}.out.{conversation_id}", self.prefix)
    }
    pub fn typing(&self, conversation_id: &str) -> String {
        format!("{}.typing.{conversation_id}", self.prefix)
    }
    /// Dead letters keep the tail of the original subject: `<botId>.<conversationId>` for a DM,
    /// `group.<conversationId>` for a group message, `signal.<kind>.<id>` for a signal.
    pub(crate) fn dead_letter(&self, original_subject: &str) -> String {
        let tail = if self.is_signal(original_subject) || self.is_group(original_subject) {
            original_subject.strip_prefix(&format!("{}.", self.prefix))
        } else {
            original_subject.strip_prefix(&format!("{}.in.", self.prefix))
        }
        .filter(|t| !t.is_empty() && !t.ends_with('.'))
        .unwrap_or("unknown");
        format!("{}.dlq.{tail}", self.prefix)
    }
}

/// The three durable consumers a worker pulls from, each on a stream of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feed {
    /// Bot-bound DMs and group messages.
    Inbound,
    /// Signals companions act on by themselves (spot reviews, due reminders, memory).
    Signals,
    /// The server's notices of events whose deliveries ran out on either of the other two.
    Exhausted,
}

impl Feed {
    /// Every feed, as `companion provision` sets them up.
    pub const ALL: [Feed; 3] = [Feed::Inbound, Feed::Signals, Feed::Exhausted];
}

/// A connected bus: the client, its JetStream context and the names in use.
#[derive(Clone)]
pub struct Bus {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub names: Names,
    /// Replicas requested for every stream.
    pub(crate) replicas: usize,
}

/// The shared consumer with the settings the server has for it.
pub struct Consumer {
    pub consumer: jetstream::consumer::PullConsumer,
    /// Deliveries of one event before the server gives up on it.
    pub max_deliver: i64,
    /// How long the server waits for an ack or progress.
    pub ack_wait: Duration,
}

/// `setting: server value (consumer) → configured value`, for each setting that differs.
fn consumer_differences(have: &jetstream::consumer::Config, want: &pull::Config) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |name: &str, have: String, want: String| {
        if have != want {
            out.push(format!("{name}: {have} (consumer) vs {want} (configured)"));
        }
    };
    check(
        "max_deliver",
        have.max_deliver.to_string(),
        want.max_deliver.to_string(),
    );
    check(
        "ack_wait",
        format!("{:?}", have.ack_wait),
        format!("{:?}", want.ack_wait),
    );
    check(
        "max_ack_pending",
        have.max_ack_pending.to_string(),
        want.max_ack_pending.to_string(),
    );
    // One filter or several: the same list either way.
    let filters = |one: &str, many: &[String]| {
        let mut all: Vec<&str> = many.iter().map(String::as_str).collect();
        if !one.is_empty() {
            all.insert(0, one);
        }
        all.join(" ")
    };
    check(
        "filter_subjects",
        filters(&have.filter_subject, &have.filter_subjects),
        filters(&want.filter_subject, &want.filter_subjects),
    );
    out
}

impl Bus {
    /// Connects to the configured server(s). The first connection is tried for the connect window
    /// (`NATS_CONNECT_WINDOW_SECS`), an attempt every 2 s. The first failed attempt is logged with the
    /// URL (no credentials) and its cause in plain words ([`ConnectCause`]: nothing listening, not a
    /// NATS server, TLS expected, ...); later attempts are quiet unless the cause changes, and the final
    /// error carries the cause and the count of attempts. A server that refuses our credentials or an
    /// address that does not parse fails at once. Once connected, the client reconnects by itself
    /// whenever the connection drops.
    pub async fn connect(config: &NatsConfig) -> Result<Self, BusError> {
        let shown = crate::config::redact_url(&config.url);
        let failed = |cause: ConnectCause, attempts: u32| BusError::Connect {
            url: shown.clone(),
            cause,
            attempts: Attempts(attempts),
        };
        let servers: Vec<async_nats::ServerAddr> = config
            .url
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.parse())
            .collect::<Result<_, std::io::Error>>()
            .map_err(|e| failed(ConnectCause::BadAddress(e.to_string()), 0))?;
        if servers.is_empty() {
            return Err(failed(ConnectCause::NoAddress, 0));
        }
        let window = Duration::from_secs(config.connect_window_secs);
        let started = tokio::time::Instant::now();
        let mut attempt = 0u32;
        // The cause of the latest failures and how many attempts in a row it had.
        let mut last: Option<(ConnectCause, u32)> = None;
        let client = loop {
            attempt += 1;
            let mut options = async_nats::ConnectOptions::new()
                .name("companion")
                .connection_timeout(Duration::from_secs(5));
            if let Some(user) = &config.user {
                options = options
                    .user_and_password(user.clone(), config.password.expose_secret().to_owned());
            }
            options = tls_options(options, config);
            let cause = match connect::attempt(config, options, &servers).await {
                Ok(client) => break client,
                Err(cause) => cause,
            };
            let left = window.saturating_sub(started.elapsed());
            if cause.is_final() || left.is_zero() {
                return Err(failed(cause, attempt));
            }
            match &mut last {
                Some((same, n)) if *same == cause => *n += 1,
                Some((before, n)) => {
                    tracing::warn!(url = %shown, attempt, attempts_before = *n,
                        "NATS: now {cause} (before: {before}, {n} attempts); still trying");
                    last = Some((cause, 1));
                }
                None => {
                    tracing::warn!(url = %shown, window_secs = window.as_secs(),
                        "cannot connect to NATS at {shown}: {cause}; trying again every 2 s for up to \
                         {} s, logging only a change", left.as_secs());
                    last = Some((cause, 1));
                }
            }
            tokio::time::sleep(Duration::from_secs(2).min(left)).await;
        };
        if attempt > 1 {
            tracing::info!(url = %shown, attempt, "connected to NATS after {attempt} attempts");
        }
        let js = jetstream::new(client.clone());
        Ok(Self {
            client,
            js,
            names: Names::new(config),
            replicas: config.stream_replicas.max(1),
        })
    }

    /// The streams as this configuration wants them.
    fn stream_configs(&self) -> [stream::Config; 6] {
        let n = &self.names;
        let day = Duration::from_secs(24 * 3600);
        let two_hours = Duration::from_secs(2 * 3600);
        [
            stream::Config {
                retention: RetentionPolicy::Limits,
                duplicate_window: two_hours,
                discard: DiscardPolicy::Old,
                // The order gate and replay read messages by subject and sequence.
                allow_direct: true,
                ..self.stream_config(
                    &n.stream_in,
                    "Bot-bound DMs and group messages published by TB-Backend",
                    n.inbound_subjects(),
                    7 * day,
                )
            },
            stream::Config {
                duplicate_window: two_hours,
                // A retried publish looks its completion up first (`stored_completion`).
                allow_direct: true,
                ..self.stream_config(
                    &n.stream_out,
                    "Companion replies for TB-Backend to fan out",
                    vec![format!("{}.out.>", n.prefix)],
                    day,
                )
            },
            stream::Config {
                allow_direct: true,
                ..self.stream_config(
                    &n.stream_dlq,
                    "Events no worker could process, with the reason",
                    vec![format!("{}.dlq.>", n.prefix)],
                    30 * day,
                )
            },
            stream::Config {
                retention: RetentionPolicy::Limits,
                duplicate_window: two_hours,
                discard: DiscardPolicy::Old,
                allow_direct: true,
                allow_message_schedules: true,
                // Longer than the furthest schedule (30 days), so none expires before it fires.
                ..self.stream_config(
                    &n.stream_signal,
                    "Signals companions act on by themselves (spot reviews, due reminders)",
                    vec![n.signal_all(), format!("{}.schedule.>", n.prefix)],
                    35 * day,
                )
            },
            stream::Config {
                duplicate_window: two_hours,
                ..self.stream_config(
                    &n.stream_alert,
                    "Crisis alerts for moderators: ids and category, never the message text",
                    vec![format!("{}.alert.>", n.prefix)],
                    30 * day,
                )
            },
            // Whatever consumer of the two streams ran out: the worker's consumer filters its own.
            // Kept as long as the inbound stream keeps the event a notice is about.
            self.stream_config(
                &n.stream_exhausted,
                "The server's notices of events whose deliveries ran out, until a worker settles each",
                vec![
                    max_deliveries_advisory(&n.stream_in, "*"),
                    max_deliveries_advisory(&n.stream_signal, "*"),
                ],
                7 * day,
            ),
        ]
    }

    /// What every stream shares: file storage, the configured replicas, and its own name,
    /// description, subjects and age limit.
    fn stream_config(
        &self,
        name: &str,
        description: &str,
        subjects: Vec<String>,
        max_age: Duration,
    ) -> stream::Config {
        stream::Config {
            name: name.to_owned(),
            description: Some(description.to_owned()),
            subjects,
            storage: StorageType::File,
            max_age,
            num_replicas: self.replicas,
            ..Default::default()
        }
    }

    /// Fails clearly on a server without what the streams need (message schedules: 2.12).
    pub fn check_server(&self) -> Result<(), BusError> {
        let version = self.client.server_info().version;
        if version_at_least(&version, MIN_SERVER) {
            Ok(())
        } else {
            Err(BusError::OldServer(version))
        }
    }

    /// Creates the streams that are missing; existing ones are left as they are.
    pub async fn ensure_streams(&self) -> Result<(), BusError> {
        for config in self.stream_configs() {
            self.js.get_or_create_stream(config).await?;
        }
        Ok(())
    }

    /// `companion provision`: creates or updates the streams and the shared consumer to this
    /// configuration; returns one line per change.
    pub async fn provision(&self, consumer: &ConsumerConfig) -> Result<Vec<String>, BusError> {
        let mut changes = Vec::new();
        for config in self.stream_configs() {
            let existed = self.js.get_stream(&config.name).await.is_ok();
            let name = config.name.clone();
            self.js.create_or_update_stream(config).await?;
            changes.push(format!(
                "stream {name}: {}",
                if existed { "updated" } else { "created" }
            ));
        }
        for feed in Feed::ALL {
            let (stream, settings) = self.consumer_config(feed, consumer);
            changes.push(self.provision_consumer(stream, settings).await?);
        }
        Ok(changes)
    }

    async fn stream(&self, name: &str) -> Result<jetstream::stream::Stream, BusError> {
        self.js
            .get_stream(name)
            .await
            .map_err(|e| BusError::NoStream(name.to_owned(), e.to_string()))
    }

    /// Creates or updates the durable consumer `wanted` on `stream`; one line saying what changed.
    async fn provision_consumer(
        &self,
        stream: &str,
        wanted: pull::Config,
    ) -> Result<String, BusError> {
        let stream = self.stream(stream).await?;
        let name = wanted.durable_name.clone().unwrap_or_default();
        Ok(match stream.get_consumer::<pull::Config>(&name).await {
            Ok(mut existing) => {
                let info = existing
                    .info()
                    .await
                    .map_err(|e| BusError::ConsumerInfo(e.to_string()))?;
                let diff = consumer_differences(&info.config, &wanted);
                stream.update_consumer(wanted).await?;
                if diff.is_empty() {
                    format!("consumer {name}: unchanged")
                } else {
                    format!("consumer {name}: updated ({})", diff.join(", "))
                }
            }
            Err(_) => {
                stream.create_consumer(wanted).await?;
                format!("consumer {name}: created")
            }
        })
    }

    /// The durable consumer `wanted` on `stream`, created when missing. An existing one keeps its
    /// settings (only `companion provision` changes them); each difference is logged, and the settings
    /// returned are the consumer's.
    async fn open_consumer(
        &self,
        stream: &str,
        wanted: pull::Config,
    ) -> Result<Consumer, BusError> {
        let stream = self.stream(stream).await?;
        let name = wanted.durable_name.clone().unwrap_or_default();
        let mut consumer = match stream.get_consumer::<pull::Config>(&name).await {
            Ok(c) => c,
            Err(_) => stream.create_consumer(wanted.clone()).await?,
        };
        let info = consumer
            .info()
            .await
            .map_err(|e| BusError::ConsumerInfo(e.to_string()))?
            .clone();
        for d in consumer_differences(&info.config, &wanted) {
            tracing::warn!(
                consumer = %name,
                difference = %d,
                "the shared consumer is set up differently from this worker's configuration; going by \
                 the consumer's (run `companion provision` to apply this configuration)"
            );
        }
        Ok(Consumer {
            max_deliver: info.config.max_deliver,
            ack_wait: info.config.ack_wait,
            consumer,
        })
    }

    /// A feed's stream and its consumer's settings: the DM consumer's, under the feed's own name and
    /// filter; the notices of exhausted events with bounds of their own, so that tuning turns does not
    /// change how they are handled.
    fn consumer_config(&self, feed: Feed, c: &ConsumerConfig) -> (&str, pull::Config) {
        let n = &self.names;
        let dms = pull::Config {
            durable_name: Some(c.name.clone()),
            description: Some("companion workers".into()),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::Explicit,
            ack_wait: c.ack_wait(),
            max_deliver: c.max_deliver.max(1),
            max_ack_pending: c.max_ack_pending.max(1),
            filter_subjects: n.inbound_subjects(),
            ..Default::default()
        };
        match feed {
            Feed::Inbound => (&n.stream_in, dms),
            Feed::Signals => (
                &n.stream_signal,
                pull::Config {
                    durable_name: Some(signal_consumer_name(&c.name)),
                    description: Some("companion workers: signals".into()),
                    filter_subject: n.signal_all(),
                    filter_subjects: Vec::new(),
                    ..dms
                },
            ),
            // The server's notices about the two consumers above.
            Feed::Exhausted => (
                &n.stream_exhausted,
                pull::Config {
                    durable_name: Some(exhausted_consumer_name(&c.name)),
                    description: Some("companion workers: events whose deliveries ran out".into()),
                    filter_subjects: vec![
                        max_deliveries_advisory(&n.stream_in, &c.name),
                        max_deliveries_advisory(&n.stream_signal, &signal_consumer_name(&c.name)),
                    ],
                    max_deliver: EXHAUSTED_MAX_DELIVER,
                    ack_wait: EXHAUSTED_ACK_WAIT,
                    max_ack_pending: EXHAUSTED_MAX_ACK_PENDING,
                    ..dms
                },
            ),
        }
    }

    /// A feed's shared consumer, created with `config` when missing. An existing one keeps its settings
    /// (only `companion provision` changes them); each difference from `config` is logged, and the
    /// settings returned are the consumer's.
    pub async fn consumer(
        &self,
        feed: Feed,
        config: &ConsumerConfig,
    ) -> Result<Consumer, BusError> {
        let (stream, settings) = self.consumer_config(feed, config);
        self.open_consumer(stream, settings).await
    }

    /// Publishes to a stream subject and waits for the server's ack; `msg_id` makes a repeat a no-op.
    pub async fn publish_durable(
        &self,
        subject: String,
        msg_id: &str,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<jetstream::publish::PublishAck, BusError> {
        let msg = PublishMessage::build()
            .payload(payload)
            .headers(headers)
            .message_id(msg_id);
        let ack = self.js.send_publish(subject, msg).await?.await?;
        Ok(ack)
    }

    /// Stores `payload` as a one-shot message schedule on `subject` (a subject of the signal stream):
    /// at `at` the server publishes it on `target` and removes the schedule, whether or not any worker
    /// runs then. async-nats 0.51 has no helper for schedules, so the headers are set here
    /// (`Nats-Schedule: @at <RFC 3339 UTC>`, `Nats-Schedule-Target`); `msg_id` makes a repeat a no-op.
    pub async fn schedule_at(
        &self,
        subject: String,
        target: &str,
        at: chrono::DateTime<chrono::Utc>,
        msg_id: &str,
        payload: Bytes,
    ) -> Result<(), BusError> {
        // Whole seconds, rounded up: never earlier than asked.
        let at = match at.timestamp_subsec_nanos() {
            0 => at,
            n => at + chrono::Duration::nanoseconds(1_000_000_000 - i64::from(n)),
        };
        let mut headers = HeaderMap::new();
        let when = at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        headers.insert("Nats-Schedule", format!("@at {when}").as_str());
        headers.insert("Nats-Schedule-Target", target);
        self.publish_durable(subject, msg_id, headers, payload)
            .await?;
        Ok(())
    }

    /// Publishes a reply's completion; its sequence in the outbound stream (a repeat within the
    /// duplicate window gets the first one's).
    pub async fn publish_completion(&self, completion: &Completion) -> Result<u64, BusError> {
        let payload = Bytes::from(serde_json::to_vec(completion)?);
        let subject = self.names.outbound(&completion.conversation_id);
        let ack = self
            .publish_durable(subject, &completion.message_id, HeaderMap::new(), payload)
            .await?;
        Ok(ack.sequence)
    }

    /// Best-effort typing indicator (core NATS, not stored).
    pub async fn publish_typing(&self, typing: &Typing) -> Result<(), BusError> {
        let subject = self.names.typing(&typing.conversation_id);
        self.publish_json(subject, typing).await
    }

    pub(crate) async fn publish_json<T: Serialize>(
        &self,
        subject: String,
        value: &T,
    ) -> Result<(), BusError> {
        self.client
            .publish(subject, Bytes::from(serde_json::to_vec(value)?))
            .await?;
        Ok(())
    }

    /// [`Bus::dead_letter`] for a stream message known by its subject, sequence and bytes.
    pub async fn dead_letter_raw(
        &self,
        original_subject: &str,
        sequence: u64,
        payload: Bytes,
        reason: &str,
        deliveries: i64,
    ) -> Result<(), BusError> {
        let mut headers = HeaderMap::new();
        headers.insert(DLQ_REASON, header_safe(reason).as_str());
        headers.insert(DLQ_SUBJECT, header_safe(original_subject).as_str());
        headers.insert(DLQ_SEQUENCE, sequence.to_string().as_str());
        headers.insert(DLQ_DELIVERIES, deliveries.to_string().as_str());
        let subject = self.names.dead_letter(original_subject);
        // One dead letter per original stream message, however often this runs.
        let msg_id = format!("{}:{sequence}", self.names.stream_of(original_subject));
        self.publish_durable(subject, &msg_id, headers, payload)
            .await?;
        Ok(())
    }
}

/// How long a notice of the exhausted stream waits before it is tried again, when the event it is about
/// cannot be read or settled now (e.g. through a database outage). The worker NAKs with it.
pub const EXHAUSTED_RETRY: Duration = Duration::from_secs(15);

/// Deliveries of one notice of the exhausted stream: with [`EXHAUSTED_RETRY`] between them, about five
/// minutes in all.
const EXHAUSTED_MAX_DELIVER: i64 = 20;

/// How long a worker holds a notice without a sign of progress before the server redelivers it. The
/// worker sends progress acks every third of it while it settles; the DM consumer's setting is not used,
/// so that tuning turns does not change how notices are handled.
const EXHAUSTED_ACK_WAIT: Duration = Duration::from_secs(30);

/// Notices held at once across all workers: each worker holds at most one.
const EXHAUSTED_MAX_ACK_PENDING: i64 = 256;

/// The subject of the server's notice that a message of `stream` ran out of deliveries on its consumer
/// `consumer` (`*` for any).
fn max_deliveries_advisory(stream: &str, consumer: &str) -> String {
    format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{consumer}")
}

/// The durable consumer of signals that goes with the DM consumer `name`.
pub fn signal_consumer_name(name: &str) -> String {
    format!("{name}_signals")
}

/// The durable consumer of the exhausted stream that goes with the DM consumer `name`.
pub fn exhausted_consumer_name(name: &str) -> String {
    format!("{name}_exhausted")
}

/// TLS for the NATS connection: required when asked, when any certificate file is given, or for
/// `tls://` URLs (which async-nats handles itself); a CA file replaces the system roots.
fn tls_options(
    mut options: async_nats::ConnectOptions,
    config: &NatsConfig,
) -> async_nats::ConnectOptions {
    if config.tls_required || config.tls_ca_file.is_some() {
        options = options.require_tls(true);
    }
    if let Some(ca) = &config.tls_ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&config.tls_cert_file, &config.tls_key_file) {
        options = options
            .require_tls(true)
            .add_client_certificate(cert.clone(), key.clone());
    }
    if config.tls_first {
        options = options.tls_first();
    }
    options
}

/// Header values must be one printable line.
fn header_safe(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if out.len() > 1000 {
        let mut end = 1000;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_versions_from_2_12_have_message_schedules() {
        for (v, ok) in [
            ("2.15.1", true),
            ("2.12.0", true),
            ("v2.12.0-RC.1", true),
            ("3.0.0", true),
            ("2.11.9", false),
            ("2.10", false),
            ("", false),
        ] {
            assert_eq!(version_at_least(v, MIN_SERVER), ok, "{v}");
        }
    }

    #[test]
    fn dead_letters_keep_the_tail_of_dm_and_signal_subjects() {
        let names = Names {
            prefix: "dm.bot".into(),
            stream_in: "DM_BOT_IN".into(),
            stream_out: "DM_BOT_OUT".into(),
            stream_dlq: "DM_BOT_DLQ".into(),
            stream_signal: "DM_BOT_SIGNAL".into(),
            stream_alert: "DM_BOT_ALERT".into(),
            stream_exhausted: "DM_BOT_EXHAUSTED".into(),
        };
        assert_eq!(names.dead_letter("dm.bot.in.b.c"), "dm.bot.dlq.b.c");
        assert_eq!(names.dead_letter("dm.bot.group.c"), "dm.bot.dlq.group.c");
        assert_eq!(
            names.dead_letter("dm.bot.signal.spot_draft.d"),
            "dm.bot.dlq.signal.spot_draft.d"
        );
        assert_eq!(names.dead_letter("elsewhere.x"), "dm.bot.dlq.unknown");
        assert_eq!(
            names.stream_of("dm.bot.signal.spot_draft.d"),
            "DM_BOT_SIGNAL"
        );
        assert_eq!(names.stream_of("dm.bot.in.b.c"), "DM_BOT_IN");
    }
}
