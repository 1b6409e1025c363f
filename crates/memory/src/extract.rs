//! The extraction job, off the reply path: per (user, companion), the job
//! `memory:<user>:<bot>:<e>-<through>:<s>-<through>` (`e`, `s`: how far extraction and the summary had
//! read; `through`: the last row of each batch) reads the DM messages since its last run,
//! asks the cheaper model for facts about the user, keeps them, and rewrites the rolling summary once
//! enough messages have left the history window. Each part is a journal step, so a crash or a replay
//! never doubles a fact:
//!
//! | step | key | recorded |
//! |---|---|---|
//! | `memory_batch` | `facts` / `summary` | the history rows read (ids only, never the text) |
//! | `llm` | `facts` / `summary` | the model's answer and usage, under no user's tally: the service pays |
//! | `memory_facts` | `facts` | the facts kept and what they replaced, written in its transaction with the cursor |
//! | `memory_summary` | `summary` | the summary written in its transaction with its cursor |
//!
//! It runs when a DM has had `COMPANION_MEMORY_EXTRACT_AFTER` new user messages, or has been quiet
//! `COMPANION_MEMORY_QUIET_SECS` (a message schedule each turn replaces, see [`Memory::after_turn`]).
//! Messages are skipped when deleted (tombstone), when the crisis screen flags them, and when the user
//! was erased; group chats are never read.

use std::fmt::Write;

use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::Row;
use tracing::{info, warn};

use super::{FACT_MAX, Memory, MemoryError, Topic, store::How, store::NewFact};
use crate::{
    bus::Bus,
    journal::{Attempt, Finish, Job, Journal, NewJob, State},
    llm::{ChatRequest, LlmClient, LlmRecord, Message},
};

/// The first line of an extraction request's system message (the scripted model knows it by this).
pub const EXTRACT_MARKER: &str = "## Memory extraction";
/// The first line of a summary request's system message.
pub const SUMMARY_MARKER: &str = "## Conversation summary";
/// Facts kept from one answer at most.
const FACTS_PER_RUN: usize = 20;
/// Known facts shown to the model (so it updates instead of repeating).
const KNOWN_SHOWN: usize = 30;
/// Messages one summary reads at most; a longer backlog is summarised over several runs.
const SUMMARY_BATCH: i64 = 60;
/// Longest summary kept, characters.
const SUMMARY_MAX_CHARS: usize = 1200;
/// Longest message shown to the model, characters.
const LINE_MAX_CHARS: usize = 600;

use crate::{calls::LLM, journal::StepKind};

/// A memory extraction's history rows read (ids only), keyed `facts` or `summary`.
pub(crate) const MEMORY_BATCH: StepKind<Batch> = StepKind::new("memory_batch");
/// The facts an extraction kept and what they replaced, written in its transaction with the cursor.
pub(crate) const MEMORY_FACTS: StepKind<FactsWritten> = StepKind::new("memory_facts");
/// The rolling summary, written in its transaction with its cursor (whether it was).
pub(crate) const MEMORY_SUMMARY: StepKind<bool> = StepKind::new("memory_summary");

/// What the extraction job needs besides memory's store.
pub(crate) struct Extractor<'a> {
    pub(crate) memory: &'a Memory,
    pub(crate) journal: &'a Journal,
    pub(crate) llm: &'a LlmClient,
    pub(crate) bus: &'a Bus,
    /// The model used (the cheaper one).
    pub(crate) model: &'a str,
    /// `COMPANION_HISTORY_LIMIT`: what has left it goes into the summary.
    pub(crate) history_limit: i64,
    /// The companion's name, for the prompts.
    pub(crate) companion: &'a str,
    /// The spend budgets: extraction is paid by the service and waits while its budget is used up.
    pub(crate) spend: Option<&'a crate::spend::SpendGuard>,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Extracted {
    /// No message to read.
    NothingNew,
    /// An earlier run with the same cursors and batch settled it.
    AlreadyDone,
    /// It ran: facts kept (new), summary rewritten.
    Ran { facts: usize, summary: bool },
    /// The user was erased: nothing is read or kept.
    Erased,
}

/// One history row the job reads.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Row_ {
    id: i64,
    message_id: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Batch {
    rows: Vec<Row_>,
    /// The last row id read: the cursor after this run.
    through: i64,
}

