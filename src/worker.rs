//! The consumer loop: pulls events from the shared durable consumer and runs them through the
//! conversation pipeline ([`crate::pipeline`]), boundedly.
//!
//! Every delivery first passes the conversation's order gate ([`crate::conversation_order`]); one waiting behind an
//! earlier message holds no turn slot. Then its job runs, and the settlement ([`crate::settle`]) decides
//! and carries out what becomes of it. Beside it, a second bounded loop takes the signal stream's
//! deliveries, by the signal's kind: a moderator's takeover to [`crate::takeover::Takeovers`], memory's
//! extraction and deletions to [`crate::memory::MemorySignals`], anything else (spot reviews,
//! due reminders) into the same pipeline as a follow-up; each settled the same way.
//! Events whose deliveries ran out while no worker held them (every worker that took them died) are
//! settled from the server's advisory, the same way: a third loop reads the advisories from the stream
//! that keeps them, so one given while no worker ran is settled by the next worker to start.

use std::{future::Future, panic::AssertUnwindSafe, sync::Arc, time::Duration};

use async_nats::jetstream::{self, AckKind, stream::LastRawMessageErrorKind};
use futures::{FutureExt, StreamExt};
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    task::JoinSet,
};
use tokio_util::{sync::CancellationToken, task::AbortOnDropHandle};
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::{
    bus::{Bus, BusError, Feed, Inbound, event::parse_event},
    config::{ConsumerConfig, WorkerConfig},
    conversation_order::{Order, OrderError, Position, Waited},
    failure::{Class, Failure},
    metrics::{Metric, Metrics},
    outage::{Outages, WaitOut},
    pipeline::{Arrival, Input, Pipeline},
    proactive::PROACTIVE,
    settle::{self, DEAD_LETTERS, Ending, Handle, Settler, TURNS, Verdict},
    timing::{self, Stage},
};

/// Jobs that panicked, caught at the delivery's boundary, by kind (`turn`, `signal`).
const PANICS: Metric = Metric::new(
    "companion_panics_total",
    "Jobs that panicked, caught at the delivery's boundary, by kind (`turn`, `signal`)",
);
/// Deliveries that waited for an earlier message of their conversation.
const ORDER_WAITS: Metric = Metric::new(
    "companion_order_waits_total",
    "Deliveries that waited for an earlier message of their conversation to settle",
);
/// How long those waits took.
const ORDER_WAIT_MS: Metric = Metric::new(
    "companion_order_wait_milliseconds_total",
    "Milliseconds deliveries waited for an earlier message of their conversation",
);

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Order(#[from] OrderError),
}

/// A worker: the turns it runs and how it settles them.
pub struct Worker {
    pub(crate) bus: Bus,
    /// Its indexes, ensured at start.
    pub(crate) mongo: crate::store::Mongo,
    /// The conversations' order.
    pub(crate) pg: crate::store::Pg,
    pub(crate) pipeline: Arc<Pipeline>,
    /// A moderator's pause and resume.
    pub(crate) takeovers: Arc<crate::takeover::Takeovers>,
    /// Memory's extraction and deletion signals.
    pub(crate) memory_signals: Arc<crate::memory::MemorySignals>,
    pub(crate) metrics: Arc<Metrics>,
    /// The outage being waited out: the pull loops stop by it, failed work waits on it.
    pub(crate) outages: Arc<Outages>,
    pub(crate) config: WorkerConfig,
    pub(crate) consumer: ConsumerConfig,
}

/// What every delivery of one running worker shares.
struct Running {
    worker: Worker,
    order: Arc<Order>,
    settler: Settler,
    limits: settle::RetryLimits,
    /// How often a long turn sends progress (a third of the consumer's ack wait).
    progress_every: Duration,
    /// Fired when the grace period is over: in-flight turns NAK and stop.
    hard_stop: CancellationToken,
}

