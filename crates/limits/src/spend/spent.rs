//! What the model answers cost in a window, read from the journal's `llm` steps: their records
//! ([`companion_llm::record::LlmRecord`]) carry usage and cost under the tally of the user they were made
//! for. The SQL names the step `llm` literally, as the partial index on those steps does.

use serde_json::Value;
use sqlx::Row;

use crate::llm::CallUsage;
use crate::store::Pool;

/// Tokens (prompt + completion) and USD spent in a window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spent {
    pub tokens: u64,
    pub usd: f64,
}

impl Spent {
    /// What [`SPENT_RIDE`] read; none when the value is not its shape.
    pub fn ridden(value: &Value) -> Option<Self> {
        let tokens = value.get(0)?.as_i64()?;
        let usd = value.get(1)?.as_f64()?;
        Some(Self {
            tokens: tokens.max(0) as u64,
            usd,
        })
    }

    /// What one call adds, counted as [`spent`] counts its record.
    pub fn of(usage: &CallUsage) -> Self {
        Self {
            tokens: usage.prompt_tokens + usage.completion_tokens,
            usd: usage.cost_usd.unwrap_or(0.0),
        }
    }
}

impl std::ops::Add for Spent {
    type Output = Spent;

    fn add(self, other: Spent) -> Spent {
        Spent {
            tokens: self.tokens + other.tokens,
            usd: self.usd + other.usd,
        }
    }
}

/// Tokens (prompt + completion) and USD of the model answers a query selects from `job_steps`: two SQL
/// columns, `tokens` and `usd`.
macro_rules! spent_sums {
    () => {
        "coalesce(sum(coalesce((output -> 'usage' ->> 'promptTokens')::bigint, 0)
                    + coalesce((output -> 'usage' ->> 'completionTokens')::bigint, 0)), 0)::bigint
              AS tokens,
         coalesce(sum((output -> 'usage' ->> 'costUsd')::float8), 0)::float8 AS usd"
    };
}

/// [`spent`]'s read under one tally as a ride of another statement (`store::Rides`): the tally and
/// the window (seconds) are its arguments `spend_tally` and `spend_window`; [`Spent::ridden`] reads its
/// value.
pub const SPENT_RIDE: &str = concat!(
    "(SELECT jsonb_build_array(tokens, usd) FROM (SELECT ",
    spent_sums!(),
    " FROM job_steps
       WHERE created_at > now() - make_interval(secs => ($4::jsonb ->> 'spend_window')::float8)
         AND tally = $4::jsonb ->> 'spend_tally') s)"
);

/// [`SPENT_RIDE`]'s arguments.
pub fn spent_ride_args(tally: &str, window_secs: f64) -> serde_json::Map<String, Value> {
    let mut args = serde_json::Map::new();
    args.insert("spend_tally".into(), tally.into());
    args.insert("spend_window".into(), window_secs.into());
    args
}

/// Tokens and USD of the model answers in the last `window_secs`: under `tally` (one user's), or all.
pub async fn spent(
    pool: &Pool,
    tally: Option<&str>,
    window_secs: f64,
) -> Result<Spent, sqlx::Error> {
    // Two statements, so that each uses its own index (by tally; the model calls by time).
    macro_rules! spent_where {
        ($filter:literal) => {
            concat!(
                "SELECT ",
                spent_sums!(),
                " FROM job_steps WHERE created_at > now() - make_interval(secs => $1) AND ",
                $filter
            )
        };
    }
    let row = match tally {
        Some(t) => {
            sqlx::query(spent_where!("tally = $2"))
                .bind(window_secs)
                .bind(t)
                .fetch_one(pool)
                .await?
        }
        None => {
            sqlx::query(spent_where!("name = 'llm'"))
                .bind(window_secs)
                .fetch_one(pool)
                .await?
        }
    };
    Ok(Spent {
        tokens: row.get::<i64, _>("tokens").max(0) as u64,
        usd: row.get("usd"),
    })
}
