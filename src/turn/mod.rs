//! One turn: an inbound DM, with the rest of its burst, becomes the companion's reply in dm_messages,
//! history and a completion event.
//!
//! A burst: messages the user sent after this one that are already in the stream when the turn starts
//! (up to `COMPANION_BURST_MAX`) are answered by the same reply, as a person would answer five quick
//! lines once. They are fixed in the journal on the first attempt (`covers`), become `covered` turns of
//! their own, and are listed in the completion's `covers`.

pub mod prompt;
pub mod tool_loop;

use bson::oid::ObjectId;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tracing::{debug, info};

use crate::{
    bus::{BusError, Completion, DmEvent, Typing, event::InvalidEvent, event::parse_inbound},
    character::Character,
    llm::{ChatRequest, LlmError},
    order::{Order, OrderError},
    services::Services,
    store::{
        StoreError,
        mongo::{ConversationCheck, ReplyDoc},
        pg::{NewHistory, TurnRecord},
    },
    timing::{Stage, stage},
};

/// Said when a character file has no `busyLine`.
const DEFAULT_BUSY_LINE: &str =
    "you're sending messages faster than i can read them, give me a minute to catch up";

/// How a turn ended well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The reply was written and published.
    Answered { reply_id: String },
    /// Over the user's flood limit: answered by the busy line, or by none when it was already said
    /// within the window.
    Limited { reply_id: Option<String> },
    /// An earlier delivery already settled this message (`state` as the journal has it).
    AlreadySettled { state: String },
}

impl Outcome {
    /// The outcome's name in metrics (`outcome="…"`) and in the turn's timing record.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Answered { .. } => "answered",
            Self::Limited { .. } => "limited",
            Self::AlreadySettled { .. } => "already_done",
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

/// Why a turn did not end well; [`TurnError::disposition`] says what to do about it.
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
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Order(#[from] OrderError),
    #[error(transparent)]
    Llm(#[from] LlmError),
    #[error("the model answered with no text")]
    EmptyReply,
}

/// What the worker does with a failed turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Try again later (NAK with delay), until the last delivery.
    Retry,
    /// Never answerable, but the user is owed an honest failure line.
    Fail,
    /// Not a valid turn at all: dead-letter without a reply.
    Reject,
}

impl TurnError {
    /// A wait the failing service asked for (e.g. the model's `Retry-After`).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::Llm(e) => e.retry_after(),
            _ => None,
        }
    }

    pub fn disposition(&self) -> Disposition {
        match self {
            Self::Invalid(_)
            | Self::UnknownBot(_)
            | Self::MissingConversation(_)
            | Self::NotParticipant(_) => Disposition::Reject,
            Self::Store(_) | Self::Bus(_) | Self::Order(_) | Self::EmptyReply => Disposition::Retry,
            Self::Llm(e) if e.is_transient() => Disposition::Retry,
            Self::Llm(_) => Disposition::Fail,
        }
    }
}

/// The answer of a turn before it is delivered.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub content: String,
    pub rich_content: Option<Value>,
    /// Compact log of the tool calls behind this reply, kept on the assistant's history row.
    pub tool_log: Option<Value>,
}

/// The later messages of a burst answered with the head message, with their stream sequences.
#[derive(Debug, Clone, Default)]
pub struct Burst {
    pub messages: Vec<(DmEvent, u64)>,
}