impl Worker {
    /// Runs until `shutdown` fires, then drains in-flight turns within the grace period.
    pub async fn serve(self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        self.bus.check_server()?;
        self.bus.ensure_streams().await?;
        if let Err(e) = self.mongo.ensure_indexes().await {
            warn!(error = %e, "could not ensure MongoDB indexes; continuing");
        }
        let consumer = self.bus.consumer(Feed::Inbound, &self.consumer).await?;
        let signal_consumer = self.bus.consumer(Feed::Signals, &self.consumer).await?;
        let exhausted_consumer = self.bus.consumer(Feed::Exhausted, &self.consumer).await?;
        let concurrency = self.config.concurrency.max(1);
        let hard_stop = CancellationToken::new();
        let shared = self.share(&consumer, hard_stop.clone()).await?;
        let order = shared.order.clone();
        let w = &shared.worker;
        // Alerts look at increases: the dead-letter counter exists (at 0) before the first one.
        w.metrics.add(&DEAD_LETTERS, &[], 0);
        let notices = tokio::spawn(order.clone().listen());
        let exhausted = tokio::spawn(run_exhausted(
            shared.clone(),
            exhausted_consumer,
            shutdown.clone(),
        ));
        let signals = tokio::spawn(run_signals(
            shared.clone(),
            signal_consumer,
            shutdown.clone(),
        ));
        let semaphore = Arc::new(Semaphore::new(concurrency));
        let mut tasks = JoinSet::new();
        info!(
            consumer = %w.consumer.name,
            stream = %w.bus.names.stream_in,
            concurrency,
            runtime_threads = tokio::runtime::Handle::current().metrics().num_workers(),
            max_deliver = shared.limits.max_deliver,
            characters = w.pipeline.companions(),
            "worker ready"
        );

        let recreate = || async { w.bus.consumer(Feed::Inbound, &w.consumer).await.map(drop) };
        let pulled = Pulled {
            consumer: &consumer.consumer,
            concurrency,
            semaphore: &semaphore,
            shutdown: &shutdown,
            outages: &w.outages,
        };
        pull(pulled, &mut tasks, recreate, |msg, permit| {
            let slot = Permit {
                permit,
                semaphore: semaphore.clone(),
                shutdown: shutdown.clone(),
                hard_stop: hard_stop.clone(),
            };
            let shared = shared.clone();
            async move { shared.handle(msg, slot).await }
        })
        .await;

        drain(&mut tasks, w.config.shutdown_grace(), &hard_stop).await;
        if let Err(e) = signals.await {
            warn!(error = %e, "the signal loop ended abnormally");
        }
        if let Err(e) = exhausted.await {
            warn!(error = %e, "the loop of exhausted events ended abnormally");
        }
        // Acks and NAKs are buffered: make sure the server has them before the process exits.
        if let Err(e) = w.bus.client.flush().await {
            warn!(error = %e, "could not flush the last acks; the server will redeliver those events");
        }
        notices.abort();
        info!("worker stopped");
        Ok(())
    }

    /// What every delivery's task shares: the worker, the conversations' order, the settlement and the
    /// bounds it applies.
    async fn share(
        self,
        consumer: &crate::bus::Consumer,
        hard_stop: CancellationToken,
    ) -> Result<Arc<Running>, WorkerError> {
        let order = Arc::new(
            Order::open(
                &self.bus.js,
                self.bus.client.clone(),
                &self.bus.names.stream_in,
                &self.bus.names.prefix,
                self.pg.pool.clone(),
                self.config.order_max_wait(),
            )
            .await?,
        );
        Ok(Arc::new(Running {
            settler: Settler {
                bus: self.bus.clone(),
                order: order.clone(),
                pipeline: self.pipeline.clone(),
                metrics: self.metrics.clone(),
                outages: self.outages.clone(),
                stop: hard_stop.clone(),
            },
            limits: settle::RetryLimits {
                max_deliver: consumer.max_deliver.max(1),
                retry_base: Duration::from_secs(self.config.retry_delay_secs.max(1)),
                retry_cap: Duration::from_secs(60),
            },
            progress_every: (consumer.ack_wait / 3).max(Duration::from_millis(200)),
            hard_stop,
            order: order.clone(),
            worker: self,
        }))
    }
}

/// Stops pulling and waits for the turns in flight for `grace`; then they return their events to the
/// stream (`hard_stop`) and are awaited.
async fn drain(tasks: &mut JoinSet<()>, grace: Duration, hard_stop: &CancellationToken) {
    let in_flight = tasks.len();
    info!(
        in_flight,
        grace_secs = grace.as_secs(),
        "stopping: no longer pulling"
    );
    if !finished_within(tasks, grace).await {
        warn!(
            left = tasks.len(),
            "grace period over; returning unfinished turns to the stream"
        );
        hard_stop.cancel();
        while tasks.join_next().await.is_some() {}
    }
}

