//! Proactive messages: DMs a companion sends with no user message to answer, because something happened
//! (a moderator reviewed the spot draft it made, a reminder it promised is due). A signal on `<prefix>.signal.<kind>.<id>` becomes one
//! job of the journal, `<kind>:<id>`, so each is sent once however often the signal is delivered:
//!
//! | step | key | what it records |
//! |---|---|---|
//! | `cap` | | the message counted against the user's daily cap (tally `proactive:<user>`) |
//! | `llm` | `0` | the model's message, in character, with what happened in its context |
//! | `reply` | `g0` | the message fixed: the model's text, or the character's plain line when the model failed |
//! | `store_reply`, `history`, `touch`, `publish` | `g0` | delivering it: the path of every reply ([`Turns::write_reply`]) |
//!
//! A message that must not be sent (the user left the conversation or blocked the companion, the daily
//! cap is reached, the news is stale) settles its job `dropped` with the reason, logged and counted.

pub mod reminder;
pub mod spot_review;

use std::{sync::Arc, time::Duration};

use bson::oid::ObjectId;
use chrono::Utc;
use serde_json::Value;
use tracing::{info, warn};

use crate::{
    bus::{Trigger, event::clean_text},
    character::Character,
    failure::{Class, Classify},
    flow::{self, WaitKind, state::Applied},
    journal::{Admission as Counted, Job, NewJob, State},
    llm::{ChatRequest, Message},
    store::{StoreError, mongo::Admission},
    turn::{
        Outgoing, Reply, TurnError, Turns, bound_reply, generation_key,
        prompt::{self, PromptContext},
        tool_loop,
    },
};

/// Counter of proactive messages by kind and outcome.
const PROACTIVE: &str = "companion_proactive_total";
/// The daily cap's window.
const DAY: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum ProactiveError {
    /// The signal cannot be read or names nothing a companion can act on: dead-lettered.
    #[error("invalid signal: {0}")]
    Invalid(String),
    /// The app's data is not there yet (the review's status not stored yet): tried again later.
    #[error("{0}")]
    NotYet(String),
    #[error(transparent)]
    Turn(#[from] TurnError),
}

impl From<StoreError> for ProactiveError {
    fn from(e: StoreError) -> Self {
        Self::Turn(e.into())
    }
}

impl From<crate::journal::JournalError> for ProactiveError {
    fn from(e: crate::journal::JournalError) -> Self {
        Self::Turn(e.into())
    }
}

impl Classify for ProactiveError {
    fn class(&self) -> Class {
        match self {
            Self::Invalid(_) => Class::Reject,
            Self::NotYet(_) => Class::Transient,
            Self::Turn(e) => e.class(),
        }
    }
}

/// How a signal ended well.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProactiveOutcome {
    /// The message was written and published; `plain`: the character's line, the model having failed.
    Sent { reply_id: String, plain: bool },
    /// Not sent, on purpose.
    Dropped { reason: String },
    /// An earlier delivery settled it.
    AlreadySettled { state: State },
}

impl ProactiveOutcome {
    /// The outcome's name in metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sent { plain: false, .. } => "sent",
            Self::Sent { plain: true, .. } => "sent_plain",
            Self::Dropped { .. } => "dropped",
            Self::AlreadySettled { .. } => "already_done",
        }
    }
}

/// A signal's JSON body, read as `T` (`what` names it in errors), whose `field` must be the subject's id.
fn signal_body<T: serde::de::DeserializeOwned>(
    payload: &[u8],
    what: &str,
    subject_id: &str,
    field: &str,
    id_of: impl Fn(&T) -> &str,
) -> Result<T, ProactiveError> {
    let body: T = serde_json::from_slice(payload)
        .map_err(|e| ProactiveError::Invalid(format!("not a {what}: {e}")))?;
    let id = id_of(&body);
    if id != subject_id {
        return Err(ProactiveError::Invalid(format!(
            "{field} {id} does not match the subject's {subject_id}"
        )));
    }
    Ok(body)
}

/// A follow-up ready to be sent: who to, from whom, about what, and how to say it.
pub struct FollowUp<'a> {
    /// What it follows up on: the job is `<kind>:<id>`.
    pub trigger: Trigger,
    pub user: ObjectId,
    pub bot: ObjectId,
    pub conversation: ObjectId,
    pub character: &'a Character,
    /// What happened, for the model (a note after the conversation so far).
    pub brief: String,
    /// The plain line sent when the model cannot write the message.
    pub plain: String,
    /// The card shown with the message.
    pub card: Option<Value>,
    /// Set when the news must not be sent after all (it is stale): the job is dropped with this reason.
    pub stale: Option<String>,
}

