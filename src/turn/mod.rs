//! One turn: an inbound DM, with the rest of its burst, becomes the companion's reply in dm_messages,
//! history and a completion event. Every side effect is a step of the turn's journal ([`crate::journal`]):
//!
//! | step | key | what it records |
//! |---|---|---|
//! | `flood` | | the flood decision: go ahead, say the busy line, or already answered by one (lazy) |
//! | `flow` | | the user's guided flow with the companion as this turn sees it (lazy) |
//! | `burst` | | the later messages this reply answers, fixed on the first attempt |
//! | `llm` | round | each answer of the model, with its usage and cost ([`tool_loop`]) |
//! | `tool` | call id + hash | each tool call's result, as the model saw it (lazy) |
//! | `quota` | call id + hash | a write counted against the user's hourly quota (tally `writes:<user>`) |
//! | `reply` | `g<generation>` | the reply's id, text, card and time: every retry writes the same document |
//! | `store_reply`, `history`, `touch`, `publish` | `g<generation>` | delivering it (lazy: safe to repeat) |
//!
//! A burst: messages the user sent after this one that are already in the stream when the turn starts (up
//! to `COMPANION_BURST_MAX`) are answered by the same reply, as a person would answer five quick lines
//! once. They become `covered` jobs of their own and are listed in the completion's `covers`.
//!
//! Errors carry their class ([`Classify`]); the worker's settlement decides what to do about them.

pub mod prompt;
pub mod tool_loop;

use std::sync::Arc;

use bson::oid::ObjectId;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{debug, info};

use crate::{
    bus::{
        Bus, BusError, Completion, DmEvent, Trigger, Typing,
        event::{InvalidEvent, Limits, clean_text, parse_inbound},
    },
    character::{Character, Characters},
    config::TurnConfig,
    failure::{Class, Classify},
    flood::FloodLimit,
    journal::{Job, Journal, JournalError, NewJob, State},
    llm::{CallBudget, ChatRequest, LlmClient, LlmError},
    metrics::Metrics,
    order::{Order, OrderError},
    rag::Retriever,
    spend::SpendGuard,
    store::{
        Mongo, Pg, StoreError,
        mongo::{Admission, ReplyDoc, UserData},
        pg::NewHistory,
    },
    timing::{Stage, stage},
    tools::{REGISTRY, ReminderBounds, ToolContext, ToolError},
};

/// The kind of a turn's job.
pub const JOB_KIND: &str = "turn";

/// How a turn ended well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The reply was written and published.
    Answered { reply_id: String },
    /// Over the user's flood limit: answered by the busy line, or by none when it was already said
    /// within the window.
    Limited { reply_id: Option<String> },
    /// An earlier delivery already settled this message.
    AlreadySettled { state: State },
    /// A group message no companion answers, on purpose (an acknowledgement, a companion's own).
    Silent { reason: String },
}

impl Outcome {
    /// The outcome's name in metrics (`outcome="…"`) and in the turn's timing record.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Answered { .. } => "answered",
            Self::Limited { .. } => "limited",
            Self::AlreadySettled { .. } => "already_done",
            Self::Silent { .. } => "silent",
        }
    }
}

/// A turn's outcome and the last stream sequence it settled (its burst's last message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    pub outcome: Outcome,
    /// Stream sequence of the last message of the burst, when the turn answered more than one.
    pub through_seq: Option<u64>,
}

/// Where a delivery came from, so a turn can take in the rest of its burst.
pub struct Delivery<'a> {
    pub order: &'a Order,
    pub subject: &'a str,
    pub seq: u64,
}

/// Why a turn did not end well; its [`Class`] says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error("invalid event: {0}")]
    Invalid(#[from] InvalidEvent),
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
}

impl Classify for TurnError {
    fn class(&self) -> Class {
        match self {
            Self::Invalid(_)
            | Self::UnknownBot(_)
            | Self::MissingConversation(_)
            | Self::NotParticipant(_)
            | Self::NoCompanion(_) => Class::Reject,
            Self::Store(e) => e.class(),
            Self::Journal(e) => e.class(),
            Self::Bus(e) => e.class(),
            Self::Order(e) => e.class(),
            Self::Llm(e) => e.class(),
            Self::BadReplyId(_) => Class::Permanent,
            Self::TimedOut(_) => Class::Transient,
        }
    }

    fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::Llm(e) => e.retry_after(),
            _ => None,
        }
    }
}

impl From<ToolError> for TurnError {
    /// Only a database failure leaves a tool call without a result (see [`ToolResult::record`]).
    ///
    /// [`ToolResult::record`]: crate::tools::ToolResult::record
    fn from(e: ToolError) -> Self {
        match e {
            ToolError::Journal(e) => Self::Journal(e),
            ToolError::Store(e) => Self::Store(e),
            ToolError::Bus(e) => Self::Bus(e),
            other => Self::Store(StoreError::Pg(sqlx::Error::Protocol(other.to_string()))),
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

/// A later message of a burst, as the `burst` step fixes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Covered {
    pub message_id: String,
    pub seq: u64,
    pub content: String,
    #[serde(default)]
    pub images: Vec<String>,
    pub sent_at: DateTime<Utc>,
}

/// The `burst` step: the later messages this turn's reply answers too, in stream order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Burst {
    pub covers: Vec<Covered>,
}

impl Burst {
    pub fn last_seq(&self) -> Option<u64> {
        self.covers.last().map(|c| c.seq)
    }

    /// The covered messages as events of the same conversation as `head`.
    fn events(&self, head: &DmEvent) -> Vec<DmEvent> {
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

/// The `reply` step: the answer of a generation, fixed before it is delivered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reply {
    /// `_id` of the reply in dm_messages.
    pub id: String,
    pub content: String,
    pub rich_content: Option<Value>,
    pub at: DateTime<Utc>,
    /// Compact log of the tool calls behind this reply, kept on the assistant's history row.
    pub tool_log: Option<Value>,
}

impl Reply {
    pub fn new(content: String, rich_content: Option<Value>, tool_log: Option<Value>) -> Self {
        Self {
            id: ObjectId::new().to_hex(),
            content,
            rich_content,
            at: Utc::now(),
            tool_log,
        }
    }
}

/// What a turn uses, built once per process from the components.
pub struct Turns {
    pub journal: Journal,
    /// History (`bot_conversations`).
    pub pg: Pg,
    pub mongo: Mongo,
    /// Completions and typing events.
    pub bus: Bus,
    pub llm: LlmClient,
    pub characters: Characters,
    /// The guided flows the characters offer.
    pub flows: crate::flow::Flows,
    pub retriever: Retriever,
    pub flood: FloodLimit,
    /// The spend budgets, checked before each paid call.
    pub spend: SpendGuard,
    pub config: TurnConfig,
    pub metrics: Arc<Metrics>,
}

impl Turns {
    /// The limits inbound events are parsed with.
    pub fn limits(&self) -> Limits {
        Limits::of(&self.config)
    }

    /// The checks every event passes before anything is written for it: a known companion, and a
    /// conversation that exists and joins the sender and the bot; with the user's profile and
    /// tricklists, read in the same round trip.
    pub async fn admit(&self, event: &DmEvent) -> Result<(&Character, UserData), TurnError> {
        let character = self
            .characters
            .by_bot(&event.bot_id)
            .ok_or_else(|| TurnError::UnknownBot(event.bot_id.to_hex()))?;
        match self
            .mongo
            .admit(
                event.conversation_id,
                event.sender_id,
                event.bot_id,
                prompt::PROMPT_TRICKLISTS,
            )
            .await?
        {
            Admission::Admitted(user) => Ok((character, user)),
            Admission::Missing => Err(TurnError::MissingConversation(
                event.conversation_id.to_hex(),
            )),
            Admission::NotParticipant => {
                Err(TurnError::NotParticipant(event.conversation_id.to_hex()))
            }
        }
    }

    /// Runs one validated event to completion (no burst: for callers without a stream delivery).
    pub async fn run(&self, event: &DmEvent) -> Result<Outcome, TurnError> {
        Box::pin(self.run_delivered(event, None))
            .await
            .map(|s| s.outcome)
    }