/// A delivery's turn slot and the stop signals it obeys.
struct Permit {
    /// Held while the delivery does work; released while it waits for its conversation.
    permit: Option<OwnedSemaphorePermit>,
    semaphore: Arc<Semaphore>,
    /// The worker stops pulling: waiting deliveries go back to the stream.
    shutdown: CancellationToken,
    /// The grace period is over: in-flight turns go back to the stream.
    hard_stop: CancellationToken,
}

impl Running {
    /// One delivery, from bytes to its settlement; never panics on input.
    async fn handle(&self, msg: jetstream::Message, mut slot: Permit) {
        let (delivered, seq) = msg
            .info()
            .map(|i| (i.delivered, i.stream_sequence))
            .unwrap_or((1, 0));
        let span = info_span!(
            "turn",
            event_id = tracing::field::Empty,
            conversation_id = tracing::field::Empty,
            bot_id = tracing::field::Empty,
            delivery = delivered,
            seq,
        );
        timing::scope(
            async {
                let progress = keep_alive(&msg, self.progress_every);
                let mut held_since = None;
                let (ending, event, outcome) = loop {
                    if let Some(ending) = self.take_slot(&mut slot).await {
                        break (ending, None, None);
                    }
                    let (ending, event, outcome) = self.run_turn(&msg, seq, &mut slot).await;
                    match self.outlast(ending, &mut held_since).await {
                        Some(ending) => break (ending, event, outcome),
                        None => continue,
                    }
                };
                drop(progress);
                let verdict = settle::decide(&ending, delivered, &self.limits);
                self.count(&ending, &verdict, outcome);
                if let (Ending::Failed(f), Verdict::Nak { delay }, Some(event)) =
                    (&ending, &verdict, &event)
                {
                    warn!(error = %f.reason, retry_in_ms = delay.as_millis() as u64, "turn failed; will retry");
                    let journal = &self.worker.pipeline.journal;
                    let id = event.message_id().to_hex();
                    let note = journal.note_error(&id, &f.reason);
                    if let Err(e) = Box::pin(note).await {
                        debug!(error = %e, "could not record the error in the journal");
                    }
                }
                let ack = matches!(verdict, Verdict::Ack { .. });
                // Boxed, as is the journal note: a task waiting on the model keeps no room for them.
                let settle =
                    self.settler
                        .execute(Handle::Message(&msg), event.as_ref(), verdict, delivered);
                timing::stage(Stage::Ack, Box::pin(settle)).await;
                if let (true, Some(name)) = (ack, outcome) {
                    timing::report(&self.worker.metrics, name);
                }
            }
            .instrument(span),
        )
        .await
    }

    /// The order gate, then the turn: how it ended, the event when it parsed, and the outcome's name
    /// when it was settled.
    async fn run_turn(
        &self,
        msg: &jetstream::Message,
        seq: u64,
        slot: &mut Permit,
    ) -> (Ending, Option<Inbound>, Option<&'static str>) {
        let subject = msg.subject.as_str();
        // Parsed first, settled after the gate (every message, valid or not, passes it in order): a
        // failure at the gate still knows whom it owes the failure line.
        let parse_started = std::time::Instant::now();
        let pipeline = &self.worker.pipeline;
        let parsed = parse_event(
            &msg.payload,
            subject,
            &self.worker.bus.names.prefix,
            pipeline.limits(),
        );
        timing::add(Stage::Parse, parse_started);
        let transient = |e: &OrderError| Ending::Failed(Failure::of(e));
        let position =
            match timing::stage(Stage::Order, Box::pin(self.order.position(subject, seq))).await {
                Ok(p) => p,
                Err(e) => return (transient(&e), parsed.ok(), None),
            };
        if let Position::Behind(first) = position
            && let Some(ending) = self.wait_for_earlier(subject, seq, first, slot).await
        {
            return (ending, parsed.ok(), None);
        }

        let event = match parsed {
            Ok(e) => e,
            Err(e) => {
                let f = Failure::new(Class::Reject, e.to_string());
                return (Ending::Failed(f), None, None);
            }
        };
        let span = tracing::Span::current();
        span.record("event_id", event.message_id().to_hex());
        span.record("conversation_id", event.conversation_id().to_hex());
        if let Some(bot) = event.bot_id() {
            span.record("bot_id", bot.to_hex());
        }

        let started = std::time::Instant::now();
        let delivery = Arrival {
            order: Some(&self.order),
            subject,
            seq,
        };
        // The turn is boxed: a delivery waiting for its conversation stays a small task, and a turn's
        // large state is allocated only while it runs.
        let input = Input::from(&event);
        let turn = self.guarded("turn", Box::pin(pipeline.handle(&input, Some(&delivery))));
        let result = tokio::select! {
            r = turn => r,
            _ = slot.hard_stop.cancelled() => return (Ending::Returned, Some(event), None),
        };
        let result = match result {
            Ok(r) => r,
            Err(panicked) => return (Ending::Failed(panicked), Some(event), None),
        };
        match result {
            Ok(settled) => {
                self.worker.metrics.observe_turn(started.elapsed());
                let name = settled.outcome.name();
                (
                    Ending::Settled {
                        through: settled.through_seq,
                        floored: settled.floored,
                    },
                    Some(event),
                    Some(name),
                )
            }
            Err(e) => (Ending::Failed(Failure::of(&e)), Some(event), None),
        }
    }