/// Sends proactive messages, with the components a turn uses.
pub struct Proactive {
    pub turns: Arc<Turns>,
}

impl Proactive {
    /// Handles one signal delivered from the signal stream (`seq` is its stream sequence).
    pub async fn handle(
        &self,
        subject: &str,
        payload: &[u8],
        seq: u64,
    ) -> Result<ProactiveOutcome, ProactiveError> {
        let t = &self.turns;
        if payload.len() > t.config.max_event_bytes {
            return Err(ProactiveError::Invalid(format!(
                "the signal has {} bytes, more than COMPANION_MAX_EVENT_BYTES ({})",
                payload.len(),
                t.config.max_event_bytes
            )));
        }
        let (kind, id) = t
            .bus
            .names
            .signal_parts(subject)
            .ok_or_else(|| ProactiveError::Invalid(format!("unexpected subject {subject}")))?;
        let mut follow_up = match kind {
            "spot_draft" => spot_review::follow_up(t, id, payload).await?,
            "reminder" => reminder::follow_up(t, id, payload).await?,
            other => {
                return Err(ProactiveError::Invalid(format!(
                    "unknown signal kind `{other}`"
                )));
            }
        };
        if follow_up.stale.is_none()
            && let Some(note) = self.advance_flow(&follow_up).await?
        {
            follow_up.brief.push_str(&note);
        }
        let span = tracing::Span::current();
        span.record(
            "job",
            format!("{}:{}", follow_up.trigger.kind, follow_up.trigger.id),
        );
        span.record("conversation_id", follow_up.conversation.to_hex());
        let mut outcome = self.send(&follow_up, seq).await;
        if let (Ok(o), reminder::KIND) = (&outcome, follow_up.trigger.kind.as_str())
            && let Err(e) = reminder::settle_row(t, &follow_up.trigger.id, o).await
        {
            outcome = Err(e);
        }
        if let Ok(o) = &outcome {
            t.metrics.inc(
                PROACTIVE,
                &format!(
                    "kind=\"{}\",outcome=\"{}\"",
                    follow_up.trigger.kind,
                    o.name()
                ),
            );
        }
        outcome
    }

    /// Moves on the user's flow with the companion when its step waited for this event (once per event:
    /// the change is keyed by the trigger); the note for the model's brief when it did.
    async fn advance_flow(&self, f: &FollowUp<'_>) -> Result<Option<String>, ProactiveError> {
        let t = &self.turns;
        let waited = match f.trigger.kind.as_str() {
            spot_review::KIND => {
                let draft = f.trigger.id.split(':').next().unwrap_or_default();
                WaitKind::SpotReview.key(draft)
            }
            reminder::KIND => WaitKind::Reminder.key(&f.trigger.id),
            _ => return Ok(None),
        };
        let key = format!("event:{}:{}", f.trigger.kind, f.trigger.id);
        let applied = flow::state::apply(
            &t.pg.pool,
            &f.user.to_hex(),
            &f.bot.to_hex(),
            &key,
            |current| {
                Ok::<_, ()>(
                    current
                        .filter(|c| c.waiting_for.as_deref() == Some(waited.as_str()))
                        .filter(|c| c.status == flow::state::status::WAITING)
                        .and_then(|c| Some(flow::resume(t.flows.get(&c.flow)?, c.clone()))),
                )
            },
        )
        .await?;
        let Applied::Changed(Some(s)) = applied else {
            return Ok(None);
        };
        let Some(def) = t.flows.get(&s.flow) else {
            return Ok(None);
        };
        info!(flow = %s.flow, step = %s.step, status = %s.status, "the event moved the user's flow on");
        Ok(Some(format!(
            "\nThis also moves on the guided flow \"{}\" you lead the user through; it stands now: {}. Say \
             what comes next in the same message.",
            def.title,
            flow::view(def, &s)
        )))
    }

    /// Opens the follow-up's job and sends it once.
    async fn send(&self, f: &FollowUp<'_>, seq: u64) -> Result<ProactiveOutcome, ProactiveError> {
        let t = &self.turns;
        let (id, user, bot, conversation) = (
            format!("{}:{}", f.trigger.kind, f.trigger.id),
            f.user.to_hex(),
            f.bot.to_hex(),
            f.conversation.to_hex(),
        );
        let job = t
            .journal
            .open(&NewJob {
                id: &id,
                kind: &f.trigger.kind,
                user: &user,
                bot: &bot,
                conversation: &conversation,
                stream_seq: Some(seq),
            })
            .await?;
        if job.record.state.is_settled() {
            info!(state = ?job.record.state, "follow-up already settled; acknowledging");
            return Ok(ProactiveOutcome::AlreadySettled {
                state: job.record.state,
            });
        }
        let result = self.write(&job, f).await;
        job.keep_successes(result).await
    }

