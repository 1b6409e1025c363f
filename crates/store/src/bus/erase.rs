//! Removing a deleted message's event from the streams by its sequence, and a user's messages when the
//! user is erased (see `memory::erase`): a DM
//! conversation's subjects hold only that user's messages and the companion's answers, so they are
//! purged; a group message is deleted by its sequence; a dead letter of a group message is found by its
//! sender; a completion a deletion overtook (see `pipeline::deliver`) is deleted by its sequence. The worker's NATS user needs `$JS.API.STREAM.PURGE` and `$JS.API.STREAM.MSG.DELETE` on the
//! inbound, outbound and dead-letter streams, and `$JS.API.DIRECT.GET` on the dead-letter stream
//! (deploy/nats/auth.conf).

use super::{Bus, BusError};

/// Dead letters read at most when looking for one user's (the stream is small; this bounds a scan).
const DLQ_SCAN_MAX: u64 = 100_000;

/// The stream operations of a deletion and an erasure ([`Bus::erase`]).
pub struct Eraser<'a> {
    bus: &'a Bus,
}

impl Bus {
    /// What removes a deleted message's (or an erased user's) events from the streams.
    pub fn erase(&self) -> Eraser<'_> {
        Eraser { bus: self }
    }
}

impl Eraser<'_> {
    /// Deletes message `seq` of the inbound stream: 1, or 0 when it is gone already.
    pub async fn delete_inbound(&self, seq: u64) -> Result<u64, BusError> {
        self.delete_seq(&self.bus.names.stream_in, seq).await
    }

    /// Deletes message `seq` of the outbound stream (a completion a deletion overtook): 1, or 0 when it
    /// is gone already.
    pub async fn delete_outbound(&self, seq: u64) -> Result<u64, BusError> {
        self.delete_seq(&self.bus.names.stream_out, seq).await
    }

    async fn delete_seq(&self, name: &str, seq: u64) -> Result<u64, BusError> {
        let stream = self.bus.stream(name).await?;
        match stream.delete_message(seq).await {
            Ok(true) => Ok(1),
            Ok(false) => Ok(0),
            Err(e) if e.to_string().contains("no message found") => Ok(0),
            Err(e) => Err(BusError::Other(format!(
                "cannot delete message {seq} of {name}: {e}"
            ))),
        }
    }

    /// Purges a DM conversation's subjects: its inbound messages, their dead letters, and the
    /// completions of the companion's answers. Returns the messages removed.
    pub async fn purge_conversation(&self, bot: &str, conversation: &str) -> Result<u64, BusError> {
        let inbound = self.bus.names.inbound(bot, conversation);
        let purges = [
            (self.bus.names.stream_in.clone(), inbound.clone()),
            (
                self.bus.names.stream_dlq.clone(),
                self.bus.names.dead_letter(&inbound),
            ),
            (
                self.bus.names.stream_out.clone(),
                self.bus.names.outbound(conversation),
            ),
        ];
        let mut n = 0;
        for (stream, subject) in purges {
            let purged = self
                .bus
                .stream(&stream)
                .await?
                .purge()
                .filter(subject.clone())
                .await
                .map_err(|e| BusError::Other(format!("cannot purge {subject} in {stream}: {e}")))?;
            n += purged.purged;
        }
        Ok(n)
    }

    /// Deletes every dead letter whose event was sent by `user` (`senderId` of the original JSON), and its
    /// original in the inbound stream.
    pub async fn delete_dead_letters_of(&self, user: &str) -> Result<u64, BusError> {
        self.delete_dead_letters_with(&format!("\"senderId\":\"{user}\""))
            .await
    }

    /// Deletes one event, a deleted message: message `seq` of the inbound stream when known, and its dead
    /// letter (`messageId` of the original JSON) with the original, if it has one. Returns the messages
    /// removed.
    pub async fn delete_event(&self, message: &str, seq: Option<u64>) -> Result<u64, BusError> {
        let mut n = match seq {
            Some(seq) if seq > 0 => self.delete_inbound(seq).await?,
            _ => 0,
        };
        n += self
            .delete_dead_letters_with(&format!("\"messageId\":\"{message}\""))
            .await?;
        Ok(n)
    }

    /// Deletes every dead letter whose original JSON (whitespace aside) contains `needle`, and its
    /// original in the inbound stream.
    async fn delete_dead_letters_with(&self, needle: &str) -> Result<u64, BusError> {
        use async_nats::jetstream::stream::DirectGetErrorKind;
        let name = self.bus.names.stream_dlq.clone();
        let mut stream = self.bus.stream(&name).await?;
        let info = stream
            .info()
            .await
            .map_err(|e| BusError::Other(format!("cannot read {name}: {e}")))?;
        let (first, last) = (info.state.first_sequence, info.state.last_sequence);
        if info.state.messages == 0 {
            return Ok(0);
        }
        let mut n = 0;
        let mut seq = first;
        let mut read = 0;
        while seq <= last && read < DLQ_SCAN_MAX {
            let msg = match stream
                .direct_get_next_for_subject(format!("{}.dlq.>", self.bus.names.prefix), Some(seq))
                .await
            {
                Ok(m) => m,
                Err(e) if matches!(e.kind(), DirectGetErrorKind::NotFound) => break,
                Err(e) => return Err(BusError::Other(format!("cannot read {name}: {e}"))),
            };
            read += 1;
            let at = msg.sequence;
            let compact: String = String::from_utf8_lossy(&msg.payload)
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect();
            if compact.contains(needle) {
                // The original too, when it is still in the inbound stream (an event dead-lettered before
                // any job was opened for it, e.g. a malformed one, is found only this way).
                let original = (
                    msg.headers
                        .get(super::DLQ_SUBJECT)
                        .map(|v| v.as_str().to_owned()),
                    msg.headers
                        .get(super::DLQ_SEQUENCE)
                        .and_then(|v| v.as_str().parse::<u64>().ok()),
                );
                if let (Some(subject), Some(original_seq)) = original
                    && original_seq > 0
                    && !self.bus.names.is_signal(&subject)
                {
                    n += self.delete_inbound(original_seq).await?;
                }
                if stream.delete_message(at).await.unwrap_or(false) {
                    n += 1;
                }
            }
            seq = at + 1;
        }
        Ok(n)
    }
}
