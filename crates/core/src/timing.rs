//! Where a turn's time goes: per-stage wall times measured by the worker itself.
//!
//! The worker runs each delivery inside [`scope`]; the turn code wraps its stages in [`stage`] (a timer
//! plus a `stage` span for the logs). At the end of a turn [`report`] emits one structured log event,
//! `turn timings` (target `companion::timing`, per-stage milliseconds, LLM milliseconds and the worker's
//! overhead: the turn's wall time minus the time spent waiting on the model), and feeds the
//! `companion_turn_stage_seconds{stage=…}` histograms of `/metrics`.
//!
//! Across the stages, the time the turn waited on MongoDB is measured from the driver's events
//! ([`mongo_command_handler`], [`mongo_pool_handler`]): the union of the turn's connection checkouts
//! (waiting for one of the pool's connections) and commands, so the share of the local MongoDB-wire
//! server (or Atlas) in the overhead is visible.
//!
//! A stage counts its own time only: a stage awaited inside another (the completion's publish inside the
//! delivery's writes) is subtracted from the outer one, so nested stages never count twice. Stages can
//! still overlap in time (the context loads run beside embedding and retrieval; the calls of one tool
//! round run together and are timed as one), so their sum may exceed the overhead. Outside a [`scope`]
//! (tests calling `Pipeline::process_dm` directly, commands) nothing is recorded.

use std::{
    cell::{Cell, RefCell},
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use tracing::{Instrument, debug_span, info};

use crate::metrics::Metrics;

/// The parts of a turn that are timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The conversation's order gate (is this the first unsettled message?), gathering a burst, and
    /// settling the order floor afterwards (PostgreSQL, JetStream direct gets).
    Order,
    /// Waiting for an earlier message of the same conversation to settle: not the worker's cost, so
    /// like the model's time it is left out of the overhead.
    Wait,
    /// Parsing and validating the event (bytes to `DmEvent`).
    Parse,
    /// The admission check: the conversation and its participants, with the user's profile and
    /// tricklists in the same aggregate (MongoDB).
    Admit,
    /// Opening the turn in the journal (PostgreSQL).
    Journal,
    /// The limits every worker shares: the user's flood limit and the spend check before each paid
    /// call (PostgreSQL).
    Limits,
    /// History (PostgreSQL) and the trick names of the user's lists (MongoDB, mostly cached); the
    /// knowledge search too when it rides with the history's statement (the message's vector known).
    Context,
    /// Embedding the message (the embedder thread, batch window included).
    Embed,
    /// The vector search for knowledge chunks (pgvector), in a statement of its own; when it rode with
    /// the history's (in `Context`), reading its hits.
    Retrieve,
    /// Building the system prompt and message list.
    Prompt,
    /// Waiting on the chat model (request encoding, HTTP round trip, response decoding, rate limiter).
    Llm,
    /// Reading and writing the step journal around each model call (PostgreSQL).
    Steps,
    /// Running the tools of each round (together) and auditing them.
    Tools,
    /// Checking a tool call's arguments against its JSON Schema (inside `Tools`).
    Validate,
    /// Writing the reply: journal, `dm_messages`, history, conversation, final state.
    Writes,
    /// Publishing the typing event and the completion (JetStream ack included).
    Publish,
    /// Acknowledging the inbound event (double ack: the server's confirmation included).
    Ack,
}

impl Stage {
    /// Every stage, in the order of a turn.
    pub const ALL: [Stage; 17] = [
        Stage::Order,
        Stage::Wait,
        Stage::Parse,
        Stage::Admit,
        Stage::Journal,
        Stage::Limits,
        Stage::Context,
        Stage::Embed,
        Stage::Retrieve,
        Stage::Prompt,
        Stage::Llm,
        Stage::Steps,
        Stage::Tools,
        Stage::Validate,
        Stage::Writes,
        Stage::Publish,
        Stage::Ack,
    ];

