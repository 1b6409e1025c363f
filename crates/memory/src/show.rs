//! `companion memory --user <id> [--bot <name>]`: what companions remember about a user, with sources;
//! for support staff answering "what does Kaori know about me?".

use std::{collections::BTreeMap, fmt::Write, path::Path};

use super::{Memory, MemoryError};
use crate::{
    character::Characters,
    config::{MemoryConfig, PgConfig},
    db::Pg,
};

/// The report for `user` (24-hex), with one companion (its name, slug or bot id) or all.
pub async fn report(
    pg: &PgConfig,
    config: &MemoryConfig,
    characters_dir: &Path,
    user: &str,
    bot: Option<&str>,
) -> Result<String, MemoryError> {
    if crate::bus::event::parse_object_id(user).is_none() {
        return Err(MemoryError::Invalid(format!(
            "--user `{user}` is not a 24-hex id"
        )));
    }
    let pg = Pg::connect(pg).await?;
    let names: BTreeMap<String, String> = Characters::load(characters_dir)
        .map(|c| {
            c.iter()
                .map(|(id, c)| (id.to_hex(), c.name.clone()))
                .collect()
        })
        .unwrap_or_default();
    let bot_id = match bot {
        None => None,
        Some(b) => Some(
            names
                .iter()
                .find(|(id, name)| id.as_str() == b || name.eq_ignore_ascii_case(b))
                .map(|(id, _)| id.clone())
                .or_else(|| (b.len() == 24).then(|| b.to_owned()))
                .ok_or_else(|| MemoryError::Invalid(format!("no companion named `{b}`")))?,
        ),
    };
    let memory = Memory::new(pg.pool.clone(), None, config.clone());
    let facts = memory.facts(user, bot_id.as_deref()).await?;
    let summaries: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT bot_id, summary, summarized_through FROM memory_state
         WHERE user_id = $1 AND ($2::text IS NULL OR bot_id = $2) AND summary <> '' ORDER BY bot_id",
    )
    .bind(user)
    .bind(bot_id.as_deref())
    .fetch_all(&pg.pool)
    .await?;
    let erased = memory.is_erased(user).await?;
    let name = |id: &str| names.get(id).cloned().unwrap_or_else(|| id.to_owned());
    let mut out = String::new();
    if erased {
        let _ = writeln!(out, "user {user} was erased: nothing is kept");
    }
    let mut bots: Vec<&str> = facts.iter().map(|f| f.learned_by.as_str()).collect();
    bots.extend(summaries.iter().map(|s| s.0.as_str()));
    bots.sort_unstable();
    bots.dedup();
    if bots.is_empty() && !erased {
        let _ = writeln!(out, "nothing remembered about user {user}");
    }
    for b in bots {
        let mine: Vec<_> = facts.iter().filter(|f| f.learned_by == b).collect();
        let _ = writeln!(out, "{} ({b}): {} fact(s)", name(b), mine.len());
        for f in mine {
            let _ = writeln!(
                out,
                "  - {}: {}\n    {} {} · sources: {}",
                f.topic.as_str(),
                f.fact,
                f.how.as_str(),
                f.learned_at.format("%Y-%m-%d %H:%M UTC"),
                f.sources.join(", ")
            );
        }
        for (_, summary, through) in summaries.iter().filter(|s| s.0 == b) {
            let _ = writeln!(
                out,
                "  summary (history through row {through}):\n    {summary}"
            );
        }
    }
    Ok(out)
}
