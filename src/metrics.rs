//! The process's metrics: counters and histograms that every component records into, rendered as
//! Prometheus text by the operations endpoint (`crate::ops_http`). A leaf: it imports nothing of the crate.

use std::{
    collections::BTreeMap,
    fmt::{self, Write},
    sync::Mutex,
    time::Duration,
};

/// Upper bounds (seconds) of the turn-latency histogram.
const BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Process-wide counters, rendered as Prometheus text.
#[derive(Default)]
pub struct Metrics {
    counters: Mutex<BTreeMap<(String, String), u64>>,
    turn_seconds: Mutex<Buckets>,
    /// Counters of fractional amounts (USD).
    amounts: Mutex<BTreeMap<(String, String), f64>>,
    /// Values that go up and down (`set_gauge`), e.g. the share of the service's budget spent.
    gauges: Mutex<BTreeMap<(String, String), f64>>,
    /// Per-stage turn timings (`companion_turn_stage_seconds{stage=…}`), fed by the turn timings.
    stage_seconds: Mutex<BTreeMap<&'static str, Buckets>>,
}

/// Upper bounds (seconds) of the stage histograms: stages take milliseconds, the model seconds.
const STAGE_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Upper bounds of the embedding batch-size histogram (texts per model run).
pub(crate) const EMBED_BATCH_BUCKETS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128];

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
    pub(crate) fn add(&self, name: &str, labels: &str, by: u64) {
        let mut c = self.counters.lock().expect("metrics lock");
        *c.entry((name.to_owned(), labels.to_owned())).or_default() += by;
    }

    pub(crate) fn inc(&self, name: &str, labels: &str) {
        self.add(name, labels, 1);
    }

    pub(crate) fn observe_turn(&self, d: Duration) {
        self.turn_seconds
            .lock()
            .expect("metrics lock")
            .observe(BUCKETS, d.as_secs_f64());
    }

    /// Adds `by` to the fractional counter `name` (e.g. USD spent).
    pub(crate) fn add_f64(&self, name: &str, labels: &str, by: f64) {
        if by.is_finite() {
            let mut c = self.amounts.lock().expect("metrics lock");
            *c.entry((name.to_owned(), labels.to_owned())).or_default() += by;
        }
    }

    /// Sets gauge `name` to `v`.
    pub(crate) fn set_gauge(&self, name: &str, labels: &str, v: f64) {
        if v.is_finite() {
            let mut g = self.gauges.lock().expect("metrics lock");
            g.insert((name.to_owned(), labels.to_owned()), v);
        }
    }

    /// The value of one fractional counter.
    #[cfg(any(test, feature = "testing"))]
    pub fn get_f64(&self, name: &str, labels: &str) -> f64 {
        self.amounts
            .lock()
            .expect("metrics lock")
            .get(&(name.to_owned(), labels.to_owned()))
            .copied()
            .unwrap_or(0.0)
    }

    /// One observation of the histogram of turn stage `stage` (`companion_turn_stage_seconds`).
    pub(crate) fn observe_stage(&self, stage: &'static str, seconds: f64) {
        self.stage_seconds
            .lock()
            .expect("metrics lock")
            .entry(stage)
            .or_default()
            .observe(STAGE_BUCKETS, seconds);
    }

    /// The value of one counter (for tests and the bench).
    #[cfg(any(test, feature = "testing"))]
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
        write_series(
            &mut out,
            &self.gauges.lock().expect("metrics lock"),
            "gauge",
        );
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
    write_series(out, counters, "counter");
}

/// Series of one metric type, a `# TYPE` line before each name's first series.
fn write_series<V: fmt::Display>(
    out: &mut String,
    series: &BTreeMap<(String, String), V>,
    kind: &str,
) {
    let mut last = "";
    for ((name, labels), v) in series {
        if name != last {
            let _ = writeln!(out, "# TYPE {name} {kind}");
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
pub(crate) fn label(v: &str) -> String {
    v.chars()
        .filter(|c| !matches!(c, '"' | '\\' | '\n'))
        .take(100)
        .collect()
}

/// `companion_embed_batch_size`: texts per model run of the embedder, cumulative over
/// [`EMBED_BATCH_BUCKETS`] (`cumulative[i]` = runs with at most that many texts), with count and sum.
pub(crate) fn render_embed_batches(out: &mut String, cumulative: &[u64], count: u64, sum: u64) {
    let _ = writeln!(out, "# TYPE companion_embed_batch_size histogram");
    write_histogram(
        out,
        "companion_embed_batch_size",
        "",
        EMBED_BATCH_BUCKETS,
        cumulative,
        count,
        sum,
    );
}
