//! The one conversation pipeline. Every message a companion sends, the answer to a DM (and its burst),
//! the answers to a group message, a follow-up on a signal, is one job of the journal
//! ([`crate::journal`]) and takes this path, in this order:
//!
//! | # | stage | DM | group message | follow-up | steps |
//! |---|---|---|---|---|---|
//! | 1 | admit ([`input`]) | a known companion; the conversation joins the sender and it | the conversation has the sender; its companions | the signal's news ([`crate::proactive`]) and its thread | |
//! | 2 | open the job (a settled one is acknowledged again) | message id | message id | `<kind>:<id>` | |
//! | 3 | incoming hook ([`hooks`]): the crisis screen, and its referral, record and alert | the message | the message | | `referral`, `crisis`, `referral_message`, `alert` |
//! | 4 | gate | a pause (held), under 13, the flood limit | who answers ([`crate::group`]), a pause, under 13, the flood limit | stale news, a companion blocked or gone, a pause, under 13, a minor's quiet hours, the daily cap | `under_13`, `flood`; `route`, `flood`; `gate`, `cap` |
//! | 5 | take in | the burst, each message through the incoming hook | | the flow the news moves on | `burst`; `flow_change` |
//! | 6 | plan | one reply | the routed companions, then their hand-overs, bounded | one message | |
//! | 7 | each slot: compose → converse → outgoing hook → fix ([`compose`]) | the model, with tools | the model, with tools, as that companion | the model without tools, or the plain line | `flow`, `llm`, `tool`, `quota`, `reply` |
//! | 8 | each slot: deliver ([`deliver`]) | dm_messages, history, the conversation, the completion | the same | the same | `store_reply`, `history`, `touch`, `publish` |
//! | 9 | finish | memory hears of the turn; done, limited (the busy line) or held (paused) | done, limited, held, or dropped with the reason | done, or dropped with the reason | `memory_trigger`; the job's state |
//!
//! Over the flood limit the first speaker says the busy line instead (once per window), or the message
//! is kept in history unanswered. A job whose attempts fail ends through [`Turns::fail`]: the messages
//! fixed before are delivered, else the first speaker's failure line. Step names and keys are in
//! [`crate::journal::names`]; every step is keyed so that doing it twice is harmless.
//!
//! Errors carry their class ([`Classify`]); the worker's settlement decides what to do about them.

pub(crate) mod burst;
pub(crate) mod compose;
pub(crate) mod deliver;
pub(crate) mod hooks;
pub(crate) mod input;
pub(crate) mod prompt;
pub(crate) mod tool_loop;

use std::sync::Arc;

use bson::oid::ObjectId;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{debug, info};

pub use burst::Burst;
pub(crate) use input::Input;

use crate::{
    bus::{Bus, BusError, event::InvalidEvent},
    character::Characters,
    config::TurnConfig,
    failure::{Class, Classify},
    flood::FloodLimit,
    flow::{self, Flows, state::Applied},
    group::{self, Bounds, Member, Route},
    journal::{
        Attempt, Finish, Job, Journal, JournalError, State,
        names::{
            key::{self, Slot},
            step,
        },
    },
    llm::{LlmClient, LlmError},
    metrics::Metrics,
    order::{Order, OrderError},
    proactive::{self, ProactiveError},
    rag::Retriever,
    safety::age::Age,
    spend::SpendGuard,
    store::{Mongo, Pg, StoreError, pg::GroupLine},
    timing::{Stage, stage},
    tools::ToolError,
};
use deliver::Delivered;
use input::{Admitted, Kind};

/// The kind of a DM turn's job.
pub(crate) const JOB_KIND: &str = "turn";

/// Why a deleted message (or an erased user's) is not answered.
pub(crate) const DELETED: &str = "deleted";

/// How a job ended well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The message (the last of a group's) was written and published.
    Answered { reply_id: String },
    /// Over the user's flood limit: answered by the busy line, or by none when it was already said
    /// within the window.
    Limited { reply_id: Option<String> },
    /// An earlier delivery already settled this job.
    AlreadySettled { state: State },
    /// No message, on purpose, for the reason given: a group message nobody answers (an
    /// acknowledgement, a companion's own), a follow-up not sent.
    Dropped { reason: String },
    /// Kept in history unanswered: a moderator paused the conversation (a resume may answer it).
    Held,
}

impl Outcome {
    /// The outcome's name in metrics (`outcome="…"`) and in the turn's timing record.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Answered { .. } => "answered",
            Self::Limited { .. } => "limited",
            Self::AlreadySettled { .. } => "already_done",
            Self::Dropped { .. } => "dropped",
            Self::Held => "held",
        }
    }
}

/// A job's outcome and the last stream sequence it settled (its burst's last message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settled {
    pub(crate) outcome: Outcome,
    /// Stream sequence of the last message of the burst, when the turn answered more than one.
    pub(crate) through_seq: Option<u64>,
}

/// Where an input came from: its stream sequence and, for a conversation's message, the conversation's
/// order (a DM takes in the rest of its burst from there).
pub(crate) struct Delivery<'a> {
    pub(crate) order: Option<&'a Order>,
    pub(crate) subject: &'a str,
    pub(crate) seq: u64,
}