    /// Waits for the conversation's turn holding no turn slot (the slots stay free for the messages
    /// that can run), then takes one; the ending when the wait does not end in the turn.
    async fn wait_for_earlier(
        &self,
        subject: &str,
        seq: u64,
        first: u64,
        slot: &mut Permit,
    ) -> Option<Ending> {
        drop(slot.permit.take());
        self.worker.metrics.inc(&ORDER_WAITS, &[]);
        let wait = Box::pin(self.order.wait_for_earlier(subject, seq, &slot.shutdown));
        match timing::stage(Stage::Wait, wait).await {
            Ok(Waited::Go { waited }) => {
                let ms = waited.as_millis() as u64;
                self.worker.metrics.add(&ORDER_WAIT_MS, &[], ms);
                debug!(
                    after = first,
                    waited_ms = waited.as_millis() as u64,
                    "conversation's turn came"
                );
            }
            Ok(Waited::Cancelled) => return Some(Ending::Returned),
            Err(e) => return Some(Ending::Failed(Failure::of(&e))),
        }
        let slot_started = std::time::Instant::now();
        tokio::select! {
            p = slot.semaphore.clone().acquire_owned() => {
                slot.permit = p.ok();
                timing::add(Stage::Wait, slot_started);
            }
            _ = slot.shutdown.cancelled() => return Some(Ending::Returned),
        }
        None
    }

    /// A turn slot for a delivery taken without one (drained from the pull when an outage began);
    /// the ending when the worker stops first.
    async fn take_slot(&self, slot: &mut Permit) -> Option<Ending> {
        if slot.permit.is_some() {
            return None;
        }
        tokio::select! {
            p = slot.semaphore.clone().acquire_owned() => {
                slot.permit = p.ok();
                None
            }
            _ = slot.shutdown.cancelled() => Some(Ending::Returned),
        }
    }

    /// A transient failure may be an outage of a shared dependency: then it is waited out (the delivery
    /// held, its progress acks going on) and `None` says to run the work again in the same delivery.
    /// Otherwise, the ending to settle: the failure as it was, a failure owed an answer once the outage
    /// outlasted `COMPANION_OUTAGE_MAX_SECS` (counted from the first wait of this delivery at most), or
    /// the worker stopping.
    async fn outlast(
        &self,
        ending: Ending,
        held_since: &mut Option<std::time::Instant>,
    ) -> Option<Ending> {
        let Ending::Failed(f) = &ending else {
            return Some(ending);
        };
        if f.class != Class::Transient {
            return Some(ending);
        }
        let outages = &self.worker.outages;
        let first = *held_since.get_or_insert_with(std::time::Instant::now);
        let wait = Box::pin(outages.wait_out(&f.reason, first, &self.hard_stop));
        match timing::stage(Stage::Wait, wait).await {
            WaitOut::NoOutage => Some(ending),
            WaitOut::Resumed { waited } => {
                info!(
                    error = %f.reason,
                    waited_ms = waited.as_millis() as u64,
                    "the outage is over; running the work again in this delivery"
                );
                None
            }
            WaitOut::Exceeded(outage) => Some(Ending::Failed(Failure::new(
                Class::Permanent,
                format!(
                    "{} did not answer within COMPANION_OUTAGE_MAX_SECS ({} s; the outage began {} s ago): {}",
                    outage.dependency.name(),
                    outages.max().as_secs(),
                    outage.waited().as_secs(),
                    f.reason
                ),
            ))),
            WaitOut::Cancelled => Some(Ending::Returned),
        }
    }

