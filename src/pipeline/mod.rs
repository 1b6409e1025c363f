//! The one conversation pipeline. Every message a companion sends, the answer to a DM (and its burst),
//! the answers to a group message, a follow-up on a signal, is one job of the journal
//! ([`crate::journal`]) and takes this path, in this order:
//!
//! | # | stage | DM | group message | follow-up | steps |
//! |---|---|---|---|---|---|
//! | 1 | admit ([`input`]) | a known companion; the conversation joins the sender and it | the conversation has the sender; its companions | the signal's news ([`crate::proactive`]) and its thread | |
//! | 2 | open the job (a settled one is acknowledged again) | message id | message id | `<kind>:<id>` | |
//! | 3 | incoming hook ([`incoming`]): the crisis screen, and its record, referral and alert | the message | the message | | `referral`, `crisis`, `referral_message`, `alert` |
//! | 4 | gate ([`gate`]) | a pause (held), under 13, the flood limit; once through, the reply model's flag on the message before | who answers ([`crate::group`]), a pause, under 13, the flood limit; the same flag | stale news, a companion blocked or gone, a pause, under 13, a minor's quiet hours, the daily cap | `under_13`, `flood`, `after_flag`; `route`, `flood`, `after_flag`; `gate`, `cap` |
//! | 5 | take in ([`burst`]) | the burst, each message through the incoming hook | | the flow the news moves on | `burst`; `flow_change` |
//! | 6 | plan ([`gate::Plan`]) | one reply | the routed companions, then their hand-overs, bounded | one message | |
//! | 7 | each slot: compose → converse → outgoing hook ([`outgoing`]) → fix ([`compose`]) | the model, with tools | the model, with tools, as that companion | the model without tools, or the plain line | `flow`, `llm`, `tool`, `quota`, `reply` |
//! | 8 | each slot: deliver ([`deliver`]) | dm_messages, history, the conversation, the completion | the same | the same | `store_reply`, `history`, `touch`, `publish` |
//! | 9 | finish ([`end`]) | memory hears of the turn; done, limited (the busy line) or held (paused) | done, limited, held, or dropped with the reason | done, or dropped with the reason | `memory_trigger`; the job's state |
//!
//! Over the flood limit the first speaker says the busy line instead (once per window), or the message
//! is kept in history unanswered. A job whose attempts fail ends through [`Pipeline::fail`]: the messages
//! fixed before are delivered, else the first speaker's failure line. Step names and keys are in
//! [`crate::journal::names`]; every step is keyed so that doing it twice is harmless.
//!
//! Each stage is a type that holds what it uses; [`Pipeline`], the conductor, holds only the stages and
//! runs them in this order. Errors carry their class ([`Classify`]); the worker's settlement decides
//! what to do about them.

pub(crate) mod burst;
pub(crate) mod compose;
pub(crate) mod deliver;
pub(crate) mod end;
pub(crate) mod gate;
pub(crate) mod incoming;
pub(crate) mod input;
pub(crate) mod kind;
pub(crate) mod outgoing;
pub(crate) mod prompt;
pub(crate) mod reply;
pub(crate) mod tool_loop;

use std::ops::ControlFlow;

use bson::oid::ObjectId;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::{Instrument as _, info};

pub use burst::Burst;
pub(crate) use input::Input;