/// What the `memory_facts` step did.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct FactsWritten {
    kept: Vec<String>,
    replaced: Vec<String>,
    /// Another run had read these messages first (the cursor had moved): nothing written.
    #[serde(default)]
    skipped: bool,
}

/// A line of the conversation as the model sees it.
struct CitedLine {
    /// Its place in the batch (1 first): the number the model cites, the same on every attempt whatever
    /// was deleted or skipped since.
    n: usize,
    role: String,
    message_id: String,
    content: String,
    /// When it was said.
    at: chrono::DateTime<Utc>,
}

impl Extractor<'_> {
    /// Runs the extraction of (user, bot) from where the cursors stand, again from the new cursors when a
    /// concurrent run read the same messages first or a full batch leaves more (at most a few passes).
    pub(crate) async fn extract(&self, user: &str, bot: &str) -> Result<Extracted, MemoryError> {
        if self.memory.is_erased(user).await? {
            return Ok(Extracted::Erased);
        }
        let mut total = Extracted::NothingNew;
        for _ in 0..PASSES {
            let (e, s) = self.cursors(user, bot).await?;
            let facts = self.facts_batch(user, bot, e).await?;
            let summary = self.summary_batch(user, bot, s).await?;
            if facts.rows.is_empty() && summary.rows.is_empty() {
                break;
            }
            let id = format!(
                "memory:{user}:{bot}:{e}-{}:{s}-{}",
                facts.through, summary.through
            );
            let full = facts.rows.len() as i64 >= self.memory.config.batch_max.max(1) * 2;
            let new = NewJob {
                id: &id,
                kind: "memory",
                user,
                bot,
                conversation: "",
                stream_seq: None,
                reads: Default::default(),
            };
            let job = self.journal.open(&new).await?;
            let attempt = job.attempt(async |job| {
                let (kept, first) = self.facts(job, user, bot, e, facts).await?;
                let summarized = self.summary(job, user, bot, s, summary).await?;
                let reason = (!first).then_some("another run read these messages first");
                job.finish(
                    State::Done,
                    Finish {
                        by: None,
                        reason,
                        through: None,
                    },
                )
                .await?;
                Ok::<_, MemoryError>((kept, first, summarized))
            });
            let Attempt::Ran((kept, first, summarized)) = attempt.await? else {
                total = total.max(Extracted::AlreadyDone);
                break;
            };
            if self.memory.is_erased(user).await? {
                // After the job's last records: the erasure scrubbed what was recorded before it.
                let scrubbed = self.memory.scrub_erased_job(&id).await?;
                info!(job = %id, scrubbed, "the user was erased while this ran: nothing kept");
                return Ok(Extracted::Erased);
            }
            info!(job = %id, kept, summarized, first, "memory extraction ran");
            total = match total {
                Extracted::Ran { facts, summary } => Extracted::Ran {
                    facts: facts + kept,
                    summary: summary || summarized,
                },
                _ => Extracted::Ran {
                    facts: kept,
                    summary: summarized,
                },
            };
            if first && !full {
                break;
            }
        }
        Ok(total)
    }

    /// (extracted_through, summarized_through) of (user, bot).
    async fn cursors(&self, user: &str, bot: &str) -> Result<(i64, i64), MemoryError> {
        Ok(sqlx::query_as(
            "SELECT coalesce(max(extracted_through), 0), coalesce(max(summarized_through), 0)
             FROM memory_state WHERE user_id = $1 AND bot_id = $2",
        )
        .bind(user)
        .bind(bot)
        .fetch_one(&self.memory.pool)
        .await?)
    }

    /// The DM rows after `from`: at most `batch_max` user messages and the companion's lines between.
    async fn facts_batch(&self, user: &str, bot: &str, from: i64) -> Result<Batch, MemoryError> {
        let rows = sqlx::query(
            "SELECT id, message_id FROM bot_conversations
             WHERE user_id = $1 AND bot_id = $2 AND NOT group_chat AND id > $3
             ORDER BY id LIMIT $4",
        )
        .bind(user)
        .bind(bot)
        .bind(from)
        .bind(self.memory.config.batch_max.max(1) * 2)
        .fetch_all(&self.memory.pool)
        .await?;
        Ok(batch_of(&rows, from))
    }

    /// The rows that left the history window after `from`, when at least `summary_after` did.
    async fn summary_batch(&self, user: &str, bot: &str, from: i64) -> Result<Batch, MemoryError> {
        let pool = &self.memory.pool;
        // The oldest row still in the history window: what is older has left it.
        let window_start: Option<i64> = sqlx::query_scalar(
            "SELECT min(id) FROM (SELECT id FROM bot_conversations
              WHERE user_id = $1 AND bot_id = $2 AND NOT group_chat
              ORDER BY created_at DESC, id DESC LIMIT $3) w",
        )
        .bind(user)
        .bind(bot)
        .bind(self.history_limit.max(1))
        .fetch_one(pool)
        .await?;
        let Some(window_start) = window_start else {
            return Ok(Batch::default());
        };
        let rows = sqlx::query(
            "SELECT id, message_id FROM bot_conversations
             WHERE user_id = $1 AND bot_id = $2 AND NOT group_chat AND id > $3 AND id < $4
             ORDER BY id LIMIT $5",
        )
        .bind(user)
        .bind(bot)
        .bind(from)
        .bind(window_start)
        .bind(SUMMARY_BATCH)
        .fetch_all(pool)
        .await?;
        if (rows.len() as i64) < self.memory.config.summary_after.max(1) {
            return Ok(Batch::default());
        }
        Ok(batch_of(&rows, from))
    }

    /// Facts from the batch read after `from`: (facts kept, whether this run was the first to read
    /// them). The batch is the job's record (a retry reads the same rows); the facts and the cursor are
    /// written in one transaction, under a lock per (user, bot), only while the cursor still stands at
    /// `from`.
    async fn facts(
        &self,
        job: &Job,
        user: &str,
        bot: &str,
        from: i64,
        read: Batch,
    ) -> Result<(usize, bool), MemoryError> {
        let batch = recorded_batch(job, "facts", read).await?;
        if batch.rows.is_empty() {
            return Ok((0, true));
        }
        let lines = self.lines(&batch).await?;
        let numbered: Vec<&CitedLine> = lines.iter().filter(|l| l.role == "user").collect();
        let answer = match numbered.is_empty() {
            true => None,
            false => {
                let known = self.memory.facts(user, Some(bot)).await?;
                let request = self.extract_request(&lines, &known);
                Some(self.ask(job, "facts", request, bot).await?)
            }
        };
        let candidates = answer
            .as_deref()
            .map(|a| parse_facts(a, &numbered, job.id()))
            .unwrap_or_default();
        // Embedded before the transaction (and only when the step has not been recorded).
        let mut vectors = Vec::with_capacity(candidates.len());
        if job.recorded(&MEMORY_FACTS, "facts").is_none() {
            for c in &candidates {
                vectors.push(
                    self.memory
                        .embed(crate::rag::Role::Passage, &c.fact)
                        .await?,
                );
            }
        }
        let max_facts = self.memory.config.max_facts;
        let through = batch.through;
        let written: FactsWritten = job
            .step(&MEMORY_FACTS, "facts")
            .run_in_tx(|mut tx| async move {
                let r = async {
                    let mut w = FactsWritten::default();
                    if cursor(&mut tx, user, bot, "extracted_through").await? != Some(from) {
                        w.skipped = true;
                        return Ok(w);
                    }
                    for (c, v) in candidates.iter().zip(vectors.iter()) {
                        let k = Memory::keep(&mut tx, user, bot, c, v.as_ref(), max_facts).await?;
                        if !k.stale {
                            w.kept.push(c.id.clone());
                        }
                        w.replaced.extend(k.replaced);
                    }
                    advance(&mut tx, user, bot, "extracted_through", through).await?;
                    Ok::<_, MemoryError>(w)
                }
                .await;
                (tx, r)
            })
            .await?;
        Ok((written.kept.len(), !written.skipped))
    }

    /// The summary, rewritten from the batch that left the history window after `from` (none: nothing
    /// to do), only while the summary's cursor still stands at `from`.
    async fn summary(
        &self,
        job: &Job,
        user: &str,
        bot: &str,
        from: i64,
        read: Batch,
    ) -> Result<bool, MemoryError> {
        let pool = &self.memory.pool;
        let batch = recorded_batch(job, "summary", read).await?;
        if batch.rows.is_empty() {
            return Ok(false);
        }
        let lines = self.lines(&batch).await?;
        let previous: String = sqlx::query_scalar(
            "SELECT coalesce(max(summary), '') FROM memory_state WHERE user_id = $1 AND bot_id = $2",
        )
        .bind(user)
        .bind(bot)
        .fetch_one(pool)
        .await?;
        let text = match lines.is_empty() {
            true => previous.clone(),
            false => {
                let request = self.summary_request(&previous, &lines);
                let answer = self.ask(job, "summary", request, bot).await?;
                clip(answer.trim(), SUMMARY_MAX_CHARS)
            }
        };
        let sources: Vec<String> = lines.iter().map(|l| l.message_id.clone()).collect();
        let through = batch.through;
        let wrote: bool = job
            .step(&MEMORY_SUMMARY, "summary")
            .run_in_tx(|mut tx| async move {
                let r = async {
                    if cursor(&mut tx, user, bot, "summarized_through").await? != Some(from) {
                        return Ok(false);
                    }
                    sqlx::query(
                        "INSERT INTO memory_state (user_id, bot_id, summary, summarized_through, summary_sources)
                         VALUES ($1, $2, $3, $4, $5)
                         ON CONFLICT (user_id, bot_id) DO UPDATE
                            SET summary = EXCLUDED.summary,
                                summarized_through = greatest(memory_state.summarized_through, EXCLUDED.summarized_through),
                                summary_sources = (SELECT array_agg(DISTINCT s) FROM unnest(memory_state.summary_sources || EXCLUDED.summary_sources) s),
                                updated_at = now()",
                    )
                    .bind(user)
                    .bind(bot)
                    .bind(&text)
                    .bind(through)
                    .bind(&sources)
                    .execute(&mut *tx)
                    .await?;
                    Ok::<_, MemoryError>(true)
                }
                .await;
                (tx, r)
            })
            .await?;
        // A longer backlog (a rebuild after a deletion) goes on in the next run.
        if wrote && batch.rows.len() as i64 >= SUMMARY_BATCH {
            self.memory
                .signal_now(self.bus, user, bot, &format!("s{through}"))
                .await?;
        }
        Ok(wrote)
    }

    /// The batch's rows as the model may see them: not deleted, not flagged by the crisis screen.
    async fn lines(&self, batch: &Batch) -> Result<Vec<CitedLine>, MemoryError> {
        let ids: Vec<i64> = batch.rows.iter().map(|r| r.id).collect();
        let rows = sqlx::query(
            "SELECT b.message_id, b.role, b.content, b.created_at FROM bot_conversations b
             WHERE b.id = ANY($1)
               AND NOT EXISTS (SELECT 1 FROM tombstones t WHERE t.kind = 'message' AND t.id = b.message_id)
             ORDER BY b.id",
        )
        .bind(&ids)
        .fetch_all(&self.memory.pool)
        .await?;
        let place = |message_id: &str| {
            batch
                .rows
                .iter()
                .position(|r| r.message_id == message_id)
                .map_or(0, |i| i + 1)
        };
        Ok(rows
            .iter()
            .map(|r| {
                let message_id: String = r.get("message_id");
                CitedLine {
                    n: place(&message_id),
                    role: r.get("role"),
                    message_id,
                    content: r.get("content"),
                    at: r.get("created_at"),
                }
            })
            .filter(|l| l.role != "user" || crate::safety::screen(&l.content).is_none())
            .collect())
    }

    /// The model's answer to `request` (step `llm` `key`), paid by the service.
    async fn ask(
        &self,
        job: &Job,
        key: &str,
        request: ChatRequest,
        bot: &str,
    ) -> Result<String, MemoryError> {
        let record: LlmRecord = job
            .step(&LLM, key)
            .run(async {
                if let Some(guard) = self.spend
                    && !guard.service_allows().await?
                {
                    return Err(MemoryError::Budget);
                }
                let response = self.llm.complete(&request).await?;
                Ok::<_, MemoryError>(LlmRecord::answer(
                    self.llm,
                    &request,
                    response,
                    Some(bot.to_owned()),
                )?)
            })
            .await?;
        Ok(record.message.content.unwrap_or_default())
    }

    fn request(&self, system: String, user: String) -> ChatRequest {
        ChatRequest {
            model: self.model.to_owned(),
            messages: vec![Message::system(system), Message::user(user)],
            tools: Default::default(),
            tool_choice: None,
            max_tokens: Some(600),
            temperature: Some(0.0),
        }
    }

    fn extract_request(&self, lines: &[CitedLine], known: &[super::Fact]) -> ChatRequest {
        let topics: Vec<&str> = Topic::ALL.iter().map(|t| t.as_str()).collect();
        let system = format!(
            "{EXTRACT_MARKER}\nYou keep notes for {name}, an AI companion in a skate/snow/BMX app, about the user {name} chats with. From the user's numbered messages, list facts about the user themselves worth remembering in later chats: name, level, stance, home spot, sports, goals, injuries, gear, likes, fears. Only what the user said about themselves: nothing about other people, nothing guessed, nothing from {name}'s lines (they are context), nothing about self-harm or a crisis. A newer statement replaces an older one (\"i switched to regular\" is stance: rides regular). Each fact in the third person, under {FACT_MAX} characters.\nAnswer with JSON only: {{\"facts\":[{{\"topic\":\"stance\",\"fact\":\"rides goofy\",\"sources\":[2]}}]}}, topic one of {}, sources the numbers of the messages it comes from. Nothing worth keeping: {{\"facts\":[]}}.",
            topics.join(", "),
            name = self.companion,
        );
        let mut user = String::new();
        if !known.is_empty() {
            let _ = writeln!(user, "Already known:");
            for f in known.iter().take(KNOWN_SHOWN) {
                let _ = writeln!(user, "- {}: {}", f.topic.as_str(), f.fact);
            }
        }
        let _ = writeln!(user, "Conversation (numbered lines are the user's):");
        for l in lines {
            let text = clip(&l.content.replace('\n', " "), LINE_MAX_CHARS);
            match l.role.as_str() {
                "user" => {
                    let _ = writeln!(user, "{}. {text}", l.n);
                }
                "assistant" => {
                    let _ = writeln!(user, "{}: {text}", self.companion);
                }
                _ => {}
            }
        }
        self.request(system, user)
    }

    fn summary_request(&self, previous: &str, lines: &[CitedLine]) -> ChatRequest {
        let system = format!(
            "{SUMMARY_MARKER}\nYou keep a running summary for {name}, an AI companion in a skate/snow/BMX app, of their DM with the user, so {name} remembers what was said before the recent messages. Rewrite the summary with the messages below: who the user is, what they work on, what was planned or promised, what matters to them. At most 120 words, third person, plain text. Nothing about other people's private matters, nothing about self-harm or a crisis.",
            name = self.companion,
        );
        let mut user = format!(
            "Summary so far:\n{}\n\nMessages:\n",
            if previous.trim().is_empty() {
                "(none)"
            } else {
                previous.trim()
            }
        );
        for l in lines {
            let who = match l.role.as_str() {
                "user" => "User",
                "assistant" => self.companion,
                _ => "Moderator",
            };
            let _ = writeln!(
                user,
                "{who}: {}",
                clip(&l.content.replace('\n', " "), LINE_MAX_CHARS)
            );
        }
        self.request(system, user)
    }
}