/// Why a job did not end well; its [`Class`] says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error("invalid event: {0}")]
    Invalid(#[from] InvalidEvent),
    #[error(transparent)]
    Signal(#[from] ProactiveError),
    #[error("no character for bot {0}")]
    UnknownBot(String),
    #[error("conversation {0} does not exist")]
    MissingConversation(String),
    #[error("sender or bot is not a participant of conversation {0}")]
    NotParticipant(String),
    #[error("group conversation {0} has no companion among its participants")]
    NoCompanion(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Order(#[from] OrderError),
    #[error(transparent)]
    Llm(#[from] LlmError),
    #[error("the journal holds a reply id that is not an ObjectId: {0}")]
    BadReplyId(String),
    #[error("the turn took longer than {0} s (COMPANION_TURN_TIMEOUT_SECS)")]
    TimedOut(u64),
    #[error(transparent)]
    Memory(#[from] crate::memory::MemoryError),
    /// A tool call left without a result the model could read (see [`ToolResult::record`]); its class is
    /// the tool error's own.
    ///
    /// [`ToolResult::record`]: crate::tools::ToolResult::record
    #[error(transparent)]
    Tool(#[from] ToolError),
}

impl Classify for TurnError {
    fn class(&self) -> Class {
        match self {
            Self::Invalid(_)
            | Self::UnknownBot(_)
            | Self::MissingConversation(_)
            | Self::NotParticipant(_)
            | Self::NoCompanion(_) => Class::Reject,
            Self::Signal(e) => e.class(),
            Self::Store(e) => e.class(),
            Self::Journal(e) => e.class(),
            Self::Bus(e) => e.class(),
            Self::Order(e) => e.class(),
            Self::Llm(e) => e.class(),
            Self::BadReplyId(_) => Class::Permanent,
            Self::TimedOut(_) => Class::Transient,
            Self::Memory(e) => e.class(),
            Self::Tool(e) => e.class(),
        }
    }

    fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::Llm(e) => e.retry_after(),
            _ => None,
        }
    }
}

/// The `flood` step: who answers this message when the user is over the limit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FloodDecision {
    /// `None`: under the limit, the turn goes ahead. This turn's own id: it says the busy line. Another
    /// turn's id: that turn's busy line already answered this minute.
    pub by: Option<String>,
}

/// A companion message, as its model or its character wrote it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reply {
    /// `_id` of the message in dm_messages.
    pub id: String,
    pub content: String,
    pub rich_content: Option<Value>,
    pub at: DateTime<Utc>,
    /// Compact log of the tool calls behind it, kept on the assistant's history row.
    pub tool_log: Option<Value>,
    /// What it is for the app (a referral, a disclosure, a break reminder, private to one user).
    #[serde(default, flatten)]
    pub marks: crate::safety::Marks,
}

impl Reply {
    pub(crate) fn new(
        content: String,
        rich_content: Option<Value>,
        tool_log: Option<Value>,
    ) -> Self {
        Self {
            id: ObjectId::new().to_hex(),
            content,
            rich_content,
            at: Utc::now(),
            tool_log,
            marks: Default::default(),
        }
    }
}

/// The `reply` step: one companion message of a job, fixed before it is delivered, so that every retry
/// delivers the same. A DM's or a follow-up's reads as a plain [`Reply`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Said {
    #[serde(flatten)]
    pub(crate) reply: Reply,
    /// The companion speaking (bot user id, hex) where the job has several (a group); else the job's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) bot: Option<String>,
    /// The companion its text names, which it hands over to (bounds permitting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tags: Option<String>,
    /// A busy, budget or failure line: nobody speaks after it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) last: bool,
}

/// What a job does after its gate.
enum Gate<'a> {
    /// Its messages are planned: the gate let it through (or over the flood limit, with the busy line).
    Go(Plan<'a>),
    /// Over the flood limit with the busy line already said this minute by job `by`: kept in history,
    /// no message.
    Limited { by: String },
    /// No message, on purpose; `keep`: the user's message is kept in history all the same.
    Drop { reason: String, keep: bool },
    /// A moderator paused the conversation: kept in history, held for the resume.
    Hold,
}

/// A fixed line that stands in for the model's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fixed {
    /// The character's crisis line: the model cannot (or may not) answer a user in crisis.
    Crisis,
    /// The one line a user under 13 gets a day.
    Under13,
}

/// Why a message is held (the job's `reason`).
pub(crate) const HELD: &str = "a moderator paused the conversation";
/// Why a user under 13 gets no answer (the job's `reason`), past the day's one line.
pub(crate) const UNDER_13: &str = "the user is under 13: companions do not chat with them";

/// Who speaks, in order (stage 6).
struct Plan<'a> {
    /// The companions that speak first: the DM's or the follow-up's one, a group's routed ones.
    speakers: Vec<Member<'a>>,
    /// Over the flood limit: the first speaker says the busy line, and nobody after.
    busy: bool,
    /// The first speaker says this fixed line, and nobody after.
    fixed: Option<Fixed>,
    /// A group message's route and what its companions see; none for one message.
    group: Option<GroupPlan>,
}

