//! The process's metrics: a `prometheus-client` registry that every component records into, rendered in
//! the Prometheus text format (0.0.4) by the operations endpoint (the worker's `ops_http`). A metric is a
//! [`Metric`] declared by the module that owns it, with its help text; its series are created on first
//! use. A leaf: it imports nothing of the crate.

use std::{
    collections::HashMap,
    sync::{Mutex, RwLock, atomic::AtomicU64},
    time::Duration,
};

use prometheus_client::{
    encoding::prometheus_text,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// A metric the process exports: its name as scraped (a counter's ends in `_total`) and what it counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub(crate) help: &'static str,
}

impl Metric {
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        Self { name, help }
    }

    /// The name a counter is registered under: the encoder adds the `_total` back.
    fn counter_name(&self) -> &'static str {
        self.name.strip_suffix("_total").unwrap_or(self.name)
    }
}

/// A series' labels: name and value pairs, in the order given.
pub type Labels<'a> = &'a [(&'static str, &'a str)];

type LabelSet = Vec<(&'static str, String)>;
type Counters = Family<LabelSet, Counter>;
type Amounts = Family<LabelSet, Counter<f64, AtomicU64>>;
type Gauges = Family<LabelSet, Gauge<f64, AtomicU64>>;
type Levels = Family<LabelSet, Gauge>;
type Histograms = Family<LabelSet, Histogram, fn() -> Histogram>;
type Bucketed = Family<LabelSet, Histogram, Buckets>;

/// Makes a histogram series with the upper bounds its metric was declared with.
#[derive(Clone, Copy)]
struct Buckets(&'static [f64]);

impl prometheus_client::metrics::family::MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

/// Answers of the turns, by the time they took (`companion_turn_seconds`).
const TURN_SECONDS: Metric = Metric::new(
    "companion_turn_seconds",
    "Wall time of each settled turn, from the message in hand to the ack",
);
/// Upper bounds (seconds) of the turn-latency histogram.
const BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// The stages of the turns (`companion_turn_stage_seconds{stage}`), fed by the turn timings.
const STAGE_SECONDS: Metric = Metric::new(
    "companion_turn_stage_seconds",
    "Time a turn spent in each stage (its own time, nested stages left out)",
);
/// Upper bounds (seconds) of the stage histograms: stages take milliseconds, the model seconds.
const STAGE_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

fn stage_histogram() -> Histogram {
    Histogram::new(STAGE_BUCKETS.iter().copied())
}

/// Process-wide metrics in one registry.
pub struct Metrics {
    registry: Mutex<Registry>,
    counters: RwLock<HashMap<&'static str, Counters>>,
    /// Counters of fractional amounts (USD).
    amounts: RwLock<HashMap<&'static str, Amounts>>,
    /// Values that go up and down, e.g. the share of the service's budget spent.
    gauges: RwLock<HashMap<&'static str, Gauges>>,
    /// Whole values that go up and down: events waiting, a dependency up (1) or down (0).
    levels: RwLock<HashMap<&'static str, Levels>>,
    /// Labelled histograms declared by their owners with their buckets (the model calls' tokens and
    /// durations).
    histograms: RwLock<HashMap<&'static str, Bucketed>>,
    turn_seconds: Histogram,
    stage_seconds: Histograms,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let turn_seconds = Histogram::new(BUCKETS.iter().copied());
        registry.register(TURN_SECONDS.name, TURN_SECONDS.help, turn_seconds.clone());
        let stage_seconds = Histograms::new_with_constructor(stage_histogram);
        registry.register(
            STAGE_SECONDS.name,
            STAGE_SECONDS.help,
            stage_seconds.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            counters: Default::default(),
            amounts: Default::default(),
            gauges: Default::default(),
            levels: Default::default(),
            histograms: Default::default(),
            turn_seconds,
            stage_seconds,
        }
    }
}

fn owned(labels: Labels<'_>) -> LabelSet {
    labels.iter().map(|(k, v)| (*k, label(v))).collect()
}

impl Metrics {
    /// The family of `metric` in `families`, registered on first use.
    fn family<F: Clone + Default + prometheus_client::registry::Metric>(
        &self,
        families: &RwLock<HashMap<&'static str, F>>,
        metric: &Metric,
        name: &'static str,
    ) -> F {
        self.family_made(families, metric, name, F::default)
    }

    /// [`Metrics::family`], made by `make` on first use.
    fn family_made<F: Clone + prometheus_client::registry::Metric>(
        &self,
        families: &RwLock<HashMap<&'static str, F>>,
        metric: &Metric,
        name: &'static str,
        make: impl FnOnce() -> F,
    ) -> F {
        if let Some(f) = families.read().expect("metrics lock").get(metric.name) {
            return f.clone();
        }
        let mut all = families.write().expect("metrics lock");
        all.entry(metric.name)
            .or_insert_with(|| {
                let f = make();
                let mut registry = self.registry.lock().expect("metrics lock");
                registry.register(name, metric.help, f.clone());
                f
            })
            .clone()
    }

    /// Adds `by` to counter `metric`'s series `labels` (created at 0 when `by` is 0).
    pub fn add(&self, metric: &Metric, labels: Labels<'_>, by: u64) {
        let family = self.family(&self.counters, metric, metric.counter_name());
        family.get_or_create(&owned(labels)).inc_by(by);
    }

    pub fn inc(&self, metric: &Metric, labels: Labels<'_>) {
        self.add(metric, labels, 1);
    }

    pub fn observe_turn(&self, d: Duration) {
        self.turn_seconds.observe(d.as_secs_f64());
    }

    /// Adds `by` to the fractional counter `metric` (e.g. USD spent).
    pub fn add_f64(&self, metric: &Metric, labels: Labels<'_>, by: f64) {
        if by.is_finite() && by >= 0.0 {
            let family = self.family(&self.amounts, metric, metric.counter_name());
            family.get_or_create(&owned(labels)).inc_by(by);
        }
    }

    /// Sets gauge `metric`'s series `labels` to `v`.
    pub fn set_gauge(&self, metric: &Metric, labels: Labels<'_>, v: f64) {
        if v.is_finite() {
            let family = self.family(&self.gauges, metric, metric.name);
            family.get_or_create(&owned(labels)).set(v);
        }
    }

    /// Sets the whole-valued gauge `metric`'s series `labels` to `v`.
    pub fn set_level(&self, metric: &Metric, labels: Labels<'_>, v: i64) {
        let family = self.family(&self.levels, metric, metric.name);
        family.get_or_create(&owned(labels)).set(v);
    }

    /// Removes every series of the whole-valued gauge `metric` (a value no longer known is not
    /// exported).
    pub fn clear_level(&self, metric: &Metric) {
        self.family(&self.levels, metric, metric.name).clear();
    }

    /// One observation of histogram `metric`'s series `labels`; the series' upper bounds are `buckets`
    /// (the first observation's, for the life of the process).
    pub(crate) fn observe(
        &self,
        metric: &Metric,
        buckets: &'static [f64],
        labels: Labels<'_>,
        v: f64,
    ) {
        if !v.is_finite() {
            return;
        }
        let make = || Bucketed::new_with_constructor(Buckets(buckets));
        self.family_made(&self.histograms, metric, metric.name, make)
            .get_or_create(&owned(labels))
            .observe(v);
    }

    /// Exports `histogram`, which its owner observes into (the embedder's batch sizes).
    pub fn register_histogram(&self, metric: &Metric, histogram: Histogram) {
        let mut registry = self.registry.lock().expect("metrics lock");
        registry.register(metric.name, metric.help, histogram);
    }

    /// One observation of the histogram of turn stage `stage` (`companion_turn_stage_seconds`).
    pub(crate) fn observe_stage(&self, stage: &'static str, seconds: f64) {
        self.stage_seconds
            .get_or_create(&vec![("stage", stage.to_owned())])
            .observe(seconds);
    }

    /// The value of one counter series.
    #[cfg(test)]
    fn get(&self, metric: &Metric, labels: Labels<'_>) -> u64 {
        let families = self.counters.read().expect("metrics lock");
        let family = families.get(metric.name);
        family
            .and_then(|f| f.get(&owned(labels)).map(|c| c.get()))
            .unwrap_or(0)
    }

    /// The value of one fractional counter series.
    #[cfg(test)]
    fn get_f64(&self, metric: &Metric, labels: Labels<'_>) -> f64 {
        let families = self.amounts.read().expect("metrics lock");
        let family = families.get(metric.name);
        family
            .and_then(|f| f.get(&owned(labels)).map(|c| c.get()))
            .unwrap_or(0.0)
    }

    /// Every metric in the Prometheus text format (0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().expect("metrics lock");
        prometheus_text::encode(&mut out, &registry).expect("writing to a String cannot fail");
        out
    }
}

