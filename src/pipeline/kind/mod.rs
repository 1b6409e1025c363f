//! What differs between the kinds of job, in one place: a DM ([`dm`]), a group message ([`group`]) and a
//! follow-up ([`follow_up`]) each supply their plan (stage 4's checks and who speaks), their take-in
//! (stage 5), their prompt and answer (stage 7) and their address (what a message answers, who reads the
//! conversation). The conductor calls them (the plan through the gate, [`Gate::pass`], which asks it
//! what to do and applies the answer: [`Asked`]; the prompt through the composer, [`Composer::compose`],
//! which asks the model what the kind built: [`Ask`]); the stages read what a kind is through the facts
//! below and never match on it.
//!
//! A fourth kind is a variant of [`Kind`] (admitted in `input.rs`), a file beside these three, and an arm
//! in each function here.

pub(crate) mod dm;
pub(crate) mod follow_up;
pub(crate) mod group;

use super::{
    Arrival, Burst, PipelineError,
    burst::{TakeIn, Taken},
    compose::{Ask, Composer, SlotView},
    deliver::Answers,
    gate::{Asked, Gate, Plan},
    input::{Admitted, Answered, Kind, UserMessage},
};
use std::sync::LazyLock;

use crate::{
    bus::DmEvent,
    journal::Job,
    proactive::FollowUp,
    tools::{REGISTRY, Registry},
};

/// Stage 4's checks inside the job and who speaks, as the job's kind decides them: what it asks of the
/// gate, which calls this ([`Gate::pass`]) with whether the conversation is `paused`.
pub(crate) async fn plan<'t>(
    gate: &'t Gate,
    job: &Job,
    a: &Admitted<'t>,
    crisis: bool,
    paused: bool,
) -> Result<Asked<'t>, PipelineError> {
    match &a.kind {
        Kind::Dm(_) => Ok(dm::plan(a, crisis, paused)),
        Kind::Group { event, .. } => group::plan(gate, job, a, event, paused).await,
        Kind::FollowUp { follow_up, access } => Ok(Asked::Decided(
            follow_up::plan(gate, job, a, follow_up, *access, paused).await?,
        )),
    }
}

/// Stage 5 for a job the gate let through with `plan`: a DM's burst, a follow-up's flow; nothing for a
/// group message.
pub(crate) async fn take_in(
    t: &TakeIn,
    job: &Job,
    a: &Admitted<'_>,
    plan: &Plan<'_>,
    arrival: Option<&Arrival<'_>>,
) -> Result<Taken, PipelineError> {
    match &a.kind {
        Kind::Dm(event) => dm::take_in(t, job, a, event, plan, arrival).await,
        Kind::Group { .. } => Ok(Taken::default()),
        Kind::FollowUp { follow_up, .. } => follow_up::take_in(t, job, a, follow_up).await,
    }
}

/// Stage 7: what the slot asks the model, as the kind builds it ([`Composer::compose`] asks it).
pub(crate) async fn ask<'c>(
    c: &'c Composer,
    t: &SlotView<'_, '_>,
) -> Result<Ask<'c>, PipelineError> {
    match &t.admitted.kind {
        Kind::Dm(event) => dm::ask(c, t, event).await,
        Kind::Group {
            event,
            participants,
        } => group::ask(c, t, event, participants).await,
        Kind::FollowUp { follow_up, .. } => follow_up::ask(c, t, follow_up).await,
    }
}

/// What a follow-up's model is offered: no tools (it tells, it does not act).
static NO_TOOLS: LazyLock<Registry> = LazyLock::new(Registry::empty);

/// The tools a slot may be offered: none for a user in crisis.
fn tools_for(crisis: bool) -> &'static Registry {
    match crisis {
        true => &NO_TOOLS,
        false => &REGISTRY,
    }
}

impl Kind<'_> {
    /// The kind's name on the agent span.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Kind::Dm(_) => "dm",
            Kind::Group { .. } => "group",
            Kind::FollowUp { .. } => "follow_up",
        }
    }

    /// Several people read the conversation (a group chat): its history rows say so, its disclosure is
    /// the conversation's, a referral in it is private to its user, each companion speaking has an
    /// agent span of its own, and a message names its speaker.
    pub(crate) fn shared(&self) -> bool {
        matches!(self, Kind::Group { .. })
    }

    /// The DM that came in: the head of a burst, and the one kind whose answers memory learns from.
    pub(crate) fn dm(&self) -> Option<&DmEvent> {
        match self {
            Kind::Dm(e) => Some(e),
            _ => None,
        }
    }

    /// The news a follow-up tells (not held while a moderator pauses the conversation: it is dropped).
    pub(crate) fn follow_up(&self) -> Option<&FollowUp<'_>> {
        match self {
            Kind::FollowUp { follow_up, .. } => Some(follow_up),
            _ => None,
        }
    }

    /// The user message that came in, for the incoming hook; none for a follow-up.
    pub(crate) fn message(&self) -> Option<UserMessage<'_>> {
        match self {
            Kind::Dm(e) => Some(UserMessage::of(e)),
            Kind::Group { event, .. } => Some(group::message(event)),
            Kind::FollowUp { .. } => None,
        }
    }

    /// The user messages a companion message answers (a DM and the later messages of its burst, or the
    /// group message), as history rows keep them; none for a follow-up.
    pub(crate) fn answered(&self, burst: &Burst) -> Vec<Answered> {
        match self {
            Kind::Dm(e) => std::iter::once(Answered::of(e))
                .chain(burst.events(e).iter().map(Answered::of))
                .collect(),
            Kind::Group { event, .. } => vec![Answered::of(&event.to_bot(event.sender_id))],
            Kind::FollowUp { .. } => Vec::new(),
        }
    }

    /// What its messages answer, for the completion event.
    pub(crate) fn answers(&self) -> Answers {
        match self {
            Kind::Dm(e) => Answers::Dm(e.message_id),
            Kind::Group { event, .. } => Answers::Group(event.message_id),
            Kind::FollowUp { follow_up, .. } => Answers::News(follow_up.trigger.clone()),
        }
    }
}
