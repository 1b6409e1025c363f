//! The operations endpoint: `/healthz` (process alive), `/readyz` (NATS, MongoDB, PostgreSQL reachable,
//! model loaded when configured; the outage being waited out, which dependency and since when) and `/metrics` (the process's [`Metrics`] as Prometheus text, with
//! the readiness and the shared consumer's pending / ack-pending gauges read from NATS when scraped).
//! It sits on top: it reads the components, none of them knows it.

use std::{fmt::Write, net::SocketAddr, sync::Arc, time::Duration};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use prometheus_client::encoding::prometheus_text;

use crate::{
    bus::Bus,
    metrics::{Metric, Metrics},
    outage::Outages,
    rag::Embedder,
    store::{Mongo, Pg},
};

/// What the endpoint looks at.
pub struct Probe {
    pub(crate) bus: Bus,
    pub(crate) mongo: Mongo,
    pub(crate) pg: Pg,
    /// `None` when the model is not installed (`/readyz` says `model down`, and stays ready).
    pub(crate) embedder: Option<Arc<Embedder>>,
    pub(crate) metrics: Arc<Metrics>,
    /// The outage the worker is waiting out, named by `/readyz`.
    pub(crate) outages: Arc<Outages>,
    /// The shared consumer whose gauges are reported.
    pub(crate) consumer_name: String,
    /// When the scrape-time gauges were last read, so scrapes cost at most one read a second.
    scraped: tokio::sync::Mutex<Option<std::time::Instant>>,
}

impl Probe {
    pub(crate) fn new(
        bus: Bus,
        mongo: Mongo,
        pg: Pg,
        embedder: Option<Arc<Embedder>>,
        metrics: Arc<Metrics>,
        outages: Arc<Outages>,
        consumer_name: String,
    ) -> Self {
        Self {
            bus,
            mongo,
            pg,
            embedder,
            metrics,
            outages,
            consumer_name,
            scraped: tokio::sync::Mutex::new(None),
        }
    }
}

/// Serves the endpoint on `addr` until the returned task is aborted; returns the bound address.
pub(crate) async fn serve(
    addr: SocketAddr,
    probe: Arc<Probe>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(probe);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "ops endpoint stopped");
        }
    });
    Ok((bound, task))
}

/// What `/readyz` checks.
struct Readiness {
    nats: bool,
    mongo: bool,
    pg: bool,
    model: bool,
}

impl Readiness {
    /// NATS connected, MongoDB and PostgreSQL answering a ping within 2 s, the model loaded.
    async fn check(svc: &Probe) -> Self {
        let timeout = Duration::from_secs(2);
        let (mongo, pg) = tokio::join!(
            tokio::time::timeout(timeout, svc.mongo.ping()),
            tokio::time::timeout(timeout, svc.pg.ping()),
        );
        Self {
            nats: matches!(
                svc.bus.client.connection_state(),
                async_nats::connection::State::Connected
            ),
            mongo: matches!(mongo, Ok(Ok(()))),
            pg: matches!(pg, Ok(Ok(()))),
            model: svc.embedder.is_some(),
        }
    }

    /// Ready to answer turns. The embedding model is not required: a worker whose model did not load
    /// starts and answers, but weaker. The crisis screen's learned layer then reads the messages' n-grams
    /// only (it no longer refers on its own), the output check has no reply head, and knowledge
    /// retrieval, memory recall and a group's fit are off; `/readyz` names the model down and the
    /// `companion_ready{dependency="model"}` gauge at 0 pages (`CompanionCrisisScreenWeakened`).
    fn ready(&self) -> bool {
        self.nats && self.mongo && self.pg
    }

    fn each(&self) -> [(&'static str, bool); 4] {
        [
            ("nats", self.nats),
            ("mongodb", self.mongo),
            ("postgres", self.pg),
            ("model", self.model),
        ]
    }
}

async fn readyz(State(svc): State<Arc<Probe>>) -> impl IntoResponse {
    let r = Readiness::check(&svc).await;
    let mut body = String::new();
    for (name, up) in r.each() {
        let _ = writeln!(body, "{name} {}", if up { "ok" } else { "down" });
    }
    if let Some(o) = svc.outages.current() {
        let _ = writeln!(
            body,
            "waiting out an outage of {} since {} ({} s of at most {} s): not pulling, holding its messages",
            o.dependency.name(),
            o.since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            o.waited().as_secs(),
            svc.outages.max().as_secs()
        );
    }
    let status = if r.ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body)
}

async fn metrics(State(svc): State<Arc<Probe>>) -> impl IntoResponse {
    // First, so a failed read is already in this scrape's counters.
    scrape_gauges(&svc).await;
    (
        [(
            axum::http::header::CONTENT_TYPE,
            prometheus_text::CONTENT_TYPE,
        )],
        svc.metrics.render(),
    )
}

/// Whether the worker reaches each dependency, what `/readyz` checks.
const READY: Metric = Metric::new(
    "companion_ready",
    "Whether the worker reaches the dependency (1) or not (0)",
);
/// Reads of the shared consumer's state that failed at a scrape.
const CONSUMER_INFO_ERRORS: Metric = Metric::new(
    "companion_consumer_info_errors_total",
    "Scrapes at which the shared consumer's state could not be read",
);
/// The shared consumer's gauges, read from NATS when scraped.
const CONSUMER: [Metric; 3] = [
    Metric::new(
        "companion_consumer_pending",
        "Events in the stream not yet delivered to any worker",
    ),
    Metric::new(
        "companion_consumer_ack_pending",
        "Events delivered and not yet acknowledged",
    ),
    Metric::new(
        "companion_consumer_redelivered",
        "Events delivered more than once and not yet acknowledged",
    ),
];

/// The gauges read when scraped, at most once a second whatever the scrape rate: the readiness of
/// each dependency (`companion_ready{dependency}`, 1 or 0, what `/readyz` checks) and those of the shared
/// durable consumer (`CONSUMER.INFO`, 2 s timeout): events waiting, delivered but not yet acked,
/// redelivered. When the consumer cannot be read its gauges are left out and
/// `companion_consumer_info_errors_total` counts it.
async fn scrape_gauges(svc: &Probe) {
    let mut last = svc.scraped.lock().await;
    if last.is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
        return;
    }
    let m = &svc.metrics;
    let readiness = Readiness::check(svc).await;
    for (name, up) in readiness.each() {
        m.set_level(&READY, &[("dependency", name)], i64::from(up));
    }
    let names = &svc.bus.names;
    let info = tokio::time::timeout(Duration::from_secs(2), async {
        let stream = svc.bus.js.get_stream_no_info(&names.stream_in).await.ok()?;
        stream.consumer_info(&svc.consumer_name).await.ok()
    })
    .await
    .ok()
    .flatten();
    let Some(info) = info else {
        m.inc(&CONSUMER_INFO_ERRORS, &[]);
        CONSUMER.iter().for_each(|g| m.clear_level(g));
        *last = None;
        return;
    };
    let labels = [
        ("stream", names.stream_in.as_str()),
        ("consumer", svc.consumer_name.as_str()),
    ];
    let values = [
        i64::try_from(info.num_pending).unwrap_or(i64::MAX),
        info.num_ack_pending as i64,
        info.num_redelivered as i64,
    ];
    for (gauge, v) in CONSUMER.iter().zip(values) {
        m.set_level(gauge, &labels, v);
    }
    *last = Some(std::time::Instant::now());
}
