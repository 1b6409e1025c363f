//! Operations endpoint: `/healthz` (process alive), `/readyz` (NATS, MongoDB, PostgreSQL reachable,
//! model loaded when configured) and `/metrics` (Prometheus text), and the counters behind it; the
//! consumer's pending / ack-pending gauges are read from NATS when scraped.

use std::{
    collections::BTreeMap,
    fmt::{self, Write},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};

use crate::services::Services;

/// Upper bounds (seconds) of the turn-latency histogram.
const BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Process-wide counters, rendered as Prometheus text.
#[derive(Default)]
pub struct Metrics {
    counters: Mutex<BTreeMap<(String, String), u64>>,
    turn_seconds: Mutex<Buckets>,
    /// Counters of fractional amounts (USD).
    amounts: Mutex<BTreeMap<(String, String), f64>>,
    /// The consumer's last gauges and when they were read, so scrapes cost at most one request a second.
    consumer: tokio::sync::Mutex<Option<(std::time::Instant, String)>>,
    /// Per-stage turn timings (`companion_turn_stage_seconds{stage=…}`), fed by [`crate::timing::report`].
    stage_seconds: Mutex<BTreeMap<&'static str, Buckets>>,
}

/// Upper bounds (seconds) of the stage histograms: stages take milliseconds, the model seconds.
const STAGE_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Upper bounds of the embedding batch-size histogram (texts per model run).
pub const EMBED_BATCH_BUCKETS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128];

/// A cumulative histogram over any bounds.
#[derive(Clone, Debug, Default)]
struct Buckets {
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Buckets {
    fn observe(&mut self, bounds: &[f64], v: f64) {
        if self.counts.len() != bounds.len() {
            self.counts = vec![0; bounds.len()];
        }
        for (c, b) in self.counts.iter_mut().zip(bounds) {
            if v <= *b {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += v;
    }
}

impl Metrics {
    /// Adds `by` to counter `name` with `labels` (already formatted, e.g. `outcome="answered"`).
    pub fn add(&self, name: &str, labels: &str, by: u64) {
        let mut c = self.counters.lock().expect("metrics lock");
        *c.entry((name.to_owned(), labels.to_owned())).or_default() += by;
    }

    pub fn inc(&self, name: &str, labels: &str) {
        self.add(name, labels, 1);
    }

    pub fn observe_turn(&self, d: Duration) {
        self.turn_seconds
            .lock()
            .expect("metrics lock")
            .observe(BUCKETS, d.as_secs_f64());
    }

    /// Adds `by` to the fractional counter `name` (e.g. USD spent).
    pub fn add_f64(&self, name: &str, labels: &str, by: f64) {
        if by.is_finite() {
            let mut c = self.amounts.lock().expect("metrics lock");
            *c.entry((name.to_owned(), labels.to_owned())).or_default() += by;
        }
    }

    /// The value of one fractional counter.
    pub fn get_f64(&self, name: &str, labels: &str) -> f64 {
        self.amounts
            .lock()
            .expect("metrics lock")
            .get(&(name.to_owned(), labels.to_owned()))
            .copied()
            .unwrap_or(0.0)
    }

    /// Records one turn's stage timings, its model wait (`llm`) and its overhead (`overhead`).
    pub fn observe_turn_timings(&self, t: &crate::timing::TurnTimings) {
        let mut h = self.stage_seconds.lock().expect("metrics lock");
        for stage in crate::timing::Stage::ALL {
            let ms = t.stage_ms(stage);
            // A stage the turn never reached is not a zero-length observation.
            if ms > 0.0 || stage == crate::timing::Stage::Llm {
                h.entry(stage.name())
                    .or_default()
                    .observe(STAGE_BUCKETS, ms / 1e3);
            }
        }
        h.entry("overhead")
            .or_default()
            .observe(STAGE_BUCKETS, t.overhead_ms() / 1e3);
        // Not a stage: the turn's time inside MongoDB commands, across stages.
        h.entry("mongo")
            .or_default()
            .observe(STAGE_BUCKETS, t.mongo_ms / 1e3);
    }

    /// The value of one counter (for tests and the bench).
    pub fn get(&self, name: &str, labels: &str) -> u64 {
        self.counters
            .lock()
            .expect("metrics lock")
            .get(&(name.to_owned(), labels.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        write_counters(&mut out, &self.counters.lock().expect("metrics lock"));
        let h = self.turn_seconds.lock().expect("metrics lock");
        let _ = writeln!(out, "# TYPE companion_turn_seconds histogram");
        write_histogram(
            &mut out,
            "companion_turn_seconds",
            "",
            BUCKETS,
            &h.counts,
            h.count,
            h.sum,
        );
        drop(h);
        write_counters(&mut out, &self.amounts.lock().expect("metrics lock"));
        let stages = self.stage_seconds.lock().expect("metrics lock");
        if !stages.is_empty() {
            let _ = writeln!(out, "# TYPE companion_turn_stage_seconds histogram");
        }
        for (stage, h) in stages.iter() {
            let labels = format!("stage=\"{stage}\"");
            write_histogram(
                &mut out,
                "companion_turn_stage_seconds",
                &labels,
                STAGE_BUCKETS,
                &h.counts,
                h.count,
                h.sum,
            );
        }
        out
    }
}

/// Counters in the Prometheus text format, a `# TYPE` line before each name's first series.
fn write_counters<V: fmt::Display>(out: &mut String, counters: &BTreeMap<(String, String), V>) {
    let mut last = "";
    for ((name, labels), v) in counters {
        if name != last {
            let _ = writeln!(out, "# TYPE {name} counter");
            last = name;
        }
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {v}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {v}");
        }
    }
}

/// One histogram series: cumulative `counts` over `bounds` (none observed yet: zeros), `+Inf`, sum and
/// count.
fn write_histogram<B: fmt::Display>(
    out: &mut String,
    name: &str,
    labels: &str,
    bounds: &[B],
    counts: &[u64],
    count: u64,
    sum: impl fmt::Display,
) {
    let (open, sep, close) = if labels.is_empty() {
        ("", "", "")
    } else {
        ("{", ",", "}")
    };
    for (i, b) in bounds.iter().enumerate() {
        let c = counts.get(i).copied().unwrap_or(0);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {c}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum{open}{labels}{close} {sum}");
    let _ = writeln!(out, "{name}_count{open}{labels}{close} {count}");
}

/// A label value safe inside `"…"`.
pub fn label(v: &str) -> String {
    v.chars()
        .filter(|c| !matches!(c, '"' | '\\' | '\n'))
        .take(100)
        .collect()
}

/// Serves the endpoint on `addr` until the returned task is aborted; returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    svc: Arc<Services>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(svc);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "ops endpoint stopped");
        }
    });
    Ok((bound, task))
}

async fn readyz(State(svc): State<Arc<Services>>) -> impl IntoResponse {
    let timeout = Duration::from_secs(2);
    let nats = matches!(
        svc.bus.client.connection_state(),
        async_nats::connection::State::Connected
    );
    let (mongo, pg) = tokio::join!(
        tokio::time::timeout(timeout, svc.mongo.ping()),
        tokio::time::timeout(timeout, svc.pg.ping()),
    );
    let mongo = matches!(mongo, Ok(Ok(())));
    let pg = matches!(pg, Ok(Ok(())));
    let model = svc.embedder.is_some();
    let body = format!(
        "nats {}\nmongodb {}\npostgres {}\nmodel {}\n",
        ok(nats),
        ok(mongo),
        ok(pg),
        ok(model)
    );
    let status = if nats && mongo && pg {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body)
}

fn ok(b: bool) -> &'static str {
    if b { "ok" } else { "down" }
}