    /// `work`, with a panic inside it caught here, at the delivery's boundary: logged with the step its
    /// job last started, counted in `companion_panics_total{kind}`, and settled as a transient failure
    /// (NAK with delay, then the dead letter and, for a user's message, the failure line).
    async fn guarded<T>(
        &self,
        kind: &'static str,
        work: impl Future<Output = T>,
    ) -> Result<T, Failure> {
        let caught = AssertUnwindSafe(work).catch_unwind();
        let (out, step) = crate::journal::tracing_steps(caught).await;
        out.map_err(|payload| {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            let step = step.as_deref().unwrap_or("none");
            error!(kind, step, panic = %what, "the job panicked; it settles as a transient failure");
            self.worker
                .metrics
                .inc(&PANICS, &[("kind", kind)]);
            Failure::new(Class::Transient, format!("panicked at step {step}: {what}"))
        })
    }

    /// `companion_turns_total{outcome}` (a failure line is counted by the settlement).
    fn count(&self, ending: &Ending, verdict: &Verdict, outcome: Option<&'static str>) {
        let name = match (ending, verdict) {
            (Ending::Settled { .. }, _) => outcome.unwrap_or("answered"),
            (Ending::Returned, _) => "returned",
            (Ending::Failed(_), Verdict::Nak { .. }) => "retried",
            _ => return,
        };
        self.worker.metrics.inc(&TURNS, &[("outcome", name)]);
    }
}

/// Pulls from `consumer` until `shutdown` fires: each message is spawned onto `tasks` with a permit of
/// `semaphore` (so at most its size run at once); a consumer deleted under the worker is recreated.
/// While an outage is waited out ([`Outages`]) it pulls nothing: the messages already received are
/// spawned without a permit (each takes one before it runs), the pull is dropped so that the server
/// sends no more, and pulling starts again once the outage is over.
async fn pull<R, RF, S, SF>(
    Pulled {
        consumer,
        concurrency,
        semaphore,
        shutdown,
        outages,
    }: Pulled<'_>,
    tasks: &mut JoinSet<()>,
    recreate: R,
    mut spawn: S,
) where
    R: Fn() -> RF,
    RF: std::future::Future<Output = Result<(), BusError>>,
    S: FnMut(jetstream::Message, Option<OwnedSemaphorePermit>) -> SF,
    SF: std::future::Future<Output = ()> + Send + 'static,
{
    let mut outage = outages.subscribe();
    'pull: while !shutdown.is_cancelled() {
        if outage.borrow_and_update().is_some() {
            tokio::select! {
                _ = shutdown.cancelled() => break 'pull,
                _ = outage.wait_for(Option::is_none) => {}
            }
        }
        let Some(mut messages) = start_pulling(consumer, concurrency, shutdown).await else {
            continue 'pull;
        };
        loop {
            while tasks.try_join_next().is_some() {}
            let permit = tokio::select! {
                _ = shutdown.cancelled() => break 'pull,
                _ = outage.wait_for(Option::is_some) => None,
                p = semaphore.clone().acquire_owned() => Some(p.expect("semaphore is never closed")),
            };
            let next = match permit {
                None => None,
                Some(_) => tokio::select! {
                    _ = shutdown.cancelled() => break 'pull,
                    _ = outage.wait_for(Option::is_some) => None,
                    m = messages.next() => Some(m),
                },
            };
            let Some(next) = next else {
                // An outage began: keep what has arrived, and stop the server sending more.
                let kept = keep_arrived(&mut messages, tasks, &mut spawn);
                drop(messages);
                info!(kept, "an outage began: not pulling until it is over");
                continue 'pull;
            };
            match next {
                Some(Ok(msg)) => {
                    tasks.spawn(spawn(msg, permit));
                }
                Some(Err(e)) => {
                    warn!(error = %e, "pull error");
                    if matches!(
                        e.kind(),
                        jetstream::consumer::pull::MessagesErrorKind::ConsumerDeleted
                    ) {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        // Recreated (missing) with this worker's settings.
                        match recreate().await {
                            Ok(()) => continue 'pull,
                            Err(e) => error!(error = %e, "cannot recreate the consumer"),
                        }
                    }
                }
                None => {
                    warn!("message stream ended; pulling again");
                    continue 'pull;
                }
            }
        }
    }
}

