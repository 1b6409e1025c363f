//! Reminders a companion promised (`reminders`): what the user asked for (pending, or cancelled). The
//! timer is not here but in NATS (a message schedule, [`crate::bus::Bus::schedule_at`]), and whether
//! the reminder was sent or dropped is the state of its job in the journal (`reminder:<id>`), read here
//! with the row: a reminder is pending while the user has not cancelled it and its job has not ended.
//! This table answers "what is pending" (the prompt, with the history: [`Pg::history`]; the per-user
//! bound) and "was it cancelled" (when it fires).

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::{Pg, StoreError};

/// The kind of a reminder's follow-up: its job is `reminder:<id>` (the SQL below names the prefix).
pub const KIND: &str = "reminder";

/// SQL: the row `r` is still pending (not cancelled, its follow-up's job not ended).
pub(crate) const PENDING: &str = "r.state = 'pending' AND NOT EXISTS (SELECT 1 FROM jobs j
    WHERE j.id = 'reminder:' || r.id AND j.state IN ('done', 'dropped'))";

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
    /// Where it stands: the row's pending or cancelled, or its job's sent or dropped.
    pub state: ReminderState,
}

/// What the prompt shows of a pending reminder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingReminder {
    pub id: String,
    pub text: String,
    pub fire_at: DateTime<Utc>,
}

/// Where a reminder stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReminderState {
    Pending,
    /// The user cancelled it (the row's state).
    Cancelled,
    /// Its follow-up was sent (its job is done).
    Sent,
    /// Its follow-up was not sent, on purpose (its job was dropped).
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

/// [`COLUMNS`] of the row `r`, its state as where the reminder stands.
const STANDING: &str = "r.id, r.user_id, r.bot_id, r.conversation_id, r.text, r.due_at, r.fire_at,
    CASE WHEN r.state = 'cancelled' THEN 'cancelled'
         ELSE coalesce((SELECT CASE j.state WHEN 'done' THEN 'sent' WHEN 'dropped' THEN 'dropped' END
                        FROM jobs j WHERE j.id = 'reminder:' || r.id), 'pending') END AS state";

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
             UNION ALL SELECT {STANDING} FROM reminders r WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM ins)"
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

    /// The reminder, with where it stands.
    pub async fn reminder(&self, id: &str) -> Result<Option<Reminder>, StoreError> {
        let sql = format!("SELECT {STANDING} FROM reminders r WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(reminder))
    }

    /// How many reminders the user has pending, with every companion.
    pub async fn pending_reminders(&self, user_id: &str) -> Result<i64, StoreError> {
        let sql = format!("SELECT count(*) FROM reminders r WHERE user_id = $1 AND {PENDING}");
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(user_id)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Cancels the user's reminder while it is pending; whether it was.
    pub async fn cancel_reminder(&self, id: &str, user_id: &str) -> Result<bool, StoreError> {
        let sql = format!(
            "UPDATE reminders r SET state = 'cancelled', updated_at = now()
             WHERE id = $1 AND user_id = $2 AND {PENDING}"
        );
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(user_id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }
}
