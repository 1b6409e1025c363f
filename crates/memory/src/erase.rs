//! Deletion that really deletes, on signals from TB-Backend (docs/memory.md, docs/tb-backend.md):
//!
//! - `<prefix>.signal.message_deleted.<messageId>`: the message and the companion's reply to it leave
//!   the history, and its event the inbound and dead-letter streams (by its sequence); facts whose only source it was go; the answering turn's recorded outputs (the model's
//!   answers, tool calls, the reply) are scrubbed; a summary written from it is rebuilt.
//! - `<prefix>.signal.memory_cleared.<userId>` (body `{"userId", "botId"?}`): facts and summaries go, the
//!   account and the history stay (extraction does not read the old messages again).
//! - `<prefix>.signal.user_erased.<userId>`: every fact, summary, history row, reminder text, flow state
//!   and recorded output of the user's jobs, and the user's messages in the inbound and dead-letter
//!   streams.
//!
//! A tombstone (`tombstones`, ids only) makes each stick: admission, extraction and `replay` check it, so
//! a redelivery or a replay cannot bring anything back. Each handler is idempotent: a repeat finds
//! nothing more to remove. The crisis counts (`crisis_log`) hold no ids and stay.

use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use tracing::info;

use super::{Memory, MemoryError};
use crate::{
    bus::Bus,
    db::lock_history,
    journal::{Finish, Job, Journal, NewJob, State, StepKind, names::key},
};

/// A deletion's transaction (`message_deleted`, `memory_cleared`, `user_erased`): the tombstone and every
/// row it removes or scrubs, with this record (counts, never text; the deletion's own type `T`). Keyed
/// once.
const fn erase<T>() -> StepKind<T> {
    StepKind::new("erase")
}

/// [`erase`], its record read as JSON (for a reader that does not know the deletion).
pub(crate) const ERASE: StepKind<serde_json::Value> = erase();
/// A deletion's removal of messages from the streams, after its transaction (how many). Keyed once.
pub(crate) const ERASE_STREAMS: StepKind<u64> = StepKind::new("erase_streams");
/// A `message_deleted`'s signals to rebuild the summaries it was in. Keyed once.
pub(crate) const REBUILD: StepKind<()> = StepKind::new("rebuild");

/// The `erase` step of a `message_deleted` job, recorded in the transaction that deleted: what it
/// removed, and what the later steps act on.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct MessageErased {
    removed: Removed,
    /// Where its event is in the inbound stream.
    seq: Option<u64>,
    /// (user, companion) pairs whose summary it was in: rebuilt.
    rebuilt: Vec<(String, String)>,
}

/// The `erase` step of a `user_erased` job: what its transaction removed, and where the user's messages
/// are in the streams (kind, `conversation|bot`, group message sequence).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct UserErased {
    removed: Removed,
    subjects: Vec<(String, String, Option<i64>)>,
}

/// [`Memory::probe`]'s query for the user `$u`, the companion `$b` (empty: none) and the message ids `$m`
/// (text array): one row of `gone`, `remembers` and `waiting`.
macro_rules! probe_sql {
    ($u:literal, $b:literal, $m:literal) => {
        concat!(
            "WITH s AS (SELECT extracted_through AS e, summary <> '' AS summarized FROM memory_state
                        WHERE user_id = ",
            $u,
            " AND bot_id = ",
            $b,
            ")
             SELECT
               ",
            crate::db::tombstoned!($u, $m),
            " AS gone,
               ",
            $b,
            " <> '' AND (EXISTS (SELECT 1 FROM memory_facts WHERE user_id = ",
            $u,
            " AND bot_id = ",
            $b,
            ")
                             OR coalesce((SELECT summarized FROM s), false)) AS remembers,
               CASE WHEN ",
            $b,
            " = '' THEN 0 ELSE
                 (SELECT count(*) FROM bot_conversations b
                  WHERE b.user_id = ",
            $u,
            " AND b.bot_id = ",
            $b,
            " AND NOT b.group_chat AND b.role = 'user'
                    AND b.id > coalesce((SELECT e FROM s), 0)
                    AND b.created_at >= coalesce((SELECT created_at FROM bot_conversations
                                                  WHERE id = (SELECT e FROM s)), '-infinity'))
               END AS waiting"
        )
    };
}

