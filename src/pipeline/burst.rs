//! Stage 5, taking in what a job answers besides its own input: a DM's burst, a follow-up's flow.
//!
//! A DM's burst: messages the user sent after this one that are already in the stream when the turn
//! starts (up to `COMPANION_BURST_MAX`) are answered by the same reply, as a person would answer five
//! quick lines once. They become `covered` jobs of their own, atomically with the `burst`
//! step's record ([`crate::journal::Job::covering`]), and are listed in the completion's `covers`. With
//! none, the record is owed: the history's read in stage 7 writes it, before the model is asked. A
//! follow-up's news moves the user's flow on when a waiting step waited for it.

use bson::oid::ObjectId;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tracing::info;

use std::sync::Arc;

use super::{Arrival, PipelineError};
use crate::{
    bus::{
        DmEvent, Names,
        event::{EventLimits, parse_inbound},
    },
    flow::Flows,
    journal::{Job, NewJob, StepKind, Telling, Told, names::key},
    store::Pg,
};
use crate::{config::Config, parts::Parts};

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

/// The later messages of a burst that one reply answers ([`Burst`]). Keyed once.
pub const BURST: StepKind<Burst> = StepKind::new("burst").told(tell_burst);

fn tell_burst(_: &Told<'_>, b: &Burst) -> Telling {
    let ids: Vec<&str> = b.covers.iter().map(|c| c.message_id.as_str()).collect();
    let says = match ids.is_empty() {
        true => "burst: no later message joined".into(),
        false => format!(
            "burst: answers {} later message(s) too: {}",
            ids.len(),
            ids.join(", ")
        ),
    };
    (says, serde_json::json!({ "covers": ids }))
}

/// The `burst` step's record: the later messages this turn's reply answers too, in stream order.
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

/// What take-in brought.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    /// A DM's later messages its reply answers too.
    pub(crate) burst: Burst,
    /// A follow-up's news moved the user's flow on: the note for the brief.
    pub(crate) flow_note: Option<String>,
}

/// Stage 5, with what it reads.
pub(crate) struct TakeIn {
    /// Whether a later message of the burst was deleted already.
    pub(crate) pg: Pg,
    /// The subjects' prefix the stream's later messages are parsed under.
    pub(crate) names: Names,
    /// The bounds a later message is parsed with; a burst's text stays within `max_content_chars`.
    pub(crate) limits: EventLimits,
    /// Later messages answered by one reply, at most (`COMPANION_BURST_MAX`; 0: none).
    pub(crate) burst_max: usize,
    /// The guided flows a follow-up's news moves on.
    pub(crate) flows: Arc<Flows>,
}

impl TakeIn {
    /// Stage 5 from the shared handles (`turn`: the event bounds and the burst's).
    pub(crate) fn new(p: &Parts, c: &Config) -> Self {
        Self {
            pg: p.pg.clone(),
            names: p.bus.names.clone(),
            limits: EventLimits::of(&c.turn),
            burst_max: c.turn.burst_max,
            flows: p.flows.clone(),
        }
    }
}

impl TakeIn {
    /// The `burst` step of the DM `event`: the later messages of the same sender that follow in the
    /// stream now (contiguous, valid, within the bounds), each made a job `covered` by this one (the
    /// incoming hook sees them once the step is fixed) (like `own`, the job's own row); the first that already has a job ends the
    /// burst.
    pub(crate) async fn burst(
        &self,
        job: &Job,
        own: NewJob<'_>,
        event: &DmEvent,
        arrival: Option<&Arrival<'_>>,
    ) -> Result<Burst, PipelineError> {
        let mut candidates: Vec<(String, Covered)> = Vec::new();
        // A retry reads the stream again and finds the step recorded: the covered jobs are its record's.
        let from_stream = arrival
            .and_then(|d| Some((d.order?, d)))
            .filter(|_| self.burst_max > 0);
        if let Some((order, d)) = from_stream {
            let limits = self.limits;
            let mut chars = event.content.chars().count();
            for m in order.followers(d.subject, d.seq, self.burst_max).await? {
                let prefix = &self.names.prefix;
                let Ok(f) = parse_inbound(&m.payload, m.subject.as_str(), prefix, limits) else {
                    break;
                };
                chars += f.content.chars().count();
                if f.sender_id != event.sender_id
                    || f.message_id == event.message_id
                    || chars > self.limits.max_content_chars
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
                reads: Default::default(),
                ..own
            })
            .collect();
        let burst = job
            .covering(&BURST, key::ONCE, &jobs, |n| Burst {
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
