//! The companion's tools: typed, validated actions on the app's data that the model may call.
//!
//! A tool is a type implementing [`Tool`]: a name, a description written for the model, an `Args` type
//! whose JSON Schema is generated ([`schema::parameters_for`]) and enforced ([`schema::ArgsSchema`]) before
//! the arguments are deserialized, and an async `call`. A tool holds what it works with (a store, a
//! bound), taken from [`ToolStores`] when the [`Registry`] is built once per process; the per-call
//! [`ToolContext`] holds only the call's identity, the user it acts for and its job. [`Registry`] erases
//! the types; adding a tool is one file and one line in [`each_tool`].
//!
//! Guardrails that hold for every tool: the acting user is always the event's sender (no argument can
//! name a user), writes pass the durable per-user quota ([`guard_write`], a counted journal step) and
//! are idempotent per (event message, tool call), text from the model or user is matched literally
//! ([`literal_regex`]), and no tool deletes or edits existing data.
//!
//! Errors: bad arguments, unknown tools, missing or forbidden content and an exhausted quota become an
//! error *result* the model can explain. A database error is not a result: a write may or may not have
//! happened, so the turn fails with the error's class (and is retried when transient), and the write's
//! identity (derived from the event and call) makes the retry harmless.
//!
//! What a call gave the model is kept as a [`ToolRecord`], the journal's record of the call.

pub(crate) mod cancel_reminder;
pub(crate) mod create_spot_draft;
pub(crate) mod create_tricklist;
pub mod flag_concern;
pub(crate) mod forget;
pub use forget::FORGET;
pub(crate) mod get_user_tricklists;
pub(crate) mod leave_flow;
pub(crate) mod maps;
pub(crate) mod mark_trick_landed;
pub mod more_tools;
pub(crate) mod offer;
pub use offer::{Offer, Signals, for_turn as offer_for_turn};
pub(crate) mod remember;
pub use remember::{REMEMBER, REMEMBER_QUOTA};
pub(crate) mod schedule_reminder;
pub(crate) mod schema;
pub(crate) mod search_spots;
pub(crate) mod search_trickipedia;
pub(crate) mod set_flow_slots;
pub(crate) mod share_content;
pub(crate) mod start_flow;

use std::{
    future::Future,
    panic::AssertUnwindSafe,
    sync::{Arc, LazyLock, OnceLock},
};

use bson::oid::ObjectId;
use chrono::{DateTime, Utc};
use futures::{FutureExt, future::BoxFuture};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

use crate::{
    bus::{Bus, BusError},
    failure::{Class, Classify},
    journal::{Admission, Counted, Job, JournalError, StepKind, Telling, Told, names},
    llm::{FunctionDef, ToolDef},
    store::{Mongo, Pg, StoreError},
    timing::{self, Stage},
};
use schema::ArgsSchema;

/// Longest search text accepted from the model (bounds regex scans).
pub(crate) const QUERY_MAX: usize = 100;
/// Longest name (tricklist, spot) accepted.
pub(crate) const NAME_MAX: usize = 100;
/// Raw argument text longer than this is refused before parsing.
pub(crate) const MAX_ARGS_BYTES: usize = 16 * 1024;

/// One call: who it acts for (the event's sender and nothing else), where, its identity and its job. What
/// a tool works with (stores, bounds) it holds itself ([`ToolStores`]).
#[derive(Clone)]
pub struct ToolContext<'a> {
    /// The event's sender: every tool reads and writes as this user only.
    pub user: ObjectId,
    /// The companion answering (a bot user).
    pub bot: ObjectId,
    /// The DM thread of the turn: what a tool creates remembers it, so a follow-up lands there.
    pub conversation: ObjectId,
    /// The character's display name, stamped on created content (`createdBy`, `submittedVia`).
    pub character: &'a str,
    /// The inbound event's dm_messages id: with the call's id, the identity of a write.
    pub message_id: ObjectId,
    /// The model's call being run (set per call).
    pub call: Call,
    /// When the call runs, as the user lives it.
    pub clock: Clock<'a>,
    /// The turn's journal: a write is counted against the quota as one of its steps.
    pub job: &'a Job,
    /// The flows this companion offers (`start_flow` starts only these).
    pub offered_flows: &'a [String],
    /// Long-term memory: the user's DM with this companion keeps it; a group chat does not.
    pub memory: crate::memory::Access<'a>,
}

