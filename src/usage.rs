//! `companion usage`: what the chat model cost, by day, companion and model. Every paid call is an `llm`
//! step of a turn's journal, recorded with its usage and cost ([`crate::llm::CallUsage`]); a response
//! replayed from the journal is not paid again and is counted once.

use std::{collections::HashMap, fmt::Write, path::Path};

use chrono::{NaiveDate, Utc};
use sqlx::{PgPool, Row};

use crate::{
    character::Characters,
    config::PgConfig,
    store::{Pg, StoreError},
};

/// One line of the summary.
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
    /// Sum of the known costs.
    pub cost_usd: f64,
    /// Calls whose cost is unknown.
    pub unpriced: i64,
}

/// Paid calls of the last `days` UTC days (today included), by day, bot and model.
pub async fn summary(pool: &PgPool, days: u32) -> Result<Vec<SummaryRow>, sqlx::Error> {
    let first = Utc::now().date_naive() - chrono::Days::new(u64::from(days.max(1)) - 1);
    let since = first.and_hms_opt(0, 0, 0).expect("midnight").and_utc();
    let rows = sqlx::query(
        "SELECT (s.created_at AT TIME ZONE 'UTC')::date AS day, j.bot_id,
                s.output -> 'usage' ->> 'model' AS model,
                count(*) AS calls,
                coalesce(sum((s.output -> 'usage' ->> 'promptTokens')::bigint), 0)::bigint AS prompt_tokens,
                coalesce(sum((s.output -> 'usage' ->> 'completionTokens')::bigint), 0)::bigint
                    AS completion_tokens,
                coalesce(sum((s.output -> 'usage' ->> 'cachedTokens')::bigint), 0)::bigint
                    AS cached_tokens,
                coalesce(sum((s.output -> 'usage' ->> 'costUsd')::float8), 0)::float8 AS cost_usd,
                count(*) FILTER (WHERE s.output -> 'usage' ->> 'costUsd' IS NULL) AS unpriced
         FROM job_steps s JOIN jobs j ON j.id = s.job
         WHERE s.name = 'llm' AND s.created_at >= $1
           AND jsonb_typeof(s.output -> 'usage') = 'object'
         GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
    )
    .bind(since)
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
            cost_usd: r.get("cost_usd"),
            unpriced: r.get("unpriced"),
        })
        .collect())
}

/// The summary as a table with a total line; bots by character name where `names` knows them.
pub fn render(rows: &[SummaryRow], names: &HashMap<String, String>, days: u32) -> String {
    let mut out = String::new();
    let bot = |id: &str| names.get(id).cloned().unwrap_or_else(|| id.to_owned());
    let bot_w = rows
        .iter()
        .map(|r| bot(&r.bot_id).chars().count())
        .chain([3])
        .max()
        .unwrap_or(3);
    let model_w = rows
        .iter()
        .map(|r| r.model.chars().count())
        .chain([5])
        .max()
        .unwrap_or(5);
    let _ = writeln!(
        out,
        "LLM usage, last {days} day(s) (UTC)\n{:<10}  {:<bot_w$}  {:<model_w$}  {:>6}  {:>12}  {:>12}  {:>12}  {:>12}",
        "day", "bot", "model", "calls", "prompt tok", "cached tok", "complet. tok", "cost USD"
    );
    let (mut calls, mut prompt, mut cached, mut completion, mut cost, mut unpriced) =
        (0, 0, 0, 0, 0.0, 0);
    for r in rows {
        let _ = writeln!(
            out,
            "{:<10}  {:<bot_w$}  {:<model_w$}  {:>6}  {:>12}  {:>12}  {:>12}  {:>12}{}",
            r.day.to_string(),
            bot(&r.bot_id),
            r.model,
            r.calls,
            r.prompt_tokens,
            r.cached_tokens,
            r.completion_tokens,
            format!("{:.6}", r.cost_usd),
            if r.unpriced > 0 {
                format!("  ({} unpriced)", r.unpriced)
            } else {
                String::new()
            }
        );
        calls += r.calls;
        prompt += r.prompt_tokens;
        cached += r.cached_tokens;
        completion += r.completion_tokens;
        cost += r.cost_usd;
        unpriced += r.unpriced;
    }
    let _ = writeln!(
        out,
        "{:<10}  {:<bot_w$}  {:<model_w$}  {:>6}  {:>12}  {:>12}  {:>12}  {:>12}{}",
        "total",
        "",
        "",
        calls,
        prompt,
        cached,
        completion,
        format!("{cost:.6}"),
        if unpriced > 0 {
            format!("  ({unpriced} unpriced: set LLM_PRICES)")
        } else {
            String::new()
        }
    );
    out
}

/// `companion usage`: the summary of the configured database, bots named from the character files.
pub async fn report(pg: &PgConfig, characters_dir: &Path, days: u32) -> Result<String, StoreError> {
    let pg = Pg::connect(pg).await?;
    let rows = summary(&pg.pool, days).await?;
    let names = Characters::load(characters_dir)
        .map(|c| {
            c.iter()
                .map(|(id, c)| (id.to_hex(), c.name.clone()))
                .collect()
        })
        .unwrap_or_default();
    Ok(render(&rows, &names, days))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_bots_and_totals() {
        let day = NaiveDate::from_ymd_opt(2026, 11, 22).unwrap();
        let rows = vec![
            SummaryRow {
                day,
                bot_id: "b1".into(),
                model: "m".into(),
                calls: 2,
                prompt_tokens: 100,
                cached_tokens: 80,
                completion_tokens: 10,
                cost_usd: 0.25,
                unpriced: 0,
            },
            SummaryRow {
                day,
                bot_id: "b2".into(),
                model: "m".into(),
                calls: 1,
                prompt_tokens: 50,
                cached_tokens: 0,
                completion_tokens: 5,
                cost_usd: 0.0,
                unpriced: 1,
            },
        ];
        let names = HashMap::from([("b1".to_owned(), "Kaori".to_owned())]);
        let text = render(&rows, &names, 7);
        assert!(text.contains("2026-11-22  Kaori"), "{text}");
        assert!(text.contains("2026-11-22  b2"), "{text}");
        let total = text.lines().last().unwrap();
        assert!(total.starts_with("total"), "{text}");
        assert!(total.contains(" 3 ") && total.contains("150") && total.contains("0.250000"));
        assert!(total.contains(" 80 "), "cached tokens are totalled: {text}");
        assert!(total.contains("1 unpriced"), "{text}");
    }
}