use crate::{
    bus::{BusError, event::EventLimits, event::InvalidEvent},
    conversation_order::{Order, OrderError},
    failure::{Class, Classify},
    genai,
    journal::{
        Attempt, Job, Journal, JournalError, Opened, State, StepKind, Telling, Told, names::key,
    },
    llm::LlmError,
    proactive::ProactiveError,
    safety::Decision,
    store::StoreError,
    timing::{Stage, stage},
    tools::ToolError,
};
use crate::{config::Config, parts::Parts};
use burst::{TakeIn, Taken};
use compose::{Composer, SlotView};
use deliver::{Delivered, Delivery, How, Sent};
use end::{Ended, Ending, Endings};
use gate::{Gate, Passage, Plan};
use incoming::{Flagged, Incoming};
use input::{Admission, Admitted, UserMessage};
use outgoing::Outgoing;
pub(crate) use reply::REFERRAL_MESSAGE;
pub use reply::{REPLY, Reply};

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
    /// The order floor was moved past this sequence with the job's settlement
    /// ([`Carried::settles_floor`](companion_journal::Carried::settles_floor)); the worker then writes it no more.
    pub(crate) floored: Option<u64>,
}

/// Where an input came from: its stream sequence and, for a conversation's message, the conversation's
/// order (a DM takes in the rest of its burst from there).
pub(crate) struct Arrival<'a> {
    pub(crate) order: Option<&'a Order>,
    pub(crate) subject: &'a str,
    pub(crate) seq: u64,
}

/// Why a job did not end well; its [`Class`] says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
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

impl Classify for PipelineError {
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

/// The journal steps the pipeline records, each told as `companion explain` tells it.
pub(crate) const STEPS: &[&dyn crate::journal::Tell] = &[
    &incoming::SCREEN,
    &incoming::CRISIS,
    &incoming::REFERRAL,
    &REFERRAL_MESSAGE,
    &incoming::ALERT,
    &gate::AFTER_FLAG,
    &kind::follow_up::GATE,
    &gate::UNDER_13_LINE,
    &kind::follow_up::CAP,
    &FLOOD,
    &burst::BURST,
    &kind::dm::FLOW,
    &reply::FIXED_LINE,
    &REPLY,
    &deliver::STORE_REPLY,
    &deliver::HISTORY,
    &deliver::TOUCH,
    &deliver::PUBLISH,
    &deliver::WITHDRAW,
    &end::MEMORY_TRIGGER,
];

/// Over the flood limit or not, and who says the busy line ([`crate::flood`]). Keyed once; lazy.
pub const FLOOD: StepKind<FloodDecision> = StepKind::new("flood").packed().told(tell_flood);

fn tell_flood(t: &Told<'_>, f: &FloodDecision) -> Telling {
    match &f.by {
        None => (
            "gate: under the flood limit".into(),
            json!({ "limited": false }),
        ),
        Some(by) if by == t.job => (
            "gate: OVER the flood limit; this job says the busy line".into(),
            json!({ "limited": true, "busy_line_by": by }),
        ),
        Some(by) => (
            format!("gate: OVER the flood limit; job {by}'s busy line answers it"),
            json!({ "limited": true, "busy_line_by": by }),
        ),
    }
}

/// The `flood` step's record: who answers this message when the user is over the limit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FloodDecision {
    /// `None`: under the limit, the turn goes ahead. This turn's own id: it says the busy line. Another
    /// turn's id: that turn's busy line already answered this minute.
    pub by: Option<String>,
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

/// The conductor: the pipeline's stages, and the order it runs them in. Built once per process by
/// [`crate::startup::App::build`].
pub struct Pipeline {
    pub journal: Journal,
    pub(crate) admission: Admission,
    pub(crate) incoming: Incoming,
    pub(crate) gate: Gate,
    pub(crate) take_in: TakeIn,
    pub(crate) composer: Composer,
    pub(crate) outgoing: Outgoing,
    pub(crate) delivery: Delivery,
    pub(crate) end: Endings,
    /// One attempt's deadline (`COMPANION_TURN_TIMEOUT_SECS`).
    pub(crate) timeout_secs: u64,
}

impl Pipeline {
    /// Every stage, each built from the shared handles and its own configuration.
    pub(crate) fn new(p: &Parts, c: &Config) -> Self {
        Self {
            journal: p.journal.clone(),
            admission: Admission::new(p, c),
            incoming: Incoming::new(p),
            gate: Gate::new(p, c),
            take_in: TakeIn::new(p, c),
            composer: Composer::new(p, c),
            outgoing: Outgoing::new(p, c),
            delivery: Delivery::new(p),
            end: Endings::new(p, c),
            timeout_secs: c.turn.turn_timeout_secs,
        }
    }

