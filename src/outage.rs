//! Outages of a shared dependency (PostgreSQL, MongoDB, the broker), waited out instead of spent.
//!
//! A turn that fails transiently asks [`Outages::wait_out`] before its delivery is settled. When a probe
//! finds a shared dependency not answering, an outage begins: the pull loops stop taking new work, the
//! messages the worker holds stay held (their progress acks go on, so the server neither redelivers them
//! nor counts a delivery), and one prober asks the dependencies again every second. Once they all answer,
//! every held message runs again in the delivery it has. An outage longer than `COMPANION_OUTAGE_MAX_SECS`
//! ends the wait: the held messages are settled as a failure that is owed an answer (the failure line
//! once, a dead letter that `companion replay --dlq` brings back).
//!
//! The model is no shared dependency: its failures are not probed for here, and settle as before.
//! `/readyz` and the log name the dependency and since when; `companion_outage_wait_milliseconds_total`
//! counts the time spent waiting, by dependency, and an alert rule watches it (deploy/prometheus).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    bus::Bus,
    metrics::{Metric, Metrics},
    store::{Mongo, Pg},
};

/// Milliseconds spent waiting out an outage, by dependency.
pub(crate) const OUTAGE_WAIT_MS: Metric = Metric::new(
    "companion_outage_wait_milliseconds_total",
    "Milliseconds the worker spent waiting out an outage of a shared dependency (not pulling, holding its messages)",
);

/// How long one probe of a dependency may take before it counts as not answering.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the prober asks again during an outage.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// A probe that found everything answering is trusted this long (a burst of failures probes once).
const PROBE_FRESH: Duration = Duration::from_secs(1);
/// How often a continuing outage is logged again.
const LOG_EVERY: Duration = Duration::from_secs(30);

/// A dependency every turn needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dependency {
    Postgres,
    Mongodb,
    Nats,
}

impl Dependency {
    /// As `/readyz` and the metrics name it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Mongodb => "mongodb",
            Self::Nats => "nats",
        }
    }

    const ALL: [Self; 3] = [Self::Postgres, Self::Mongodb, Self::Nats];
}

/// An outage being waited out.
#[derive(Clone, Debug)]
pub(crate) struct Outage {
    /// The dependency not answering now (it may change while the outage lasts).
    pub(crate) dependency: Dependency,
    /// When this worker found it not answering.
    pub(crate) since: DateTime<Utc>,
    /// The same moment, for the bound.
    started: Instant,
}

impl Outage {
    pub(crate) fn waited(&self) -> Duration {
        self.started.elapsed()
    }
}

/// How waiting out ended.
#[derive(Debug)]
pub(crate) enum WaitOut {
    /// Every shared dependency answers: no outage, settle the failure as it is.
    NoOutage,
    /// The outage is over: run the work again, in the same delivery.
    Resumed { waited: Duration },
    /// The outage outlasted `COMPANION_OUTAGE_MAX_SECS`.
    Exceeded(Outage),
    /// The worker is stopping.
    Cancelled,
}

/// The shared dependencies as this worker sees them, and the outage it is waiting out.
pub(crate) struct Outages {
    pg: Pg,
    mongo: Mongo,
    bus: Bus,
    metrics: Arc<Metrics>,
    /// Longest an outage is waited out.
    max: Duration,
    state: watch::Sender<Option<Outage>>,
    /// When a probe last found every dependency answering.
    fresh: Mutex<Option<Instant>>,
}

impl Outages {
    pub(crate) fn new(
        pg: Pg,
        mongo: Mongo,
        bus: Bus,
        metrics: Arc<Metrics>,
        max: Duration,
    ) -> Self {
        // Alerts look at increases: each dependency's series exists (at 0) before the first outage.
        for d in Dependency::ALL {
            metrics.add(&OUTAGE_WAIT_MS, &[("dependency", d.name())], 0);
        }
        Self {
            pg,
            mongo,
            bus,
            metrics,
            max,
            state: watch::Sender::new(None),
            fresh: Mutex::new(None),
        }
    }

    /// The outage being waited out, if any.
    pub(crate) fn current(&self) -> Option<Outage> {
        self.state.borrow().clone()
    }

    /// The longest an outage is waited out.
    pub(crate) fn max(&self) -> Duration {
        self.max
    }

    /// Follows the outage state (the pull loops stop and start by it).
    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<Outage>> {
        self.state.subscribe()
    }

