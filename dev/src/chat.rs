//! `companion-dev send` and `chat`: one DM, or a conversation in the terminal, exactly as TB-Backend sends them.

use std::{io::IsTerminal, path::Path, pin::pin, time::Duration};

use bson::{doc, oid::ObjectId};
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::backend;
use companion::{
    bus::{Bus, Completion, event::parse_object_id},
    character::Characters,
    config::{CharactersConfig, MongoConfig, NatsConfig},
    store::{Mongo, mongo::USERS},
};

/// Lines the group demo plays when it is not run on a terminal.
pub const GROUP_SCRIPT: &[&str] = &[
    "I'm a snowboarder trying to get into skating, any tips?",
    "lol nice",
    "@tony what board size should i get?",
    "kaori and tony: park or street first?",
];

/// The spot wizard, played by `chat --script spot-wizard` (then `review` approves the draft).
pub const SPOT_WIZARD_SCRIPT: &[&str] = &[
    "can you help me add a spot to the map?",
    "https://www.google.com/maps/place/Hollow+Bowl/@45.5231,-122.6765,17z",
    "it's called Hollow Bowl, a diy spot with a deep bowl and a little hip",
];

/// Lines the demo plays when it is not run on a terminal.
pub const DEMO_SCRIPT: &[&str] = &[
    "hey kaori!! how often should i wax my snowboard?",
    "what's on my tricklists right now?",
    "make me a park list with kickflip, 50-50 and boardslide",
    "any good skateparks in Portland?",
    "how do I ollie?",
    "what's a good first trick on a skateboard?",
    "can you add this spot? https://www.google.com/maps/place/Hollow+Bowl/@45.5231,-122.6765,17z",
    "remind me to wax my board in a few seconds",
];

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("no user `{0}` (give a 24-hex id or a username)")]
    UnknownUser(String),
    #[error("no companion `{0}` in the character files")]
    UnknownBot(String),
    #[error("no reply within {0:?}; is a worker running?")]
    NoReply(Duration),
    #[error("no spot draft made by {bot} for user {user}")]
    NoDraft { user: ObjectId, bot: String },
    #[error(transparent)]
    Backend(#[from] backend::BackendError),
    #[error(transparent)]
    Store(#[from] companion::store::StoreError),
    #[error(transparent)]
    Characters(#[from] companion::character::CharacterError),
    #[error(transparent)]
    Bus(#[from] companion::bus::BusError),
    #[error("terminal: {0}")]
    Io(#[from] std::io::Error),
}

/// What `send` and `chat` act as: a user talking to one companion in one conversation.
pub struct Session {
    pub bus: Bus,
    pub mongo: Mongo,
    pub user: ObjectId,
    pub bot: ObjectId,
    pub bot_name: String,
    pub conversation: ObjectId,
}

/// What `send` and `chat` connect to.
#[derive(clap::Args, Clone, Debug)]
pub struct ChatConfig {
    #[command(flatten)]
    pub nats: NatsConfig,
    #[command(flatten)]
    pub mongo: MongoConfig,
    #[command(flatten)]
    pub characters: CharactersConfig,
}

impl Session {
    pub async fn open(config: &ChatConfig, user: &str, bot: &str) -> Result<Self, CommandError> {
        let (bus, mongo, characters) = connect(config).await?;
        let user_id = resolve_user(&mongo, user).await?;
        let (bot_id, bot_name) = match parse_object_id(bot) {
            Some(id) => (
                id,
                characters
                    .by_bot(&id)
                    .map(|c| c.name.clone())
                    .unwrap_or_else(|| bot.to_owned()),
            ),
            None => characters
                .by_name(bot)
                .map(|(id, c)| (id, c.name.clone()))
                .ok_or_else(|| CommandError::UnknownBot(bot.to_owned()))?,
        };
        let conversation = backend::ensure_conversation(&mongo, user_id, bot_id).await?;
        Ok(Self {
            bus,
            mongo,
            user: user_id,
            bot: bot_id,
            bot_name,
            conversation,
        })
    }

    /// Sends one message and, when `wait` is set, returns the reply to it.
    pub async fn say(
        &self,
        text: &str,
        images: &[String],
        wait: Option<Duration>,
    ) -> Result<Option<Completion>, CommandError> {
        let replies = backend::completions(&self.bus, self.conversation).await?;
        let event = backend::store_user_message(
            &self.mongo,
            self.conversation,
            self.user,
            self.bot,
            text,
            images,
        )
        .await?;
        let duplicate = backend::publish_event(&self.bus, &event).await?;
        tracing::debug!(message_id = %event.message_id, duplicate, "published");
        let Some(wait) = wait else { return Ok(None) };
        let mut replies = pin!(replies.filter(|c| futures::future::ready(
            c.in_reply_to.as_deref() == Some(event.message_id.as_str())
                || c.covers.contains(&event.message_id)
        )));
        match tokio::time::timeout(wait, replies.next()).await {
            Ok(Some(c)) => Ok(Some(c)),
            _ => Err(CommandError::NoReply(wait)),
        }
    }
}

impl Session {
    /// Acts as the admin tool on the newest spot draft the companion made for the user: stores the
    /// review (approved: the spot goes to `ck_spots` and its id on the draft), publishes it, and, when
    /// `wait` is set, returns the companion's follow-up.
    pub async fn review_latest_draft(
        &self,
        approve: bool,
        note: Option<&str>,
        wait: Option<Duration>,
    ) -> Result<Option<Completion>, CommandError> {
        let store = |e: mongodb::error::Error| CommandError::Store(e.into());
        let draft = self
            .mongo
            .collection("spot_drafts")
            .find_one(doc! { "submittedBy": self.user.to_hex(), "botId": self.bot.to_hex() })
            .sort(doc! { "createdAt": -1, "_id": -1 })
            .await
            .map_err(store)?
            .ok_or_else(|| CommandError::NoDraft {
                user: self.user,
                bot: self.bot_name.clone(),
            })?;
        let draft_id = draft
            .get_object_id("_id")
            .map_err(|_| CommandError::NoDraft {
                user: self.user,
                bot: self.bot_name.clone(),
            })?;
        let conversation = draft
            .get_str("conversationId")
            .ok()
            .and_then(parse_object_id)
            .unwrap_or(self.conversation);
        let mut review = serde_json::json!({
            "draftId": draft_id.to_hex(),
            "status": if approve { "approved" } else { "rejected" },
            "reviewedAt": chrono::Utc::now(),
        });
        let mut set = doc! { "status": review["status"].as_str().unwrap_or_default() };
        if approve {
            let spot = ObjectId::new();
            let mut doc = doc! { "_id": spot };
            for field in [
                "name",
                "type",
                "latitude",
                "longitude",
                "city",
                "state",
                "country",
                "description",
            ] {
                if let Some(v) = draft.get(field) {
                    doc.insert(field, v.clone());
                }
            }
            self.mongo
                .collection("ck_spots")
                .insert_one(doc)
                .await
                .map_err(store)?;
            set.insert("spotId", spot);
            review["spotId"] = spot.to_hex().into();
        }
        if let Some(n) = note {
            review["note"] = n.into();
        }
        self.mongo
            .collection("spot_drafts")
            .update_one(doc! { "_id": draft_id }, doc! { "$set": set })
            .await
            .map_err(store)?;
        let replies = backend::completions(&self.bus, conversation).await?;
        backend::publish_spot_review(&self.bus, draft_id, &review).await?;
        let Some(wait) = wait else { return Ok(None) };
        let trigger = format!(
            "{}:{}",
            draft_id.to_hex(),
            review["status"].as_str().unwrap_or_default()
        );
        let mut replies = pin!(replies.filter(move |c| futures::future::ready(
            c.trigger.as_ref().is_some_and(|t| t.id == trigger)
        )));
        match tokio::time::timeout(wait, replies.next()).await {
            Ok(Some(c)) => Ok(Some(c)),
            _ => Err(CommandError::NoReply(wait)),
        }
    }
}

impl Session {
    /// Waits for the companion's first proactive message of `kind` in this conversation written since
    /// `since` (read from dm_messages, so one that came before this command started is found too).
    pub async fn follow_up_since(
        &self,
        kind: &str,
        since: chrono::DateTime<chrono::Utc>,
        wait: Duration,
    ) -> Result<bson::Document, CommandError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let found = self
                .mongo
                .collection("dm_messages")
                .find_one(doc! {
                    "conversationId": self.conversation,
                    "trigger.kind": kind,
                    "timestamp": { "$gte": bson::DateTime::from_chrono(since) },
                })
                .await
                .map_err(|e| CommandError::Store(e.into()))?;
            if let Some(d) = found {
                return Ok(d);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(CommandError::NoReply(wait));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// The bus, the app's database and the characters (bots resolved) a session talks through.
async fn connect(config: &ChatConfig) -> Result<(Bus, Mongo, Characters), CommandError> {
    let (bus, mongo) = tokio::try_join!(
        async { Bus::connect(&config.nats).await.map_err(CommandError::from) },
        async {
            Mongo::connect(&config.mongo)
                .await
                .map_err(CommandError::from)
        },
    )?;
    let mut characters = Characters::load(&config.characters.dir)?;
    characters.resolve(&mongo).await?;
    Ok((bus, mongo, characters))
}

async fn resolve_user(mongo: &Mongo, user: &str) -> Result<ObjectId, CommandError> {
    if let Some(id) = parse_object_id(user) {
        return Ok(id);
    }
    let found = mongo
        .collection(USERS)
        .find_one(doc! { "username": user })
        .await
        .map_err(companion::store::StoreError::from)?;
    found
        .and_then(|d| d.get_object_id("_id").ok())
        .ok_or_else(|| CommandError::UnknownUser(user.to_owned()))
}

/// Prints a reply and its card the way the terminal chat shows them.
pub fn print_reply(bot_name: &str, c: &Completion) {
    println!("{}> {}", bot_name.to_lowercase(), c.content);
    if let Some(card) = &c.rich_content {
        let kind = card.get("type").and_then(|t| t.as_str()).unwrap_or("card");
        println!(
            "  [{kind}] {}",
            serde_json::to_string(card.get("data").unwrap_or(card)).unwrap_or_default()
        );
    }
}

/// The lines a scripted chat plays: `builtin` (the chat's own script), `spot-wizard`, a file, or stdin
/// when it is not a terminal; `None` on a terminal (the chat is interactive).
async fn script_lines(
    script: Option<&Path>,
    builtin: &[&str],
) -> Result<Option<Vec<String>>, CommandError> {
    let owned = |lines: &[&str]| lines.iter().map(|s| s.to_string()).collect();
    Ok(Some(match script {
        Some(p) if p.as_os_str() == "builtin" => owned(builtin),
        Some(p) if p.as_os_str() == "spot-wizard" => owned(SPOT_WIZARD_SCRIPT),
        Some(p) => std::fs::read_to_string(p)?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect(),
        None if std::io::stdin().is_terminal() => return Ok(None),
        None => {
            let mut out = Vec::new();
            let mut stdin = BufReader::new(tokio::io::stdin()).lines();
            while let Some(l) = stdin.next_line().await? {
                if !l.trim().is_empty() {
                    out.push(l);
                }
            }
            out
        }
    }))
}

/// The interactive chat, or the scripted one when `script` is given or stdin is not a terminal.
pub async fn chat(
    session: &Session,
    script: Option<&Path>,
    wait: Duration,
) -> Result<(), CommandError> {
    let Some(lines) = script_lines(script, DEMO_SCRIPT).await? else {
        println!(
            "chatting with {} as user {} in conversation {} (empty line or Ctrl-D to quit)",
            session.bot_name, session.user, session.conversation
        );
        return interactive(session, wait).await;
    };
    for line in lines {
        println!("you> {line}");
        let reply = session
            .say(&line, &[], Some(wait))
            .await?
            .expect("waited for a reply");
        print_reply(&session.bot_name, &reply);
        println!();
    }
    Ok(())
}

async fn interactive(session: &Session, wait: Duration) -> Result<(), CommandError> {
    read_lines(
        async |line| match session.say(line, &[], Some(wait)).await {
            Ok(Some(reply)) => print_reply(&session.bot_name, &reply),
            Ok(None) => {}
            Err(e) => println!("  ({e})"),
        },
    )
    .await
}

/// Reads the user's lines at a `you>` prompt and hands each to `on_line`, until an empty line or the
/// end of input.
async fn read_lines(mut on_line: impl AsyncFnMut(&str)) -> Result<(), CommandError> {
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut stdout = tokio::io::stdout();
    loop {
        stdout.write_all(b"you> ").await?;
        stdout.flush().await?;
        let Some(line) = stdin.next_line().await? else {
            break;
        };
        let line = line.trim();
        if line.is_empty() {
            break;
        }
        on_line(line).await;
    }
    Ok(())
}

/// A user in a group conversation with several companions (`chat --group kaori,tony`).
pub struct GroupSession {
    pub bus: Bus,
    pub mongo: Mongo,
    pub user: ObjectId,
    pub conversation: ObjectId,
    /// The companions, by bot id: their names.
    pub names: std::collections::HashMap<String, String>,
}

impl GroupSession {
    /// The group of `user` and the companions `bots` (comma separated), created as TB-Backend would when
    /// there is none with exactly them.
    pub async fn open(config: &ChatConfig, user: &str, bots: &str) -> Result<Self, CommandError> {
        let (bus, mongo, characters) = connect(config).await?;
        let user = resolve_user(&mongo, user).await?;
        let mut ids = Vec::new();
        let mut names = std::collections::HashMap::new();
        for b in bots.split(',').map(str::trim).filter(|b| !b.is_empty()) {
            let (id, c) = characters
                .by_name(b)
                .ok_or_else(|| CommandError::UnknownBot(b.to_owned()))?;
            ids.push(id);
            names.insert(id.to_hex(), c.name.clone());
        }
        let mut participants = vec![user];
        participants.extend(&ids);
        let existing = mongo
            .collection(companion::store::mongo::DM_CONVERSATIONS)
            .find_one(doc! {
                "isGroup": true,
                "participants": { "$all": participants.clone(), "$size": participants.len() as i32 },
            })
            .await
            .map_err(companion::store::StoreError::from)?
            .and_then(|d| d.get_object_id("_id").ok());
        let conversation = match existing {
            Some(id) => id,
            None => backend::create_group(&mongo, &[user], &ids).await?,
        };
        Ok(Self {
            bus,
            mongo,
            user,
            conversation,
            names,
        })
    }

    /// Sends one message and prints every companion message that answers it, as they come: each
    /// companion announces itself with a typing event, so the answers are over when none follows within
    /// `quiet` (and after `wait` at most).
    pub async fn say(
        &self,
        text: &str,
        wait: Duration,
        quiet: Duration,
    ) -> Result<usize, CommandError> {
        let replies = backend::completions(&self.bus, self.conversation).await?;
        let typing = self
            .bus
            .client
            .subscribe(self.bus.names.typing(&self.conversation.to_hex()))
            .await
            .map_err(backend::BackendError::from)?;
        let event =
            backend::store_group_message(&self.mongo, self.conversation, self.user, text).await?;
        backend::publish_group_message(&self.bus, &event).await?;
        let mut replies = pin!(replies.filter(|c| futures::future::ready(
            c.responds_to.as_deref() == Some(event.message_id.as_str())
        )));
        let mut typing = pin!(typing);
        let deadline = tokio::time::Instant::now() + wait;
        let mut answered = 0;
        // Someone is about to speak (a typing event came and no answer since).
        let mut expecting = false;
        loop {
            let limit = if expecting {
                deadline
            } else {
                (tokio::time::Instant::now() + quiet).min(deadline)
            };
            tokio::select! {
                c = replies.next() => {
                    let Some(c) = c else { break };
                    let name = self.names.get(&c.sender_id).cloned().unwrap_or_else(|| c.sender_id.clone());
                    print_reply(&name, &c);
                    answered += 1;
                    expecting = false;
                }
                t = typing.next() => {
                    if t.is_none() { break }
                    expecting = true;
                }
                _ = tokio::time::sleep_until(limit) => break,
            }
        }
        if answered == 0 {
            if expecting {
                return Err(CommandError::NoReply(wait));
            }
            println!("  (no companion answers that)");
        }
        Ok(answered)
    }
}

/// The group chat in the terminal, or scripted (`script`, or stdin when it is not a terminal).
pub async fn group_chat(
    session: &GroupSession,
    script: Option<&Path>,
    wait: Duration,
) -> Result<(), CommandError> {
    let quiet = Duration::from_secs(4);
    let mut names: Vec<&String> = session.names.values().collect();
    names.sort();
    let Some(lines) = script_lines(script, GROUP_SCRIPT).await? else {
        println!(
            "group chat with {} in conversation {} (empty line or Ctrl-D to quit)",
            names
                .iter()
                .map(|n| n.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            session.conversation
        );
        return read_lines(async |line| {
            if let Err(e) = session.say(line, wait, quiet).await {
                println!("  ({e})");
            }
        })
        .await;
    };
    for line in lines {
        println!("you> {line}");
        session.say(&line, wait, quiet).await?;
        println!();
    }
    Ok(())
}