/// The batch a job reads under `key`: the one recorded by an earlier attempt, else `read`, recorded
/// now.
async fn recorded_batch(job: &Job, key: &str, read: Batch) -> Result<Batch, MemoryError> {
    job.step(&MEMORY_BATCH, key)
        .run(async { Ok::<_, MemoryError>(read) })
        .await
}

/// Passes one run makes at most (a concurrent run read the batch first, or a full batch left more).
const PASSES: usize = 3;

/// The batch of `rows` (`id`, `message_id`), read after `from`.
fn batch_of(rows: &[sqlx::postgres::PgRow], from: i64) -> Batch {
    Batch {
        rows: rows
            .iter()
            .map(|r| Row_ {
                id: r.get("id"),
                message_id: r.get("message_id"),
            })
            .collect(),
        through: rows
            .iter()
            .map(|r| r.get::<i64, _>("id"))
            .max()
            .unwrap_or(from),
    }
}

/// A cursor of (user, bot), read under a lock per (user, bot) held to the end of the transaction; `None`
/// when the user was erased meanwhile (an erasure removes the cursors too: without this, a first
/// extraction's cursor, 0, would still match).
async fn cursor(
    tx: &mut sqlx::PgConnection,
    user: &str,
    bot: &str,
    column: &str,
) -> Result<Option<i64>, MemoryError> {
    if super::store::one_writer(tx, user, bot).await? == super::store::Writer::Erased {
        return Ok(None);
    }
    let sql = format!(
        "SELECT coalesce(max({column}), 0) FROM memory_state WHERE user_id = $1 AND bot_id = $2"
    );
    Ok(Some(
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(user)
            .bind(bot)
            .fetch_one(&mut *tx)
            .await?,
    ))
}