/// The probe as the guard of a turn's opening ([`crate::journal::Guard`]): a tombstone stops the job
/// before its row exists, and the rest comes back with the job, in the opening's one statement.
pub const PROBE_GUARD: &str = probe_sql!("$10", "$11", "$12");

/// The signal kinds handled here.
pub const MESSAGE_DELETED: &str = "message_deleted";
pub const MEMORY_CLEARED: &str = "memory_cleared";
pub const USER_ERASED: &str = "user_erased";

/// What a recorded output becomes once scrubbed: no text, only the usage a budget counts.
const SCRUB: &str =
    "jsonb_strip_nulls(jsonb_build_object('erased', true, 'usage', output -> 'usage'))";

/// What [`Memory::probe`] found for a turn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryCheck {
    /// Its message was deleted or its user erased: it is not answered.
    pub gone: bool,
    /// The companion remembers something of the user (facts or a summary): recall runs.
    pub remembers: bool,
    /// The user's DM messages extraction has not read yet, before this turn's.
    pub waiting: i64,
}

/// What a deletion removed (counts, never text): the log, and the record of its job's steps.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Removed {
    pub(crate) history_rows: u64,
    pub(crate) facts: u64,
    pub(crate) summaries: u64,
    pub(crate) scrubbed_steps: u64,
    pub(crate) reminders: u64,
    pub(crate) flows: u64,
    pub(crate) stream_messages: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Cleared {
    user_id: String,
    #[serde(default)]
    bot_id: Option<String>,
}

fn hex24(s: &str) -> bool {
    crate::bus::event::parse_object_id(s).is_some()
}

impl Memory {
    /// Whether the user was erased.
    pub(crate) async fn is_erased(&self, user: &str) -> Result<bool, MemoryError> {
        Ok(self.probe(user, "", &[]).await?.gone)
    }

    /// What a turn needs to know before it opens its job, in one statement: whether a tombstone stops it
    /// (its message deleted or its user erased), whether the companion remembers anything of the user
    /// (else recall is skipped), and how many of the user's DM messages extraction has not read yet.
    /// `bot` is empty for a group message (no memory there). A turn reads it with its job's opening
    /// ([`PROBE_GUARD`]); this is the same query alone, for the readers that open nothing.
    pub async fn probe(
        &self,
        user: &str,
        bot: &str,
        messages: &[String],
    ) -> Result<MemoryCheck, MemoryError> {
        let (gone, remembers, waiting): (bool, bool, i64) =
            sqlx::query_as(probe_sql!("$1", "$2", "$3"))
                .bind(user)
                .bind(bot)
                .bind(messages)
                .fetch_one(&self.pool)
                .await?;
        Ok(self.check(gone, remembers, waiting))
    }

    /// The probe's row as [`Journal::open_unless`] returned it ([`PROBE_GUARD`]'s columns).
    pub fn checked(&self, row: &serde_json::Value) -> MemoryCheck {
        self.check(
            row["gone"].as_bool().unwrap_or(false),
            row["remembers"].as_bool().unwrap_or(false),
            row["waiting"].as_i64().unwrap_or(0),
        )
    }

    fn check(&self, gone: bool, remembers: bool, waiting: i64) -> MemoryCheck {
        MemoryCheck {
            gone,
            remembers: remembers && self.config.enabled,
            waiting,
        }
    }

    /// Acts on a deletion signal of `kind` about `id`, the stream's message `seq`: a job of the journal
    /// (`<kind>:<id>:<seq>`) whose steps each run once, whatever is redelivered or killed between them;
    /// its row, `done`, with the counts its steps recorded, is the record of the deletion.
    pub(crate) async fn on_signal(
        &self,
        journal: &Journal,
        bus: &Bus,
        kind: &str,
        id: &str,
        payload: &[u8],
        seq: u64,
    ) -> Result<Removed, MemoryError> {
        if !hex24(id) {
            return Err(MemoryError::Invalid(format!("`{id}` is not a 24-hex id")));
        }
        let bot = match kind {
            MEMORY_CLEARED => cleared_bot(id, payload)?,
            MESSAGE_DELETED | USER_ERASED => None,
            other => {
                return Err(MemoryError::Invalid(format!(
                    "unknown signal kind `{other}`"
                )));
            }
        };
        let job_id = format!("{kind}:{id}:{seq}");
        let user = match kind {
            MESSAGE_DELETED => "",
            _ => id,
        };
        let job = journal
            .open(&NewJob {
                id: &job_id,
                kind,
                user,
                bot: bot.as_deref().unwrap_or_default(),
                conversation: "",
                stream_seq: Some(seq),
                reads: Default::default(),
            })
            .await?;
        if job.record.state.is_settled() {
            info!(kind, id, job = %job_id, "deletion already carried out");
            return Ok(Removed::default());
        }
        let removed = match kind {
            MESSAGE_DELETED => self.erase_message(&job, bus, id).await?,
            MEMORY_CLEARED => {
                let bot = bot.as_deref();
                job.step(&erase(), key::ONCE)
                    .run_in_tx(|mut tx| async move {
                        let r = clear_in(&mut tx, id, bot).await;
                        (tx, r)
                    })
                    .await?
            }
            _ => erase_user(&job, bus, id).await?,
        };
        job.finish(State::Done, Finish::default()).await?;
        info!(kind, id, job = %job_id, ?removed, "deletion carried out");
        Ok(removed)
    }