impl Burst {
    /// The burst fixed in the journal (none when not fixed yet).
    fn of_record(head: &DmEvent, record: &TurnRecord) -> Self {
        let Some(Value::Array(items)) = &record.covers else {
            return Self::default();
        };
        let messages = items
            .iter()
            .filter_map(|v| {
                let id = crate::bus::event::parse_object_id(v["messageId"].as_str()?)?;
                let seq = v["seq"].as_u64()?;
                let event = DmEvent {
                    message_id: id,
                    content: v["content"].as_str().unwrap_or_default().to_owned(),
                    images: v["images"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|u| u.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default(),
                    sent_at: v["sentAt"]
                        .as_str()
                        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                        .map(|t| t.with_timezone(&Utc))
                        .unwrap_or(head.sent_at),
                    ..head.clone()
                };
                Some((event, seq))
            })
            .collect();
        Self { messages }
    }

    fn entry(event: &DmEvent, seq: u64) -> Value {
        json!({
            "messageId": event.message_id.to_hex(),
            "seq": seq,
            "content": event.content,
            "images": event.images,
            "sentAt": event.sent_at.to_rfc3339(),
        })
    }

    pub fn last_seq(&self) -> Option<u64> {
        self.messages.last().map(|(_, seq)| *seq)
    }

    fn ids(&self) -> Vec<String> {
        self.messages
            .iter()
            .map(|(e, _)| e.message_id.to_hex())
            .collect()
    }
}

/// The checks every event passes before anything is written for it: a known companion, and a
/// conversation that exists and joins the sender and the bot.
pub async fn admit<'a>(svc: &'a Services, event: &DmEvent) -> Result<&'a Character, TurnError> {
    let character = svc
        .characters
        .by_bot(&event.bot_id)
        .ok_or_else(|| TurnError::UnknownBot(event.bot_id.to_hex()))?;
    match svc
        .mongo
        .check_conversation(event.conversation_id, event.sender_id, event.bot_id)
        .await?
    {
        ConversationCheck::Ok => Ok(character),
        ConversationCheck::Missing => Err(TurnError::MissingConversation(
            event.conversation_id.to_hex(),
        )),
        ConversationCheck::NotParticipant => {
            Err(TurnError::NotParticipant(event.conversation_id.to_hex()))
        }
    }
}

/// Runs one validated event to completion (no burst: for callers without a stream delivery).
pub async fn run(svc: &Services, event: &DmEvent) -> Result<Outcome, TurnError> {
    run_delivered(svc, event, None).await.map(|s| s.outcome)
}

/// Runs one validated event delivered from the stream; later messages of its burst already in the
/// stream are answered with it.
pub async fn run_delivered(
    svc: &Services,
    event: &DmEvent,
    delivery: Option<&Delivery<'_>>,
) -> Result<Settled, TurnError> {
    let character = stage(Stage::Admit, admit(svc, event)).await?;
    let ids = Ids::of(event);
    let record = stage(
        Stage::Journal,
        svc.pg.begin_turn(
            &ids.message,
            &ids.conversation,
            &ids.sender,
            &ids.bot,
            delivery.map(|d| d.seq),
        ),
    )
    .await?;
    if let Some(settled) = already_settled(event, &record) {
        info!(state = %record.state, attempts = record.attempts, "message already settled; acknowledging");
        return Ok(settled);
    }
    let busy = answered_by_busy_line(&ids, &record);
    let (burst, reply) = match recorded_reply(&record) {
        Some(reply) => {
            debug!("reply already recorded; delivering it again");
            (Burst::of_record(event, &record), reply)
        }
        None => {
            // Only a first attempt takes from the allowance: a retried turn was admitted already. A
            // retried turn that was found over the limit (the journal says who answers it) stays so.
            if record.covered_by.is_some()
                || (record.attempts == 1
                    && record.covers.is_none()
                    && !svc.flood.allow(event.sender_id))
            {
                return limited(svc, event, character, &record).await;
            }
            let burst = stage(Stage::Order, burst(svc, event, delivery, &record)).await?;
            let typing = Typing {
                conversation_id: ids.conversation.clone(),
                sender_id: ids.bot.clone(),
                typing: true,
                at: Utc::now(),
            };
            if let Err(e) = stage(Stage::Publish, svc.bus.publish_typing(&typing)).await {
                debug!(error = %e, "typing indicator not sent");
            }
            let reply = respond(svc, event, &burst, character).await?;
            (burst, reply)
        }
    };
    let state = if busy { "limited" } else { "done" };
    // Writes are the delivery's time less its publish (stages count their own time only).
    let reply_id = stage(
        Stage::Writes,
        deliver(svc, event, &burst, reply, state, record.generation),
    )
    .await?;
    Ok(Settled {
        through_seq: burst.last_seq(),
        outcome: if busy {
            Outcome::Limited {
                reply_id: Some(reply_id),
            }
        } else {
            Outcome::Answered { reply_id }
        },
    })
}

