//! MongoDB access to the app's collections, in the shapes TB-Backend and the app use.
//!
//! Tricklists store their owner as a DBRef (`user: {$ref: "users", $id: ObjectId}`). Queries on it use
//! [`user_ref_filter`]; the worker never creates an index on that field (see there).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bson::{Bson, Document, doc, oid::ObjectId};
use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use mongodb::{
    Client, Collection, Database, IndexModel,
    error::{ErrorKind, WriteFailure},
    options::{ClientOptions, IndexOptions},
};
use serde_json::Value;

use super::StoreError;
use crate::config::MongoConfig;

pub const USERS: &str = "users";
pub const DM_CONVERSATIONS: &str = "dm_conversations";
pub const DM_MESSAGES: &str = "dm_messages";
pub const TRICKLISTS: &str = "tricklists";
pub const TRICKS: &str = "tricks";
pub const SPOTS: &str = "ck_spots";
pub const SPOT_DRAFTS: &str = "spot_drafts";

/// Unique index on (`inReplyTo`, `replyGeneration`) of dm_messages.
const REPLY_INDEX: &str = "companion_reply_once_per_generation";
/// Unique index on `inReplyTo` alone, made by earlier versions.
const OLD_REPLY_INDEX: &str = "companion_reply_once";

/// The app's database.
#[derive(Clone)]
pub struct Mongo {
    pub db: Database,
    /// Trick names by id: the trickipedia changes rarely, and every turn shows the user's lists.
    trick_names: Arc<NameCache>,
}

/// How long a trick name is trusted before it is read again.
const TRICK_NAME_TTL: Duration = Duration::from_secs(60);
/// Trick names kept at most.
const TRICK_NAMES_MAX: usize = 20_000;

/// A bounded map of names with a time to live (a full map is emptied: refilling it is one query).
#[derive(Default)]
struct NameCache {
    names: Mutex<HashMap<ObjectId, (String, Instant)>>,
}

/// What the admission reads about the user in the same round trip.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UserData {
    /// `None` when the user has no profile document.
    pub profile: Option<UserProfile>,
    /// The newest tricklists, read from their documents (which are not kept: a turn holds this while it
    /// waits on the model); their trick names are resolved ([`Mongo::resolve_tricklists`]) only by a turn
    /// that answers, not by every delivery admitted.
    pub tricklists: Vec<Tricklist>,
    /// Whom the user blocked (`users.blockedUsers`): a companion among them may answer, never start a DM.
    pub(crate) blocked: Vec<ObjectId>,
    /// The user document as stored, for what the safety protocol reads of it (the age signal, whose
    /// field names are configured); the admission takes it once it has read the age.
    pub document: Option<Document>,
}

impl UserData {
    pub fn blocks(&self, bot: ObjectId) -> bool {
        self.blocked.contains(&bot)
    }
}

/// A conversation as the admission finds it: who is in it, and the user's data.
#[derive(Clone, Debug, PartialEq)]
pub struct Membership {
    /// Every participant, users and companions, in the conversation's order.
    pub participants: Vec<ObjectId>,
    pub user: UserData,
}

impl Membership {
    pub fn joins(&self, id: ObjectId) -> bool {
        self.participants.contains(&id)
    }
}

/// What the companion knows about the user it talks to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UserProfile {
    pub(crate) id: ObjectId,
    pub name: Option<String>,
    pub username: Option<String>,
    pub bio: Option<String>,
    pub location: Option<String>,
    pub sports: Vec<String>,
    /// IANA time zone (`timezone` or `timeZone`), e.g. `America/Los_Angeles`.
    pub time_zone: Option<String>,
    /// ISO 3166-1 alpha-2 country (`country`), for the crisis lines.
    pub country: Option<String>,
}