/// What a group message's answers share.
pub(crate) struct GroupPlan {
    route: Route,
    bounds: Bounds,
    /// The group's history before the message.
    history: Vec<GroupLine>,
    /// Names of the group's people and companions by id (hex): read once, by the first companion who
    /// speaks now (none when every message was fixed by an earlier attempt).
    names: tokio::sync::OnceCell<std::collections::HashMap<String, String>>,
}

impl<'a> Plan<'a> {
    fn one(speaker: Member<'a>, busy: bool) -> Self {
        Self {
            speakers: vec![speaker],
            busy,
            fixed: None,
            group: None,
        }
    }

    fn fixed(speaker: Member<'a>, line: Fixed) -> Self {
        Self {
            fixed: Some(line),
            ..Self::one(speaker, false)
        }
    }

    fn slot(&self, n: usize) -> Slot {
        match self.group {
            Some(_) => Slot::Nth(n),
            None => Slot::Only,
        }
    }

    /// Who speaks after `said`, and whether another companion's message handed over to them; none when
    /// the plan is done.
    fn next(&self, said: &[Said], members: &[Member<'a>]) -> Option<(Member<'a>, bool)> {
        if said.last().is_some_and(|s| s.last) {
            return None;
        }
        let Some(g) = &self.group else {
            return said.is_empty().then(|| (self.speakers[0], false));
        };
        let hex = |s: Option<&str>| s.and_then(|b| ObjectId::parse_str(b).ok());
        let so_far: Vec<(ObjectId, Option<ObjectId>)> = said
            .iter()
            .filter_map(|s| Some((hex(s.bot.as_deref())?, hex(s.tags.as_deref()))))
            .collect();
        let route: Vec<ObjectId> = self.speakers.iter().map(|m| m.bot).collect();
        let next = group::route::next_speaker(&route, &so_far, g.bounds)?;
        let member = members.iter().find(|m| m.bot == next.bot).copied()?;
        Some((member, next.handed_over))
    }
}

/// What a turn uses, built once per process from the components.
pub struct Turns {
    pub journal: Journal,
    /// History (`bot_conversations`), reminders, flows.
    pub(crate) pg: Pg,
    pub(crate) mongo: Mongo,
    /// Completions and typing events.
    pub(crate) bus: Bus,
    pub(crate) llm: LlmClient,
    pub(crate) characters: Characters,
    /// The guided flows the characters offer.
    pub(crate) flows: Arc<Flows>,
    /// The tools, built once with the stores they use.
    pub(crate) tools: Arc<crate::tools::Toolbox>,
    pub(crate) retriever: Retriever,
    pub(crate) flood: FloodLimit,
    /// The spend budgets, checked before each paid call.
    pub(crate) spend: Arc<SpendGuard>,
    pub(crate) config: TurnConfig,
    /// Who answers in a group chat and how far companions talk among themselves.
    pub(crate) group: crate::config::GroupConfig,
    /// How long a user's place in a guided flow is kept.
    pub(crate) flow: crate::config::FlowConfig,
    /// The daily cap of follow-ups no user message triggered.
    pub(crate) follow_ups: crate::config::FollowUpConfig,
    /// The crisis protocol, the AI disclosure and what a user's age allows.
    pub(crate) safety: crate::safety::Safety,
    /// The moderation endpoint the crisis screen also asks, when one is configured.
    pub(crate) moderator: Option<crate::llm::moderation::Moderator>,
    /// The caps of what a turn sends the model.
    pub(crate) prompt: crate::config::PromptConfig,
    /// What companions remember about their users (facts, summaries) and deletion.
    pub(crate) memory: crate::memory::Memory,
    pub(crate) metrics: Arc<Metrics>,
}

impl Turns {
    /// Whether `id` is one of the companions' users.
    pub(crate) fn is_companion(&self, id: &ObjectId) -> bool {
        self.characters.by_bot(id).is_some()
    }

    /// The limits inbound events are parsed with.
    pub(crate) fn limits(&self) -> crate::bus::event::EventLimits {
        crate::bus::event::EventLimits::of(&self.config)
    }

    /// Runs one validated DM to completion (no burst: for callers without a stream delivery).
    #[cfg(any(test, feature = "testing"))]
    pub async fn process_dm(&self, event: &crate::bus::DmEvent) -> Result<Outcome, TurnError> {
        Box::pin(self.handle(&Input::Dm(event), None))
            .await
            .map(|s| s.outcome)
    }

