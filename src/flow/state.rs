//! Where a user stands in a flow (`flow_states`, one row per user and companion). Every change is
//! keyed: by the tool call that made it, or by the event a waiting step was waiting for. A key already in
//! the row's `applied` list changes nothing, so a retried turn or a redelivered event never moves a flow
//! twice.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sqlx::{PgPool, Row, postgres::PgRow};

use crate::store::StoreError;

/// Keys kept in `applied` (the newest).
const APPLIED_KEPT: i32 = 50;

/// A flow's status.
pub mod status {
    /// The companion is working through a step with the user.
    pub const ACTIVE: &str = "active";
    /// A step waits for an event (`waiting_for`).
    pub const WAITING: &str = "waiting";
    /// The user paused it; `start_flow` with the same flow resumes it.
    pub const PAUSED: &str = "paused";
    pub const DONE: &str = "done";
    /// The user left it.
    pub const LEFT: &str = "left";
    /// Idle too long; the companion may mention it once.
    pub const EXPIRED: &str = "expired";

    /// Still counts as the user's flow with this companion.
    pub fn is_open(s: &str) -> bool {
        matches!(s, ACTIVE | WAITING | PAUSED)
    }
}

/// A user's flow with a companion.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlowState {
    pub flow: String,
    pub step: String,
    pub slots: Map<String, Value>,
    pub status: String,
    /// `<kind>:<id>` of the event a waiting step waits for.
    pub waiting_for: Option<String>,
    pub updated_at: DateTime<Utc>,
}

fn state_of(r: &PgRow) -> FlowState {
    let slots = match r.get::<Value, _>("slots") {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    FlowState {
        flow: r.get("flow"),
        step: r.get("step"),
        slots,
        status: r.get("status"),
        waiting_for: r.get("waiting_for"),
        updated_at: r.get("updated_at"),
    }
}

/// What a keyed change did.
#[derive(Clone, Debug, PartialEq)]
pub enum Applied<E> {
    /// Changed now (or by an earlier attempt with the same key): the flow as it stands.
    Changed(Option<FlowState>),
    /// Nothing to change: the flow as it stands.
    Unchanged(Option<FlowState>),
    /// The change was refused, with why (for the model); nothing changed.
    Refused(E),
}

/// The user's flow with the companion, if any.
pub async fn load(pool: &PgPool, user: &str, bot: &str) -> Result<Option<FlowState>, StoreError> {
    let row = sqlx::query(
        "SELECT flow, step, slots, status, waiting_for, updated_at FROM flow_states
         WHERE user_id = $1 AND bot_id = $2",
    )
    .bind(user)
    .bind(bot)
    .fetch_optional(pool)
    .await?;
    Ok(row.as_ref().map(state_of))
}

/// Applies `change` to the user's flow with the companion once per `key`, under the row's lock: `change`
/// gets the flow as it stands and returns the new one (`None` leaves the row as it is), or a refusal.
pub async fn apply<E>(
    pool: &PgPool,
    user: &str,
    bot: &str,
    key: &str,
    change: impl FnOnce(Option<&FlowState>) -> Result<Option<FlowState>, E>,
) -> Result<Applied<E>, StoreError> {
    let mut tx = pool.begin().await?;
    // The row may not exist yet: serialize on the pair all the same.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || ':' || $2, 7))")
        .bind(user)
        .bind(bot)
        .execute(&mut *tx)
        .await?;
    let row = sqlx::query(
        "SELECT flow, step, slots, status, waiting_for, updated_at, $3 = ANY(applied) AS done
         FROM flow_states WHERE user_id = $1 AND bot_id = $2",
    )
    .bind(user)
    .bind(bot)
    .bind(key)
    .fetch_optional(&mut *tx)
    .await?;
    let current = row.as_ref().map(state_of);
    if row.as_ref().is_some_and(|r| r.get::<bool, _>("done")) {
        return Ok(Applied::Changed(current));
    }
    let next = match change(current.as_ref()) {
        Ok(n) => n,
        Err(e) => return Ok(Applied::Refused(e)),
    };
    let Some(next) = next else {
        return Ok(Applied::Unchanged(current));
    };
    let row = sqlx::query(
        "INSERT INTO flow_states (user_id, bot_id, flow, step, slots, status, waiting_for, applied)
         VALUES ($1, $2, $3, $4, $5, $6, $7, ARRAY[$8])
         ON CONFLICT (user_id, bot_id) DO UPDATE SET
            flow = EXCLUDED.flow, step = EXCLUDED.step, slots = EXCLUDED.slots,
            status = EXCLUDED.status, waiting_for = EXCLUDED.waiting_for, updated_at = now(),
            applied = (flow_states.applied || ARRAY[$8])[greatest(1, cardinality(flow_states.applied) + 2 - $9):]
         RETURNING flow, step, slots, status, waiting_for, updated_at",
    )
    .bind(user)
    .bind(bot)
    .bind(&next.flow)
    .bind(&next.step)
    .bind(Value::Object(next.slots.clone()))
    .bind(&next.status)
    .bind(&next.waiting_for)
    .bind(key)
    .bind(APPLIED_KEPT)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Applied::Changed(Some(state_of(&row))))
}

/// Ends the user's open flow with the companion when it was last changed before `idle_since`; whether
/// this call ended it.
pub async fn expire_idle(
    pool: &PgPool,
    user: &str,
    bot: &str,
    idle_since: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE flow_states SET status = 'expired', waiting_for = NULL, updated_at = now()
         WHERE user_id = $1 AND bot_id = $2 AND status IN ('active', 'waiting', 'paused')
           AND updated_at < $3",
    )
    .bind(user)
    .bind(bot)
    .bind(idle_since)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}
