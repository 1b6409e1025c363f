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
    journal::{
        JournalError, StepKind, Tell, Told,
        names::key::Slot,
        or_unknown,
        story::{self, JobRow, StepRow, Story},
    },
    pipeline::Reply,
    store::{Pg, StoreError},
};

/// The steps' names where the story's order and slots match on them (a pattern needs a constant).
mod step {
    use crate::pipeline::{burst, deliver, gate, incoming, kind};
    use crate::tools;

    pub(super) const SCREEN: &str = incoming::SCREEN.name;
    pub(super) const CRISIS: &str = incoming::CRISIS.name;
    pub(super) const REFERRAL: &str = incoming::REFERRAL.name;
    pub(super) const REFERRAL_MESSAGE: &str = crate::pipeline::REFERRAL_MESSAGE.name;
    pub(super) const ALERT: &str = incoming::ALERT.name;
    pub(super) const UNDER_13: &str = gate::UNDER_13_LINE.name;
    pub(super) const ROUTE: &str = crate::group::ROUTE.name;
    pub(super) const GATE: &str = kind::follow_up::GATE.name;
    pub(super) const CAP: &str = kind::follow_up::CAP.name;
    pub(super) const TURN: &str = crate::flood::TURN.name;
    pub(super) const BUSY: &str = crate::flood::BUSY.name;
    pub(super) const FLOOD: &str = crate::pipeline::FLOOD.name;
    pub(super) const AFTER_FLAG: &str = gate::AFTER_FLAG.name;
    pub(super) const BURST: &str = burst::BURST.name;
    pub(super) const FLOW: &str = kind::dm::FLOW.name;
    pub(super) const FLOW_CHANGE: &str = crate::flow::state::FLOW_CHANGE.name;
    pub(super) const LLM: &str = crate::calls::LLM.name;
    pub(super) const MODEL_FAILED: &str = crate::calls::MODEL_FAILED.name;
    pub(super) const FIXED_LINE: &str = crate::pipeline::reply::FIXED_LINE.name;
    pub(super) const TOOL: &str = tools::TOOL.name;
    pub(super) const QUOTA: &str = tools::QUOTA.name;
    pub(super) const REMEMBER: &str = tools::REMEMBER.name;
    pub(super) const REMEMBER_QUOTA: &str = tools::REMEMBER_QUOTA.name;
    pub(super) const FORGET: &str = tools::FORGET.name;
    pub(super) const REPLY: &str = crate::pipeline::REPLY.name;
    pub(super) const STORE_REPLY: &str = deliver::STORE_REPLY.name;
    pub(super) const HISTORY: &str = deliver::HISTORY.name;
    pub(super) const TOUCH: &str = deliver::TOUCH.name;
    pub(super) const PUBLISH: &str = deliver::PUBLISH.name;
    pub(super) const WITHDRAW: &str = deliver::WITHDRAW.name;
    pub(super) const TEXT_SHOWN: &str = crate::journal::story::TEXT_SHOWN.name;
}

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
        read(story, &crate::pipeline::burst::BURST)
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
fn read<T: serde::de::DeserializeOwned>(story: &Story, kind: &StepKind<T>) -> Option<T> {
    let s = story.steps.iter().find(|s| s.name == kind.name)?;
    serde_json::from_value(s.output.clone()).ok()
}