/// A label value of bounded length (the encoder escapes what needs escaping).
pub(crate) fn label(v: &str) -> String {
    v.chars().take(100).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVED: Metric = Metric::new("companion_test_served_total", "Things served, by kind");
    const COST: Metric = Metric::new("companion_test_cost_usd_total", "Money spent");
    const RATIO: Metric = Metric::new("companion_test_ratio", "A share");
    const WAITING: Metric = Metric::new("companion_test_waiting", "Things waiting");
    const TOKENS: Metric = Metric::new("companion_test_tokens", "Tokens used");

    #[test]
    fn series_render_under_their_names_with_help_and_type() {
        let m = Metrics::default();
        m.add(&SERVED, &[], 0);
        m.inc(&SERVED, &[("kind", "dm")]);
        m.inc(&SERVED, &[("kind", "dm")]);
        m.add_f64(&COST, &[("model", "a\"b")], 0.25);
        m.set_gauge(&RATIO, &[], 0.5);
        m.set_level(&WAITING, &[("stream", "IN")], 3);
        m.observe_turn(Duration::from_millis(70));
        m.observe_stage("llm", 0.002);
        m.observe(
            &TOKENS,
            &[1.0, 16.0],
            &[("gen_ai_token_type", "input")],
            12.0,
        );
        let text = m.render();
        for line in [
            "# HELP companion_test_served_total Things served, by kind.",
            "# TYPE companion_test_served_total counter",
            "companion_test_served_total 0",
            "companion_test_served_total{kind=\"dm\"} 2",
            "companion_test_cost_usd_total{model=\"a\\\"b\"} 0.25",
            "# TYPE companion_test_ratio gauge",
            "companion_test_ratio 0.5",
            "# TYPE companion_test_waiting gauge",
            "companion_test_waiting{stream=\"IN\"} 3",
            "companion_turn_seconds_bucket{le=\"0.1\"} 1",
            "companion_turn_seconds_count 1",
            "companion_turn_stage_seconds_bucket{stage=\"llm\",le=\"0.0025\"} 1",
            "# TYPE companion_test_tokens histogram",
            "companion_test_tokens_bucket{gen_ai_token_type=\"input\",le=\"1\"} 0",
            "companion_test_tokens_bucket{gen_ai_token_type=\"input\",le=\"16\"} 1",
            "companion_test_tokens_sum{gen_ai_token_type=\"input\"} 12.0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert_eq!(m.get(&SERVED, &[("kind", "dm")]), 2);
        assert_eq!(m.get_f64(&COST, &[("model", "a\"b")]), 0.25);
        m.clear_level(&WAITING);
        assert!(!m.render().contains("companion_test_waiting{"));
    }
}
