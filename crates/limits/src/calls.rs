//! The steps of a call to the model, shared by every job that asks it: the conversation's tool loop
//! (the worker's `pipeline::tool_loop`) and memory's extraction. What the answers cost is read back from
//! these records by [`crate::spend`] and `companion usage`.

use serde_json::json;

use crate::{
    journal::{StepKind, Telling, Told, or_unknown},
    llm::{FailedCall, LlmRecord},
};

/// One answer of the model, with its usage and cost (tally [`crate::spend::tally`] when a user's turn
/// pays), keyed by the call (`<slot><n>` in a turn, `facts` or `summary` in an extraction). The SQL of
/// the spend and usage reads names it `llm` literally, as the partial index on these steps does.
pub const LLM: StepKind<LlmRecord> = StepKind::new("llm").told(tell_llm);

/// A note ([`crate::journal::Job::note`]), not a side effect: one failed request to the model (the model
/// asked, the error, its class, how long it took), keyed `<llm key>@<attempt>.<n>`.
pub const MODEL_FAILED: StepKind<FailedCall> = StepKind::new("model_failed").told(tell_failed);

fn tell_failed(_: &Told<'_>, f: &FailedCall) -> Telling {
    (
        format!(
            "model request FAILED: {} ({}), {} after {} ms",
            f.model, f.error, f.class, f.ms
        ),
        json!({ "model": f.model, "error": f.error, "class": f.class, "ms": f.ms }),
    )
}

/// A missing figure.
/// A model call in words and fields.
fn tell_llm(t: &Told<'_>, r: &LlmRecord) -> Telling {
    let u = r.usage.as_ref();
    let asked: Vec<&str> = r
        .message
        .tool_calls
        .iter()
        .map(|c| c.function.name.as_str())
        .collect();
    let offered = r.offered.as_ref().map(|t| match t.is_empty() {
        true => "none".to_owned(),
        false => t.join(", "),
    });
    // The scripted offline model is no model anyone pays for: named so, never priced.
    let scripted = u.is_some_and(|u| u.scripted);
    let model = match (scripted, u) {
        (true, Some(u)) => format!("SCRIPTED (the offline stub, asked as {})", u.model),
        _ => or_unknown(u.map(|u| u.model.clone())),
    };
    let cost = match scripted {
        true => "none (scripted)".to_owned(),
        false => or_unknown(u.and_then(|u| u.cost_usd).map(|c| format!("${c:.6}"))),
    };
    let says = format!(
        "model {}{}: {} prompt tokens ({} cached) + {} completion, cost {}, {} ms, finish {}; tools offered: {}{}",
        model,
        r.bot
            .as_deref()
            .map_or(String::new(), |b| format!(" as {}", t.name(b))),
        or_unknown(u.map(|u| u.prompt_tokens)),
        or_unknown(u.and_then(|u| u.cached_tokens)),
        or_unknown(u.map(|u| u.completion_tokens)),
        cost,
        or_unknown(r.ms),
        or_unknown(r.finish.clone()),
        offered.clone().unwrap_or_else(|| match r.offered_tools {
            true => "some (names unknown)".into(),
            false => "none".into(),
        }),
        match asked.is_empty() {
            true => String::new(),
            false => format!("; asked for {}", asked.join(", ")),
        }
    );
    let facts = json!({
        "model": u.map(|u| &u.model), "scripted": scripted, "bot": r.bot,
        "prompt_tokens": u.map(|u| u.prompt_tokens), "cached_tokens": u.and_then(|u| u.cached_tokens),
        "completion_tokens": u.map(|u| u.completion_tokens), "cost_usd": u.and_then(|u| u.cost_usd),
        "ms": r.ms, "finish": r.finish, "tools_offered": r.offered, "tool_calls": asked,
    });
    (says, facts)
}