    /// Whether `id` is one of the companions' users.
    pub(crate) fn is_companion(&self, id: &ObjectId) -> bool {
        self.admission.is_companion(id)
    }

    /// How many companions there are.
    pub(crate) fn companions(&self) -> usize {
        self.admission.companions()
    }

    /// The limits inbound events are parsed with.
    pub(crate) fn limits(&self) -> EventLimits {
        self.admission.limits
    }

    /// Runs one validated DM to completion (no burst: for callers without a stream delivery).
    #[cfg(any(test, feature = "testing"))]
    pub async fn process_dm(&self, event: &crate::bus::DmEvent) -> Result<Outcome, PipelineError> {
        Box::pin(self.handle(&Input::Dm(event), None))
            .await
            .map(|s| s.outcome)
    }

    /// Runs one input to completion: stages 1 and 2, then the job's ([`Pipeline::conduct`]).
    pub(crate) async fn handle(
        &self,
        input: &Input<'_>,
        arrival: Option<&Arrival<'_>>,
    ) -> Result<Settled, PipelineError> {
        // One deadline for the whole attempt: a request a server accepted and never answers must not
        // hold the message (and its conversation behind it) for good.
        let secs = self.timeout_secs.max(1);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
        let work = async {
            let admitted = stage(Stage::Admit, self.admission.admit(input)).await?;
            let mut new_job = admitted.new_job(arrival.map(|d| d.seq));
            // The gate's reads ride with the opening: a moderator's pause, and the reply model's flag on
            // the message before. A pause that comes after this read is held at delivery.
            new_job.reads.paused = true;
            if admitted.message().is_some() {
                new_job.reads.previous = Some(self.gate.flag_read());
            }
            // So does the probe, which stops it first: a tombstone leaves no job row.
            let messages = admitted.message_ids();
            let guard = admitted.probe_guard(&messages);
            let opening = self.journal.open_unless(&new_job, &guard);
            let job = match stage(Stage::Journal, opening).await? {
                Opened::Job(job, probe) => {
                    admitted.probed(self.admission.checked(&probe));
                    job
                }
                Opened::Stopped(_) => {
                    info!(
                        "the message was deleted or its user erased; acknowledged without an answer"
                    );
                    return Ok(Settled {
                        outcome: Outcome::Dropped {
                            reason: DELETED.into(),
                        },
                        through_seq: None,
                        floored: None,
                    });
                }
            };
            let run = async {
                // The job's settlement moves its conversation's order floor too (one statement).
                if let Some(Arrival {
                    order: Some(order),
                    subject,
                    seq,
                }) = arrival
                {
                    job.carried().settles_floor(order.floor_at(subject, *seq));
                }
                let attempt =
                    job.attempt(async |job| Box::pin(self.conduct(job, &admitted, arrival)).await);
                match Box::pin(attempt).await? {
                    Attempt::Ran(settled) => Ok::<_, PipelineError>(settled),
                    Attempt::Settled => {
                        info!(state = ?job.record.state, attempts = job.record.attempts, "already settled; acknowledging");
                        let settled = already_settled(&job);
                        self.end.count(&admitted, &settled.outcome, false);
                        Ok(settled)
                    }
                }
            };
            // A group's companions each get their agent span, around their slot ([`Pipeline::conduct`]).
            if admitted.kind.shared() {
                return run.await;
            }
            let span = admitted.agent_span(admitted.members[0]);
            let result = run.instrument(span.clone()).await;
            settled_on(&span, &result);
            result
        };
        // Type-erased: every caller (the worker, replay, a takeover's catch-up) awaits this one future.
        let work: std::pin::Pin<
            Box<dyn Future<Output = Result<Settled, PipelineError>> + Send + '_>,
        > = Box::pin(work);
        within(deadline, secs, work).await
    }