    /// A `message_deleted`'s steps: its transaction, the message out of the streams, the summaries it was
    /// in rebuilt.
    async fn erase_message(&self, job: &Job, bus: &Bus, id: &str) -> Result<Removed, MemoryError> {
        let erased: MessageErased = job
            .step(&erase(), key::ONCE)
            .run_in_tx(|mut tx| async move {
                let r = delete_message_in(&mut tx, id).await;
                (tx, r)
            })
            .await?;
        // After the commit: a redelivery the stream makes meanwhile finds the tombstone.
        let events: u64 = job
            .step(&ERASE_STREAMS, key::ONCE)
            .run(async { Ok::<_, MemoryError>(bus.erase().delete_event(id, erased.seq).await?) })
            .await?;
        job.step(&REBUILD, key::ONCE)
            .run(async {
                for (user, bot) in &erased.rebuilt {
                    self.signal_now(bus, user, bot, &format!("rebuild:{id}"))
                        .await?;
                }
                Ok::<_, MemoryError>(())
            })
            .await?;
        Ok(Removed {
            stream_messages: events,
            ..erased.removed
        })
    }
}

/// A `user_erased`'s steps: its transaction, then the user's messages out of the streams.
async fn erase_user(job: &Job, bus: &Bus, id: &str) -> Result<Removed, MemoryError> {
    let erased: UserErased = job
        .step(&erase(), key::ONCE)
        .run_in_tx(|mut tx| async move {
            let r = erase_user_in(&mut tx, id).await;
            (tx, r)
        })
        .await?;
    let events: u64 = job
        .step(&ERASE_STREAMS, key::ONCE)
        .run(async { erase_from_streams(bus, id, &erased.subjects).await })
        .await?;
    Ok(Removed {
        stream_messages: events,
        ..erased.removed
    })
}

/// `message_deleted`'s transaction (see the module documentation): the tombstone first, under the
/// history lock of the message.
async fn delete_message_in(
    tx: &mut PgConnection,
    message: &str,
) -> Result<MessageErased, MemoryError> {
    // After a history write of this message that holds the lock has committed (its rows are deleted
    // below), or before one (it sees the tombstone and writes nothing of it).
    lock_history(tx, &[], &[message]).await?;
    tombstone(tx, "message", message).await?;
    let (answering, replies) = answered_by(tx, message).await?;
    let mut doomed = replies.clone();
    doomed.push(message.to_owned());
    let owners: Vec<(String, String)> = sqlx::query_as(
        "SELECT DISTINCT user_id, bot_id FROM bot_conversations WHERE message_id = $1",
    )
    .bind(message)
    .fetch_all(&mut *tx)
    .await?;
    let history = sqlx::query("DELETE FROM bot_conversations WHERE message_id = ANY($1)")
        .bind(&doomed)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    sqlx::query(
        "UPDATE memory_facts SET sources = array_remove(sources, $1) WHERE sources @> ARRAY[$1]",
    )
    .bind(message)
    .execute(&mut *tx)
    .await?;
    let facts = sqlx::query("DELETE FROM memory_facts WHERE sources = '{}'")
        .execute(&mut *tx)
        .await?
        .rows_affected();
    // A summary written from it is rebuilt from what is left.
    let rebuilt: Vec<(String, String)> = sqlx::query_as(
        "UPDATE memory_state SET summary = '', summarized_through = 0, summary_sources = '{}',
                updated_at = now()
         WHERE summary_sources @> ARRAY[$1] RETURNING user_id, bot_id",
    )
    .bind(message)
    .fetch_all(&mut *tx)
    .await?;
    let scrubbed = scrub(
        tx,
        "job = ANY($1) AND name IN ('llm', 'tool', 'reply', 'flow', 'flow_change')",
        &answering,
    )
    .await?;
    let blanked = blank_burst(tx, &answering, Some(message)).await?;
    let extraction_scrubbed = scrub_extractions(tx, &owners, message).await?;
    // Where its event is in the inbound stream (its own job's sequence; a burst's later message has a
    // covered job of its own).
    let seq: Option<i64> = sqlx::query_scalar("SELECT stream_seq FROM jobs WHERE id = $1")
        .bind(message)
        .fetch_optional(&mut *tx)
        .await?
        .flatten();
    Ok(MessageErased {
        removed: Removed {
            history_rows: history,
            facts,
            summaries: rebuilt.len() as u64,
            scrubbed_steps: scrubbed + blanked + extraction_scrubbed,
            ..Removed::default()
        },
        seq: seq.map(|s| s as u64),
        rebuilt,
    })
}