/// A tricklist with its trick names resolved from the trickipedia.
#[derive(Clone, Debug, PartialEq)]
pub struct Tricklist {
    pub id: ObjectId,
    pub name: String,
    pub category: Option<String>,
    pub is_public: bool,
    pub created_by: Option<String>,
    pub tricks: Vec<TrickEntry>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TrickEntry {
    pub id: ObjectId,
    /// `None` when the trick id no longer exists in the trickipedia.
    pub name: Option<String>,
    pub checked: bool,
}

/// A reply as stored in dm_messages.
#[derive(Clone, Debug)]
pub struct ReplyDoc {
    pub id: ObjectId,
    pub conversation_id: ObjectId,
    pub sender_id: ObjectId,
    /// The user message answered; none for a proactive message.
    pub in_reply_to: Option<ObjectId>,
    /// In a group: the user message this is one of the answers to (`respondsTo`; several companions
    /// answer one message, so it is not `inReplyTo`, whose index allows one reply per generation).
    pub responds_to: Option<ObjectId>,
    /// What a proactive message follows up on: (kind, id).
    pub trigger: Option<(String, String)>,
    pub content: String,
    pub rich_content: Option<Value>,
    pub timestamp: DateTime<Utc>,
    /// 0 for the first reply to a message; a replay that answers it again writes the next one.
    pub generation: i32,
    pub marks: crate::bus::event::Marks,
}

/// Filter matching documents whose `field` refers to user `id`, right on MongoDB and on SecantusDB alike.
///
/// On MongoDB the `field.$id` path matches a DBRef by its id whatever its key order or `$db`; SecantusDB
/// (the local and CI server) silently matches nothing on DBRef sub-fields but matches the exact DBRef
/// document. A plain ObjectId is accepted too, for documents written by other tools. Never index the
/// DBRef field from here: on SecantusDB such an index makes later inserts and finds on it fail.
pub fn user_ref_filter(field: &str, id: ObjectId) -> Document {
    doc! { "$or": [
        { format!("{field}.$id"): id },
        { field: { "$ref": USERS, "$id": id } },
        { field: id },
    ] }
}

/// The DBRef the app stores in `tricklists.user`.
pub fn user_ref(id: ObjectId) -> Document {
    doc! { "$ref": USERS, "$id": id }
}

impl Mongo {
    pub async fn connect(config: &MongoConfig) -> Result<Self, StoreError> {
        let mut options = ClientOptions::parse(&config.uri).await?;
        options.app_name = Some("companion".into());
        // Per-turn MongoDB wait for the turn timings (crate::timing).
        options.command_event_handler = Some(crate::timing::mongo_command_handler());
        options.cmap_event_handler = Some(crate::timing::mongo_pool_handler());
        if options.server_selection_timeout.is_none() {
            options.server_selection_timeout = Some(std::time::Duration::from_secs(5));
        }
        let client = Client::with_options(options)?;
        Ok(Self {
            db: client.database(&config.database()),
            trick_names: Arc::default(),
        })
    }

    /// The document of `collection` with `_id` `id`.
    pub async fn by_id(
        &self,
        collection: &str,
        id: ObjectId,
    ) -> Result<Option<Document>, StoreError> {
        Ok(self
            .collection(collection)
            .find_one(doc! { "_id": id })
            .await?)
    }

    pub fn collection(&self, name: &str) -> Collection<Document> {
        self.db.collection(name)
    }

    /// Indexes the worker relies on (idempotent).
    pub async fn ensure_indexes(&self) -> Result<(), StoreError> {
        // One reply per inbound message and reply generation, however often a turn is retried. Sparse:
        // user messages have neither field. The first generation stores no `replyGeneration`, so replies
        // written before generations existed keep their key.
        let unique_reply = IndexModel::builder()
            .keys(doc! { "inReplyTo": 1, "replyGeneration": 1 })
            .options(
                IndexOptions::builder()
                    .unique(true)
                    .sparse(true)
                    .name(REPLY_INDEX.to_owned())
                    .build(),
            )
            .build();
        let messages = self.collection(DM_MESSAGES);
        messages.create_index(unique_reply).await?;
        // The index of earlier versions (one reply per message, ever) would refuse a replay's reply.
        let old = messages.list_index_names().await?;
        if old.iter().any(|n| n == OLD_REPLY_INDEX) {
            messages.drop_index(OLD_REPLY_INDEX).await?;
        }
        Ok(())
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        self.db.run_command(doc! { "ping": 1 }).await?;
        Ok(())
    }

