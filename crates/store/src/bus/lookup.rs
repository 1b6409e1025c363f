//! Reading back what the worker stored on the bus ([`Bus::lookup`]): a completion whose publish a stalled
//! server stored though its ack never came back, and the dead letter of a message that got no reply. Both
//! are direct gets: the streams need `allow_direct`, and the worker's NATS user `$JS.API.DIRECT.GET` on
//! `DM_BOT_OUT` and `DM_BOT_DLQ` (deploy/nats/auth.conf).

use super::{Bus, BusError, Completion};
#[cfg(feature = "testing")]
use super::{DLQ_DELIVERIES, DLQ_REASON};

/// A conversation's dead letters [`Lookup::dead_letter_of`] reads at most.
#[cfg(feature = "testing")]
const DEAD_LETTERS_READ: usize = 256;

/// What the dead-letter stream says of one message.
#[cfg(feature = "testing")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    pub reason: String,
    /// Deliveries spent on it (absent in dead letters older than the header).
    pub deliveries: Option<i64>,
}

/// The reads ([`Bus::lookup`]).
pub struct Lookup<'a> {
    bus: &'a Bus,
}

impl Bus {
    /// What reads back stored completions and dead letters.
    pub fn lookup(&self) -> Lookup<'_> {
        Lookup { bus: self }
    }
}

impl Lookup<'_> {
    /// The stream `name`, for direct gets (no info request: a lookup is one round trip per read).
    async fn open(
        &self,
        name: &str,
    ) -> Result<async_nats::jetstream::stream::Stream<()>, BusError> {
        self.bus
            .js
            .get_stream_no_info(name)
            .await
            .map_err(|e| BusError::NoStream(name.to_owned(), e.to_string()))
    }

    /// The sequence of `completion` in the outbound stream when it is stored already: an earlier
    /// attempt's publish the server stored though its ack never came back (a stalled server). Publishing
    /// it again would be dropped by the stream but seen twice by a core subscriber, so a retried
    /// publish asks first. Read by direct get: the conversation's last completion, and when a later one
    /// came after this reply was made (a group's next companion, a follow-up), a few of the
    /// conversation's completions before that one.
    pub async fn stored_completion(
        &self,
        completion: &Completion,
    ) -> Result<Option<u64>, BusError> {
        use async_nats::jetstream::stream::DirectGetErrorKind;
        /// Stream sequences looked back from the conversation's last completion, and completions read.
        const LOOK_BACK: u64 = 4096;
        const READ_AT_MOST: usize = 16;
        let stream = self.open(&self.bus.names.stream_out).await?;
        let subject = self.bus.names.outbound(&completion.conversation_id);
        let is_this = |m: &async_nats::jetstream::message::StreamMessage| {
            m.headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .is_some_and(|id| id.as_str() == completion.message_id)
        };
        let last = match stream.direct_get_last_for_subject(subject.as_str()).await {
            Ok(m) => m,
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(BusError::Other(format!("reading the completions: {e}"))),
        };
        if is_this(&last) {
            return Ok(Some(last.sequence));
        }
        let made = completion.created_at.timestamp_nanos_opt().unwrap_or(0);
        if last.time.unix_timestamp_nanos() < i128::from(made) {
            // Nothing was stored after the reply was made, so neither was the reply.
            return Ok(None);
        }
        let mut next = last.sequence.saturating_sub(LOOK_BACK).max(1);
        for _ in 0..READ_AT_MOST {
            match stream
                .direct_get_next_for_subject(subject.as_str(), Some(next))
                .await
            {
                Ok(m) if m.sequence >= last.sequence => break,
                Ok(m) if is_this(&m) => return Ok(Some(m.sequence)),
                Ok(m) => next = m.sequence + 1,
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => break,
                Err(e) => return Err(BusError::Other(format!("reading the completions: {e}"))),
            }
        }
        Ok(None)
    }

    /// The dead letter of message `message_id` that arrived on `original_subject`, when there is one:
    /// why and after how many deliveries (what the terminal chat says of a message that got no reply).
    /// Reads the conversation's dead letters in order, at most [`DEAD_LETTERS_READ`].
    #[cfg(feature = "testing")]
    pub async fn dead_letter_of(
        &self,
        original_subject: &str,
        message_id: &str,
    ) -> Result<Option<DeadLetter>, BusError> {
        use async_nats::jetstream::stream::DirectGetErrorKind;
        let stream = self.open(&self.bus.names.stream_dlq).await?;
        let subject = self.bus.names.dead_letter(original_subject);
        let mut next = 1;
        for _ in 0..DEAD_LETTERS_READ {
            let m = match stream
                .direct_get_next_for_subject(subject.as_str(), Some(next))
                .await
            {
                Ok(m) => m,
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(BusError::Other(format!("reading the dead letters: {e}"))),
            };
            next = m.sequence + 1;
            let id = serde_json::from_slice::<serde_json::Value>(&m.payload)
                .ok()
                .and_then(|v| v.get("messageId")?.as_str().map(str::to_owned));
            if id.as_deref() == Some(message_id) {
                let header = |name: &str| m.headers.get(name).map(|v| v.as_str().to_owned());
                return Ok(Some(DeadLetter {
                    reason: header(DLQ_REASON).unwrap_or_default(),
                    deliveries: header(DLQ_DELIVERIES).and_then(|d| d.parse().ok()),
                }));
            }
        }
        Ok(None)
    }
}
