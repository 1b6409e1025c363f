//! PostgreSQL: conversation history (`bot_conversations`) and the turn journal (`turns`).

use std::time::Duration;

use serde_json::Value;
use sqlx::{PgPool, Row, postgres::PgPoolOptions};

use super::StoreError;
use crate::config::Config;

/// Embedded so a deployed binary can migrate without the source tree.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

#[derive(Clone)]
pub struct Pg {
    pub pool: PgPool,
}

/// One message of the history window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryMessage {
    pub role: String,
    pub content: String,
    /// Compact JSON log of the tool calls behind an assistant message, shown to the model next time.
    pub tool_calls: Option<String>,
}

/// A row to append to `bot_conversations`.
#[derive(Clone, Debug)]
pub struct NewHistory<'a> {
    pub user_id: &'a str,
    pub bot_id: &'a str,
    pub conversation_id: &'a str,
    pub role: &'a str,
    pub content: &'a str,
    pub message_id: &'a str,
    pub tool_calls: Option<&'a Value>,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// The journal's view of a turn.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnRecord {
    pub state: String,
    pub attempts: i32,
    pub reply_id: Option<String>,
    pub reply_content: Option<String>,
    pub rich_content: Option<Value>,
    pub reply_at: Option<chrono::DateTime<chrono::Utc>>,
    pub completed_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Reply generation (0 first; a replay that answers again uses the next).
    pub generation: i32,
    /// Later messages of the burst this turn answers (JSON array), once fixed.
    pub covers: Option<Value>,
    /// For a covered or limited message: the turn whose reply answered it.
    pub covered_by: Option<String>,
}

/// Columns every journal query returns, read by [`turn_record`].
const TURN_COLUMNS: &str = "state, attempts, reply_id, reply_content, rich_content, reply_at, \
    CASE WHEN state = 'done' THEN updated_at END AS completed_at, generation, covers, covered_by";

