//! The event contract between TB-Backend and the workers, and the validation of inbound events.
//!
//! Inbound (`<prefix>.in.<botId>.<conversationId>`, header `Nats-Msg-Id: <messageId>`) and
//! outbound (`<prefix>.out.<conversationId>`, `<prefix>.typing.<conversationId>`) bodies are JSON in camelCase.

use bson::oid::ObjectId;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Most attachments accepted on one message (the app sends one image per DM).
pub(crate) const MAX_ATTACHMENTS: usize = 4;
/// Longest accepted attachment URL.
pub(crate) const MAX_URL_LEN: usize = 2048;

/// A bot-bound DM, as TB-Backend publishes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboundEvent {
    /// `_id` of the user's message in dm_messages; also the event's `Nats-Msg-Id`.
    pub message_id: String,
    pub conversation_id: String,
    pub sender_id: String,
    pub bot_id: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    pub sent_at: DateTime<Utc>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attachment {
    #[serde(rename = "type")]
    pub kind: String,
    pub url: String,
}

/// A user's message in a group conversation, as TB-Backend publishes it once on
/// `<prefix>.group.<conversationId>`: a DM event without `botId`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupMessageEvent {
    pub message_id: String,
    pub conversation_id: String,
    pub sender_id: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    pub sent_at: DateTime<Utc>,
}

/// A validated group message: who sent what to the group; which companions answer is decided later.
#[derive(Clone, Debug)]
pub struct GroupEvent {
    pub message_id: ObjectId,
    pub conversation_id: ObjectId,
    pub sender_id: ObjectId,
    pub content: String,
    pub images: Vec<String>,
    pub(crate) sent_at: DateTime<Utc>,
}

impl GroupEvent {
    /// The message as addressed to one companion of the group (for the prompt, tools and history).
    pub fn to_bot(&self, bot: ObjectId) -> DmEvent {
        DmEvent {
            message_id: self.message_id,
            conversation_id: self.conversation_id,
            sender_id: self.sender_id,
            bot_id: bot,
            content: self.content.clone(),
            images: self.images.clone(),
            sent_at: self.sent_at,
        }
    }
}

/// Any event of the inbound stream, validated.
#[derive(Clone, Debug)]
pub enum Inbound {
    /// A DM to one companion (`<prefix>.in.<botId>.<conversationId>`).
    Dm(DmEvent),
    /// A message to a group (`<prefix>.group.<conversationId>`).
    Group(GroupEvent),
}

impl Inbound {
    pub fn message_id(&self) -> ObjectId {
        match self {
            Self::Dm(e) => e.message_id,
            Self::Group(e) => e.message_id,
        }
    }

    pub fn conversation_id(&self) -> ObjectId {
        match self {
            Self::Dm(e) => e.conversation_id,
            Self::Group(e) => e.conversation_id,
        }
    }

    pub fn sender_id(&self) -> ObjectId {
        match self {
            Self::Dm(e) => e.sender_id,
            Self::Group(e) => e.sender_id,
        }
    }

    /// The companion a DM is for; none for a group message.
    pub fn bot_id(&self) -> Option<ObjectId> {
        match self {
            Self::Dm(e) => Some(e.bot_id),
            Self::Group(_) => None,
        }
    }
}

/// Parses an event of the inbound stream by its subject: a group message on `<prefix>.group.…`, a DM
/// otherwise.
pub fn parse_event(
    payload: &[u8],
    subject: &str,
    prefix: &str,
    limits: EventLimits,
) -> Result<Inbound, InvalidEvent> {
    let group = subject
        .strip_prefix(prefix)
        .is_some_and(|t| t.starts_with(".group."));
    if group {
        parse_group(payload, subject, prefix, limits).map(Inbound::Group)
    } else {
        parse_inbound(payload, subject, prefix, limits).map(Inbound::Dm)
    }
}

/// Parses and validates one group message received on `subject` (`<prefix>.group.<conversationId>`).
pub(crate) fn parse_group(
    payload: &[u8],
    subject: &str,
    prefix: &str,
    limits: EventLimits,
) -> Result<GroupEvent, InvalidEvent> {
    let raw: GroupMessageEvent = decode(payload, limits)?;
    let message_id = oid("messageId", &raw.message_id)?;
    let conversation_id = oid("conversationId", &raw.conversation_id)?;
    let sender_id = oid("senderId", &raw.sender_id)?;
    if subject != format!("{prefix}.group.{}", raw.conversation_id) {
        return Err(InvalidEvent::SubjectMismatch {
            subject: truncate(subject, 200),
        });
    }
    let (content, images) = check_body(&raw.content, &raw.attachments, limits)?;
    Ok(GroupEvent {
        message_id,
        conversation_id,
        sender_id,
        content,
        images,
        sent_at: raw.sent_at,
    })
}

