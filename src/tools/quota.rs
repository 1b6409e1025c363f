//! The durable write quota: at most N tool writes per user per rolling hour, across every worker.
//!
//! PostgreSQL is the arbiter: a transaction takes `pg_advisory_xact_lock(hashtext(user_id))`, counts the
//! user's rows of the last hour in `tool_writes` and inserts one for this (event message, tool call).
//! Workers serialize per user on the lock, so no two can both see "4 of 5" and both write. A call already
//! recorded (a retry) is let through without counting again.

use chrono::{DateTime, Duration, Utc};
use sqlx::Row;

use crate::store::{Pg, StoreError};

/// The answer of [`reserve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reservation {
    /// Counted now.
    Granted,
    /// This call was counted before (a retry); nothing new is counted.
    AlreadyCounted,
    /// The user has used the quota; the oldest write of the window leaves it in this many seconds.
    Exceeded { retry_after_secs: i64 },
}

/// Counts one write for `user_id` unless the last hour already holds `limit`.
pub async fn reserve(
    pg: &Pg,
    user_id: &str,
    message_id: &str,
    tool_call_id: &str,
    tool: &str,
    now: DateTime<Utc>,
    limit: u32,
) -> Result<Reservation, StoreError> {
    let mut tx = pg.pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(user_id)
        .execute(&mut *tx)
        .await?;
    let seen = sqlx::query("SELECT 1 FROM tool_writes WHERE message_id = $1 AND tool_call_id = $2")
        .bind(message_id)
        .bind(tool_call_id)
        .fetch_optional(&mut *tx)
        .await?;
    if seen.is_some() {
        tx.commit().await?;
        return Ok(Reservation::AlreadyCounted);
    }
    let since = now - Duration::hours(1);
    let row = sqlx::query(
        "SELECT count(*) AS n, min(created_at) AS oldest FROM tool_writes
         WHERE user_id = $1 AND created_at > $2",
    )
    .bind(user_id)
    .bind(since)
    .fetch_one(&mut *tx)
    .await?;
    let used: i64 = row.get("n");
    if used >= i64::from(limit) {
        let oldest: Option<DateTime<Utc>> = row.get("oldest");
        let retry_after_secs = oldest
            .map(|o| (o + Duration::hours(1) - now).num_seconds().max(1))
            .unwrap_or(3600);
        tx.commit().await?;
        return Ok(Reservation::Exceeded { retry_after_secs });
    }
    sqlx::query(
        "INSERT INTO tool_writes (message_id, tool_call_id, user_id, tool, created_at)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(message_id)
    .bind(tool_call_id)
    .bind(user_id)
    .bind(tool)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Reservation::Granted)
}