    /// The label used in logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Order => "order",
            Stage::Wait => "wait",
            Stage::Parse => "parse",
            Stage::Admit => "admit",
            Stage::Journal => "journal",
            Stage::Limits => "limits",
            Stage::Context => "context",
            Stage::Embed => "embed",
            Stage::Retrieve => "retrieve",
            Stage::Prompt => "prompt",
            Stage::Llm => "llm",
            Stage::Steps => "steps",
            Stage::Tools => "tools",
            Stage::Validate => "validate",
            Stage::Writes => "writes",
            Stage::Publish => "publish",
            Stage::Ack => "ack",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The running totals of one turn.
struct Clock {
    started: Instant,
    /// Own nanoseconds per stage, indexed by [`Stage::index`] (signed: a nested stage is subtracted
    /// from its parent before the parent adds its own wall time).
    nanos: [Cell<i64>; Stage::ALL.len()],
    /// Chat calls timed.
    llm_calls: Cell<u32>,
    /// Start and end of every MongoDB command of the turn.
    mongo: RefCell<Vec<(Instant, Instant)>>,
    /// Start and end of every wait for a pooled MongoDB connection.
    mongo_wait: RefCell<Vec<(Instant, Instant)>>,
    /// How the knowledge lookup got its query vector (`embedded`, `cached`, `skipped`), if it ran.
    knowledge: Cell<&'static str>,
}

tokio::task_local! {
    static CLOCK: Clock;
}

thread_local! {
    /// The stage whose future is being polled on this thread right now: a stage started while it is set
    /// is nested in it.
    static POLLING: Cell<Option<Stage>> = const { Cell::new(None) };
}

/// The timings of one finished turn.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnTimings {
    /// Wall time of the whole delivery, from the message in hand to the ack.
    pub total_ms: f64,
    /// Milliseconds per stage, in [`Stage::ALL`] order.
    pub(crate) stages_ms: [f64; Stage::ALL.len()],
    /// Chat calls made.
    pub(crate) llm_calls: u32,
    /// Wall time during which the turn waited on MongoDB: a command running, or a connection being
    /// checked out of the pool for one.
    pub mongo_ms: f64,
    /// MongoDB commands sent.
    pub mongo_commands: u32,
    /// How the knowledge lookup got its query vector, or `none`.
    pub(crate) knowledge: &'static str,
}

impl TurnTimings {
    pub fn stage_ms(&self, stage: Stage) -> f64 {
        self.stages_ms[stage.index()]
    }

    /// The worker's own cost: wall time minus the time spent waiting on the model and on earlier
    /// messages of the conversation.
    pub(crate) fn overhead_ms(&self) -> f64 {
        (self.total_ms - self.stage_ms(Stage::Llm) - self.stage_ms(Stage::Wait)).max(0.0)
    }
}

/// Runs one delivery with a fresh clock; [`stage`] and [`report`] inside it use that clock.
pub fn scope<F: Future>(fut: F) -> impl Future<Output = F::Output> {
    let clock = Clock {
        started: Instant::now(),
        nanos: Default::default(),
        llm_calls: Cell::new(0),
        mongo: RefCell::new(Vec::new()),
        mongo_wait: RefCell::new(Vec::new()),
        knowledge: Cell::new("none"),
    };
    CLOCK.scope(clock, fut)
}

/// Runs `fut` as `stage` of the current turn: adds its wall time (less that of stages nested in it) to the
/// turn's clock when inside a [`scope`], and runs it in a `stage` span (debug level) named after it.
///
/// A plain function returning a [`Staged`], not an `async fn`: an `async fn` would hold `fut` twice (its
/// argument and the awaited copy), and every turn waiting on the model sits inside several stages.
pub fn stage<F: Future>(stage: Stage, fut: F) -> impl Future<Output = F::Output> {
    Staged {
        stage,
        first_poll: None,
        fut: fut.instrument(debug_span!("stage", name = stage.name())),
    }
}

pin_project_lite::pin_project! {
    /// The future of [`stage`].
    pub(crate) struct Staged<F> {
        stage: Stage,
        // The stage polled around this one at its first poll (its parent), and when that was.
        first_poll: Option<(Option<Stage>, Instant)>,
        #[pin]
        fut: tracing::instrument::Instrumented<F>,
    }
}

impl<F: Future> Future for Staged<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let stage = *this.stage;
        let (parent, started) = *this
            .first_poll
            .get_or_insert_with(|| (POLLING.with(Cell::get), Instant::now()));
        let outer = POLLING.with(|p| p.replace(Some(stage)));
        let poll = this.fut.poll(cx);
        POLLING.with(|p| p.set(outer));
        if poll.is_ready() {
            record(stage, parent, started.elapsed());
        }
        poll
    }
}

/// Adds the time since `started` to `stage` of the current turn, for code timed without a future (no-op
/// outside a [`scope`]).
pub fn add(stage: Stage, started: Instant) {
    record(stage, POLLING.with(Cell::get), started.elapsed());
}

fn record(stage: Stage, parent: Option<Stage>, elapsed: Duration) {
    let nanos = elapsed.as_nanos().min(i64::MAX as u128) as i64;
    let _ = CLOCK.try_with(|c| {
        let cell = &c.nanos[stage.index()];
        cell.set(cell.get().saturating_add(nanos));
        if let Some(p) = parent.filter(|p| *p != stage) {
            let cell = &c.nanos[p.index()];
            cell.set(cell.get().saturating_sub(nanos));
        }
        if stage == Stage::Llm {
            c.llm_calls.set(c.llm_calls.get() + 1);
        }
    });
}

