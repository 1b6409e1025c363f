//! Reminders a companion promised (`reminders`): what the user asked for and where it stands. The timer
//! is not here but in NATS (a message schedule, [`crate::bus::Bus::schedule_at`]); this table answers
//! "what is pending" (the prompt, with the history: [`Pg::history`]; the per-user bound) and "was it
//! cancelled" (when it fires).

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::{Pg, StoreError};

/// A reminder's row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reminder {
    pub id: String,
    pub user_id: String,
    pub bot_id: String,
    pub conversation_id: String,
    pub text: String,
    /// The time the user asked for.
    pub due_at: DateTime<Utc>,
    /// When it fires: `due_at`, or held to the morning out of the user's quiet hours.
    pub fire_at: DateTime<Utc>,
    pub state: ReminderState,
}

/// What the prompt shows of a pending reminder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingReminder {
    pub id: String,
    pub text: String,
    pub fire_at: DateTime<Utc>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReminderState {
    Pending,
    Cancelled,
    Sent,
    Dropped,
}

impl ReminderState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Cancelled => "cancelled",
            Self::Sent => "sent",
            Self::Dropped => "dropped",
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "cancelled" => Self::Cancelled,
            "sent" => Self::Sent,
            "dropped" => Self::Dropped,
            _ => Self::Pending,
        }
    }
}

const COLUMNS: &str = "id, user_id, bot_id, conversation_id, text, due_at, fire_at, state";

fn reminder(r: sqlx::postgres::PgRow) -> Reminder {
    Reminder {
        id: r.get("id"),
        user_id: r.get("user_id"),
        bot_id: r.get("bot_id"),
        conversation_id: r.get("conversation_id"),
        text: r.get("text"),
        due_at: r.get("due_at"),
        fire_at: r.get("fire_at"),
        state: ReminderState::parse(r.get("state")),
    }
}

impl Pg {
    /// Stores a reminder; one with the same id (a retried tool call) is left as it is. The stored row.
    pub async fn insert_reminder(&self, r: &Reminder) -> Result<Reminder, StoreError> {
        let sql = format!(
            "WITH ins AS (
                INSERT INTO reminders (id, user_id, bot_id, conversation_id, text, due_at, fire_at)
                VALUES ($1, $2, $3, $4, $5, $6, $7)
                ON CONFLICT (id) DO NOTHING
                RETURNING {COLUMNS})
             SELECT {COLUMNS} FROM ins
             UNION ALL SELECT {COLUMNS} FROM reminders WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM ins)"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&r.id)
            .bind(&r.user_id)
            .bind(&r.bot_id)
            .bind(&r.conversation_id)
            .bind(&r.text)
            .bind(r.due_at)
            .bind(r.fire_at)
            .fetch_one(&self.pool)
            .await?;
        Ok(reminder(row))
    }

    pub async fn reminder(&self, id: &str) -> Result<Option<Reminder>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM reminders WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(reminder))
    }

    /// How many reminders the user has pending, with every companion.
    pub async fn pending_reminders(&self, user_id: &str) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM reminders WHERE user_id = $1 AND state = 'pending'",
        )
        .bind(user_id)
        .fetch_one(&self.pool)
        .await?)
    }

    /// Moves a reminder from `from` to `to`; whether it was in `from`.
    pub async fn move_reminder(
        &self,
        id: &str,
        user_id: Option<&str>,
        from: ReminderState,
        to: ReminderState,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE reminders SET state = $4, updated_at = now()
             WHERE id = $1 AND ($2::text IS NULL OR user_id = $2) AND state = $3",
        )
        .bind(id)
        .bind(user_id)
        .bind(from.as_str())
        .bind(to.as_str())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }
}
