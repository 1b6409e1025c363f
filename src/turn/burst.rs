//! Stage 5 of a DM: its burst. Messages the user sent after this one that are already in the stream
//! when the turn starts (up to `COMPANION_BURST_MAX`) are answered by the same reply, as a person would
//! answer five quick lines once. They become `covered` jobs of their own, atomically with the `burst`
//! step's record ([`crate::journal::Job::covering`]), and are listed in the completion's `covers`.

use bson::oid::ObjectId;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tracing::info;

use super::{Delivery, TurnError, Turns};
use crate::{
    bus::{DmEvent, event::parse_inbound},
    journal::{
        Job, NewJob,
        names::{key, step},
    },
};

/// A later message of a burst, as the `burst` step fixes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Covered {
    pub(crate) message_id: String,
    pub(crate) seq: u64,
    pub(crate) content: String,
    #[serde(default)]
    pub(crate) images: Vec<String>,
    pub(crate) sent_at: DateTime<Utc>,
}

/// The `burst` step: the later messages this turn's reply answers too, in stream order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Burst {
    pub(crate) covers: Vec<Covered>,
}

impl Burst {
    pub fn last_seq(&self) -> Option<u64> {
        self.covers.last().map(|c| c.seq)
    }

    /// The covered messages as events of the same conversation as `head`.
    pub(crate) fn events(&self, head: &DmEvent) -> Vec<DmEvent> {
        self.covers
            .iter()
            .filter_map(|c| {
                Some(DmEvent {
                    message_id: ObjectId::parse_str(&c.message_id).ok()?,
                    content: c.content.clone(),
                    images: c.images.clone(),
                    sent_at: c.sent_at,
                    ..head.clone()
                })
            })
            .collect()
    }
}

impl Turns {
    /// The `burst` step of the DM `event`: the later messages of the same sender that follow in the
    /// stream now (contiguous, valid, within the bounds), each made a job `covered` by this one (the
    /// incoming hook sees them once the step is fixed) (like `own`, the job's own row); the first that already has a job ends the
    /// burst.
    pub(crate) async fn take_in(
        &self,
        (job, own): (&Job, NewJob<'_>),
        event: &DmEvent,
        delivery: Option<&Delivery<'_>>,
    ) -> Result<Burst, TurnError> {
        let mut candidates: Vec<(String, Covered)> = Vec::new();
        // A retry reads the stream again and finds the step recorded: the covered jobs are its record's.
        let from_stream = delivery
            .and_then(|d| Some((d.order?, d)))
            .filter(|_| self.config.burst_max > 0);
        if let Some((order, d)) = from_stream {
            let limits = self.limits();
            let mut chars = event.content.chars().count();
            for m in order
                .followers(d.subject, d.seq, self.config.burst_max)
                .await?
            {
                let prefix = &self.bus.names.prefix;
                let Ok(f) = parse_inbound(&m.payload, m.subject.as_str(), prefix, limits) else {
                    break;
                };
                chars += f.content.chars().count();
                if f.sender_id != event.sender_id
                    || f.message_id == event.message_id
                    || chars > self.config.max_content_chars
                {
                    break;
                }
                let covered = Covered {
                    message_id: f.message_id.to_hex(),
                    seq: m.sequence,
                    content: f.content,
                    images: f.images,
                    sent_at: f.sent_at,
                };
                candidates.push((covered.message_id.clone(), covered));
            }
        }
        // A later message already deleted ends the burst before it: its own delivery finds the tombstone.
        if !candidates.is_empty() {
            let ids: Vec<String> = candidates.iter().map(|(id, _)| id.clone()).collect();
            if let Some(at) = self.pg.first_deleted(&ids).await? {
                candidates.truncate(at);
            }
        }
        let jobs: Vec<NewJob<'_>> = candidates
            .iter()
            .map(|(id, c)| NewJob {
                id,
                stream_seq: Some(c.seq),
                ..own
            })
            .collect();
        let burst = job
            .covering(step::BURST, key::ONCE, &jobs, |n| Burst {
                covers: candidates[..n].iter().map(|(_, c)| c.clone()).collect(),
            })
            .await?;
        if !burst.covers.is_empty() {
            info!(
                covers = burst.covers.len(),
                "answering a burst of messages with one reply"
            );
        }
        Ok(burst)
    }
}