/// Fixes the burst this turn answers: the journal's if an earlier attempt fixed it, else the messages
/// of the same sender that follow in the stream now (contiguous, valid, within the bounds).
async fn burst(
    svc: &Services,
    event: &DmEvent,
    delivery: Option<&Delivery<'_>>,
    record: &TurnRecord,
) -> Result<Burst, TurnError> {
    if record.covers.is_some() {
        return Ok(Burst::of_record(event, record));
    }
    let mut candidates = Vec::new();
    if let Some(d) = delivery
        && svc.config.burst_max > 0
    {
        let limits = svc.config.event_limits();
        let mut chars = event.content.chars().count();
        for m in d
            .order
            .followers(d.subject, d.seq, svc.config.burst_max)
            .await?
        {
            let Ok(f) = parse_inbound(
                &m.payload,
                m.subject.as_str(),
                &svc.bus.names.prefix,
                limits,
            ) else {
                break;
            };
            chars += f.content.chars().count();
            if f.sender_id != event.sender_id
                || f.message_id == event.message_id
                || chars > svc.config.max_content_chars
            {
                break;
            }
            candidates.push(Burst::entry(&f, m.sequence));
        }
    }
    let ids = Ids::of(event);
    let fixed = svc
        .pg
        .fix_covers(
            &ids.message,
            &ids.conversation,
            &ids.sender,
            &ids.bot,
            &candidates,
        )
        .await?;
    let burst = Burst::of_record(
        event,
        &TurnRecord {
            covers: Some(Value::Array(fixed)),
            ..record.clone()
        },
    );
    if !burst.messages.is_empty() {
        info!(
            covers = burst.messages.len(),
            "answering a burst of messages with one reply"
        );
    }
    Ok(burst)
}

/// Over the flood limit: the busy line once per window; later messages of the window are recorded
/// (journal and history, so the next real turn sees them) without a reply of their own.
async fn limited(
    svc: &Services,
    event: &DmEvent,
    character: &Character,
    record: &TurnRecord,
) -> Result<Settled, TurnError> {
    let ids = Ids::of(event);
    // The decision is journaled (`covered_by`) before anything else, so a retry carries it out the same.
    let by = match &record.covered_by {
        Some(by) => by.clone(),
        None => {
            let window = chrono::Duration::from_std(svc.flood.window).unwrap_or_default();
            let by = svc
                .pg
                .recent_busy_notice(&ids.sender, &ids.bot, Utc::now() - window)
                .await?
                .unwrap_or_else(|| ids.message.clone());
            svc.pg.set_covered_by(&ids.message, &by).await?;
            by
        }
    };
    if by != ids.message {
        svc.pg
            .append_history(&[user_row(&ids, event, Utc::now())])
            .await?;
        svc.pg.mark_limited(&ids.message, &by).await?;
        info!(answered_by = %by, "over the flood limit; the busy line already answered this minute");
        return Ok(Settled {
            outcome: Outcome::Limited { reply_id: None },
            through_seq: None,
        });
    }
    info!("over the flood limit; answering with the busy line");
    let reply = Reply {
        content: character
            .busy_line
            .clone()
            .unwrap_or_else(|| DEFAULT_BUSY_LINE.to_owned()),
        rich_content: None,
        tool_log: None,
    };
    let reply_id = stage(
        Stage::Writes,
        deliver(
            svc,
            event,
            &Burst::default(),
            reply,
            "limited",
            record.generation,
        ),
    )
    .await?;
    Ok(Settled {
        outcome: Outcome::Limited {
            reply_id: Some(reply_id),
        },
        through_seq: None,
    })
}