/// `memory_cleared`: facts and summaries of the user (with one companion, or all), and the extraction
/// answers that named them. Under memory's lock of each (user, companion), both cursors move to the
/// newest history row: nothing said before the clear is learned or summarised after it, and an
/// extraction already waiting on the model finds its cursor moved and writes nothing.
async fn clear_in(
    tx: &mut PgConnection,
    user: &str,
    bot: Option<&str>,
) -> Result<Removed, MemoryError> {
    let mut bots: Vec<String> = match bot {
        Some(b) => vec![b.to_owned()],
        None => {
            sqlx::query_scalar(
                "SELECT bot_id FROM bot_conversations WHERE user_id = $1 AND NOT group_chat
                 UNION SELECT bot_id FROM memory_state WHERE user_id = $1
                 UNION SELECT bot_id FROM memory_facts WHERE user_id = $1",
            )
            .bind(user)
            .fetch_all(&mut *tx)
            .await?
        }
    };
    bots.sort();
    bots.dedup();
    for b in &bots {
        // Clearing the memory of a user erased meanwhile finds nothing to clear: the same either way.
        let _ = super::store::one_writer(tx, user, b).await?;
    }
    sqlx::query(
        "INSERT INTO memory_state (user_id, bot_id, extracted_through, summarized_through)
         SELECT $1, b.bot, n.newest, n.newest
         FROM unnest($2::text[]) AS b(bot),
              LATERAL (SELECT coalesce(max(id), 0) AS newest FROM bot_conversations
                       WHERE user_id = $1 AND bot_id = b.bot AND NOT group_chat) n
         ON CONFLICT (user_id, bot_id) DO UPDATE
            SET extracted_through = greatest(memory_state.extracted_through,
                                             EXCLUDED.extracted_through),
                summarized_through = greatest(memory_state.summarized_through,
                                              EXCLUDED.summarized_through),
                updated_at = now()",
    )
    .bind(user)
    .bind(&bots)
    .execute(&mut *tx)
    .await?;
    let facts = sqlx::query(
        "DELETE FROM memory_facts WHERE user_id = $1 AND ($2::text IS NULL OR bot_id = $2)",
    )
    .bind(user)
    .bind(bot)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let summaries = sqlx::query(
        "UPDATE memory_state SET summary = '', summary_sources = '{}', updated_at = now()
         WHERE user_id = $1 AND ($2::text IS NULL OR bot_id = $2) AND summary <> ''",
    )
    .bind(user)
    .bind(bot)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let scrubbed = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE job_steps SET output = {SCRUB}
         WHERE job IN (SELECT id FROM jobs WHERE kind = 'memory' AND user_id = $1
                       AND ($2::text IS NULL OR bot_id = $2))
           AND name IN ('llm', 'memory_facts') AND NOT output ? 'erased'"
    )))
    .bind(user)
    .bind(bot)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    Ok(Removed {
        facts,
        summaries,
        scrubbed_steps: scrubbed,
        ..Removed::default()
    })
}