impl Pg {
    pub async fn connect(config: &Config) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(config.concurrency.clamp(4, 32) as u32)
            .acquire_timeout(Duration::from_secs(5))
            .connect(&config.postgres_url)
            .await?;
        Ok(Self { pool })
    }

    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// The last `limit` messages between this user and this bot, oldest first.
    pub async fn history(
        &self,
        user_id: &str,
        bot_id: &str,
        limit: i64,
    ) -> Result<Vec<HistoryMessage>, StoreError> {
        let rows = sqlx::query(
            "SELECT role, content, tool_calls FROM (
                SELECT role, content, tool_calls::text AS tool_calls, created_at, id FROM bot_conversations
                WHERE user_id = $1 AND bot_id = $2
                ORDER BY created_at DESC, id DESC LIMIT $3
             ) w ORDER BY created_at ASC, id ASC",
        )
        .bind(user_id)
        .bind(bot_id)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| HistoryMessage {
                role: r.get("role"),
                content: r.get("content"),
                tool_calls: r.get("tool_calls"),
            })
            .collect())
    }

    /// Appends messages in one transaction; a message already recorded is left as it is.
    pub async fn append_history(&self, rows: &[NewHistory<'_>]) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        for r in rows {
            sqlx::query(
                "INSERT INTO bot_conversations
                    (user_id, bot_id, conversation_id, role, content, message_id, tool_calls, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT (message_id) DO NOTHING",
            )
            .bind(r.user_id)
            .bind(r.bot_id)
            .bind(r.conversation_id)
            .bind(r.role)
            .bind(r.content)
            .bind(r.message_id)
            .bind(r.tool_calls)
            .bind(r.created_at)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Opens (or re-opens, counting the attempt) the journal entry of one inbound event.
    pub async fn begin_turn(
        &self,
        message_id: &str,
        conversation_id: &str,
        user_id: &str,
        bot_id: &str,
        stream_seq: Option<u64>,
    ) -> Result<TurnRecord, StoreError> {
        let sql = format!(
            "INSERT INTO turns (message_id, conversation_id, user_id, bot_id, stream_seq)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (message_id) DO UPDATE
                SET attempts = turns.attempts + 1, updated_at = now(),
                    stream_seq = COALESCE(turns.stream_seq, EXCLUDED.stream_seq)
             RETURNING {TURN_COLUMNS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(message_id)
            .bind(conversation_id)
            .bind(user_id)
            .bind(bot_id)
            .bind(stream_seq.map(|s| s as i64))
            .fetch_one(&self.pool)
            .await?;
        Ok(turn_record(&row))
    }

    /// Fixes the reply of a turn. The first reply recorded wins: a retry gets back the same id and text.
    pub async fn record_reply(
        &self,
        message_id: &str,
        reply_id: &str,
        content: &str,
        rich_content: Option<&Value>,
        reply_at: chrono::DateTime<chrono::Utc>,
    ) -> Result<TurnRecord, StoreError> {
        let sql = format!(
            "UPDATE turns SET
                reply_id = COALESCE(reply_id, $2),
                reply_content = CASE WHEN reply_id IS NULL THEN $3 ELSE reply_content END,
                rich_content = CASE WHEN reply_id IS NULL THEN $4 ELSE rich_content END,
                reply_at = COALESCE(reply_at, $5),
                updated_at = now()
             WHERE message_id = $1
             RETURNING {TURN_COLUMNS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(message_id)
            .bind(reply_id)
            .bind(content)
            .bind(rich_content)
            .bind(reply_at)
            .fetch_one(&self.pool)
            .await?;
        Ok(turn_record(&row))
    }

    /// Settles a running turn: `done` (answered), `limited` or `failed` (dead-lettered), with the last error
    /// if any. A turn settled already (by another worker or a replay) is left as it is.
    pub async fn finish_turn(
        &self,
        message_id: &str,
        state: &str,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE turns SET state = $2, last_error = COALESCE($3, last_error), updated_at = now() WHERE message_id = $1 AND state = 'running'")
            .bind(message_id)
            .bind(state)
            .bind(error)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The model response journaled for step `step` of a turn, if an earlier attempt got that far.
    pub async fn turn_step(
        &self,
        message_id: &str,
        step: i32,
    ) -> Result<Option<Value>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT response FROM turn_steps WHERE message_id = $1 AND step = $2",
        )
        .bind(message_id)
        .bind(step)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Journals a model response; if another attempt recorded this step first, that one is returned.
    pub async fn record_turn_step(
        &self,
        message_id: &str,
        step: i32,
        response: &Value,
    ) -> Result<Value, StoreError> {
        let stored: Value = sqlx::query_scalar(
            "WITH ins AS (
                INSERT INTO turn_steps (message_id, step, response) VALUES ($1, $2, $3)
                ON CONFLICT (message_id, step) DO NOTHING RETURNING response)
             SELECT response FROM ins
             UNION ALL SELECT response FROM turn_steps WHERE message_id = $1 AND step = $2
             LIMIT 1",
        )
        .bind(message_id)
        .bind(step)
        .bind(response)
        .fetch_one(&self.pool)
        .await?;
        Ok(stored)
    }

    /// The journal state of a turn (`running`, `done`, `failed`), if it was ever started.
    pub async fn turn_state(&self, message_id: &str) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT state FROM turns WHERE message_id = $1")
                .bind(message_id)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    /// Records why an attempt failed, for operators.
    pub async fn note_error(&self, message_id: &str, error: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE turns SET last_error = $2, updated_at = now() WHERE message_id = $1")
            .bind(message_id)
            .bind(error)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

fn turn_record(row: &sqlx::postgres::PgRow) -> TurnRecord {
    TurnRecord {
        state: row.get("state"),
        attempts: row.get("attempts"),
        reply_id: row.get("reply_id"),
        reply_content: row.get("reply_content"),
        rich_content: row.get("rich_content"),
        reply_at: row.get("reply_at"),
        completed_at: row.get("completed_at"),
        generation: row.get("generation"),
        covers: row.get("covers"),
        covered_by: row.get("covered_by"),
    }
}

/// Journal operations for bursts, flood limits, order and replay.
impl Pg {
    /// Fixes, on the first attempt only, the later messages of a burst that `head` answers. Each
    /// candidate (`{"messageId", "seq", …}`, in stream order) becomes a `covered` turn unless it already has
    /// a journal entry; the first such one ends the burst, so a burst is always contiguous. Returns the
    /// covers as fixed (by this attempt or an earlier one).
    pub async fn fix_covers(
        &self,
        head: &str,
        conversation_id: &str,
        user_id: &str,
        bot_id: &str,
        candidates: &[Value],
    ) -> Result<Vec<Value>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let fixed: Option<Value> =
            sqlx::query_scalar("SELECT covers FROM turns WHERE message_id = $1 FOR UPDATE")
                .bind(head)
                .fetch_one(&mut *tx)
                .await?;
        if let Some(Value::Array(fixed)) = fixed {
            tx.commit().await?;
            return Ok(fixed);
        }
        let mut covers = Vec::new();
        for c in candidates {
            let (Some(id), Some(seq)) = (c["messageId"].as_str(), c["seq"].as_i64()) else {
                break;
            };
            let inserted = sqlx::query(
                "INSERT INTO turns (message_id, conversation_id, user_id, bot_id, state, covered_by, stream_seq)
                 VALUES ($1, $2, $3, $4, 'covered', $5, $6)
                 ON CONFLICT (message_id) DO NOTHING",
            )
            .bind(id)
            .bind(conversation_id)
            .bind(user_id)
            .bind(bot_id)
            .bind(head)
            .bind(seq)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if inserted == 0 {
                break;
            }
            covers.push(c.clone());
        }
        sqlx::query("UPDATE turns SET covers = $2, updated_at = now() WHERE message_id = $1")
            .bind(head)
            .bind(Value::Array(covers.clone()))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(covers)
    }

    /// The turn of this user and bot whose busy line was sent since `since`, if any.
    pub async fn recent_busy_notice(
        &self,
        user_id: &str,
        bot_id: &str,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT message_id FROM turns
             WHERE user_id = $1 AND bot_id = $2 AND state = 'limited' AND reply_id IS NOT NULL
               AND reply_at >= $3
             ORDER BY reply_at DESC LIMIT 1",
        )
        .bind(user_id)
        .bind(bot_id)
        .bind(since)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Records that a message over the flood limit was answered by an earlier busy line.
    pub async fn mark_limited(
        &self,
        message_id: &str,
        answered_by: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE turns SET state = 'limited', covered_by = $2, updated_at = now()
             WHERE message_id = $1 AND state = 'running'",
        )
        .bind(message_id)
        .bind(answered_by)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records which turn's reply answers this message (itself, for the turn that says the busy line).
    pub async fn set_covered_by(&self, message_id: &str, by: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE turns SET covered_by = $2, updated_at = now() WHERE message_id = $1")
            .bind(message_id)
            .bind(by)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// State, last change and last error of a turn, if it was ever started (for replay).
    pub async fn turn_status(
        &self,
        message_id: &str,
    ) -> Result<Option<(String, chrono::DateTime<chrono::Utc>, Option<String>)>, StoreError> {
        let row =
            sqlx::query("SELECT state, updated_at, last_error FROM turns WHERE message_id = $1")
                .bind(message_id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|r| (r.get("state"), r.get("updated_at"), r.get("last_error"))))
    }

    /// Opens a settled turn again for a replay: the next reply generation (the same one when the last
    /// attempt wrote no reply), no reply yet. `fresh` also
    /// forgets the journaled model responses (the model is asked again); otherwise the replay resumes
    /// from them, so no paid call or tool write of the earlier attempts is repeated. A covered or
    /// limited message becomes a turn of its own.
    pub async fn reopen_turn(&self, message_id: &str, fresh: bool) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "UPDATE turns SET state = 'running',
                generation = generation + CASE WHEN reply_id IS NULL THEN 0 ELSE 1 END, reply_id = NULL,
                reply_content = NULL, rich_content = NULL, reply_at = NULL, covered_by = NULL,
                covers = CASE WHEN state IN ('covered', 'limited') THEN '[]'::jsonb ELSE covers END,
                updated_at = now()
             WHERE message_id = $1 AND state <> 'running'",
        )
        .bind(message_id)
        .execute(&mut *tx)
        .await?;
        if fresh {
            sqlx::query("DELETE FROM turn_steps WHERE message_id = $1")
                .bind(message_id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The order floor of `subject`: every message below it is settled (0 when none is).
    pub async fn order_floor(&self, stream: &str, subject: &str) -> Result<u64, StoreError> {
        let floor: Option<i64> = sqlx::query_scalar(
            "SELECT next_seq FROM order_floors WHERE stream = $1 AND subject = $2",
        )
        .bind(stream)
        .bind(subject)
        .fetch_optional(&self.pool)
        .await?;
        Ok(floor.unwrap_or(0).max(0) as u64)
    }

    /// Marks every message of `subject` up to `through_seq` settled (the floor never moves back).
    pub async fn advance_order_floor(
        &self,
        stream: &str,
        subject: &str,
        through_seq: u64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO order_floors (stream, subject, next_seq) VALUES ($1, $2, $3)
             ON CONFLICT (stream, subject) DO UPDATE
                SET next_seq = GREATEST(order_floors.next_seq, EXCLUDED.next_seq), updated_at = now()",
        )
        .bind(stream)
        .bind(subject)
        .bind(through_seq.saturating_add(1) as i64)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