/// A companion by name, else by id (`?` when the record has none), as a step's telling names one.
fn name(names: &HashMap<String, String>, bot: Option<&str>) -> String {
    crate::journal::companion_name(names, bot.unwrap_or("?"))
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

/// Every step kind the journal holds, each told by the stage that records it.
fn steps() -> impl Iterator<Item = &'static dyn Tell> {
    let story: [&'static dyn Tell; 2] = [&story::TEXT_SHOWN, &crate::group::ROUTE];
    crate::pipeline::STEPS
        .iter()
        .chain(companion_limits::STEPS)
        .chain(companion_memory::STEPS)
        .chain(companion_flows::STEPS)
        .chain(companion_tools::STEPS)
        .copied()
        .chain(crate::takeover::STEPS)
        .chain(story)
}

/// A step in words and in fields, read by the kind that records it; a step no kind reads is told by its
/// name.
fn describe(s: &StepRow, job: &str, names: &HashMap<String, String>) -> (String, Value) {
    let out = &s.output;
    if out.get("erased").is_some() {
        let usage = out.get("usage").cloned().unwrap_or(Value::Null);
        return (
            "recorded, then erased (a deletion scrubbed it)".into(),
            json!({ "erased": true, "usage": usage }),
        );
    }
    let told = Told {
        key: &s.key,
        job,
        tally: s.tally.as_deref(),
        names,
    };
    let spaced = s.name.replace('_', " ");
    match steps().find(|k| k.name() == s.name) {
        None => (spaced, json!({})),
        Some(kind) => kind
            .tell(&told, out)
            .unwrap_or_else(|| (format!("{spaced} (does not read back)"), out.clone())),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The step names journals hold (`job_steps.name`), as the build before typed steps (929b91f) wrote
    /// them: a kind renamed would leave old records unread.
    const WRITTEN: [&str; 41] = [
        "after_flag",
        "alert",
        "burst",
        "busy",
        "cap",
        "catch_up",
        "crisis",
        "erase",
        "erase_streams",
        "fixed_line",
        "flood",
        "flow",
        "flow_change",
        "forget",
        "gate",
        "history",
        "llm",
        "memory_batch",
        "memory_facts",
        "memory_summary",
        "memory_trigger",
        "model_failed",
        "moderator_history",
        "publish",
        "quota",
        "rebuild",
        "referral",
        "referral_message",
        "remember",
        "remember_quota",
        "reply",
        "route",
        "screen",
        "store_reply",
        "takeover",
        "text_shown",
        "tool",
        "touch",
        "turn",
        "under_13",
        "withdraw",
    ];

    #[test]
    fn every_step_kind_keeps_the_name_old_journals_hold() {
        let mut names: Vec<&str> = steps().map(|k| k.name()).collect();
        names.sort_unstable();
        assert_eq!(names, WRITTEN, "one kind per name, every name kept");
        let mut packed: Vec<&str> = steps().filter(|k| k.packable()).map(|k| k.name()).collect();
        packed.sort_unstable();
        assert_eq!(
            packed,
            [
                "after_flag",
                "flood",
                "history",
                "memory_trigger",
                "publish",
                "store_reply",
                "touch"
            ],
            "the records packed as before"
        );
        assert!(!WRITTEN.contains(&crate::journal::names::PACKED));
    }

    /// One record of a journal the build before wrote.
    #[derive(serde::Deserialize)]
    struct Written {
        name: String,
        key: String,
        tally: Option<String>,
        output: Value,
    }

    /// Records the build before typed steps (929b91f) wrote, taken from its integration tests' journals
    /// (`job_records`, up to four of each shape per step; every step but `under_13`, which no test's
    /// journal held): each reads back as its kind's record, as a replay reads it, and is told from it.
    #[test]
    fn a_journal_the_build_before_wrote_reads_back_and_is_told() {
        let rows: Vec<Written> =
            serde_json::from_str(include_str!("../tests/fixtures/journal-929b91f.json")).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        let names = HashMap::new();
        for r in &rows {
            let kind = steps().find(|k| k.name() == r.name).expect(&r.name);
            assert!(kind.reads(&r.output), "{} {} {}", r.name, r.key, r.output);
            let row = StepRow {
                name: r.name.clone(),
                key: r.key.clone(),
                tally: r.tally.clone(),
                output: r.output.clone(),
                at: Utc::now(),
            };
            let (says, _) = describe(&row, "job", &names);
            assert!(!says.contains("does not read back"), "{says}");
            seen.insert(r.name.as_str());
        }
        assert_eq!(seen.len(), WRITTEN.len() - 1, "{seen:?}");
    }
}