    /// The first shared dependency that does not answer within [`PROBE_TIMEOUT`], if any.
    async fn probe(&self) -> Option<Dependency> {
        let (pg, mongo, nats) = tokio::join!(
            tokio::time::timeout(PROBE_TIMEOUT, self.pg.ping()),
            tokio::time::timeout(PROBE_TIMEOUT, self.mongo.ping()),
            // A round trip, not the client's idea of its connection: a stalled server is still "connected".
            tokio::time::timeout(PROBE_TIMEOUT, self.bus.client.flush()),
        );
        [
            (Dependency::Postgres, matches!(pg, Ok(Ok(())))),
            (Dependency::Mongodb, matches!(mongo, Ok(Ok(())))),
            (Dependency::Nats, matches!(nats, Ok(Ok(())))),
        ]
        .into_iter()
        .find_map(|(d, up)| (!up).then_some(d))
    }

    /// Work failed transiently with `cause`: when a shared dependency does not answer, waits until it
    /// does, or until `stop`. The bound counts from the outage's start or from `held_since` (when this
    /// work was first held), whichever is earlier, so work held through outage after outage ends too.
    pub(crate) async fn wait_out(
        self: &Arc<Self>,
        cause: &str,
        held_since: Instant,
        stop: &CancellationToken,
    ) -> WaitOut {
        if self.current().is_none() {
            let fresh = self
                .fresh
                .lock()
                .expect("outage lock")
                .is_some_and(|at| at.elapsed() < PROBE_FRESH);
            if fresh {
                return WaitOut::NoOutage;
            }
            let Some(dependency) = self.probe().await else {
                *self.fresh.lock().expect("outage lock") = Some(Instant::now());
                return WaitOut::NoOutage;
            };
            self.begin(dependency, cause);
        }
        let mut state = self.subscribe();
        let Some(outage) = state.borrow_and_update().clone() else {
            return WaitOut::Resumed {
                waited: Duration::ZERO,
            };
        };
        let deadline = tokio::time::Instant::from_std(outage.started.min(held_since) + self.max);
        let held = Instant::now();
        tokio::select! {
            _ = state.wait_for(Option::is_none) => WaitOut::Resumed { waited: held.elapsed() },
            _ = tokio::time::sleep_until(deadline) => WaitOut::Exceeded(outage),
            _ = stop.cancelled() => WaitOut::Cancelled,
        }
    }

    /// Starts an outage of `dependency` unless one is on, with the prober that ends it.
    fn begin(self: &Arc<Self>, dependency: Dependency, cause: &str) {
        let began = self.state.send_if_modified(|s| {
            if s.is_some() {
                return false;
            }
            *s = Some(Outage {
                dependency,
                since: Utc::now(),
                started: Instant::now(),
            });
            true
        });
        if began {
            warn!(
                dependency = dependency.name(),
                error = cause,
                max_secs = self.max.as_secs(),
                "waiting out an outage of {}: not pulling new work; the messages held are kept and run again once it answers",
                dependency.name()
            );
            tokio::spawn(self.clone().probe_until_answered());
        }
    }

    /// Asks the dependencies every [`PROBE_EVERY`] until they all answer, counting the time waited.
    async fn probe_until_answered(self: Arc<Self>) {
        let mut counted = Instant::now();
        let mut logged = Instant::now();
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            let down = self.probe().await;
            let Some(outage) = self.current() else { return };
            let now = Instant::now();
            self.metrics.add(
                &OUTAGE_WAIT_MS,
                &[("dependency", outage.dependency.name())],
                now.duration_since(counted).as_millis() as u64,
            );
            counted = now;
            match down {
                None => {
                    self.state.send_replace(None);
                    *self.fresh.lock().expect("outage lock") = Some(Instant::now());
                    info!(
                        dependency = outage.dependency.name(),
                        waited_secs = outage.waited().as_secs(),
                        "{} answers again: the outage is over; pulling again and running the held messages",
                        outage.dependency.name()
                    );
                    return;
                }
                Some(d) if d != outage.dependency => {
                    self.state.send_modify(|s| {
                        if let Some(o) = s {
                            o.dependency = d;
                        }
                    });
                    warn!(
                        dependency = d.name(),
                        waited_secs = outage.waited().as_secs(),
                        "still waiting out the outage: {} answers, {} does not",
                        outage.dependency.name(),
                        d.name()
                    );
                }
                Some(d) if logged.elapsed() >= LOG_EVERY => {
                    logged = Instant::now();
                    warn!(
                        dependency = d.name(),
                        since = %outage.since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                        waited_secs = outage.waited().as_secs(),
                        max_secs = self.max.as_secs(),
                        "still waiting out an outage of {}",
                        d.name()
                    );
                }
                Some(_) => {}
            }
        }
    }
}
