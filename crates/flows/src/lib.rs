//! Guided flows: multi-step sessions a companion leads a user through over days (plan a season, add a
//! spot, coach a trick). A flow is data (`flows/*.json`, [`FlowDef`]): steps with a goal for the model,
//! typed slots to fill, the tools the step uses, what it may wait for, and the next step (with simple
//! conditions on slots). The model does the talking and moves the flow with tools (`start_flow`,
//! `set_flow_slots`, `leave_flow`); where the user stands lives in PostgreSQL ([`state`]), keyed by
//! (user, companion), and every change is a journal step keyed by the tool call (or the event) that made
//! it, so a retried turn never moves a flow twice.

pub mod state;

use companion_journal as journal;
use companion_store::store;

/// The journal steps this crate records, each told as `companion explain` tells it.
pub const STEPS: &[&dyn journal::Tell] = &[&state::FLOW_CHANGE];

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::Path,
};

use crate::store::Pool;
use serde::Deserialize;
use serde_json::{Value, json};

/// One flow, as written in its file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowDef {
    /// Stable id, the file's name without `.json` (`season_plan`).
    pub id: String,
    /// What the user sees it called.
    pub(crate) title: String,
    /// For the model: when to offer it.
    pub(crate) offer: String,
    /// The first step.
    pub start: String,
    pub steps: BTreeMap<String, StepDef>,
}

/// One step of a flow.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepDef {
    /// What the companion should get done in this step, for the model.
    pub(crate) goal: String,
    /// Values the step must fill (by `set_flow_slots`), by name.
    #[serde(default)]
    pub(crate) slots: BTreeMap<String, SlotDef>,
    /// Tools the step uses (named to the model; they must exist).
    #[serde(default)]
    pub(crate) tools: Vec<String>,
    /// Entered with its slots filled, the flow waits here for an event before going on.
    #[serde(default)]
    pub(crate) wait: Option<Wait>,
    /// Where the flow goes once the step's required slots are filled (or its wait is over); the first
    /// rule whose condition holds wins. None: the flow ends after this step.
    #[serde(default)]
    pub(crate) next: Option<Next>,
}

/// A slot's type and whether the step needs it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SlotDef {
    #[serde(rename = "type")]
    pub(crate) kind: SlotType,
    /// For the model: what to put there.
    #[serde(default)]
    pub(crate) description: Option<String>,
    /// For `enum`: the allowed values.
    #[serde(default)]
    pub(crate) values: Vec<String>,
    #[serde(default = "yes")]
    pub(crate) required: bool,
}

fn yes() -> bool {
    true
}

/// What a slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SlotType {
    /// Up to 300 characters.
    Text,
    Integer,
    Number,
    Boolean,
    /// One of `values`.
    Enum,
    /// A 24-hex ObjectId (a tricklist, a spot draft).
    Id,
    /// `YYYY-MM-DD`.
    Date,
    /// Up to 20 texts.
    List,
}

/// An event a step waits for.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Wait {
    /// `spot_review` (the review of the draft whose id is in `slot`) or `reminder` (the reminder whose id
    /// is in `slot` comes due).
    #[serde(rename = "for")]
    pub(crate) kind: WaitKind,
    /// The slot (of this step or an earlier one) holding the id waited on.
    pub(crate) slot: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitKind {
    SpotReview,
    Reminder,
}

impl WaitKind {
    /// How a flow's `waiting_for` names the event: `<kind>:<id>`.
    pub fn key(self, id: &str) -> String {
        match self {
            Self::SpotReview => format!("spot_draft:{id}"),
            Self::Reminder => format!("reminder:{id}"),
        }
    }
}

/// Where a finished step leads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Go {
    To(String),
    /// Rules of which none holds yet: the step goes on.
    Stay,
    /// No next step: the flow is done.
    End,
}

/// The next step: one name, or rules tried in order (none holding: the step goes on).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Next {
    To(String),
    Rules(Vec<Rule>),
}

/// `{"if": {"slot": "level", "equals": "beginner"}, "to": "basics"}`; a rule without `if` always holds.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Rule {
    #[serde(default, rename = "if")]
    pub(crate) condition: Option<Condition>,
    pub(crate) to: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Condition {
    pub(crate) slot: String,
    /// Holds when the slot equals this value.
    #[serde(default)]
    pub(crate) equals: Option<Value>,
    /// Holds when the slot is one of these values.
    #[serde(default, rename = "in")]
    pub(crate) one_of: Option<Vec<Value>>,
}