/// The model's call a tool runs for.
#[derive(Clone, Debug, Default)]
pub struct Call {
    /// The model's id for it (unique within the turn).
    pub id: String,
    /// Its journal key (see [`call_key`]): the write quota counts a call once, and a flow change is
    /// made once.
    pub key: String,
}

/// The time of a call as its user lives it.
#[derive(Clone, Copy, Debug)]
pub struct Clock<'a> {
    /// The turn's clock (`createdAt`, the quota window).
    pub now: DateTime<Utc>,
    /// The user's IANA time zone (`users.timezone`), for quiet hours.
    pub time_zone: Option<&'a str>,
    /// A minor's quiet hours (start, end; local time): no reminder fires in them, whatever `exact` says.
    pub minor_quiet: Option<(chrono::NaiveTime, chrono::NaiveTime)>,
}

/// What the tools are built with, once per process: each tool keeps the parts it needs.
#[derive(Clone)]
pub struct ToolStores {
    pub mongo: Mongo,
    /// The service's database (reminders).
    pub pg: Pg,
    /// Where reminders are scheduled.
    pub bus: Bus,
    /// Every guided flow there is.
    pub flows: Arc<crate::flow::Flows>,
    pub reminders: ReminderBounds,
    /// Writes allowed per user per rolling hour.
    pub writes_per_hour: u32,
}

/// The configurable bounds of reminders.
#[derive(Clone, Copy, Debug)]
pub struct ReminderBounds {
    /// Shortest time ahead a reminder may be set for.
    pub min_lead: std::time::Duration,
}

/// The journal key of a call: its id and a hash of the tool and its arguments, so a forced replay that
/// reuses an id for another call never gets the first call's result.
pub fn call_key(tool_call_id: &str, tool: &str, raw_args: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(tool.as_bytes());
    h.update(b"\n");
    h.update(clip(raw_args, MAX_RECORDED_ARGS).as_bytes());
    let hex: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{tool_call_id}:{hex}")
}

/// What a successful call gives back: data for the model and maybe a card for the app.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolOutput {
    pub data: Value,
    pub(crate) card: Option<Value>,
}

impl ToolOutput {
    pub(crate) fn data(data: Value) -> Self {
        Self { data, card: None }
    }
    pub(crate) fn with_card(data: Value, card: Option<Value>) -> Self {
        Self { data, card }
    }
}

/// Why a call produced no output.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("unknown tool `{0}`")]
    UnknownTool(String),
    #[error("arguments are not valid JSON: {0}")]
    NotJson(String),
    #[error("invalid argument `{field}`: {message}")]
    InvalidArgs { field: String, message: String },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Forbidden(String),
    #[error(
        "write limit reached: at most {limit} things can be created per hour; try again in about {retry_after_mins} minutes"
    )]
    QuotaExceeded { limit: u32, retry_after_mins: i64 },
    #[error("the tool crashed")]
    Crashed,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The broker did not take a write (a reminder's schedule): like a database error, not a result.
    #[error(transparent)]
    Bus(#[from] BusError),
}

impl Classify for ToolError {
    /// A database's or the broker's failure is theirs (a server down is retried). Every other tool error
    /// is a result the model reads; one that reaches the turn instead is a bug, and trying the turn again
    /// would meet it again: permanent.
    fn class(&self) -> Class {
        match self {
            Self::Store(e) => e.class(),
            Self::Journal(e) => e.class(),
            Self::Bus(e) => e.class(),
            Self::UnknownTool(_)
            | Self::NotJson(_)
            | Self::InvalidArgs { .. }
            | Self::NotFound(_)
            | Self::Forbidden(_)
            | Self::QuotaExceeded { .. }
            | Self::Crashed => Class::Permanent,
        }
    }
}

impl ToolError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidArgs {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The error as the model sees it: `{"error": …}`, naming the field when there is one.
    pub fn to_model(&self) -> Value {
        let mut v = json!({ "error": self.to_string() });
        match self {
            Self::InvalidArgs { field, .. } => v["field"] = json!(field),
            Self::QuotaExceeded { limit, .. } => v["limit"] = json!(limit),
            _ => {}
        }
        v
    }
}

impl From<mongodb::error::Error> for ToolError {
    fn from(e: mongodb::error::Error) -> Self {
        Self::Store(StoreError::Mongo(e))
    }
}

impl From<sqlx::Error> for ToolError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(StoreError::Pg(e))
    }
}