    /// Stages 3 to 9 for an open job.
    ///
    /// Each stage's future is boxed where it is awaited: an `async fn`'s state is as large as its largest
    /// await, so a turn waiting on the model would otherwise hold room for the gate's and the writes'
    /// database futures (docs/bench/history.md).
    async fn conduct(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        arrival: Option<&Arrival<'_>>,
    ) -> Result<Settled, PipelineError> {
        let (mut crisis, plan) = match Box::pin(self.through_the_gate(job, a)).await? {
            ControlFlow::Continue(go) => go,
            ControlFlow::Break(settled) => return Ok(settled),
        };
        // 5: take in the burst (each of its messages then through the incoming hook) or the news's flow.
        let Taken { burst, flow_note } =
            Box::pin(kind::take_in(&self.take_in, job, a, &plan, arrival)).await?;
        if let Some(f) = Box::pin(self.screen_burst(job, a, &burst)).await? {
            crisis.get_or_insert(f);
        }
        // A message after one the reply model flagged (the gate read it) is answered with the safety
        // brief too.
        let briefed = crisis.is_some() || plan.after_flag;
        let content = Box::pin(self.content_on_spans(a, briefed)).await?;
        // 7 and 8: each slot's message, fixed, then delivered.
        let mut said: Vec<Reply> = Vec::new();
        let mut fresh = 0;
        let mut owed = None;
        while let Some((speaker, handed_over)) = plan.next(&said, &a.members) {
            // A group's companion is an agent of its own; a DM's slot is inside the job's agent span.
            let agent = match plan.group {
                Some(_) => a.agent_span(speaker),
                None => tracing::Span::none(),
            };
            let view = SlotView {
                job,
                admitted: a,
                speaker,
                handed_over,
                slot: plan.slot(said.len()),
                burst: &burst,
                said: &said,
                plan: &plan,
                crisis: briefed,
                flow_note: flow_note.as_deref(),
            };
            let slot = view.slot;
            // The crisis line is owed whatever a moderator or a deletion did meanwhile: no check.
            let check = plan.fixed != Some(Fixed::Crisis);
            let lang = crisis.as_ref().map(|f| f.lang.as_str());
            let line = self.said(&view, lang, content, check, &mut fresh);
            said.push(line.instrument(agent.clone()).await?);
            // The messages before are recorded as delivered before another companion starts: a crash
            // from there on never sends them (or their completions) again.
            let how = How {
                check,
                more: plan.next(&said, &a.members).is_some(),
            };
            let out = self
                .delivery
                .deliver(job, a, slot, &burst, &said[said.len() - 1], how);
            let delivered = Box::pin(out).instrument(agent.clone()).await?;
            match Box::pin(self.after_delivery(job, a, &burst, delivered, &agent)).await? {
                ControlFlow::Continue(None) => {}
                ControlFlow::Continue(Some(sent)) => owed = Some(sent),
                ControlFlow::Break(settled) => return Ok(settled),
            }
        }
        let ending = Ending {
            plan: &plan,
            said,
            burst: &burst,
            state: if plan.busy {
                State::Limited
            } else {
                State::Done
            },
            fresh: fresh > 0,
            remember: true,
            owed,
        };
        Box::pin(self.answered(job, a, ending)).await
    }