    /// The conversation's participants, and the user's profile, blocks and newest `tricklists` lists:
    /// one aggregate on the conversation that looks up the other two (one round trip where three finds
    /// were); `None` when there is no such conversation. Who must be in it is the caller's to check.
    pub async fn admit(
        &self,
        conversation: ObjectId,
        user: ObjectId,
        tricklists: i64,
    ) -> Result<Option<Membership>, StoreError> {
        Ok(self
            .admission(conversation, user, tricklists)
            .await?
            .map(|f| f.into_membership(user)))
    }

    /// Display names (`name`, else `username`) of the given users, for a group's history.
    pub async fn display_names(
        &self,
        ids: &[ObjectId],
    ) -> Result<HashMap<ObjectId, String>, StoreError> {
        let docs: Vec<Document> = self
            .collection(USERS)
            .find(doc! { "_id": { "$in": ids.to_vec() } })
            .projection(doc! { "name": 1, "username": 1 })
            .await?
            .try_collect()
            .await?;
        Ok(docs
            .iter()
            .filter_map(|d| {
                let id = d.get_object_id("_id").ok()?;
                let p = profile_of(id, d);
                Some((id, p.name.or(p.username)?))
            })
            .collect())
    }

    /// The conversation's participants and the user's profile and newest tricklists, in one aggregate;
    /// `None` when there is no such conversation.
    async fn admission(
        &self,
        conversation: ObjectId,
        user: ObjectId,
        tricklists: i64,
    ) -> Result<Option<Found>, StoreError> {
        let pipeline = [
            doc! { "$match": { "_id": conversation } },
            doc! { "$limit": 1 },
            doc! { "$project": { "participants": 1 } },
            doc! { "$lookup": {
                "from": USERS,
                "pipeline": [ { "$match": { "_id": user } }, { "$limit": 1 } ],
                "as": "user",
            } },
            doc! { "$lookup": {
                "from": TRICKLISTS,
                "pipeline": [
                    { "$match": user_ref_filter("user", user) },
                    { "$sort": { "createdAt": -1, "_id": -1 } },
                    { "$limit": tricklists.max(1) },
                ],
                "as": "tricklists",
            } },
        ];
        let mut found: Vec<Document> = self
            .collection(DM_CONVERSATIONS)
            .aggregate(pipeline)
            .await?
            .try_collect()
            .await?;
        let Some(mut conv) = found.pop() else {
            return Ok(None);
        };
        let docs = |conv: &mut Document, key: &str| -> Vec<Document> {
            match conv.remove(key) {
                Some(Bson::Array(a)) => a
                    .into_iter()
                    .filter_map(|b| match b {
                        Bson::Document(d) => Some(d),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            }
        };
        Ok(Some(Found {
            participants: participants_of(&conv),
            user_doc: docs(&mut conv, "user").into_iter().next(),
            tricklists: docs(&mut conv, "tricklists")
                .iter()
                .filter_map(tricklist_of)
                .collect(),
        }))
    }

    #[cfg(any(test, feature = "testing"))]
    pub async fn user_profile(&self, user: ObjectId) -> Result<Option<UserProfile>, StoreError> {
        Ok(self
            .collection(USERS)
            .find_one(doc! { "_id": user })
            .await?
            .map(|d| profile_of(user, &d)))
    }

    /// The user's tricklists, newest first, at most `limit`, with trick names resolved.
    pub async fn user_tricklists(
        &self,
        user: ObjectId,
        limit: i64,
    ) -> Result<Vec<Tricklist>, StoreError> {
        let lists: Vec<Document> = self
            .collection(TRICKLISTS)
            .find(user_ref_filter("user", user))
            .sort(doc! { "createdAt": -1, "_id": -1 })
            .limit(limit)
            .await?
            .try_collect()
            .await?;
        let lists: Vec<Tricklist> = lists.iter().filter_map(tricklist_of).collect();
        self.resolve_tricklists(&lists).await
    }

    /// Fills in the trick names of `lists` (read by [`tricklist_of`]) with one trickipedia query for all
    /// their tricks.
    pub async fn resolve_tricklists(
        &self,
        lists: &[Tricklist],
    ) -> Result<Vec<Tricklist>, StoreError> {
        let mut ids: Vec<ObjectId> = lists
            .iter()
            .flat_map(|l| l.tricks.iter().map(|t| t.id))
            .collect();
        ids.sort();
        ids.dedup();
        let names = self.trick_names(&ids).await?;
        let mut lists = lists.to_vec();
        for t in lists.iter_mut().flat_map(|l| l.tricks.iter_mut()) {
            t.name = names.get(&t.id).cloned();
        }
        Ok(lists)
    }

    /// Names of these tricks: from the cache while fresh, the rest in one query (then cached).
    async fn trick_names(&self, ids: &[ObjectId]) -> Result<HashMap<ObjectId, String>, StoreError> {
        let mut names = HashMap::with_capacity(ids.len());
        let mut missing = Vec::new();
        {
            let cache = self
                .trick_names
                .names
                .lock()
                .expect("trick name cache lock");
            for id in ids {
                match cache.get(id) {
                    Some((name, at)) if at.elapsed() < TRICK_NAME_TTL => {
                        names.insert(*id, name.clone());
                    }
                    _ => missing.push(*id),
                }
            }
        }
        if missing.is_empty() {
            return Ok(names);
        }
        let docs: Vec<Document> = self
            .collection(TRICKS)
            .find(doc! { "_id": { "$in": &missing } })
            .projection(doc! { "name": 1 })
            .await?
            .try_collect()
            .await?;
        let found: Vec<(ObjectId, String)> = docs
            .into_iter()
            .filter_map(|d| {
                Some((
                    d.get_object_id("_id").ok()?,
                    d.get_str("name").ok()?.to_owned(),
                ))
            })
            .collect();
        let now = Instant::now();
        let mut cache = self
            .trick_names
            .names
            .lock()
            .expect("trick name cache lock");
        if cache.len() + found.len() > TRICK_NAMES_MAX {
            cache.clear();
        }
        for (id, name) in found {
            cache.insert(id, (name.clone(), now));
            names.insert(id, name);
        }
        Ok(names)
    }

    /// Removes a reply this worker wrote (`_id` and sender both its own) that a deletion overtook: it
    /// answered a message deleted, or a user erased, after the turn's last check. `Ok(false)` when it is
    /// not there (removed already, or by TB-Backend).
    pub async fn withdraw_reply(&self, id: ObjectId, sender: ObjectId) -> Result<bool, StoreError> {
        let filter = doc! { "_id": id, "senderId": sender.to_hex() };
        let r = self.collection(DM_MESSAGES).delete_one(filter).await?;
        Ok(r.deleted_count > 0)
    }

    /// Writes the reply; `Ok(false)` when this reply (or another for the same message) is already there.
    pub async fn insert_reply(&self, reply: &ReplyDoc) -> Result<bool, StoreError> {
        let rich = match &reply.rich_content {
            Some(v) => bson::to_bson(v).unwrap_or(Bson::Null),
            None => Bson::Null,
        };
        let mut doc = doc! {
            "_id": reply.id,
            "conversationId": reply.conversation_id,
            "senderId": reply.sender_id.to_hex(),
            "content": &reply.content,
            "richContent": rich,
            "timestamp": bson::DateTime::from_chrono(reply.timestamp),
            "read": false,
        };
        if let Some(id) = reply.in_reply_to {
            doc.insert("inReplyTo", id);
        }
        if let Some(id) = reply.responds_to {
            doc.insert("respondsTo", id);
        }
        if let Some((kind, id)) = &reply.trigger {
            doc.insert("proactive", true);
            doc.insert("trigger", doc! { "kind": kind, "id": id });
        }
        if reply.generation > 0 {
            doc.insert("replyGeneration", reply.generation);
        }
        if let Ok(Bson::Document(marks)) = bson::to_bson(&reply.marks) {
            doc.extend(marks);
        }
        match self.collection(DM_MESSAGES).insert_one(doc).await {
            Ok(_) => Ok(true),
            Err(e) if is_duplicate_key(&e) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Moves the conversation to the top of both users' inboxes.
    /// The one-to-one conversation between `user` and `bot`, the newest if there are several.
    pub async fn direct_conversation(
        &self,
        user: ObjectId,
        bot: ObjectId,
    ) -> Result<Option<ObjectId>, StoreError> {
        let either = |id: ObjectId| doc! { "participants": { "$in": [id, id.to_hex()] } };
        let mut found: Vec<Document> = self
            .collection(DM_CONVERSATIONS)
            .find(doc! { "$and": [either(user), either(bot)], "isGroup": { "$ne": true } })
            .sort(doc! { "updatedAt": -1, "_id": -1 })
            .limit(5)
            .await?
            .try_collect()
            .await?;
        found.retain(|c| {
            let participants = participants_of(c);
            participants.contains(&user) && participants.contains(&bot)
        });
        Ok(found.first().and_then(|c| c.get_object_id("_id").ok()))
    }

    pub async fn touch_conversation(
        &self,
        conversation: ObjectId,
        last_message: &str,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let at = bson::DateTime::from_chrono(at);
        self.collection(DM_CONVERSATIONS)
            .update_one(
                doc! { "_id": conversation, "$or": [ { "updatedAt": { "$lt": at } }, { "updatedAt": { "$exists": false } } ] },
                doc! { "$set": { "lastMessage": last_message, "updatedAt": at } },
            )
            .await?;
        Ok(())
    }

    /// What moderators wrote in `conversation` from `from` to `to` (both included): among the window's
    /// newest 500 messages, those whose sender is not one of its participants, oldest first; with its
    /// participants and whether it is a group. None when there is no such conversation.
    pub async fn outsider_messages(
        &self,
        conversation: ObjectId,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Option<(Vec<ObjectId>, bool, Vec<Document>)>, StoreError> {
        let Some(conv) = self
            .collection(DM_CONVERSATIONS)
            .find_one(doc! { "_id": conversation })
            .projection(doc! { "participants": 1, "isGroup": 1 })
            .await?
        else {
            return Ok(None);
        };
        let participants = participants_of(&conv);
        let window = doc! {
            "$gte": bson::DateTime::from_chrono(from),
            "$lte": bson::DateTime::from_chrono(to),
        };
        let messages: Vec<Document> = self
            .collection(DM_MESSAGES)
            .find(doc! { "conversationId": conversation, "timestamp": window })
            .sort(doc! { "timestamp": -1, "_id": -1 })
            .limit(500)
            .await?
            .try_collect()
            .await?;
        let outsiders = messages
            .into_iter()
            .rev()
            .filter(|m| {
                m.get("senderId")
                    .and_then(participant_id)
                    .is_some_and(|s| !participants.contains(&s))
            })
            .collect();
        let group = conv.get_bool("isGroup").unwrap_or(false);
        Ok(Some((participants, group, outsiders)))
    }
}

/// Whether the conversation document has both users as participants (ObjectId, string or DBRef form).
/// A participant's id, however it is stored (ObjectId, hex string, DBRef or `{_id}`).
fn participant_id(p: &Bson) -> Option<ObjectId> {
    match p {
        Bson::ObjectId(o) => Some(*o),
        Bson::String(s) => ObjectId::parse_str(s).ok(),
        Bson::Document(d) => d
            .get_object_id("$id")
            .or_else(|_| d.get_object_id("_id"))
            .ok(),
        _ => None,
    }
}

/// The ids of a conversation's participants, in its order.
fn participants_of(conv: &Document) -> Vec<ObjectId> {
    conv.get_array("participants")
        .map(|a| a.iter().filter_map(participant_id).collect())
        .unwrap_or_default()
}

/// A tricklist document as a [`Tricklist`] whose trick names are not resolved yet; `None` without an id.
pub fn tricklist_of(l: &Document) -> Option<Tricklist> {
    let id = l.get_object_id("_id").ok()?;
    let tricks = l
        .get_array("tricks")
        .map(|a| a.as_slice())
        .unwrap_or(&[])
        .iter()
        .filter_map(|t| {
            Some(TrickEntry {
                id: trick_ref_id(t)?,
                name: None,
                checked: t
                    .as_document()
                    .and_then(|d| d.get_bool("checked").ok())
                    .unwrap_or(false),
            })
        })
        .collect();
    Some(Tricklist {
        id,
        name: l.get_str("name").unwrap_or("(unnamed)").to_owned(),
        category: l.get_str("category").ok().map(str::to_owned),
        is_public: l.get_bool("isPublic").unwrap_or(false),
        created_by: l.get_str("createdBy").ok().map(str::to_owned),
        tricks,
    })
}

/// What the admission's aggregate found.
struct Found {
    participants: Vec<ObjectId>,
    user_doc: Option<Document>,
    tricklists: Vec<Tricklist>,
}

impl Found {
    fn into_membership(self, user: ObjectId) -> Membership {
        Membership {
            participants: self.participants,
            user: UserData {
                profile: self.user_doc.as_ref().map(|d| profile_of(user, d)),
                blocked: self.user_doc.as_ref().map(blocked_by).unwrap_or_default(),
                tricklists: self.tricklists,
                document: self.user_doc,
            },
        }
    }
}

/// A user document as the prompt shows it.
fn profile_of(user: ObjectId, d: &Document) -> UserProfile {
    let s = |k: &str| {
        d.get_str(k)
            .ok()
            .map(str::to_owned)
            .filter(|v| !v.trim().is_empty())
    };
    let sports = d
        .get_array("sports")
        .map(|a| {
            a.iter()
                .filter_map(|b| b.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    UserProfile {
        id: user,
        name: s("name").or_else(|| s("displayName")),
        username: s("username"),
        bio: s("bio"),
        location: s("location").or_else(|| s("city")),
        sports,
        time_zone: s("timezone").or_else(|| s("timeZone")),
        country: s("country"),
    }
}

/// A tricklist entry is `{_id, checked}`; older lists may hold a bare ObjectId.
fn trick_ref_id(t: &Bson) -> Option<ObjectId> {
    match t {
        Bson::ObjectId(o) => Some(*o),
        Bson::Document(d) => d
            .get_object_id("_id")
            .ok()
            .or_else(|| d.get_object_id("trick").ok()),
        _ => None,
    }
}

/// Whom the user document lists in `blockedUsers` (as ObjectIds or their hex).
fn blocked_by(user: &Document) -> Vec<ObjectId> {
    user.get_array("blockedUsers")
        .map(|a| {
            a.iter()
                .filter_map(|b| match b {
                    Bson::ObjectId(id) => Some(*id),
                    Bson::String(s) => ObjectId::parse_str(s.to_ascii_lowercase()).ok(),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

pub fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    match &*e.kind {
        ErrorKind::Write(WriteFailure::WriteError(we)) => we.code == 11000,
        ErrorKind::InsertMany(im) => im
            .write_errors
            .as_ref()
            .is_some_and(|errs| errs.iter().all(|we| we.code == 11000)),
        ErrorKind::Command(ce) => ce.code == 11000,
        _ => false,
    }
}
