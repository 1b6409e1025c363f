//! The bench's data: the demo seed, then many users with profiles and tricklists, one DM conversation per
//! (user, companion) pair with a full history window, the knowledge base, and the user messages the run
//! publishes (stored in `dm_messages` before the clock starts, as TB-Backend would have stored them).

use std::path::Path;

use bson::{Document, doc, oid::ObjectId};
use chrono::{Duration as ChronoDuration, Utc};
use futures::TryStreamExt;

use super::{BenchError, env::RunEnv};
use crate::seed;
use companion_knowledge::character::Characters;
use companion_store::{
    bus::event::InboundEvent,
    store::{
        DM_CONVERSATIONS, DM_MESSAGES, Mongo, StoreError, TRICKLISTS, TRICKS, USERS, user_ref,
    },
};

/// The users' side of the seeded history: short, realistic DMs to a companion.
pub const CHAT_MESSAGES: &[&str] = &[
    "How do I land a kickflip without the board flipping away from me?",
    "Any tips for locking into a 50-50 grind on a flat bar?",
    "My frontside boardslide keeps sliding out at the end of the rail.",
    "Should I buy a camber or a rocker snowboard for park riding?",
    "just landed my first tre flip 🔥🛹🎉",
    "What snowboard wax do you recommend for really cold days? ❄️",
    "How do I do a frontside 360 off a medium kicker on my snowboard?",
    "is it normal to be scared of dropping in?",
    "what should I practice this weekend at the park?",
    "my ollies are still super low, what am I doing wrong",
    "how do you link turns on steeper runs without skidding",
    "any good skateparks to check out near me?",
];

/// Short replies people send in chats: one measured message in eight is one of these.
pub const ACKNOWLEDGEMENTS: &[&str] = &[
    "ok thanks!",
    "lol 😂",
    "sick 🔥🔥",
    "haha yeah",
    "got it, makes sense",
    "thank you so much!!",
    "nice",
    "cool cool",
];

const TRICK_NAMES: &[&str] = &[
    "kickflip",
    "heelflip",
    "tre flip",
    "ollie",
    "nollie",
    "pop shove-it",
    "50-50 grind",
    "boardslide",
    "5-0",
    "nosegrind",
    "manual",
    "frontside 180",
    "backside 180",
    "frontside 360",
    "method air",
    "indy grab",
    "butter",
    "nose press",
    "tail press",
    "rock to fakie",
    "axle stall",
    "drop in",
    "feeble grind",
    "smith grind",
    "hardflip",
    "varial flip",
    "switch ollie",
    "fakie flip",
    "carve",
    "backside 540",
];

const PLACES: &[&str] = &[
    "a flat bar",
    "a handrail",
    "the mini ramp",
    "a ledge",
    "a medium kicker",
    "the bowl",
    "a box in the park",
    "a down rail",
    "flat ground",
    "a quarter pipe",
];

const TEMPLATES: &[&str] = &[
    "How do I land a {t} on {p} without bailing?",
    "Any tips for a {t} on {p}?",
    "My {t} keeps sliding out on {p}, what am I doing wrong",
    "is a {t} on {p} too much for my second week?",
    "what should I practice before trying a {t} on {p}?",
    "just landed my first {t} on {p} 🔥🛹🎉",
    "how do you keep your speed into a {t} on {p}",
    "scared of trying a {t} on {p}, any advice?",
];

/// The measured phase's message `i`: chat questions about a trick and a place (2,400 different ones, so
/// a run rarely repeats a text), and one in eight a short acknowledgement, as people chat.
pub fn chat_message(i: usize) -> String {
    if i % 8 == 7 {
        return ACKNOWLEDGEMENTS[(i / 8) % ACKNOWLEDGEMENTS.len()].to_owned();
    }
    // The index among the questions (every eighth message is not one).
    let j = (i / 8) * 7 + i % 8;
    let t = TEMPLATES[j % TEMPLATES.len()];
    let k = j / TEMPLATES.len();
    t.replace("{t}", TRICK_NAMES[k % TRICK_NAMES.len()])
        .replace("{p}", PLACES[(k / TRICK_NAMES.len()) % PLACES.len()])
}

/// Rows written per statement when seeding.
const CHUNK: usize = 500;

/// One DM conversation between a bench user and a companion.
#[derive(Clone, Debug)]
pub struct Conversation {
    pub id: ObjectId,
    pub user: ObjectId,
    pub bot: ObjectId,
}

/// What the run talks over.
pub struct Dataset {
    pub conversations: Vec<Conversation>,
    pub users: usize,
    /// Knowledge chunks stored for retrieval.
    pub knowledge_chunks: usize,
}

/// How much data to create.
pub struct DataShape {
    pub users: usize,
    pub conversations: usize,
    /// Messages of history already in each conversation.
    pub history: usize,
    pub tricklists_per_user: usize,
}

