//! The bounded tool loop of a turn: ask, run the requested tools, feed the results back, repeat.
//!
//! - `tools` go with every call; all calls of one response run concurrently and their results are
//!   appended in call order with their `tool_call_id`, so the conversation is always valid for the API.
//! - At most `max_rounds` rounds of tools. If the model still asks for tools after the last round, those
//!   calls are not run and one more call is made without tools, so every turn ends with text.
//! - The last card produced in the turn becomes the reply's `richContent`.
//! - Every call is audited in `tool_calls`; a compact log goes with the reply into history. That row is
//!   the journal of the call: a retried turn replays the model's responses (`turn_steps`) and the
//!   recorded tool results, so nothing that ran is run or paid for again.
//! - A database error inside a tool fails the turn transiently (it is retried); everything else a tool
//!   can go wrong with is an error result the model explains.
//! - A tool result longer than `max_result_bytes` reaches the model cut, with a note.
//! - Every paid response is recorded in `llm_usage` (tokens, cost); a replayed one is not.

use std::{collections::HashSet, time::Instant};

use chrono::Utc;
use serde_json::Value;
use tracing::{debug, info};

use super::TurnError;
use crate::{
    bus::DmEvent,
    character::Character,
    llm::{AssistantMessage, ChatRequest, Message, ToolCall},
    services::Services,
    timing::{Stage, stage},
    tools::{Registry, ToolContext, ToolError, audit},
};

/// What the loop produced.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LoopOutput {
    /// The model's final text (untrimmed, unbounded).
    pub text: String,
    /// The last card of the turn.
    pub card: Option<Value>,
    /// Compact record of every call made, in order.
    pub log: Vec<Value>,
    /// Chat calls made.
    pub llm_calls: u32,
}

/// Runs the loop for `request` (whose `tools` are replaced by the registry's) on behalf of the event's sender.
pub async fn run(
    svc: &Services,
    event: &DmEvent,
    character: &Character,
    registry: &Registry,
    mut request: ChatRequest,
) -> Result<LoopOutput, TurnError> {
    let base = ToolContext {
        user: event.sender_id,
        bot: event.bot_id,
        character: character.name.clone(),
        message_id: event.message_id,
        tool_call_id: String::new(),
        mongo: svc.mongo.clone(),
        pg: svc.pg.clone(),
        now: Utc::now(),
        writes_per_hour: svc.config.writes_per_hour,
    };
    request.tools = registry.defs();
    request.tool_choice = None;
    let limits = LoopLimits {
        max_rounds: svc.config.max_tool_rounds,
        max_result_bytes: svc.config.max_tool_result_bytes,
    };
    let out = run_llm_with(&svc.llm, &base, registry, request, limits).await?;
    for call in &out.log {
        let tool = crate::ops::label(call["tool"].as_str().unwrap_or("?"));
        let outcome = if call["ok"] == true { "ok" } else { "error" };
        svc.metrics.inc(
            "companion_tool_calls_total",
            &format!("tool=\"{tool}\",outcome=\"{outcome}\""),
        );
    }
    Ok(out)
}

/// The bounds of one loop.
#[derive(Clone, Copy, Debug)]
pub struct LoopLimits {
    /// Rounds of tool calls before the model must answer in text.
    pub max_rounds: u32,
    /// Longest tool result sent back to the model, bytes.
    pub max_result_bytes: usize,
}

/// The loop against any chat client, with the default result bound.
pub async fn run_llm(
    llm: &crate::llm::LlmClient,
    base: &ToolContext,
    registry: &Registry,
    request: ChatRequest,
    max_rounds: u32,
) -> Result<LoopOutput, TurnError> {
    let limits = LoopLimits {
        max_rounds,
        max_result_bytes: 16 * 1024,
    };
    run_llm_with(llm, base, registry, request, limits).await
}