// What a turn may need tools for. A turn is offered the tools of the groups it needs ([`offer`]), and
// the model can ask for another group with [`more_tools`]; a tool of the registry runs whether or not it
// was offered this turn (offering shortens the prompt, it does not grant anything). Plain comments: the
// enum is `more_tools`' argument, and doc comments would go to the model with its schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Group {
    // Looking tricks up, the user's tricklists, showing cards.
    Tricks,
    // Changing the user's tricklists: making one, checking off a landed trick.
    Lists,
    // Finding and adding spots.
    Spots,
    // Setting and cancelling reminders.
    Reminders,
    // Starting a guided flow.
    Flows,
    // Answering inside a guided flow (its slots, leaving it).
    InFlow,
    // Remembering and forgetting what the user asks.
    Memory,
}

impl Group {
    pub(crate) const ALL: [Group; 7] = [
        Group::Tricks,
        Group::Lists,
        Group::Spots,
        Group::Reminders,
        Group::Flows,
        Group::InFlow,
        Group::Memory,
    ];

    /// The group's bit in an [`offer::Offer`].
    pub(crate) const fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A typed tool.
pub(crate) trait Tool: Send + Sync + 'static {
    const NAME: &'static str;
    /// The groups whose turns are offered this tool.
    const GROUPS: &'static [Group];
    /// A call changes nothing (no write, no message, no count) and only reads: so a model answer that
    /// calls such tools alone may be asked again after a crash, and its record can wait for the reply's
    /// ([`Registry::reads_only`]). A tool that acts keeps the default.
    const READS_ONLY: bool = false;
    type Args: DeserializeOwned + JsonSchema + Send;
    /// Written for the model: when to use the tool and what it returns.
    fn description() -> &'static str;
    /// The tool, holding what it needs of `stores`.
    fn new(stores: &ToolStores) -> Self
    where
        Self: Sized;
    fn call(
        &self,
        ctx: &ToolContext<'_>,
        args: Self::Args,
    ) -> impl Future<Output = Result<ToolOutput, ToolError>> + Send;
}

/// A tool with its type erased: what runs a call.
trait DynTool: Send + Sync {
    fn name(&self) -> &'static str;
    fn call_json<'a>(
        &'a self,
        ctx: &'a ToolContext<'a>,
        raw: &'a str,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>>;
}

struct Erased<T> {
    /// The JSON Schema of `T::Args`, compiled from the value its definition shows the model
    /// ([`Registry::schema`]).
    schema: Arc<ArgsSchema>,
    tool: T,
}

impl<T: Tool> DynTool for Erased<T> {
    fn name(&self) -> &'static str {
        T::NAME
    }
    fn call_json<'a>(
        &'a self,
        ctx: &'a ToolContext<'a>,
        raw: &'a str,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let args = parse_args::<T::Args>(&self.schema, raw)?;
            self.tool.call(ctx, args).await
        })
    }
}

/// A tool as the model is offered it: its name, groups and definition, which need no store.
struct Def {
    name: &'static str,
    groups: &'static [Group],
    reads_only: bool,
    def: ToolDef,
    /// The arguments' schema, whose value `def` shows.
    schema: Arc<ArgsSchema>,
}

