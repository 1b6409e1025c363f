//! `companion explain <messageId>`: the story of the job that answered one message, from the journal
//! alone ([`crate::journal::story`]), in the pipeline's order (`pipeline`'s table): when it arrived and
//! how often it was delivered; the crisis screen, the gate and the burst; each companion's slot (the
//! model's calls, the tool calls, the message the outgoing hook let out and what it was composed from);
//! the delivery; how the job ended. Each step is read back by the type that records it; a field a record
//! does not have (older records, or one an erasure scrubbed) is `unknown`.
//!
//! Text is never shown unless asked (`--show-text`), and never that of a deleted message or an erased
//! user. Each ask is logged (target `audit`) and recorded as the job's step `text_shown`
//! ([`crate::journal::story::note_shown`]): it stays with the job it concerns, an operator finds it with
//! `SELECT key, output FROM job_steps WHERE name = 'text_shown'`, and its key (`<operator>@<time>`)
//! keeps who and when even after an erasure scrubs the output.

use std::{collections::HashMap, fmt::Write, path::Path};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use tracing::info;

use crate::{
    config::PgConfig,
    group::Route,
    journal::{
        JournalError,
        names::{key::Slot, step},
        story::{self, JobRow, StepRow, Story},
    },
    llm::{FailedCall, LlmRecord},
    pipeline::{
        Burst, FloodDecision, Reply,
        incoming::{Flagged, Screened},
    },
    store::{Pg, StoreError},
    tools::ToolRecord,
};

/// Why `companion explain` has no story to tell.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("no job in the journal for message {0}")]
    Unknown(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// What `companion explain` is asked.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// A message id (a DM's, a group message's, a burst's later one), or a follow-up's job id.
    pub id: &'a str,
    /// One JSON object instead of the text.
    pub json: bool,
    /// The messages' text too (audited).
    pub show_text: bool,
    /// Who asks, for the audit.
    pub operator: &'a str,
}

/// The story as `--json` prints it; the text is rendered from it.
#[derive(Debug, Serialize)]
struct Explained {
    asked: String,
    /// The job asked for was a burst's later message (at this stream sequence), answered by this job's
    /// reply.
    #[serde(skip_serializing_if = "Option::is_none")]
    follower_seq: Option<Option<u64>>,
    job: String,
    kind: String,
    user: String,
    bot: Option<String>,
    conversation: String,
    arrived: DateTime<Utc>,
    stream_seq: Option<u64>,
    deliveries: i32,
    generation: i32,
    events: Vec<Event>,
    state: &'static str,
    ended: DateTime<Utc>,
    covered_by: Option<String>,
    reason: Option<String>,
    last_error: Option<String>,
    /// With `--show-text`: the messages' text…
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<Vec<Said>>,
    /// …or why it is withheld.
    #[serde(skip_serializing_if = "Option::is_none")]
    text_withheld: Option<String>,
}

/// One step of the story.
#[derive(Debug, Serialize)]
struct Event {
    at: DateTime<Utc>,
    step: String,
    key: String,
    /// The companion message of the job it belongs to (a group message has several).
    slot: Option<usize>,
    /// What happened, in words.
    says: String,
    /// The same for machines.
    facts: Value,
}

/// A message's text.
#[derive(Debug, Serialize)]
struct Said {
    message: String,
    from: String,
    text: String,
}

/// `companion explain`: the story of `request.id`'s job, as text or JSON; bots named from the character
/// files.
pub async fn explain(
    pg: &PgConfig,
    characters_dir: &Path,
    request: Request<'_>,
) -> Result<String, ExplainError> {
    let pg = Pg::connect(pg).await?;
    let story = story::story(&pg.pool, request.id)
        .await?
        .ok_or_else(|| ExplainError::Unknown(request.id.to_owned()))?;
    let names = crate::usage::bot_names(characters_dir);
    let mut explained = tell(request.id, &story, &names);
    if request.show_text {
        match texts(&pg, &story, &names, request).await? {
            Ok(said) => explained.text = Some(said),
            Err(why) => explained.text_withheld = Some(why),
        }
    }
    Ok(match request.json {
        true => serde_json::to_string_pretty(&explained).unwrap_or_default() + "\n",
        false => render(&explained, &names),
    })
}

