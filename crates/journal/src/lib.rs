//! The journal of durable jobs: every side effect of a job is a named step, recorded once it succeeded,
//! so a retry replays what succeeded and redoes only what failed. Every message a companion sends is a
//! job: the answer to a DM, to a group message, a follow-up (the worker's `pipeline`).
//!
//! - A job is a row of `jobs` (a turn's id is its event's message id) with a [`State`], whose transitions
//!   are all in [`State::may_become`]; attempts, the reply generation and who answered it live there.
//! - `job.step(&KIND, key).run(async { … })` returns the record of (job, kind, key) if an earlier
//!   attempt recorded one; otherwise it runs the body and records the success. The first writer wins: when
//!   two attempts race, both go on with the first one's output. A failure is returned and recorded
//!   nowhere, so the next attempt runs the step again.
//! - A step's kind ([`StepKind`]) is its persisted name and its record's type, defined once by the stage
//!   that records it; the journal stores what a kind gives it and knows none of the records.
//! - A [`Step::lazy`] step is an effect that is safe to repeat (a keyed write, a publish with a message id):
//!   its record rides along with the job's next recorded step or its settlement, one statement instead of
//!   one each. A crash in between means the effect runs once more, harmlessly.
//! - [`Job::counted`] is a step that counts against a limit every worker shares (a tally such as
//!   `writes:<user>`): under a lock per tally, it is granted only while fewer than `limit` steps of the
//!   tally were recorded in the window.
//!
//! - [`Step::run_in_tx`] is a step whose effect is a write to this database: the body runs in the
//!   transaction that records the step, so the effect and its record commit together or not at all
//!   (a covered burst, a counted turn, a flow change). [`Job::counted`] and [`Job::covering`] are built
//!   on it.
//! - [`Job::recorded`] is the one way to ask whether a step ran (and what it gave).
//! - A job ends with [`Job::finish`]: its state, who answered it when another job did, and, when it ends
//!   without a message on purpose, the reason.
//!
//! Every step and tally name is in [`names`]; one job's whole record, for `companion explain`, is read in
//! [`story`]. What the records mean is their owners' business: what the model's answers cost is read by
//! the spend guard and `companion usage`.
//!
//! Outputs are JSON (`job_steps.output`); text is kept as it is but for U+0000, which PostgreSQL cannot
//! store and which becomes U+FFFD.

mod kind;
pub mod names;
pub mod story;

pub use kind::{Counted, StepKind, Tell, Telling, Told, companion_name, or_unknown};

#[cfg(feature = "testing")]
use companion_core::fault;
use companion_core::{failure, metrics};
use companion_store::conversation_order::{FloorAt, upsert_floor};
use companion_store::store;

use std::{
    collections::HashMap,
    future::Future,
    marker::PhantomData,
    sync::{Arc, Mutex},
    time::Duration,
};

use chrono::{DateTime, Utc};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;
use sqlx::{Row, postgres::PgRow};
use tracing::{debug, warn};

use crate::{
    failure::{Class, Classify},
    metrics::{Labels, Metric, Metrics},
    store::StoreError,
};
use companion_store::store::Pool;

tokio::task_local! {
    /// The step the task's job last started, for the log of a panic caught at the delivery's boundary.
    static RUNNING: Arc<Mutex<String>>;
}

/// Runs `work`, noting each step its jobs start; with its output, the last step started (`name:key`),
/// which names where a panic caught around `work` struck.
pub async fn tracing_steps<F: Future>(work: F) -> (F::Output, Option<String>) {
    let running = Arc::new(Mutex::new(String::new()));
    let out = RUNNING.scope(running.clone(), work).await;
    let last = running.lock().map(|r| r.clone()).unwrap_or_default();
    (out, (!last.is_empty()).then_some(last))
}

/// A step's body is about to run: noted for [`tracing_steps`], and a fault injected there, if a test
/// armed one.
fn starting(job: &str, name: &str, key: &str) {
    // One buffer per task, rewritten in place: no allocation per step once it is large enough.
    let _ = RUNNING.try_with(|r| {
        if let Ok(mut r) = r.lock() {
            r.clear();
            r.push_str(name);
            r.push(':');
            r.push_str(key);
        }
    });
    #[cfg(feature = "testing")]
    crate::fault::at(job, name);
    #[cfg(not(feature = "testing"))]
    let _ = job;
}

/// Where a job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Opened by a delivery, not settled yet.
    Running,
    /// Answered.
    Done,
    /// Answered with the character's failure line and dead-lettered.
    Failed,
    /// Answered by the reply of an earlier message of the same burst (`covered_by`).
    Covered,
    /// Over the user's flood limit: answered by the busy line, its own or an earlier one (`covered_by`).
    Limited,
    /// Not answered, on purpose: a follow-up over the daily cap, to a user who left or blocked the bot, or
    /// with stale news; a group message no companion answers. `reason` says why.
    Dropped,
    /// Kept in history, not answered: a moderator had paused the conversation. A resume may open the
    /// latest held job again to answer it.
    Held,
}

impl State {
    pub(crate) const ALL: [State; 7] = [
        State::Running,
        State::Done,
        State::Failed,
        State::Covered,
        State::Limited,
        State::Dropped,
        State::Held,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Done => "done",
            State::Failed => "failed",
            State::Covered => "covered",
            State::Limited => "limited",
            State::Dropped => "dropped",
            State::Held => "held",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Settled: nothing more will be done unless a replay opens it again.
    pub fn is_settled(self) -> bool {
        self != State::Running
    }

    /// Every transition there is. A job is created `Running` by its own delivery, or `Covered` by the
    /// turn whose reply answers it; a running job settles once; a replay reopens a settled one.
    pub(crate) fn may_become(self, to: State) -> bool {
        use State::*;
        matches!(
            (self, to),
            (Running, Done | Failed | Limited | Dropped | Held)
                | (Done | Failed | Covered | Limited | Dropped | Held, Running)
        )
    }

    /// The states that may become `to`, as SQL text values.
    fn sources(to: State) -> Vec<&'static str> {
        State::ALL
            .into_iter()
            .filter(|from| from.may_become(to))
            .map(State::as_str)
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal: {0}")]
    Store(#[from] StoreError),
    #[error("journal: step {name}/{key} output cannot be encoded: {source}")]
    Encode {
        name: String,
        key: String,
        source: serde_json::Error,
    },
    #[error("journal: job {0} has an unknown state `{1}`")]
    BadState(String, String),
    #[error("journal: the recorded step {name}/{key} does not read back")]
    Decode { name: String, key: String },
    /// Another attempt of the job recorded this owed step ([`Step::run_owed`]) first, with another
    /// output: this attempt went on from its own and ends; the next goes on with the recorded one.
    #[error("journal: another attempt recorded step {name}/{key} first, with another output")]
    Raced { name: String, key: String },
}

impl From<sqlx::Error> for JournalError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(StoreError::Pg(e))
    }
}

impl Classify for JournalError {
    fn class(&self) -> Class {
        match self {
            Self::Store(e) => e.class(),
            Self::Raced { .. } => Class::Transient,
            Self::Encode { .. } | Self::BadState(..) | Self::Decode { .. } => Class::Permanent,
        }
    }
}

/// A job's row.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    pub(crate) id: String,
    pub state: State,
    pub attempts: i32,
    /// Reply generation: 0 first; each replay that answers again takes the next.
    pub generation: i32,
    /// For a covered or limited job: the job whose reply answered it.
    pub covered_by: Option<String>,
    pub stream_seq: Option<u64>,
    pub last_error: Option<String>,
    /// Why a job ended without a message (`dropped`).
    pub reason: Option<String>,
    pub updated_at: DateTime<Utc>,
}

impl JobRecord {
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// Who a job acts for and where it came from, for its row.
#[derive(Clone, Copy, Debug)]
pub struct NewJob<'a> {
    pub id: &'a str,
    pub kind: &'a str,
    pub user: &'a str,
    /// The companion acting; empty for a job several companions act in (a group message).
    pub bot: &'a str,
    pub conversation: &'a str,
    pub stream_seq: Option<u64>,
    /// What the opening also reads, in the same statement, for the job's next steps.
    pub reads: Reads<'a>,
}