impl Def {
    fn of<T: Tool>() -> Self {
        let schema = Arc::new(ArgsSchema::of::<T::Args>());
        Self {
            name: T::NAME,
            groups: T::GROUPS,
            reads_only: T::READS_ONLY,
            def: ToolDef {
                kind: "function".into(),
                function: FunctionDef {
                    name: T::NAME.into(),
                    description: T::description().into(),
                    parameters: schema.value().clone(),
                },
            },
            schema,
        }
    }
}

/// Raw argument text → validated `A`. Empty text means `{}` (OpenRouter sends that for no-arg tools).
pub(crate) fn parse_args<A: DeserializeOwned>(
    schema: &ArgsSchema,
    raw: &str,
) -> Result<A, ToolError> {
    if raw.len() > MAX_ARGS_BYTES {
        return Err(ToolError::invalid(
            "(arguments)",
            format!("longer than {MAX_ARGS_BYTES} bytes"),
        ));
    }
    let raw = raw.trim();
    let mut value: Value = if raw.is_empty() {
        json!({})
    } else {
        serde_json::from_str(raw).map_err(|e| ToolError::NotJson(e.to_string()))?
    };
    if value.is_null() {
        value = json!({});
    }
    if !value.is_object() {
        return Err(ToolError::invalid("(arguments)", "must be a JSON object"));
    }
    schema::normalize(schema.value(), &mut value);
    let started = std::time::Instant::now();
    let checked = schema.validate(&value);
    timing::add(Stage::Validate, started);
    if let Err(v) = checked {
        if v.unexpected && is_user_field(&v.field) {
            return Err(ToolError::Forbidden(format!(
                "`{}` is not accepted: tools always act for the user you are talking to, never for anyone else",
                v.field
            )));
        }
        return Err(ToolError::InvalidArgs {
            field: v.field,
            message: v.message,
        });
    }
    serde_json::from_value(value).map_err(|e| ToolError::invalid("(arguments)", e.to_string()))
}

/// Argument names a model uses when it tries to act for someone else.
fn is_user_field(field: &str) -> bool {
    let f = field.to_ascii_lowercase().replace(['_', '-'], "");
    [
        "user",
        "userid",
        "owner",
        "ownerid",
        "submittedby",
        "createdby",
        "sender",
        "senderid",
        "username",
        "actor",
        "asuser",
        "foruser",
    ]
    .contains(&f.as_str())
}

/// The result of one dispatched call; never a panic.
#[derive(Debug)]
pub struct ToolResult {
    pub name: String,
    pub outcome: Result<ToolOutput, ToolError>,
}

/// What the tests read of a result.
#[cfg(any(test, feature = "testing"))]
impl ToolResult {
    /// The `content` of the tool message sent back to the model.
    pub fn model_content(&self) -> String {
        match &self.outcome {
            Ok(o) => o.data.to_string(),
            Err(e) => e.to_model().to_string(),
        }
    }
    #[cfg(feature = "testing")]
    pub fn card(&self) -> Option<&Value> {
        self.outcome.as_ref().ok().and_then(|o| o.card.as_ref())
    }
    pub fn is_ok(&self) -> bool {
        self.outcome.is_ok()
    }
}

impl ToolResult {
    /// What the model was given, for the journal; `None` for a database failure, which is not a result
    /// (the turn fails and the call runs again on the next attempt).
    pub fn record(self, raw_args: &str, round: u32, ms: u64) -> Result<ToolRecord, ToolError> {
        let (ok, content, card) = match self.outcome {
            Ok(o) => (true, o.data, o.card),
            // A server's failure is the turn's (retried); every other error the model reads.
            Err(e @ (ToolError::Store(_) | ToolError::Journal(_) | ToolError::Bus(_))) => {
                return Err(e);
            }
            Err(e) => (false, e.to_model(), None),
        };
        Ok(ToolRecord {
            tool: self.name,
            args: clip(raw_args, MAX_RECORDED_ARGS),
            ok,
            content,
            card,
            round,
            ms,
        })
    }
}

