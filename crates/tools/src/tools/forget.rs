//! `forget`: the user asks the companion to forget something. Removes the facts (of this user with this
//! companion) that match what the user names: a topic named alone ("my stance") by topic, a fact by its
//! words, else by meaning (embedding similarity); and says which it removed, or, when none matched, that
//! nothing was forgotten and what is remembered. A journal step keyed by the call (`forget`) does it in its transaction, so a retried
//! turn removes nothing more and answers the same.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{
    Group, Tool, ToolContext, ToolError, ToolOutput, ToolStores,
    remember::{dm_memory, memory_error},
};
use crate::{journal::StepKind, memory::Memory};

/// Facts the user asked to be forgotten (their ids), removed in the transaction that records it (keyed by
/// the call).
pub const FORGET: StepKind<Vec<String>> = StepKind::new("forget");

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    /// What to forget, in your words ("that they ride goofy"); resolve "that" from the chat.
    #[schemars(length(min = 1, max = 200), regex(pattern = r"\S"))]
    pub(crate) about: String,
}

pub(crate) struct Forget;

impl Tool for Forget {
    const NAME: &'static str = "forget";
    const GROUPS: &'static [Group] = &[Group::Memory];
    type Args = Args;

    fn description() -> &'static str {
        "Forget what the user asks you to forget about them; returns the facts removed."
    }

    fn new(_: &ToolStores) -> Self {
        Self
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Args) -> Result<ToolOutput, ToolError> {
        let memory = dm_memory(ctx)?;
        let about = args.about.trim().to_owned();
        let recorded = ctx.job.recorded(&FORGET, &ctx.call.key).is_some();
        let embedding = match recorded {
            true => None,
            false => memory
                .embed(crate::rag::Role::Query, &about)
                .await
                .map_err(memory_error)?,
        };
        // Where the encoder's similarity says "this fact" (its scale: docs/knowledge.md, "Thresholds").
        let scores = memory.scores();
        let (user, bot) = (ctx.user.to_hex(), ctx.bot.to_hex());
        let removed: Vec<String> = ctx
            .job
            .step(&FORGET, &ctx.call.key)
            .run_in_tx(|mut tx| async move {
                let r = Memory::forget(
                    &mut tx,
                    &user,
                    &bot,
                    &about,
                    embedding.as_ref(),
                    scores.forget_match,
                    scores.forget_floor,
                )
                .await
                .map(|facts| facts.into_iter().map(|f| f.fact).collect())
                .map_err(memory_error);
                (tx, r)
            })
            .await?;
        if !removed.is_empty() {
            return Ok(ToolOutput::data(json!({
                "forgotten": removed,
                "count": removed.len(),
            })));
        }
        // Nothing matched: say so, with what is remembered, so the model asks which one the user means
        // instead of answering as if it had forgotten.
        let remembered: Vec<_> = memory
            .facts(&ctx.user.to_hex(), Some(&ctx.bot.to_hex()))
            .await
            .map_err(memory_error)?
            .into_iter()
            .map(|f| json!({ "topic": f.topic.as_str(), "fact": f.fact }))
            .collect();
        Ok(ToolOutput::data(json!({
            "forgotten": [],
            "count": 0,
            "note": "Nothing remembered matches that, so nothing was forgotten. Tell the user so; if one of \
                     the remembered facts may be what they mean, ask which.",
            "remembered": remembered,
        })))
    }
}