/// Reads that ride with [`Journal::open`] (one statement, where each was one of its own).
#[derive(Clone, Copy, Debug, Default)]
pub struct Reads<'a> {
    /// The outputs of the steps of this name in the job just before this one
    /// ([`Journal::previous_steps`]), created at or after the time given ([`Carried::previous`]).
    pub previous: Option<(&'a str, DateTime<Utc>)>,
    /// Whether a moderator has paused the job's conversation ([`Carried::paused`]).
    pub paused: bool,
}

/// A read that decides whether a job opens at all ([`Journal::open_unless`]): a query of one row whose
/// boolean column `gone` stops the opening when true, so no job row exists for what it stops. It sees
/// the parameters `$10` (the user), `$11` (the companion, or empty) and `$12` (the input's message ids,
/// a text array); its whole row comes back as a JSON object.
#[derive(Clone, Copy, Debug)]
pub struct Guard<'a> {
    pub sql: &'static str,
    pub user: &'a str,
    pub bot: &'a str,
    pub messages: &'a [String],
}

/// What [`Journal::open_unless`] found.
pub enum Opened {
    /// The guard let it open; with the guard's row.
    Job(Box<Job>, Value),
    /// The guard stopped it (no job row was written); its row.
    Stopped(Value),
}

/// The answer of [`Job::counted`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Counted now.
    Granted,
    /// Counted by an earlier attempt of this step; nothing new is counted.
    AlreadyCounted,
    /// The limit is used up; the oldest step of the window leaves it in this many seconds.
    Exceeded { retry_after_secs: i64 },
}

/// A transaction a [`Step::run_in_tx`] body does its writes in.
pub(crate) type Tx = companion_store::store::Tx;

/// The journal, in the service's PostgreSQL database.
#[derive(Clone)]
pub struct Journal {
    pool: Pool,
    metrics: Option<Arc<Metrics>>,
}

/// The job that came just before job `j` (same kind, user and conversation; created at or after the
/// parameter `since`), or the job that covered it: one query for [`Journal::open`] and
/// [`Journal::previous_steps`].
fn previous_job(since: &str) -> String {
    format!(
        "SELECT coalesce(p.covered_by, p.id) FROM jobs p
         WHERE p.conversation_id = j.conversation_id AND p.user_id = j.user_id AND p.kind = j.kind
           AND p.id <> j.id AND p.created_at < j.created_at AND p.created_at >= {since}
         ORDER BY p.created_at DESC LIMIT 1"
    )
}

const JOB_COLUMNS: &str =
    "id, state, attempts, generation, covered_by, stream_seq, last_error, reason, updated_at";

impl Journal {
    pub fn new(pool: Pool) -> Self {
        Self {
            pool,
            metrics: None,
        }
    }

    /// The journal whose steps' counters ([`Step::counts`]) move in `metrics`.
    pub fn counting(self, metrics: Arc<Metrics>) -> Self {
        Self {
            metrics: Some(metrics),
            ..self
        }
    }

    /// Opens an attempt of a job: creates it `Running`, or counts another attempt of an existing one;
    /// with every step recorded so far. One round trip.
    pub async fn open(&self, new: &NewJob<'_>) -> Result<Job, JournalError> {
        let row = self.opening(new, None).await?;
        self.opened(&row)
    }

    /// [`Journal::open`] unless `guard` stops it, in the same one statement.
    pub async fn open_unless(
        &self,
        new: &NewJob<'_>,
        guard: &Guard<'_>,
    ) -> Result<Opened, JournalError> {
        let row = self.opening(new, Some(guard)).await?;
        let guarded: Value = row.get("guarded");
        match row.get::<Option<String>, _>("id") {
            None => Ok(Opened::Stopped(guarded)),
            Some(_) => Ok(Opened::Job(Box::new(self.opened(&row)?), guarded)),
        }
    }