    /// Runs one input to completion: the pipeline of the module documentation.
    pub(crate) async fn handle(
        &self,
        input: &Input<'_>,
        delivery: Option<&Delivery<'_>>,
    ) -> Result<Settled, TurnError> {
        // One deadline for the whole attempt: a request a server accepted and never answers must not
        // hold the message (and its conversation behind it) for good.
        let secs = self.config.turn_timeout_secs.max(1);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
        let work = async {
            let mut admitted = stage(Stage::Admit, self.admit(input)).await?;
            admitted.memory = self.probe(&admitted).await?;
            if admitted.memory.gone {
                info!("the message was deleted or its user erased; acknowledged without an answer");
                return Ok(Settled {
                    outcome: Outcome::Dropped {
                        reason: DELETED.into(),
                    },
                    through_seq: None,
                });
            }
            let new_job = admitted.new_job(delivery.map(|d| d.seq));
            let job = stage(Stage::Journal, self.journal.open(&new_job)).await?;
            let attempt =
                job.attempt(async |job| Box::pin(self.conduct(job, &admitted, delivery)).await);
            match Box::pin(attempt).await? {
                Attempt::Ran(settled) => Ok::<_, TurnError>(settled),
                Attempt::Settled => {
                    info!(state = ?job.record.state, attempts = job.record.attempts, "already settled; acknowledging");
                    let settled = already_settled(&job);
                    self.count(&admitted, &settled.outcome, false);
                    Ok(settled)
                }
            }
        };
        // Type-erased: every caller (the worker, replay, a takeover's catch-up) awaits this one future.
        let work: std::pin::Pin<Box<dyn Future<Output = Result<Settled, TurnError>> + Send + '_>> =
            Box::pin(work);
        within(deadline, secs, work).await
    }

    /// Whether a tombstone stops this input (its message was deleted or its user erased, so a redelivery
    /// or a replay cannot bring it back; docs/memory.md), and what memory the turn has: one statement.
    async fn probe(&self, a: &Admitted<'_>) -> Result<crate::memory::Probe, TurnError> {
        let messages: Vec<String> = a.message().map(|m| m.id.to_hex()).into_iter().collect();
        let bot = match a.kind {
            Kind::Dm(_) => a.ids.bot.as_str(),
            _ => "",
        };
        Ok(self.memory.probe(&a.ids.user, bot, &messages).await?)
    }

    /// Stages 4 to 9 for an open job.
    ///
    /// Each stage's future is boxed where it is awaited: an `async fn`'s state is as large as its largest
    /// await, so a turn waiting on the model would otherwise hold room for the gate's and the writes'
    /// database futures (its boxed work was 33 KB per waiting turn before, 2 KB now; docs/benchmark.md).
    async fn conduct(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        delivery: Option<&Delivery<'_>>,
    ) -> Result<Settled, TurnError> {
        // Stage 3: the incoming hook; a crisis gets its referral before anything else.
        let mut crisis = match a.message() {
            Some(m) => Box::pin(self.incoming(job, a, &m)).await?,
            None => None,
        };
        let plan = match Box::pin(self.gate(job, a, crisis.is_some())).await? {
            Gate::Go(plan) => plan,
            Gate::Limited { by } => return Box::pin(self.limited(job, a, &by)).await,
            Gate::Drop { reason, keep } => return Box::pin(self.drop(job, a, &reason, keep)).await,
            Gate::Hold => return Box::pin(self.hold(job, a, &Burst::default())).await,
        };
        let burst = match (&a.kind, plan.busy || plan.fixed.is_some()) {
            (Kind::Dm(event), false) => {
                let fix = Box::pin(self.take_in((job, a.new_job(None)), event, delivery));
                stage(Stage::Order, fix).await?
            }
            _ => Burst::default(),
        };
        if let Some(f) = Box::pin(self.incoming_burst(job, a, &burst)).await? {
            crisis.get_or_insert(f);
        }
        // The turn after one the reply model flagged is answered with the safety brief too.
        let briefed = crisis.is_some()
            || (a.message().is_some() && Box::pin(self.after_model_flag(job)).await?);
        let flow_note = Box::pin(self.move_flow(job, a)).await?;
        let mut said: Vec<Said> = Vec::new();
        let mut fresh = 0;
        while let Some((speaker, handed_over)) = plan.next(&said, &a.members) {
            let slot = plan.slot(said.len());
            if !said.is_empty() {
                // The messages before are recorded as delivered before another companion starts: a
                // crash from here on never sends them (or their completions) again.
                Box::pin(job.flush()).await?;
            }
            let turn = compose::Turn {
                job,
                admitted: a,
                speaker,
                handed_over,
                slot,
                burst: &burst,
                said: &said,
                busy: plan.busy,
                fixed: plan.fixed,
                crisis: briefed,
                group: plan.group.as_ref(),
                flow_note: flow_note.as_deref(),
            };
            // Boxed: the model's part of a turn is a large future, kept off the caller's stack.
            let line = job
                .step(step::REPLY, slot.reply(job.record.generation))
                .run(Box::pin(async {
                    fresh += 1;
                    let said = self.compose(&turn).await?;
                    self.outgoing(a, speaker, said).await
                }))
                .await?;
            // Read when the message is about to be written: a pause holds on every worker at once, and
            // a deletion that came while the model answered stops it.
            let answered: Vec<String> = a.answered(&burst).into_iter().map(|m| m.message).collect();
            let (paused, gone) = Box::pin(self.pg.before_delivery(
                &a.ids.conversation,
                &a.ids.user,
                &answered,
            ))
            .await?;
            if gone && plan.fixed != Some(Fixed::Crisis) {
                return Box::pin(self.deleted_meanwhile(job, a)).await;
            }
            if plan.fixed != Some(Fixed::Crisis) && paused {
                return match a.kind {
                    // News is not held for later: a follow-up is simply not sent.
                    Kind::FollowUp { .. } => Box::pin(self.drop(job, a, HELD, false)).await,
                    _ => Box::pin(self.hold(job, a, &burst)).await,
                };
            }
            if Box::pin(self.deliver(job, a, slot, &burst, &line)).await? == Delivered::Withdrawn {
                return Box::pin(self.deleted_meanwhile(job, a)).await;
            }
            said.push(line);
        }
        let state = if plan.busy {
            State::Limited
        } else {
            State::Done
        };
        Box::pin(self.finish(job, a, &plan, said, &burst, state, fresh > 0, true)).await
    }