    /// Stage 3, the incoming hook (a crisis gets its referral before anything else), then stage 4, the
    /// gate, with stage 6's choice of who speaks: the crisis found and the plan to go on with, or the job
    /// settled at the gate (limited, dropped, held).
    async fn through_the_gate<'a>(
        &'a self,
        job: &Job,
        a: &Admitted<'a>,
    ) -> Result<ControlFlow<Settled, (Option<Flagged>, Plan<'a>)>, PipelineError> {
        let crisis = match a.message() {
            Some(m) => Box::pin(self.screen(job, a, &m)).await?,
            None => None,
        };
        let flagged = crisis.is_some();
        let checks = |gate, paused| kind::plan(gate, job, a, flagged, paused);
        let settled = match Box::pin(self.gate.pass(job, a, flagged, checks)).await? {
            Passage::Go(plan) => return Ok(ControlFlow::Continue((crisis, plan))),
            Passage::Limited { by } => Box::pin(self.limited(job, a, &by)).await?,
            Passage::Drop { reason, keep } => Box::pin(self.drop(job, a, &reason, keep)).await?,
            Passage::Hold => Box::pin(self.hold(job, a, &Burst::default())).await?,
        };
        Ok(ControlFlow::Break(settled))
    }

    /// What a slot's delivery leaves the job: go on (with the message whose deletion check is owed to
    /// the settlement, if it was that), or the job settled (a deletion meanwhile; a pause holds a
    /// message, and drops news, which is not held for later). The slot's agent span gets its outcome.
    async fn after_delivery(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        burst: &Burst,
        delivered: Delivered,
        agent: &tracing::Span,
    ) -> Result<ControlFlow<Settled, Option<Sent>>, PipelineError> {
        let (outcome, reason) = match delivered {
            Delivered::Out | Delivered::Owed(_) => ("answered", None),
            Delivered::Deleted | Delivered::Withdrawn => ("dropped", Some(DELETED)),
            Delivered::Paused => ("held", None),
        };
        genai::outcome(agent, outcome, reason);
        let settled = match delivered {
            Delivered::Out => return Ok(ControlFlow::Continue(None)),
            Delivered::Owed(sent) => return Ok(ControlFlow::Continue(Some(sent))),
            Delivered::Deleted | Delivered::Withdrawn => {
                Box::pin(self.deleted_meanwhile(job, a)).await?
            }
            Delivered::Paused if a.kind.follow_up().is_some() => {
                Box::pin(self.drop(job, a, HELD, false)).await?
            }
            Delivered::Paused => Box::pin(self.hold(job, a, burst)).await?,
        };
        Ok(ControlFlow::Break(settled))
    }

    /// Stage 7 of a slot, recorded: its message fixed by its `reply` step (`fresh` counts the ones
    /// composed now, not replayed). With `check`, the check before delivery, and the history when it finds
    /// the way clear, ride with the record. `crisis` is the job's crisis language; `content`, whether its
    /// model calls may carry message text on their spans.
    async fn said(
        &self,
        view: &SlotView<'_, '_>,
        crisis: Option<&str>,
        content: bool,
        check: bool,
        fresh: &mut usize,
    ) -> Result<Reply, PipelineError> {
        let (job, slot) = (view.job, view.slot);
        let reply = job.step(&REPLY, slot.reply(job.record.generation));
        // Boxed: the model's part of a turn is a large future, kept off the caller's stack.
        let body = Box::pin(async {
            *fresh += 1;
            genai::with_content(content, self.fix(view, crisis)).await
        });
        if !check {
            return reply.run(body).await;
        }
        let (a, burst) = (view.admitted, view.burst);
        let ride = |line: &Reply| self.delivery.before_ride(job, a, slot, burst, line);
        reply.run_riding(body, ride).await
    }

    /// Stage 9 for an answered job; a message withdrawn when the settlement's check found a deletion
    /// since it went out, and the job then ends as deleted.
    async fn answered(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        ending: Ending<'_, '_>,
    ) -> Result<Settled, PipelineError> {
        match self.end.answered(job, a, ending).await? {
            Ended::Settled(settled) => Ok(settled),
            Ended::Deleted(sent) => {
                self.delivery.withdraw(job, &sent).await?;
                Box::pin(self.deleted_meanwhile(job, a)).await
            }
        }
    }