/// The messages' text, unless one of the job's user messages was deleted or its user erased; the ask
/// logged and recorded either way.
async fn texts(
    pg: &Pg,
    story: &Story,
    names: &HashMap<String, String>,
    request: Request<'_>,
) -> Result<Result<Vec<Said>, String>, ExplainError> {
    let job = &story.job;
    let replies: Vec<Reply> = story
        .steps
        .iter()
        .filter(|s| s.name == step::REPLY || s.name == step::REFERRAL_MESSAGE)
        .filter_map(|s| serde_json::from_value(s.output.clone()).ok())
        .collect();
    let mut users: Vec<String> = match job.kind.as_str() {
        crate::pipeline::JOB_KIND | crate::group::JOB_KIND => vec![job.record.id().to_owned()],
        _ => Vec::new(),
    };
    users.extend(
        read::<Burst>(story, step::BURST)
            .into_iter()
            .flat_map(|b| b.covers.into_iter().map(|c| c.message_id)),
    );
    let gone = pg.tombstoned(&job.user, &users).await?;
    let at = Utc::now();
    info!(target: "audit", operator = request.operator, message = request.id, job = job.record.id(),
          shown = !gone, "companion explain --show-text");
    story::note_shown(
        &pg.pool,
        job.record.id(),
        request.operator,
        request.id,
        !gone,
        at,
    )
    .await?;
    if gone {
        return Ok(Err(
            "withheld: a message of this job was deleted or its user erased".into(),
        ));
    }
    let history = pg.texts(&users).await?;
    let mut said: Vec<Said> = users
        .into_iter()
        .map(|id| Said {
            text: history.get(&id).cloned().unwrap_or_default(),
            message: id,
            from: job.user.clone(),
        })
        .collect();
    said.extend(replies.into_iter().map(|r| Said {
        from: name(names, r.bot.as_deref().or(job.bot.as_deref())),
        message: r.id,
        text: r.content,
    }));
    Ok(Ok(said))
}

/// The step `name` (keyed once) as its type reads it.
fn read<T: serde::de::DeserializeOwned>(story: &Story, name: &str) -> Option<T> {
    let s = story.steps.iter().find(|s| s.name == name)?;
    serde_json::from_value(s.output.clone()).ok()
}

/// A companion by name, else by id.
fn name(names: &HashMap<String, String>, bot: Option<&str>) -> String {
    let bot = bot.unwrap_or("?");
    names.get(bot).cloned().unwrap_or_else(|| bot.to_owned())
}

/// The story of `story`'s job, its steps in the pipeline's order.
fn tell(asked: &str, story: &Story, names: &HashMap<String, String>) -> Explained {
    let JobRow {
        kind,
        user,
        bot,
        conversation,
        created_at,
        record,
    } = story.job.clone();
    let tools: HashMap<&str, i64> = story
        .steps
        .iter()
        .filter(|s| s.name == step::TOOL)
        .map(|s| {
            (
                s.key.as_str(),
                s.output["round"].as_i64().unwrap_or(1) * 2 - 1,
            )
        })
        .collect();
    let mut steps: Vec<&StepRow> = story.steps.iter().collect();
    steps.sort_by_key(|s| (order(s, record.id(), &tools), s.at));
    let events = steps
        .into_iter()
        .map(|s| {
            let (says, facts) = describe(s, record.id(), names);
            Event {
                at: s.at,
                step: s.name.clone(),
                key: s.key.clone(),
                slot: slot(s),
                says,
                facts,
            }
        })
        .collect();
    Explained {
        asked: asked.to_owned(),
        follower_seq: story.follower.as_ref().map(|f| f.record.stream_seq),
        job: record.id().to_owned(),
        kind,
        user,
        bot,
        conversation,
        arrived: created_at,
        stream_seq: record.stream_seq,
        deliveries: record.attempts,
        generation: record.generation,
        events,
        state: record.state.as_str(),
        ended: record.updated_at,
        covered_by: record.covered_by,
        reason: record.reason,
        last_error: record.last_error,
        text: None,
        text_withheld: None,
    }
}