impl Condition {
    fn holds(&self, slots: &serde_json::Map<String, Value>) -> bool {
        let Some(v) = slots.get(&self.slot) else {
            return false;
        };
        self.equals.as_ref().is_none_or(|e| e == v)
            && self.one_of.as_ref().is_none_or(|o| o.contains(v))
    }
}

/// Why the flow files cannot be used. The worker does not start with them.
#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a valid flow file: {source}")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
    #[error("{path}: {why}")]
    Invalid { path: String, why: String },
    #[error("character `{character}` offers flow `{flow}`, which no flow file defines")]
    UnknownFlow { character: String, flow: String },
}

impl FlowDef {
    pub(crate) fn step(&self, id: &str) -> Option<&StepDef> {
        self.steps.get(id)
    }

    /// Where the flow goes after `step` with these slots.
    pub(crate) fn next_after(&self, step: &str, slots: &serde_json::Map<String, Value>) -> Go {
        let Some(next) = self.step(step).and_then(|s| s.next.as_ref()) else {
            return Go::End;
        };
        match next {
            Next::To(to) => Go::To(to.clone()),
            Next::Rules(rules) => rules
                .iter()
                .find(|r| r.condition.as_ref().is_none_or(|c| c.holds(slots)))
                .map_or(Go::Stay, |r| Go::To(r.to.clone())),
        }
    }

    /// Every problem of the definition: unknown steps and tools, steps no path reaches, slots without a
    /// usable type, waits on slots that do not exist.
    pub(crate) fn problems(&self, known_tools: &[&str]) -> Vec<String> {
        let mut out = Vec::new();
        if !self.steps.contains_key(&self.start) {
            out.push(format!("start step `{}` is not a step", self.start));
        }
        let mut all_slots: HashSet<&str> = HashSet::new();
        for step in self.steps.values() {
            all_slots.extend(step.slots.keys().map(String::as_str));
        }
        for (id, step) in &self.steps {
            for t in &step.tools {
                if !known_tools.contains(&t.as_str()) {
                    out.push(format!("step `{id}` uses unknown tool `{t}`"));
                }
            }
            for (name, slot) in &step.slots {
                if slot.kind == SlotType::Enum && slot.values.is_empty() {
                    out.push(format!(
                        "step `{id}`: slot `{name}` is an enum without `values`"
                    ));
                }
            }
            for to in step.targets() {
                if !self.steps.contains_key(to) {
                    out.push(format!("step `{id}` goes to unknown step `{to}`"));
                }
            }
            if let Some(w) = &step.wait
                && !all_slots.contains(w.slot.as_str())
            {
                out.push(format!(
                    "step `{id}` waits on slot `{}`, which no step has",
                    w.slot
                ));
            }
            if let Some(Next::Rules(rules)) = &step.next {
                for c in rules.iter().filter_map(|r| r.condition.as_ref()) {
                    if !all_slots.contains(c.slot.as_str()) {
                        out.push(format!(
                            "step `{id}` has a condition on slot `{}`, which no step has",
                            c.slot
                        ));
                    }
                }
            }
        }
        let mut seen: HashSet<&str> = HashSet::new();
        let mut todo = vec![self.start.as_str()];
        while let Some(s) = todo.pop() {
            if seen.insert(s)
                && let Some(step) = self.steps.get(s)
            {
                todo.extend(step.targets());
            }
        }
        for id in self.steps.keys() {
            if !seen.contains(id.as_str()) {
                out.push(format!("step `{id}` is unreachable from `{}`", self.start));
            }
        }
        out
    }
}

impl StepDef {
    fn targets(&self) -> Vec<&str> {
        match &self.next {
            None => Vec::new(),
            Some(Next::To(t)) => vec![t.as_str()],
            Some(Next::Rules(r)) => r.iter().map(|r| r.to.as_str()).collect(),
        }
    }

    /// The JSON Schema of the step's slots: what `set_flow_slots` accepts here, shown to the model.
    pub fn schema(&self) -> Value {
        let mut properties = serde_json::Map::new();
        for (name, slot) in &self.slots {
            let mut s = match slot.kind {
                SlotType::Text => json!({"type": "string", "minLength": 1, "maxLength": 300}),
                SlotType::Integer => json!({"type": "integer"}),
                SlotType::Number => json!({"type": "number"}),
                SlotType::Boolean => json!({"type": "boolean"}),
                SlotType::Enum => json!({"type": "string", "enum": slot.values}),
                SlotType::Id => json!({"type": "string", "pattern": "^[0-9a-fA-F]{24}$"}),
                SlotType::Date => {
                    json!({"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"})
                }
                SlotType::List => json!({
                    "type": "array", "maxItems": 20,
                    "items": {"type": "string", "minLength": 1, "maxLength": 100}
                }),
            };
            if let Some(d) = &slot.description {
                s["description"] = json!(d);
            }
            properties.insert(name.clone(), s);
        }
        json!({"type": "object", "properties": properties, "additionalProperties": false})
    }