/// One tool call's result, as the model saw it, keyed by the call ([`call_key`]).
pub const TOOL: StepKind<ToolRecord> = StepKind::new("tool").told(tell_tool);
/// A write counted against the user's hourly quota (tally [`names::tally::writes`]), keyed by the call.
pub const QUOTA: StepKind<Counted> = StepKind::new("quota")
    .says(|t| crate::flood::counted(t, "a write counted against the user's hourly quota"));

fn tell_tool(_: &Told<'_>, t: &ToolRecord) -> Telling {
    let says = format!(
        "tool {} (round {}): arguments {} bytes, {}, {} ms",
        t.tool,
        t.round,
        t.args.len(),
        if t.ok { "ok" } else { "error" },
        t.ms
    );
    let facts = json!({ "tool": t.tool, "round": t.round, "args_bytes": t.args.len(), "ok": t.ok, "ms": t.ms });
    (says, facts)
}

/// Longest argument text kept in a call's record.
const MAX_RECORDED_ARGS: usize = 4000;

/// One call as the model saw it: the journal's record of the call (and the audit of tool use).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolRecord {
    pub tool: String,
    /// The arguments as the model wrote them (at most 4000 characters).
    pub args: String,
    pub ok: bool,
    /// What the model reads: the data, or `{"error": …}`.
    pub content: Value,
    /// The card for the app, when the call made one.
    pub card: Option<Value>,
    /// Tool round of the turn (1 first).
    pub round: u32,
    /// How long the call took, milliseconds.
    pub ms: u64,
}

impl ToolRecord {
    /// The compact form kept on the assistant's history row (`bot_conversations.tool_calls`).
    pub fn compact(&self) -> Value {
        let args: Value =
            serde_json::from_str(&self.args).unwrap_or_else(|_| json!(clip(&self.args, 200)));
        let mut v = json!({ "tool": self.tool, "args": args, "ok": self.ok });
        if self.ok {
            for key in ["_id", "name", "count", "status"] {
                if let Some(x) = self.content.get(key) {
                    v[key] = x.clone();
                }
            }
            if let Some(t) = self.card.as_ref().and_then(|c| c.get("type")) {
                v["card"] = t.clone();
            }
        } else {
            let error = self.content["error"].as_str().unwrap_or("error");
            v["error"] = json!(clip(error, 200));
        }
        v
    }
}

/// The tools the model may be offered: their definitions, by the groups a turn needs. What runs a call
/// is the [`Toolbox`].
pub struct Registry {
    defs: Vec<Def>,
    /// The definitions offered with each set of groups (by [`offer::Offer`] bits, with `more_tools`
    /// while a group is left out), built once each and shared: a few KB of schema per tool.
    offers: [OnceLock<Arc<[ToolDef]>>; offer::OFFERS],
}

/// Something done with each tool type, in the order the model is offered them.
trait EachTool {
    fn tool<T: Tool>(&mut self);
}

/// The six TrickBook tools, the two of reminders, checking off a landed trick, the three of guided
/// flows, remembering and forgetting, the model's crisis flag, and `more_tools`.
fn each_tool(e: &mut impl EachTool) {
    e.tool::<search_spots::SearchSpots>();
    e.tool::<get_user_tricklists::GetUserTricklists>();
    e.tool::<search_trickipedia::SearchTrickipedia>();
    e.tool::<create_tricklist::CreateTricklist>();
    e.tool::<create_spot_draft::CreateSpotDraft>();
    e.tool::<share_content::ShareContent>();
    e.tool::<schedule_reminder::ScheduleReminder>();
    e.tool::<cancel_reminder::CancelReminder>();
    e.tool::<mark_trick_landed::MarkTrickLanded>();
    e.tool::<start_flow::StartFlow>();
    e.tool::<set_flow_slots::SetFlowSlots>();
    e.tool::<leave_flow::LeaveFlow>();
    e.tool::<remember::Remember>();
    e.tool::<forget::Forget>();
    e.tool::<flag_concern::FlagConcern>();
    e.tool::<more_tools::MoreTools>();
}

