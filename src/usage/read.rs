//! The usage report's reads: the journal's `llm` steps ([`companion_llm::record::LlmRecord`]), summed by
//! day, companion and model, or by user. The SQL names the step `llm` literally, as the partial index on
//! those steps does.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::Row;

use crate::store::Pool;

/// One line of the usage summary.
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryRow {
    pub day: NaiveDate,
    pub bot_id: String,
    pub model: String,
    pub calls: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    /// Prompt tokens the providers served from their prompt caches (where they report it).
    pub cached_tokens: i64,
    /// Turns (jobs) the calls were made for.
    pub turns: i64,
    /// Estimated tokens of the requests' cacheable prefix (tools and system prompt), where recorded.
    pub prefix_tokens: i64,
    /// Sum of the known costs.
    pub cost_usd: f64,
    /// Calls whose cost is unknown.
    pub unpriced: i64,
    /// Calls whose cost is estimated from the price table (the provider did not report it).
    pub estimated: i64,
}

/// Midnight (UTC) that starts the last `days` days, today included.
fn since(days: u32) -> DateTime<Utc> {
    let first = Utc::now().date_naive() - chrono::Days::new(u64::from(days.max(1)) - 1);
    first.and_hms_opt(0, 0, 0).expect("midnight").and_utc()
}

/// Paid calls of the last `days` UTC days (today included), by day, companion and model; one user's only
/// when `user` is given. A group message's calls count for the companion that spoke.
pub async fn summary(
    pool: &Pool,
    days: u32,
    user: Option<&str>,
) -> Result<Vec<SummaryRow>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT (s.created_at AT TIME ZONE 'UTC')::date AS day,
                coalesce(s.output ->> 'bot', j.bot_id, 'group') AS bot_id,
                s.output -> 'usage' ->> 'model' AS model,
                count(*) AS calls,
                coalesce(sum((s.output -> 'usage' ->> 'promptTokens')::bigint), 0)::bigint AS prompt_tokens,
                coalesce(sum((s.output -> 'usage' ->> 'completionTokens')::bigint), 0)::bigint
                    AS completion_tokens,
                coalesce(sum((s.output -> 'usage' ->> 'cachedTokens')::bigint), 0)::bigint
                    AS cached_tokens,
                count(DISTINCT s.job) AS turns,
                coalesce(sum((s.output -> 'usage' ->> 'prefixTokens')::bigint), 0)::bigint
                    AS prefix_tokens,
                coalesce(sum((s.output -> 'usage' ->> 'costUsd')::float8), 0)::float8 AS cost_usd,
                count(*) FILTER (WHERE s.output -> 'usage' ->> 'costUsd' IS NULL) AS unpriced,
                count(*) FILTER (WHERE s.output -> 'usage' ->> 'costSource' = 'estimated') AS estimated
         FROM job_steps s JOIN jobs j ON j.id = s.job
         WHERE s.name = 'llm' AND s.created_at >= $1
           AND jsonb_typeof(s.output -> 'usage') = 'object'
           AND ($2::text IS NULL OR j.user_id = $2)
         GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
    )
    .bind(since(days))
    .bind(user)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| SummaryRow {
            day: r.get("day"),
            bot_id: r.get("bot_id"),
            model: r.get("model"),
            calls: r.get("calls"),
            prompt_tokens: r.get("prompt_tokens"),
            completion_tokens: r.get("completion_tokens"),
            cached_tokens: r.get("cached_tokens"),
            turns: r.get("turns"),
            prefix_tokens: r.get("prefix_tokens"),
            cost_usd: r.get("cost_usd"),
            unpriced: r.get("unpriced"),
            estimated: r.get("estimated"),
        })
        .collect())
}

/// One user's paid calls over the period.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct UserRow {
    pub user_id: String,
    pub calls: i64,
    pub tokens: i64,
    pub cost_usd: f64,
    pub unpriced: i64,
}

/// The `n` users whose model calls cost most in the last `days` UTC days (then by tokens).
pub(crate) async fn top_users(pool: &Pool, days: u32, n: u32) -> Result<Vec<UserRow>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT j.user_id, count(*) AS calls,
                coalesce(sum((s.output -> 'usage' ->> 'promptTokens')::bigint
                           + (s.output -> 'usage' ->> 'completionTokens')::bigint), 0)::bigint AS tokens,
                coalesce(sum((s.output -> 'usage' ->> 'costUsd')::float8), 0)::float8 AS cost_usd,
                count(*) FILTER (WHERE s.output -> 'usage' ->> 'costUsd' IS NULL) AS unpriced
         FROM job_steps s JOIN jobs j ON j.id = s.job
         WHERE s.name = 'llm' AND s.created_at >= $1
           AND jsonb_typeof(s.output -> 'usage') = 'object'
         GROUP BY 1 ORDER BY cost_usd DESC, tokens DESC, 1 LIMIT $2",
    )
    .bind(since(days))
    .bind(i64::from(n.max(1)))
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| UserRow {
            user_id: r.get("user_id"),
            calls: r.get("calls"),
            tokens: r.get("tokens"),
            cost_usd: r.get("cost_usd"),
            unpriced: r.get("unpriced"),
        })
        .collect())
}
