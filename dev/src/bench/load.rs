//! The load: events published as TB-Backend publishes them (`Nats-Msg-Id`, JetStream ack) at a set rate,
//! and every completion counted as it arrives on `<prefix>.out.>`, so a lost or duplicated reply shows.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use tokio::sync::Semaphore;

use super::BenchError;
use crate::backend;
use companion_store::bus::{Bus, event::InboundEvent};

/// Publishes waiting for their JetStream ack at once (bounds the publisher's memory when open-loop).
const MAX_PENDING_PUBLISHES: usize = 512;

/// What happened to each event of a phase.
#[derive(Default)]
struct State {
    index: HashMap<String, usize>,
    published_at: Vec<Option<Instant>>,
    completed_at: Vec<Option<Instant>>,
    /// Completions received per event (more than one is a duplicate on the wire).
    received: Vec<u32>,
    published: usize,
    completed: usize,
    duplicates: usize,
    /// Completion messages of this phase's events (a reply may answer a burst).
    replies: usize,
    /// Events answered as part of a burst (in a reply's `covers`).
    covered: usize,
    publish_errors: usize,
    /// JetStream said the publish was a duplicate (must not happen: ids are fresh).
    publish_duplicates: usize,
}

/// Shared view of a phase's events, fed by the publisher and the completion subscriber.
#[derive(Clone, Default)]
pub struct Tracker {
    state: Arc<Mutex<State>>,
}

/// Counters of a phase at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub published: usize,
    pub completed: usize,
    pub duplicates: usize,
    pub replies: usize,
    pub covered: usize,
    pub publish_errors: usize,
    pub publish_duplicates: usize,
}

impl Progress {
    pub fn in_flight(&self) -> usize {
        self.published.saturating_sub(self.completed)
    }
}

impl Tracker {
    /// Starts tracking a new set of events (completions of earlier ones are then ignored).
    pub fn reset(&self, events: &[InboundEvent]) {
        let mut s = self.state.lock().expect("tracker lock");
        *s = State {
            index: events
                .iter()
                .enumerate()
                .map(|(i, e)| (e.message_id.clone(), i))
                .collect(),
            published_at: vec![None; events.len()],
            completed_at: vec![None; events.len()],
            received: vec![0; events.len()],
            ..State::default()
        };
    }

    pub fn progress(&self) -> Progress {
        let s = self.state.lock().expect("tracker lock");
        Progress {
            published: s.published,
            completed: s.completed,
            duplicates: s.duplicates,
            replies: s.replies,
            covered: s.covered,
            publish_errors: s.publish_errors,
            publish_duplicates: s.publish_duplicates,
        }
    }

    /// Milliseconds from publish to completion, for every completed event.
    pub fn latencies_ms(&self) -> Vec<f64> {
        let s = self.state.lock().expect("tracker lock");
        s.published_at
            .iter()
            .zip(&s.completed_at)
            .filter_map(|(p, c)| Some(c.as_ref()?.duration_since(*p.as_ref()?).as_secs_f64() * 1e3))
            .collect()
    }

    /// Events published and completed in each second since `start` (one entry per second).
    pub fn timeline(&self, start: Instant) -> Vec<super::report::Second> {
        let s = self.state.lock().expect("tracker lock");
        let second = |t: &Instant| t.saturating_duration_since(start).as_secs() as usize;
        let last = s
            .published_at
            .iter()
            .chain(&s.completed_at)
            .flatten()
            .map(second)
            .max();
        let Some(last) = last else {
            return Vec::new();
        };
        let mut out: Vec<super::report::Second> = (0..=last)
            .map(|i| super::report::Second {
                second: i,
                ..Default::default()
            })
            .collect();
        for t in s.published_at.iter().flatten() {
            out[second(t)].published += 1;
        }
        for t in s.completed_at.iter().flatten() {
            out[second(t)].completed += 1;
        }
        out
    }

    /// When the last completion arrived.
    pub fn last_completion(&self) -> Option<Instant> {
        let s = self.state.lock().expect("tracker lock");
        s.completed_at.iter().flatten().max().copied()
    }