/// Seeds everything a run needs into the run's databases.
pub async fn seed_all(
    env: &RunEnv,
    shape: &DataShape,
    seed_dir: &Path,
) -> Result<Dataset, BenchError> {
    let bots = seed_bots(env, seed_dir).await?;
    let users_needed = shape.conversations.div_ceil(bots.len());
    let n_users = shape.users.max(users_needed).max(1);
    let tricks = trick_ids(&env.mongo).await?;

    let now = Utc::now();
    let users: Vec<ObjectId> = (0..n_users).map(|_| ObjectId::new()).collect();
    insert_chunked(env, USERS, user_docs(&users, now)).await?;

    let lists = tricklists(&users, &tricks, shape.tricklists_per_user, now);
    insert_chunked(env, TRICKLISTS, lists).await?;

    let conversations: Vec<Conversation> = (0..shape.conversations)
        .map(|i| Conversation {
            id: ObjectId::new(),
            user: users[i % n_users],
            bot: bots[(i / n_users) % bots.len()],
        })
        .collect();
    let conv_docs: Vec<Document> = conversations
        .iter()
        .map(|c| {
            doc! {
                "_id": c.id,
                "participants": [c.user, c.bot],
                "isBotConversation": true,
                "createdAt": bson::DateTime::from_chrono(now - ChronoDuration::days(1)),
                "updatedAt": bson::DateTime::from_chrono(now - ChronoDuration::days(1)),
            }
        })
        .collect();
    insert_chunked(env, DM_CONVERSATIONS, conv_docs).await?;
    seed_history(env, &conversations, shape.history).await?;

    Ok(Dataset {
        conversations,
        users: n_users,
        knowledge_chunks: 0,
    })
}

/// Seeds the demo data and resolves the characters; returns the companions' bot ids, sorted.
async fn seed_bots(env: &RunEnv, seed_dir: &Path) -> Result<Vec<ObjectId>, BenchError> {
    let mongo = &env.mongo;
    seed::seed_dir(mongo, seed_dir)
        .await
        .map_err(|e| BenchError::Setup(format!("demo seed: {e}")))?;
    let mut characters = Characters::load(&env.config.characters.dir)
        .map_err(|e| BenchError::Setup(format!("characters: {e}")))?;
    characters
        .resolve(mongo)
        .await
        .map_err(|e| BenchError::Setup(format!("characters: {e}")))?;
    let mut bots: Vec<ObjectId> = characters.iter().map(|(id, _)| *id).collect();
    bots.sort();
    if bots.is_empty() {
        return Err(BenchError::Setup("no characters".into()));
    }
    Ok(bots)
}

/// The id of every trick in the trickipedia.
async fn trick_ids(mongo: &Mongo) -> Result<Vec<ObjectId>, BenchError> {
    let tricks: Vec<ObjectId> = mongo
        .collection(TRICKS)
        .find(doc! {})
        .projection(doc! { "_id": 1 })
        .await
        .map_err(StoreError::from)?
        .try_collect::<Vec<Document>>()
        .await
        .map_err(StoreError::from)?
        .into_iter()
        .filter_map(|d| d.get_object_id("_id").ok())
        .collect();
    Ok(tricks)
}

/// The bench riders' user documents, one for each id, their sports and cities taken in turn.
fn user_docs(users: &[ObjectId], now: chrono::DateTime<Utc>) -> Vec<Document> {
    let sports = ["skateboard", "snowboard", "bmx"];
    let cities = ["Portland, OR", "Barcelona", "Berlin", "Denver, CO", "Tokyo"];
    users
        .iter()
        .enumerate()
        .map(|(i, id)| {
            doc! {
                "_id": *id,
                "name": format!("Bench Rider {i}"),
                "username": format!("bench_rider_{i}"),
                "isBot": false,
                "bio": "Skates after work, snowboards all winter, always chasing the next trick.",
                "location": cities[i % cities.len()],
                "sports": [sports[i % sports.len()], sports[(i + 1) % sports.len()]],
                "createdAt": bson::DateTime::from_chrono(now),
            }
        })
        .collect()
}

/// `per_user` tricklists for each user, eight of `tricks` in each, every third one landed.
fn tricklists(
    users: &[ObjectId],
    tricks: &[ObjectId],
    per_user: usize,
    now: chrono::DateTime<Utc>,
) -> Vec<Document> {
    let sports = ["skateboard", "snowboard", "bmx"];
    let mut lists = Vec::new();
    for (i, user) in users.iter().enumerate() {
        for l in 0..per_user {
            let picked: Vec<Document> = (0..8)
                .filter_map(|k| tricks.get((i * 7 + l * 13 + k * 3) % tricks.len().max(1)))
                .enumerate()
                .map(|(k, t)| doc! { "_id": *t, "checked": k % 3 == 0 })
                .collect();
            lists.push(doc! {
                "_id": ObjectId::new(),
                "name": format!("Session list {l}"),
                "user": user_ref(*user),
                "category": sports[(i + l) % sports.len()],
                "isPublic": l % 2 == 0,
                "tricks": picked,
                "createdAt": bson::DateTime::from_chrono(now - ChronoDuration::days(l as i64 + 1)),
            });
        }
    }
    lists
}

