//! What the chat model costs: one `llm_usage` row per paid call (tokens and USD), the price table that
//! estimates a cost the server did not report, and the `companion usage` summary by day, bot and model.
//!
//! OpenRouter reports the charge of every response in `usage.cost` (its usage-accounting docs: the old
//! request option `usage: {include: true}` is deprecated and has no effect), so the worker sends nothing
//! extra and other OpenAI-compatible servers get a plain request. A response without `cost` is priced
//! from `LLM_PRICES`; a model missing there is recorded as `unpriced` (cost NULL).

use std::{collections::BTreeMap, collections::HashMap, fmt::Write, str::FromStr};

use chrono::{NaiveDate, Utc};
use sqlx::{PgPool, Row};
use tracing::warn;

use crate::{
    character::Characters,
    config::Config,
    llm::{ChatResponse, LlmClient, Usage},
    store::{Pg, StoreError},
    tools::ToolContext,
};

/// USD per million tokens of one model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Price {
    pub prompt: f64,
    pub completion: f64,
}

/// Prices by model, from `LLM_PRICES` (`model=prompt:completion,…`, USD per million tokens).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prices(BTreeMap<String, Price>);

#[derive(Debug, thiserror::Error)]
#[error("price `{entry}` is not `model=prompt:completion` (USD per million tokens, both ≥ 0)")]
pub struct PriceError {
    entry: String,
}

impl std::fmt::Display for Prices {
    /// The `LLM_PRICES` form, which `FromStr` reads back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (model, p)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{model}={}:{}", p.prompt, p.completion)?;
        }
        Ok(())
    }
}

impl FromStr for Prices {
    type Err = PriceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = BTreeMap::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = || PriceError {
                entry: entry.to_owned(),
            };
            // Model names contain `:` (`…:free`), so the price is after the last `=`.
            let (model, price) = entry.rsplit_once('=').ok_or_else(bad)?;
            let (p, c) = price.split_once(':').ok_or_else(bad)?;
            let num = |v: &str| {
                v.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
            };
            let (Some(prompt), Some(completion)) = (num(p), num(c)) else {
                return Err(bad());
            };
            let model = model.trim();
            if model.is_empty() {
                return Err(bad());
            }
            out.insert(model.to_owned(), Price { prompt, completion });
        }
        Ok(Self(out))
    }
}

/// Where a call's cost comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CostSource {
    /// The server's `usage.cost`.
    Reported,
    /// Tokens × the price table.
    Estimated,
    /// Neither: the cost is unknown.
    Unpriced,
}

impl CostSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reported => "reported",
            Self::Estimated => "estimated",
            Self::Unpriced => "unpriced",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    pub usd: Option<f64>,
    pub source: CostSource,
}

impl Prices {
    /// The cost of one response with `usage`, answered by `model`.
    pub fn cost(&self, model: &str, usage: &Usage) -> Cost {
        if let Some(c) = usage.cost.filter(|c| c.is_finite() && *c >= 0.0) {
            return Cost {
                usd: Some(c),
                source: CostSource::Reported,
            };
        }
        match self.0.get(model) {
            Some(p) => Cost {
                usd: Some(
                    (usage.prompt_tokens as f64 * p.prompt
                        + usage.completion_tokens as f64 * p.completion)
                        / 1e6,
                ),
                source: CostSource::Estimated,
            },
            None => Cost {
                usd: None,
                source: CostSource::Unpriced,
            },
        }
    }
}