/// `user_erased`: see the module documentation. The PostgreSQL part commits first (with the
/// tombstone), then the streams: a failure there is retried by the signal's redelivery, and a repeat
/// of the first part finds nothing more.
async fn erase_user_in(tx: &mut PgConnection, user: &str) -> Result<UserErased, MemoryError> {
    lock_history(tx, &[user], &[]).await?;
    tombstone(tx, "user", user).await?;
    // Where the user's messages are in the inbound stream: their DM conversations' subjects, and the
    // sequence of each group message they sent.
    let subjects: Vec<(String, String, Option<i64>)> = sqlx::query_as(
        "SELECT DISTINCT kind, conversation_id || '|' || coalesce(bot_id, ''), stream_seq FROM jobs
         WHERE user_id = $1 AND kind IN ('turn', 'group')",
    )
    .bind(user)
    .fetch_all(&mut *tx)
    .await?;
    let facts = sqlx::query("DELETE FROM memory_facts WHERE user_id = $1")
        .bind(user)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    let summaries = sqlx::query("DELETE FROM memory_state WHERE user_id = $1")
        .bind(user)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    let history_rows = sqlx::query("DELETE FROM bot_conversations WHERE user_id = $1")
        .bind(user)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    let reminders = sqlx::query(
        "UPDATE reminders SET text = '', state = CASE WHEN state = 'pending' THEN 'cancelled' ELSE state END,
                updated_at = now()
         WHERE user_id = $1 AND text <> ''",
    )
    .bind(user)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let flows = sqlx::query("DELETE FROM flow_states WHERE user_id = $1")
        .bind(user)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    let scrubbed_steps = scrub(
        tx,
        "job IN (SELECT id FROM jobs WHERE user_id = ANY($1)) AND NOT output ? 'erased'",
        &[user.to_owned()],
    )
    .await?;
    sqlx::query("UPDATE jobs SET last_error = NULL, reason = NULL WHERE user_id = $1")
        .bind(user)
        .execute(&mut *tx)
        .await?;
    Ok(UserErased {
        removed: Removed {
            history_rows,
            facts,
            summaries,
            scrubbed_steps,
            reminders,
            flows,
            stream_messages: 0,
        },
        subjects,
    })
}

/// The companion a `memory_cleared` body names (none: every companion), checked against the subject's
/// user.
fn cleared_bot(user: &str, payload: &[u8]) -> Result<Option<String>, MemoryError> {
    if payload.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let c: Cleared = serde_json::from_slice(payload)
        .map_err(|e| MemoryError::Invalid(format!("not a memory_cleared body: {e}")))?;
    if c.user_id != user {
        return Err(MemoryError::Invalid(format!(
            "userId {} does not match the subject's {user}",
            c.user_id
        )));
    }
    if let Some(b) = c.bot_id.as_deref().filter(|b| !hex24(b)) {
        return Err(MemoryError::Invalid(format!(
            "botId `{b}` is not a 24-hex id"
        )));
    }
    Ok(c.bot_id)
}

/// The jobs that answered `message` (its own, or the burst's that covered it) and the ids of their
/// replies.
async fn answered_by(
    tx: &mut PgConnection,
    message: &str,
) -> Result<(Vec<String>, Vec<String>), MemoryError> {
    let answering: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM jobs WHERE id = $1
         UNION SELECT covered_by FROM jobs WHERE id = $1 AND covered_by IS NOT NULL",
    )
    .bind(message)
    .fetch_all(&mut *tx)
    .await?;
    let replies: Vec<String> = sqlx::query_scalar(
        "SELECT output ->> 'id' FROM job_steps
         WHERE job = ANY($1) AND name = 'reply' AND output ? 'id'",
    )
    .bind(&answering)
    .fetch_all(&mut *tx)
    .await?;
    Ok((answering, replies))
}

/// Scrubs the answers of the extraction runs of `owners` that read `message` (they named its facts).
async fn scrub_extractions(
    tx: &mut PgConnection,
    owners: &[(String, String)],
    message: &str,
) -> Result<u64, MemoryError> {
    let mut extraction_scrubbed = 0;
    for (user, bot) in owners {
        extraction_scrubbed += sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE job_steps SET output = {SCRUB}
             WHERE name = 'llm' AND job IN (
                SELECT j.id FROM jobs j JOIN job_steps b ON b.job = j.id AND b.name = 'memory_batch'
                WHERE j.kind = 'memory' AND j.user_id = $1 AND j.bot_id = $2
                  AND b.output -> 'rows' @> jsonb_build_array(jsonb_build_object('message_id', $3::text)))
               AND NOT output ? 'erased'"
        )))
        .bind(user)
        .bind(bot)
        .bind(message)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    }
    Ok(extraction_scrubbed)
}

