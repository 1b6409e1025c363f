//! One turn: an inbound DM becomes the companion's reply in dm_messages, history and a completion event.

pub mod prompt;
pub mod tool_loop;

use bson::oid::ObjectId;
use chrono::{DateTime, Utc};
use serde_json::Value;
use tracing::{debug, info};

use crate::{
    bus::{BusError, Completion, DmEvent, Typing, event::InvalidEvent},
    character::Character,
    llm::{ChatRequest, LlmError},
    services::Services,
    store::{
        StoreError,
        mongo::{ConversationCheck, ReplyDoc},
        pg::NewHistory,
    },
    timing::{Stage, stage},
};

/// Longest reply stored and published, in characters.
pub const MAX_REPLY_CHARS: usize = 4000;

/// How a turn ended well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The reply was written and published.
    Answered { reply_id: String },
    /// An earlier delivery already completed this turn.
    AlreadyDone,
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
            Self::Store(_) | Self::Bus(_) | Self::EmptyReply => Disposition::Retry,
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

/// Runs one validated event to completion.
pub async fn run(svc: &Services, event: &DmEvent) -> Result<Outcome, TurnError> {
    let character = stage(Stage::Admit, admit(svc, event)).await?;
    let ids = Ids::of(event);
    let record = stage(
        Stage::Journal,
        svc.pg
            .begin_turn(&ids.message, &ids.conversation, &ids.sender, &ids.bot),
    )
    .await?;
    if record.state == "done" {
        info!(
            attempts = record.attempts,
            "turn already completed; acknowledging"
        );
        return Ok(Outcome::AlreadyDone);
    }
    let reply = match (record.reply_content, record.reply_id.is_some()) {
        (Some(content), true) => {
            debug!("reply already recorded; delivering it again");
            Reply {
                content,
                rich_content: record.rich_content,
                tool_log: None,
            }
        }
        _ => {
            let typing = Typing {
                conversation_id: ids.conversation.clone(),
                sender_id: ids.bot.clone(),
                typing: true,
                at: Utc::now(),
            };
            if let Err(e) = stage(Stage::Publish, svc.bus.publish_typing(&typing)).await {
                debug!(error = %e, "typing indicator not sent");
            }
            respond(svc, event, character).await?
        }
    };
    // Writes are the delivery's time less its publish (stages count their own time only).
    let reply_id = stage(Stage::Writes, deliver(svc, event, reply, "done")).await?;
    Ok(Outcome::Answered { reply_id })
}

/// Loads the context, asks the model and returns its answer.
async fn respond(
    svc: &Services,
    event: &DmEvent,
    character: &Character,
) -> Result<Reply, TurnError> {
    let ids = Ids::of(event);
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
        crate::rag::retrieve_for_turn(svc, character, &event.content),
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
    let messages = prompt::conversation(system, &history, event);
    crate::timing::add(Stage::Prompt, prompt_started);
    let request = ChatRequest {
        model: character
            .model
            .clone()
            .unwrap_or_else(|| svc.llm.default_model.clone()),
        messages,
        tools: Vec::new(),
        tool_choice: None,
        max_tokens: Some(svc.llm.max_tokens),
        temperature: Some(svc.llm.temperature),
    };
    let registry = &*crate::tools::REGISTRY;
    let out = tool_loop::run(svc, event, character, registry, request).await?;
    let content = bound_reply(out.text.trim());
    if content.is_empty() {
        return Err(TurnError::EmptyReply);
    }
    Ok(Reply {
        content,
        rich_content: out.card,
        tool_log: (!out.log.is_empty()).then(|| Value::Array(out.log)),
    })
}

/// Answers the event with the character's honest failure line (once, like any reply; never over a
/// turn that was answered).
pub async fn answer_with_failure(
    svc: &Services,
    event: &DmEvent,
    reason: &str,
) -> Result<String, TurnError> {
    let character = admit(svc, event).await?;
    let ids = Ids::of(event);
    let record = svc
        .pg
        .begin_turn(&ids.message, &ids.conversation, &ids.sender, &ids.bot)
        .await?;
    if record.state == "done" {
        info!("turn was answered after all; no failure line");
        return Ok(record.reply_id.unwrap_or_default());
    }
    svc.pg.note_error(&ids.message, reason).await?;
    let reply = Reply {
        content: character.failure_line.clone(),
        rich_content: None,
        tool_log: None,
    };
    deliver(svc, event, reply, "failed").await
}

/// Writes the reply once and publishes it; every step is safe to repeat.
async fn deliver(
    svc: &Services,
    event: &DmEvent,
    reply: Reply,
    final_state: &str,
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
        })
        .await?;
    if !inserted {
        debug!("reply document already present");
    }
    let user_at = user_message_time(event.sent_at, at);
    svc.pg
        .append_history(&[
            NewHistory {
                user_id: &ids.sender,
                bot_id: &ids.bot,
                conversation_id: &ids.conversation,
                role: "user",
                content: &prompt::history_text(event),
                message_id: &ids.message,
                tool_calls: None,
                created_at: user_at,
            },
            NewHistory {
                user_id: &ids.sender,
                bot_id: &ids.bot,
                conversation_id: &ids.conversation,
                role: "assistant",
                content: &content,
                message_id: &reply_id_hex,
                tool_calls: reply.tool_log.as_ref(),
                created_at: at,
            },
        ])
        .await?;
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
        }),
    )
    .await?;
    svc.pg.finish_turn(&ids.message, final_state, None).await?;
    info!(reply_id = %reply_id_hex, state = final_state, "reply delivered");
    Ok(reply_id_hex)
}

/// The user's message sorts before the reply even when the client clock is off.
fn user_message_time(sent_at: DateTime<Utc>, reply_at: DateTime<Utc>) -> DateTime<Utc> {
    sent_at.min(reply_at - chrono::Duration::microseconds(1))
}

fn bound_reply(text: &str) -> String {
    if text.chars().count() <= MAX_REPLY_CHARS {
        text.to_owned()
    } else {
        format!(
            "{}…",
            text.chars().take(MAX_REPLY_CHARS).collect::<String>()
        )
    }
}

/// Hex forms of an event's ids, as the stores key them.
struct Ids {
    message: String,
    conversation: String,
    sender: String,
    bot: String,
}

impl Ids {
    fn of(e: &DmEvent) -> Self {
        Self {
            message: e.message_id.to_hex(),
            conversation: e.conversation_id.to_hex(),
            sender: e.sender_id.to_hex(),
            bot: e.bot_id.to_hex(),
        }
    }
}