/// The payload as `T`: within the size limit, UTF-8, JSON of the contract.
fn decode<T: serde::de::DeserializeOwned>(
    payload: &[u8],
    limits: EventLimits,
) -> Result<T, InvalidEvent> {
    if payload.len() > limits.max_event_bytes {
        return Err(InvalidEvent::TooLarge {
            size: payload.len(),
            limit: limits.max_event_bytes,
        });
    }
    let text = std::str::from_utf8(payload).map_err(|_| InvalidEvent::NotUtf8)?;
    serde_json::from_str(text).map_err(|e| InvalidEvent::Malformed(truncate(&e.to_string(), 200)))
}

/// A field that must be an ObjectId.
fn oid(field: &'static str, value: &str) -> Result<ObjectId, InvalidEvent> {
    parse_object_id(value).ok_or(InvalidEvent::BadId { field })
}

/// The message's text (cleaned) and image URLs, within the limits; not both empty.
fn check_body(
    content: &str,
    attachments: &[Attachment],
    limits: EventLimits,
) -> Result<(String, Vec<String>), InvalidEvent> {
    let chars = content.chars().count();
    if chars > limits.max_content_chars {
        return Err(InvalidEvent::ContentTooLong {
            chars,
            limit: limits.max_content_chars,
        });
    }
    if attachments.len() > MAX_ATTACHMENTS {
        return Err(InvalidEvent::BadAttachment {
            index: MAX_ATTACHMENTS,
            why: "too many attachments",
        });
    }
    let mut images = Vec::with_capacity(attachments.len());
    for (index, a) in attachments.iter().enumerate() {
        if a.kind != "image" {
            return Err(InvalidEvent::BadAttachment {
                index,
                why: "only type \"image\" is supported",
            });
        }
        if a.url.len() > MAX_URL_LEN
            || !(a.url.starts_with("https://") || a.url.starts_with("http://"))
            || a.url.chars().any(char::is_control)
        {
            return Err(InvalidEvent::BadAttachment {
                index,
                why: "url must be http(s), at most 2048 bytes, without control characters",
            });
        }
        images.push(a.url.clone());
    }
    let content = clean_text(content).trim().to_owned();
    if content.is_empty() && images.is_empty() {
        return Err(InvalidEvent::Empty);
    }
    Ok((content, images))
}

/// An inbound event that passed validation, with its ids parsed.
#[derive(Clone, Debug)]
pub struct DmEvent {
    pub message_id: ObjectId,
    pub conversation_id: ObjectId,
    pub sender_id: ObjectId,
    pub bot_id: ObjectId,
    pub content: String,
    /// Image URLs (http or https only).
    pub images: Vec<String>,
    pub sent_at: DateTime<Utc>,
}