    /// Runs one validated event delivered from the stream; later messages of its burst already in the
    /// stream are answered with it.
    pub async fn run_delivered(
        &self,
        event: &DmEvent,
        delivery: Option<&Delivery<'_>>,
    ) -> Result<Settled, TurnError> {
        // One deadline for the whole attempt: a request a server accepted and never answers must not
        // hold the message (and its conversation behind it) for good.
        let secs = self.config.turn_timeout_secs.max(1);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
        let (character, user) =
            within(deadline, secs, stage(Stage::Admit, self.admit(event))).await?;
        let ids = Ids::of(event);
        let new_job = ids.job(delivery.map(|d| d.seq));
        let open = stage(Stage::Journal, self.journal.open(&new_job));
        let job = within(deadline, secs, open).await?;
        if let Some(settled) = already_settled(&job) {
            info!(state = ?job.record.state, attempts = job.record.attempts, "message already settled; acknowledging");
            return Ok(settled);
        }
        let result = within(
            deadline,
            secs,
            self.answer(&job, event, &ids, character, &user, delivery),
        )
        .await;
        job.keep_successes(result).await
    }

    async fn answer(
        &self,
        job: &Job,
        event: &DmEvent,
        ids: &Ids,
        character: &Character,
        user: &UserData,
        delivery: Option<&Delivery<'_>>,
    ) -> Result<Settled, TurnError> {
        let generation = generation_key(job);
        if let Some(reply) = job.recorded::<Reply>("reply", &generation) {
            debug!("reply already fixed; delivering it again");
            return self.deliver_recorded(job, event, ids, reply).await;
        }
        let flood = job
            .step("flood", "")
            .lazy()
            .run(self.decide_flood(job, &ids.sender, &ids.bot))
            .await?;
        match flood.by.as_deref() {
            Some(by) if by != ids.message => {
                return self.limited_silently(job, event, ids, by).await;
            }
            Some(_) => {
                info!("over the flood limit; answering with the busy line");
                let line = character.busy_line.clone();
                let reply = job
                    .step("reply", &generation)
                    .run(async { Ok::<_, TurnError>(Reply::new(line, None, None)) })
                    .await?;
                return self
                    .deliver(job, event, ids, &Burst::default(), reply, true)
                    .await;
            }
            None => {}
        }
        let burst = stage(Stage::Order, self.fix_burst(job, event, delivery)).await?;
        let typing = Typing {
            conversation_id: ids.conversation.clone(),
            sender_id: ids.bot.clone(),
            typing: true,
            at: Utc::now(),
        };
        if let Err(e) = stage(Stage::Publish, self.bus.publish_typing(&typing)).await {
            debug!(error = %e, "typing indicator not sent");
        }
        // Boxed: the model's part of a turn is a large future, kept off the caller's stack.
        let reply = job
            .step("reply", &generation)
            .run(Box::pin(self.respond(job, event, &burst, character, user)))
            .await?;
        self.deliver(job, event, ids, &burst, reply, false).await
    }