/// The slot a step belongs to: the `n` of a group's `n.` call keys and `g<generation>.n` delivery keys.
fn slot(s: &StepRow) -> Option<usize> {
    let k = s.key.as_str();
    match s.name.as_str() {
        step::REPLY
        | step::STORE_REPLY
        | step::HISTORY
        | step::TOUCH
        | step::PUBLISH
        | step::WITHDRAW
            if k.starts_with('g') =>
        {
            Slot::of_reply(k).map(|(_, slot)| slot.index())
        }
        step::LLM
        | step::TOOL
        | step::QUOTA
        | step::REMEMBER
        | step::REMEMBER_QUOTA
        | step::FORGET
        | step::FLOW_CHANGE
            if k != crate::journal::names::key::EVENT =>
        {
            Some(Slot::of_call(k).index())
        }
        // Notes: `<llm key>@…` and `<reply key>@…`.
        step::MODEL_FAILED => Some(Slot::of_call(noted(k)).index()),
        step::FIXED_LINE => Slot::of_reply(noted(k)).map(|(_, slot)| slot.index()),
        _ => None,
    }
}

/// The step key a note's key (`<key>@<attempt>.<n>`) is about.
fn noted(key: &str) -> &str {
    key.split('@').next().unwrap_or(key)
}

/// Where a step stands in the pipeline: (stage, slot, within the slot). Lazy steps are recorded with a
/// later one, so their time alone does not order them.
fn order(s: &StepRow, job: &str, tools: &HashMap<&str, i64>) -> (u8, usize, i64) {
    let (name, key) = (s.name.as_str(), s.key.as_str());
    let within_slot = |n: i64| (3, slot(s).unwrap_or(0), n);
    let generation = || Slot::of_reply(key).map_or(0, |(g, _)| i64::from(g));
    // The incoming hook's steps, in the order the protocol takes them (the referral's delivery keyed
    // `crisis.<message>`).
    let incoming = [
        step::SCREEN,
        step::REFERRAL,
        step::CRISIS,
        step::REFERRAL_MESSAGE,
        step::STORE_REPLY,
        step::HISTORY,
        step::TOUCH,
        step::PUBLISH,
        step::ALERT,
    ];
    let incoming_rank = incoming.iter().position(|n| *n == name).unwrap_or(0) as i64;
    // A burst's later messages pass the incoming hook once the burst is fixed.
    let hook = if key.trim_start_matches("crisis.") == job {
        0
    } else {
        2
    };
    match name {
        _ if key.starts_with("crisis.") => (hook, 0, incoming_rank),
        step::SCREEN | step::CRISIS | step::REFERRAL | step::REFERRAL_MESSAGE | step::ALERT => {
            (hook, 0, incoming_rank)
        }
        step::UNDER_13
        | step::ROUTE
        | step::GATE
        | step::CAP
        | step::TURN
        | step::BUSY
        | step::FLOOD
        | step::AFTER_FLAG => (1, 0, 0),
        step::BURST => (2, 0, -1),
        step::FLOW_CHANGE if key == crate::journal::names::key::EVENT => (2, 0, 0),
        step::FLOW => (3, 0, -1),
        // A call's failed requests come before its answer (the same rank; they were noted first).
        step::LLM | step::MODEL_FAILED => {
            let n = noted(key)
                .rsplit('.')
                .next()
                .and_then(|n| n.parse::<i64>().ok());
            within_slot(n.unwrap_or(0) * 2)
        }
        step::FIXED_LINE => {
            let g = Slot::of_reply(noted(key)).map_or(0, |(g, _)| i64::from(g));
            within_slot(10_000 + g * 10 - 1)
        }
        step::TOOL
        | step::QUOTA
        | step::REMEMBER
        | step::REMEMBER_QUOTA
        | step::FORGET
        | step::FLOW_CHANGE => within_slot(tools.get(key).copied().unwrap_or(999)),
        step::REPLY => within_slot(10_000 + generation() * 10),
        step::STORE_REPLY | step::HISTORY | step::TOUCH | step::PUBLISH | step::WITHDRAW
            if key.starts_with('g') =>
        {
            let rank = [step::STORE_REPLY, step::HISTORY, step::TOUCH, step::PUBLISH]
                .iter()
                .position(|n| *n == name)
                .unwrap_or(4) as i64;
            within_slot(10_001 + generation() * 10 + rank)
        }
        step::TEXT_SHOWN => (5, 0, 0),
        _ => (4, 0, 0),
    }
}