/// Why an inbound event can never be processed. The text is the dead-letter reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidEvent {
    #[error("event is {size} bytes, over the limit of {limit}")]
    TooLarge { size: usize, limit: usize },
    #[error("event is not UTF-8")]
    NotUtf8,
    #[error("event is not valid JSON for the contract: {0}")]
    Malformed(String),
    #[error("field `{field}` is not a 24-hex ObjectId")]
    BadId { field: &'static str },
    #[error("content is {chars} characters, over the limit of {limit}")]
    ContentTooLong { chars: usize, limit: usize },
    #[error("message has neither text nor an image")]
    Empty,
    #[error("attachment {index}: {why}")]
    BadAttachment { index: usize, why: &'static str },
    #[error("subject `{subject}` does not match the event's botId and conversationId")]
    SubjectMismatch { subject: String },
    #[error("sender is the bot itself")]
    SelfMessage,
}

/// EventLimits applied while parsing.
#[derive(Clone, Copy, Debug)]
pub struct EventLimits {
    pub max_event_bytes: usize,
    pub max_content_chars: usize,
}

impl EventLimits {
    pub fn of(config: &crate::config::TurnConfig) -> Self {
        Self {
            max_event_bytes: config.max_event_bytes,
            max_content_chars: config.max_content_chars,
        }
    }
}

/// The text without C0 control characters other than tab and newline (NUL among them, which
/// PostgreSQL cannot store): invisible in a chat, and never worth failing a message over.
pub fn clean_text(text: &str) -> String {
    text.chars()
        .filter(|c| *c >= ' ' || matches!(c, '\t' | '\n'))
        .collect()
}

/// Parses and validates one inbound payload received on `subject` (`<prefix>.in.<botId>.<conversationId>`).
pub fn parse_inbound(
    payload: &[u8],
    subject: &str,
    prefix: &str,
    limits: EventLimits,
) -> Result<DmEvent, InvalidEvent> {
    let raw: InboundEvent = decode(payload, limits)?;
    let message_id = oid("messageId", &raw.message_id)?;
    let conversation_id = oid("conversationId", &raw.conversation_id)?;
    let sender_id = oid("senderId", &raw.sender_id)?;
    let bot_id = oid("botId", &raw.bot_id)?;
    if sender_id == bot_id {
        return Err(InvalidEvent::SelfMessage);
    }
    let expected = format!("{prefix}.in.{}.{}", raw.bot_id, raw.conversation_id);
    if subject != expected {
        return Err(InvalidEvent::SubjectMismatch {
            subject: truncate(subject, 200),
        });
    }
    let (content, images) = check_body(&raw.content, &raw.attachments, limits)?;
    Ok(DmEvent {
        message_id,
        conversation_id,
        sender_id,
        bot_id,
        content,
        images,
        sent_at: raw.sent_at,
    })
}

/// Strict ObjectId parsing: exactly 24 hex digits.
pub fn parse_object_id(s: &str) -> Option<ObjectId> {
    if s.len() == 24 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        ObjectId::parse_str(s).ok()
    } else {
        None
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The worker's answer, published on `<prefix>.out.<conversationId>` with `Nats-Msg-Id: <messageId>`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Completion {
    /// `_id` of the reply in dm_messages.
    pub message_id: String,
    /// `messageId` of the inbound event answered; none for a proactive message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<String>,
    pub conversation_id: String,
    /// The bot's user id.
    pub sender_id: String,
    pub content: String,
    pub rich_content: Option<Value>,
    pub created_at: DateTime<Utc>,
    /// Later messages of the same burst this reply answers too (they get no reply of their own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub covers: Vec<String>,
    /// In a group: the user message this companion message belongs to (several companions may answer
    /// one message, in the order they are meant to be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub responds_to: Option<String>,
    /// A message no user message triggered: a companion following up on its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub proactive: bool,
    /// What a proactive message follows up on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,
    /// A referral, a disclosure, a break reminder; `visibleTo`: show it to those users only.
    #[serde(default, flatten)]
    pub marks: Marks,
}

/// What a companion message is, for the app and its moderators: written on its `dm_messages` document
/// and its completion event as they are named here. The safety protocol decides them; they are the
/// contract's, so the store carries them without knowing the protocol.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marks {
    /// `crisis` on a crisis referral (a fixed message, never the model's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safety: Option<String>,
    /// The only users who may see it (a referral in a group: its user); none: everyone in the
    /// conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visible_to: Option<Vec<String>>,
    /// It carries the character's line that it is an AI, not a human.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ai_disclosure: bool,
    /// It carries a break reminder (a minor after hours of continuing interaction).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub break_reminder: bool,
}

impl Marks {
    /// Only some may see it: kept out of the conversation's shared history and preview.
    pub fn is_private(&self) -> bool {
        self.visible_to.is_some()
    }
}

/// What a proactive message follows up on: `{"kind": "spot_review", "id": "<draftId>:<status>"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trigger {
    pub kind: String,
    pub id: String,
}

