//! `remember`: the user asks the companion to remember something about them ("remember, i ride goofy").
//! It is kept at once, in the same turn, as a journal step (`remember`, keyed by the call) whose
//! transaction writes the fact, so a retried turn keeps it once; an update replaces the older fact of
//! its topic (see `memory::store`). Its own bound (`COMPANION_MEMORY_REMEMBER_PER_DAY`, a counted step
//! under the tally `remember:<user>`), not the hourly write quota meant for app data. Never in a group
//! chat with other people, and never what the crisis screen flags.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{Group, Tool, ToolContext, ToolError, ToolOutput, ToolStores};
use crate::{
    journal::{Admission, Counted, StepKind, names},
    memory::{self, Access, How, Kept, Memory, NewFact},
};

/// A fact the user asked to be remembered, written in the transaction that records it (keyed by the
/// call; a second topic of the same call by `<call>.<n>`).
pub const REMEMBER: StepKind<Kept> = StepKind::new("remember");
/// A `remember` counted against the user's daily bound (tally [`names::tally::remember`]).
pub const REMEMBER_QUOTA: StepKind<Counted> = StepKind::new("remember_quota");

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    /// About the user, third person ("rides goofy").
    #[schemars(length(min = 1, max = memory::FACT_MAX), regex(pattern = r"\S"))]
    pub(crate) fact: String,
}

pub(crate) struct Remember;

impl Tool for Remember {
    const NAME: &'static str = "remember";
    const GROUPS: &'static [Group] = &[Group::Memory];
    type Args = Args;

    fn description() -> &'static str {
        "Keep a fact about the user for later chats, when they ask you to remember it. Only about them, never about others."
    }

    fn new(_: &ToolStores) -> Self {
        Self
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Args) -> Result<ToolOutput, ToolError> {
        let memory = dm_memory(ctx)?;
        let fact = args.fact.trim().to_owned();
        if memory::flagged(&fact) {
            return Err(ToolError::Forbidden(
                "that is not something to keep as a memory; answer the user with care instead"
                    .into(),
            ));
        }
        within_daily_bound(ctx, memory).await?;
        // One fact per topic ("rides goofy and home park is …" is two), each its own step.
        let parts = memory::one_topic_each(&fact);
        let (user, bot) = (ctx.user.to_hex(), ctx.bot.to_hex());
        let max = memory.config.max_facts;
        let mut remembered = Vec::with_capacity(parts.len());
        for (n, (topic, text)) in parts.into_iter().enumerate() {
            // The first part keeps the call's own key, as a single fact always had.
            let key = match n {
                0 => ctx.call.key.clone(),
                n => format!("{}.{n}", ctx.call.key),
            };
            let new = NewFact {
                id: memory::fact_id(&ctx.call.key, n),
                topic,
                fact: text.clone(),
                sources: vec![ctx.message_id.to_hex()],
                how: How::Remembered,
                said_at: ctx.clock.now,
            };
            let recorded = ctx.job.recorded(&REMEMBER, &key).is_some();
            let embedding = match recorded {
                true => None,
                false => memory
                    .embed(crate::rag::Role::Passage, &text)
                    .await
                    .map_err(memory_error)?,
            };
            let (user, bot) = (&user, &bot);
            let kept: Kept = ctx
                .job
                .step(&REMEMBER, &key)
                .run_in_tx(|mut tx| async move {
                    let r = Memory::keep(&mut tx, user, bot, &new, embedding.as_ref(), max)
                        .await
                        .map_err(memory_error);
                    (tx, r)
                })
                .await?;
            remembered.push((topic, text, kept));
        }
        if remembered.iter().all(|(_, _, k)| k.stale) {
            return Err(ToolError::Forbidden(
                "the user said something newer about this that is kept instead".into(),
            ));
        }
        if let [(topic, text, kept)] = remembered.as_slice() {
            return Ok(ToolOutput::data(json!({
                "remembered": text,
                "topic": topic.as_str(),
                "replaced": kept.replaced.len(),
            })));
        }
        let facts: Vec<_> = remembered
            .iter()
            .filter(|(_, _, k)| !k.stale)
            .map(|(t, text, k)| json!({ "fact": text, "topic": t.as_str(), "replaced": k.replaced.len() }))
            .collect();
        Ok(ToolOutput::data(json!({ "remembered": facts })))
    }
}

/// Counts the call against the user's daily bound of things remembered (a counted step, tally
/// `remember:<user>`); a refusal for the model when it is used up.
async fn within_daily_bound(ctx: &ToolContext<'_>, memory: &Memory) -> Result<(), ToolError> {
    let limit = memory.config.remember_per_day;
    let counted = ctx
        .job
        .counted(
            &REMEMBER_QUOTA,
            &ctx.call.key,
            &names::tally::remember(&ctx.user.to_hex()),
            limit,
            std::time::Duration::from_secs(24 * 3600),
            ctx.clock.now,
        )
        .await?;
    if let Admission::Exceeded { retry_after_secs } = counted {
        return Err(ToolError::Forbidden(format!(
            "at most {limit} things can be remembered a day; try again in about {} hours",
            (retry_after_secs + 3599) / 3600
        )));
    }
    Ok(())
}

/// The memory a call may use: a DM's; a group chat or memory turned off says why not.
pub(super) fn dm_memory<'a>(ctx: &ToolContext<'a>) -> Result<&'a Memory, ToolError> {
    match ctx.memory {
        Access::Dm(m) => Ok(m),
        Access::Group => Err(ToolError::Forbidden(
            "in a group chat nothing is remembered; the user can tell you in your one-to-one chat"
                .into(),
        )),
        Access::Off => Err(ToolError::Forbidden(
            "long-term memory is turned off in this app".into(),
        )),
    }
}

/// A memory failure inside a tool: the database's is the turn's (retried), the rest a result.
pub(super) fn memory_error(e: memory::MemoryError) -> ToolError {
    match e {
        memory::MemoryError::Store(s) => ToolError::Store(s),
        memory::MemoryError::Journal(j) => ToolError::Journal(j),
        memory::MemoryError::Bus(b) => ToolError::Bus(b),
        memory::MemoryError::Erased => {
            ToolError::Forbidden("the user's data was erased; nothing is kept".into())
        }
        other => {
            tracing::error!(error = %other, "memory failed inside a tool");
            ToolError::Crashed
        }
    }
}