/// A missing figure.
fn or_unknown<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "unknown".into(), |v| v.to_string())
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// A step in words and in fields, read by the type that records it.
fn describe(s: &StepRow, job: &str, names: &HashMap<String, String>) -> (String, Value) {
    let out = &s.output;
    if out.get("erased").is_some() {
        let usage = out.get("usage").cloned().unwrap_or(Value::Null);
        return (
            "recorded, then erased (a deletion scrubbed it)".into(),
            json!({ "erased": true, "usage": usage }),
        );
    }
    let as_ = |t: &str| format!("{t} (does not read back)");
    match s.name.as_str() {
        step::SCREEN => match serde_json::from_value::<Screened>(out.clone()) {
            Ok(Screened {
                decision,
                moderation,
            }) => {
                let says = match &decision {
                    None => format!("crisis screen of {}: nothing found", s.key),
                    Some(d) => format!(
                        "crisis screen of {}: FLAGGED {} by layer {}",
                        s.key,
                        d.category.as_str(),
                        d.layer.as_str()
                    ),
                };
                let moderation_says = moderation.as_deref().unwrap_or("not configured");
                (
                    format!("{says} (moderation endpoint: {moderation_says})"),
                    json!({ "message": s.key, "decision": decision, "moderation": moderation }),
                )
            }
            Err(_) => (as_("crisis screen"), out.clone()),
        },
        step::CRISIS => match serde_json::from_value::<Flagged>(out.clone()) {
            Ok(f) => (
                format!(
                    "crisis protocol for {}: {} ({}), layer {}, referral {}",
                    s.key,
                    f.category.as_str(),
                    f.lang,
                    f.layer.as_str(),
                    if f.referred {
                        "owed"
                    } else {
                        "already sent this window"
                    }
                ),
                json!({ "message": s.key, "category": f.category.as_str(), "lang": f.lang,
                        "layer": f.layer.as_str(), "referred": f.referred }),
            ),
            Err(_) => (as_("crisis protocol"), out.clone()),
        },
        step::REFERRAL => (
            "referral counted against the conversation's window".into(),
            json!({}),
        ),
        step::REFERRAL_MESSAGE => {
            let id = out["id"].as_str().unwrap_or("?");
            (
                format!("crisis referral {id} fixed"),
                json!({ "reply": id }),
            )
        }
        step::ALERT => (
            "moderators alerted (ids, category, layer; never the text)".into(),
            json!({}),
        ),
        step::AFTER_FLAG => {
            let flagged = out.as_bool() == Some(true);
            let says = match flagged {
                true => "the model flagged the message before: answered with the safety brief",
                false => "no model flag on the message before",
            };
            (says.into(), json!({ "after_flag": flagged }))
        }
        step::UNDER_13 => (
            "a user under 13: today's one line counted".into(),
            json!({}),
        ),
        step::TURN => (
            "gate: counted against the user's flood allowance".into(),
            json!({ "tally": s.tally }),
        ),
        step::BUSY => (
            "gate: the busy line counted for this window".into(),
            json!({ "tally": s.tally }),
        ),
        step::FLOOD => match serde_json::from_value::<FloodDecision>(out.clone()) {
            Ok(FloodDecision { by: None }) => (
                "gate: under the flood limit".into(),
                json!({ "limited": false }),
            ),
            Ok(FloodDecision { by: Some(by) }) if by == job => (
                "gate: OVER the flood limit; this job says the busy line".into(),
                json!({ "limited": true, "busy_line_by": by }),
            ),
            Ok(FloodDecision { by: Some(by) }) => (
                format!("gate: OVER the flood limit; job {by}'s busy line answers it"),
                json!({ "limited": true, "busy_line_by": by }),
            ),
            Err(_) => (as_("flood decision"), out.clone()),
        },
        step::ROUTE => match serde_json::from_value::<Route>(out.clone()) {
            Ok(r) => {
                let who: Vec<String> = r.speakers.iter().map(|b| name(names, Some(b))).collect();
                (
                    format!(
                        "route: {} (why: {})",
                        if who.is_empty() {
                            "nobody".into()
                        } else {
                            who.join(", ")
                        },
                        r.why
                    ),
                    json!({ "speakers": r.speakers, "why": r.why }),
                )
            }
            Err(_) => (as_("route"), out.clone()),
        },
        step::GATE => match out.as_str() {
            Some(reason) => (
                format!("gate: dropped ({reason})"),
                json!({ "dropped": reason }),
            ),
            None => ("gate: passed".into(), json!({ "dropped": null })),
        },
        step::CAP => (
            "gate: counted against the daily follow-up cap".into(),
            json!({ "tally": s.tally }),
        ),
        step::BURST => match serde_json::from_value::<Burst>(out.clone()) {
            Ok(b) => {
                let ids: Vec<&str> = b.covers.iter().map(|c| c.message_id.as_str()).collect();
                let says = match ids.is_empty() {
                    true => "burst: no later message joined".into(),
                    false => format!(
                        "burst: answers {} later message(s) too: {}",
                        ids.len(),
                        ids.join(", ")
                    ),
                };
                (says, json!({ "covers": ids }))
            }
            Err(_) => (as_("burst"), out.clone()),
        },
        step::LLM => match serde_json::from_value::<LlmRecord>(out.clone()) {
            Ok(r) => llm(&r, names),
            Err(_) => (as_("model call"), out.clone()),
        },
        step::TOOL => match serde_json::from_value::<ToolRecord>(out.clone()) {
            Ok(t) => (
                format!(
                    "tool {} (round {}): arguments {} bytes, {}, {} ms",
                    t.tool,
                    t.round,
                    t.args.len(),
                    if t.ok { "ok" } else { "error" },
                    t.ms
                ),
                json!({ "tool": t.tool, "round": t.round, "args_bytes": t.args.len(), "ok": t.ok, "ms": t.ms }),
            ),
            Err(_) => (as_("tool call"), out.clone()),
        },
        step::MODEL_FAILED => match serde_json::from_value::<FailedCall>(out.clone()) {
            Ok(f) => (
                format!(
                    "model request FAILED: {} ({}), {} after {} ms",
                    f.model, f.error, f.class, f.ms
                ),
                json!({ "model": f.model, "error": f.error, "class": f.class, "ms": f.ms }),
            ),
            Err(_) => (as_("failed model request"), out.clone()),
        },
        step::FIXED_LINE => {
            let line = out["line"].as_str().unwrap_or("unknown");
            let why = out["why"].as_str().unwrap_or("unknown");
            (
                format!("fixed line: the {line} line instead of the model's answer, because {why}"),
                json!({ "line": line, "why": why }),
            )
        }
        step::FLOW => ("the user's guided flow read".into(), json!({})),
        step::QUOTA => (
            "a write counted against the user's hourly quota".into(),
            json!({ "tally": s.tally }),
        ),
        step::REPLY => match serde_json::from_value::<Reply>(out.clone()) {
            Ok(r) => reply(&r, names),
            Err(_) => (as_("reply"), out.clone()),
        },
        step::STORE_REPLY => (
            "delivered: the message stored in dm_messages".into(),
            json!({}),
        ),
        step::HISTORY if s.key == crate::journal::names::key::USER => (
            "kept in history without an answer of its own".into(),
            json!({}),
        ),
        step::HISTORY => ("delivered: history written".into(), json!({})),
        step::TOUCH => (
            "delivered: the conversation's last message updated".into(),
            json!({}),
        ),
        step::PUBLISH => ("delivered: completion published".into(), json!({})),
        step::WITHDRAW => (
            "WITHDRAWN after it went out (deleted meanwhile)".into(),
            json!({}),
        ),
        step::MEMORY_TRIGGER => ("memory told of the turn".into(), json!({})),
        step::TEXT_SHOWN => {
            let who = out["operator"].as_str().unwrap_or("?");
            let says = match out["shown"].as_bool() {
                Some(true) => format!("text shown to {who} (companion explain --show-text)"),
                _ => format!("text asked by {who}, withheld"),
            };
            (says, out.clone())
        }
        other => (other.replace('_', " "), json!({})),
    }
}

