//! `companion-dev send` and `chat`: one DM, or a conversation in the terminal, exactly as TB-Backend sends them.

use std::{io::IsTerminal, path::Path, pin::pin, time::Duration};

use bson::{doc, oid::ObjectId};
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::backend;
use companion_core::config::{CharactersConfig, MongoConfig, NatsConfig, PgConfig};
use companion_journal::{JobRecord, Journal, State};
use companion_knowledge::character::Characters;
use companion_store::store::Pool;
use companion_store::{
    bus::{
        Bus,
        event::{Completion, parse_object_id},
    },
    store::{Mongo, Pg, USERS},
};

/// Lines the group demo plays when it is not run on a terminal.
pub const GROUP_SCRIPT: &[&str] = &[
    "I'm a snowboarder trying to get into skating, any tips?",
    "lol nice",
    "@tony what board size should i get?",
    "kaori, how do i drop in on a skateboard?",
    "kaori and tony: park or street first?",
];

/// The spot wizard, played by `chat --script spot-wizard` (then `review` approves the draft).
pub const SPOT_WIZARD_SCRIPT: &[&str] = &[
    "can you help me add a spot to the map?",
    "https://www.google.com/maps/place/Hollow+Bowl/@45.5231,-122.6765,17z",
    "it's called Hollow Bowl, a diy spot with a deep bowl and a little hip",
];