    async fn write(&self, job: &Job, f: &FollowUp<'_>) -> Result<ProactiveOutcome, ProactiveError> {
        let t = &self.turns;
        let generation = generation_key(job);
        let reply = match job.recorded::<Reply>("reply", &generation) {
            Some(reply) => reply,
            None => {
                if let Some(reason) = &f.stale {
                    return self.drop(job, reason).await;
                }
                let user = match t
                    .mongo
                    .admit(f.conversation, f.user, f.bot, prompt::PROMPT_TRICKLISTS)
                    .await?
                {
                    Admission::Admitted(u) if u.blocks_bot => {
                        return self.drop(job, "the user blocked the companion").await;
                    }
                    Admission::Admitted(u) => u,
                    Admission::Missing => {
                        return self.drop(job, "the conversation no longer exists").await;
                    }
                    Admission::NotParticipant => {
                        return self
                            .drop(job, "the user or the companion left the conversation")
                            .await;
                    }
                };
                let tally = format!("proactive:{}", f.user.to_hex());
                let cap = t.config.proactive_daily_cap;
                if let Counted::Exceeded { .. } =
                    job.counted("cap", "", &tally, cap, DAY, Utc::now()).await?
                {
                    let reason = format!("the user's daily cap of {cap} proactive messages");
                    return self.drop(job, &reason).await;
                }
                job.step("reply", &generation)
                    .run(self.compose(job, f, &user))
                    .await?
            }
        };
        let plain = reply.content == f.plain;
        let out = Outgoing {
            conversation: f.conversation,
            bot: f.bot,
            user: f.user,
            in_reply_to: None,
            user_rows: Vec::new(),
            covers: Vec::new(),
            trigger: Some(f.trigger.clone()),
            responds_to: None,
            group: false,
            key: generation.clone(),
        };
        t.write_reply(job, &out, &reply).await?;
        job.settle(State::Done, None).await?;
        info!(reply_id = %reply.id, plain, "follow-up delivered");
        Ok(ProactiveOutcome::Sent {
            reply_id: reply.id,
            plain,
        })
    }

    /// The message the model writes with what happened in its context; the character's plain line when
    /// the model fails after all its retries and fallbacks (the news is never held back for it).
    async fn compose(
        &self,
        job: &Job,
        f: &FollowUp<'_>,
        user: &crate::store::mongo::UserData,
    ) -> Result<Reply, TurnError> {
        let t = &self.turns;
        let (history, tricklists) = tokio::try_join!(
            async {
                t.pg.history(&f.user.to_hex(), &f.bot.to_hex(), t.config.history_limit)
                    .await
                    .map_err(TurnError::from)
            },
            async {
                t.mongo
                    .resolve_tricklists(&user.tricklists)
                    .await
                    .map_err(TurnError::from)
            },
        )?;
        let system = prompt::system_prompt(&PromptContext {
            character: f.character,
            profile: user.profile.as_ref(),
            tricklists: &tricklists,
            knowledge: &[],
            reminders: &[],
            now: Utc::now(),
            tools_enabled: false,
            flow: "",
        });
        let mut messages = prompt::conversation(system, &history.messages, &[]);
        messages.push(Message::system(f.brief.clone()));
        let request = ChatRequest {
            model: f
                .character
                .model
                .clone()
                .unwrap_or_else(|| t.llm.default_model.clone()),
            messages,
            tools: Default::default(),
            tool_choice: None,
            max_tokens: Some(t.llm.max_tokens),
            temperature: Some(t.llm.temperature),
        };
        let owner = f.user.to_hex();
        let written = match tool_loop::answer_in_text(job, &t.llm, &t.spend, &owner, &request).await
        {
            Ok(Some(text)) => bound_reply(clean_text(&text).trim(), t.config.max_reply_chars),
            Ok(None) => {
                info!("the spend budget is used up; sending the plain line");
                String::new()
            }
            Err(TurnError::Llm(e)) => {
                warn!(error = %e, "the model could not write the follow-up; sending the plain line");
                String::new()
            }
            Err(e) => return Err(e),
        };
        let content = if written.is_empty() {
            f.plain.clone()
        } else {
            written
        };
        Ok(Reply::new(content, f.card.clone(), None))
    }

    /// Settles the job without a message, saying why.
    async fn drop(&self, job: &Job, reason: &str) -> Result<ProactiveOutcome, ProactiveError> {
        self.turns.journal.note_error(job.id(), reason).await?;
        job.settle(State::Dropped, None).await?;
        info!(reason, "follow-up dropped");
        Ok(ProactiveOutcome::Dropped {
            reason: reason.to_owned(),
        })
    }
}