    /// The flood decision of a job that has none recorded (`bot` is the companion that would say the
    /// busy line). Only a first attempt takes from the allowance: a retried or replayed job was admitted
    /// already.
    pub(crate) async fn decide_flood(
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

    /// Over the flood limit with the busy line already said this minute: the message is kept in history
    /// for the next real answer and settled without a reply of its own.
    async fn limited_silently(
        &self,
        job: &Job,
        event: &DmEvent,
        ids: &Ids,
        by: &str,
    ) -> Result<Settled, TurnError> {
        job.step("history", "limited")
            .lazy()
            .run(async {
                self.pg
                    .append_history(&[user_row(ids, event, Utc::now())])
                    .await
                    .map_err(TurnError::from)
            })
            .await?;
        job.settle(State::Limited, Some(by)).await?;
        info!(answered_by = %by, "over the flood limit; the busy line already answered this minute");
        Ok(Settled {
            outcome: Outcome::Limited { reply_id: None },
            through_seq: None,
        })
    }

    /// The `burst` step: the later messages of the same sender that follow in the stream now
    /// (contiguous, valid, within the bounds), each made a job `covered` by this one, atomically with
    /// the step's record ([`Job::covering`]); the first that already has a job ends the burst.
    async fn fix_burst(
        &self,
        job: &Job,
        event: &DmEvent,
        delivery: Option<&Delivery<'_>>,
    ) -> Result<Burst, TurnError> {
        if let Some(burst) = job.recorded::<Burst>("burst", "") {
            return Ok(burst);
        }
        let mut candidates: Vec<(Ids, Covered)> = Vec::new();
        if let Some(d) = delivery.filter(|_| self.config.burst_max > 0) {
            let limits = self.limits();
            let mut chars = event.content.chars().count();
            for m in d
                .order
                .followers(d.subject, d.seq, self.config.burst_max)
                .await?
            {
                let Ok(f) = parse_inbound(
                    &m.payload,
                    m.subject.as_str(),
                    &self.bus.names.prefix,
                    limits,
                ) else {
                    break;
                };
                chars += f.content.chars().count();
                if f.sender_id != event.sender_id
                    || f.message_id == event.message_id
                    || chars > self.config.max_content_chars
                {
                    break;
                }
                let fids = Ids::of(&f);
                let covered = Covered {
                    message_id: fids.message.clone(),
                    seq: m.sequence,
                    content: f.content,
                    images: f.images,
                    sent_at: f.sent_at,
                };
                candidates.push((fids, covered));
            }
        }
        let jobs: Vec<NewJob<'_>> = candidates
            .iter()
            .map(|(fids, c)| fids.job(Some(c.seq)))
            .collect();
        let burst = job
            .covering("burst", "", &jobs, |n| Burst {
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

    /// Loads the context, asks the model (the tool loop) and returns its answer.
    async fn respond(
        &self,
        job: &Job,
        event: &DmEvent,
        burst: &Burst,
        character: &Character,
        user: &UserData,
    ) -> Result<Reply, TurnError> {
        let ids = Ids::of(event);
        let followers = burst.events(event);
        let events: Vec<&DmEvent> = std::iter::once(event).chain(&followers).collect();
        let query = events
            .iter()
            .map(|e| e.content.as_str())
            .filter(|c| !c.is_empty())
            .collect::<Vec<_>>()
            .join("\n");
        // Retrieval (embedding + vector search) runs beside the history load and the trick names (mostly
        // cached), not after them.
        let (context, knowledge, flow) = tokio::join!(
            stage(Stage::Context, async {
                tokio::try_join!(
                    self.pg
                        .history(&ids.sender, &ids.bot, self.config.history_limit),
                    self.mongo.resolve_tricklists(&user.tricklists),
                )
            }),
            self.retriever.for_turn(&character.knowledge, &query),
            self.turn_flow(job, &ids, character),
        );
        let (history, tricklists) = context?;
        let flow = flow?.prompt(&self.flows, &character.flows);
        let prompt_started = std::time::Instant::now();
        let system = prompt::system_prompt(&prompt::PromptContext {
            character,
            profile: user.profile.as_ref(),
            tricklists: &tricklists,
            knowledge: &knowledge,
            reminders: &history.reminders,
            now: Utc::now(),
            tools_enabled: true,
            flow: &flow,
        });
        let messages = prompt::conversation(system, &history.messages, &events);
        crate::timing::add(Stage::Prompt, prompt_started);
        Ok(self
            .converse(job, "", character, event, user, messages)
            .await?
            .reply)
    }

    /// Asks the model as `character`, with `messages` (the system prompt first), and runs the tool loop
    /// for the event's sender: the companion message it makes, bounded, or the character's budget line
    /// when a spend budget stops it. Its model answers and tool calls are journal steps keyed under
    /// `slot` (empty for a DM turn), and the per-turn ceiling counts those of the slot.
    pub(crate) async fn converse(
        &self,
        job: &Job,
        slot: &str,
        character: &Character,
        event: &DmEvent,
        user: &UserData,
        messages: Vec<crate::llm::Message>,
    ) -> Result<Answer, TurnError> {
        let request = ChatRequest {
            model: character
                .model
                .clone()
                .unwrap_or_else(|| self.llm.default_model.clone()),
            messages,
            tools: REGISTRY.defs(),
            tool_choice: None,
            max_tokens: Some(self.llm.max_tokens),
            temperature: Some(self.llm.temperature),
        };
        // Answers recorded by earlier attempts were paid once and are replayed for free.
        let budget = CallBudget::new(
            self.config
                .max_llm_calls_per_turn
                .saturating_sub(job.recorded_count_under("llm", slot) as u32),
            self.config.max_prompt_tokens_per_turn,
        );
        let cx = tool_loop::LoopContext {
            slot,
            budget: &budget,
            spend: Some(&self.spend),
            llm: &self.llm,
            registry: &REGISTRY,
            limits: tool_loop::LoopLimits {
                max_rounds: self.config.max_tool_rounds,
                max_result_bytes: self.config.max_tool_result_bytes,
            },
            metrics: &self.metrics,
            tools: ToolContext {
                user: event.sender_id,
                bot: event.bot_id,
                conversation: event.conversation_id,
                character: &character.name,
                pg: &self.pg,
                bus: &self.bus,
                time_zone: user.profile.as_ref().and_then(|p| p.time_zone.as_deref()),
                reminders: ReminderBounds {
                    min_lead: std::time::Duration::from_secs(self.config.reminder_min_lead_secs),
                },
                message_id: event.message_id,
                tool_call_id: String::new(),
                call_key: String::new(),
                mongo: &self.mongo,
                job,
                now: Utc::now(),
                writes_per_hour: self.config.writes_per_hour,
                flows: &self.flows,
                offered_flows: &character.flows,
            },
        };
        let out = tool_loop::run(&cx, request).await?;
        let log = (!out.log.is_empty()).then(|| Value::Array(out.log));
        if let Some(scope) = out.stopped {
            info!(
                scope = scope.label(),
                "the spend budget is used up; answering with the budget line"
            );
            return Ok(Answer {
                reply: Reply::new(character.budget_line.clone(), out.card, log),
                budget_stopped: true,
            });
        }
        let content = bound_reply(clean_text(&out.text).trim(), self.config.max_reply_chars);
        if content.is_empty() {
            return Err(LlmError::EmptyAnswer.into());
        }
        Ok(Answer {
            reply: Reply::new(content, out.card, log),
            budget_stopped: false,
        })
    }

    /// The user's flow with the companion as this turn sees it (the `flow` step: a retry after the first
    /// model answer sees the same); nothing for a companion without flows.
    async fn turn_flow(
        &self,
        job: &Job,
        ids: &Ids,
        character: &Character,
    ) -> Result<crate::flow::TurnFlow, TurnError> {
        if character.flows.is_empty() {
            return Ok(Default::default());
        }
        let idle = chrono::Duration::days(i64::from(self.config.flow_idle_days.max(1)));
        // Lazy: reading it again is harmless, and its record rides with the turn's first model answer.
        job.step("flow", "")
            .lazy()
            .run(async {
                crate::flow::TurnFlow::load(&self.pg.pool, &ids.sender, &ids.bot, Utc::now() - idle)
                    .await
                    .map_err(TurnError::from)
            })
            .await
    }

    /// Answers the event (and the burst fixed with it) with the character's honest failure line, once
    /// like any reply; never over a settled turn. A reply fixed before the failure is delivered instead.
    pub async fn answer_with_failure(
        &self,
        event: &DmEvent,
        reason: &str,
    ) -> Result<Settled, TurnError> {
        let (character, _) = self.admit(event).await?;
        let ids = Ids::of(event);
        let job = self.journal.open(&ids.job(None)).await?;
        if let Some(settled) = already_settled(&job) {
            info!(state = ?job.record.state, "message settled after all; no failure line");
            return Ok(settled);
        }
        self.journal.note_error(&ids.message, reason).await?;
        let generation = generation_key(&job);
        let result = match job.recorded::<Reply>("reply", &generation) {
            Some(reply) => self.deliver_recorded(&job, event, &ids, reply).await,
            None => {
                let burst = job.recorded::<Burst>("burst", "").unwrap_or_default();
                let line = Reply::new(character.failure_line.clone(), None, None);
                let reply = job
                    .step("reply", &generation)
                    .run(async { Ok::<_, TurnError>(line) })
                    .await?;
                self.deliver_as(&job, event, &ids, &burst, reply, State::Failed, None)
                    .await
            }
        };
        job.keep_successes(result).await
    }

    /// Delivers the reply an earlier attempt fixed, with the burst and flood decision recorded with it.
    async fn deliver_recorded(
        &self,
        job: &Job,
        event: &DmEvent,
        ids: &Ids,
        reply: Reply,
    ) -> Result<Settled, TurnError> {
        let burst = job.recorded::<Burst>("burst", "").unwrap_or_default();
        let flood = job
            .recorded::<FloodDecision>("flood", "")
            .unwrap_or_default();
        let busy = flood.by.as_deref() == Some(ids.message.as_str());
        self.deliver(job, event, ids, &burst, reply, busy).await
    }

    /// Delivers a fixed reply: `Limited` (answered by its own busy line) or `Done`.
    async fn deliver(
        &self,
        job: &Job,
        event: &DmEvent,
        ids: &Ids,
        burst: &Burst,
        reply: Reply,
        busy: bool,
    ) -> Result<Settled, TurnError> {
        let (state, by) = if busy {
            (State::Limited, Some(ids.message.as_str()))
        } else {
            (State::Done, None)
        };
        self.deliver_as(job, event, ids, burst, reply, state, by)
            .await
    }

    /// Writes the fixed reply once and publishes it, then settles the job in `state`; every step is safe
    /// to repeat and recorded with the settlement.
    #[allow(clippy::too_many_arguments)]
    async fn deliver_as(
        &self,
        job: &Job,
        event: &DmEvent,
        ids: &Ids,
        burst: &Burst,
        reply: Reply,
        state: State,
        by: Option<&str>,
    ) -> Result<Settled, TurnError> {
        let followers = burst.events(event);
        let follower_ids: Vec<Ids> = followers.iter().map(Ids::of).collect();
        let mut user_rows = vec![user_row(ids, event, reply.at)];
        for (e, fids) in followers.iter().zip(&follower_ids) {
            user_rows.push(user_row(fids, e, reply.at));
        }
        let out = Outgoing {
            conversation: event.conversation_id,
            bot: event.bot_id,
            user: event.sender_id,
            in_reply_to: Some(event.message_id),
            user_rows,
            covers: burst.covers.iter().map(|c| c.message_id.clone()).collect(),
            trigger: None,
            responds_to: None,
            group: false,
            key: generation_key(job),
        };
        self.write_reply(job, &out, &reply).await?;
        if !stage(Stage::Writes, job.settle(state, by)).await? {
            debug!("the turn was settled elsewhere meanwhile");
        }
        info!(reply_id = %reply.id, state = state.as_str(), generation = job.record.generation, "reply delivered");
        Ok(Settled {
            through_seq: burst.last_seq(),
            outcome: match state {
                State::Limited => Outcome::Limited {
                    reply_id: Some(reply.id),
                },
                _ => Outcome::Answered { reply_id: reply.id },
            },
        })
    }

    /// Delivers a fixed reply, every step keyed by the job's generation and safe to repeat (lazy: recorded
    /// with the job's settlement): the dm_messages document, the history rows (the user messages it
    /// answers, then its own), the conversation's last message, the completion event. The one path of
    /// every companion message, answer or proactive.
    pub async fn write_reply(
        &self,
        job: &Job,
        out: &Outgoing<'_>,
        reply: &Reply,
    ) -> Result<(), TurnError> {
        let generation = out.key.as_str();
        let reply_id =
            ObjectId::parse_str(&reply.id).map_err(|_| TurnError::BadReplyId(reply.id.clone()))?;
        let (user, bot, conversation) = (
            out.user.to_hex(),
            out.bot.to_hex(),
            out.conversation.to_hex(),
        );
        let writes = async {
            job.step("store_reply", generation)
                .lazy()
                .run(async {
                    let inserted = self
                        .mongo
                        .insert_reply(&ReplyDoc {
                            id: reply_id,
                            conversation_id: out.conversation,
                            sender_id: out.bot,
                            in_reply_to: out.in_reply_to,
                            responds_to: out.responds_to,
                            trigger: out.trigger.as_ref().map(|t| (t.kind.clone(), t.id.clone())),
                            content: reply.content.clone(),
                            rich_content: reply.rich_content.clone(),
                            timestamp: reply.at,
                            generation: job.record.generation,
                        })
                        .await?;
                    if !inserted {
                        debug!("reply document already present");
                    }
                    Ok::<_, TurnError>(inserted)
                })
                .await?;
            job.step("history", generation)
                .lazy()
                .run(async {
                    let mut rows = out.user_rows.clone();
                    rows.push(NewHistory {
                        user_id: &user,
                        bot_id: &bot,
                        conversation_id: &conversation,
                        role: "assistant",
                        content: &reply.content,
                        message_id: &reply.id,
                        tool_calls: reply.tool_log.as_ref(),
                        created_at: reply.at,
                        group_chat: out.group,
                    });
                    self.pg.append_history(&rows).await?;
                    Ok::<_, TurnError>(())
                })
                .await?;
            job.step("touch", generation)
                .lazy()
                .run(async {
                    self.mongo
                        .touch_conversation(out.conversation, &reply.content, reply.at)
                        .await?;
                    Ok::<_, TurnError>(())
                })
                .await?;
            Ok::<_, TurnError>(())
        };
        stage(Stage::Writes, writes).await?;
        let completion = Completion {
            message_id: reply.id.clone(),
            in_reply_to: out.in_reply_to.or(out.responds_to).map(|id| id.to_hex()),
            responds_to: out.responds_to.map(|id| id.to_hex()),
            conversation_id: conversation.clone(),
            sender_id: bot.clone(),
            content: reply.content.clone(),
            rich_content: reply.rich_content.clone(),
            created_at: reply.at,
            covers: out.covers.clone(),
            proactive: out.trigger.is_some(),
            trigger: out.trigger.clone(),
        };
        stage(
            Stage::Publish,
            job.step("publish", generation).lazy().run(async {
                self.bus.publish_completion(&completion).await?;
                Ok::<_, TurnError>(())
            }),
        )
        .await?;
        Ok(())
    }
}

/// One companion message the model made ([`Turns::converse`]).
pub(crate) struct Answer {
    pub reply: Reply,
    /// A spend budget stopped the model: the reply is the character's budget line.
    pub budget_stopped: bool,
}

/// Where a fixed reply goes and what it answers.
pub struct Outgoing<'a> {
    pub conversation: ObjectId,
    /// The companion speaking.
    pub bot: ObjectId,
    /// The user it speaks to.
    pub user: ObjectId,
    /// The user message answered; none for a proactive message.
    pub in_reply_to: Option<ObjectId>,
    /// History rows of the user messages answered, stored before the reply's own.
    pub user_rows: Vec<NewHistory<'a>>,
    /// Later messages of a burst the reply answers too.
    pub covers: Vec<String>,
    /// What a proactive message follows up on (`proactive: true` in the completion).
    pub trigger: Option<Trigger>,
    /// In a group: the user message this is one of the answers to.
    pub responds_to: Option<ObjectId>,
    /// A group conversation's message: its history rows go to the group's window.
    pub group: bool,
    /// The key of its delivery steps (`g<generation>`, and the slot in a group).
    pub key: String,
}

/// `fut`, unless the attempt's deadline passes first.
pub(crate) async fn within<T, E: Into<TurnError>>(
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
pub(crate) fn already_settled(job: &Job) -> Option<Settled> {
    job.record.state.is_settled().then(|| Settled {
        through_seq: job
            .recorded::<Burst>("burst", "")
            .and_then(|b| b.last_seq()),
        outcome: Outcome::AlreadySettled {
            state: job.record.state,
        },
    })
}

/// The key of this generation's reply steps.
pub(crate) fn generation_key(job: &Job) -> String {
    format!("g{}", job.record.generation)
}

/// The history row of a user's message.
fn user_row<'a>(ids: &'a Ids, event: &DmEvent, reply_at: DateTime<Utc>) -> NewHistory<'a> {
    NewHistory {
        user_id: &ids.sender,
        bot_id: &ids.bot,
        conversation_id: &ids.conversation,
        role: "user",
        content: ids.text.as_str(),
        message_id: &ids.message,
        tool_calls: None,
        created_at: user_message_time(event.sent_at, reply_at),
        group_chat: false,
    }
}

/// The user's message sorts before the reply even when the client clock is off.
fn user_message_time(sent_at: DateTime<Utc>, reply_at: DateTime<Utc>) -> DateTime<Utc> {
    sent_at.min(reply_at - chrono::Duration::microseconds(1))
}

pub(crate) fn bound_reply(text: &str, max_chars: usize) -> String {
    let max_chars = max_chars.max(1);
    if text.chars().count() <= max_chars {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(max_chars).collect::<String>())
    }
}

/// Hex forms of an event's ids, as the stores key them, and its history text.
struct Ids {
    message: String,
    conversation: String,
    sender: String,
    bot: String,
    text: String,
}

impl Ids {
    fn of(e: &DmEvent) -> Self {
        Self {
            message: e.message_id.to_hex(),
            conversation: e.conversation_id.to_hex(),
            sender: e.sender_id.to_hex(),
            bot: e.bot_id.to_hex(),
            text: prompt::history_text(e),
        }
    }

    fn job(&self, stream_seq: Option<u64>) -> NewJob<'_> {
        NewJob {
            id: &self.message,
            kind: JOB_KIND,
            user: &self.sender,
            bot: &self.bot,
            conversation: &self.conversation,
            stream_seq,
        }
    }
}