    /// Whether the job's model calls may carry message text on their spans: only when the process
    /// captures content, and never for a minor, a message answered with the safety brief, or a
    /// conversation where a message was ever flagged as a crisis (a `crisis` step in one of its jobs: its
    /// words may come back in any later prompt of the conversation).
    async fn content_on_spans(
        &self,
        a: &Admitted<'_>,
        briefed: bool,
    ) -> Result<bool, PipelineError> {
        if !genai::capturing() || briefed || a.age.is_minor() {
            return Ok(false);
        }
        let flagged = self
            .journal
            .ever_in(&a.ids.conversation, incoming::CRISIS.name);
        Ok(!flagged.await?)
    }

    /// Stage 7 of a slot: its message composed, through the outgoing hook; what its `reply` step fixes.
    /// `crisis` is the language of the job's crisis, when one of its messages was flagged. When the model
    /// flagged a concern, the crisis protocol runs first and the referral goes first: the model's reply,
    /// composed before it, is stamped after it.
    async fn fix(
        &self,
        view: &SlotView<'_, '_>,
        crisis: Option<&str>,
    ) -> Result<Reply, PipelineError> {
        let ask = |composer| kind::ask(composer, view);
        let mut composed = self.composer.compose(view, ask).await?;
        let mut lang = crisis.map(str::to_owned);
        if let Some(concern) = composed.concern
            && let Some(m) = view.admitted.message()
        {
            let decision = self.incoming.safety.screen.model_flag(m.text, concern);
            let (flagged, referral) =
                Box::pin(self.protocol(view.job, view.admitted, &m, decision)).await?;
            // The referral went out since the disclosure's rule was read with the history: read again.
            composed.seen = None;
            if let Some(referral) = referral {
                composed.said.stamp_after(&referral);
            }
            lang.get_or_insert(flagged.lang);
        }
        let (a, speaker) = (view.admitted, view.speaker);
        let said = self
            .outgoing
            .pass(a, speaker, composed.said, lang.as_deref(), composed.seen);
        Box::pin(said).await
    }

    /// The incoming hook on a user message: its screen, and the protocol when it flags a crisis.
    async fn screen(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        m: &UserMessage<'_>,
    ) -> Result<Option<Flagged>, PipelineError> {
        match self.incoming.screen(job, a, m).await? {
            Some(decision) => Ok(Some(self.protocol(job, a, m, decision).await?.0)),
            None => Ok(None),
        }
    }

    /// The crisis protocol on a flagged message, each part once per message: the record, the referral
    /// when one is owed (through the outgoing hook and delivered at once, before anything else is said)
    /// and the moderators' alert. Returns the record and the referral delivered, if one was owed.
    async fn protocol(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        m: &UserMessage<'_>,
        decision: Decision,
    ) -> Result<(Flagged, Option<Reply>), PipelineError> {
        let flagged = self.incoming.flag(job, a, m, decision).await?;
        let mut referral = None;
        if flagged.referred {
            let reply = job
                .step(&REFERRAL_MESSAGE, m.id.to_hex())
                .run(async {
                    let said = self.incoming.referral(a, m, &flagged);
                    let lang = Some(flagged.lang.as_str());
                    let said = self
                        .outgoing
                        .pass(a, a.members[0], said, lang, None)
                        .await?;
                    Ok::<_, PipelineError>(said)
                })
                .await?;
            self.delivery.deliver_referral(job, a, m, &reply).await?;
            referral = Some(reply);
        }
        self.incoming.alert(job, a, m, &flagged).await?;
        Ok((flagged, referral))
    }

    /// The burst's other messages through the incoming hook, each screened; the first crisis among them.
    async fn screen_burst(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        burst: &Burst,
    ) -> Result<Option<Flagged>, PipelineError> {
        let Some(head) = a.kind.dm() else {
            return Ok(None);
        };
        let mut crisis = None;
        for e in burst.events(head) {
            let m = UserMessage::of(&e);
            if let Some(f) = Box::pin(self.screen(job, a, &m)).await? {
                crisis.get_or_insert(f);
            }
        }
        Ok(crisis)
    }

