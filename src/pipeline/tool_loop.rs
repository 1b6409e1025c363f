//! The bounded tool loop of a turn: ask, run the requested tools, feed the results back, repeat.
//!
//! - `tools` go with every call; all calls of one response run concurrently and their results are
//!   appended in call order with their `tool_call_id`, so the conversation is always valid for the API.
//! - At most `max_rounds` rounds of tools. If the model still asks for tools after the last round, those
//!   calls are not run and one more call is made without tools, so every turn ends with text.
//! - The last card produced in the turn becomes the reply's `richContent`.
//! - Each model answer is a journal step (`llm`, by round, with its usage and cost) and each call one
//!   (`tool`, by call id and a hash of tool and arguments): a retried turn replays them, so nothing that
//!   succeeded is run or paid for again. An answer that failed (an error inside a 200, an empty one) is
//!   never recorded: the next attempt asks again.
//! - A database error inside a tool fails the turn (with the error's class); everything else a tool can
//!   go wrong with is an error result the model explains.
//! - A tool result longer than `max_result_bytes` reaches the model cut, with a note.
//! - The turn's [`CallBudget`] bounds what it sends to the chat API, retries and fallbacks included: when
//!   one request is left, it goes without tools, so the turn still ends with text.
//! - Before each paid call the spend budgets are checked ([`SpendGuard`]): near one the call goes to the
//!   cheaper model; at one no call is made and the loop ends [`LoopOutput::stopped`]. Each answer is
//!   recorded under the user's spend tally, which is what the budgets count.

use std::{collections::HashSet, sync::Arc, time::Instant};

use serde_json::Value;
use tracing::{Instrument as _, debug, info, warn};

use super::PipelineError;
use crate::{
    calls::{LLM, MODEL_FAILED},
    genai,
    journal::JournalError,
    llm::{CallBudget, ChatRequest, FailedCall, LlmClient, Message, ToolCall},
    metrics::{Metric, Metrics},
    safety::Category,
    spend::{self, Allowance, LoopSpend, Scope, SpendGuard, Spent},
    timing::{Stage, stage},
    tools::{
        Group, Offer, Registry, ToolContext, ToolRecord, Toolbox, call_key, flag_concern,
        more_tools,
    },
};
use crate::{config::Config, parts::Parts};

/// Tool calls run, by tool and outcome.
pub(crate) const TOOL_CALLS: Metric = Metric::new(
    "companion_tool_calls_total",
    "Tool calls the model made, by tool and outcome (ok, error)",
);

/// What the loop produced.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LoopOutput {
    /// The model's final text (untrimmed, unbounded).
    pub text: String,
    /// The last card of the turn.
    pub card: Option<Value>,
    /// Compact record of every call made, in order.
    pub log: Vec<Value>,
    /// A spend budget was used up before the model could answer: no text.
    pub(crate) stopped: Option<Scope>,
    /// The model flagged a concern for the user ([`flag_concern`]): the loop stopped at that answer.
    pub(crate) concern: Option<Category>,
}

/// The bounds of one loop.
#[derive(Clone, Copy, Debug)]
pub struct LoopLimits {
    /// Rounds of tool calls before the model must answer in text.
    pub max_rounds: u32,
    /// Longest tool result sent back to the model, bytes.
    pub max_result_bytes: usize,
}

/// What one loop uses: the model, the tools (with the turn's journal in their context) and its bounds.
pub struct LoopContext<'a> {
    pub llm: &'a LlmClient,
    pub registry: &'a Registry,
    /// What runs the calls: the tools, or none when none were offered.
    pub toolbox: &'a Toolbox,
    /// The groups of tools offered at first; `more_tools` adds one for the rounds after it.
    pub offer: Offer,
    pub limits: LoopLimits,
    pub metrics: &'a Metrics,
    /// The context every call starts from (its call id and key are set per call).
    pub tools: ToolContext<'a>,
    /// What this attempt may still send to the chat API.
    pub budget: &'a CallBudget,
    /// The spend budgets, checked before each paid call (none: unchecked).
    pub spend: Option<Spending<'a>>,
    /// Prefix of this loop's step keys: empty for a DM turn, `<n>.` for the n-th companion message
    /// of a group message (several loops share one job).
    pub slot: &'a str,
}