    /// The opening's statement: the job's row (none when `guard` stopped it), its records, the reads
    /// riding with it, and with a guard its row as `guarded`. A first attempt (the row this statement
    /// created: `attempts` 1, which only an insert returns) has no records to read: every writer of a
    /// job's records opens the job first.
    async fn opening(
        &self,
        new: &NewJob<'_>,
        guard: Option<&Guard<'_>>,
    ) -> Result<sqlx::postgres::PgRow, JournalError> {
        let (with_guard, values, source, guarded) = match guard {
            Some(g) => (
                format!("g AS ({}), ", g.sql),
                "SELECT $1, $2, $3, NULLIF($4, ''), $5, $6 WHERE NOT (SELECT gone FROM g)",
                "(SELECT to_jsonb(g) AS guarded FROM g) g LEFT JOIN j ON true",
                ", g.guarded",
            ),
            None => (
                String::new(),
                "VALUES ($1, $2, $3, NULLIF($4, ''), $5, $6)",
                "j",
                "",
            ),
        };
        let sql = format!(
            "WITH {with_guard}j AS (
                INSERT INTO jobs (id, kind, user_id, bot_id, conversation_id, stream_seq)
                {values}
                ON CONFLICT (id) DO UPDATE
                   SET attempts = jobs.attempts + 1, updated_at = now(),
                       stream_seq = COALESCE(jobs.stream_seq, EXCLUDED.stream_seq)
                RETURNING {JOB_COLUMNS}, kind, user_id, conversation_id, created_at)
             SELECT j.*, CASE WHEN j.attempts > 1 THEN
                           (SELECT coalesce(jsonb_agg(jsonb_build_array(s.name, s.key, s.output)), '[]')
                            FROM job_records s WHERE s.job = j.id)
                         ELSE '[]' END AS steps,
                    CASE WHEN $7::text IS NOT NULL THEN
                      (SELECT coalesce(jsonb_agg(s.output), '[]') FROM job_steps s
                       WHERE s.name = $7 AND s.job = ({previous}))
                    END AS previous,
                    CASE WHEN $9 THEN {paused} END AS paused{guarded}
             FROM {source}",
            previous = previous_job("$8"),
            paused = store::paused_sql("j.conversation_id"),
        );
        let (previous_name, previous_since) = new.reads.previous.unzip();
        let query = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(new.id)
            .bind(new.kind)
            .bind(new.user)
            .bind(new.bot)
            .bind(new.conversation)
            .bind(new.stream_seq.map(|s| s as i64))
            .bind(previous_name)
            .bind(previous_since)
            .bind(new.reads.paused);
        let query = match guard {
            Some(g) => query.bind(g.user).bind(g.bot).bind(g.messages),
            None => query,
        };
        Ok(query.fetch_one(&self.pool).await?)
    }

    /// The job of an opening's row.
    fn opened(&self, row: &sqlx::postgres::PgRow) -> Result<Job, JournalError> {
        let record = job_record(row)?;
        let previous = match row.get::<Option<Value>, _>("previous") {
            Some(Value::Array(outputs)) => Some(outputs),
            _ => None,
        };
        let mut recorded = HashMap::new();
        if let Value::Array(steps) = row.get::<Value, _>("steps") {
            for s in steps {
                if let (Some(name), Some(key)) = (s[0].as_str(), s[1].as_str()) {
                    // A packed record two attempts both wrote reads twice: either output will do.
                    recorded
                        .entry((name.to_owned(), key.to_owned()))
                        .or_insert_with(|| s[2].clone());
                }
            }
        }
        Ok(Job {
            pool: self.pool.clone(),
            metrics: self.metrics.clone(),
            record,
            recorded: Mutex::new(recorded),
            pending: Mutex::new(Vec::new()),
            notes: Default::default(),
            packs: Default::default(),
            carried: Carried {
                previous,
                paused: row.get("paused"),
                ..Carried::default()
            },
            owed: Mutex::new(None),
        })
    }

    /// The job as it stands, without opening an attempt.
    pub async fn get(&self, id: &str) -> Result<Option<JobRecord>, JournalError> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(job_record).transpose()
    }

    /// Opens a settled job again for a replay (`Running`, nobody's cover any more, no reason): in the
    /// next reply generation when the current one has a companion message, so that the replay answers
    /// anew; the records of the steps named in `forget` are dropped, so they run again (the model's
    /// answers, say). A running job is left as it is.
    pub async fn reopen(&self, id: &str, forget: &[&str]) -> Result<(), JournalError> {
        let mut tx = self.pool.begin().await?;
        let generation: Option<i32> =
            sqlx::query_scalar("SELECT generation FROM jobs WHERE id = $1 FOR UPDATE")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        let Some(generation) = generation else {
            return Ok(());
        };
        let replies: Vec<String> =
            sqlx::query_scalar("SELECT key FROM job_steps WHERE job = $1 AND name = $2")
                .bind(id)
                .bind(names::REPLY)
                .fetch_all(&mut *tx)
                .await?;
        let answered = replies
            .iter()
            .any(|k| names::key::is_reply_of(k, generation));
        sqlx::query(
            "UPDATE jobs SET state = 'running', covered_by = NULL, reason = NULL, updated_at = now(),
                generation = generation + CASE WHEN $2 THEN 1 ELSE 0 END
             WHERE id = $1 AND state = ANY($3)",
        )
        .bind(id)
        .bind(answered)
        .bind(State::sources(State::Running))
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM job_steps WHERE job = $1 AND name = ANY($2)")
            .bind(id)
            .bind(forget)
            .execute(&mut *tx)
            .await?;
        // And out of the packed rows ([`names::PACKED`]).
        sqlx::query(
            "UPDATE job_steps SET output = (
                SELECT coalesce(jsonb_agg(r), '[]'::jsonb) FROM jsonb_array_elements(output) AS r
                WHERE NOT (r ->> 'name' = ANY($2)))
             WHERE job = $1 AND name = $3 AND jsonb_typeof(output) = 'array'",
        )
        .bind(id)
        .bind(forget)
        .bind(names::PACKED)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records why an attempt failed, for operators.
    pub async fn note_error(&self, id: &str, reason: &str) -> Result<(), JournalError> {
        sqlx::query("UPDATE jobs SET last_error = $2, updated_at = now() WHERE id = $1")
            .bind(id)
            .bind(reason)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Settles a job that has no open attempt here (a replay that failed): only from a state that may
    /// become `to`.
    pub async fn force_state(
        &self,
        id: &str,
        to: State,
        error: Option<&str>,
    ) -> Result<(), JournalError> {
        let to = Transition {
            to,
            ending: Finish::default(),
            error,
            floor: None,
            unless_deleted: None,
        };
        transition(&self.pool, id, to, Value::Array(Vec::new())).await?;
        Ok(())
    }

    /// The job whose step `name` was last recorded under `tally`, if that was at or after `since` (e.g.
    /// the turn that said the busy line to this user this minute).
    pub async fn last_tallied(
        &self,
        tally: &str,
        name: &str,
        since: DateTime<Utc>,
    ) -> Result<Option<String>, JournalError> {
        Ok(sqlx::query_scalar(
            "SELECT job FROM job_steps WHERE tally = $1 AND name = $2 AND created_at >= $3
             ORDER BY created_at DESC LIMIT 1",
        )
        .bind(tally)
        .bind(name)
        .bind(since)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// The output of step `name` (every key) in the job of the same kind, user and conversation that
    /// came just before `job` and was created at or after `since`; for a burst's covered message, in the
    /// job that covered it. Empty when there is no such job or it has no such step.
    pub async fn previous_steps(
        &self,
        job: &str,
        name: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<Value>, JournalError> {
        let sql = format!(
            "SELECT s.output FROM job_steps s, (SELECT * FROM jobs WHERE id = $1) j
             WHERE s.name = $2 AND s.job = ({previous})",
            previous = previous_job("$3")
        );
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(job)
            .bind(name)
            .bind(since)
            .fetch_all(&self.pool)
            .await?)
    }

    /// The record of the latest step of `kind` in a job of `conversation` since `since` (none: no such
    /// step, or it does not read as the kind's record).
    pub async fn latest_in<T: DeserializeOwned>(
        &self,
        conversation: &str,
        kind: &StepKind<T>,
        since: DateTime<Utc>,
    ) -> Result<Option<T>, JournalError> {
        let latest: Option<Value> = sqlx::query_scalar(
            "SELECT s.output FROM jobs j JOIN job_steps s ON s.job = j.id AND s.name = $2
             WHERE j.conversation_id = $1 AND j.created_at >= $3 AND s.created_at >= $3
             ORDER BY s.created_at DESC LIMIT 1",
        )
        .bind(conversation)
        .bind(kind.name)
        .bind(since)
        .fetch_optional(&self.pool)
        .await?;
        Ok(latest.and_then(|v| serde_json::from_value(v).ok()))
    }

    /// Whether a job of `conversation` ever recorded a `name` step.
    pub async fn ever_in(&self, conversation: &str, name: &str) -> Result<bool, JournalError> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM jobs j JOIN job_steps s ON s.job = j.id
                            WHERE j.conversation_id = $1 AND s.name = $2)",
        )
        .bind(conversation)
        .bind(name)
        .fetch_one(&self.pool)
        .await?)
    }

    /// The latest job of `conversation` in `state`, created at or after `since`: its id, kind and
    /// inbound stream sequence.
    pub async fn latest_in_state(
        &self,
        conversation: &str,
        state: State,
        since: DateTime<Utc>,
    ) -> Result<Option<(String, String, Option<u64>)>, JournalError> {
        let row = sqlx::query(
            "SELECT id, kind, stream_seq FROM jobs
             WHERE conversation_id = $1 AND state = $2 AND created_at >= $3
             ORDER BY stream_seq DESC NULLS LAST, created_at DESC LIMIT 1",
        )
        .bind(conversation)
        .bind(state.as_str())
        .bind(since)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| {
            let seq = r.get::<Option<i64>, _>("stream_seq").map(|s| s as u64);
            (r.get("id"), r.get("kind"), seq)
        }))
    }
}

fn job_record(row: &PgRow) -> Result<JobRecord, JournalError> {
    let id: String = row.get("id");
    let state: String = row.get("state");
    let Some(state) = State::parse(&state) else {
        return Err(JournalError::BadState(id, state));
    };
    Ok(JobRecord {
        id,
        state,
        attempts: row.get("attempts"),
        generation: row.get("generation"),
        covered_by: row.get("covered_by"),
        stream_seq: row.get::<Option<i64>, _>("stream_seq").map(|s| s as u64),
        last_error: row.get("last_error"),
        reason: row.get("reason"),
        updated_at: row.get("updated_at"),
    })
}

/// A step record not yet written.
#[derive(Clone, Debug)]
struct Pending {
    name: String,
    /// Its step kind's records may be packed ([`StepKind::packed`]).
    packable: bool,
    key: String,
    output: Value,
    tally: Option<String>,
    /// When it counts from (a counted step's clock); none: the database's.
    at: Option<DateTime<Utc>>,
    /// The counter the record moves once it is committed by this attempt ([`Step::counts`]).
    counter: Option<Counter>,
}

/// A counter and its labels, moved when a step's record commits.
#[derive(Clone, Debug)]
struct Counter {
    metric: &'static Metric,
    labels: Vec<(&'static str, String)>,
}

/// One attempt of a job: its row as opened, the steps recorded so far, and the records not yet written.
pub struct Job {
    pool: Pool,
    /// Where the steps' counters move ([`Step::counts`]); none: they do not.
    metrics: Option<Arc<Metrics>>,
    pub record: JobRecord,
    recorded: Mutex<HashMap<(String, String), Value>>,
    pending: Mutex<Vec<Pending>>,
    /// Notes written by this attempt ([`Job::note`]), for their keys.
    notes: std::sync::atomic::AtomicU32,
    /// Packed rows built by this attempt ([`Job::records`]), for their keys.
    packs: std::sync::atomic::AtomicU32,
    /// What the attempt's statements carry besides their own work ([`Job::carried`]).
    carried: Carried,
    /// The record of a step owed before the attempt's next record ([`Step::run_owed`]).
    owed: Mutex<Option<Pending>>,
}

/// What an attempt's statements carry besides their own work, so that it needs no statement of its own:
/// reads that rode with the opening ([`Reads`]) or with a record ([`Ride`]), and the order floor the
/// settlement moves.
#[derive(Debug, Default)]
pub struct Carried {
    /// What [`Reads::previous`] asked for, read when the job opened.
    previous: Option<Vec<Value>>,
    /// What [`Reads::paused`] asked for, read when the job opened.
    paused: Option<bool>,
    /// What the last record statement's [`Ride`] read, with the key of the step it recorded.
    ridden: Mutex<Option<(String, Value)>>,
    /// The conversation's order floor this job's settlement moves ([`Carried::settles_floor`]).
    floor: Mutex<Option<FloorAt>>,
    /// The last sequence the settlement moved that floor past ([`Carried::floored`]).
    floored: Mutex<Option<u64>>,
}

impl Carried {
    /// The job's [`Job::finish`] also moves `floor` (a conversation's order floor) past the last message
    /// it answered ([`Finish::through`]), in the same statement, when it is the finish that settles the
    /// job. One statement and one commit fewer for the settlement ([`Carried::floored`] says it was done).
    pub fn settles_floor(&self, floor: FloorAt) {
        *self.floor.lock().expect("floor lock") = Some(floor);
    }