/// Published on `<prefix>.typing.<conversationId>` when a turn starts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Typing {
    pub conversation_id: String,
    pub sender_id: String,
    pub typing: bool,
    pub at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: EventLimits = EventLimits {
        max_event_bytes: 64 * 1024,
        max_content_chars: 4000,
    };
    const BOT: &str = "69c15e55c7ebe2c6884f1267";
    const CONV: &str = "65f000000000000000000001";

    fn event(content: &str) -> Value {
        serde_json::json!({
            "messageId": "65f0000000000000000000aa", "conversationId": CONV,
            "senderId": "65f0000000000000000000bb", "botId": BOT,
            "content": content, "sentAt": "2026-11-22T10:00:00Z"
        })
    }

    fn parse(v: &Value) -> Result<DmEvent, InvalidEvent> {
        parse_inbound(
            v.to_string().as_bytes(),
            &format!("dm.bot.in.{BOT}.{CONV}"),
            "dm.bot",
            LIMITS,
        )
    }

    #[test]
    fn a_good_event_parses() {
        let e = parse(&event("  yo kaori  ")).unwrap();
        assert_eq!(e.content, "yo kaori");
        assert_eq!(e.bot_id.to_hex(), BOT);
    }

    #[test]
    fn bad_events_say_why() {
        let mut v = event("hi");
        v["senderId"] = "not-an-id".into();
        assert_eq!(
            parse(&v).unwrap_err(),
            InvalidEvent::BadId { field: "senderId" }
        );
        let mut v = event("hi");
        v["botId"] = "65f0000000000000000000bb".into();
        assert!(matches!(
            parse(&v).unwrap_err(),
            InvalidEvent::SelfMessage | InvalidEvent::SubjectMismatch { .. }
        ));
        assert_eq!(parse(&event("   ")).unwrap_err(), InvalidEvent::Empty);
        assert!(matches!(
            parse(&event(&"x".repeat(4001))).unwrap_err(),
            InvalidEvent::ContentTooLong { .. }
        ));
        let mut v = event("hi");
        v["content"] = 5.into();
        assert!(matches!(parse(&v).unwrap_err(), InvalidEvent::Malformed(_)));
        let err = parse_inbound(b"\xff\xfe", "dm.bot.in.x.y", "dm.bot", LIMITS).unwrap_err();
        assert_eq!(err, InvalidEvent::NotUtf8);
        let err = parse_inbound(&[b' '; 70_000], "dm.bot.in.x.y", "dm.bot", LIMITS).unwrap_err();
        assert!(matches!(err, InvalidEvent::TooLarge { .. }));
        let err = parse_inbound(
            event("hi").to_string().as_bytes(),
            "dm.bot.in.other.subject",
            "dm.bot",
            LIMITS,
        )
        .unwrap_err();
        assert!(matches!(err, InvalidEvent::SubjectMismatch { .. }));
    }

    #[test]
    fn group_messages_parse_by_their_subject_and_are_checked_alike() {
        let mut v = event("  kaori and tony?  ");
        v.as_object_mut().unwrap().remove("botId");
        let payload = v.to_string();
        let subject = format!("dm.bot.group.{CONV}");
        match parse_event(payload.as_bytes(), &subject, "dm.bot", LIMITS).unwrap() {
            Inbound::Group(g) => assert_eq!(g.content, "kaori and tony?"),
            other => panic!("{other:?}"),
        }
        let other = "dm.bot.group.65f000000000000000000002";
        assert!(matches!(
            parse_group(payload.as_bytes(), other, "dm.bot", LIMITS).unwrap_err(),
            InvalidEvent::SubjectMismatch { .. }
        ));
        v["content"] = " ".into();
        assert_eq!(
            parse_group(v.to_string().as_bytes(), &subject, "dm.bot", LIMITS).unwrap_err(),
            InvalidEvent::Empty
        );
    }

    #[test]
    fn attachments_are_checked() {
        let mut v = event("");
        v["attachments"] =
            serde_json::json!([{"type": "image", "url": "https://cdn.example/a.jpg"}]);
        assert_eq!(parse(&v).unwrap().images, vec!["https://cdn.example/a.jpg"]);
        v["attachments"] = serde_json::json!([{"type": "image", "url": "file:///etc/passwd"}]);
        assert!(matches!(
            parse(&v).unwrap_err(),
            InvalidEvent::BadAttachment { index: 0, .. }
        ));
    }

    #[test]
    fn control_characters_are_removed_but_tab_and_newline_kept() {
        let e = parse(&event("  kick\u{0}flip\u{7}?\tplease\r\nthanks  ")).unwrap();
        assert_eq!(e.content, "kickflip?\tplease\nthanks");
        assert_eq!(
            parse(&event("\u{0}\u{1}")).unwrap_err(),
            InvalidEvent::Empty
        );
    }

    #[test]
    fn object_ids_are_strict() {
        assert!(parse_object_id("69c15e55c7ebe2c6884f1267").is_some());
        assert!(parse_object_id("69c15e55c7ebe2c6884f126").is_none());
        assert!(parse_object_id("69c15e55c7ebe2c6884f126z").is_none());
        assert!(parse_object_id("{\"$gt\": \"\"}").is_none());
    }
}