/// Notes how the current turn's knowledge lookup got its query vector (no-op outside a [`scope`]).
pub fn note_knowledge(how: &'static str) {
    let _ = CLOCK.try_with(|c| c.knowledge.set(how));
}

/// Notes a vector read from the cache (`cached`), unless the current turn already ran the model for it
/// (at admission, for the crisis screen): that turn's vector was `embedded`.
pub fn note_knowledge_cached(cached: &'static str) {
    let _ = CLOCK.try_with(|c| {
        if c.knowledge.get() == "none" {
            c.knowledge.set(cached);
        }
    });
}

/// The timings of the current turn so far (`None` outside a [`scope`]).
pub fn snapshot() -> Option<TurnTimings> {
    CLOCK
        .try_with(|c| {
            let mut stages_ms = [0.0; Stage::ALL.len()];
            for (ms, n) in stages_ms.iter_mut().zip(&c.nanos) {
                *ms = n.get().max(0) as f64 / 1e6;
            }
            let commands = c.mongo.borrow();
            let mut all = commands.clone();
            all.extend(c.mongo_wait.borrow().iter().copied());
            TurnTimings {
                total_ms: c.started.elapsed().as_secs_f64() * 1e3,
                stages_ms,
                llm_calls: c.llm_calls.get(),
                mongo_ms: union(&all).as_secs_f64() * 1e3,
                mongo_commands: commands.len() as u32,
                knowledge: c.knowledge.get(),
            }
        })
        .ok()
}

/// Ends the current turn's measurement: one `turn timings` log event (inside the turn's span, so it
/// carries the event id) and the stage histograms. Returns what was reported.
pub fn report(metrics: &Metrics, outcome: &'static str) -> Option<TurnTimings> {
    let t = snapshot()?;
    let ms = |s: Stage| round_us(t.stage_ms(s));
    info!(
        target: "companion::timing",
        outcome,
        total_ms = round_us(t.total_ms),
        overhead_ms = round_us(t.overhead_ms()),
        llm_calls = t.llm_calls,
        mongo_ms = round_us(t.mongo_ms),
        mongo_commands = t.mongo_commands,
        knowledge = t.knowledge,
        order_ms = ms(Stage::Order),
        wait_ms = ms(Stage::Wait),
        parse_ms = ms(Stage::Parse),
        admit_ms = ms(Stage::Admit),
        journal_ms = ms(Stage::Journal),
        limits_ms = ms(Stage::Limits),
        context_ms = ms(Stage::Context),
        embed_ms = ms(Stage::Embed),
        retrieve_ms = ms(Stage::Retrieve),
        prompt_ms = ms(Stage::Prompt),
        llm_ms = ms(Stage::Llm),
        steps_ms = ms(Stage::Steps),
        tools_ms = ms(Stage::Tools),
        validate_ms = ms(Stage::Validate),
        writes_ms = ms(Stage::Writes),
        publish_ms = ms(Stage::Publish),
        ack_ms = ms(Stage::Ack),
        "turn timings"
    );
    for stage in Stage::ALL {
        let ms = t.stage_ms(stage);
        // A stage the turn never reached is not a zero-length observation.
        if ms > 0.0 || stage == Stage::Llm {
            metrics.observe_stage(stage.name(), ms / 1e3);
        }
    }
    metrics.observe_stage("overhead", t.overhead_ms() / 1e3);
    // Not a stage: the turn's time inside MongoDB commands, across stages.
    metrics.observe_stage("mongo", t.mongo_ms / 1e3);
    Some(t)
}

/// The MongoDB driver's command monitor: every command that completes inside a turn adds its interval
/// to that turn's clock (the driver runs commands in the caller's task and calls this synchronously).
pub fn mongo_command_handler() -> mongodb::event::EventHandler<mongodb::event::command::CommandEvent>
{
    use mongodb::event::command::CommandEvent;
    mongodb::event::EventHandler::callback(|event| {
        let duration = match event {
            CommandEvent::Succeeded(e) => e.duration,
            CommandEvent::Failed(e) => e.duration,
            _ => return,
        };
        let end = Instant::now();
        let start = end.checked_sub(duration).unwrap_or(end);
        let _ = CLOCK.try_with(|c| c.mongo.borrow_mut().push((start, end)));
    })
}

