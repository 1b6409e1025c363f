//! The load phases of a run: the warm-up, then the measured phase, sampling the workers' memory, the
//! turns in flight and the CPU time of every process involved while it runs.

use std::time::{Duration, Instant};

use super::{
    env::RunEnv,
    load::{self, Progress, Tracker},
    procs::{self, Servers},
    prompt::Sampler,
    workers::WorkerProc,
};
use crate::stub::StubLlm;
use companion_store::bus::event::InboundEvent;

/// kB to MB.
pub fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// Resident memory of each worker now, MB (0 for one that is gone).
pub fn rss_mb(procs: &[WorkerProc]) -> Vec<f64> {
    procs
        .iter()
        .map(|w| procs::sample(w.pid).map(|s| mb(s.rss_kb)).unwrap_or(0.0))
        .collect()
}

/// What both phases publish over and count with.
pub struct Phases<'a> {
    /// The run's bus to publish on, and its configuration and tag to find the servers by.
    pub env: &'a RunEnv,
    /// Counts the current phase's events as they are published and completed.
    pub tracker: Tracker,
    /// Turns published per second (0: as fast as the server acks).
    pub rate: f64,
    /// How long to wait for the last completions after the last publish.
    pub timeout: Duration,
}

/// CPU time so far of the processes a run involves, clock ticks.
pub struct Ticks {
    /// The worker processes together.
    pub workers: u64,
    /// The NATS and MongoDB-wire servers, in the order of [`Servers::ticks`].
    pub servers: [u64; 2],
    /// PostgreSQL's processes, each on its own (they come and go).
    pub postgres: procs::PgSnapshot,
    /// This process: publisher, completion counting and the stub model.
    pub bench: u64,
    /// The machine: busy and total, as [`procs::machine_ticks`].
    pub machine: (u64, u64),
}

impl Ticks {
    fn read(pids: &[u32], servers: &Servers) -> Self {
        Self {
            workers: pids.iter().filter_map(|p| procs::cpu_ticks(*p)).sum(),
            servers: servers.ticks(),
            postgres: servers.postgres_now(),
            bench: procs::cpu_ticks(std::process::id()).unwrap_or(0),
            machine: procs::machine_ticks().unwrap_or((0, 0)),
        }
    }
}

/// Samples of the measured phase, taken while it runs.
struct Samples {
    /// Per worker, the highest resident memory seen, kB.
    peak_rss_kb: Vec<u64>,
    /// Most events published and not yet completed at a sample.
    peak_in_flight: usize,
}

impl Samples {
    fn take(&mut self, p: Progress, pids: &[u32]) {
        self.peak_in_flight = self.peak_in_flight.max(p.in_flight());
        for (peak, pid) in self.peak_rss_kb.iter_mut().zip(pids) {
            if let Some(x) = procs::sample(*pid) {
                *peak = (*peak).max(x.rss_kb);
            }
        }
    }
}

/// What the measured phase saw.
pub struct Measured {
    /// The counters at the end, with duplicates counted a moment after the last completion.
    pub progress: Progress,
    /// When the phase started (just before the publisher), the origin of its timeline.
    pub started: Instant,
    /// From the start to the last completion.
    pub seconds: f64,
    /// CPU time at the start, to subtract from `after`.
    pub before: Ticks,
    /// CPU time once the last completion came (or the wait gave up).
    pub after: Ticks,
    /// Per worker, the highest resident memory sampled, MB.
    pub peak_rss_mb: Vec<f64>,
    /// Per worker, the kernel's peak resident memory (`VmHWM`) at the end, MB.
    pub hwm_mb: Vec<f64>,
    /// Most events published and not yet completed at a sample.
    pub peak_in_flight: usize,
}