    /// The sequence the finish moved the order floor past, when it did ([`Carried::settles_floor`]).
    pub fn floored(&self) -> Option<u64> {
        *self.floored.lock().expect("floor lock")
    }

    /// What the [`Ride`] of the step keyed `key` read, when its record statement just ran; none
    /// otherwise. Taking it clears it, whatever its key.
    pub fn take_ridden(&self, key: &str) -> Option<Value> {
        match self.ridden.lock().expect("ride lock").take() {
            Some((k, v)) if k == key => Some(v),
            _ => None,
        }
    }

    /// Whether a moderator had paused the job's conversation when this attempt opened
    /// ([`Reads::paused`]); none when it was not asked.
    pub fn paused(&self) -> Option<bool> {
        self.paused
    }

    /// The previous job's step outputs asked for by [`Reads::previous`], as they stood when this
    /// attempt opened; none when they were not asked for.
    pub fn previous(&self) -> Option<&[Value]> {
        self.previous.as_deref()
    }
}

impl Job {
    pub fn id(&self) -> &str {
        &self.record.id
    }

    /// What the attempt's statements carried besides their own work.
    pub fn carried(&self) -> &Carried {
        &self.carried
    }

    /// Step `kind` with `key` of this job; run it with [`Step::run`].
    pub fn step<'a, T>(&'a self, kind: &StepKind<T>, key: impl Into<String>) -> Step<'a, T> {
        Step {
            job: self,
            name: kind.name,
            packable: kind.packable,
            key: key.into(),
            lazy: false,
            tally: None,
            at: None,
            counter: None,
            record: PhantomData,
        }
    }

    /// Writes a note: what happened in this attempt that is not a side effect's success (a failed
    /// request, why a fixed line was said), as a step of `kind` keyed `<prefix>@<attempt>.<n>` with `detail`.
    /// A note is never replayed or asked for ([`Job::recorded`] is for side effects); it is there for
    /// `companion explain`. Written at once, whatever becomes of the attempt.
    pub async fn note<T: Serialize>(
        &self,
        kind: &StepKind<T>,
        prefix: &str,
        detail: &T,
    ) -> Result<(), JournalError> {
        let name = kind.name;
        let detail = encode(name, prefix, detail)?;
        let n = self
            .notes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        sqlx::query(
            "INSERT INTO job_steps (job, name, key, output) VALUES ($1, $2, $3, $4)
             ON CONFLICT (job, name, key) DO NOTHING",
        )
        .bind(self.id())
        .bind(name)
        .bind(format!("{prefix}@{}.{n}", self.record.attempts))
        .bind(detail)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// How many steps of `kind` are recorded with a key starting with `prefix`.
    pub fn recorded_count_under<T>(&self, kind: &StepKind<T>, prefix: &str) -> usize {
        let recorded = self.recorded.lock().expect("journal lock");
        recorded
            .keys()
            .filter(|(n, k)| n == kind.name && k.starts_with(prefix))
            .count()
    }

    /// The record of (kind, key), if any and if it reads as the kind's record.
    pub fn recorded<T: DeserializeOwned>(&self, kind: &StepKind<T>, key: &str) -> Option<T> {
        self.recorded_as(kind.name, key)
    }

    /// Whether a step of `kind` is recorded under `key`, whatever it holds.
    pub(crate) fn has_recorded<T>(&self, kind: &StepKind<T>, key: &str) -> bool {
        let recorded = self.recorded.lock().expect("journal lock");
        recorded.contains_key(&(kind.name.to_owned(), key.to_owned()))
    }

    /// The output recorded for (name, key), if any and if it reads as `T`.
    fn recorded_as<T: DeserializeOwned>(&self, name: &str, key: &str) -> Option<T> {
        let recorded = self.recorded.lock().expect("journal lock");
        let value = recorded.get(&(name.to_owned(), key.to_owned()))?;
        decode(name, key, value)
    }

    /// A step that counts against `limit` steps of `tally` per `window`, across every worker: under a lock
    /// per tally, granted (and recorded, with the tally) only while fewer than `limit` steps of the tally
    /// were recorded in the window that ends at `now`.
    pub async fn counted(
        &self,
        kind: &StepKind<Counted>,
        key: &str,
        tally: &str,
        limit: u32,
        window: Duration,
        now: DateTime<Utc>,
    ) -> Result<Admission, JournalError> {
        let window = chrono::Duration::from_std(window).unwrap_or(chrono::Duration::hours(1));
        if self.has_recorded(kind, key) {
            return Ok(Admission::AlreadyCounted);
        }
        let name = kind.name;
        let mut step = self.step(kind, key).tally(tally);
        step.at = Some(now);
        starting(self.id(), name, key);
        let counted = Counted {
            counted: Some(tally.to_owned()),
        };
        let own = step.pending(encode(name, key, &counted)?);
        pay_owed(self).await?;
        let pending = self.take_pending();
        // Serialised on the tally (every step counting against it, of any job), then the earlier record,
        // the count and the insert, each in a fresh snapshot: one statement (migration `counted_step`).
        let row = sqlx::query(
            "SELECT earlier, counted, oldest, inserted
             FROM counted_step($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(format!("tally:{tally}"))
        .bind(self.id())
        .bind(name)
        .bind(key)
        .bind(tally)
        .bind(now - window)
        .bind(i64::from(limit))
        .bind(self.records(&pending, None))
        .bind(self.records(&[], Some(&own)))
        .fetch_one(&self.pool)
        .await;
        let row = match row {
            Ok(row) => row,
            Err(e) => {
                self.requeue(pending);
                return Err(e.into());
            }
        };
        let inserted: Vec<(String, String)> =
            serde_json::from_value(row.get::<Value, _>("inserted")).unwrap_or_else(|e| {
                warn!(step = name, key, error = %e, "counted_step's inserted records do not read; their counters stay");
                Vec::new()
            });
        if let Some(earlier) = row.get::<Option<Value>, _>("earlier") {
            debug!(
                step = name,
                key, "another attempt recorded this step first; using its output"
            );
            self.count_committed(&pending, &inserted);
            self.remember(name, key, earlier);
            return Ok(Admission::AlreadyCounted);
        }
        if row.get::<Option<i64>, _>("counted").unwrap_or(0) >= i64::from(limit) {
            self.requeue(pending);
            let oldest: Option<DateTime<Utc>> = row.get("oldest");
            let retry_after_secs = oldest
                .map(|o| (o + window - now).num_seconds().max(1))
                .unwrap_or(window.num_seconds());
            return Ok(Admission::Exceeded { retry_after_secs });
        }
        let output = own.output.clone();
        let mut rows = pending;
        rows.push(own);
        self.count_committed(&rows, &inserted);
        self.remember(name, key, output);
        Ok(Admission::Granted)
    }

    /// A step whose effect is covering other jobs (a burst's later messages, answered by this job's
    /// reply): covers the longest prefix of `candidates` that can still be covered and records
    /// `output(n)` for the `n` covered, in one transaction ([`Step::run_in_tx`]). Two attempts of this job
    /// running at once (a redelivery while the first delivery still runs) therefore agree: the second
    /// reads the first's record and covers nothing, so no job is covered that the recorded step (and the
    /// reply built from it) does not answer.
    pub async fn covering<T, F>(
        &self,
        kind: &StepKind<T>,
        key: &str,
        candidates: &[NewJob<'_>],
        output: F,
    ) -> Result<T, JournalError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(usize) -> T,
    {
        if candidates.is_empty() {
            // Nothing to cover: the record is owed (`Step::run_owed`), carried by the next read that
            // takes it or written before the attempt's next record. An attempt that covered meanwhile
            // wins: this one then ends at that read or record, before anything it records.
            return self
                .step(kind, key)
                .run_owed(async { Ok::<_, JournalError>(output(0)) })
                .await;
        }
        self.step(kind, key)
            .run_in_tx(|mut tx| async move {
                let mut n = 0;
                for c in candidates {
                    match cover_with(&mut *tx, c, self.id()).await {
                        Ok(true) => n += 1,
                        Ok(false) => break,
                        Err(e) => return (tx, Err(e)),
                    }
                }
                (tx, Ok(output(n)))
            })
            .await
    }

    /// Writes the records of lazy steps now.
    async fn flush(&self) -> Result<(), JournalError> {
        pay_owed(self).await?;
        let pending = self.take_pending();
        if pending.is_empty() {
            return Ok(());
        }
        let sql = format!("{INSERT_RECORDS} RETURNING name, key");
        let result: Result<Vec<(String, String)>, _> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(self.id())
            .bind(self.records(&pending, None))
            .fetch_all(&self.pool)
            .await;
        match result {
            Ok(inserted) => {
                self.count_committed(&pending, &inserted);
                Ok(())
            }
            Err(e) => {
                self.requeue(pending);
                Err(e.into())
            }
        }
    }

    /// The attempt [`Journal::open`] began: unless the job is already settled (an earlier attempt,
    /// another worker or a replay ended it), runs `body` on it. When the body fails, the records of the
    /// steps that succeeded are written first (best effort), so the next attempt replays rather than
    /// redoes them.
    pub async fn attempt<T, E>(
        &self,
        body: impl AsyncFnOnce(&Job) -> Result<T, E>,
    ) -> Result<Attempt<T>, E> {
        if self.record.state.is_settled() {
            return Ok(Attempt::Settled);
        }
        let result = body(self).await;
        self.keep_successes(result).await.map(Attempt::Ran)
    }

    /// Passes an attempt's result on; when it failed, first writes the records still pending, best
    /// effort, so that what succeeded is not redone by the next attempt.
    async fn keep_successes<T, E>(&self, result: Result<T, E>) -> Result<T, E> {
        if result.is_err()
            && let Err(e) = self.flush().await
        {
            debug!(error = %e, "step records not written; the next attempt redoes those steps");
        }
        result
    }

    /// Ends the running job in state `to`, with who answered it and why it ended without a message
    /// ([`Finish`]), writing the pending records in the same statement. False when the job was no longer
    /// running (a replay or another worker ended it first).
    pub async fn finish(&self, to: State, ending: Finish<'_>) -> Result<bool, JournalError> {
        Ok(self.finish_unless_deleted(to, ending, None).await? == Finished::Moved)
    }

    /// [`Job::finish`], unless one of the `answered` messages (when given) was deleted or their user
    /// erased: read in the settling statement's own snapshot (the check once the job's last message is
    /// out, without a round trip of its own). A deletion found leaves the job running.
    pub async fn finish_unless_deleted(
        &self,
        to: State,
        ending: Finish<'_>,
        answered: Option<Answered<'_>>,
    ) -> Result<Finished, JournalError> {
        pay_owed(self).await?;
        let pending = self.take_pending();
        let floor = self
            .carried
            .floor
            .lock()
            .expect("floor lock")
            .clone()
            .map(|f| {
                let through = ending.through.unwrap_or(f.seq).max(f.seq);
                (f, through)
            });
        let to = Transition {
            to,
            ending,
            error: None,
            floor: floor.as_ref(),
            unless_deleted: answered,
        };
        match transition(&self.pool, self.id(), to, self.records(&pending, None)).await {
            Ok((moved, deleted, inserted)) => {
                self.count_committed(&pending, &inserted);
                if moved && let Some((_, through)) = floor {
                    *self.carried.floored.lock().expect("floor lock") = Some(through);
                }
                Ok(match (moved, deleted) {
                    (true, _) => Finished::Moved,
                    (false, true) => Finished::Deleted,
                    (false, false) => Finished::Elsewhere,
                })
            }
            Err(e) => {
                self.requeue(pending);
                Err(e)
            }
        }
    }

    /// The record this attempt owes ([`Step::run_owed`]), for a read to carry instead of a statement of
    /// its own; none when nothing is owed.
    pub fn owing(&self) -> Option<Owing<'_>> {
        let owed = self.owed.lock().expect("journal lock");
        let o = owed.as_ref()?;
        let mut args = serde_json::Map::new();
        args.insert("owed_job".into(), self.id().into());
        args.insert("owed_name".into(), o.name.clone().into());
        args.insert("owed_key".into(), o.key.clone().into());
        args.insert("owed_output".into(), o.output.clone());
        Some(Owing { job: self, args })
    }

    fn remember(&self, name: &str, key: &str, output: Value) {
        self.recorded
            .lock()
            .expect("journal lock")
            .insert((name.to_owned(), key.to_owned()), output);
    }

    /// Moves the counters of `rows` whose records this attempt inserted (`inserted`: name and key, as
    /// `INSERT … RETURNING` gave them); a record another attempt wrote first moved its counter then.
    fn count_committed(&self, rows: &[Pending], inserted: &[(String, String)]) {
        let Some(metrics) = &self.metrics else {
            return;
        };
        for r in rows {
            if let Some(c) = &r.counter
                && inserted.iter().any(|(n, k)| *n == r.name && *k == r.key)
            {
                let labels: Vec<(&'static str, &str)> =
                    c.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                metrics.inc(c.metric, &labels);
            }
        }
    }

    /// The JSON array [`INSERT_RECORDS`] reads: the lazy records `pending`, those of packable steps
    /// ([`StepKind::packed`]) packed into one record of step [`names::PACKED`] (keyed
    /// `<attempt>.<n>`, so no other attempt's pack is in its way), then the step's own record `own`, as
    /// it is (its statement reads it back by name).
    fn records(&self, pending: &[Pending], own: Option<&Pending>) -> Value {
        let packable =
            |r: &Pending| r.packable && r.tally.is_none() && r.counter.is_none() && r.at.is_none();
        let (packed, single): (Vec<&Pending>, Vec<&Pending>) =
            pending.iter().partition(|r| packable(r));
        let mut out: Vec<Value> = single.into_iter().chain(own).map(record_json).collect();
        if !packed.is_empty() {
            let n = self
                .packs
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let inner: Vec<Value> = packed
                .iter()
                .map(|r| serde_json::json!({"name": r.name, "key": r.key, "output": r.output}))
                .collect();
            out.push(serde_json::json!({
                "name": names::PACKED,
                "key": format!("{}.{n}", self.record.attempts),
                "output": inner,
            }));
        }
        Value::Array(out)
    }

    fn take_pending(&self) -> Vec<Pending> {
        std::mem::take(&mut *self.pending.lock().expect("journal lock"))
    }

    /// Puts records whose write failed back, for the next write.
    fn requeue(&self, rows: Vec<Pending>) {
        self.pending.lock().expect("journal lock").extend(rows);
    }

    /// Records one step, with the pending ones; returns the output that won.
    async fn record(&self, step: Pending, ride: Option<Ride>) -> Result<Value, JournalError> {
        let (name, key) = (step.name.clone(), step.key.clone());
        pay_owed(self).await?;
        let mut rows = self.take_pending();
        let records = self.records(&rows, Some(&step));
        rows.push(step);
        // Every record this statement inserted, and the step's own as stored before it, if it was; and
        // the ride's value, in a row of no name.
        let ridden = match &ride {
            Some(r) => format!("UNION ALL SELECT '', '', ({}), false", r.sql),
            None => String::new(),
        };
        let sql = format!(
            "WITH ins AS ({INSERT_RECORDS} RETURNING name, key, output)
             SELECT name, key, output, true AS ours FROM ins
             UNION ALL SELECT name, key, output, false FROM job_steps
                       WHERE job = $1 AND name = $3 AND key = $4
             {ridden}"
        );
        let query = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(self.id())
            .bind(records)
            .bind(&name)
            .bind(&key);
        let query = match ride {
            Some(r) => query.bind(r.arg),
            None => query,
        };
        let stored: Result<Vec<(String, String, Value, bool)>, sqlx::Error> =
            query.fetch_all(&self.pool).await;
        let stored = stored.map(|mut found| {
            if let Some(i) = found.iter().position(|f| f.0.is_empty()) {
                let value = found.swap_remove(i).2;
                *self.carried.ridden.lock().expect("ride lock") = Some((key.clone(), value));
            }
            let inserted: Vec<(String, String)> = found
                .iter()
                .filter(|f| f.3)
                .map(|f| (f.0.clone(), f.1.clone()))
                .collect();
            self.count_committed(&rows, &inserted);
            found
                .into_iter()
                .find(|f| f.0 == name && f.1 == key)
                .map(|f| f.2)
        });
        let own = rows.pop().expect("the step itself").output;
        match stored {
            Ok(Some(stored)) => Ok(stored),
            // Our insert waited for another attempt's and found it, but the statement's snapshot is
            // older than that commit: read it now.
            Ok(None) => Ok(step_output(&self.pool, self.id(), &name, &key)
                .await?
                .unwrap_or(own)),
            Err(e) => {
                self.requeue(rows);
                Err(e.into())
            }
        }
    }
}

/// The record a job's attempt owes ([`Job::owing`]), as a write a read carries: [`OWED_WRITE`] reads
/// [`Owing::args`] from the read's jsonb argument; after the read, [`Owing::ridden`] with what it returned.
pub struct Owing<'a> {
    job: &'a Job,
    args: serde_json::Map<String, Value>,
}

impl Owing<'_> {
    /// The keys [`OWED_WRITE`] reads.
    pub fn args(&self) -> serde_json::Map<String, Value> {
        self.args.clone()
    }

    /// After the read that carried [`OWED_WRITE`]: `written` is what it returned (none or null: another
    /// attempt's record of the step was there first). Paid when ours was written or the record found is
    /// the same; another output is [`JournalError::Raced`].
    pub async fn ridden(self, written: Option<Value>) -> Result<(), JournalError> {
        let Some(owed) = self.job.owed.lock().expect("journal lock").take() else {
            return Ok(());
        };
        if written.as_ref() == Some(&owed.output) {
            return Ok(());
        }
        found_owed(self.job, owed).await
    }
}

/// Writes the record `job` owes, if no read carried it: before any other record of the attempt, so no
/// record of this attempt commits on an owed output that another attempt's record contradicts.
async fn pay_owed(job: &Job) -> Result<(), JournalError> {
    let Some(owed) = job.owed.lock().expect("journal lock").take() else {
        return Ok(());
    };
    let written: Result<Option<Value>, _> = sqlx::query_scalar(
        "INSERT INTO job_steps (job, name, key, output) VALUES ($1, $2, $3, $4)
         ON CONFLICT (job, name, key) DO NOTHING RETURNING output",
    )
    .bind(job.id())
    .bind(&owed.name)
    .bind(&owed.key)
    .bind(&owed.output)
    .fetch_optional(&job.pool)
    .await;
    match written {
        Ok(Some(_)) => Ok(()),
        Ok(None) => found_owed(job, owed).await,
        Err(e) => {
            *job.owed.lock().expect("journal lock") = Some(owed);
            Err(e.into())
        }
    }
}

/// The owed record was not written by this attempt: the one stored is either the same (paid) or
/// another attempt's ([`JournalError::Raced`]); none stored means the write never ran (written now).
async fn found_owed(job: &Job, owed: Pending) -> Result<(), JournalError> {
    let stored = match step_output(&job.pool, job.id(), &owed.name, &owed.key).await {
        Ok(stored) => stored,
        Err(e) => {
            *job.owed.lock().expect("journal lock") = Some(owed);
            return Err(e);
        }
    };
    match stored {
        Some(v) if v == owed.output => Ok(()),
        Some(v) => {
            warn!(step = %owed.name, key = %owed.key, "another attempt recorded this step first, with another output; this attempt ends");
            job.remember(&owed.name, &owed.key, v);
            Err(JournalError::Raced {
                name: owed.name,
                key: owed.key,
            })
        }
        None => {
            *job.owed.lock().expect("journal lock") = Some(owed);
            Box::pin(pay_owed(job)).await
        }
    }
}

/// The recorded output of step (name, key) of job `job`, on any connection.
async fn step_output<'e>(
    e: impl sqlx::PgExecutor<'e>,
    job: &str,
    name: &str,
    key: &str,
) -> Result<Option<Value>, JournalError> {
    Ok(
        sqlx::query_scalar(
            "SELECT output FROM job_steps WHERE job = $1 AND name = $2 AND key = $3",
        )
        .bind(job)
        .bind(name)
        .bind(key)
        .fetch_optional(e)
        .await?,
    )
}

