//! Stage 1: what comes in, and its admission, the checks every input passes before anything is written
//! for it. A DM needs a known companion and a conversation that joins the sender and it; a group message
//! a conversation that has the sender and at least one companion; a follow-up, a signal whose news names
//! a companion, a user and a thread ([`crate::proactive`]). What fails here is rejected (a dead letter,
//! no reply), except a follow-up whose user left, blocked the companion or lost the conversation: that
//! is the gate's to drop, inside the job. The conversation and the user's data come from one MongoDB
//! round trip, whatever the input.

use bson::oid::ObjectId;
use chrono::{DateTime, Utc};

use std::sync::Arc;

use super::{PipelineError, prompt};
use crate::{
    bus::{DmEvent, GroupEvent, Inbound, Names, event::EventLimits},
    character::Characters,
    group::Member,
    journal::NewJob,
    memory::Memory,
    proactive::{self, FollowUp, ProactiveError},
    safety::{Age, Safety},
    store::{Membership, Mongo, Pg, UserData},
};
use crate::{config::Config, parts::Parts};

/// A user's message as the incoming hook sees it.
pub(crate) struct UserMessage<'a> {
    /// `dm` or `group`.
    pub(crate) kind: &'static str,
    pub(crate) id: ObjectId,
    pub(crate) sender: ObjectId,
    pub(crate) text: &'a str,
    pub(crate) images: &'a [String],
}

impl<'a> UserMessage<'a> {
    /// A DM (a later message of a burst).
    pub(crate) fn of(e: &'a DmEvent) -> Self {
        Self {
            kind: "dm",
            id: e.message_id,
            sender: e.sender_id,
            text: &e.content,
            images: &e.images,
        }
    }
}

/// An input of the pipeline.
pub(crate) enum Input<'a> {
    /// A DM to one companion.
    Dm(&'a DmEvent),
    /// A message to a group conversation.
    Group(&'a GroupEvent),
    /// A signal (`<prefix>.signal.<kind>.<id>`): news a companion follows up on.
    Signal { subject: &'a str, payload: &'a [u8] },
}

impl<'a> From<&'a Inbound> for Input<'a> {
    fn from(event: &'a Inbound) -> Self {
        match event {
            Inbound::Dm(e) => Input::Dm(e),
            Inbound::Group(e) => Input::Group(e),
        }
    }
}

/// What differs between the kinds of job (each kind's behaviour: `kind/`).
pub(crate) enum Kind<'t> {
    Dm(DmEvent),
    Group {
        event: GroupEvent,
        /// Every participant, for display names.
        participants: Vec<ObjectId>,
    },
    FollowUp {
        follow_up: FollowUp<'t>,
        access: Reach,
    },
}

/// Whether a follow-up's user can still be written to in its thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    Open,
    /// The conversation no longer exists.
    Missing,
    /// The user or the companion left it.
    Left,
    /// The user blocked the companion.
    Blocked,
}

impl Reach {
    /// Why nothing may be sent, if so.
    pub(crate) fn refusal(self) -> Option<&'static str> {
        match self {
            Reach::Open => None,
            Reach::Missing => Some("the conversation no longer exists"),
            Reach::Left => Some("the user or the companion left the conversation"),
            Reach::Blocked => Some("the user blocked the companion"),
        }
    }
}

/// An input, admitted: the job it opens and what the rest of the pipeline knows of it.
pub(crate) struct Admitted<'t> {
    pub(crate) kind: Kind<'t>,
    /// The user's profile, tricklists and blocks.
    pub(crate) user: UserData,
    /// The companions that may speak, in the conversation's order: the DM's or the follow-up's one, a
    /// group's every one.
    pub(crate) members: Vec<Member<'t>>,
    pub(crate) ids: Ids,
    /// What the user's age allows, from the users document (unknown: as configured).
    pub(crate) age: Age,
    /// Memory, read with the job's opening ([`crate::memory::PROBE_GUARD`]); unset before it.
    memory: std::sync::OnceLock<crate::memory::MemoryCheck>,
}

/// The job's ids; hex forms as the stores key them.
pub(crate) struct Ids {
    pub(crate) user_id: ObjectId,
    pub(crate) conversation_id: ObjectId,
    pub(crate) job: String,
    pub(crate) kind: String,
    /// The user the job acts for (the sender, or the one a follow-up is for).
    pub(crate) user: String,
    /// The companion acting; empty for a group message, where several may.
    pub(crate) bot: String,
    pub(crate) conversation: String,
}

