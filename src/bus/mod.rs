//! NATS JetStream: subjects, streams and the shared durable consumer, and the publishes a turn makes.

pub mod event;

use std::time::Duration;

use async_nats::{
    HeaderMap,
    jetstream::{
        self, AckKind,
        consumer::{AckPolicy, DeliverPolicy, pull},
        message::PublishMessage,
        stream::{self, DiscardPolicy, RetentionPolicy, StorageType},
    },
};
use bytes::Bytes;
use serde::Serialize;

use crate::config::Config;

pub use event::{Completion, DmEvent, InboundEvent, Typing};

/// Header carrying the dead-letter reason.
pub const DLQ_REASON: &str = "Companion-Dlq-Reason";
/// Header carrying the subject the dead-lettered event arrived on.
pub const DLQ_SUBJECT: &str = "Companion-Original-Subject";
/// Header carrying the stream sequence of the dead-lettered event.
pub const DLQ_SEQUENCE: &str = "Companion-Original-Sequence";
/// Header carrying how many times the event was delivered.
pub const DLQ_DELIVERIES: &str = "Companion-Deliveries";

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("cannot connect to NATS: {0}")]
    Connect(#[from] async_nats::ConnectError),
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
}

/// Subject and stream names, all derived from two configurable prefixes.
#[derive(Clone, Debug)]
pub struct Names {
    pub prefix: String,
    pub stream_in: String,
    pub stream_out: String,
    pub stream_dlq: String,
    pub consumer: String,
}

impl Names {
    pub fn new(config: &Config) -> Self {
        let s = &config.stream_prefix;
        Self {
            prefix: config.subject_prefix.clone(),
            stream_in: format!("{s}_IN"),
            stream_out: format!("{s}_OUT"),
            stream_dlq: format!("{s}_DLQ"),
            consumer: config.consumer.clone(),
        }
    }
    pub fn inbound(&self, bot_id: &str, conversation_id: &str) -> String {
        format!("{}.in.{bot_id}.{conversation_id}", self.prefix)
    }
    pub fn inbound_all(&self) -> String {
        format!("{}.in.>", self.prefix)
    }
    pub fn outbound(&self, conversation_id: &str) -> String {
        format!("{}.out.{conversation_id}", self.prefix)
    }
    pub fn typing(&self, conversation_id: &str) -> String {
        format!("{}.typing.{conversation_id}", self.prefix)
    }
    /// Dead letters keep the tail of the original subject (`<botId>.<conversationId>`).
    pub fn dead_letter(&self, original_subject: &str) -> String {
        let head = format!("{}.in.", self.prefix);
        let tail = original_subject
            .strip_prefix(&head)
            .filter(|t| !t.is_empty())
            .unwrap_or("unknown");
        format!("{}.dlq.{tail}", self.prefix)
    }
}

/// A connected bus: the client, its JetStream context and the names in use.
#[derive(Clone)]
pub struct Bus {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub names: Names,
    /// Replicas requested for every stream.
    pub replicas: usize,
}