/// The spend budgets a loop checks before each paid call, and its user's spending when it was read
/// already (with a DM's history: [`SpendGuard::ride`]).
#[derive(Clone, Copy)]
pub struct Spending<'a> {
    pub guard: &'a SpendGuard,
    pub known: Option<Spent>,
}

pub use crate::llm::LlmRecord;

/// The model and the tools a slot converses with, and how far.
pub(crate) struct Talk {
    pub(crate) llm: LlmClient,
    /// The tools, built once with the stores they use.
    pub(crate) tools: Arc<Toolbox>,
    /// The spend budgets, checked before each paid call.
    pub(crate) spend: Arc<SpendGuard>,
    pub(crate) limits: LoopLimits,
    /// Model calls one slot may make (`COMPANION_MAX_LLM_CALLS_PER_TURN`).
    pub(crate) max_calls: u32,
    /// The model a character without its own is answered by.
    pub(crate) model: String,
    /// Longest answer asked for, in tokens.
    pub(crate) max_tokens: u32,
    pub(crate) temperature: f32,
}

impl Talk {
    /// From the shared handles (`llm`, `turn`: the tools' bounds, the loop's and the calls').
    pub(crate) fn new(p: &Parts, c: &Config) -> Self {
        let tools = Arc::new(Toolbox::new(&crate::tools::ToolStores {
            mongo: p.mongo.clone(),
            pg: p.pg.clone(),
            bus: p.bus.clone(),
            flows: p.flows.clone(),
            reminders: crate::tools::ReminderBounds {
                min_lead: std::time::Duration::from_secs(c.turn.reminder_min_lead_secs),
            },
            writes_per_hour: c.turn.writes_per_hour,
        }));
        Self {
            llm: p.llm.clone(),
            tools,
            spend: p.spend.clone(),
            limits: LoopLimits {
                max_rounds: c.turn.max_tool_rounds,
                max_result_bytes: c.turn.max_tool_result_bytes,
            },
            max_calls: c.turn.max_llm_calls_per_turn,
            model: c.llm.model.clone(),
            max_tokens: c.llm.max_tokens,
            temperature: c.llm.temperature,
        }
    }
}