    /// No message, on purpose: the job ends `dropped` with the reason (the user's message kept in
    /// history when `keep`).
    async fn drop(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        reason: &str,
        keep: bool,
    ) -> Result<Settled, PipelineError> {
        if keep {
            self.delivery
                .keep_unanswered(job, a, &Burst::default())
                .await?;
        }
        self.end.dropped(job, a, reason).await
    }

    /// The job's message, or one of its burst, was deleted (or its user erased) while the model
    /// answered: no reply is written or published (it was built on the deleted words), the job ends
    /// dropped, and what its steps recorded is scrubbed. The message itself stays in the history when it
    /// was not the one deleted (the history write leaves out what was).
    async fn deleted_meanwhile(
        &self,
        job: &Job,
        a: &Admitted<'_>,
    ) -> Result<Settled, PipelineError> {
        let settled = self.drop(job, a, DELETED, true).await?;
        self.end.scrub(job).await?;
        Ok(settled)
    }

    /// Over the flood limit with the busy line already said this minute: the message is kept in history
    /// for the next real answer and settled without a reply of its own.
    async fn limited(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        by: &str,
    ) -> Result<Settled, PipelineError> {
        self.delivery
            .keep_unanswered(job, a, &Burst::default())
            .await?;
        self.end.limited(job, by).await
    }

    /// A moderator paused the conversation: the message (and its burst) is kept in history, and its job
    /// ends `held` for the resume to answer.
    async fn hold(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        burst: &Burst,
    ) -> Result<Settled, PipelineError> {
        genai::Safety::Held.record();
        self.delivery.unsay_undelivered(job, a).await?;
        self.delivery.keep_unanswered(job, a, burst).await?;
        self.end.held(job, burst).await
    }

    /// The end of a job whose attempts failed: the messages fixed before the failure are delivered, else
    /// the first speaker's failure line, once like any message; never over a settled job.
    pub(crate) async fn fail(
        &self,
        input: &Input<'_>,
        reason: &str,
    ) -> Result<Settled, PipelineError> {
        let a = self.admission.admit(input).await?;
        let job = self.journal.open(&a.new_job(None)).await?;
        let attempt = job.attempt(async |job| {
            self.journal.note_error(job.id(), reason).await?;
            self.fail_slots(job, &a, reason).await
        });
        match attempt.await? {
            Attempt::Ran(settled) => Ok(settled),
            Attempt::Settled => {
                info!(state = ?job.record.state, "settled after all; no failure line");
                Ok(already_settled(&job))
            }
        }
    }