async fn metrics(State(svc): State<Arc<Services>>) -> impl IntoResponse {
    // First, so a failed read is already in this scrape's counters.
    let gauges = consumer_gauges(&svc).await;
    let mut text = svc.metrics.render();
    if let Some(e) = &svc.embedder {
        render_embed_batches(&mut text, &e.batch_sizes());
    }
    text.push_str(&gauges);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        text,
    )
}

/// Gauges of the shared durable consumer (`CONSUMER.INFO`): events waiting, delivered but not yet acked,
/// redelivered. Read at most once a second whatever the scrape rate, with a 2 s timeout; on failure the
/// gauges are left out and `companion_consumer_info_errors_total` counts it.
async fn consumer_gauges(svc: &Services) -> String {
    let mut cached = svc.metrics.consumer.lock().await;
    if let Some((at, text)) = cached.as_ref()
        && at.elapsed() < Duration::from_secs(1)
    {
        return text.clone();
    }
    let names = &svc.bus.names;
    let info = tokio::time::timeout(Duration::from_secs(2), async {
        let stream = svc.bus.js.get_stream_no_info(&names.stream_in).await.ok()?;
        stream.consumer_info(&names.consumer).await.ok()
    })
    .await
    .ok()
    .flatten();
    let Some(info) = info else {
        svc.metrics.inc("companion_consumer_info_errors_total", "");
        *cached = None;
        return String::new();
    };
    let labels = format!(
        "stream=\"{}\",consumer=\"{}\"",
        label(&names.stream_in),
        label(&names.consumer)
    );
    let mut text = String::new();
    for (name, help, v) in [
        (
            "companion_consumer_pending",
            "events in the stream not yet delivered to any worker",
            info.num_pending,
        ),
        (
            "companion_consumer_ack_pending",
            "events delivered and not yet acknowledged",
            info.num_ack_pending as u64,
        ),
        (
            "companion_consumer_redelivered",
            "events delivered more than once and not yet acknowledged",
            info.num_redelivered as u64,
        ),
    ] {
        let _ = writeln!(
            text,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {v}"
        );
    }
    *cached = Some((std::time::Instant::now(), text.clone()));
    text
}

/// `companion_embed_batch_size`: texts per model run of the embedder, cumulative over
/// [`EMBED_BATCH_BUCKETS`] (`counts[i]` = runs with at most that many texts), with count and sum.
pub fn render_embed_batches(out: &mut String, h: &crate::rag::embed::BatchSizes) {
    let _ = writeln!(out, "# TYPE companion_embed_batch_size histogram");
    write_histogram(
        out,
        "companion_embed_batch_size",
        "",
        EMBED_BATCH_BUCKETS,
        &h.cumulative,
        h.count,
        h.sum,
    );
}