/// Creates `job` settled as `Covered` by job `by`. True when it is covered by `by` now (created, or by an
/// earlier attempt of the same cover); false when the job already existed otherwise.
async fn cover_with<'e>(
    e: impl sqlx::PgExecutor<'e>,
    job: &NewJob<'_>,
    by: &str,
) -> Result<bool, JournalError> {
    let covered: Option<String> = sqlx::query_scalar(
        "WITH ins AS (
            INSERT INTO jobs (id, kind, user_id, bot_id, conversation_id, stream_seq, state, covered_by)
            VALUES ($1, $2, $3, $4, $5, $6, 'covered', $7)
            ON CONFLICT (id) DO NOTHING RETURNING covered_by)
         SELECT covered_by FROM ins
         UNION ALL SELECT covered_by FROM jobs WHERE id = $1 AND state = 'covered'
         LIMIT 1",
    )
    .bind(job.id)
    .bind(job.kind)
    .bind(job.user)
    .bind(job.bot)
    .bind(job.conversation)
    .bind(job.stream_seq.map(|s| s as i64))
    .bind(by)
    .fetch_optional(e)
    .await?
    .flatten();
    Ok(covered.as_deref() == Some(by))
}

/// A settlement as [`transition`] writes it.
struct Transition<'a> {
    to: State,
    ending: Finish<'a>,
    error: Option<&'a str>,
    /// The order floor it moves, and past which sequence.
    floor: Option<&'a (FloorAt, u64)>,
    /// Settle only if none of these was deleted (see [`Job::finish_unless_deleted`]).
    unless_deleted: Option<Answered<'a>>,
}

