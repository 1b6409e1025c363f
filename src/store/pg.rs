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
}

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
    ) -> Result<TurnRecord, StoreError> {
        let row = sqlx::query(
            "INSERT INTO turns (message_id, conversation_id, user_id, bot_id)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (message_id) DO UPDATE
                SET attempts = turns.attempts + 1, updated_at = now()
             RETURNING state, attempts, reply_id, reply_content, rich_content, reply_at,
                       CASE WHEN state = 'done' THEN updated_at END AS completed_at",
        )
        .bind(message_id)
        .bind(conversation_id)
        .bind(user_id)
        .bind(bot_id)
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
        let row = sqlx::query(
            "UPDATE turns SET
                reply_id = COALESCE(reply_id, $2),
                reply_content = CASE WHEN reply_id IS NULL THEN $3 ELSE reply_content END,
                rich_content = CASE WHEN reply_id IS NULL THEN $4 ELSE rich_content END,
                reply_at = COALESCE(reply_at, $5),
                updated_at = now()
             WHERE message_id = $1
             RETURNING state, attempts, reply_id, reply_content, rich_content, reply_at,
                       CASE WHEN state = 'done' THEN updated_at END AS completed_at",
        )
        .bind(message_id)
        .bind(reply_id)
        .bind(content)
        .bind(rich_content)
        .bind(reply_at)
        .fetch_one(&self.pool)
        .await?;
        Ok(turn_record(&row))
    }

    /// Marks the end of a turn: `done` (answered) or `failed` (dead-lettered), with the last error if any.
    pub async fn finish_turn(
        &self,
        message_id: &str,
        state: &str,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE turns SET state = $2, last_error = COALESCE($3, last_error), updated_at = now() WHERE message_id = $1")
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
    }
}