impl Phases<'_> {
    /// Publishes the warm-up turns and waits for them (a shortfall is only reported), then lets the
    /// workers settle for a second.
    pub async fn warm_up(&self, events: Vec<InboundEvent>) {
        if events.is_empty() {
            return;
        }
        eprintln!("bench: warm-up, {} turns…", events.len());
        let n = events.len();
        self.tracker.reset(&events);
        load::publish(&self.env.bus, events, self.rate, &self.tracker).await;
        let p = load::wait_done(&self.tracker, n, self.timeout, "warm-up", |_| {}).await;
        if p.completed < n {
            eprintln!(
                "bench: warm-up: only {} of {n} completed; measuring anyway",
                p.completed
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    /// The measured phase: publishes `events` from a task of its own while sampling, then waits for the
    /// last completions. The sampler's and the stub model's counts start afresh here.
    pub async fn measured(
        &self,
        events: Vec<InboundEvent>,
        procs: &[WorkerProc],
        sampler: &Sampler,
        stub: &StubLlm,
    ) -> Measured {
        let turns = events.len();
        eprintln!(
            "bench: measuring {turns} turns at {}…",
            if self.rate > 0.0 {
                format!("{} turns/s", self.rate)
            } else {
                "full speed".into()
            }
        );
        self.tracker.reset(&events);
        sampler.clear();
        stub.reset_totals();
        let servers = self.servers();
        let pids: Vec<u32> = procs.iter().map(|w| w.pid).collect();
        let before = Ticks::read(&pids, &servers);
        let started = Instant::now();
        let mut samples = Samples {
            peak_rss_kb: vec![0; pids.len()],
            peak_in_flight: 0,
        };
        let publisher = {
            let (bus, tracker, rate) = (self.env.bus.clone(), self.tracker.clone(), self.rate);
            tokio::spawn(async move { load::publish(&bus, events, rate, &tracker).await })
        };
        self.watch(&publisher, turns, started, &pids, &mut samples)
            .await;
        let _ = publisher.await;
        let progress = load::wait_done(&self.tracker, turns, self.timeout, "draining", |p| {
            samples.take(p, &pids)
        })
        .await;
        let ended = self.tracker.last_completion().unwrap_or_else(Instant::now);
        let seconds = ended.duration_since(started).as_secs_f64().max(1e-9);
        let after = Ticks::read(&pids, &servers);
        let hwm_mb: Vec<f64> = pids
            .iter()
            .map(|p| procs::sample(*p).map(|s| mb(s.hwm_kb)).unwrap_or(0.0))
            .collect();
        // Late duplicates would show within a moment.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let progress = Progress {
            duplicates: self.tracker.progress().duplicates,
            ..progress
        };
        Measured {
            progress,
            started,
            seconds,
            before,
            after,
            peak_rss_mb: samples.peak_rss_kb.iter().map(|k| mb(*k)).collect(),
            hwm_mb,
            peak_in_flight: samples.peak_in_flight,
        }
    }

    /// The run's server processes; those not found are said, as their CPU then shows as other.
    fn servers(&self) -> Servers {
        let config = &self.env.config;
        let port = |url: &str, default: u16| {
            url::Url::parse(url.split(',').next().unwrap_or(url))
                .ok()
                .and_then(|u| u.port())
                .unwrap_or(default)
        };
        let servers = Servers::find(
            port(&config.nats.url, 4222),
            port(&config.mongo.uri, 27017),
            &format!("bench_{}", self.env.tag),
        );
        // PostgreSQL's processes are found at each reading (`Servers::postgres_now`), and said there.
        if servers.nats.is_empty() || servers.mongo.is_empty() {
            eprintln!(
                "bench: server processes not all found (nats {:?}, mongo {:?}); their CPU shows as other",
                servers.nats, servers.mongo,
            );
        }
        servers
    }

    /// Until the publisher is done: a sample every 100 ms, a progress line every second.
    async fn watch(
        &self,
        publisher: &tokio::task::JoinHandle<()>,
        turns: usize,
        started: Instant,
        pids: &[u32],
        samples: &mut Samples,
    ) {
        let mut last_print = Instant::now();
        while !publisher.is_finished() {
            let p = self.tracker.progress();
            samples.take(p, pids);
            if last_print.elapsed() >= Duration::from_secs(1) {
                let rss: Vec<String> = pids
                    .iter()
                    .map(|pid| {
                        procs::sample(*pid)
                            .map(|s| format!("{:.0}", mb(s.rss_kb)))
                            .unwrap_or_default()
                    })
                    .collect();
                eprintln!(
                    "  {:>6.1} s  published {}/{turns}  completed {}  in flight {}  worker RSS {} MB",
                    started.elapsed().as_secs_f64(),
                    p.published,
                    p.completed,
                    p.in_flight(),
                    rss.join("/")
                );
                last_print = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