/// A model call in words and fields.
fn llm(r: &LlmRecord, names: &HashMap<String, String>) -> (String, Value) {
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
            .map_or(String::new(), |b| format!(" as {}", name(names, Some(b)))),
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

/// A companion message in words and fields (never its text).
fn reply(r: &Reply, names: &HashMap<String, String>) -> (String, Value) {
    let hooks = match &r.hooked {
        None => "outgoing hook: unknown".to_owned(),
        Some(h) => format!(
            "clipped {}, {}, disclosure {}",
            yes_no(h.clipped),
            h.replaced
                .as_deref()
                .map_or("output check passed".into(), |w| format!(
                    "REPLACED by the output check ({w})"
                )),
            if r.marks.ai_disclosure {
                "added"
            } else {
                "not due"
            }
        ),
    };
    let hits = |v: &[(String, Option<f32>)]| {
        v.iter()
            .map(|(id, s)| s.map_or(id.clone(), |s| format!("{id} ({s:.2})")))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let recalled = match &r.recalled {
        // Kept since the hook's changes are: not composed by the model with them.
        None if r.hooked.is_some() => "nothing recalled".to_owned(),
        None => "recalled: unknown".to_owned(),
        Some(k) => format!(
            "knowledge [{}], memory [{}]",
            hits(&k.knowledge),
            hits(&k.memory)
        ),
    };
    let says = format!(
        "message {}{} fixed: {} chars{}; {hooks}; {recalled}",
        r.id,
        r.bot
            .as_deref()
            .map_or(String::new(), |b| format!(" by {}", name(names, Some(b)))),
        r.content.chars().count(),
        if r.last {
            ", a fixed line (nobody speaks after it)"
        } else {
            ""
        },
    );
    let facts = json!({
        "reply": r.id, "bot": r.bot, "chars": r.content.chars().count(), "fixed_line": r.last,
        "clipped": r.hooked.as_ref().map(|h| h.clipped),
        "replaced": r.hooked.as_ref().map(|h| h.replaced.clone()),
        "disclosure": r.hooked.as_ref().map(|_| r.marks.ai_disclosure),
        "referral": r.marks.safety, "recalled": r.recalled,
    });
    (says, facts)
}

/// The story as text.
fn render(e: &Explained, names: &HashMap<String, String>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "message {}", e.asked);
    if let Some(seq) = e.follower_seq {
        let _ = writeln!(
            out,
            "  a later message of a burst (stream seq {}): answered by the reply of job {}",
            or_unknown(seq),
            e.job
        );
    }
    let companion = match &e.bot {
        Some(b) => format!("{} ({b})", name(names, Some(b))),
        None => "several (group)".into(),
    };
    let _ = writeln!(
        out,
        "job {} ({}), user {}, companion {companion}, conversation {}",
        e.job, e.kind, e.user, e.conversation
    );
    let _ = writeln!(
        out,
        "arrived {} (stream seq {}), delivered {} time(s), reply generation {}",
        e.arrived.format("%Y-%m-%d %H:%M:%S%.3f UTC"),
        or_unknown(e.stream_seq),
        e.deliveries,
        e.generation
    );
    for ev in &e.events {
        let ms = (ev.at - e.arrived).num_milliseconds();
        let slot = ev
            .slot
            .filter(|_| e.bot.is_none())
            .map_or(String::new(), |n| format!(" [slot {n}]"));
        let secs = ms as f64 / 1000.0;
        let _ = writeln!(out, "  {secs:>+7.3}s  {:<16} {}{slot}", ev.step, ev.says);
    }
    let _ = write!(
        out,
        "ended {} at {}",
        e.state,
        e.ended.format("%Y-%m-%d %H:%M:%S%.3f UTC")
    );
    for (what, v) in [
        ("answered by", &e.covered_by),
        ("reason", &e.reason),
        ("last error", &e.last_error),
    ] {
        if let Some(v) = v {
            let _ = write!(out, "; {what}: {v}");
        }
    }
    out.push('\n');
    if let Some(why) = &e.text_withheld {
        let _ = writeln!(out, "text {why}");
    }
    if let Some(said) = &e.text {
        let _ = writeln!(out, "text (this look is audited):");
        for s in said {
            let _ = writeln!(out, "  {} {}: {}", s.from, s.message, s.text);
        }
    }
    out
}