impl EachTool for Registry {
    fn tool<T: Tool>(&mut self) {
        self.defs.push(Def::of::<T>());
    }
}

impl Default for Registry {
    fn default() -> Self {
        let mut registry = Self::empty();
        each_tool(&mut registry);
        registry
    }
}

/// Every tool's definition, built once per process.
pub static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::default);

impl Registry {
    /// No tool at all (a crisis turn's, a follow-up's).
    pub fn empty() -> Self {
        Self {
            defs: Vec::new(),
            offers: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    #[cfg(test)]
    fn with<T: Tool>(mut self) -> Self {
        self.defs.push(Def::of::<T>());
        self.offers = std::array::from_fn(|_| OnceLock::new());
        self
    }

    /// The `tools` array of a request offered `offer`: the tools of its groups, in registry order, and
    /// `more_tools` when a group with tools is left out.
    pub fn offered(&self, offer: offer::Offer) -> Arc<[ToolDef]> {
        self.offers[offer.index()]
            .get_or_init(|| {
                let left_out = self
                    .defs
                    .iter()
                    .any(|t| !t.groups.is_empty() && !t.groups.iter().any(|g| offer.has(*g)));
                self.defs
                    .iter()
                    .filter(|t| match t.name {
                        more_tools::NAME => left_out,
                        // The crisis net goes with every offer.
                        flag_concern::NAME => true,
                        _ => t.groups.iter().any(|g| offer.has(*g)),
                    })
                    .map(|t| t.def.clone())
                    .collect()
            })
            .clone()
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.defs.iter().map(|t| t.name).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.defs.is_empty()
    }

    /// The JSON Schema of `tool`'s arguments, compiled from the value its definition shows the model:
    /// a call is validated against that very value.
    fn schema(&self, tool: &str) -> Arc<ArgsSchema> {
        let def = self.defs.iter().find(|d| d.name == tool);
        def.expect("every tool has a definition: both are built from `each_tool`")
            .schema
            .clone()
    }

    /// Whether a call of `tool` only reads ([`Tool::READS_ONLY`]); an unknown name is not taken to.
    pub fn reads_only(&self, tool: &str) -> bool {
        self.defs.iter().any(|d| d.name == tool && d.reads_only)
    }

    /// The names of the tools of `group`.
    pub(crate) fn names_in(&self, group: Group) -> Vec<&'static str> {
        self.defs
            .iter()
            .filter(|t| t.groups.contains(&group))
            .map(|t| t.name)
            .collect()
    }

    /// The `tools` array of a chat request offered every tool.
    #[cfg(test)]
    fn defs(&self) -> Arc<[ToolDef]> {
        self.offered(offer::Offer::all())
    }

    /// The estimated prompt tokens of [`Registry::offered`] (a quarter of its JSON bytes).
    pub fn offered_tokens(&self, offer: offer::Offer) -> usize {
        serde_json::to_string(&*self.offered(offer)).map_or(0, |s| s.len().div_ceil(4))
    }
}

/// What runs the tools' calls: every tool, holding the stores it works with.
pub struct Toolbox {
    tools: Vec<Box<dyn DynTool>>,
}

impl Toolbox {
    /// Every tool, built with what it needs of `stores`.
    pub fn new(stores: &ToolStores) -> Self {
        struct Build<'s>(&'s ToolStores, Vec<Box<dyn DynTool>>);
        impl EachTool for Build<'_> {
            fn tool<T: Tool>(&mut self) {
                self.1.push(Box::new(Erased {
                    schema: REGISTRY.schema(T::NAME),
                    tool: T::new(self.0),
                }));
            }
        }
        let mut build = Build(stores, Vec::new());
        each_tool(&mut build);
        Self { tools: build.1 }
    }

    /// No tool: every call is an unknown tool (a crisis turn's).
    pub fn empty() -> Self {
        Self { tools: Vec::new() }
    }

    /// Runs one call: unknown names, bad arguments, tool errors and even panics become results.
    pub async fn dispatch(&self, name: &str, raw_args: &str, ctx: &ToolContext<'_>) -> ToolResult {
        let outcome = match self.tools.iter().find(|t| t.name() == name) {
            None => Err(ToolError::UnknownTool(name.chars().take(64).collect())),
            Some(tool) => AssertUnwindSafe(tool.call_json(ctx, raw_args))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    tracing::error!(tool = name, "tool panicked");
                    Err(ToolError::Crashed)
                }),
        };
        ToolResult {
            name: name.to_owned(),
            outcome,
        }
    }
}