/// Moves a cursor of (user, bot) forward to `through`.
async fn advance(
    tx: &mut sqlx::PgConnection,
    user: &str,
    bot: &str,
    column: &str,
    through: i64,
) -> Result<(), MemoryError> {
    let sql = format!(
        "INSERT INTO memory_state (user_id, bot_id, {column}) VALUES ($1, $2, $3)
         ON CONFLICT (user_id, bot_id) DO UPDATE
            SET {column} = greatest(memory_state.{column}, EXCLUDED.{column}), updated_at = now()"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(user)
        .bind(bot)
        .bind(through)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The facts of the model's answer that hold up: JSON (found inside any text around it), a known topic
/// (else `other`), 1–300 characters, not flagged by the crisis screen, from at least one numbered
/// message. A fact's id is derived from the job and its place, so a retry keeps the same rows.
fn parse_facts(answer: &str, numbered: &[&CitedLine], job: &str) -> Vec<NewFact> {
    let json = match (answer.find('{'), answer.rfind('}')) {
        (Some(a), Some(b)) if a < b => &answer[a..=b],
        _ => {
            warn!(answer = %clip(answer, 200), "the extraction answer has no JSON; nothing kept");
            return Vec::new();
        }
    };
    let value: Value = match serde_json::from_str(json) {
        Ok(v) => v,
        Err(e) => {
            warn!(error = %e, "the extraction answer is not JSON; nothing kept");
            return Vec::new();
        }
    };
    let mut out: Vec<NewFact> = Vec::new();
    for (i, f) in value["facts"].as_array().into_iter().flatten().enumerate() {
        let fact = f["fact"].as_str().unwrap_or("").trim();
        if fact.is_empty() || flagged(fact) {
            continue;
        }
        let cited: Vec<&&CitedLine> = f["sources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .filter_map(|n| numbered.iter().find(|l| l.n as u64 == n))
            .collect();
        let Some(said_at) = cited.iter().map(|l| l.at).max() else {
            continue;
        };
        let sources: Vec<String> = cited.iter().map(|l| l.message_id.clone()).collect();
        let topic = f["topic"]
            .as_str()
            .and_then(Topic::parse)
            .unwrap_or(Topic::Other);
        if out.iter().any(|o| o.fact.eq_ignore_ascii_case(fact)) {
            continue;
        }
        out.push(NewFact {
            id: fact_id(job, i),
            topic,
            fact: clip(fact, FACT_MAX),
            sources,
            how: How::Extracted,
            said_at,
        });
        if out.len() >= FACTS_PER_RUN {
            break;
        }
    }
    out
}

/// Whether the crisis screen flags a fact, read as written (third person) and as the user would have
/// said it ("wants to die" → "i want to die"): the screen is tuned on what users write.
pub fn flagged(fact: &str) -> bool {
    use crate::safety::screen;
    if screen(fact).is_some() {
        return true;
    }
    let first_person: Vec<&str> = fact
        .split_whitespace()
        .map(|w| match w.to_lowercase().as_str() {
            "wants" => "want",
            "is" => "am",
            "has" => "have",
            "feels" => "feel",
            "thinks" => "think",
            "their" => "my",
            "they" => "i",
            "them" | "themselves" | "themself" => "myself",
            "hates" => "hate",
            "hurts" => "hurt",
            "cuts" => "cut",
            "doesn't" => "don't",
            "does" => "do",
            "was" => "was",
            _ => w,
        })
        .collect();
    let said = format!("i {}", first_person.join(" "));
    screen(&said).is_some()
}

/// The id of the `n`-th fact of `origin` (a job, or a turn's tool call).
pub fn fact_id(origin: &str, n: usize) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{origin}\n{n}").as_bytes());
    digest[..12].iter().map(|b| format!("{b:02x}")).collect()
}

fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        s.chars().take(max).collect()
    }
}

