//! TB-Backend's side of the contract, for the terminal commands, the demo and the tests:
//! store the user's DM in dm_messages, then publish it to the bot exactly as `dm.js` does.

use async_nats::HeaderMap;
use bson::{doc, oid::ObjectId};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::StreamExt;

use companion_store::{
    bus::{
        Bus, BusError,
        event::{Attachment, Completion, GroupMessageEvent, InboundEvent},
    },
    store::{DM_CONVERSATIONS, DM_MESSAGES, Mongo, StoreError},
};

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error("NATS subscribe failed: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
}

impl From<mongodb::error::Error> for BackendError {
    fn from(e: mongodb::error::Error) -> Self {
        Self::Store(e.into())
    }
}

/// The DM conversation between a user and a bot, created if there is none.
pub async fn ensure_conversation(
    mongo: &Mongo,
    user: ObjectId,
    bot: ObjectId,
) -> Result<ObjectId, BackendError> {
    let convs = mongo.collection(DM_CONVERSATIONS);
    let filter = doc! { "participants": { "$all": [user, bot] } };
    if let Some(existing) = convs.find_one(filter).await?
        && let Ok(id) = existing.get_object_id("_id")
    {
        return Ok(id);
    }
    let id = ObjectId::new();
    let now = bson::DateTime::now();
    convs
        .insert_one(doc! { "_id": id, "participants": [user, bot], "isBotConversation": true, "createdAt": now, "updatedAt": now })
        .await?;
    Ok(id)
}

/// Saves the user's message as TB-Backend does and returns the event to publish for it.
pub async fn store_user_message(
    mongo: &Mongo,
    conversation: ObjectId,
    user: ObjectId,
    bot: ObjectId,
    content: &str,
    images: &[String],
) -> Result<InboundEvent, BackendError> {
    let (id, now, attachments) = insert_message(mongo, conversation, user, content, images).await?;
    Ok(InboundEvent {
        message_id: id.to_hex(),
        conversation_id: conversation.to_hex(),
        sender_id: user.to_hex(),
        bot_id: bot.to_hex(),
        content: content.to_owned(),
        attachments,
        sent_at: now,
    })
}

/// Publishes an event with `Nats-Msg-Id: <messageId>`; returns whether the server saw it as a duplicate.
/// Inserts a user's message into dm_messages as the app does; its id, time and attachments.
async fn insert_message(
    mongo: &Mongo,
    conversation: ObjectId,
    user: ObjectId,
    content: &str,
    images: &[String],
) -> Result<(ObjectId, DateTime<Utc>, Vec<Attachment>), BackendError> {
    let id = ObjectId::new();
    let now: DateTime<Utc> = Utc::now();
    let mut message = doc! {
        "_id": id,
        "conversationId": conversation,
        "senderId": user.to_hex(),
        "content": content,
        "timestamp": bson::DateTime::from_chrono(now),
        "read": false,
    };
    if !images.is_empty() {
        message.insert(
            "attachments",
            images
                .iter()
                .map(|u| doc! { "type": "image", "url": u })
                .collect::<Vec<_>>(),
        );
    }
    mongo.collection(DM_MESSAGES).insert_one(message).await?;
    let attachments = images
        .iter()
        .map(|u| Attachment {
            kind: "image".into(),
            url: u.clone(),
        })
        .collect();
    Ok((id, now, attachments))
}

/// Creates a group conversation of `users` and `bots` as TB-Backend does (`isGroup: true`).
pub async fn create_group(
    mongo: &Mongo,
    users: &[ObjectId],
    bots: &[ObjectId],
) -> Result<ObjectId, BackendError> {
    let id = ObjectId::new();
    let now = bson::DateTime::now();
    let participants: Vec<ObjectId> = users.iter().chain(bots).copied().collect();
    mongo
        .collection(DM_CONVERSATIONS)
        .insert_one(doc! { "_id": id, "participants": participants, "isGroup": true, "createdAt": now, "updatedAt": now })
        .await?;
    Ok(id)
}

/// Stores a user's message to a group and returns its event (not yet published).
pub async fn store_group_message(
    mongo: &Mongo,
    conversation: ObjectId,
    user: ObjectId,
    content: &str,
) -> Result<GroupMessageEvent, BackendError> {
    let (id, now, attachments) = insert_message(mongo, conversation, user, content, &[]).await?;
    Ok(GroupMessageEvent {
        message_id: id.to_hex(),
        conversation_id: conversation.to_hex(),
        sender_id: user.to_hex(),
        content: content.to_owned(),
        attachments,
        sent_at: now,
    })
}