/// The consumer a loop pulls from, and what bounds and stops it.
struct Pulled<'a> {
    consumer: &'a jetstream::consumer::PullConsumer,
    /// Messages pulled at once (a batch holds at most this many, 64 at most).
    concurrency: usize,
    /// A message runs with one of its permits.
    semaphore: &'a Arc<Semaphore>,
    shutdown: &'a CancellationToken,
    /// While one is waited out, nothing is pulled.
    outages: &'a Outages,
}

/// Starts a pull of `consumer`'s messages, in batches of at most `concurrency` (64 at most); `None`
/// when it cannot start (after a second's wait, or at `shutdown`): the caller tries again.
async fn start_pulling(
    consumer: &jetstream::consumer::PullConsumer,
    concurrency: usize,
    shutdown: &CancellationToken,
) -> Option<jetstream::consumer::pull::Stream> {
    let started = consumer
        .stream()
        .max_messages_per_batch(concurrency.min(64))
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await;
    match started {
        Ok(m) => Some(m),
        Err(e) => {
            warn!(error = %e, "cannot start pulling; retrying in 1 s");
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            None
        }
    }
}

/// Spawns, without a permit (each takes one before it runs), the messages that have already arrived;
/// how many.
fn keep_arrived<S, SF>(
    messages: &mut jetstream::consumer::pull::Stream,
    tasks: &mut JoinSet<()>,
    spawn: &mut S,
) -> usize
where
    S: FnMut(jetstream::Message, Option<OwnedSemaphorePermit>) -> SF,
    SF: std::future::Future<Output = ()> + Send + 'static,
{
    let mut kept = 0;
    while let Some(Some(Ok(msg))) = messages.next().now_or_never() {
        tasks.spawn(spawn(msg, None));
        kept += 1;
    }
    kept
}

/// Waits for every task to end, up to `grace`; whether they all did.
async fn finished_within(tasks: &mut JoinSet<()>, grace: Duration) -> bool {
    tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} })
        .await
        .is_ok()
}

/// The signal consumer's loop: each signal is sent as a proactive message, at most
/// `COMPANION_SIGNAL_CONCURRENCY` at once, and settled like a turn (without an order gate: a signal is about
/// one draft or reminder, not a step of a conversation). On shutdown it stops pulling and lets the
/// signals in hand finish within the grace period; what is left is redelivered.
async fn run_signals(
    shared: Arc<Running>,
    consumer: crate::bus::Consumer,
    shutdown: CancellationToken,
) {
    let w = &shared.worker;
    let limits = settle::RetryLimits {
        max_deliver: consumer.max_deliver.max(1),
        ..shared.limits
    };
    let concurrency = w.config.signal_concurrency.max(1);
    let recreate = || async { w.bus.consumer(Feed::Signals, &w.consumer).await.map(drop) };
    let handle = move |shared: Arc<Running>, msg| async move {
        shared.handle_signal(msg, limits).await;
    };
    let side = SideLoop {
        consumer: &consumer.consumer,
        concurrency,
        shutdown: &shutdown,
        what: "signals",
    };
    side.run(&shared, recreate, handle).await;
}

/// A loop beside the DM consumer's: what it pulls, how many at once, and what stops it.
struct SideLoop<'a> {
    consumer: &'a jetstream::consumer::PullConsumer,
    /// Messages handled at once.
    concurrency: usize,
    shutdown: &'a CancellationToken,
    /// What the messages are, for the log.
    what: &'static str,
}

impl SideLoop<'_> {
    /// Pulls until shutdown, each message handled by `handle` with one of the loop's permits; then the
    /// messages in hand finish within the grace period, and what is left is redelivered.
    async fn run<R, RF, H, HF>(self, shared: &Arc<Running>, recreate: R, handle: H)
    where
        R: Fn() -> RF,
        RF: Future<Output = Result<(), BusError>>,
        H: Fn(Arc<Running>, jetstream::Message) -> HF,
        HF: Future<Output = ()> + Send + 'static,
    {
        let w = &shared.worker;
        let semaphore = Arc::new(Semaphore::new(self.concurrency));
        let mut tasks = JoinSet::new();
        let pulled = Pulled {
            consumer: self.consumer,
            concurrency: self.concurrency,
            semaphore: &semaphore,
            shutdown: self.shutdown,
            outages: &w.outages,
        };
        pull(pulled, &mut tasks, recreate, |msg, permit| {
            let handled = handle(shared.clone(), msg);
            async move {
                handled.await;
                drop(permit);
            }
        })
        .await;
        if !finished_within(&mut tasks, w.config.shutdown_grace()).await {
            warn!(
                left = tasks.len(),
                what = self.what,
                "grace period over; what is unfinished will be redelivered"
            );
            tasks.abort_all();
        }
    }
}

