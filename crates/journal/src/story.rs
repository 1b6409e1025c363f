//! One job's record as `companion explain` reads it: the job's row with who it acted for, and every
//! step recorded for it, oldest first. A message answered by the reply of an earlier one (a burst's later
//! message) leads to that job. An operator's look at a job's text is a step of the job too
//! ([`note_shown`]).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::Row;

use crate::{JOB_COLUMNS, JobRecord, JournalError, State, StepKind, Telling, Told, job_record};
use companion_store::store::Pool;

/// A job's row, with who it acted for and when it was opened.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRow {
    pub kind: String,
    pub user: String,
    /// None for a job several companions act in (a group message).
    pub bot: Option<String>,
    pub conversation: String,
    pub created_at: DateTime<Utc>,
    pub record: JobRecord,
}

/// One recorded step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRow {
    pub name: String,
    pub key: String,
    pub output: Value,
    pub tally: Option<String>,
    pub at: DateTime<Utc>,
}

/// What the journal holds of the job that answered a message.
#[derive(Clone, Debug, PartialEq)]
pub struct Story {
    /// The job asked for, when it is a burst's later message: its reply is the job's below.
    pub follower: Option<JobRow>,
    pub job: JobRow,
    pub steps: Vec<StepRow>,
}

/// The job `id` names: a job's id (a message id; a follow-up's `<kind>:<id>`), else a follow-up's id
/// without its kind. A burst's later message leads to the job that covered it. None when there is no
/// such job.
pub async fn story(pool: &Pool, id: &str) -> Result<Option<Story>, JournalError> {
    let Some(asked) = job_row(pool, id).await? else {
        return Ok(None);
    };
    let (follower, job) = match (&asked.record.state, &asked.record.covered_by) {
        (State::Covered, Some(head)) => match job_row(pool, head).await? {
            Some(head) => (Some(asked), head),
            None => (None, asked),
        },
        _ => (None, asked),
    };
    let steps = sqlx::query(
        "SELECT name, key, output, tally, created_at FROM job_records WHERE job = $1
         ORDER BY created_at, name, key",
    )
    .bind(job.record.id())
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| StepRow {
        name: r.get("name"),
        key: r.get("key"),
        output: r.get("output"),
        tally: r.get("tally"),
        at: r.get("created_at"),
    })
    .collect();
    Ok(Some(Story {
        follower,
        job,
        steps,
    }))
}

/// The row of job `id`, or of the one job whose id is `<kind>:<id>`.
async fn job_row(pool: &Pool, id: &str) -> Result<Option<JobRow>, JournalError> {
    let sql = format!(
        "SELECT {JOB_COLUMNS}, kind, user_id, bot_id, conversation_id, created_at FROM jobs
         WHERE id = $1
         UNION ALL
         (SELECT {JOB_COLUMNS}, kind, user_id, bot_id, conversation_id, created_at FROM jobs
          WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE id = $1)
            AND right(id, length($1) + 1) = ':' || $1
          ORDER BY created_at DESC LIMIT 1)
         LIMIT 1"
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .fetch_optional(pool)
        .await?;
    row.map(|r| {
        Ok(JobRow {
            kind: r.get("kind"),
            user: r.get("user_id"),
            bot: r.get("bot_id"),
            conversation: r.get("conversation_id"),
            created_at: r.get("created_at"),
            record: job_record(&r)?,
        })
    })
    .transpose()
}

/// An operator asked `companion explain --show-text` for a job's messages ([`note_shown`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Shown {
    pub operator: String,
    pub message: String,
    /// Whether the text was shown (never for a deleted message or an erased user).
    pub shown: bool,
}

/// Who asked `companion explain --show-text` for this job's messages, which message, whether the text
/// was shown. Keyed `<operator>@<time>`, so an erasure's scrub of its output leaves who and when.
pub const TEXT_SHOWN: StepKind<Shown> = StepKind::new("text_shown").told(tell_shown);

fn tell_shown(_: &Told<'_>, s: &Shown) -> Telling {
    let says = match s.shown {
        true => format!(
            "text shown to {} (companion explain --show-text)",
            s.operator
        ),
        false => format!("text asked by {}, withheld", s.operator),
    };
    (
        says,
        json!({ "operator": s.operator, "message": s.message, "shown": s.shown }),
    )
}

/// Records that `operator` was shown the text of job `job`'s messages (`shown`; false: asked, and
/// refused), as its step [`TEXT_SHOWN`] keyed `<operator>@<time>`: the key keeps who and when even after
/// an erasure scrubs the step's output.
pub async fn note_shown(
    pool: &Pool,
    job: &str,
    operator: &str,
    message: &str,
    shown: bool,
    at: DateTime<Utc>,
) -> Result<(), JournalError> {
    sqlx::query(
        "INSERT INTO job_steps (job, name, key, output, created_at) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (job, name, key) DO NOTHING",
    )
    .bind(job)
    .bind(TEXT_SHOWN.name)
    .bind(format!("{operator}@{}", at.to_rfc3339()))
    .bind(json!({ "operator": operator, "message": message, "shown": shown }))
    .bind(at)
    .execute(pool)
    .await?;
    Ok(())
}