/// The MongoDB driver's connection-pool monitor: time spent waiting to check out a connection counts
/// as MongoDB wait of the turn that waited (a saturated server shows here first).
pub fn mongo_pool_handler() -> mongodb::event::EventHandler<mongodb::event::cmap::CmapEvent> {
    use mongodb::event::cmap::CmapEvent;
    mongodb::event::EventHandler::callback(|event| {
        let duration = match event {
            CmapEvent::ConnectionCheckedOut(e) => e.duration,
            CmapEvent::ConnectionCheckoutFailed(e) => e.duration,
            _ => return,
        };
        let end = Instant::now();
        let start = end.checked_sub(duration).unwrap_or(end);
        let _ = CLOCK.try_with(|c| c.mongo_wait.borrow_mut().push((start, end)));
    })
}

/// Total length of the union of intervals.
fn union(intervals: &[(Instant, Instant)]) -> Duration {
    let mut v = intervals.to_vec();
    v.sort();
    let mut total = Duration::ZERO;
    let mut current: Option<(Instant, Instant)> = None;
    for (s, e) in v {
        current = match current {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some((cs, ce)) = current {
        total += ce - cs;
    }
    total
}

/// Milliseconds to the microsecond: the shortest stages (a tool call's validation) take a few.
fn round_us(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn stages_add_up_inside_a_scope_and_overhead_excludes_the_model() {
        let t = scope(async {
            stage(
                Stage::Context,
                tokio::time::sleep(Duration::from_millis(20)),
            )
            .await;
            stage(Stage::Llm, tokio::time::sleep(Duration::from_millis(30))).await;
            stage(Stage::Llm, tokio::time::sleep(Duration::from_millis(30))).await;
            snapshot().unwrap()
        })
        .await;
        assert_eq!(t.llm_calls, 2);
        assert!(t.stage_ms(Stage::Context) >= 20.0, "{t:?}");
        assert!(t.stage_ms(Stage::Llm) >= 60.0, "{t:?}");
        assert_eq!(t.stage_ms(Stage::Tools), 0.0);
        assert!(t.total_ms >= t.stage_ms(Stage::Llm) + t.stage_ms(Stage::Context));
        assert!((t.overhead_ms() - (t.total_ms - t.stage_ms(Stage::Llm))).abs() < 1e-9);
    }

    #[tokio::test]
    async fn a_nested_stage_counts_once() {
        let t = scope(async {
            stage(Stage::Writes, async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                stage(
                    Stage::Publish,
                    tokio::time::sleep(Duration::from_millis(40)),
                )
                .await;
            })
            .await;
            snapshot().unwrap()
        })
        .await;
        let (writes, publish) = (t.stage_ms(Stage::Writes), t.stage_ms(Stage::Publish));
        assert!(publish >= 40.0, "{t:?}");
        assert!(writes >= 10.0, "{t:?}");
        // Together they are the outer stage's wall time, which is below the turn's.
        assert!(writes + publish <= t.total_ms, "{t:?}");
    }

    #[tokio::test]
    async fn concurrent_sibling_stages_are_not_nested() {
        let t = scope(async {
            tokio::join!(
                stage(
                    Stage::Context,
                    tokio::time::sleep(Duration::from_millis(30))
                ),
                stage(Stage::Embed, tokio::time::sleep(Duration::from_millis(30))),
            );
            snapshot().unwrap()
        })
        .await;
        assert!(t.stage_ms(Stage::Context) >= 30.0, "{t:?}");
        assert!(t.stage_ms(Stage::Embed) >= 30.0, "{t:?}");
    }

    #[test]
    fn overlapping_intervals_count_once() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let u = union(&[
            (at(10), at(20)),
            (at(0), at(5)),
            (at(15), at(30)),
            (at(40), at(41)),
        ]);
        assert_eq!(u, Duration::from_millis(5 + 20 + 1));
        assert_eq!(union(&[]), Duration::ZERO);
    }

    #[tokio::test]
    async fn outside_a_scope_nothing_is_recorded() {
        let v = stage(Stage::Writes, async { 7 }).await;
        assert_eq!(v, 7);
        assert!(snapshot().is_none());
        assert!(report(&Metrics::default(), "answered").is_none());
    }

    #[tokio::test]
    async fn report_feeds_the_stage_histograms() {
        let metrics = Metrics::default();
        scope(async {
            stage(Stage::Writes, async {}).await;
            report(&metrics, "answered").unwrap();
        })
        .await;
        let text = metrics.render();
        assert!(
            text.contains("companion_turn_stage_seconds_count{stage=\"writes\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("companion_turn_stage_seconds_count{stage=\"overhead\"} 1"),
            "{text}"
        );
    }
}