    fn published(&self, i: usize, at: Instant) {
        let mut s = self.state.lock().expect("tracker lock");
        s.published_at[i] = Some(at);
        s.published += 1;
    }

    fn publish_result(&self, result: Result<bool, String>) {
        let mut s = self.state.lock().expect("tracker lock");
        match result {
            Ok(true) => s.publish_duplicates += 1,
            Ok(false) => {}
            Err(e) => {
                if s.publish_errors == 0 {
                    tracing::warn!(error = %e, "publish failed");
                }
                s.publish_errors += 1;
            }
        }
    }

    /// One completion: the event it answers and the later events of the burst it covers.
    fn completion(&self, in_reply_to: &str, covers: &[String], at: Instant) {
        let mut s = self.state.lock().expect("tracker lock");
        if s.index.contains_key(in_reply_to) {
            s.replies += 1;
        }
        for (n, id) in std::iter::once(in_reply_to)
            .chain(covers.iter().map(String::as_str))
            .enumerate()
        {
            let Some(&i) = s.index.get(id) else {
                continue;
            };
            s.received[i] += 1;
            if s.received[i] == 1 {
                s.completed_at[i] = Some(at);
                s.completed += 1;
                if n > 0 {
                    s.covered += 1;
                }
            } else {
                s.duplicates += 1;
            }
        }
    }
}

/// Subscribes to every completion of the run (core subscription, before anything is published).
pub async fn collect_completions(
    bus: &Bus,
    tracker: Tracker,
) -> Result<tokio::task::JoinHandle<()>, BenchError> {
    let mut sub = bus
        .client
        .subscribe(format!("{}.out.>", bus.names.prefix))
        .await
        .map_err(|e| BenchError::Setup(format!("subscribing to completions: {e}")))?;
    Ok(tokio::spawn(async move {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Reply {
            in_reply_to: String,
            #[serde(default)]
            covers: Vec<String>,
        }
        while let Some(msg) = sub.next().await {
            let at = Instant::now();
            if let Ok(r) = serde_json::from_slice::<Reply>(&msg.payload) {
                tracker.completion(&r.in_reply_to, &r.covers, at);
            }
        }
    }))
}

/// Publishes `events` at `rate` per second (0: as fast as the server acks), each as TB-Backend does.
/// Returns when the last one is published (its ack may still be on the way).
pub async fn publish(bus: &Bus, events: Vec<InboundEvent>, rate: f64, tracker: &Tracker) {
    let started = Instant::now();
    let pending = Arc::new(Semaphore::new(MAX_PENDING_PUBLISHES));
    for (i, mut event) in events.into_iter().enumerate() {
        if rate > 0.0 {
            let due = started + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
        }
        // Sent now, as TB-Backend publishes a message when the user sends it: the history orders a
        // conversation's messages by it, between the replies to the messages before.
        event.sent_at = chrono::Utc::now();
        let permit = pending.clone().acquire_owned().await.expect("never closed");
        tracker.published(i, Instant::now());
        let (bus, tracker) = (bus.clone(), tracker.clone());
        tokio::spawn(async move {
            let result = backend::publish_event(&bus, &event)
                .await
                .map_err(|e| e.to_string());
            tracker.publish_result(result);
            drop(permit);
        });
    }
    // Every publish has its ack (or error) once all permits are back.
    let _ = pending
        .acquire_many(MAX_PENDING_PUBLISHES as u32)
        .await
        .map(|p| p.forget());
}

/// Waits until every published event of the phase is completed or `timeout` passes after the call;
/// prints a progress line every `every` (and calls `tick` at each line, e.g. to sample memory).
pub async fn wait_done(
    tracker: &Tracker,
    expected: usize,
    timeout: Duration,
    label: &str,
    mut tick: impl FnMut(Progress),
) -> Progress {
    let started = Instant::now();
    let mut last_print = Instant::now();
    loop {
        let p = tracker.progress();
        tick(p);
        if p.completed >= expected || started.elapsed() > timeout {
            return p;
        }
        if last_print.elapsed() >= Duration::from_secs(1) {
            eprintln!(
                "  {label}: completed {}/{expected}, in flight {}",
                p.completed,
                p.in_flight()
            );
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