impl Admitted<'_> {
    /// The GenAI agent span of companion `m` doing this job.
    pub(crate) fn agent_span(&self, m: Member<'_>) -> tracing::Span {
        let kind = self.kind.name();
        crate::genai::agent(&m.character.name, &m.bot, &self.ids.conversation, kind)
    }

    /// What the probe found ([`Admitted::probed`]); nothing remembered nor waiting before it ran.
    pub(crate) fn memory(&self) -> crate::memory::MemoryCheck {
        self.memory.get().copied().unwrap_or_default()
    }

    /// Keeps what the probe found with the job's opening.
    pub(crate) fn probed(&self, check: crate::memory::MemoryCheck) {
        let _ = self.memory.set(check);
    }

    /// The id of the message that came in, if any, as the tombstones key it.
    pub(crate) fn message_ids(&self) -> Vec<String> {
        self.message().map(|m| m.id.to_hex()).into_iter().collect()
    }

    /// The probe that guards the job's opening: whether a tombstone stops this input (its message was
    /// deleted or its user erased, so a redelivery or a replay cannot bring it back; docs/memory.md), and
    /// what memory the turn has. `messages` are [`Admitted::message_ids`].
    pub(crate) fn probe_guard<'a>(&'a self, messages: &'a [String]) -> crate::journal::Guard<'a> {
        // Memory is a DM's: a group message or a follow-up probes the user's tombstones only.
        let bot = self.kind.dm().map_or("", |_| self.ids.bot.as_str());
        crate::journal::Guard {
            sql: crate::memory::PROBE_GUARD,
            user: &self.ids.user,
            bot,
            messages,
        }
    }

    pub(crate) fn new_job(&self, stream_seq: Option<u64>) -> NewJob<'_> {
        NewJob {
            id: &self.ids.job,
            kind: &self.ids.kind,
            user: &self.ids.user,
            bot: &self.ids.bot,
            conversation: &self.ids.conversation,
            stream_seq,
            reads: Default::default(),
        }
    }

    /// The user message that came in, for the incoming hook.
    pub(crate) fn message(&self) -> Option<UserMessage<'_>> {
        self.kind.message()
    }

    /// The user messages a companion message answers, as history rows keep them.
    pub(crate) fn answered(&self, burst: &super::Burst) -> Vec<Answered> {
        self.kind.answered(burst)
    }
}

/// A user message as its history row keeps it.
pub(crate) struct Answered {
    pub(crate) message: String,
    pub(crate) text: String,
    pub(crate) sent_at: DateTime<Utc>,
}

impl Answered {
    pub(crate) fn of(e: &DmEvent) -> Self {
        Self {
            message: e.message_id.to_hex(),
            text: prompt::history_text(e),
            sent_at: e.sent_at,
        }
    }
}

/// Stage 1, with what admission reads.
pub(crate) struct Admission {
    pub(crate) characters: Characters,
    /// The conversation and the user's data, in one round trip.
    pub(crate) mongo: Mongo,
    /// What a signal's news is read against (reminders, flows).
    pub(crate) pg: Pg,
    /// The subjects a signal's kind and id are read from.
    pub(crate) names: Names,
    /// How a user's age is read from their document.
    pub(crate) safety: Arc<Safety>,
    /// The bounds an inbound event is parsed with.
    pub(crate) limits: EventLimits,
    /// The tombstones and what the companion remembers, read before the job opens.
    pub(crate) memory: Memory,
}

impl Admission {
    /// Stage 1 from the shared handles (`turn`: the bounds an inbound event is parsed with).
    pub(crate) fn new(p: &Parts, c: &Config) -> Self {
        Self {
            characters: p.characters.clone(),
            mongo: p.mongo.clone(),
            pg: p.pg.clone(),
            names: p.bus.names.clone(),
            safety: p.safety.clone(),
            limits: EventLimits::of(&c.turn),
            memory: p.memory.clone(),
        }
    }
}

impl Admission {
    /// How many companions there are.
    pub(crate) fn companions(&self) -> usize {
        self.characters.count()
    }

    /// Whether `id` is one of the companions' users.
    pub(crate) fn is_companion(&self, id: &ObjectId) -> bool {
        self.characters.by_bot(id).is_some()
    }

    /// The probe's row as the opening returned it.
    pub(crate) fn checked(&self, row: &serde_json::Value) -> crate::memory::MemoryCheck {
        self.memory.checked(row)
    }