impl Running {
    /// One signal, from bytes to its settlement; never panics on input.
    async fn handle_signal(&self, msg: jetstream::Message, limits: settle::RetryLimits) {
        let (delivered, seq) = msg
            .info()
            .map(|i| (i.delivered, i.stream_sequence))
            .unwrap_or((1, 0));
        let span = info_span!(
            "signal",
            subject = %msg.subject,
            job = tracing::field::Empty,
            conversation_id = tracing::field::Empty,
            delivery = delivered,
            seq,
        );
        async {
            let progress = keep_alive(&msg, self.progress_every);
            let work = || self.act_on_signal(&msg, seq);
            let mut held_since = None;
            let ending = loop {
                let ending = match self.guarded("signal", work()).await {
                    Ok(Ok(())) => Ending::Settled {
                        through: None,
                        floored: None,
                    },
                    Ok(Err(e)) => Ending::Failed(Failure::of(&e)),
                    Err(panicked) => Ending::Failed(panicked),
                };
                if let Some(ending) = self.outlast(ending, &mut held_since).await {
                    break ending;
                }
            };
            drop(progress);
            let verdict = settle::decide(&ending, delivered, &limits);
            match (&ending, &verdict) {
                (Ending::Failed(f), Verdict::Nak { delay }) => {
                    warn!(error = %f.reason, retry_in_ms = delay.as_millis() as u64, "signal failed; will retry")
                }
                (Ending::Failed(f), Verdict::Term { .. }) => {
                    error!(error = %f.reason, "signal cannot be acted on; dead-lettering");
                    self.worker
                        .metrics
                        .inc(&PROACTIVE, &[("kind", "signal"), ("outcome", "failed")]);
                }
                _ => {}
            }
            self.settler
                .execute(Handle::Message(&msg), None, verdict, delivered)
                .await;
        }
        .instrument(span)
        .await
    }

    /// A signal to what acts on it, by its kind: a takeover, a memory extraction or deletion; else the
    /// pipeline, as a follow-up.
    async fn act_on_signal(
        &self,
        msg: &jetstream::Message,
        seq: u64,
    ) -> Result<(), crate::pipeline::PipelineError> {
        let subject = msg.subject.as_str();
        let (takeovers, memory) = (&self.worker.takeovers, &self.worker.memory_signals);
        match self.worker.bus.names.signal_parts(subject) {
            Some((crate::takeover::KIND, _)) => {
                Box::pin(takeovers.takeover(subject, &msg.payload)).await
            }
            Some((kind @ crate::memory::KIND, id)) => Box::pin(memory.extraction(kind, id))
                .await
                .map_err(crate::pipeline::PipelineError::from),
            Some((
                kind @ (crate::memory::MESSAGE_DELETED
                | crate::memory::MEMORY_CLEARED
                | crate::memory::USER_ERASED),
                id,
            )) => {
                let deletion = memory.deletion(kind, id, &msg.payload, seq);
                Box::pin(deletion)
                    .await
                    .map_err(crate::pipeline::PipelineError::from)
            }
            _ => {
                let input = Input::Signal {
                    subject,
                    payload: &msg.payload,
                };
                let delivery = Arrival {
                    order: None,
                    subject,
                    seq,
                };
                let handled = self.worker.pipeline.handle(&input, Some(&delivery));
                Box::pin(handled).await.map(drop)
            }
        }
    }
}

/// Sends progress acks so a long turn keeps its message, until the handle is dropped (settled, failed or
/// unwound).
fn keep_alive(msg: &jetstream::Message, every: Duration) -> AbortOnDropHandle<()> {
    let msg = msg.clone();
    AbortOnDropHandle::new(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tick.tick().await;
            // Keep trying through a NATS reconnect: the turn may still finish in time.
            if let Err(e) = msg.ack_with(AckKind::Progress).await {
                debug!(error = %e, "progress ack not sent");
            }
        }
    }))
}