/// Moves a job to `t.to` from any state that may become it, writing `records` ([`Job::records`]) in the
/// same statement: whether it moved, whether a deletion stopped it, and the records inserted.
async fn transition(
    pool: &Pool,
    id: &str,
    t: Transition<'_>,
    records: Value,
) -> Result<(bool, bool, Vec<(String, String)>), JournalError> {
    let (to, ending, error, floor) = (t.to, t.ending, t.error, t.floor);
    // The floor moves only with the settlement that moved the job (never past a job settled elsewhere).
    let floor_cte = match floor {
        Some(_) => format!(
            ", floor AS ({})",
            upsert_floor("SELECT $8, $9, $10 WHERE EXISTS (SELECT 1 FROM moved)")
        ),
        None => String::new(),
    };
    // The deletion check, in the statement's snapshot: a deletion found leaves the job running.
    let deleted = match (t.unless_deleted, floor) {
        (None, _) => "false",
        (Some(_), Some(_)) => store::tombstoned!("$11", "$12"),
        (Some(_), None) => store::tombstoned!("$8", "$9"),
    };
    let sql = format!(
        "WITH ins AS ({INSERT_RECORDS} RETURNING name, key),
              deleted AS (SELECT {deleted} AS yes),
              moved AS (
                UPDATE jobs SET state = $3, covered_by = COALESCE($4, covered_by),
                       last_error = COALESCE($5, last_error), reason = COALESCE($7, reason),
                       updated_at = now()
                WHERE id = $1 AND state = ANY($6) AND NOT (SELECT yes FROM deleted)
                RETURNING state){floor_cte}
         SELECT EXISTS (SELECT 1 FROM moved) AS moved, (SELECT yes FROM deleted) AS deleted,
                (SELECT coalesce(jsonb_agg(jsonb_build_array(name, key)), '[]') FROM ins) AS inserted"
    );
    let query = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .bind(records)
        .bind(to.as_str())
        .bind(ending.by)
        .bind(error)
        .bind(State::sources(to))
        .bind(ending.reason);
    let query = match floor {
        Some((at, through)) => query
            .bind(&at.stream)
            .bind(&at.subject)
            .bind(through.saturating_add(1) as i64),
        None => query,
    };
    let row = match t.unless_deleted {
        Some(a) => query.bind(a.user).bind(a.messages),
        None => query,
    }
    .fetch_one(pool)
    .await?;
    let inserted = match row.get::<Value, _>("inserted") {
        Value::Array(rows) => rows
            .iter()
            .filter_map(|r| Some((r[0].as_str()?.to_owned(), r[1].as_str()?.to_owned())))
            .collect(),
        _ => Vec::new(),
    };
    Ok((row.get("moved"), row.get("deleted"), inserted))
}