    /// Admits `input` (see the module documentation).
    pub(crate) async fn admit<'t>(
        &'t self,
        input: &Input<'_>,
    ) -> Result<Admitted<'t>, PipelineError> {
        match input {
            Input::Dm(e) => self.admit_dm(e).await,
            Input::Group(e) => self.admit_group(e).await,
            Input::Signal { subject, payload } => self.admit_signal(subject, payload).await,
        }
    }

    /// A DM: its companion, the conversation with both in it, the user's data.
    async fn admit_dm<'t>(&'t self, e: &DmEvent) -> Result<Admitted<'t>, PipelineError> {
        let tricklists = prompt::PROMPT_TRICKLISTS;
        let character = self
            .characters
            .by_bot(&e.bot_id)
            .ok_or_else(|| PipelineError::UnknownBot(e.bot_id.to_hex()))?;
        let found = self
            .mongo
            .admit(e.conversation_id, e.sender_id, tricklists)
            .await?;
        let conversation = e.conversation_id.to_hex();
        let mut admission =
            found.ok_or(PipelineError::MissingConversation(conversation.clone()))?;
        if !(admission.joins(e.sender_id) && admission.joins(e.bot_id)) {
            return Err(PipelineError::NotParticipant(conversation));
        }
        Ok(Admitted {
            ids: Ids {
                user_id: e.sender_id,
                conversation_id: e.conversation_id,
                job: e.message_id.to_hex(),
                kind: super::JOB_KIND.to_owned(),
                user: e.sender_id.to_hex(),
                bot: e.bot_id.to_hex(),
                conversation,
            },
            kind: Kind::Dm(e.clone()),
            age: self.age_of(&mut admission.user),
            user: admission.user,
            memory: Default::default(),
            members: vec![Member {
                bot: e.bot_id,
                character,
            }],
        })
    }

    /// A group message: the conversation with its sender in it and at least one companion.
    async fn admit_group<'t>(&'t self, e: &GroupEvent) -> Result<Admitted<'t>, PipelineError> {
        let tricklists = prompt::PROMPT_TRICKLISTS;
        let conversation = e.conversation_id.to_hex();
        let mut admission = self
            .mongo
            .admit(e.conversation_id, e.sender_id, tricklists)
            .await?
            .ok_or(PipelineError::MissingConversation(conversation.clone()))?;
        if !admission.joins(e.sender_id) {
            return Err(PipelineError::NotParticipant(conversation));
        }
        let members: Vec<Member<'t>> = admission
            .participants
            .iter()
            .filter_map(|p| {
                let character = self.characters.by_bot(p)?;
                Some(Member { bot: *p, character })
            })
            .collect();
        if members.is_empty() {
            return Err(PipelineError::NoCompanion(conversation));
        }
        Ok(Admitted {
            ids: Ids {
                user_id: e.sender_id,
                conversation_id: e.conversation_id,
                job: e.message_id.to_hex(),
                kind: crate::group::JOB_KIND.to_owned(),
                user: e.sender_id.to_hex(),
                bot: String::new(),
                conversation,
            },
            kind: Kind::Group {
                event: e.clone(),
                participants: admission.participants,
            },
            age: self.age_of(&mut admission.user),
            user: admission.user,
            memory: Default::default(),
            members,
        })
    }

    /// A signal: the news it carries, read against the app's data, and the thread it goes to.
    async fn admit_signal<'t>(
        &'t self,
        subject: &str,
        payload: &[u8],
    ) -> Result<Admitted<'t>, PipelineError> {
        let tricklists = prompt::PROMPT_TRICKLISTS;
        let (kind, id) = self
            .names
            .signal_parts(subject)
            .ok_or_else(|| ProactiveError::Invalid(format!("unexpected subject {subject}")))?;
        let sources = proactive::Sources {
            mongo: &self.mongo,
            pg: &self.pg,
            characters: &self.characters,
        };
        let max = self.limits.max_event_bytes;
        let f = proactive::read(sources, kind, id, payload, max).await?;
        let span = tracing::Span::current();
        span.record("job", f.job_id());
        span.record("conversation_id", f.conversation.to_hex());
        let found = self.mongo.admit(f.conversation, f.user, tricklists).await?;
        let (access, mut user) = follow_up_access(found, &f);
        Ok(Admitted {
            ids: Ids {
                user_id: f.user,
                conversation_id: f.conversation,
                job: f.job_id(),
                kind: f.trigger.kind.clone(),
                user: f.user.to_hex(),
                bot: f.bot.to_hex(),
                conversation: f.conversation.to_hex(),
            },
            members: vec![Member {
                bot: f.bot,
                character: f.character,
            }],
            kind: Kind::FollowUp {
                follow_up: f,
                access,
            },
            age: self.age_of(&mut user),
            user,
            memory: Default::default(),
        })
    }

    /// The user's age; the users document is let go once read (a waiting turn does not hold it).
    fn age_of(&self, user: &mut UserData) -> Age {
        self.safety.age(user.document.take().as_ref(), Utc::now())
    }
}

/// Whether the follow-up may reach its user, and the user's data when it may.
fn follow_up_access(found: Option<Membership>, f: &FollowUp<'_>) -> (Reach, UserData) {
    match found {
        None => (Reach::Missing, UserData::default()),
        Some(a) if !(a.joins(f.user) && a.joins(f.bot)) => (Reach::Left, a.user),
        Some(a) if a.user.blocks(f.bot) => (Reach::Blocked, a.user),
        Some(a) => (Reach::Open, a.user),
    }
}