/// Events whose deliveries ran out without a worker settling them (crashed or killed mid-turn) would
/// otherwise just stop. The server's notice of each (its max-deliveries advisory) is kept in the
/// exhausted stream, so a notice given while no worker ran waits for the next one to start; a worker
/// settles the event from it as a transient failure on its last delivery, one notice at a time. A repeat
/// is harmless (the dead letter and the reply are keyed by the event).
async fn run_exhausted(
    shared: Arc<Running>,
    consumer: crate::bus::Consumer,
    shutdown: CancellationToken,
) {
    let w = &shared.worker;
    let recreate = || async { w.bus.consumer(Feed::Exhausted, &w.consumer).await.map(drop) };
    let progress = (consumer.ack_wait / 3).max(Duration::from_millis(200));
    let handle = move |shared: Arc<Running>, msg| async move {
        shared.on_exhausted(msg, progress).await;
    };
    let side = SideLoop {
        consumer: &consumer.consumer,
        concurrency: 1,
        shutdown: &shutdown,
        what: "notices of exhausted events",
    };
    side.run(&shared, recreate, handle).await;
}

impl Running {
    /// One notice of the exhausted stream, settled and acked; kept for a later try (NAK) when the event
    /// cannot be read now, dropped (TERM) when it is not a notice.
    async fn on_exhausted(&self, msg: jetstream::Message, progress: Duration) {
        #[derive(serde::Deserialize)]
        struct MaxDeliveries {
            stream: String,
            stream_seq: u64,
            deliveries: i64,
        }
        let answer = match serde_json::from_slice::<MaxDeliveries>(&msg.payload) {
            Err(e) => {
                warn!(error = %e, "unreadable max-deliveries advisory; dropped");
                AckKind::Term
            }
            Ok(a) => {
                let _alive = keep_alive(&msg, progress);
                let span = info_span!("exhausted", stream = %a.stream, seq = a.stream_seq, deliveries = a.deliveries);
                match self
                    .settle_exhausted(&a.stream, a.stream_seq, a.deliveries)
                    .instrument(span)
                    .await
                {
                    true => AckKind::Ack,
                    false => AckKind::Nak(Some(crate::bus::EXHAUSTED_RETRY)),
                }
            }
        };
        if let Err(e) = msg.ack_with(answer).await {
            warn!(error = %e, "could not settle the notice; the server will redeliver it");
        }
    }

    /// An event (a DM or a signal, by `stream`) whose deliveries ran out, settled as a transient failure on
    /// its last delivery: the failure line for a DM that parses, a dead letter for every one. A signal's
    /// job stays open, so republishing it runs it again from its recorded steps. True when it is settled or
    /// nothing is left to settle; false when it could not be read or written now.
    async fn settle_exhausted(&self, stream: &str, seq: u64, deliveries: i64) -> bool {
        let w = &self.worker;
        if stream != w.bus.names.stream_in && stream != w.bus.names.stream_signal {
            warn!("a notice about a stream this worker does not read; dropped");
            return true;
        }
        let stream = match w.bus.js.get_stream(stream).await {
            Ok(s) => s,
            Err(e) => {
                error!(error = %e, "cannot open the stream; the notice is tried again");
                return false;
            }
        };
        let msg = match stream.get_raw_message(seq).await {
            Ok(m) => m,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {
                warn!(
                    "the exhausted event is no longer in the stream (expired, or its user erased)"
                );
                return true;
            }
            Err(e) => {
                error!(error = %e, "cannot read the exhausted event; the notice is tried again");
                return false;
            }
        };
        let signal = w.bus.names.is_signal(msg.subject.as_str());
        let reason = format!(
            "no worker finished this {} in {deliveries} deliveries (crashed or timed out)",
            if signal { "signal" } else { "event" }
        );
        let transient = |reason| Ending::Failed(Failure::new(Class::Transient, reason));
        let (ending, event) = if signal {
            w.metrics
                .inc(&PROACTIVE, &[("kind", "signal"), ("outcome", "failed")]);
            (transient(reason), None)
        } else {
            match parse_event(
                &msg.payload,
                msg.subject.as_str(),
                &w.bus.names.prefix,
                w.pipeline.limits(),
            ) {
                Ok(event) => (transient(reason), Some(event)),
                Err(e) => (
                    Ending::Failed(Failure::new(Class::Reject, format!("{reason}; {e}"))),
                    None,
                ),
            }
        };
        let verdict = settle::decide(
            &ending,
            deliveries.max(self.limits.max_deliver),
            &self.limits,
        );
        let handle = Handle::Exhausted {
            subject: msg.subject.as_str(),
            seq,
            payload: msg.payload.clone(),
        };
        self.settler
            .execute(handle, event.as_ref(), verdict, deliveries)
            .await
    }
}