/// A regex source matching `text` literally: every ASCII punctuation character is escaped, which is
/// literal in PCRE (MongoDB) and Python `re` (SecantusDB) alike, so `.*` or `(a+)+$` are just characters.
pub(crate) fn literal_regex(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if c.is_ascii_punctuation() && !matches!(c, '<' | '>') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `{ $regex: <literal text>, $options: "i" }`: a case-insensitive substring match.
pub(crate) fn contains_ci(text: &str) -> bson::Document {
    bson::doc! { "$regex": literal_regex(text), "$options": "i" }
}

/// The identity of a document created by a call: the event message's timestamp followed by a stable
/// hash of (message, tool, call id). A retried call computes the same `_id` and cannot insert twice.
pub(crate) fn derived_id(message_id: ObjectId, tool: &str, tool_call_id: &str) -> ObjectId {
    let m = message_id.bytes();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in m
        .iter()
        .chain(tool.as_bytes())
        .chain(&[0u8])
        .chain(tool_call_id.as_bytes())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut bytes = [0u8; 12];
    bytes[..4].copy_from_slice(&m[..4]);
    bytes[4..].copy_from_slice(&h.to_be_bytes());
    ObjectId::from_bytes(bytes)
}

/// Passes the write quota for this call or explains why not: a counted step of the turn's journal
/// (tally `writes:<user>`, one hour), so every worker counts against the same limit and a retried call is
/// not counted twice.
pub(crate) async fn guard_write(
    ctx: &ToolContext<'_>,
    writes_per_hour: u32,
    tool: &str,
) -> Result<(), ToolError> {
    let tally = names::tally::writes(&ctx.user.to_hex());
    let admission = ctx
        .job
        .counted(
            &QUOTA,
            &ctx.call.key,
            &tally,
            writes_per_hour,
            std::time::Duration::from_secs(3600),
            ctx.clock.now,
        )
        .await?;
    tracing::debug!(tool, ?admission, "write quota");
    match admission {
        Admission::Granted | Admission::AlreadyCounted => Ok(()),
        Admission::Exceeded { retry_after_secs } => Err(ToolError::QuotaExceeded {
            limit: writes_per_hour,
            retry_after_mins: (retry_after_secs + 59) / 60,
        }),
    }
}

/// Deep links the app opens.
pub(crate) fn deep_link(kind: &str, id: ObjectId) -> String {
    format!("trickbook://{kind}/{}", id.to_hex())
}

/// A string field of a document, if present and not blank.
pub(crate) fn str_field(d: &bson::Document, key: &str) -> Option<String> {
    d.get_str(key)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(str::to_owned)
}

/// A numeric field as f64 (doubles and integers alike).
pub(crate) fn num_field(d: &bson::Document, key: &str) -> Option<f64> {
    match d.get(key)? {
        bson::Bson::Double(x) => Some(*x),
        bson::Bson::Int32(x) => Some(f64::from(*x)),
        bson::Bson::Int64(x) => Some(*x as f64),
        _ => None,
    }
}

/// Text cut to `max` characters, with an ellipsis when cut.
pub fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(max).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_with_an_ellipsis() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("abcdef", 3), "abc…");
        assert_eq!(clip("ééé", 1), "é…");
    }

    #[test]
    fn literal_regex_escapes_metacharacters() {
        assert_eq!(literal_regex(".*"), "\\.\\*");
        assert_eq!(literal_regex("(a+)+$"), "\\(a\\+\\)\\+\\$");
        assert_eq!(literal_regex("50-50 grind"), "50\\-50 grind");
        let re =
            regex::Regex::new(&format!("^{}$", literal_regex("a.b*(c)[d]{2}|e\\f^g$"))).unwrap();
        assert!(re.is_match("a.b*(c)[d]{2}|e\\f^g$"));
        assert!(!re.is_match("axb"));
    }

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        let m = ObjectId::parse_str("6650f1a2b3c4d5e6f7a8b9c0").unwrap();
        let a = derived_id(m, "create_tricklist", "call_1");
        assert_eq!(a, derived_id(m, "create_tricklist", "call_1"));
        assert_ne!(a, derived_id(m, "create_tricklist", "call_2"));
        assert_eq!(a.timestamp(), m.timestamp());
    }

    #[test]
    fn requests_share_one_copy_of_the_definitions() {
        let r = Registry::default();
        let (a, b) = (r.defs(), r.defs());
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.len(), 15);
        // Adding a tool makes a new set that includes it.
        let more = Registry::empty().with::<search_spots::SearchSpots>();
        assert_eq!(more.defs().len(), 1);
    }

    #[test]
    fn an_offer_is_its_groups_tools_and_more_tools_for_the_rest() {
        let r = Registry::default();
        let names = |o: offer::Offer| -> Vec<String> {
            r.offered(o)
                .iter()
                .map(|d| d.function.name.clone())
                .collect()
        };
        assert_eq!(names(offer::Offer::none()), ["flag_concern", "more_tools"]);
        let group = &r.offered(offer::Offer::none())[1].function.parameters["properties"]["group"];
        assert_eq!(
            group["enum"],
            serde_json::json!([
                "tricks",
                "lists",
                "spots",
                "reminders",
                "flows",
                "in_flow",
                "memory"
            ]),
            "a plain enum, no code docs shown to the model: {group}"
        );
        assert_eq!(
            names(offer::Offer::none().with(Group::Spots)),
            [
                "search_spots",
                "create_spot_draft",
                "share_content",
                "flag_concern",
                "more_tools"
            ]
        );
        assert_eq!(
            names(offer::Offer::none().with(Group::Reminders)),
            [
                "schedule_reminder",
                "cancel_reminder",
                "flag_concern",
                "more_tools"
            ]
        );
        // Every tool but `more_tools` and the crisis flag (offered always) is in some group, so every
        // tool can be offered.
        for name in r.names() {
            assert!(
                name == more_tools::NAME
                    || name == flag_concern::NAME
                    || Group::ALL.iter().any(|g| r.names_in(*g).contains(&name)),
                "{name} is in no group"
            );
        }
        assert!(r.offered_tokens(offer::Offer::none()) < r.offered_tokens(offer::Offer::all()));
    }

    #[test]
    fn registry_offers_fifteen_tools_with_object_schemas() {
        let r = Registry::default();
        assert_eq!(r.names().last(), Some(&more_tools::NAME));
        assert_eq!(r.defs().len(), 15, "every tool offered: no `more_tools`");
        assert_eq!(
            r.names(),
            [
                "search_spots",
                "get_user_tricklists",
                "search_trickipedia",
                "create_tricklist",
                "create_spot_draft",
                "share_content",
                "schedule_reminder",
                "cancel_reminder",
                "mark_trick_landed",
                "start_flow",
                "set_flow_slots",
                "leave_flow",
                "remember",
                "forget",
                "flag_concern",
                "more_tools"
            ]
        );
        for d in r
            .offered(offer::Offer::none())
            .iter()
            .chain(r.defs().iter())
        {
            assert_eq!(
                d.function.parameters["type"], "object",
                "{}",
                d.function.name
            );
            assert!(!d.function.parameters.to_string().contains("$ref"));
        }
    }
}