    /// Required slots not yet filled.
    pub(crate) fn missing(&self, slots: &serde_json::Map<String, Value>) -> Vec<String> {
        self.slots
            .iter()
            .filter(|(n, s)| s.required && !slots.contains_key(*n))
            .map(|(n, _)| n.clone())
            .collect()
    }
}

/// Every flow, by id.
#[derive(Clone, Debug, Default)]
pub struct Flows {
    by_id: HashMap<String, FlowDef>,
}

impl Flows {
    /// Reads and checks every `*.json` in `dir` (a missing directory means no flows); tools are checked
    /// against `known_tools`.
    pub fn load(dir: &Path, known_tools: &[&str]) -> Result<Self, FlowError> {
        let mut by_id = HashMap::new();
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(source) => {
                return Err(FlowError::Io {
                    path: dir.display().to_string(),
                    source,
                });
            }
        };
        let mut paths: Vec<_> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        for path in paths {
            let shown = path.display().to_string();
            let text = std::fs::read_to_string(&path).map_err(|source| FlowError::Io {
                path: shown.clone(),
                source,
            })?;
            let def: FlowDef = serde_json::from_str(&text).map_err(|source| FlowError::Parse {
                path: shown.clone(),
                source,
            })?;
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            let mut problems = def.problems(known_tools);
            if def.id != stem {
                problems.insert(
                    0,
                    format!("id `{}` is not the file's name `{stem}`", def.id),
                );
            }
            if !problems.is_empty() {
                return Err(FlowError::Invalid {
                    path: shown,
                    why: problems.join("; "),
                });
            }
            by_id.insert(def.id.clone(), def);
        }
        Ok(Self { by_id })
    }

    pub fn get(&self, id: &str) -> Option<&FlowDef> {
        self.by_id.get(id)
    }

    /// Every flow, in no particular order.
    pub fn all(&self) -> impl Iterator<Item = &FlowDef> {
        self.by_id.values()
    }

    /// Fails when a character offers a flow no file defines.
    pub fn check_offers<'a>(
        &self,
        offers: impl IntoIterator<Item = (&'a str, &'a [String])>,
    ) -> Result<(), FlowError> {
        for (character, flows) in offers {
            for f in flows {
                if !self.by_id.contains_key(f) {
                    return Err(FlowError::UnknownFlow {
                        character: character.to_owned(),
                        flow: f.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Moves a flow as far as its slots allow from its current step: a step with required slots missing
/// stays active; a step that waits starts waiting (for the id in its wait slot); a finished step goes on
/// to the next one; no next step ends the flow.
pub fn advance(def: &FlowDef, mut s: state::FlowState) -> state::FlowState {
    for _ in 0..=def.steps.len() {
        let Some(step) = def.step(&s.step) else { break };
        if !step.missing(&s.slots).is_empty() {
            s.status = state::status::ACTIVE.into();
            s.waiting_for = None;
            return s;
        }
        if let Some(w) = &step.wait
            && let Some(id) = s.slots.get(&w.slot).and_then(Value::as_str)
        {
            s.status = state::status::WAITING.into();
            s.waiting_for = Some(w.kind.key(id));
            return s;
        }
        match def.next_after(&s.step, &s.slots) {
            Go::To(next) if next != s.step => s.step = next,
            Go::To(_) | Go::Stay => {
                s.status = state::status::ACTIVE.into();
                s.waiting_for = None;
                return s;
            }
            Go::End => {
                s.status = state::status::DONE.into();
                s.waiting_for = None;
                return s;
            }
        }
    }
    s
}

/// The flow after the event its step waited for: on to the next step, and as far as it goes.
pub fn resume(def: &FlowDef, mut s: state::FlowState) -> state::FlowState {
    s.waiting_for = None;
    match def.next_after(&s.step, &s.slots) {
        Go::To(next) => {
            s.step = next;
            advance(def, s)
        }
        Go::Stay => {
            s.status = state::status::ACTIVE.into();
            s
        }
        Go::End => {
            s.status = state::status::DONE.into();
            s
        }
    }
}

/// The note a follow-up's brief gets when its news moved the user's flow on.
pub fn resumed_note(def: &FlowDef, s: &state::FlowState) -> String {
    format!(
        "\nThis also moves on the guided flow \"{}\" you lead the user through; it stands now: {}. Say \
         what comes next in the same message.",
        def.title,
        view(def, s)
    )
}

/// What the model is told about the flow: where it stands, what the step needs, what is filled.
pub fn view(def: &FlowDef, s: &state::FlowState) -> Value {
    let step = def.step(&s.step);
    let mut v = json!({
        "flow": def.id,
        "title": def.title,
        "status": s.status,
        "step": s.step,
        "filled": s.slots,
    });
    if let Some(step) = step {
        v["goal"] = json!(step.goal);
        v["missing"] = json!(step.missing(&s.slots));
        if !step.slots.is_empty() {
            v["slots"] = step.schema()["properties"].clone();
        }
        if !step.tools.is_empty() {
            v["tools"] = json!(step.tools);
        }
    }
    if let Some(w) = &s.waiting_for {
        v["waitingFor"] = json!(w);
    }
    v
}

/// What a turn knows of the user's flow with the companion, fixed once per turn (the journal's `flow`
/// step): the flow as it stands, and the one that expired at this turn (mentioned once).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, Deserialize)]
pub struct TurnFlow {
    pub(crate) current: Option<state::FlowState>,
    pub(crate) expired: Option<state::FlowState>,
}

impl TurnFlow {
    /// The user is in a flow with the companion (running, waiting or paused).
    pub fn open(&self) -> bool {
        self.current
            .as_ref()
            .is_some_and(|c| state::status::is_open(&c.status))
    }

    /// The flow of `user` with `bot`; an open one idle since before `idle_since` expires now.
    pub async fn load(
        pool: &Pool,
        user: &str,
        bot: &str,
        idle_since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Self, crate::store::StoreError> {
        Self::of(
            state::load(pool, user, bot).await?,
            pool,
            user,
            bot,
            idle_since,
        )
        .await
    }

    /// [`TurnFlow::load`] with the flow as read already (`current`, e.g. by [`state::RIDE`]).
    pub async fn of(
        current: Option<state::FlowState>,
        pool: &Pool,
        user: &str,
        bot: &str,
        idle_since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Self, crate::store::StoreError> {
        match current {
            Some(c) if state::status::is_open(&c.status) && c.updated_at < idle_since => {
                // Expired by this turn (not by another at the same moment): mentioned by this one.
                let expired = state::expire_idle(pool, user, bot, idle_since)
                    .await?
                    .then(|| c.clone());
                let mut current = c;
                current.status = state::status::EXPIRED.into();
                current.waiting_for = None;
                Ok(Self {
                    current: Some(current),
                    expired,
                })
            }
            current => Ok(Self {
                current,
                expired: None,
            }),
        }
    }

    /// The system prompt's section on flows: the open flow and its step, or the flows on offer; and an
    /// expired flow to mention once.
    pub fn prompt(&self, flows: &Flows, offered: &[String]) -> String {
        let mut p = String::new();
        if let Some(e) = &self.expired
            && let Some(def) = flows.get(&e.flow)
        {
            p.push_str(&format!(
                "\n## An unfinished flow\nThe user started \"{}\" with you and left it at step `{}` \
                 {} days ago; it has expired. You may mention it once if it fits, and offer to start \
                 over (start_flow).\n",
                def.title,
                e.step,
                (chrono::Utc::now() - e.updated_at).num_days()
            ));
        }
        let open = self
            .current
            .as_ref()
            .filter(|c| state::status::is_open(&c.status))
            .and_then(|c| Some((c, flows.get(&c.flow)?)));
        match open {
            Some((c, def)) => {
                p.push_str(&format!(
                    "\n## Guided flow in progress: {}\n{}\nWork towards the step's goal. Record what \
                     the user tells you with set_flow_slots (only what they said or a tool returned); \
                     the flow moves on by itself when the step is complete. If they want to stop or do \
                     something else, use leave_flow (pause=true to keep their progress).\n",
                    def.title,
                    view(def, c)
                ));
                if c.status == state::status::PAUSED {
                    p.push_str(
                        "The user paused it: only pick it up (start_flow) when they want to.\n",
                    );
                }
            }
            _ if !offered.is_empty() => {
                p.push_str("\n## Guided flows you can offer (start_flow)\n");
                for id in offered {
                    if let Some(def) = flows.get(id) {
                        p.push_str(&format!("- `{id}`: {}, when {}\n", def.title, def.offer));
                    }
                }
            }
            _ => {}
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(v: Value) -> FlowDef {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn problems_are_named() {
        let f = flow(json!({
            "id": "x", "title": "X", "offer": "o", "start": "a",
            "steps": {
                "a": {"goal": "g", "tools": ["no_such_tool"], "slots": {"k": {"type": "enum"}},
                      "next": [{"if": {"slot": "nope", "equals": 1}, "to": "b"}, {"to": "ghost"}]},
                "b": {"goal": "g", "wait": {"for": "spot_review", "slot": "missing"}},
                "island": {"goal": "g"}
            }
        }));
        let p = f.problems(&["create_tricklist"]).join("\n");
        for want in [
            "unknown tool `no_such_tool`",
            "slot `k` is an enum without `values`",
            "unknown step `ghost`",
            "waits on slot `missing`",
            "condition on slot `nope`",
            "step `island` is unreachable",
        ] {
            assert!(p.contains(want), "{want} in:\n{p}");
        }
        let bad_type: Result<FlowDef, _> = serde_json::from_value(json!({
            "id": "x", "title": "X", "offer": "o", "start": "a",
            "steps": {"a": {"goal": "g", "slots": {"k": {"type": "colour"}}}}
        }));
        assert!(bad_type.is_err(), "an unknown slot type is refused");
        let no_type: Result<FlowDef, _> = serde_json::from_value(json!({
            "id": "x", "title": "X", "offer": "o", "start": "a",
            "steps": {"a": {"goal": "g", "slots": {"k": {"description": "d"}}}}
        }));
        assert!(no_type.is_err(), "a slot without a type is refused");
    }

    #[test]
    fn next_follows_the_first_rule_that_holds() {
        let f = flow(json!({
            "id": "x", "title": "X", "offer": "o", "start": "a",
            "steps": {
                "a": {"goal": "g", "slots": {"level": {"type": "enum", "values": ["new", "pro"]}},
                      "next": [{"if": {"slot": "level", "equals": "new"}, "to": "basics"}, {"to": "pro"}]},
                "basics": {"goal": "g"}, "pro": {"goal": "g"}
            }
        }));
        let slots = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            f.next_after("a", &slots(json!({"level": "new"}))),
            Go::To("basics".into())
        );
        assert_eq!(
            f.next_after("a", &slots(json!({"level": "pro"}))),
            Go::To("pro".into())
        );
        assert_eq!(f.next_after("basics", &slots(json!({}))), Go::End);
        let schema = f.step("a").unwrap().schema();
        assert_eq!(schema["properties"]["level"]["enum"], json!(["new", "pro"]));
        assert_eq!(f.step("a").unwrap().missing(&slots(json!({}))), ["level"]);
    }

    #[test]
    fn a_flow_settles_as_far_as_its_slots_go_and_waits_where_it_must() {
        let f = flow(json!({
            "id": "w", "title": "W", "offer": "o", "start": "link",
            "steps": {
                "link": {"goal": "g", "slots": {"url": {"type": "text"}}, "next": "draft"},
                "draft": {"goal": "g", "slots": {"draft_id": {"type": "id"}}, "next": "review"},
                "review": {"goal": "g", "wait": {"for": "spot_review", "slot": "draft_id"}, "next": "done"},
                "done": {"goal": "tell them"}
            }
        }));
        let mut s = state::FlowState {
            flow: "w".into(),
            step: "link".into(),
            slots: serde_json::Map::new(),
            status: "active".into(),
            waiting_for: None,
            updated_at: chrono::Utc::now(),
        };
        s = advance(&f, s);
        assert_eq!((s.step.as_str(), s.status.as_str()), ("link", "active"));
        s.slots
            .insert("url".into(), json!("https://maps.app.goo.gl/x"));
        s = advance(&f, s);
        assert_eq!((s.step.as_str(), s.status.as_str()), ("draft", "active"));
        s.slots
            .insert("draft_id".into(), json!("65f000000000000000000001"));
        s = advance(&f, s);
        assert_eq!((s.step.as_str(), s.status.as_str()), ("review", "waiting"));
        assert_eq!(
            s.waiting_for.as_deref(),
            Some("spot_draft:65f000000000000000000001")
        );
        s = resume(&f, s);
        assert_eq!((s.step.as_str(), s.status.as_str()), ("done", "done"));
        assert_eq!(view(&f, &s)["status"], "done");
    }
}
