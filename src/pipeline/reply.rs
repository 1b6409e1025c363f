//! A companion message ([`Reply`]): what its model or its character wrote, as the pipeline carries it
//! from the outgoing hook to its `reply` step, which fixes it before it is delivered, and what its model
//! was given ([`Recalled`]).

use bson::oid::ObjectId;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::warn;

use super::outgoing;
use crate::{
    journal::{Job, StepKind, Telling, Told, names},
    memory::Recall,
};

/// A companion message, fixed before it is delivered ([`Reply`]), keyed by its reply generation and slot
/// ([`key::Slot::reply`]).
pub const REPLY: StepKind<Reply> = StepKind::new(names::REPLY).told(tell_reply);
/// The crisis referral's message, fixed before it is delivered (its delivery steps are keyed
/// [`key::crisis`]). Keyed by the user's message.
pub(crate) const REFERRAL_MESSAGE: StepKind<Reply> =
    StepKind::new("referral_message").told(|_, r| {
        (
            format!("crisis referral {} fixed", r.id),
            json!({ "reply": r.id }),
        )
    });

/// A companion message in words and fields (never its text).
fn tell_reply(t: &Told<'_>, r: &Reply) -> Telling {
    let yes_no = |b: bool| if b { "yes" } else { "no" };
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
            .map_or(String::new(), |b| format!(" by {}", t.name(b))),
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

/// A companion message, as its model or its character wrote it, and what the pipeline carries it as: the
/// outgoing hook shapes it, its `reply` step fixes it before it is delivered (so that every retry
/// delivers the same), and delivery writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reply {
    /// `_id` of the message in dm_messages.
    pub id: String,
    pub content: String,
    pub rich_content: Option<Value>,
    pub at: DateTime<Utc>,
    /// Compact log of the tool calls behind it, kept on the assistant's history row.
    pub tool_log: Option<Value>,
    /// What it is for the app (a referral, a disclosure, a break reminder, private to one user).
    #[serde(default, flatten)]
    pub marks: crate::bus::event::Marks,
    /// The companion speaking (bot user id, hex) where the job has several (a group); else the job's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bot: Option<String>,
    /// The companion its text names, which it hands over to (bounds permitting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<String>,
    /// A busy, budget or failure line: nobody speaks after it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub last: bool,
    /// What the outgoing hook changed (none: recorded before the hook said).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) hooked: Option<outgoing::Hooked>,
    /// The knowledge and memory its model was given (none: not composed by the model with them, or
    /// recorded before they were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) recalled: Option<Recalled>,
}

impl Reply {
    pub(crate) fn new(
        content: String,
        rich_content: Option<Value>,
        tool_log: Option<Value>,
    ) -> Self {
        Self {
            id: ObjectId::new().to_hex(),
            content,
            rich_content,
            at: Utc::now(),
            tool_log,
            marks: Default::default(),
            bot: None,
            tags: None,
            last: false,
            hooked: None,
            recalled: None,
        }
    }

    /// Stamps the message as said after `earlier`: a later time (at least a millisecond later, the
    /// precision of `dm_messages.timestamp`) and a later id, so that every reader that sorts by either
    /// shows `earlier` first. For a message composed before `earlier` but owed after it: the model's own
    /// reply when its flag raised the referral.
    pub(crate) fn stamp_after(&mut self, earlier: &Reply) {
        self.at = Utc::now().max(earlier.at + chrono::Duration::milliseconds(1));
        let mut id = ObjectId::new();
        if let Ok(before) = ObjectId::parse_str(&earlier.id)
            && id <= before
        {
            // `earlier` came from another process within the same second: the next second's id, with
            // this process's unique bytes and counter.
            let mut bytes = id.bytes();
            let second = u32::from_be_bytes(before.bytes()[..4].try_into().expect("4 bytes"));
            bytes[..4].copy_from_slice(&second.saturating_add(1).to_be_bytes());
            id = ObjectId::from_bytes(bytes);
        }
        self.id = id.to_hex();
    }
}

/// What a slot's model was given, kept on its `reply` step: the knowledge chunks (`kb_chunks.id`) and
/// the facts remembered (`memory_facts.id`), each with its similarity to the messages (none for a
/// pinned fact).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Recalled {
    pub(crate) knowledge: Vec<(String, Option<f32>)>,
    pub(crate) memory: Vec<(String, Option<f32>)>,
}

impl Recalled {
    pub(crate) fn of(knowledge: &[crate::rag::KnowledgeSnippet], memory: &Recall) -> Self {
        Self {
            knowledge: knowledge
                .iter()
                .map(|k| (k.id.to_string(), Some(k.score)))
                .collect(),
            memory: memory.ids().map(|(id, s)| (id.to_owned(), s)).collect(),
        }
    }
}

/// A note: why a fixed line (the failure line, the crisis line, the busy or budget line) stands in for the
/// model's answer, keyed `<reply key>@<attempt>.<n>`.
pub(crate) const FIXED_LINE: StepKind<FixedLine> = StepKind::new("fixed_line").told(|_, f| {
    (
        format!(
            "fixed line: the {} line instead of the model's answer, because {}",
            f.line, f.why
        ),
        serde_json::json!({ "line": f.line, "why": f.why }),
    )
});

/// The record of a [`FIXED_LINE`] note.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct FixedLine {
    /// Which line: crisis, busy, budget, under_13, failure.
    line: String,
    why: String,
}

/// Notes in the journal why a fixed line (`which`: crisis, busy, budget, under_13, failure) stands in for the
/// model's answer of the reply keyed `key` ([`FIXED_LINE`]); a note that cannot be written is logged.
pub(crate) async fn note_fixed_line(job: &Job, key: &str, which: &str, why: String) {
    let detail = FixedLine {
        line: which.to_owned(),
        why,
    };
    if let Err(e) = job.note(&FIXED_LINE, key, &detail).await {
        warn!(error = %e, "why a fixed line was said not noted in the journal");
    }
}