/// [`Job::owing`]'s write, as a data-modifying statement a read carries (`store::Rides`): over
/// the read's jsonb argument `$4`, returning the output it wrote as `value` (no row: the step was
/// recorded already).
pub const OWED_WRITE: &str = "INSERT INTO job_steps (job, name, key, output)
    SELECT $4 ->> 'owed_job', $4 ->> 'owed_name', $4 ->> 'owed_key', $4 -> 'owed_output'
    ON CONFLICT (job, name, key) DO NOTHING RETURNING output AS value";

/// Inserts the step records `$2` (a JSON array of [`records`]) of job `$1`; a record already there (an
/// earlier attempt's) stays.
const INSERT_RECORDS: &str = "INSERT INTO job_steps (job, name, key, output, tally, created_at)
    SELECT $1, r.name, r.key, coalesce(r.output, 'null'::jsonb), r.tally, coalesce(r.at, now())
    FROM jsonb_to_recordset($2::jsonb) AS r(name text, key text, output jsonb, tally text, at timestamptz)
    ON CONFLICT (job, name, key) DO NOTHING";

/// One step record as the JSON object [`INSERT_RECORDS`] reads.
fn record_json(r: &Pending) -> Value {
    let mut v =
        serde_json::json!({"name": r.name, "key": r.key, "output": r.output, "tally": r.tally});
    if let Some(at) = r.at {
        v["at"] = serde_json::json!(at);
    }
    v
}

fn decode<T: DeserializeOwned>(name: &str, key: &str, value: &Value) -> Option<T> {
    match T::deserialize(value) {
        Ok(v) => Some(v),
        Err(e) => {
            warn!(step = name, key, error = %e, "a recorded step does not read back; it runs again");
            None
        }
    }
}

/// What [`Job::attempt`] did.
pub enum Attempt<T> {
    /// The job was settled already; the body did not run.
    Settled,
    /// The body ran, and succeeded.
    Ran(T),
}

/// How a job ended, besides its state.
#[derive(Clone, Copy, Debug, Default)]
pub struct Finish<'a> {
    /// The job whose message answered this one (a burst's reply, a busy line).
    pub by: Option<&'a str>,
    /// Why it ended without a message of its own, on purpose.
    pub reason: Option<&'a str>,
    /// The last stream message the job answered (a burst's), when more than its own: how far the
    /// order floor moves ([`Carried::settles_floor`]).
    pub through: Option<u64>,
}

/// The user messages a job's last message answered, and their user: what
/// [`Job::finish_unless_deleted`] checks.
#[derive(Clone, Copy, Debug)]
pub struct Answered<'a> {
    pub user: &'a str,
    pub messages: &'a [String],
}

/// What [`Job::finish_unless_deleted`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finished {
    /// The job is settled in the state asked.
    Moved,
    /// It was no longer running (a replay or another worker ended it first).
    Elsewhere,
    /// One of the messages was deleted, or their user erased: the job is still running, with its
    /// pending records written.
    Deleted,
}

/// What [`Step`]'s body gave: the recorded output of an earlier attempt, or its own with that output as
/// it would be recorded.
enum Ran<T> {
    Replayed(T),
    Fresh(T, Value),
}

/// A step about to run; see the module documentation.
pub struct Step<'a, T> {
    job: &'a Job,
    name: &'static str,
    packable: bool,
    key: String,
    lazy: bool,
    tally: Option<String>,
    at: Option<DateTime<Utc>>,
    counter: Option<Counter>,
    record: PhantomData<fn() -> T>,
}

/// A read that rides with a step's record statement instead of a statement of its own: an SQL expression
/// of type jsonb that reads its input from the statement's parameter `$5` (`arg`). It sees the record's
/// snapshot, taken when the statement starts, where a read of its own would have come one round trip
/// later. Its value is then [`Carried::take_ridden`]'s. It may also read `ins`, the records the statement
/// inserted (`name`, `key`, `output`), with the step's own name and key in `$3` and `$4`: whether this
/// attempt's record is the one stored ([`Step::run_riding`]).
#[derive(Clone, Debug)]
pub struct Ride {
    pub sql: &'static str,
    pub arg: Value,
}