/// The loop against any chat client.
pub async fn run_llm_with(
    llm: &crate::llm::LlmClient,
    base: &ToolContext,
    registry: &Registry,
    mut request: ChatRequest,
    limits: LoopLimits,
) -> Result<LoopOutput, TurnError> {
    let max_rounds = limits.max_rounds;
    let mut out = LoopOutput::default();
    let mut seen_ids: HashSet<String> = HashSet::new();
    let mut round: u32 = 0;
    let mut step: i32 = 0;
    loop {
        let tools_offered = !request.tools.is_empty();
        let message = journaled_completion(llm, base, step, &request, &mut out).await?;
        step += 1;
        let text = message.content.clone().unwrap_or_default();
        if message.tool_calls.is_empty() || !tools_offered {
            if !message.tool_calls.is_empty() {
                debug!("model asked for tools when none were offered; ignored");
            }
            out.text = text;
            return Ok(out);
        }
        if round >= max_rounds {
            // Out of rounds: do not run these calls; one last call with tools disabled.
            info!(
                rounds = round,
                "tool round limit reached; asking for a final answer without tools"
            );
            request.tools = Default::default();
            request.tool_choice = None;
            continue;
        }
        round += 1;
        let calls = unique_ids(message.tool_calls, round, &mut seen_ids);
        let round_started = Instant::now();
        let results = futures::future::join_all(calls.iter().map(|call| async move {
            let mut ctx = base.clone();
            ctx.tool_call_id = call.id.clone();
            let started = Instant::now();
            // A call an earlier attempt ran keeps its result: the tool does not run again.
            let result =
                match audit::recorded(&ctx, &call.function.name, &call.function.arguments).await {
                    Ok(Some(recorded)) => {
                        debug!(tool = %recorded.name, "tool result replayed from the turn journal");
                        recorded
                    }
                    Ok(None) => {
                        registry
                            .dispatch(&call.function.name, &call.function.arguments, &ctx)
                            .await
                    }
                    Err(e) => crate::tools::ToolResult {
                        name: call.function.name.clone(),
                        outcome: Err(ToolError::Store(e)),
                    },
                };
            (ctx, result, started.elapsed().as_millis() as u64)
        }))
        .await;
        crate::timing::add(Stage::Tools, round_started);
        request.messages.push(Message::Assistant {
            content: message.content.filter(|c| !c.trim().is_empty()),
            tool_calls: calls.clone(),
        });
        for ((ctx, result, ms), call) in results.into_iter().zip(&calls) {
            if result
                .outcome
                .as_ref()
                .err()
                .is_some_and(ToolError::is_transient)
            {
                if let Err(ToolError::Store(e)) = result.outcome {
                    return Err(TurnError::Store(e));
                }
                unreachable!("only store errors are transient");
            }
            stage(
                Stage::Tools,
                audit::record(&ctx, round, &call.function.arguments, &result, ms),
            )
            .await?;
            info!(tool = %result.name, ok = result.is_ok(), ms, round, "tool call");

            if let Some(card) = result.card() {
                out.card = Some(card.clone());
            }
            out.log
                .push(audit::compact(&result, &call.function.arguments));
            request.messages.push(Message::Tool {
                tool_call_id: call.id.clone(),
                content: bound_result(result.model_content(), limits.max_result_bytes),
            });
        }
    }
}

/// The model's answer at `step`: replayed from the journal when an earlier attempt of this turn got it
/// (so a paid call is not paid again and the same tool call ids run again), else asked and journaled.
async fn journaled_completion(
    llm: &crate::llm::LlmClient,
    base: &ToolContext,
    step: i32,
    request: &ChatRequest,
    out: &mut LoopOutput,
) -> Result<AssistantMessage, TurnError> {
    let message_id = base.message_id.to_hex();
    if let Some(stored) = stage(Stage::Steps, base.pg.turn_step(&message_id, step)).await?
        && let Ok(message) = serde_json::from_value::<AssistantMessage>(stored)
    {
        debug!(step, "model response replayed from the turn journal");
        return Ok(message);
    }
    let response = stage(Stage::Llm, llm.complete(request)).await?;
    out.llm_calls += 1;
    let message = response
        .choices
        .first()
        .map(|c| c.message.clone())
        .unwrap_or_default();
    let value = serde_json::to_value(&message).unwrap_or(Value::Null);
    // The step and its cost are written side by side (one round trip of time, not two).
    let (stored, ()) = stage(Stage::Steps, async {
        tokio::join!(
            base.pg.record_turn_step(&message_id, step, &value),
            crate::usage::record_paid_call(llm, base, step, &response),
        )
    })
    .await;
    Ok(serde_json::from_value(stored?).unwrap_or(message))
}

/// A tool result cut to `max` bytes (on a character boundary) with a note saying so.
fn bound_result(content: String, max: usize) -> String {
    if content.len() <= max {
        return content;
    }
    let mut end = max;
    while !content.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… [cut: the result had {} bytes, only the first {end} are shown]",
        &content[..end],
        content.len()
    )
}

/// Gives every call an id unique within the turn (some providers send empty or repeated ids), so tool
/// messages pair up unambiguously and writes keyed by (message, call id) stay distinct.
fn unique_ids(calls: Vec<ToolCall>, round: u32, seen: &mut HashSet<String>) -> Vec<ToolCall> {
    calls
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            let id = c.id.trim();
            if id.is_empty() || id.len() > 128 || seen.contains(id) {
                c.id = format!("call_r{round}_{i}");
            }
            seen.insert(c.id.clone());
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::bound_result;

    #[test]
    fn long_tool_results_are_cut_on_a_character_boundary() {
        assert_eq!(bound_result("short".into(), 10), "short");
        let cut = bound_result("ééééé".into(), 5);
        assert!(cut.starts_with("éé…"), "{cut}");
        assert!(cut.contains("had 10 bytes, only the first 4"), "{cut}");
    }
}