/// Records the paid response of `step` of the turn in `ctx`. A failure is logged, never returned: the
/// reply matters more than its bookkeeping.
pub async fn record_paid_call(
    llm: &LlmClient,
    ctx: &ToolContext,
    step: i32,
    response: &ChatResponse,
) {
    let usage = response.usage.clone().unwrap_or_default();
    let model = response.model.as_deref().unwrap_or("unknown");
    let cost = llm.prices.cost(model, &usage);
    let result = sqlx::query(
        "INSERT INTO llm_usage (message_id, step, user_id, bot_id, model, prompt_tokens,
                                completion_tokens, cost_usd, cost_source)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(ctx.message_id.to_hex())
    .bind(step)
    .bind(ctx.user.to_hex())
    .bind(ctx.bot.to_hex())
    .bind(model)
    .bind(usage.prompt_tokens.min(i64::MAX as u64) as i64)
    .bind(usage.completion_tokens.min(i64::MAX as u64) as i64)
    .bind(cost.usd)
    .bind(cost.source.as_str())
    .execute(&ctx.pg.pool)
    .await;
    if let Err(e) = result {
        warn!(error = %e, step, model, "LLM usage not recorded; the turn goes on");
    }
}

/// One line of the summary.
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryRow {
    pub day: NaiveDate,
    pub bot_id: String,
    pub model: String,
    pub calls: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
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
        "SELECT (created_at AT TIME ZONE 'UTC')::date AS day, bot_id, model,
                count(*) AS calls,
                sum(prompt_tokens)::bigint AS prompt_tokens,
                sum(completion_tokens)::bigint AS completion_tokens,
                coalesce(sum(cost_usd), 0)::float8 AS cost_usd,
                count(*) FILTER (WHERE cost_usd IS NULL) AS unpriced
         FROM llm_usage WHERE created_at >= $1
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
        "LLM usage, last {days} day(s) (UTC)\n{:<10}  {:<bot_w$}  {:<model_w$}  {:>6}  {:>12}  {:>12}  {:>12}",
        "day", "bot", "model", "calls", "prompt tok", "complet. tok", "cost USD"
    );
    let (mut calls, mut prompt, mut completion, mut cost, mut unpriced) = (0, 0, 0, 0.0, 0);
    for r in rows {
        let _ = writeln!(
            out,
            "{:<10}  {:<bot_w$}  {:<model_w$}  {:>6}  {:>12}  {:>12}  {:>12}{}",
            r.day.to_string(),
            bot(&r.bot_id),
            r.model,
            r.calls,
            r.prompt_tokens,
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
        completion += r.completion_tokens;
        cost += r.cost_usd;
        unpriced += r.unpriced;
    }
    let _ = writeln!(
        out,
        "{:<10}  {:<bot_w$}  {:<model_w$}  {:>6}  {:>12}  {:>12}  {:>12}{}",
        "total",
        "",
        "",
        calls,
        prompt,
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
pub async fn report(config: &Config, days: u32) -> Result<String, StoreError> {
    let pg = Pg::connect(config).await?;
    let rows = summary(&pg.pool, days).await?;
    let names = Characters::load(&config.characters_dir)
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

    fn usage(prompt: u64, completion: u64, cost: Option<f64>) -> Usage {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            cost,
        }
    }

    #[test]
    fn prices_parse_and_price_calls() {
        let p: Prices = "google/gemini-2.0-flash-001=0.10:0.40, meta/llama:free=0:0"
            .parse()
            .unwrap();
        let c = p.cost(
            "google/gemini-2.0-flash-001",
            &usage(1_000_000, 500_000, None),
        );
        assert_eq!(c.source, CostSource::Estimated);
        assert!((c.usd.unwrap() - 0.30).abs() < 1e-12);
        assert_eq!(
            p.cost("meta/llama:free", &usage(10, 10, None)).usd,
            Some(0.0)
        );
        let reported = p.cost("google/gemini-2.0-flash-001", &usage(1, 1, Some(0.5)));
        assert_eq!(reported.source, CostSource::Reported);
        assert_eq!(reported.usd, Some(0.5));
        let unknown = p.cost("other/model", &usage(10, 10, None));
        assert_eq!(unknown.source, CostSource::Unpriced);
        assert_eq!(unknown.usd, None);
        assert_eq!("".parse::<Prices>().unwrap(), Prices::default());
        for bad in ["m", "m=1", "m=a:b", "=1:2", "m=-1:2", "m=1:NaN"] {
            assert!(bad.parse::<Prices>().is_err(), "{bad}");
        }
    }

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
        assert!(total.contains("1 unpriced"), "{text}");
    }
}
