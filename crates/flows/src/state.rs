//! Where a user stands in a flow (`flow_states`, one row per user and companion). Every change is a step
//! of the journal ([`change`]: step `flow_change`, keyed by the tool call that made it or by the event a
//! waiting step waited for), written in the transaction that records the step: a retried turn or a
//! redelivered event gets the recorded result and never moves a flow twice.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::{Map, Value};
use sqlx::{PgConnection, Row, postgres::PgRow};

use crate::store::Pool;
use crate::{
    journal::{Job, JournalError, StepKind},
    store::StoreError,
};

/// A flow's status.
pub mod status {
    /// The companion is working through a step with the user.
    pub const ACTIVE: &str = "active";
    /// A step waits for an event (`waiting_for`).
    pub const WAITING: &str = "waiting";
    /// The user paused it; `start_flow` with the same flow resumes it.
    pub const PAUSED: &str = "paused";
    pub(crate) const DONE: &str = "done";
    /// The user left it.
    pub const LEFT: &str = "left";
    /// Idle too long; the companion may mention it once.
    pub(crate) const EXPIRED: &str = "expired";

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

/// A change to the user's guided flow ([`change`]): by a tool call (keyed by the call) or by the event a
/// waiting step waited for (key [`crate::journal::names::key::EVENT`]), written in the transaction that
/// records it. Its record's refusal is the changer's type `E`.
pub(crate) const fn flow_change<E>() -> StepKind<Applied<E>> {
    StepKind::new("flow_change")
}

/// [`flow_change`], its refusal read as JSON (for a reader that does not know the changer).
pub const FLOW_CHANGE: StepKind<Applied<Value>> = flow_change();

/// What a change did (the `flow_change` step's record).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Applied<E> {
    /// Changed now (or by an earlier attempt of the same step): the flow as it stands.
    Changed(Option<FlowState>),
    /// Nothing to change: the flow as it stands.
    Unchanged(Option<FlowState>),
    /// The change was refused, with why (for the model); nothing changed.
    Refused(E),
}

/// [`load`]'s read as a ride of the history's statement (`store::Rides`: `$1` the user, `$2` the
/// bot): the row as jsonb, or null; [`ridden`] reads its value.
pub const RIDE: &str =
    "(SELECT to_jsonb(f) FROM (SELECT flow, step, slots, status, waiting_for, updated_at
     FROM flow_states WHERE user_id = $1 AND bot_id = $2) f)";

/// What [`RIDE`] read.
pub fn ridden(value: Value) -> Result<Option<FlowState>, StoreError> {
    serde_json::from_value(value).map_err(|e| StoreError::Pg(sqlx::Error::Decode(Box::new(e))))
}

/// The user's flow with the companion, if any: [`RIDE`]'s read in a statement of its own.
pub(crate) async fn load(
    pool: &Pool,
    user: &str,
    bot: &str,
) -> Result<Option<FlowState>, StoreError> {
    let row: Option<Value> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {RIDE}")))
        .bind(user)
        .bind(bot)
        .fetch_one(pool)
        .await?;
    ridden(row.unwrap_or(Value::Null))
}

/// Applies `change` to the user's flow with the companion as step `flow_change`/`key` of `job`: under the
/// row's lock, `change` gets the flow as it stands and returns the new one (`None` leaves the row as it
/// is), or a refusal. The row and the step's record commit together; a step already recorded returns its
/// record and changes nothing.
pub async fn change<E>(
    job: &Job,
    key: &str,
    user: &str,
    bot: &str,
    change: impl FnOnce(Option<&FlowState>) -> Result<Option<FlowState>, E>,
) -> Result<Applied<E>, JournalError>
where
    E: Serialize + DeserializeOwned,
{
    job.step(&flow_change(), key)
        .run_in_tx(|mut tx| async move {
            let applied = apply(&mut tx, user, bot, change).await;
            (tx, applied.map_err(JournalError::from))
        })
        .await
}

async fn apply<E>(
    tx: &mut PgConnection,
    user: &str,
    bot: &str,
    change: impl FnOnce(Option<&FlowState>) -> Result<Option<FlowState>, E>,
) -> Result<Applied<E>, StoreError> {
    // The row may not exist yet: serialize on the pair all the same.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || ':' || $2, 7))")
        .bind(user)
        .bind(bot)
        .execute(&mut *tx)
        .await?;
    let row = sqlx::query(
        "SELECT flow, step, slots, status, waiting_for, updated_at
         FROM flow_states WHERE user_id = $1 AND bot_id = $2",
    )
    .bind(user)
    .bind(bot)
    .fetch_optional(&mut *tx)
    .await?;
    let current = row.as_ref().map(state_of);
    let next = match change(current.as_ref()) {
        Ok(n) => n,
        Err(e) => return Ok(Applied::Refused(e)),
    };
    let Some(next) = next else {
        return Ok(Applied::Unchanged(current));
    };
    let row = sqlx::query(
        "INSERT INTO flow_states (user_id, bot_id, flow, step, slots, status, waiting_for)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (user_id, bot_id) DO UPDATE SET
            flow = EXCLUDED.flow, step = EXCLUDED.step, slots = EXCLUDED.slots,
            status = EXCLUDED.status, waiting_for = EXCLUDED.waiting_for, updated_at = now()
         RETURNING flow, step, slots, status, waiting_for, updated_at",
    )
    .bind(user)
    .bind(bot)
    .bind(&next.flow)
    .bind(&next.step)
    .bind(Value::Object(next.slots.clone()))
    .bind(&next.status)
    .bind(&next.waiting_for)
    .fetch_one(&mut *tx)
    .await?;
    Ok(Applied::Changed(Some(state_of(&row))))
}

/// Ends the user's open flow with the companion when it was last changed before `idle_since`; whether
/// this call ended it.
pub(crate) async fn expire_idle(
    pool: &Pool,
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