    /// The burst's other messages through the incoming hook, each screened; the first crisis among them.
    async fn incoming_burst(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        burst: &Burst,
    ) -> Result<Option<hooks::Flagged>, TurnError> {
        let Kind::Dm(head) = &a.kind else {
            return Ok(None);
        };
        let mut crisis = None;
        for e in burst.events(head) {
            let m = input::UserMessage {
                kind: "dm",
                id: e.message_id,
                sender: e.sender_id,
                text: &e.content,
                images: &e.images,
            };
            if let Some(f) = Box::pin(self.incoming(job, a, &m)).await? {
                crisis.get_or_insert(f);
            }
        }
        Ok(crisis)
    }

    /// Stage 4: the checks inside the job, each decision a step of it.
    async fn gate<'t>(
        &'t self,
        job: &Job,
        a: &Admitted<'t>,
        crisis: bool,
    ) -> Result<Gate<'t>, TurnError> {
        let paused = self.pg.paused(&a.ids.conversation).await?;
        match &a.kind {
            Kind::Dm(_) => {
                let first = a.members[0];
                if paused {
                    return Ok(match crisis {
                        true => Gate::Go(Plan::fixed(first, Fixed::Crisis)),
                        false => Gate::Hold,
                    });
                }
                if a.age == Age::Under13 {
                    return self.under_13_gate(job, a, crisis).await;
                }
                self.flood_gate(job, a, Plan::one(first, false)).await
            }
            Kind::Group { event, .. } => self.group_gate(job, a, event, paused).await,
            Kind::FollowUp { follow_up, access } => {
                // The `gate` step: why the follow-up is dropped, or nothing (it is sent).
                let dropped = job
                    .step(step::GATE, key::ONCE)
                    .lazy()
                    .run(self.follow_up_gate(job, a, follow_up, *access, paused))
                    .await?;
                Ok(match dropped {
                    Some(reason) => Gate::Drop {
                        reason,
                        keep: false,
                    },
                    None => Gate::Go(Plan::one(a.members[0], false)),
                })
            }
        }
    }

    /// A group message: dropped when a companion sent it, held while paused, else the companions the
    /// route picks (a journal step, so a replay picks the same), within the flood limit.
    async fn group_gate<'t>(
        &'t self,
        job: &Job,
        a: &Admitted<'t>,
        event: &crate::bus::GroupEvent,
        paused: bool,
    ) -> Result<Gate<'t>, TurnError> {
        if a.members.iter().any(|m| m.bot == event.sender_id) {
            return Ok(Gate::Drop {
                reason: group::COMPANION_SENDER.into(),
                keep: false,
            });
        }
        // In a group, a user in crisis has the private referral; the group sees nothing of it.
        if paused {
            return Ok(Gate::Hold);
        }
        if a.age == Age::Under13 {
            return self.under_13_gate(job, a, false).await;
        }
        let history = self
            .pg
            .group_history(&a.ids.conversation, self.config.history_limit)
            .await?;
        let route = job
            .step(step::ROUTE, key::ONCE)
            .run(async {
                let members = &a.members;
                let margin = self.group.fit_margin;
                let route = group::decide(&self.retriever, event, members, &history, margin).await;
                Ok::<_, TurnError>(route)
            })
            .await?;
        let speakers: Vec<Member<'t>> = route
            .speakers_among(&a.members)
            .into_iter()
            .filter_map(|b| a.members.iter().find(|m| m.bot == b).copied())
            .collect();
        if speakers.is_empty() {
            return Ok(Gate::Drop {
                reason: route.why,
                keep: true,
            });
        }
        let plan = Plan {
            speakers,
            busy: false,
            fixed: None,
            group: Some(GroupPlan {
                route,
                bounds: Bounds {
                    max_handovers: self.group.max_handovers,
                    max_messages: self.group.max_messages.max(1),
                },
                history,
                names: Default::default(),
            }),
        };
        self.flood_gate(job, a, plan).await
    }

    /// A user under 13: the one fixed line a day (a counted step, tally `under_13:<user>`), else no
    /// answer; a user in crisis gets the character's crisis line after the referral. No model call.
    async fn under_13_gate<'t>(
        &self,
        job: &Job,
        a: &Admitted<'t>,
        crisis: bool,
    ) -> Result<Gate<'t>, TurnError> {
        let first = a.members[0];
        if crisis {
            return Ok(Gate::Go(Plan::fixed(first, Fixed::Crisis)));
        }
        let day = std::time::Duration::from_secs(24 * 3600);
        let tally = crate::journal::names::tally::under_13(&a.ids.user);
        let counted = job
            .counted(step::UNDER_13, key::ONCE, &tally, 1, day, Utc::now())
            .await?;
        Ok(match counted {
            crate::journal::Admission::Exceeded { .. } => Gate::Drop {
                reason: UNDER_13.into(),
                keep: true,
            },
            _ => Gate::Go(Plan::fixed(first, Fixed::Under13)),
        })
    }

    /// The flood decision (the `flood` step) for a plan whose first speaker would say the busy line.
    async fn flood_gate<'t>(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        mut plan: Plan<'t>,
    ) -> Result<Gate<'t>, TurnError> {
        let busy_by = plan.speakers[0].bot.to_hex();
        let flood = job
            .step(step::FLOOD, key::ONCE)
            .lazy()
            .run(self.decide_flood(job, &a.ids.user, &busy_by))
            .await?;
        Ok(match flood.by {
            None => Gate::Go(plan),
            Some(by) if by == job.id() => {
                info!("over the flood limit; answering with the busy line");
                plan.busy = true;
                Gate::Go(plan)
            }
            Some(by) => Gate::Limited { by },
        })
    }

    /// The flood decision of a job that has none recorded (`bot` is the companion that would say the
    /// busy line). Only a first attempt takes from the allowance: a retried or replayed job was admitted
    /// already.
    async fn decide_flood(
        &self,
        job: &Job,
        sender: &str,
        bot: &str,
    ) -> Result<FloodDecision, TurnError> {
        if job.record.attempts > 1 {
            return Ok(FloodDecision::default());
        }
        let by = stage(
            Stage::Limits,
            self.flood.decide(&self.journal, job, sender, bot),
        )
        .await?;
        Ok(FloodDecision { by })
    }

    /// A follow-up's checks: the news is still news, the user can still be written to, and the daily cap
    /// has room (a counted step, tally `proactive:<user>`). Why it is dropped, or nothing.
    async fn follow_up_gate(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        f: &proactive::FollowUp<'_>,
        access: input::Access,
        paused: bool,
    ) -> Result<Option<String>, TurnError> {
        let drop = |why: &str| Ok(Some(why.to_owned()));
        if let Some(stale) = &f.stale {
            return drop(stale);
        }
        if let Some(why) = access.refusal() {
            return drop(why);
        }
        if paused {
            return drop(HELD);
        }
        if a.age == Age::Under13 {
            return drop(UNDER_13);
        }
        let tz = a.user.profile.as_ref().and_then(|p| p.time_zone.as_deref());
        let local = crate::safety::age::local(Utc::now(), tz);
        if a.age.is_minor() && self.safety.quiet(local.time()) {
            let c = &self.safety.config;
            return drop(&format!(
                "quiet hours for a minor ({}–{} local; it is {})",
                c.minor_quiet_start.format("%H:%M"),
                c.minor_quiet_end.format("%H:%M"),
                local.format("%H:%M")
            ));
        }
        let cap = self.follow_ups.daily_cap;
        let counted = job
            .counted(
                step::CAP,
                key::ONCE,
                &crate::journal::names::tally::proactive(&a.ids.user),
                cap,
                std::time::Duration::from_secs(24 * 3600),
                Utc::now(),
            )
            .await?;
        if let crate::journal::Admission::Exceeded { .. } = counted {
            return drop(&format!("the user's daily cap of {cap} proactive messages"));
        }
        Ok(None)
    }

    /// Stage 5 of a follow-up: the user's flow with its companion moves on when a waiting step waited
    /// for this news (step `flow_change`/`event`); the note for the brief when it did.
    async fn move_flow(&self, job: &Job, a: &Admitted<'_>) -> Result<Option<String>, TurnError> {
        let Kind::FollowUp { follow_up, .. } = &a.kind else {
            return Ok(None);
        };
        let Some(awaited) = follow_up.awaited() else {
            return Ok(None);
        };
        let applied = flow::state::change(job, key::EVENT, &a.ids.user, &a.ids.bot, |current| {
            Ok::<_, ()>(
                current
                    .filter(|c| c.waiting_for.as_deref() == Some(awaited.as_str()))
                    .filter(|c| c.status == flow::state::status::WAITING)
                    .and_then(|c| Some(flow::resume(self.flows.get(&c.flow)?, c.clone()))),
            )
        })
        .await?;
        let Applied::Changed(Some(s)) = applied else {
            return Ok(None);
        };
        let Some(def) = self.flows.get(&s.flow) else {
            return Ok(None);
        };
        info!(flow = %s.flow, step = %s.step, status = %s.status, "the news moved the user's flow on");
        Ok(Some(flow::resumed_note(def, &s)))
    }

    /// Stage 9: the job ends in `state`, answered; `fresh` when this attempt composed a message (the
    /// group's counters), `remember` when memory hears of the turn (not for a failure line).
    #[allow(clippy::too_many_arguments)]
    async fn finish(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        plan: &Plan<'_>,
        said: Vec<Said>,
        burst: &Burst,
        state: State,
        fresh: bool,
        remember: bool,
    ) -> Result<Settled, TurnError> {
        let Some(last) = said.last() else {
            return self.drop(job, a, "no companion left to speak", false).await;
        };
        if let Kind::Dm(_) = a.kind
            && remember
            && self.memory.config.enabled
        {
            // Before the job settles, as a step: a crash after the reply publishes it on the retry.
            let waiting = a.memory.waiting + 1 + burst.covers.len() as i64;
            job.step(step::MEMORY_TRIGGER, job.record.generation.to_string())
                .lazy()
                .run(async {
                    let (user, bot) = (&a.ids.user, &a.ids.bot);
                    self.memory
                        .after_turn(&self.bus, user, bot, job.id(), waiting)
                        .await
                })
                .await?;
        }
        let by = (state == State::Limited).then(|| job.id());
        let ending = Finish { by, reason: None };
        if !stage(Stage::Writes, job.finish(state, ending)).await? {
            debug!("the job was settled elsewhere meanwhile");
        }
        let reply_id = last.reply.id.clone();
        info!(%reply_id, state = state.as_str(), messages = said.len(), generation = job.record.generation, "delivered");
        let outcome = match state {
            State::Limited => Outcome::Limited {
                reply_id: Some(reply_id),
            },
            _ => Outcome::Answered { reply_id },
        };
        if let Some(g) = &plan.group
            && fresh
        {
            let route = format!("route=\"{}\"", g.route.why);
            self.metrics.inc(group::MESSAGES, &route);
            self.metrics.add(group::ANSWERS, "", said.len() as u64);
        }
        let plain = matches!(&a.kind, Kind::FollowUp { follow_up, .. }
            if last.reply.content.ends_with(&self.outgoing_text(&follow_up.plain)));
        self.count(a, &outcome, plain);
        Ok(Settled {
            outcome,
            through_seq: burst.last_seq(),
        })
    }

    /// No message, on purpose: the job ends `dropped` with the reason (the user's message kept in
    /// history when `keep`).
    /// The job's message, or one of its burst, was deleted (or its user erased) while the model
    /// answered: no reply is written or published (it was built on the deleted words), the job ends
    /// dropped, and then what its steps recorded is scrubbed (after the job's last records are written:
    /// a deletion that committed before this read scrubbed what was recorded then, and this scrubs the
    /// rest). The message itself stays in the history when it was not the one deleted (the history write
    /// leaves out what was).
    async fn deleted_meanwhile(&self, job: &Job, a: &Admitted<'_>) -> Result<Settled, TurnError> {
        let settled = self.drop(job, a, DELETED, true).await?;
        let scrubbed = self.memory.scrub_job(job.id()).await?;
        info!(
            scrubbed,
            "deleted while the model answered: nothing written"
        );
        Ok(settled)
    }

    async fn drop(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        reason: &str,
        keep: bool,
    ) -> Result<Settled, TurnError> {
        if keep {
            self.keep_unanswered(job, a, &Burst::default()).await?;
        }
        let ending = Finish {
            by: None,
            reason: Some(reason),
        };
        job.finish(State::Dropped, ending).await?;
        info!(reason, "no message for this job");
        if let Kind::Group { .. } = a.kind {
            let label = format!("reason=\"{}\"", crate::metrics::label(reason));
            self.metrics.inc(group::SILENCES, &label);
        }
        let outcome = Outcome::Dropped {
            reason: reason.to_owned(),
        };
        self.count(a, &outcome, false);
        Ok(Settled {
            outcome,
            through_seq: None,
        })
    }

    /// Over the flood limit with the busy line already said this minute: the message is kept in history
    /// for the next real answer and settled without a reply of its own.
    async fn limited(&self, job: &Job, a: &Admitted<'_>, by: &str) -> Result<Settled, TurnError> {
        self.keep_unanswered(job, a, &Burst::default()).await?;
        let ending = Finish {
            by: Some(by),
            reason: None,
        };
        job.finish(State::Limited, ending).await?;
        info!(answered_by = %by, "over the flood limit; the busy line already answered this minute");
        Ok(Settled {
            outcome: Outcome::Limited { reply_id: None },
            through_seq: None,
        })
    }

    /// A moderator paused the conversation: the message (and its burst) is kept in history, and its job
    /// ends `held` for the resume to answer.
    async fn hold(&self, job: &Job, a: &Admitted<'_>, burst: &Burst) -> Result<Settled, TurnError> {
        self.keep_unanswered(job, a, burst).await?;
        let ending = Finish {
            by: None,
            reason: Some(HELD),
        };
        job.finish(State::Held, ending).await?;
        info!("a moderator paused the conversation; the message is held");
        Ok(Settled {
            outcome: Outcome::Held,
            through_seq: burst.last_seq(),
        })
    }

    /// The follow-ups' counter (`companion_proactive_total{kind,outcome}`); answers to users are
    /// counted by the worker.
    fn count(&self, a: &Admitted<'_>, outcome: &Outcome, plain: bool) {
        if let Kind::FollowUp { follow_up, .. } = &a.kind {
            let name = match outcome {
                Outcome::Answered { .. } if plain => "sent_plain",
                Outcome::Answered { .. } | Outcome::Limited { .. } => "sent",
                other => other.name(),
            };
            let labels = format!("kind=\"{}\",outcome=\"{name}\"", follow_up.trigger.kind);
            self.metrics.inc(proactive::PROACTIVE, &labels);
        }
    }

    /// The end of a job whose attempts failed: the messages fixed before the failure are delivered, else
    /// the first speaker's failure line, once like any message; never over a settled job.
    pub(crate) async fn fail(&self, input: &Input<'_>, reason: &str) -> Result<Settled, TurnError> {
        let a = self.admit(input).await?;
        let job = self.journal.open(&a.new_job(None)).await?;
        let attempt = job.attempt(async |job| {
            self.journal.note_error(job.id(), reason).await?;
            self.fail_slots(job, &a).await
        });
        match attempt.await? {
            Attempt::Ran(settled) => Ok(settled),
            Attempt::Settled => {
                info!(state = ?job.record.state, "settled after all; no failure line");
                Ok(already_settled(&job))
            }
        }
    }

    async fn fail_slots(&self, job: &Job, a: &Admitted<'_>) -> Result<Settled, TurnError> {
        let burst = job
            .recorded::<Burst>(step::BURST, key::ONCE)
            .unwrap_or_default();
        let busy = job
            .recorded::<FloodDecision>(step::FLOOD, key::ONCE)
            .is_some_and(|f| f.by.as_deref() == Some(job.id()));
        let route = job.recorded::<Route>(step::ROUTE, key::ONCE);
        let first = route
            .as_ref()
            .and_then(|r| r.speakers_among(&a.members).first().copied())
            .and_then(|b| a.members.iter().find(|m| m.bot == b).copied())
            .unwrap_or(a.members[0]);
        let group = matches!(a.kind, Kind::Group { .. }).then(|| GroupPlan {
            route: route.unwrap_or_default(),
            bounds: Bounds {
                max_handovers: 0,
                max_messages: 1,
            },
            history: Vec::new(),
            names: Default::default(),
        });
        let plan = Plan {
            group,
            ..Plan::one(first, busy)
        };
        let generation = job.record.generation;
        let failed = std::sync::atomic::AtomicBool::new(false);
        let first_line = job
            .step(step::REPLY, plan.slot(0).reply(generation))
            .run(async {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                // A user in crisis is owed the character's crisis line, not a failure.
                let crisis = a.message().is_some_and(|m| {
                    job.recorded::<hooks::Flagged>(step::CRISIS, &m.id.to_hex())
                        .is_some()
                });
                let c = first.character;
                let line = match crisis {
                    true => c.crisis_line.clone(),
                    false => c.failure_line.clone(),
                };
                self.outgoing(a, first, self.line(a, first, line)).await
            })
            .await?;
        let mut said = vec![first_line];
        while plan.group.is_some()
            && let Some(s) =
                job.recorded::<Said>(step::REPLY, &plan.slot(said.len()).reply(generation))
        {
            said.push(s);
        }
        for (n, s) in said.iter().enumerate() {
            // A failure line withdrawn (its user erased meanwhile) ends the job failed all the same.
            let _ = self.deliver(job, a, plan.slot(n), &burst, s).await?;
        }
        let state = match (failed.into_inner(), busy) {
            (true, _) => State::Failed,
            (false, true) => State::Limited,
            (false, false) => State::Done,
        };
        self.finish(job, a, &plan, said, &burst, state, false, false)
            .await
    }

    /// Opens a settled job again for `companion replay`: a failed one resumes from its journal (the model's
    /// recorded answers are not paid again); `fresh` asks the model anew. Either way the flood decision is
    /// made again (a replay is never limited), and when the last generation has a message the next one
    /// answers.
    pub(crate) async fn reopen(&self, id: &str, fresh: bool) -> Result<(), JournalError> {
        let forget: &[&str] = match fresh {
            true => &[step::FLOOD, step::LLM, step::ROUTE],
            false => &[step::FLOOD],
        };
        self.journal.reopen(id, forget).await
    }
}