impl Bus {
    pub async fn connect(config: &Config) -> Result<Self, BusError> {
        let mut options = async_nats::ConnectOptions::new()
            .name("companion")
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(5));
        if let Some(user) = &config.nats_user {
            options =
                options.user_and_password(user.clone(), config.nats_password.expose().to_owned());
        }
        options = tls_options(options, config);
        let servers: Vec<async_nats::ServerAddr> = config
            .nats_url
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.parse())
            .collect::<Result<_, _>>()
            .map_err(|e: std::io::Error| {
                BusError::Connect(async_nats::ConnectError::with_source(
                    async_nats::ConnectErrorKind::ServerParse,
                    e,
                ))
            })?;
        let client = options.connect(servers).await?;
        let js = jetstream::new(client.clone());
        Ok(Self {
            client,
            js,
            names: Names::new(config),
            replicas: config.stream_replicas.max(1),
        })
    }

    /// Creates or updates the three streams (idempotent; every worker runs it at start-up).
    pub async fn ensure_streams(&self) -> Result<(), BusError> {
        let n = &self.names;
        let day = Duration::from_secs(24 * 3600);
        let num_replicas = self.replicas;
        self.js
            .create_or_update_stream(stream::Config {
                name: n.stream_in.clone(),
                description: Some("Bot-bound DMs published by TB-Backend".into()),
                subjects: vec![n.inbound_all()],
                retention: RetentionPolicy::Limits,
                storage: StorageType::File,
                max_age: 7 * day,
                duplicate_window: Duration::from_secs(2 * 3600),
                discard: DiscardPolicy::Old,
                num_replicas,
                // The order gate and replay read messages by subject and sequence.
                allow_direct: true,
                ..Default::default()
            })
            .await?;
        self.js
            .create_or_update_stream(stream::Config {
                name: n.stream_out.clone(),
                description: Some("Companion replies for TB-Backend to fan out".into()),
                subjects: vec![format!("{}.out.>", n.prefix)],
                storage: StorageType::File,
                max_age: day,
                duplicate_window: Duration::from_secs(2 * 3600),
                num_replicas,
                ..Default::default()
            })
            .await?;
        self.js
            .create_or_update_stream(stream::Config {
                name: n.stream_dlq.clone(),
                description: Some("Events no worker could process, with the reason".into()),
                subjects: vec![format!("{}.dlq.>", n.prefix)],
                storage: StorageType::File,
                max_age: 30 * day,
                num_replicas,
                allow_direct: true,
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    /// Creates or updates the durable pull consumer all worker processes share.
    pub async fn ensure_consumer(
        &self,
        config: &Config,
    ) -> Result<jetstream::consumer::PullConsumer, BusError> {
        let stream = self
            .js
            .get_stream(&self.names.stream_in)
            .await
            .map_err(|e| {
                BusError::Consumer(jetstream::stream::ConsumerError::with_source(
                    jetstream::stream::ConsumerErrorKind::Other,
                    e,
                ))
            })?;
        let consumer_config = pull::Config {
            durable_name: Some(self.names.consumer.clone()),
            description: Some("companion workers".into()),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::Explicit,
            ack_wait: config.ack_wait(),
            max_deliver: config.max_deliver.max(1),
            max_ack_pending: config.max_ack_pending(),
            filter_subject: self.names.inbound_all(),
            ..Default::default()
        };
        let consumer = match stream
            .get_consumer::<pull::Config>(&self.names.consumer)
            .await
        {
            Ok(_) => stream.update_consumer(consumer_config).await?,
            Err(_) => stream.create_consumer(consumer_config).await?,
        };
        Ok(consumer)
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

    pub async fn publish_completion(&self, completion: &Completion) -> Result<(), BusError> {
        let payload = Bytes::from(serde_json::to_vec(completion)?);
        let subject = self.names.outbound(&completion.conversation_id);
        self.publish_durable(subject, &completion.message_id, HeaderMap::new(), payload)
            .await?;
        Ok(())
    }

    /// Best-effort typing indicator (core NATS, not stored).
    pub async fn publish_typing(&self, typing: &Typing) -> Result<(), BusError> {
        let subject = self.names.typing(&typing.conversation_id);
        self.publish_json(subject, typing).await
    }

    pub async fn publish_json<T: Serialize>(
        &self,
        subject: String,
        value: &T,
    ) -> Result<(), BusError> {
        self.client
            .publish(subject, Bytes::from(serde_json::to_vec(value)?))
            .await?;
        Ok(())
    }

    /// Records an event no worker can process, with the original bytes and why.
    pub async fn dead_letter(
        &self,
        msg: &jetstream::Message,
        reason: &str,
        deliveries: i64,
    ) -> Result<(), BusError> {
        let sequence = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
        self.dead_letter_raw(
            msg.subject.as_str(),
            sequence,
            msg.payload.clone(),
            reason,
            deliveries,
        )
        .await
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
        let msg_id = format!("{}:{sequence}", self.names.stream_in);
        self.publish_durable(subject, &msg_id, headers, payload)
            .await?;
        Ok(())
    }

    /// The server's notice that an event used up its deliveries without being settled (workers crashed).
    pub fn max_deliveries_advisory(&self) -> String {
        format!(
            "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{}.{}",
            self.names.stream_in, self.names.consumer
        )
    }
}

/// TLS for the NATS connection: required when asked, when any certificate file is given, or for
/// `tls://` URLs (which async-nats handles itself); a CA file replaces the system roots.
fn tls_options(
    mut options: async_nats::ConnectOptions,
    config: &Config,
) -> async_nats::ConnectOptions {
    if config.nats_tls_required || config.nats_tls_ca_file.is_some() {
        options = options.require_tls(true);
    }
    if let Some(ca) = &config.nats_tls_ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&config.nats_tls_cert_file, &config.nats_tls_key_file) {
        options = options
            .require_tls(true)
            .add_client_certificate(cert.clone(), key.clone());
    }
    if config.nats_tls_first {
        options = options.tls_first();
    }
    options
}

/// NAK with a delay, or terminate: how a failed delivery is answered.
pub async fn settle(msg: &jetstream::Message, kind: AckKind) {
    if let Err(e) = msg.ack_with(kind).await {
        tracing::warn!(error = %e, "could not settle message; the server will redeliver it");
    }
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