/// `history` alternating user/assistant rows per conversation, oldest first, ending an hour ago.
async fn seed_history(
    env: &RunEnv,
    conversations: &[Conversation],
    history: usize,
) -> Result<(), BenchError> {
    if history == 0 {
        return Ok(());
    }
    let start = Utc::now() - ChronoDuration::hours(1);
    let reply = "ok so lean into it and commit, you've got this!! 🔥 try it ten times slow first";
    for convs in conversations.chunks((CHUNK * 4 / history).max(1)) {
        let n = convs.len() * history;
        let (mut users, mut bots, mut ids) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut roles, mut contents, mut messages, mut times) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for c in convs {
            for k in 0..history {
                users.push(c.user.to_hex());
                bots.push(c.bot.to_hex());
                ids.push(c.id.to_hex());
                let user_turn = k % 2 == 0;
                roles.push(if user_turn { "user" } else { "assistant" });
                contents.push(if user_turn {
                    CHAT_MESSAGES[k % CHAT_MESSAGES.len()]
                } else {
                    reply
                });
                messages.push(ObjectId::new().to_hex());
                times.push(start - ChronoDuration::minutes((history - k) as i64));
            }
        }
        sqlx::query(
            "INSERT INTO bot_conversations (user_id, bot_id, conversation_id, role, content, message_id, created_at)
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::timestamptz[])",
        )
        .bind(&users)
        .bind(&bots)
        .bind(&ids)
        .bind(&roles)
        .bind(&contents)
        .bind(&messages)
        .bind(&times)
        .execute(&env.pg.pool)
        .await
        .map_err(StoreError::from)?;
    }
    // Memory in its steady state: extraction has read the seeded history (a run's turns are then what
    // it reads next, every `COMPANION_MEMORY_EXTRACT_AFTER` user messages), not all of it at once.
    sqlx::query(
        "INSERT INTO memory_state (user_id, bot_id, extracted_through)
         SELECT user_id, bot_id, max(id) FROM bot_conversations GROUP BY user_id, bot_id
         ON CONFLICT (user_id, bot_id) DO UPDATE SET extracted_through = EXCLUDED.extracted_through",
    )
    .execute(&env.pg.pool)
    .await
    .map_err(StoreError::from)?;
    Ok(())
}

async fn insert_chunked(
    env: &RunEnv,
    collection: &str,
    docs: Vec<Document>,
) -> Result<(), BenchError> {
    for chunk in docs.chunks(CHUNK) {
        env.mongo
            .collection(collection)
            .insert_many(chunk.to_vec())
            .await
            .map_err(StoreError::from)?;
    }
    Ok(())
}

/// Stores `n` user messages (round-robin over the conversations, so a conversation's messages are as
/// far apart as possible) in `dm_messages` and returns their events, ready to publish.
pub async fn prepare_events(
    env: &RunEnv,
    data: &Dataset,
    n: usize,
    offset: usize,
) -> Result<Vec<InboundEvent>, BenchError> {
    let now = Utc::now();
    let mut events = Vec::with_capacity(n);
    let mut docs = Vec::with_capacity(n);
    for i in offset..offset + n {
        let c = &data.conversations[i % data.conversations.len()];
        let text = chat_message(i);
        let id = ObjectId::new();
        docs.push(doc! {
            "_id": id,
            "conversationId": c.id,
            "senderId": c.user.to_hex(),
            "content": &text,
            "timestamp": bson::DateTime::from_chrono(now),
            "read": false,
        });
        events.push(InboundEvent {
            message_id: id.to_hex(),
            conversation_id: c.id.to_hex(),
            sender_id: c.user.to_hex(),
            bot_id: c.bot.to_hex(),
            content: text,
            attachments: Vec::new(),
            sent_at: now,
        });
    }
    insert_chunked(env, DM_MESSAGES, docs).await?;
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_messages_rarely_repeat_and_one_in_eight_is_an_acknowledgement() {
        let msgs: Vec<String> = (0..400).map(chat_message).collect();
        let acks = msgs
            .iter()
            .filter(|m| ACKNOWLEDGEMENTS.contains(&m.as_str()))
            .count();
        assert_eq!(acks, 50);
        let questions: std::collections::HashSet<&String> = msgs
            .iter()
            .filter(|m| !ACKNOWLEDGEMENTS.contains(&m.as_str()))
            .collect();
        assert_eq!(
            questions.len(),
            350,
            "every question of a 400-turn run differs"
        );
        assert!(msgs.iter().all(|m| !m.contains('{')));
    }
}
