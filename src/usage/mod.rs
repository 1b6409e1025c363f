//! `companion usage`: what the chat model cost, by day, companion and model (`--user`: one user's), or
//! the heaviest users (`--top N`). Every paid call is an `llm` step of a job's journal, recorded with its
//! usage and cost and read back by [`read`]; a response replayed from the journal is
//! not paid again and is counted once.

use std::{collections::HashMap, fmt::Write, path::Path};

mod read;

use crate::{
    character::Characters,
    config::PgConfig,
    store::{Pg, StoreError},
};
pub use read::summary;
pub(crate) use read::{SummaryRow, UserRow, top_users};

/// The heaviest users as a table, heaviest first.
pub(crate) fn render_top(rows: &[UserRow], days: u32) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Heaviest users, last {days} day(s) (UTC)\n{:<24}  {:>6}  {:>12}  {:>12}",
        "user", "calls", "tokens", "cost USD"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<24}  {:>6}  {:>12}  {:>12}{}",
            r.user_id,
            r.calls,
            r.tokens,
            format!("{:.6}", r.cost_usd),
            if r.unpriced > 0 {
                format!("  ({} unpriced)", r.unpriced)
            } else {
                String::new()
            }
        );
    }
    out
}

/// The summary as a table with a total line, then what a turn's prompts come to: tokens over all its
/// calls, the cacheable prefix, the cached part, and the billed-equivalent (uncached + cached ×
/// `cached_price_ratio`, the provider's cached-read price over its input price). Bots by character name
/// where `names` knows them.
pub(crate) fn render(
    rows: &[SummaryRow],
    names: &HashMap<String, String>,
    days: u32,
    cached_price_ratio: f64,
) -> String {
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
    let (mut calls, mut prompt, mut cached, mut completion, mut cost) = (0, 0, 0, 0, 0.0);
    let (mut unpriced, mut estimated, mut turns, mut prefix) = (0, 0, 0, 0);
    for r in rows {
        turns += r.turns;
        prefix += r.prefix_tokens;
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
            notes(r.unpriced, r.estimated, "")
        );
        calls += r.calls;
        prompt += r.prompt_tokens;
        cached += r.cached_tokens;
        completion += r.completion_tokens;
        cost += r.cost_usd;
        unpriced += r.unpriced;
        estimated += r.estimated;
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
        notes(unpriced, estimated, ": set LLM_PRICES")
    );
    if turns > 0 {
        let per = |x: f64| x / turns as f64;
        let billed = (prompt - cached) as f64 + cached as f64 * cached_price_ratio;
        let _ = writeln!(
            out,
            "per turn ({turns} turns, all calls): prompt {:.0} tok, cacheable prefix (est.) {:.0}, cached {:.0}, billed-equivalent {:.0} (cached × {cached_price_ratio})",
            per(prompt as f64),
            per(prefix as f64),
            per(cached as f64),
            per(billed),
        );
    }
    out
}

/// What a cost figure leaves out or guesses: calls without a price, calls priced from `LLM_PRICES`
/// because the provider reported no cost.
fn notes(unpriced: i64, estimated: i64, hint: &str) -> String {
    let mut parts = Vec::new();
    if estimated > 0 {
        parts.push(format!("{estimated} estimated from LLM_PRICES"));
    }
    if unpriced > 0 {
        parts.push(format!("{unpriced} unpriced{hint}"));
    }
    match parts.is_empty() {
        true => String::new(),
        false => format!("  ({})", parts.join("; ")),
    }
}

/// What `companion usage` shows.
#[derive(Clone, Copy, Debug, Default)]
pub struct Query<'a> {
    /// Days covered, today included; default 7 for the summary, 1 (today) for `top`.
    pub days: Option<u32>,
    /// Only this user's calls.
    pub user: Option<&'a str>,
    /// The heaviest users instead of the summary.
    pub top: Option<u32>,
    /// A cached prompt token's price over an uncached one's, for the billed-equivalent tokens.
    pub cached_price_ratio: f64,
}

/// The companions' names by bot id (hex), from the character files (none when they do not load).
pub(crate) fn bot_names(characters_dir: &Path) -> HashMap<String, String> {
    Characters::load(characters_dir)
        .map(|c| {
            c.iter()
                .map(|(id, c)| (id.to_hex(), c.name.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// `companion usage`: the summary of the configured database, bots named from the character files.
pub async fn report(
    pg: &PgConfig,
    characters_dir: &Path,
    query: Query<'_>,
) -> Result<String, StoreError> {
    let pg = Pg::connect(pg).await?;
    if let Some(n) = query.top {
        let days = query.days.unwrap_or(1);
        return Ok(render_top(&top_users(&pg.pool, days, n).await?, days));
    }
    let days = query.days.unwrap_or(7);
    let rows = summary(&pg.pool, days, query.user).await?;
    let names = bot_names(characters_dir);
    let mut text = render(&rows, &names, days, query.cached_price_ratio);
    if let Some(user) = query.user {
        text = format!("user {user}: {text}");
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;

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
                turns: 1,
                prefix_tokens: 70,
                completion_tokens: 10,
                cost_usd: 0.25,
                unpriced: 0,
                estimated: 2,
            },
            SummaryRow {
                day,
                bot_id: "b2".into(),
                model: "m".into(),
                calls: 1,
                prompt_tokens: 50,
                cached_tokens: 0,
                turns: 1,
                prefix_tokens: 30,
                completion_tokens: 5,
                cost_usd: 0.0,
                unpriced: 1,
                estimated: 0,
            },
        ];
        let names = HashMap::from([("b1".to_owned(), "Kaori".to_owned())]);
        let text = render(&rows, &names, 7, 0.25);
        assert!(text.contains("2026-11-22  Kaori"), "{text}");
        assert!(text.contains("2026-11-22  b2"), "{text}");
        let per_turn = text.lines().last().unwrap();
        assert!(
            per_turn.contains("2 turns")
                && per_turn.contains("prompt 75 tok")
                && per_turn.contains("prefix (est.) 50")
                && per_turn.contains("cached 40")
                && per_turn.contains("billed-equivalent 45"),
            "(150 - 80 + 80 × 0.25) / 2 = 45: {per_turn}"
        );
        let total = text.lines().find(|l| l.starts_with("total")).unwrap();
        assert!(total.starts_with("total"), "{text}");
        assert!(total.contains(" 3 ") && total.contains("150") && total.contains("0.250000"));
        assert!(total.contains(" 80 "), "cached tokens are totalled: {text}");
        assert!(total.contains("1 unpriced"), "{text}");
        assert!(
            total.contains("2 estimated from LLM_PRICES"),
            "estimated costs say so: {text}"
        );
    }
}