/// Loads the context, asks the model and returns its answer.
async fn respond(
    svc: &Services,
    event: &DmEvent,
    burst: &Burst,
    character: &Character,
) -> Result<Reply, TurnError> {
    let ids = Ids::of(event);
    let events: Vec<&DmEvent> = std::iter::once(event)
        .chain(burst.messages.iter().map(|(e, _)| e))
        .collect();
    let query = events
        .iter()
        .map(|e| e.content.as_str())
        .filter(|c| !c.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    // Retrieval (embedding + vector search) runs beside the context loads, not after them.
    let (context, knowledge) = tokio::join!(
        stage(Stage::Context, async {
            tokio::try_join!(
                svc.pg
                    .history(&ids.sender, &ids.bot, svc.config.history_limit),
                svc.mongo.user_profile(event.sender_id),
                svc.mongo
                    .user_tricklists(event.sender_id, prompt::PROMPT_TRICKLISTS),
            )
        }),
        crate::rag::retrieve_for_turn(svc, character, &query),
    );
    let (history, profile, tricklists) = context?;
    let prompt_started = std::time::Instant::now();
    let system = prompt::system_prompt(&prompt::PromptContext {
        character,
        profile: profile.as_ref(),
        tricklists: &tricklists,
        knowledge: &knowledge,
        now: Utc::now(),
        tools_enabled: true,
    });
    let messages = prompt::conversation(system, &history, &events);
    crate::timing::add(Stage::Prompt, prompt_started);
    let request = ChatRequest {
        model: character
            .model
            .clone()
            .unwrap_or_else(|| svc.llm.default_model.clone()),
        messages,
        tools: Default::default(),
        tool_choice: None,
        max_tokens: Some(svc.llm.max_tokens),
        temperature: Some(svc.llm.temperature),
    };
    let registry = &*crate::tools::REGISTRY;
    let out = tool_loop::run(svc, event, character, registry, request).await?;
    let content = bound_reply(out.text.trim(), svc.config.max_reply_chars);
    if content.is_empty() {
        return Err(TurnError::EmptyReply);
    }
    Ok(Reply {
        content,
        rich_content: out.card,
        tool_log: (!out.log.is_empty()).then(|| Value::Array(out.log)),
    })
}

/// Answers the event (and the burst fixed with it) with the character's honest failure line, once like
/// any reply; never over a settled turn. A reply recorded before the failure is delivered instead.
pub async fn answer_with_failure(
    svc: &Services,
    event: &DmEvent,
    reason: &str,
) -> Result<Settled, TurnError> {
    let character = admit(svc, event).await?;
    let ids = Ids::of(event);
    let record = svc
        .pg
        .begin_turn(&ids.message, &ids.conversation, &ids.sender, &ids.bot, None)
        .await?;
    if let Some(settled) = already_settled(event, &record) {
        info!(state = %record.state, "message settled after all; no failure line");
        return Ok(settled);
    }
    let burst = Burst::of_record(event, &record);
    svc.pg.note_error(&ids.message, reason).await?;
    let recorded_state = if answered_by_busy_line(&ids, &record) {
        "limited"
    } else {
        "done"
    };
    let (reply, state) = match recorded_reply(&record) {
        Some(reply) => (reply, recorded_state),
        None => (
            Reply {
                content: character.failure_line.clone(),
                rich_content: None,
                tool_log: None,
            },
            "failed",
        ),
    };
    let reply_id = deliver(svc, event, &burst, reply, state, record.generation).await?;
    Ok(Settled {
        through_seq: burst.last_seq(),
        outcome: Outcome::Answered { reply_id },
    })
}

/// A turn the journal says is settled is acknowledged again, with what its reply covered.
fn already_settled(event: &DmEvent, record: &TurnRecord) -> Option<Settled> {
    (record.state != "running").then(|| Settled {
        through_seq: Burst::of_record(event, record).last_seq(),
        outcome: Outcome::AlreadySettled {
            state: record.state.clone(),
        },
    })
}

/// The reply an earlier attempt recorded before it failed to deliver it.
fn recorded_reply(record: &TurnRecord) -> Option<Reply> {
    match (&record.reply_content, record.reply_id.is_some()) {
        (Some(content), true) => Some(Reply {
            content: content.clone(),
            rich_content: record.rich_content.clone(),
            tool_log: None,
        }),
        _ => None,
    }
}

/// A turn answered by the busy line marks itself as answered by itself before it delivers.
fn answered_by_busy_line(ids: &Ids, record: &TurnRecord) -> bool {
    record.covered_by.as_deref() == Some(ids.message.as_str())
}

/// Writes the reply once and publishes it; every step is safe to repeat.
async fn deliver(
    svc: &Services,
    event: &DmEvent,
    burst: &Burst,
    reply: Reply,
    final_state: &str,
    generation: i32,
) -> Result<String, TurnError> {
    let ids = Ids::of(event);
    let record = svc
        .pg
        .record_reply(
            &ids.message,
            &ObjectId::new().to_hex(),
            &reply.content,
            reply.rich_content.as_ref(),
            Utc::now(),
        )
        .await?;
    // The first recorded reply wins, so a retry writes exactly the same document.
    let reply_id_hex = record.reply_id.unwrap_or_default();
    let reply_id = ObjectId::parse_str(&reply_id_hex)
        .map_err(|_| StoreError::Pg(sqlx::Error::Protocol("bad reply id in journal".into())))?;
    let content = record.reply_content.unwrap_or(reply.content);
    let rich_content = record.rich_content;
    let at = record.reply_at.unwrap_or_else(Utc::now);
    let inserted = svc
        .mongo
        .insert_reply(&ReplyDoc {
            id: reply_id,
            conversation_id: event.conversation_id,
            sender_id: event.bot_id,
            in_reply_to: event.message_id,
            content: content.clone(),
            rich_content: rich_content.clone(),
            timestamp: at,
            generation,
        })
        .await?;
    if !inserted {
        debug!("reply document already present");
    }
    let follower_ids: Vec<Ids> = burst.messages.iter().map(|(e, _)| Ids::of(e)).collect();
    let mut rows = vec![user_row(&ids, event, at)];
    for ((e, _), fids) in burst.messages.iter().zip(&follower_ids) {
        rows.push(user_row(fids, e, at));
    }
    rows.push(NewHistory {
        user_id: &ids.sender,
        bot_id: &ids.bot,
        conversation_id: &ids.conversation,
        role: "assistant",
        content: &content,
        message_id: &reply_id_hex,
        tool_calls: reply.tool_log.as_ref(),
        created_at: at,
    });
    svc.pg.append_history(&rows).await?;
    svc.mongo
        .touch_conversation(event.conversation_id, &content, at)
        .await?;
    stage(
        Stage::Publish,
        svc.bus.publish_completion(&Completion {
            message_id: reply_id_hex.clone(),
            in_reply_to: ids.message.clone(),
            conversation_id: ids.conversation.clone(),
            sender_id: ids.bot.clone(),
            content,
            rich_content,
            created_at: at,
            covers: burst.ids(),
        }),
    )
    .await?;
    svc.pg.finish_turn(&ids.message, final_state, None).await?;
    info!(reply_id = %reply_id_hex, state = final_state, generation, "reply delivered");
    Ok(reply_id_hex)
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
    }
}

/// The user's message sorts before the reply even when the client clock is off.
fn user_message_time(sent_at: DateTime<Utc>, reply_at: DateTime<Utc>) -> DateTime<Utc> {
    sent_at.min(reply_at - chrono::Duration::microseconds(1))
}

fn bound_reply(text: &str, max_chars: usize) -> String {
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
}