/// `fut`, unless the attempt's deadline passes first.
async fn within<T, E: Into<TurnError>>(
    deadline: tokio::time::Instant,
    secs: u64,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, TurnError> {
    match tokio::time::timeout_at(deadline, fut).await {
        Ok(r) => r.map_err(Into::into),
        Err(_) => Err(TurnError::TimedOut(secs)),
    }
}

/// A job the journal says is settled is acknowledged again, with what its reply covered.
fn already_settled(job: &Job) -> Settled {
    Settled {
        through_seq: job
            .recorded::<Burst>(step::BURST, key::ONCE)
            .and_then(|b| b.last_seq()),
        outcome: Outcome::AlreadySettled {
            state: job.record.state,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_error_keeps_its_class_in_the_turn() {
        let retried = |e: ToolError| TurnError::from(e).class() == Class::Transient;
        for e in [
            ToolError::Forbidden("not yours".into()),
            ToolError::NotFound("no such list".into()),
            ToolError::invalid("name", "too long"),
            ToolError::Crashed,
        ] {
            let text = e.to_string();
            let turn = TurnError::from(e);
            assert_eq!(turn.class(), Class::Permanent, "{text}");
            assert!(
                !matches!(turn, TurnError::Store(_)),
                "never a database error: {turn:?}"
            );
        }
        assert!(retried(ToolError::Store(StoreError::Pg(
            sqlx::Error::PoolTimedOut
        ))));
    }
}
