//! What the model cost, read from the journal: every paid call is an `llm` step whose record
//! ([`LlmRecord`]) carries its usage and cost ([`CallUsage`]), under the tally of the user it was made
//! for (step `llm`, [`super::names::step::LLM`], which the SQL here names literally, as the partial
//! index on those steps does). This module writes that record's shape and is the only one that reads it back: the spend
//! budgets (`companion_tools::spend`) and `companion usage` (the worker's `usage`) ask here, and
//! `companion explain` decodes it (with the latency, finish reason and tools offered it keeps).

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::Row;

use crate::llm::{AssistantMessage, CallUsage, ChatRequest, ChatResponse, LlmClient, LlmError};
use companion_store::store::Pool;

/// The `llm` step: one answer of the model and what that call used.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlmRecord {
    pub message: AssistantMessage,
    pub usage: Option<CallUsage>,
    /// The companion the call spoke as, when its job has several (a group message); else the job's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bot: Option<String>,
    /// Whether the call offered tools (a request without them must end in text, and a tool call in its
    /// answer is not run).
    #[serde(default = "offered", rename = "tools")]
    pub offered_tools: bool,
    /// The tools offered, by name (none: recorded before they were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offered: Option<Vec<String>>,
    /// Why the model stopped, as the provider said (`stop`, `tool_calls`, `length`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish: Option<String>,
    /// How long the call took, retries and fallbacks included, in milliseconds (set by the caller
    /// that timed it; none: not timed, or recorded before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms: Option<u64>,
}

fn offered() -> bool {
    true
}

impl LlmRecord {
    /// The record of `response` to `request`: the first choice's message and the call's usage (priced
    /// for the model that answered, with the cacheable prefix), spoken as `bot`. A request without tools
    /// must end in text: an empty answer to one is an error, so the call is made again.
    pub fn answer(
        llm: &LlmClient,
        request: &ChatRequest,
        response: ChatResponse,
        bot: Option<String>,
    ) -> Result<Self, LlmError> {
        let offered_tools = !request.tools.is_empty();
        let model = response
            .model
            .clone()
            .unwrap_or_else(|| request.model.clone());
        let mut usage = llm
            .prices
            .call_usage(&model, &response.usage.clone().unwrap_or_default());
        usage.prefix_tokens = Some(request.prefix_tokens());
        if response.provider.as_deref() == Some(crate::llm::SCRIPTED_PROVIDER) {
            usage.scripted = true;
            usage.cost_usd = None;
            usage.cost_source = crate::llm::prices::CostSource::Unpriced;
        }
        let (message, finish) = response
            .choices
            .into_iter()
            .next()
            .map(|c| (c.message, c.finish_reason))
            .ok_or(LlmError::NoChoice)?;
        if !offered_tools
            && message
                .content
                .as_deref()
                .is_none_or(|c| c.trim().is_empty())
        {
            return Err(LlmError::EmptyAnswer);
        }
        Ok(Self {
            message,
            usage: Some(usage),
            bot,
            offered_tools,
            offered: Some(
                request
                    .tools
                    .iter()
                    .map(|t| t.function.name.clone())
                    .collect(),
            ),
            finish,
            ms: None,
        })
    }
}

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

/// [`spent`]'s read under one tally as a ride of another statement (`store::pg::Rides`): the tally and
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
pub struct UserRow {
    pub user_id: String,
    pub calls: i64,
    pub tokens: i64,
    pub cost_usd: f64,
    pub unpriced: i64,
}

/// The `n` users whose model calls cost most in the last `days` UTC days (then by tokens).
pub async fn top_users(pool: &Pool, days: u32, n: u32) -> Result<Vec<UserRow>, sqlx::Error> {
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