/// Runs the loop for `request` (with the registry's tools) on behalf of the event's sender.
pub async fn converse(
    cx: &LoopContext<'_>,
    mut request: ChatRequest,
) -> Result<LoopOutput, PipelineError> {
    let mut offer = cx.offer;
    request.tools = cx.registry.offered(offer);
    request.tool_choice = None;
    let mut out = LoopOutput::default();
    let mut seen_ids: HashSet<String> = HashSet::new();
    let (mut round, mut n) = (0u32, 0u32); // tool rounds run; model calls made (each step's key)
    // Several companions' conversations share a group message's job: each call says who spoke.
    let speaker = (!cx.slot.is_empty()).then(|| cx.tools.bot.to_hex());
    let spent = LoopSpend::knowing(cx.spend.and_then(|s| s.known));
    loop {
        let answered = answer(cx, &request, n, speaker.clone(), &spent).await;
        let record = match answered {
            Ok(record) => record,
            Err(Unpaid::Stopped(scope)) => {
                out.stopped = Some(scope);
                return Ok(out);
            }
            Err(Unpaid::Failed(e)) => return Err(e),
        };
        n += 1;
        let (tools_offered, message) = (record.offered_tools, record.message);
        let text = message.content.clone().unwrap_or_default();
        if tools_offered && let Some(concern) = concern_in(&message.tool_calls) {
            info!(
                concern = concern.as_str(),
                "the model flagged a concern: no tool runs and no model call follows"
            );
            out.text = text;
            out.concern = Some(concern);
            return Ok(out);
        }
        if message.tool_calls.is_empty() || !tools_offered {
            if !message.tool_calls.is_empty() {
                debug!("model asked for tools when none were offered; ignored");
            }
            out.text = text;
            return Ok(out);
        }
        if round >= cx.limits.max_rounds {
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
        let results = run_calls(cx, &calls, round).await;
        crate::timing::add(Stage::Tools, round_started);
        request.messages.push(Message::Assistant {
            content: message.content.filter(|c| !c.trim().is_empty()),
            tool_calls: calls.clone(),
        });
        take_results(cx, results, &calls, &mut out, &mut offer, &mut request)?;
    }
}

/// The slot's `n`-th answer of the model (its `llm` step). The step's own time is the journal's; the
/// model's is the nested `llm` stage. An answer recorded by an earlier attempt was paid once and replays
/// for free: the checks before a paid call are the step's body.
async fn answer(
    cx: &LoopContext<'_>,
    request: &ChatRequest,
    n: u32,
    speaker: Option<String>,
    spent: &LoopSpend,
) -> Result<LlmRecord, Unpaid> {
    let key = format!("{}{n}", cx.slot);
    let user = cx.tools.user.to_hex();
    let step = cx
        .tools
        .job
        .step(&LLM, key.clone())
        .tally(spend::tally(&user));
    // An answer in text, or one calling only tools that read, rides with the reply's record (a crash
    // before it asks again, and those tools read again); one that calls a tool that acts is recorded
    // before the tool acts on it.
    let reads_only = |r: &LlmRecord| {
        r.message
            .tool_calls
            .iter()
            .all(|c| cx.registry.reads_only(&c.function.name))
    };
    let asked = Box::pin(pay_and_ask(cx, request, speaker, &key, spent));
    stage(Stage::Steps, step.run_lazy_if(asked, reads_only)).await
}

/// The round's results into the request for the next answer, each after its call; a card and the
/// compact log into `out`, and a call that asked for more tools widens `offer`.
fn take_results(
    cx: &LoopContext<'_>,
    results: Vec<Result<ToolRecord, PipelineError>>,
    calls: &[ToolCall],
    out: &mut LoopOutput,
    offer: &mut Offer,
    request: &mut ChatRequest,
) -> Result<(), PipelineError> {
    for (record, call) in results.into_iter().zip(calls) {
        let record: ToolRecord = record?;
        if let Some(card) = &record.card {
            out.card = Some(card.clone());
        }
        if let Some(group) = asked_for(&record) {
            info!(?group, "the model asked for more tools");
            *offer = offer.with(group);
            request.tools = cx.registry.offered(*offer);
        }
        out.log.push(record.compact());
        request.messages.push(Message::Tool {
            tool_call_id: call.id.clone(),
            content: bound_result(record.content.to_string(), cx.limits.max_result_bytes),
        });
    }
    Ok(())
}

/// The concern of a `flag_concern` call among `calls`. Arguments that do not read are still a flag: the
/// most urgent category (logged).
fn concern_in(calls: &[ToolCall]) -> Option<Category> {
    let call = calls
        .iter()
        .find(|c| c.function.name == flag_concern::NAME)?;
    Some(
        serde_json::from_str::<flag_concern::Args>(&call.function.arguments)
            .map(|a| a.concern)
            .unwrap_or_else(|e| {
                warn!(error = %e, "the model's flag_concern arguments do not read; taken as self_harm");
                Category::SelfHarm
            }),
    )
}

/// One round's tool calls, at once, each a journal step keyed by the call (a replay reads its result).
async fn run_calls(
    cx: &LoopContext<'_>,
    calls: &[ToolCall],
    round: u32,
) -> Vec<Result<ToolRecord, PipelineError>> {
    let job = cx.tools.job;
    futures::future::join_all(calls.iter().map(|call| {
        let (name, args) = (&call.function.name, &call.function.arguments);
        let mut ctx = cx.tools.clone();
        ctx.call.id = call.id.clone();
        ctx.call.key = format!("{}{}", cx.slot, call_key(&call.id, name, args));
        async move {
            let key = ctx.call.key.clone();
            job.step(&crate::tools::TOOL, key)
                .lazy()
                .run(async {
                    let span = genai::tool(name, &call.id);
                    let started = Instant::now();
                    let result = cx
                        .toolbox
                        .dispatch(name, args, &ctx)
                        .instrument(span.clone())
                        .await;
                    let ms = started.elapsed().as_millis() as u64;
                    let record = result.record(args, round, ms);
                    let outcome = match &record {
                        Ok(r) if r.ok => "ok",
                        _ => "error",
                    };
                    span.record("companion.tool.outcome", outcome);
                    if outcome != "ok" {
                        genai::failed(&span, "tool_error");
                    }
                    let record = record?;
                    info!(tool = %record.tool, ok = record.ok, ms, round, "tool call");
                    let labels = [("tool", record.tool.as_str()), ("outcome", outcome)];
                    cx.metrics.inc(&TOOL_CALLS, &labels);
                    Ok::<_, PipelineError>(record)
                })
                .await
        }
    }))
    .await
}

/// The group a successful `more_tools` call asked for (read from its recorded result, so a replayed
/// turn widens its offer the same way).
fn asked_for(record: &ToolRecord) -> Option<Group> {
    (record.ok && record.tool == more_tools::NAME)
        .then(|| serde_json::from_value(record.content["group"].clone()).ok())
        .flatten()
}

/// Why a call to the model gave no answer to record.
enum Unpaid {
    /// A spend budget is used up: no call was made.
    Stopped(Scope),
    Failed(PipelineError),
}

impl From<JournalError> for Unpaid {
    fn from(e: JournalError) -> Self {
        Self::Failed(e.into())
    }
}

/// One paid call: the spend budgets first (near one, the cheaper model; at one, no call), and the turn's
/// last allowed request goes without tools so that it ends with text.
async fn pay_and_ask(
    cx: &LoopContext<'_>,
    request: &ChatRequest,
    speaker: Option<String>,
    call: &str,
    spent: &LoopSpend,
) -> Result<LlmRecord, Unpaid> {
    let mut request = std::borrow::Cow::Borrowed(request);
    if !request.tools.is_empty() && cx.budget.calls_left() <= 1 {
        info!(
            "the turn's last allowed request to the model: asking for a final answer without tools"
        );
        let r = request.to_mut();
        r.tools = Default::default();
        r.tool_choice = None;
    }
    if let Some(spending) = cx.spend {
        let user = cx.tools.user.to_hex();
        match stage(Stage::Limits, spending.guard.check(&user, spent)).await {
            Ok(Allowance::Full) => {}
            Ok(Allowance::Cheaper { model, .. }) => request.to_mut().model = model,
            Ok(Allowance::Stopped { scope }) => return Err(Unpaid::Stopped(scope)),
            Err(e) => return Err(Unpaid::Failed(e.into())),
        }
    }
    let mut failed = Vec::new();
    let answer = ask(cx.llm, &request, cx.budget, speaker, &mut failed).await;
    // Each failed request is a note of the job, whatever the call's outcome (a retry that answered,
    // a fallback model, or none at all).
    for f in failed {
        if let Err(e) = cx.tools.job.note(&MODEL_FAILED, call, &f).await {
            warn!(error = %e, "a failed model request not noted in the journal");
        }
    }
    if let Ok(LlmRecord {
        usage: Some(usage), ..
    }) = &answer
    {
        spent.add(Spent::of(usage));
    }
    answer.map_err(Unpaid::Failed)
}

/// One model answer, or the reason it is not one. A final answer (no tools offered) must have text.
/// Each request that failed on the way is pushed onto `failed`.
async fn ask(
    llm: &LlmClient,
    request: &ChatRequest,
    budget: &CallBudget,
    bot: Option<String>,
    failed: &mut Vec<FailedCall>,
) -> Result<LlmRecord, PipelineError> {
    let started = Instant::now();
    let response = stage(
        Stage::Llm,
        llm.complete_noting(request, Some(budget), failed),
    )
    .await?;
    let ms = Some(started.elapsed().as_millis() as u64);
    // An answer the API sent that is no answer (an empty one) failed too.
    let record = LlmRecord::answer(llm, request, response, bot).inspect_err(|e| {
        failed.push(FailedCall::of(&request.model, e, started.elapsed()));
    })?;
    Ok(LlmRecord { ms, ..record })
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