impl Memory {
    /// After a DM turn: the extraction signal now when `extract_after` user messages wait (`waiting`,
    /// this turn's included: the turn's probe counted them), and (every turn) the quiet-period schedule,
    /// which replaces the one before (a schedule's subject is its identity). Both are safe to repeat (the
    /// stream drops a duplicate id within its window): the turn runs this as a journal step before it
    /// settles, so a crash after the reply repeats it rather than losing it; only when memory is enabled,
    /// which it checks (no step is recorded otherwise).
    pub async fn after_turn(
        &self,
        bus: &Bus,
        user: &str,
        bot: &str,
        turn: &str,
        waiting: i64,
    ) -> Result<(), MemoryError> {
        let every = self.config.extract_after.max(1);
        if waiting >= every {
            let tag = format!("{turn}:n{}", waiting / every);
            self.signal_now(bus, user, bot, &tag).await?;
        }
        let names = &bus.names;
        let at = Utc::now() + chrono::Duration::seconds(self.config.quiet_secs as i64);
        bus.schedule_at(
            names.memory_schedule(user, bot),
            &names.memory(user, bot),
            at,
            &format!("memory-quiet:{turn}"),
            Default::default(),
        )
        .await?;
        Ok(())
    }

    /// Publishes the extraction signal of (user, bot) now; `tag` tells repeats apart (the stream drops a
    /// duplicate id within its window).
    pub(crate) async fn signal_now(
        &self,
        bus: &Bus,
        user: &str,
        bot: &str,
        tag: &str,
    ) -> Result<(), MemoryError> {
        bus.publish_durable(
            bus.names.memory(user, bot),
            &format!("memory:{user}:{bot}:{tag}"),
            Default::default(),
            Default::default(),
        )
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(n: usize, id: &str) -> CitedLine {
        CitedLine {
            n,
            role: "user".into(),
            message_id: id.into(),
            content: String::new(),
            at: Utc::now(),
        }
    }

    #[test]
    fn only_facts_that_hold_up_are_kept_with_their_cited_messages() {
        let (a, b) = (line(1, "m1"), line(4, "m4"));
        let shown = [&a, &b];
        let answer = r#"sure! {"facts":[
            {"topic":"stance","fact":"rides goofy","sources":[4]},
            {"topic":"weather","fact":"likes rain","sources":[1, 4]},
            {"topic":"injury","fact":"broke their wrist","sources":[2]},
            {"topic":"goal","fact":"","sources":[1]},
            {"topic":"other","fact":"wants to die","sources":[1]},
            {"topic":"stance","fact":"Rides goofy","sources":[1]}
        ]} hope that helps"#;
        let facts = parse_facts(answer, &shown, "job");
        let got: Vec<(Topic, &str, Vec<String>)> = facts
            .iter()
            .map(|f| (f.topic, f.fact.as_str(), f.sources.clone()))
            .collect();
        assert_eq!(
            got,
            [
                (Topic::Stance, "rides goofy", vec!["m4".to_owned()]),
                (
                    Topic::Other,
                    "likes rain",
                    vec!["m1".to_owned(), "m4".to_owned()]
                ),
            ],
            "a message not shown (2), an empty fact, a flagged one and a repeat are dropped"
        );
        assert_eq!(facts[0].id, fact_id("job", 0));
        assert_ne!(facts[0].id, facts[1].id);
        assert!(parse_facts("no facts today", &shown, "job").is_empty());
        for f in ["wants to die", "is thinking about killing themselves"] {
            assert!(flagged(f), "{f}");
        }
        for f in [
            "rides goofy",
            "broke their wrist last month",
            "is scared of dropping in",
        ] {
            assert!(!flagged(f), "{f}");
        }
        assert!(parse_facts("{not json}", &shown, "job").is_empty());
    }
}