/// Lines the demo plays when it is not run on a terminal (`{bot}`: the companion's name).
pub const DEMO_SCRIPT: &[&str] = &[
    "hey {bot}!! how often should i wax my snowboard?",
    "what's on my tricklists right now?",
    "make me a park list with kickflip, 50-50 and boardslide",
    "any good skateparks in Portland?",
    "how do I ollie?",
    "what's a good first trick on a skateboard?",
    "can you add this spot? https://www.google.com/maps/place/Hollow+Bowl/@45.5231,-122.6765,17z",
    "remind me to wax my board in a few seconds",
    "remember i ride goofy",
    "btw my home park is burnside, i'm scared of dropping in there",
];

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("no user `{0}` (give a 24-hex id or a username)")]
    UnknownUser(String),
    #[error("no companion `{0}` in the character files")]
    UnknownBot(String),
    #[error(
        "no reply within {0:?}: neither the journal nor the dead-letter stream knows the message; is a worker running?"
    )]
    NoReply(Duration),
    #[error(
        "no reply: the message was dead-lettered{}: {reason}; `companion replay --dlq` brings it back",
        deliveries.map(|n| format!(" after {n} attempts")).unwrap_or_default()
    )]
    DeadLettered {
        reason: String,
        deliveries: Option<i64>,
    },
    #[error(
        "the turn was not over within {0:?}: a worker took the message and is still on it (see its log)"
    )]
    StillRunning(Duration),
    #[error(
        "no reply within {0:?}, and the journal cannot be read ({1}): PostgreSQL may be down (see the worker's log)"
    )]
    JournalUnreadable(Duration, String),
    #[error("no spot draft made by {bot} for user {user}")]
    NoDraft { user: ObjectId, bot: String },
    #[error(transparent)]
    Backend(#[from] backend::BackendError),
    #[error(transparent)]
    Store(#[from] companion_store::store::StoreError),
    #[error(transparent)]
    Characters(#[from] companion_knowledge::character::CharacterError),
    #[error(transparent)]
    Bus(#[from] companion_store::bus::BusError),
    #[error("terminal: {0}")]
    Io(#[from] std::io::Error),
}

/// What `send` and `chat` act as: a user talking to one companion in one conversation.
pub struct Session {
    pub bus: Bus,
    pub mongo: Mongo,
    /// What became of a message that got no reply.
    pub journal: Journal,
    /// The service's database, for what the demo checks (a guided flow's state).
    pub pool: Pool,
    pub user: ObjectId,
    pub bot: ObjectId,
    pub bot_name: String,
    /// The companion's busy line: a reply that is it says so.
    pub busy_line: String,
    /// The companion's failure line: a reply that is it is followed by why, from the journal.
    pub failure_line: String,
    pub conversation: ObjectId,
    /// Cards as raw JSON.
    pub raw_cards: bool,
    /// Each reply line ends with the id `companion explain` takes.
    pub ids: bool,
}

/// What `send` and `chat` connect to.
#[derive(clap::Args, Clone, Debug)]
pub struct ChatConfig {
    #[command(flatten)]
    pub nats: NatsConfig,
    #[command(flatten)]
    pub mongo: MongoConfig,
    /// The service's database: the journal says what became of a message that got no reply.
    #[command(flatten)]
    pub pg: PgConfig,
    #[command(flatten)]
    pub characters: CharactersConfig,
    /// Show cards as the raw JSON the app receives instead of as the app would render them.
    #[arg(long, help_heading = "Options")]
    pub raw_cards: bool,
    /// End each reply line with the id `companion explain` takes: the user's message it answers, or a
    /// follow-up's `<kind>:<id>`.
    #[arg(long, help_heading = "Options")]
    pub ids: bool,
}

impl Session {
    pub async fn open(config: &ChatConfig, user: &str, bot: &str) -> Result<Self, CommandError> {
        let (bus, mongo, characters) = connect(config).await?;
        let pg = Pg::connect(&config.pg).await?;
        let user_id = resolve_user(&mongo, user).await?;
        let found = match parse_object_id(bot) {
            Some(id) => characters.by_bot(&id).map(|c| (id, c)),
            None => characters.by_name(bot),
        };
        let (bot_id, character) = found.ok_or_else(|| CommandError::UnknownBot(bot.to_owned()))?;
        let conversation = backend::ensure_conversation(&mongo, user_id, bot_id).await?;
        Ok(Self {
            bus,
            mongo,
            pool: pg.pool.clone(),
            journal: Journal::new(pg.pool),
            user: user_id,
            bot: bot_id,
            bot_name: character.name.clone(),
            busy_line: character.busy_line.clone(),
            failure_line: character.failure_line.clone(),
            conversation,
            raw_cards: config.raw_cards,
            ids: config.ids,
        })
    }

    /// The user's guided flow `flow` with this companion: (step, status), if there is one.
    pub async fn flow_state(&self, flow: &str) -> Result<Option<(String, String)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT step, status FROM flow_states WHERE user_id = $1 AND bot_id = $2 AND flow = $3",
        )
        .bind(self.user.to_hex())
        .bind(self.bot.to_hex())
        .bind(flow)
        .fetch_optional(&self.pool)
        .await
    }

    /// Prints a reply the way the terminal chat shows it, saying when it is the busy line.
    pub fn print(&self, c: &Completion) {
        if c.content == self.busy_line {
            let label = format!("{} (busy: over the flood limit)", self.bot_name);
            print_reply(&label, c, self.raw_cards, self.ids);
        } else {
            print_reply(&self.bot_name, c, self.raw_cards, self.ids);
        }
    }

    /// One line on a turn that did not simply answer, as the journal tells it: it failed (its reply is
    /// the failure line), it was over the flood limit with no busy line of its own, it was dropped or
    /// held. `None` when the turn answered.
    pub async fn note(&self, turn: &Turn) -> Option<String> {
        let failed = turn.job.as_ref().is_some_and(|j| j.state == State::Failed)
            || turn.replies.iter().any(|c| c.content == self.failure_line);
        if turn.replies.is_empty() || failed {
            turn_note(&self.journal, turn).await
        } else {
            None
        }
    }

    /// Sends one message and, when `wait` is set, waits for the whole turn (see [`whole_turn`]).
    pub async fn say(
        &self,
        text: &str,
        images: &[String],
        wait: Option<Duration>,
    ) -> Result<Turn, CommandError> {
        self.say_showing(text, images, wait, |_| {}).await
    }

    /// [`Session::say`], handing each message of the turn to `shown` as it arrives.
    pub async fn say_showing(
        &self,
        text: &str,
        images: &[String],
        wait: Option<Duration>,
        shown: impl FnMut(&Completion),
    ) -> Result<Turn, CommandError> {
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
        let Some(wait) = wait else {
            return Ok(Turn {
                message: event.message_id,
                replies: Vec::new(),
                job: None,
            });
        };
        let watch = Watch {
            journal: &self.journal,
            pool: &self.pool,
            bus: &self.bus,
            subject: self
                .bus
                .names
                .inbound(&self.bot.to_hex(), &self.conversation.to_hex()),
        };
        watch
            .whole_turn(replies, &event.message_id, wait, shown)
            .await
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
        let (draft, draft_id) = self.latest_draft().await?;
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
            let spot = self.publish_spot(&draft).await?;
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

    /// The newest spot draft the companion made for the user, and its id.
    async fn latest_draft(&self) -> Result<(bson::Document, ObjectId), CommandError> {
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
        Ok((draft, draft_id))
    }

    /// Puts an approved draft's spot in `ck_spots`, as the admin tool does; returns the spot's id.
    async fn publish_spot(&self, draft: &bson::Document) -> Result<ObjectId, CommandError> {
        let store = |e: mongodb::error::Error| CommandError::Store(e.into());
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
        Ok(spot)
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

/// How long a turn may take before the chat says what the journal knows.
const LATE: Duration = Duration::from_secs(10);

/// How often the chat reads the journal while a turn runs.
const POLL: Duration = Duration::from_millis(200);

/// How long the chat waits, once the journal has settled a job, for the messages the job published to
/// arrive: they went out before it settled, so normally they are here already.
const DRAIN: Duration = Duration::from_secs(5);

/// One message's turn, as the chat saw it.
#[derive(Clone, Debug)]
pub struct Turn {
    /// The user's message: the id `companion explain` takes.
    pub message: String,
    /// The companions' messages of the turn, in the order they arrived: a crisis referral and the
    /// companion's reply, a group's speakers, a burst's one reply.
    pub replies: Vec<Completion>,
    /// The message's job as the journal settled it; none when the message was only published.
    pub job: Option<JobRecord>,
}

/// Whether `c` is one of the messages of user message `message`'s turn (a follow-up never is).
fn belongs(c: &Completion, message: &str) -> bool {
    !c.proactive
        && (c.in_reply_to.as_deref() == Some(message)
            || c.responds_to.as_deref() == Some(message)
            || c.covers.iter().any(|m| m == message))
}

/// What the chat reads to know that a turn is over: the worker's journal.
struct Watch<'a> {
    journal: &'a Journal,
    pool: &'a Pool,
    /// Where a message that got no reply may have been dead-lettered.
    bus: &'a Bus,
    /// The subject the message was published on.
    subject: String,
}

impl Watch<'_> {
    /// Waits until the turn of user message `message` is over, handing each of its messages to `shown`
    /// as it arrives from `replies` (subscribed before the message was published). Over means: the
    /// journal has settled the message's job (and the job that answered it, for a message a burst or the
    /// flood limit covered), and every message the job published has arrived. A crisis turn's referral
    /// and its reply, a group's speakers: all of them, however far apart. Not settled within `wait`: what
    /// the journal knows, as the error.
    async fn whole_turn(
        &self,
        replies: impl futures::Stream<Item = Completion>,
        message: &str,
        wait: Duration,
        mut shown: impl FnMut(&Completion),
    ) -> Result<Turn, CommandError> {
        let mut replies = pin!(replies);
        let mut got: Vec<Completion> = Vec::new();
        let mut take = |c: Completion, got: &mut Vec<Completion>| {
            if belongs(&c, message) && !got.iter().any(|g| g.message_id == c.message_id) {
                shown(&c);
                got.push(c);
            }
        };
        let started = tokio::time::Instant::now();
        let deadline = started + wait;
        let mut late = Some(started + LATE.min(wait));
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (job, expected) = loop {
            tokio::select! {
                c = replies.next() => match c {
                    Some(c) => take(c, &mut got),
                    None => return Err(CommandError::NoReply(wait)),
                },
                _ = poll.tick() => {
                    // A journal that cannot be read now may be read on the next tick; at the deadline
                    // the error says so.
                    if let Ok(Some(settled)) = self.settled(message).await {
                        break settled;
                    }
                    let now = tokio::time::Instant::now();
                    if late.is_some_and(|at| now >= at) {
                        late = None;
                        if let Some(line) = status_of(self.journal, message).await {
                            let what = if got.is_empty() { "no reply" } else { "the turn still runs" };
                            println!("  ({what} after {} s: {line})", LATE.min(wait).as_secs());
                        }
                    }
                    if now >= deadline {
                        return Err(self.no_reply(message, wait).await);
                    }
                }
            }
        };
        let drained = tokio::time::Instant::now() + DRAIN;
        while got.len() < expected {
            match tokio::time::timeout_at(drained, replies.next()).await {
                Ok(Some(c)) => take(c, &mut got),
                _ => {
                    println!(
                        "  (the journal says {expected} message(s) went out for it; {} came here; see {})",
                        got.len(),
                        worker_log()
                    );
                    break;
                }
            }
        }
        Ok(Turn {
            message: message.to_owned(),
            replies: got,
            job: Some(job),
        })
    }

    /// `message`'s job once it is settled, and the job that answered it too when that was another
    /// (a burst's first message, an earlier busy line); with how many of the turn's messages went out.
    async fn settled(
        &self,
        message: &str,
    ) -> Result<Option<(JobRecord, usize)>, companion_journal::JournalError> {
        let Some(job) = self.journal.get(message).await? else {
            return Ok(None);
        };
        if !job.state.is_settled() {
            return Ok(None);
        }
        if let Some(by) = job.covered_by.as_deref().filter(|by| *by != message) {
            let Some(cover) = self.journal.get(by).await? else {
                return Ok(None);
            };
            if !cover.state.is_settled() {
                return Ok(None);
            }
            // A burst's later message has the reply that covers it; one over the flood limit, none.
            let answered =
                job.state == State::Covered && matches!(cover.state, State::Done | State::Failed);
            return Ok(Some((job, usize::from(answered))));
        }
        let published = self.published(&job).await?;
        Ok(Some((job, published)))
    }

    /// How many messages `job` published in its reply generation: its `publish` steps (a crisis
    /// referral's, and each slot's of the generation).
    async fn published(&self, job: &JobRecord) -> Result<usize, companion_journal::JournalError> {
        use companion::testing::steps::PUBLISH;
        use companion_journal::names::key;
        let keys: Vec<String> =
            sqlx::query_scalar("SELECT key FROM job_records WHERE job = $1 AND name = $2")
                .bind(job.id())
                .bind(PUBLISH.name)
                .fetch_all(self.pool)
                .await?;
        let referral = key::crisis("");
        Ok(keys
            .iter()
            .filter(|k| {
                k.starts_with(&referral)
                    || key::Slot::of_reply(k).is_some_and(|(g, _)| g == job.generation)
            })
            .count())
    }
}

/// One line on what became of `message` so far, as the journal tells it: printed when its turn is late,
/// failed, or ended without a message. `None` when there is nothing to say (answered).
async fn status_of(journal: &Journal, message: &str) -> Option<String> {
    let log = worker_log();
    let job = match journal.get(message).await {
        Ok(j) => j,
        Err(e) => {
            return Some(format!(
                "the journal cannot be read either, PostgreSQL may be down ({}); see {log}",
                clip(&e.to_string())
            ));
        }
    };
    let Some(j) = job else {
        return Some(format!(
            "no worker has taken the message yet: is one running? see {log}"
        ));
    };
    let error = j.last_error.as_deref().map(clip);
    Some(match (j.state, error) {
        (State::Failed, Some(e)) => format!("it failed: {e}; see {log}"),
        (State::Failed, None) => format!("it failed; see {log}"),
        (State::Running, Some(e)) => format!(
            "attempt {} failed ({e}); the worker tries again; see {log}",
            (j.attempts - 1).max(1)
        ),
        (State::Running, None) => format!(
            "a worker is on it (attempt {}): the model or a server is slow; see {log}",
            j.attempts
        ),
        (State::Limited, _) => "over the flood limit: the next real answer covers it".into(),
        (State::Held, _) => "a moderator paused the conversation".into(),
        (State::Dropped, _) => format!(
            "no message, on purpose: {}",
            j.reason.as_deref().unwrap_or("dropped")
        ),
        _ => return None,
    })
}

/// What the journal says of a settled turn that failed or sent nothing.
async fn turn_note(journal: &Journal, turn: &Turn) -> Option<String> {
    match status_of(journal, &turn.message).await {
        Some(line) => Some(line),
        None if turn.replies.is_empty() => Some(format!(
            "the job ended {} without a message of its own; see {}",
            turn.job.as_ref().map_or("settled", |j| j.state.as_str()),
            worker_log()
        )),
        None => None,
    }
}

/// Why `message`'s turn was not over within `wait`, as the journal tells it.
impl Watch<'_> {
    /// Why a message got no reply within `wait`: a turn still running (the journal), a dead letter (the
    /// dead-letter stream: why and after how many attempts), a journal that cannot be read, and only when
    /// neither knows the message, no worker.
    async fn no_reply(&self, message: &str, wait: Duration) -> CommandError {
        let job = self.journal.get(message).await;
        if let Ok(Some(j)) = &job
            && j.state == State::Running
        {
            return CommandError::StillRunning(wait);
        }
        match self
            .bus
            .lookup()
            .dead_letter_of(&self.subject, message)
            .await
        {
            Ok(Some(dead)) => {
                return CommandError::DeadLettered {
                    reason: clip(&dead.reason),
                    deliveries: dead.deliveries,
                };
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "the dead letters cannot be read"),
        }
        match job {
            Ok(_) => CommandError::NoReply(wait),
            Err(e) => CommandError::JournalUnreadable(wait, clip(&e.to_string())),
        }
    }
}

/// Where the worker's log is, as the demo scripts say (`COMPANION_WORKER_LOG`).
fn worker_log() -> String {
    std::env::var("COMPANION_WORKER_LOG").unwrap_or_else(|_| "the worker's log".into())
}

/// An error, on one line and short.
fn clip(e: &str) -> String {
    let line = e.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line,
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

pub async fn resolve_user(mongo: &Mongo, user: &str) -> Result<ObjectId, CommandError> {
    if let Some(id) = parse_object_id(user) {
        return Ok(id);
    }
    let found = mongo
        .collection(USERS)
        .find_one(doc! { "username": user })
        .await
        .map_err(companion_store::store::StoreError::from)?;
    found
        .and_then(|d| d.get_object_id("_id").ok())
        .ok_or_else(|| CommandError::UnknownUser(user.to_owned()))
}

/// Prints a reply and its card the way the terminal chat shows them: the card as the app renders it,
/// or its JSON when `raw`; with `ids`, the line ends with the id `companion explain` takes.
pub fn print_reply(bot_name: &str, c: &Completion, raw: bool, ids: bool) {
    match explain_id(c).filter(|_| ids) {
        Some(id) => println!("{}> {}  [explain {id}]", bot_name.to_lowercase(), c.content),
        None => println!("{}> {}", bot_name.to_lowercase(), c.content),
    }
    if let Some(card) = &c.rich_content {
        for line in card_lines(card, raw) {
            println!("  {line}");
        }
    }
}

/// The id `companion explain` takes for the job that sent `c`: the user message it answers (a burst's
/// first), or a follow-up's `<kind>:<id>`.
pub fn explain_id(c: &Completion) -> Option<String> {
    match &c.trigger {
        Some(t) => Some(format!("{}:{}", t.kind, t.id)),
        None => c.responds_to.clone().or_else(|| c.in_reply_to.clone()),
    }
}

/// A card's lines: what the app shows of it (a name, where and how good, the deep link), or its type
/// and JSON when `raw` or unknown.
pub fn card_lines(card: &serde_json::Value, raw: bool) -> Vec<String> {
    use serde_json::Value;
    let kind = card.get("type").and_then(Value::as_str).unwrap_or("card");
    let data = card.get("data").unwrap_or(card);
    let raw_line = || {
        format!(
            "[{kind}] {}",
            serde_json::to_string(data).unwrap_or_default()
        )
    };
    if raw {
        return vec![raw_line()];
    }
    match kind {
        "spot_card" => vec![spot_line(data)],
        "spots_list" => match data.as_array() {
            Some(spots) if !spots.is_empty() => spots.iter().map(spot_line).collect(),
            _ => vec!["📍 (no spots)".into()],
        },
        "tricklist_card" => {
            let count = data.get("trickCount").and_then(Value::as_u64).unwrap_or(0);
            let category = card_text(data, "category")
                .map(|c| format!("{c}, "))
                .unwrap_or_default();
            vec![format!(
                "📋 {} ({category}{count} tricks){}",
                card_name(data),
                card_link(data)
            )]
        }
        "trick_card" => {
            let about: Vec<String> = ["category", "difficulty"]
                .iter()
                .filter_map(|k| card_text(data, k))
                .collect();
            vec![format!(
                "🤙 {} ({}){}",
                card_name(data),
                about.join(", "),
                card_link(data)
            )]
        }
        "crisis_resources" => {
            let lines = data.get("lines").and_then(Value::as_array);
            match lines {
                Some(lines) if !lines.is_empty() => lines.iter().map(crisis_line).collect(),
                _ => vec!["🆘 (no lines)".into()],
            }
        }
        "spot_draft_confirmation" => {
            let status = match card_text(data, "status").as_deref() {
                Some("pending_approval") => "waiting for a moderator".to_owned(),
                Some(s) => s.to_owned(),
                None => "submitted".to_owned(),
            };
            vec![format!(
                "📝 {}{} · {status}",
                card_name(data),
                card_place(data)
            )]
        }
        _ => vec![raw_line()],
    }
}

/// A card's text field `k`, if it has one.
fn card_text(v: &serde_json::Value, k: &str) -> Option<String> {
    v.get(k)
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
}

/// Where a card's place is (` · city, state`), or nothing.
fn card_place(v: &serde_json::Value) -> String {
    let parts: Vec<String> = ["city", "state"]
        .iter()
        .filter_map(|k| card_text(v, k))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(" · {}", parts.join(", "))
    }
}

/// A card's rating (` · ★ 4.5`), or nothing.
fn card_rating(v: &serde_json::Value) -> String {
    v.get("rating")
        .and_then(serde_json::Value::as_f64)
        .map(|r| format!(" · ★ {r:.1}"))
        .unwrap_or_default()
}

/// A card's link into the app (` · <deep link>`), or nothing.
fn card_link(v: &serde_json::Value) -> String {
    card_text(v, "deepLink")
        .map(|l| format!(" · {l}"))
        .unwrap_or_default()
}

/// A card's name, or `(no name)`.
fn card_name(v: &serde_json::Value) -> String {
    card_text(v, "name").unwrap_or_else(|| "(no name)".into())
}

/// A spot's line: its name, place, rating and link.
fn spot_line(v: &serde_json::Value) -> String {
    format!(
        "📍 {}{}{}{}",
        card_name(v),
        card_place(v),
        card_rating(v),
        card_link(v)
    )
}

/// A crisis line as the app's card lists it: whom to reach, how, when, and what it costs.
fn crisis_line(v: &serde_json::Value) -> String {
    let mut how: Vec<String> = Vec::new();
    if let Some(p) = card_text(v, "phone") {
        how.push(format!("call {p}"));
    }
    if let Some(t) = card_text(v, "text") {
        how.push(format!("text {t}"));
    }
    if let Some(u) = card_text(v, "url") {
        how.push(u);
    }
    let mut parts = vec![card_name(v)];
    parts.extend(how);
    parts.extend(["hours", "cost"].iter().filter_map(|k| card_text(v, k)));
    format!("🆘 {}", parts.join(" · "))
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

/// Prints the companion's follow-ups (a reminder come due, a spot's review) as they arrive, labelled, for
/// as long as the returned listener lives; each one printed is also sent on its channel.
pub struct FollowUps {
    task: tokio::task::JoinHandle<()>,
    printed: tokio::sync::mpsc::UnboundedReceiver<String>,
    /// When the session began: the reminders waited for are those set since.
    since: chrono::DateTime<chrono::Utc>,
    /// Reminders printed in the session so far.
    reminders: usize,
}

impl FollowUps {
    /// Listens on the session's conversation; `prompt`: print the `you> ` prompt again after each one
    /// (the interactive chat waits at it).
    pub async fn listen(session: &Session, prompt: bool) -> Result<Self, CommandError> {
        let mut completions =
            Box::pin(backend::completions(&session.bus, session.conversation).await?);
        let (name, raw, ids) = (session.bot_name.clone(), session.raw_cards, session.ids);
        let (tx, printed) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Some(c) = completions.next().await {
                if !c.proactive {
                    continue;
                }
                let kind = c.trigger.as_ref().map_or("follow-up", |t| t.kind.as_str());
                let label = format!("{name} (follow-up: {})", follow_up_label(kind));
                if prompt {
                    println!();
                }
                print_reply(&label, &c, raw, ids);
                if prompt {
                    print!("you> ");
                    let _ = std::io::Write::flush(&mut std::io::stdout());
                }
                let _ = tx.send(kind.to_owned());
            }
        });
        Ok(Self {
            task,
            printed,
            since: chrono::Utc::now(),
            reminders: 0,
        })
    }

    /// After piped lines: waits (up to `max`) for the reminders set in this session and due by then,
    /// saying so first; how many reminders the session printed.
    pub async fn linger(
        &mut self,
        session: &Session,
        max: Duration,
    ) -> Result<usize, CommandError> {
        while let Ok(kind) = self.printed.try_recv() {
            self.count(&kind);
        }
        let horizon = chrono::Utc::now() + chrono::Duration::from_std(max).unwrap_or_default();
        let due: Vec<(chrono::DateTime<chrono::Utc>,)> = sqlx::query_as(
            "SELECT fire_at FROM reminders WHERE user_id = $1 AND bot_id = $2 AND state = 'pending'
               AND created_at >= $3 AND fire_at <= $4 ORDER BY fire_at",
        )
        .bind(session.user.to_hex())
        .bind(session.bot.to_hex())
        .bind(self.since)
        .bind(horizon)
        .fetch_all(&session.pool)
        .await
        .map_err(|e| CommandError::Store(e.into()))?;
        let waiting = due.len().saturating_sub(self.reminders);
        let Some((last,)) = due.last().copied().filter(|_| waiting > 0) else {
            return Ok(self.reminders);
        };
        println!(
            "({waiting} reminder{} due by {} UTC: waiting for {})",
            if waiting == 1 { "" } else { "s" },
            last.format("%H:%M:%S"),
            if waiting == 1 { "it" } else { "them" }
        );
        let deadline = tokio::time::Instant::now() + max;
        while self.reminders < due.len() {
            match tokio::time::timeout_at(deadline, self.printed.recv()).await {
                Ok(Some(kind)) => self.count(&kind),
                _ => {
                    println!("(no reminder came by then: see worker.log)");
                    break;
                }
            }
        }
        Ok(self.reminders)
    }

    fn count(&mut self, kind: &str) {
        if kind == "reminder" {
            self.reminders += 1;
        }
    }
}

impl Drop for FollowUps {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a follow-up's trigger is, in the chat's words.
fn follow_up_label(kind: &str) -> &str {
    match kind {
        "reminder" => "reminder",
        "spot_review" => "spot review",
        other => other,
    }
}

/// The interactive chat, or the scripted one when `script` is given or stdin is not a terminal. Each
/// line's turn is shown whole, each message as it arrives (a crisis referral, then the companion's
/// reply). The interactive and piped chats print the companion's follow-ups as they arrive; piped, the
/// chat then waits for the reminders due within `wait`. A `--script` run does not (the demo shows them
/// itself). Returns the last message's id, what `companion explain` takes.
pub async fn chat(
    session: &Session,
    script: Option<&Path>,
    wait: Duration,
) -> Result<Option<String>, CommandError> {
    let terminal = script.is_none() && std::io::stdin().is_terminal();
    let mut follow_ups = match script {
        None => Some(FollowUps::listen(session, terminal).await?),
        Some(_) => None,
    };
    let Some(lines) = script_lines(script, DEMO_SCRIPT).await? else {
        println!(
            "chatting with {} as user {} in conversation {} (an empty line or Ctrl-D quits; \
             follow-ups print as they come)",
            session.bot_name, session.user, session.conversation
        );
        return interactive(session, wait).await;
    };
    let mut last = None;
    for line in lines {
        let line = line.replace("{bot}", &session.bot_name.to_lowercase());
        println!("you> {line}");
        last = Some(dm_turn(session, &line, wait).await?);
        println!();
    }
    if let Some(f) = &mut follow_ups {
        f.linger(session, wait).await?;
    }
    Ok(last)
}

/// Sends one line and prints its turn as it comes, then what the journal says of a turn that failed or
/// sent nothing (over the flood limit, dropped, held); the line's message id.
async fn dm_turn(session: &Session, line: &str, wait: Duration) -> Result<String, CommandError> {
    let turn = session
        .say_showing(line, &[], Some(wait), |c| session.print(c))
        .await?;
    if let Some(note) = session.note(&turn).await {
        println!("  ({note})");
    }
    Ok(turn.message)
}

async fn interactive(session: &Session, wait: Duration) -> Result<Option<String>, CommandError> {
    let mut last = None;
    read_lines(async |line| match dm_turn(session, line, wait).await {
        Ok(id) => last = Some(id),
        Err(e) => println!("  ({e})"),
    })
    .await?;
    Ok(last)
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
    /// When a group message's turn is over.
    pub journal: Journal,
    pub pool: Pool,
    /// Cards as raw JSON.
    pub raw_cards: bool,
    /// Each reply line ends with the id `companion explain` takes.
    pub ids: bool,
}

impl GroupSession {
    /// The group of `user` and the companions `bots` (comma separated), created as TB-Backend would when
    /// there is none with exactly them.
    pub async fn open(config: &ChatConfig, user: &str, bots: &str) -> Result<Self, CommandError> {
        let (bus, mongo, characters) = connect(config).await?;
        let pg = Pg::connect(&config.pg).await?;
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
        let conversation = backend::ensure_group(&mongo, user, &ids).await?;
        Ok(Self {
            bus,
            mongo,
            user,
            conversation,
            names,
            pool: pg.pool.clone(),
            journal: Journal::new(pg.pool),
            raw_cards: config.raw_cards,
            ids: config.ids,
        })
    }

    /// Sends one message and prints every companion message of its turn as it comes, until the journal
    /// has settled the message's job and all of them are here (see [`Session::say`]); then what the
    /// journal says of a turn that failed or in which no companion spoke.
    pub async fn say(&self, text: &str, wait: Duration) -> Result<Turn, CommandError> {
        let replies = backend::completions(&self.bus, self.conversation).await?;
        let event =
            backend::store_group_message(&self.mongo, self.conversation, self.user, text).await?;
        backend::publish_group_message(&self.bus, &event).await?;
        let watch = Watch {
            journal: &self.journal,
            pool: &self.pool,
            bus: &self.bus,
            subject: self.bus.names.group(&self.conversation.to_hex()),
        };
        let turn = watch
            .whole_turn(replies, &event.message_id, wait, |c| {
                let name = self.names.get(&c.sender_id).unwrap_or(&c.sender_id);
                print_reply(name, c, self.raw_cards, self.ids);
            })
            .await?;
        let failed = turn.job.as_ref().is_some_and(|j| j.state == State::Failed);
        if (turn.replies.is_empty() || failed)
            && let Some(note) = turn_note(&self.journal, &turn).await
        {
            println!("  ({note})");
        }
        Ok(turn)
    }
}

/// The group chat in the terminal, or scripted (`script`, or stdin when it is not a terminal). Returns
/// the last message's id, what `companion explain` takes.
pub async fn group_chat(
    session: &GroupSession,
    script: Option<&Path>,
    wait: Duration,
) -> Result<Option<String>, CommandError> {
    let mut names: Vec<&String> = session.names.values().collect();
    names.sort();
    let mut last = None;
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
        read_lines(async |line| match session.say(line, wait).await {
            Ok(turn) => last = Some(turn.message),
            Err(e) => println!("  ({e})"),
        })
        .await?;
        return Ok(last);
    };
    for line in lines {
        println!("you> {line}");
        last = Some(session.say(&line, wait).await?.message);
        println!();
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::card_lines;
    use serde_json::json;

    #[test]
    fn cards_read_as_the_app_shows_them_and_raw_on_request() {
        let spots = json!({"type": "spots_list", "data": [
            {"name": "Burnside Skatepark", "city": "Portland", "state": "OR", "rating": 4.9,
             "deepLink": "trickbook://spot/1"},
            {"name": "Hollow Bowl", "city": null, "rating": null}
        ]});
        assert_eq!(
            card_lines(&spots, false),
            [
                "📍 Burnside Skatepark · Portland, OR · ★ 4.9 · trickbook://spot/1",
                "📍 Hollow Bowl"
            ]
        );
        let list = json!({"type": "tricklist_card", "data": {"name": "Park List", "trickCount": 3,
                          "category": "skateboard", "deepLink": "trickbook://tricklist/2"}});
        assert_eq!(
            card_lines(&list, false),
            ["📋 Park List (skateboard, 3 tricks) · trickbook://tricklist/2"]
        );
        let draft = json!({"type": "spot_draft_confirmation",
                           "data": {"name": "New Spot", "status": "pending_approval"}});
        assert_eq!(
            card_lines(&draft, false),
            ["📝 New Spot · waiting for a moderator"]
        );
        let crisis = json!({"type": "crisis_resources", "data": {"lang": "en", "country": "US",
            "lines": [{"name": "988 Suicide & Crisis Lifeline", "phone": "988", "text": "988",
                       "url": "https://988lifeline.org", "kind": "crisis", "hours": "24/7", "cost": "free"}]}});
        assert_eq!(
            card_lines(&crisis, false),
            [
                "🆘 988 Suicide & Crisis Lifeline · call 988 · text 988 · https://988lifeline.org · 24/7 · free"
            ]
        );
        assert!(card_lines(&crisis, true)[0].starts_with("[crisis_resources] {"));
        assert!(card_lines(&list, true)[0].starts_with("[tricklist_card] {"));
        let odd = json!({"type": "poll", "data": {"q": 1}});
        assert_eq!(card_lines(&odd, false), [r#"[poll] {"q":1}"#]);
    }
}
