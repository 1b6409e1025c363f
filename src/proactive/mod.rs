//! Follow-ups' one difference from an answer: what the companion is told to say, and why. A signal on
//! `<prefix>.signal.<kind>.<id>` (a moderator reviewed a spot draft a companion made; a reminder it
//! promised is due) is read here into a [`FollowUp`]: to whom, from which companion, in which thread, the
//! brief for the model, the plain line that stands in when the model cannot write, and the card. The
//! conversation pipeline ([`crate::pipeline`]) sends it once, as the job `<kind>:<id>`, or drops it with the
//! reason (the user left or blocked the companion, the daily cap, stale news).

pub(crate) mod reminder;
pub(crate) mod spot_review;

use bson::oid::ObjectId;
use serde_json::Value;

use crate::{
    bus::Trigger,
    character::{Character, Characters},
    failure::{Class, Classify},
    flow::WaitKind,
    metrics::Metric,
    store::{Mongo, Pg, StoreError},
};

/// Counter of follow-ups by kind and outcome.
pub(crate) const PROACTIVE: Metric = Metric::new(
    "companion_proactive_total",
    "Counter of follow-ups by kind and outcome",
);

#[derive(Debug, thiserror::Error)]
pub enum ProactiveError {
    /// The signal cannot be read or names nothing a companion can act on: dead-lettered.
    #[error("invalid signal: {0}")]
    Invalid(String),
    /// The app's data is not there yet (the review's status not stored yet): tried again later.
    #[error("{0}")]
    NotYet(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Classify for ProactiveError {
    fn class(&self) -> Class {
        match self {
            Self::Invalid(_) => Class::Reject,
            Self::NotYet(_) => Class::Transient,
            Self::Store(e) => e.class(),
        }
    }
}

/// What reading a signal looks at.
#[derive(Clone, Copy)]
pub(crate) struct Sources<'t> {
    pub(crate) mongo: &'t Mongo,
    pub(crate) pg: &'t Pg,
    pub(crate) characters: &'t Characters,
}

/// A follow-up ready to be sent: who to, from whom, about what, and how to say it.
pub(crate) struct FollowUp<'a> {
    /// What it follows up on: the job is `<kind>:<id>`.
    pub(crate) trigger: Trigger,
    pub(crate) user: ObjectId,
    pub(crate) bot: ObjectId,
    pub(crate) conversation: ObjectId,
    pub(crate) character: &'a Character,
    /// What happened, for the model (a note after the conversation so far).
    pub(crate) brief: String,
    /// The plain line sent when the model cannot write the message.
    pub(crate) plain: String,
    /// The card shown with the message.
    pub(crate) card: Option<Value>,
    /// Set when the news must not be sent after all (it is stale): the job is dropped with this reason.
    pub(crate) stale: Option<String>,
}

impl FollowUp<'_> {
    /// The job's id: `<kind>:<id>`.
    pub(crate) fn job_id(&self) -> String {
        format!("{}:{}", self.trigger.kind, self.trigger.id)
    }

    /// How a waiting step of a guided flow names the event this follows up on.
    pub(crate) fn awaited(&self) -> Option<String> {
        match self.trigger.kind.as_str() {
            spot_review::KIND => {
                let draft = self.trigger.id.split(':').next().unwrap_or_default();
                Some(WaitKind::SpotReview.key(draft))
            }
            reminder::KIND => Some(WaitKind::Reminder.key(&self.trigger.id)),
            _ => None,
        }
    }
}

/// Reads the signal of `kind` about `id` (its subject's last tokens) into the follow-up it asks for.
pub(crate) async fn read<'t>(
    sources: Sources<'t>,
    kind: &str,
    id: &str,
    payload: &[u8],
    max_bytes: usize,
) -> Result<FollowUp<'t>, ProactiveError> {
    if payload.len() > max_bytes {
        return Err(ProactiveError::Invalid(format!(
            "the signal has {} bytes, more than COMPANION_MAX_EVENT_BYTES ({max_bytes})",
            payload.len(),
        )));
    }
    let (kind, (id, (user, bot, conversation, character), news)) = match kind {
        "spot_draft" => (
            spot_review::KIND,
            spot_review::follow_up(sources, body(payload, id)?).await?,
        ),
        "reminder" => (
            reminder::KIND,
            reminder::follow_up(sources, body(payload, id)?).await?,
        ),
        other => return Err(invalid(format!("unknown signal kind `{other}`"))),
    };
    Ok(FollowUp {
        trigger: Trigger {
            kind: kind.to_owned(),
            id,
        },
        user,
        bot,
        conversation,
        character,
        brief: news.brief,
        plain: news.plain,
        card: news.card,
        stale: news.stale,
    })
}

/// What a kind of signal found: the trigger's id, the thread and the news.
type Found<'t> = (String, Thread<'t>, News);

/// Who a follow-up goes to, from which companion, in which conversation: (user, bot, conversation, the
/// bot's character).
type Thread<'a> = (ObjectId, ObjectId, ObjectId, &'a Character);

/// What a follow-up tells (see [`FollowUp`]).
struct News {
    brief: String,
    plain: String,
    card: Option<Value>,
    stale: Option<String>,
}

impl News {
    fn new(brief: String, plain: String, card: Option<Value>, stale: Option<String>) -> Self {
        Self {
            brief,
            plain,
            card,
            stale,
        }
    }
}

/// A signal's JSON body.
trait SignalBody: serde::de::DeserializeOwned {
    /// What it is, for errors.
    const WHAT: &'static str;
    /// The field that holds the id its subject names.
    const ID_FIELD: &'static str;
    fn id(&self) -> &str;
}

/// The signal's body, whose id must be the one its subject names.
fn body<T: SignalBody>(payload: &[u8], subject_id: &str) -> Result<T, ProactiveError> {
    let body: T =
        serde_json::from_slice(payload).map_err(|e| invalid(format!("not a {}: {e}", T::WHAT)))?;
    if body.id() != subject_id {
        return Err(invalid(format!(
            "{} {} does not match the subject's {subject_id}",
            T::ID_FIELD,
            body.id()
        )));
    }
    Ok(body)
}

fn invalid(why: String) -> ProactiveError {
    ProactiveError::Invalid(why)
}