/// Publishes a group message once, as TB-Backend does (`<prefix>.group.<conversationId>`,
/// `Nats-Msg-Id: <messageId>`); true when JetStream saw a duplicate.
pub async fn publish_group_message(
    bus: &Bus,
    event: &GroupMessageEvent,
) -> Result<bool, BackendError> {
    let subject = bus.names.group(&event.conversation_id);
    let payload = Bytes::from(serde_json::to_vec(event).map_err(BusError::from)?);
    let ack = bus
        .publish_durable(subject, &event.message_id, HeaderMap::new(), payload)
        .await?;
    Ok(ack.duplicate)
}

pub async fn publish_event(bus: &Bus, event: &InboundEvent) -> Result<bool, BackendError> {
    let subject = bus.names.inbound(&event.bot_id, &event.conversation_id);
    let payload = Bytes::from(serde_json::to_vec(event).map_err(BusError::from)?);
    let ack = bus
        .publish_durable(subject, &event.message_id, HeaderMap::new(), payload)
        .await?;
    Ok(ack.duplicate)
}

/// Completions of one conversation as they arrive (core subscription; subscribe before publishing).
pub async fn completions(
    bus: &Bus,
    conversation: ObjectId,
) -> Result<impl futures::Stream<Item = Completion> + use<>, BackendError> {
    let sub = bus
        .client
        .subscribe(bus.names.outbound(&conversation.to_hex()))
        .await?;
    Ok(sub.filter_map(|m| async move { serde_json::from_slice::<Completion>(&m.payload).ok() }))
}

/// Publishes a spot draft's review as the admin tool does (`Nats-Msg-Id: <draftId>:<status>`); whether it
/// was a duplicate.
pub async fn publish_spot_review(
    bus: &Bus,
    draft: ObjectId,
    review: &serde_json::Value,
) -> Result<bool, BackendError> {
    let status = review["status"].as_str().unwrap_or_default();
    let ack = bus
        .publish_durable(
            bus.names.spot_review(&draft.to_hex()),
            &format!("{}:{status}", draft.to_hex()),
            async_nats::HeaderMap::new(),
            serde_json::to_vec(review)
                .map_err(companion_store::bus::BusError::from)?
                .into(),
        )
        .await?;
    Ok(ack.duplicate)
}

/// The chat page's conversations of `user` (`deploy/local/demo.sh --web`): a DM with every companion
/// (the users with `isBot`) and a group with the companions named in `group` (usernames), each created
/// when missing. Their ids with a label (`kaori`, `group kaori,tony`), DMs first.
pub async fn ensure_web_conversations(
    mongo: &Mongo,
    user: ObjectId,
    group: &[String],
) -> Result<Vec<(String, ObjectId)>, BackendError> {
    let mut bots = Vec::new();
    let mut cursor = mongo
        .collection(companion_store::store::USERS)
        .find(doc! { "isBot": true })
        .await?;
    while let Some(bot) = cursor.next().await {
        let bot = bot?;
        if let (Ok(id), Ok(name)) = (bot.get_object_id("_id"), bot.get_str("username")) {
            bots.push((name.to_owned(), id));
        }
    }
    bots.sort();
    let mut out = Vec::new();
    for (name, id) in &bots {
        out.push((name.clone(), ensure_conversation(mongo, user, *id).await?));
    }
    let members: Vec<ObjectId> = group
        .iter()
        .filter_map(|g| bots.iter().find(|(n, _)| n == g).map(|(_, id)| *id))
        .collect();
    if !members.is_empty() {
        let id = ensure_group(mongo, user, &members).await?;
        out.push((format!("group {}", group.join(",")), id));
    }
    Ok(out)
}

/// The group conversation of exactly `user` and `bots`, created if there is none.
pub async fn ensure_group(
    mongo: &Mongo,
    user: ObjectId,
    bots: &[ObjectId],
) -> Result<ObjectId, BackendError> {
    let mut participants = vec![user];
    participants.extend(bots);
    let existing = mongo
        .collection(DM_CONVERSATIONS)
        .find_one(doc! {
            "isGroup": true,
            "participants": { "$all": participants.clone(), "$size": participants.len() as i32 },
        })
        .await?
        .and_then(|d| d.get_object_id("_id").ok());
    match existing {
        Some(id) => Ok(id),
        None => create_group(mongo, &[user], bots).await,
    }
}