    async fn fail_slots(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        reason: &str,
    ) -> Result<Settled, PipelineError> {
        let burst = job.recorded(&burst::BURST, key::ONCE).unwrap_or_default();
        let busy = job
            .recorded(&FLOOD, key::ONCE)
            .is_some_and(|f| f.by.as_deref() == Some(job.id()));
        let plan = Plan::after_failure(a, job.recorded(&crate::group::ROUTE, key::ONCE), busy);
        let first = plan.speakers[0];
        let generation = job.record.generation;
        let failed = std::sync::atomic::AtomicBool::new(false);
        let first_line = job
            .step(&REPLY, plan.slot(0).reply(generation))
            .run(async {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                // A user in crisis is owed the character's crisis line, not a failure.
                let crisis = a
                    .message()
                    .and_then(|m| job.recorded(&incoming::CRISIS, &m.id.to_hex()));
                let c = first.character;
                let (line, which) = match crisis {
                    Some(_) => (c.crisis_line.clone(), "crisis"),
                    None => (c.failure_line.clone(), "failure"),
                };
                let why = format!("the job's attempts failed: {reason}");
                reply::note_fixed_line(job, &plan.slot(0).reply(generation), which, why).await;
                let said = self.composer.line(a, first, line);
                let lang = crisis.as_ref().map(|f| f.lang.as_str());
                self.outgoing.pass(a, first, said, lang, None).await
            })
            .await?;
        let mut said = vec![first_line];
        while plan.group.is_some()
            && let Some(s) = job.recorded(&REPLY, &plan.slot(said.len()).reply(generation))
        {
            said.push(s);
        }
        for (n, s) in said.iter().enumerate() {
            // A failure line withdrawn (its user erased meanwhile) ends the job failed all the same.
            let how = How {
                check: false,
                more: false,
            };
            let delivered = self
                .delivery
                .deliver(job, a, plan.slot(n), &burst, s, how)
                .await?;
            if let Delivered::Owed(sent) = delivered {
                let _ = self.delivery.check_sent(job, &sent).await?;
            }
        }
        let state = match (failed.into_inner(), busy) {
            (true, _) => State::Failed,
            (false, true) => State::Limited,
            (false, false) => State::Done,
        };
        let ending = Ending {
            plan: &plan,
            said,
            burst: &burst,
            state,
            fresh: false,
            remember: false,
            owed: None,
        };
        self.answered(job, a, ending).await
    }

    /// Opens a settled job again for `companion replay`: a failed one resumes from its journal (the model's
    /// recorded answers are not paid again); `fresh` asks the model anew. Either way the flood decision is
    /// made again (a replay is never limited), and when the last generation has a message the next one
    /// answers.
    pub(crate) async fn reopen(&self, id: &str, fresh: bool) -> Result<(), JournalError> {
        let forget: &[&str] = match fresh {
            true => &[FLOOD.name, crate::calls::LLM.name, crate::group::ROUTE.name],
            false => &[FLOOD.name],
        };
        self.journal.reopen(id, forget).await
    }
}

/// Records how the job ended on its agent span.
fn settled_on(span: &tracing::Span, result: &Result<Settled, PipelineError>) {
    match result {
        Ok(s) => {
            let reason = match &s.outcome {
                Outcome::Dropped { reason } => Some(reason.as_str()),
                _ => None,
            };
            genai::outcome(span, s.outcome.name(), reason);
        }
        Err(e) => {
            let class = match e.class() {
                Class::Transient => "transient",
                Class::Permanent => "permanent",
                Class::Reject => "reject",
            };
            genai::outcome(span, "failed", Some(class));
        }
    }
}

/// `fut`, unless the attempt's deadline passes first.
async fn within<T, E: Into<PipelineError>>(
    deadline: tokio::time::Instant,
    secs: u64,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, PipelineError> {
    match tokio::time::timeout_at(deadline, fut).await {
        Ok(r) => r.map_err(Into::into),
        Err(_) => Err(PipelineError::TimedOut(secs)),
    }
}

/// A job the journal says is settled is acknowledged again, with what its reply covered.
fn already_settled(job: &Job) -> Settled {
    Settled {
        through_seq: job
            .recorded(&burst::BURST, key::ONCE)
            .and_then(|b| b.last_seq()),
        floored: None,
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
        let retried = |e: ToolError| PipelineError::from(e).class() == Class::Transient;
        for e in [
            ToolError::Forbidden("not yours".into()),
            ToolError::NotFound("no such list".into()),
            ToolError::invalid("name", "too long"),
            ToolError::Crashed,
        ] {
            let text = e.to_string();
            let turn = PipelineError::from(e);
            assert_eq!(turn.class(), Class::Permanent, "{text}");
            assert!(
                !matches!(turn, PipelineError::Store(_)),
                "never a database error: {turn:?}"
            );
        }
        assert!(retried(ToolError::Store(StoreError::Pg(
            sqlx::Error::PoolTimedOut
        ))));
    }
}