impl<T: Serialize + DeserializeOwned> Step<'_, T> {
    /// Recorded with the job's next recorded step or its settlement, not on its own: for effects that
    /// are safe to repeat.
    pub fn lazy(mut self) -> Self {
        self.lazy = true;
        self
    }

    /// [`Step::lazy`] unless `now`: then recorded at once, with the records still pending before it (what
    /// a job does next must never make it run again).
    pub fn lazy_unless(mut self, now: bool) -> Self {
        self.lazy = !now;
        self
    }

    /// Counted under `tally` (see [`Journal::last_tallied`], [`Job::counted`]).
    pub fn tally(mut self, tally: impl Into<String>) -> Self {
        self.tally = Some(tally.into());
        self
    }

    /// Moves counter `metric{labels}` once, when this step's record commits: not when the body runs
    /// (an attempt that fails before its record is written does not count), and not again on a retry
    /// that replays the record.
    pub fn counts(mut self, metric: &'static Metric, labels: Labels<'_>) -> Self {
        self.counter = Some(Counter {
            metric,
            labels: labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
        });
        self
    }

    fn pending(&self, output: Value) -> Pending {
        Pending {
            name: self.name.to_owned(),
            packable: self.packable,
            key: self.key.clone(),
            output,
            tally: self.tally.clone(),
            at: self.at,
            counter: self.counter.clone(),
        }
    }

    /// The recorded output, or the body's, recorded now (or with the next record, when lazy).
    pub async fn run<E, F>(self, body: F) -> Result<T, E>
    where
        E: From<JournalError>,
        F: Future<Output = Result<T, E>>,
    {
        let lazy = self.lazy;
        self.run_lazy_if(body, move |_| lazy).await
    }

    /// [`Step::run`] for a step whose record must commit before the attempt's next record, and may ride
    /// with a read made before that ([`Job::owing`]) instead of a statement of its own. The body's
    /// output is not written now; every record statement of the attempt writes it first if no read
    /// carried it. When another attempt recorded the step first with another output, that read (or the
    /// next record) fails this attempt with [`JournalError::Raced`], before any of its later records.
    pub(crate) async fn run_owed<E, F>(self, body: F) -> Result<T, E>
    where
        E: From<JournalError>,
        F: Future<Output = Result<T, E>>,
    {
        let job = self.job;
        let (out, value) = match self.ran(body).await? {
            Ran::Replayed(done) => return Ok(done),
            Ran::Fresh(out, value) => (out, value),
        };
        pay_owed(job).await?;
        job.remember(self.name, &self.key, value.clone());
        *job.owed.lock().expect("journal lock") = Some(self.pending(value));
        Ok(out)
    }

    /// The step's recorded output, replayed; or the body run now (logged as started, past the test's
    /// fault hook), with its output as it would be recorded.
    async fn ran<E, F>(&self, body: F) -> Result<Ran<T>, E>
    where
        E: From<JournalError>,
        F: Future<Output = Result<T, E>>,
    {
        let (job, name) = (self.job, self.name);
        if let Some(done) = job.recorded_as::<T>(name, &self.key) {
            debug!(step = name, key = %self.key, "step replayed from the journal");
            return Ok(Ran::Replayed(done));
        }
        starting(job.id(), name, &self.key);
        #[cfg(feature = "testing")]
        crate::fault::reached(job.id(), name).await;
        let out = body.await?;
        let value = encode(name, &self.key, &out)?;
        Ok(Ran::Fresh(out, value))
    }

    /// [`Step::run`], lazy when `lazy` says so of the body's output: a step whose output decides whether
    /// what follows may be repeated (a model answer: text, or calls of tools that only read, which
    /// nothing acts on before the reply's own record, rides along; calls of a tool that acts are
    /// recorded first).
    pub async fn run_lazy_if<E, F>(self, body: F, lazy: impl FnOnce(&T) -> bool) -> Result<T, E>
    where
        E: From<JournalError>,
        F: Future<Output = Result<T, E>>,
    {
        let (job, name) = (self.job, self.name);
        let (out, value) = match self.ran(body).await? {
            Ran::Replayed(done) => return Ok(done),
            Ran::Fresh(out, value) => (out, value),
        };
        if lazy(&out) {
            job.remember(name, &self.key, value.clone());
            let pending = self.pending(value);
            job.pending.lock().expect("journal lock").push(pending);
            return Ok(out);
        }
        self.record_fresh(out, value, None).await
    }

    /// [`Step::run`], recorded now, with a [`Ride`] made from the body's output: for a read or a write
    /// that needs what the step produced, in the record's statement. A step replayed from the journal
    /// rides nothing (then [`Carried::take_ridden`] is none).
    pub async fn run_riding<E, F>(self, body: F, ride: impl FnOnce(&T) -> Ride) -> Result<T, E>
    where
        E: From<JournalError>,
        F: Future<Output = Result<T, E>>,
    {
        let (out, value) = match self.ran(body).await? {
            Ran::Replayed(done) => return Ok(done),
            Ran::Fresh(out, value) => (out, value),
        };
        let ride = ride(&out);
        self.record_fresh(out, value, Some(ride)).await
    }

    /// Records a fresh output now, with `ride`; when another attempt recorded the step first, goes on
    /// with that output.
    async fn record_fresh<E>(self, out: T, value: Value, ride: Option<Ride>) -> Result<T, E>
    where
        E: From<JournalError>,
    {
        let (job, name) = (self.job, self.name);
        let pending = self.pending(value.clone());
        let stored = job.record(pending, ride).await?;
        job.remember(name, &self.key, stored.clone());
        if stored == value {
            return Ok(out);
        }
        debug!(step = name, key = %self.key, "another attempt recorded this step first; using its output");
        Ok(decode(name, &self.key, &stored).unwrap_or(out))
    }

    /// The recorded output, or the body's: the body does its writes in the transaction that records the
    /// step (with the job's pending records), so they commit together or not at all. Attempts of the same
    /// step are serialised; one that finds the step recorded meanwhile returns that record and runs
    /// nothing. A body's error rolls its writes back and records nothing. The body gets the transaction
    /// and hands it back with its result.
    pub async fn run_in_tx<E, F, Fut>(self, body: F) -> Result<T, E>
    where
        E: From<JournalError>,
        F: FnOnce(Tx) -> Fut,
        Fut: Future<Output = (Tx, Result<T, E>)>,
    {
        self.run_tx_fresh(body).await.map(|(out, _)| out)
    }

    /// Takes the step's lock in `tx` (serialised per step), then reads its record in a statement of its
    /// own, so that it sees what another attempt committed while this one waited.
    async fn locked_record(&self, tx: &mut Tx) -> Result<Option<Value>, JournalError> {
        let (job, name) = (self.job, self.name);
        let lock = format!("step:{}:{name}:{}", job.id(), self.key);
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(&lock)
            .execute(&mut **tx)
            .await?;
        step_output(&mut **tx, job.id(), name, &self.key).await
    }

    /// The output another attempt recorded first, which this one goes on with.
    fn adopted<E: From<JournalError>>(&self, value: &Value) -> Result<T, E> {
        let name = self.name;
        debug!(step = name, key = %self.key, "another attempt recorded this step first; using its output");
        decode(name, &self.key, value).ok_or_else(|| {
            E::from(JournalError::Decode {
                name: name.to_owned(),
                key: self.key.clone(),
            })
        })
    }

    /// [`Step::run_in_tx`], and whether the body ran now (false: an earlier attempt's record).
    async fn run_tx_fresh<E, F, Fut>(self, body: F) -> Result<(T, bool), E>
    where
        E: From<JournalError>,
        F: FnOnce(Tx) -> Fut,
        Fut: Future<Output = (Tx, Result<T, E>)>,
    {
        let (job, name) = (self.job, self.name);
        if let Some(done) = job.recorded_as::<T>(name, &self.key) {
            return Ok((done, false));
        }
        starting(job.id(), name, &self.key);
        pay_owed(job).await?;
        let pending = job.take_pending();
        let result = async {
            let mut tx = job.pool.begin().await.map_err(JournalError::from)?;
            let earlier = self.locked_record(&mut tx).await?;
            let (tx, value, own) = match earlier {
                Some(v) => (tx, v, None),
                None => {
                    let (tx, out) = body(tx).await;
                    let out = out?;
                    (tx, encode(name, &self.key, &out)?, Some(out))
                }
            };
            let mut tx = tx;
            let mut rows = pending.clone();
            if own.is_some() {
                rows.push(self.pending(value.clone()));
            }
            let records = job.records(&pending, rows.get(pending.len()));
            let sql = format!("{INSERT_RECORDS} RETURNING name, key");
            let inserted: Vec<(String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(job.id())
                .bind(records)
                .fetch_all(&mut *tx)
                .await
                .map_err(JournalError::from)?;
            if own.is_some() && !inserted.iter().any(|(n, k)| n == name && *k == self.key) {
                // A record of this step written outside the step's lock (an owed one,
                // `Step::run_owed`) committed while this insert waited on it: undo the body's writes
                // and go on with that record, so the attempts still agree.
                tx.rollback().await.map_err(JournalError::from)?;
                let stored = step_output(&job.pool, job.id(), name, &self.key).await?;
                let stored = stored.ok_or_else(|| JournalError::Raced {
                    name: name.to_owned(),
                    key: self.key.clone(),
                })?;
                return Ok((stored, None, true));
            }
            #[cfg(feature = "testing")]
            crate::fault::at(job.id(), &format!("commit:{name}"));
            tx.commit().await.map_err(JournalError::from)?;
            job.count_committed(&rows, &inserted);
            Ok::<_, E>((value, own, false))
        }
        .await;
        match result {
            Ok((value, own, rolled_back)) => {
                if rolled_back {
                    job.requeue(pending);
                }
                job.remember(name, &self.key, value.clone());
                match own {
                    Some(out) => Ok((out, true)),
                    None => self.adopted(&value).map(|out| (out, false)),
                }
            }
            Err(e) => {
                job.requeue(pending);
                Err(e)
            }
        }
    }
}

/// A step's output as recorded.
fn encode<T: Serialize>(name: &str, key: &str, out: &T) -> Result<Value, JournalError> {
    let mut value = serde_json::to_value(out).map_err(|source| JournalError::Encode {
        name: name.to_owned(),
        key: key.to_owned(),
        source,
    })?;
    strip_nul(&mut value);
    Ok(value)
}

/// PostgreSQL's `jsonb` cannot hold U+0000.
fn strip_nul(v: &mut Value) {
    match v {
        Value::String(s) if s.contains('\0') => *s = s.replace('\0', "\u{FFFD}"),
        Value::Array(a) => a.iter_mut().for_each(strip_nul),
        Value::Object(o) => o.values_mut().for_each(strip_nul),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transition_is_listed_once() {
        use State::*;
        let allowed: Vec<(State, State)> = State::ALL
            .into_iter()
            .flat_map(|a| State::ALL.into_iter().map(move |b| (a, b)))
            .filter(|(a, b)| a.may_become(*b))
            .collect();
        assert_eq!(
            allowed,
            [
                (Running, Done),
                (Running, Failed),
                (Running, Limited),
                (Running, Dropped),
                (Running, Held),
                (Done, Running),
                (Failed, Running),
                (Covered, Running),
                (Limited, Running),
                (Dropped, Running),
                (Held, Running),
            ]
        );
        assert_eq!(
            State::sources(Running),
            ["done", "failed", "covered", "limited", "dropped", "held"]
        );
        assert_eq!(State::sources(Done), ["running"]);
        for s in State::ALL {
            assert_eq!(State::parse(s.as_str()), Some(s));
        }
    }

    #[test]
    fn nul_characters_never_reach_postgres() {
        let mut v = serde_json::json!({"a": ["x\u{0}y", 1], "b": "ok"});
        strip_nul(&mut v);
        assert_eq!(v, serde_json::json!({"a": ["x\u{FFFD}y", 1], "b": "ok"}));
    }
}