/// Scrubs the outputs of the steps `filter` selects (`$1`: a text array).
async fn scrub(tx: &mut PgConnection, filter: &str, arg: &[String]) -> Result<u64, MemoryError> {
    let sql = format!("UPDATE job_steps SET output = {SCRUB} WHERE {filter}");
    Ok(sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(arg)
        .execute(&mut *tx)
        .await?
        .rows_affected())
}

impl Memory {
    /// Scrubs the recorded outputs of job `job` that may hold a user's words (the model's answers, tool
    /// calls, the reply, flow steps) to their usage: for a turn that found its message deleted after the
    /// deletion's own scrub had run.
    /// Scrubs every step of the job `job`, an extraction that ran while its user was erased: what it
    /// recorded after the erasure's own scrub (the model's answer) goes too.
    pub(crate) async fn scrub_erased_job(&self, job: &str) -> Result<u64, MemoryError> {
        let mut tx = self.pool.begin().await?;
        let n = scrub(
            &mut tx,
            "job = ANY($1) AND NOT output ? 'erased'",
            &[job.to_owned()],
        )
        .await?;
        tx.commit().await?;
        Ok(n)
    }

    pub async fn scrub_job(&self, job: &str) -> Result<u64, MemoryError> {
        let mut tx = self.pool.begin().await?;
        let n = scrub(
            &mut tx,
            "job = ANY($1) AND name IN ('llm', 'tool', 'reply', 'flow', 'flow_change', 'screen')
             AND NOT output ? 'erased'",
            &[job.to_owned()],
        )
        .await?;
        let blanked = blank_burst(&mut tx, &[job.to_owned()], None).await?;
        tx.commit().await?;
        Ok(n + blanked)
    }
}

/// Blanks the words of `message` (every message, with none) in the `burst` steps of `jobs`: the later
/// messages a turn answered together, each with its text. The rest of the record stays, so a replay of
/// the turn still reads it.
async fn blank_burst(
    tx: &mut PgConnection,
    jobs: &[String],
    message: Option<&str>,
) -> Result<u64, MemoryError> {
    Ok(sqlx::query(
        r#"UPDATE job_steps SET output = jsonb_set(output, '{covers}', (
               SELECT coalesce(jsonb_agg(CASE WHEN $2::text IS NULL OR c ->> 'messageId' = $2
                                              THEN c || '{"content": "", "images": []}'::jsonb
                                              ELSE c END ORDER BY n), '[]'::jsonb)
               FROM jsonb_array_elements(output -> 'covers') WITH ORDINALITY AS e(c, n)))
           WHERE job = ANY($1) AND name = 'burst' AND jsonb_typeof(output -> 'covers') = 'array'
             AND jsonb_array_length(output -> 'covers') > 0"#,
    )
    .bind(jobs)
    .bind(message)
    .execute(&mut *tx)
    .await?
    .rows_affected())
}

async fn tombstone(tx: &mut PgConnection, kind: &str, id: &str) -> Result<(), MemoryError> {
    sqlx::query("INSERT INTO tombstones (kind, id) VALUES ($1, $2) ON CONFLICT DO NOTHING")
        .bind(kind)
        .bind(id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The user's messages in the inbound stream (their DM conversations' subjects purged; each group
/// message they sent deleted by its sequence) and in the dead-letter stream (their DM conversations'
/// subjects purged; their group messages found by sender and deleted).
async fn erase_from_streams(
    bus: &Bus,
    user: &str,
    jobs: &[(String, String, Option<i64>)],
) -> Result<u64, MemoryError> {
    let mut n = 0;
    for (kind, where_, seq) in jobs {
        let (conversation, bot) = where_.split_once('|').unwrap_or((where_, ""));
        match (kind.as_str(), seq) {
            ("group", Some(seq)) => n += bus.erase().delete_inbound(*seq as u64).await?,
            ("group", None) => {}
            _ if !bot.is_empty() && hex24(conversation) => {
                n += bus.erase().purge_conversation(bot, conversation).await?;
            }
            _ => {}
        }
    }
    n += bus.erase().delete_dead_letters_of(user).await?;
    Ok(n)
}
