//! The figures of a run: the report written as JSON, and the table printed on the terminal.

use std::fmt::Write;

use serde::Serialize;

use super::dist::Dist;
use super::{embed::EmbedFigures, procs::Machine, prompt::PromptFigures, script::Script};

/// One second of the measured phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Second {
    /// Seconds since the measured phase started.
    pub second: usize,
    pub published: usize,
    pub completed: usize,
}

/// How the run was set up.
#[derive(Clone, Debug, Serialize)]
pub struct RunSettings {
    pub workers: usize,
    pub turns: usize,
    pub warmup: usize,
    /// Turns per second asked for (0 = as fast as possible).
    pub rate: f64,
    pub conversations: usize,
    pub users: usize,
    pub history: usize,
    pub script: Script,
    pub llm_latency_ms: u64,
    /// `COMPANION_CONCURRENCY` of each worker.
    pub concurrency: usize,
    pub embed_threads: usize,
    pub embed_max_batch: usize,
    pub embed_window_ms: u64,
    pub knowledge_chunks: usize,
}

/// Counts of the measured phase.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TurnCounts {
    pub published: usize,
    pub completed: usize,
    /// Published and never completed within the timeout.
    pub lost: usize,
    /// Completions beyond the first for the same event, on the wire.
    pub duplicated: usize,
    /// Completion messages received (one per reply; a reply may answer a burst).
    pub replies: usize,
    /// Events answered by the reply to an earlier message of their burst (listed in its `covers`).
    pub covered: usize,
    pub publish_errors: usize,
    /// Replies stored in `dm_messages` for this phase's events (must equal `replies`).
    pub replies_stored: u64,
    /// Completion messages in the OUT stream for the whole run, warm-up included.
    pub out_stream_messages: u64,
    /// Events dead-lettered during the run.
    pub dead_letters: u64,
    /// Turns whose journal shows more than one attempt (redeliveries).
    pub redelivered: u64,
    /// Seconds from the first publish to the last completion.
    pub seconds: f64,
    pub turns_per_second: f64,
    /// Most events published and not yet completed, sampled every 100 ms.
    pub peak_in_flight: usize,
    /// Most turns running inside the workers at once (from their turn timings).
    pub peak_running_in_workers: usize,
}

/// Memory and CPU of the processes involved.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Resources {
    /// Per worker: resident memory once ready (model loaded), before any turn, MB.
    pub worker_rss_idle_mb: Vec<f64>,
    /// Per worker: resident memory after the warm-up turns, idle again, MB.
    pub worker_rss_warm_mb: Vec<f64>,
    /// Per worker: highest resident memory sampled during the measured phase, MB.
    pub worker_rss_peak_mb: Vec<f64>,
    /// Per worker: the kernel's peak resident memory (`VmHWM`) at the end, MB.
    pub worker_vm_hwm_mb: Vec<f64>,
    /// CPU seconds per 1,000 turns of the measured phase: all workers together.
    pub worker_cpu_s_per_1000: f64,
    pub nats_cpu_s_per_1000: f64,
    /// PostgreSQL: the run's backends, the server's own processes, and those that exited in the phase.
    pub postgres_cpu_s_per_1000: f64,
    /// The same, by kind of process.
    pub postgres_cpu: PgCpuSplit,
    /// SecantusDB, the Python MongoDB-wire server.
    pub mongo_cpu_s_per_1000: f64,
    /// This process: publisher, completion counting and the stub model.
    pub bench_cpu_s_per_1000: f64,
    /// Everything else on the machine (other users' builds and tests): the noise.
    pub other_cpu_s_per_1000: f64,
    /// Share of the machine's CPU capacity busy during the measured phase.
    pub machine_busy_share: f64,
    /// CPU-bound share of each group over the phase, as cores used.
    pub cores_used: CoresUsed,
}

/// PostgreSQL's CPU seconds per 1,000 turns by kind of process ([`super::procs::PgCpu`]).
#[derive(Clone, Debug, Default, Serialize)]
pub struct PgCpuSplit {
    /// Backends of the run's database: the statements, their protocol and commits.
    pub backends: f64,
    /// The postmaster and its background processes (WAL writer, checkpointer, autovacuum launcher, …).
    pub background: f64,
    /// Processes that ended within the phase: autovacuum workers, closed connections.
    pub exited: f64,
}

/// Average cores each group used during the measured phase.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CoresUsed {
    pub workers: f64,
    pub nats: f64,
    pub postgres: f64,
    pub mongo: f64,
    pub bench: f64,
    pub other: f64,
}

/// One stage's distribution over the measured turns.
#[derive(Clone, Debug, Serialize)]
pub struct StageDist {
    pub stage: &'static str,
    /// Turns in which the stage ran.
    pub turns: usize,
    pub ms: Dist,
}

/// Everything a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub command: String,
    pub started_at: String,
    pub machine: Machine,
    pub load_average_before: [f64; 3],
    pub load_average_after: [f64; 3],
    pub settings: Option<RunSettings>,
    pub turns: Option<TurnCounts>,
    /// Publish to completion, as TB-Backend would see it.
    pub end_to_end_ms: Option<Dist>,
    /// Worker wall time per turn, message in hand to ack.
    pub turn_wall_ms: Option<Dist>,
    /// Time waiting on the model per turn.
    pub llm_wait_ms: Option<Dist>,
    /// Wall time minus model wait: what the worker itself costs per turn.
    pub overhead_ms: Option<Dist>,
    /// Wall time waiting on MongoDB per turn, for a pooled connection or a command (across stages; the
    /// local server is a Python process).
    pub mongo_wait_ms: Option<Dist>,
    /// MongoDB commands per turn, on average.
    pub mongo_commands_per_turn: f64,
    /// Turns by how their knowledge lookup got its query vector (`embedded`, `cached`, `skipped`,
    /// `none`), as the workers' timings say.
    pub knowledge: std::collections::BTreeMap<String, usize>,
    /// Prompt tokens and the prefix shared across users.
    pub prompt: Option<PromptFigures>,
    /// Prompt tokens of all calls per turn, cached and billed-equivalent.
    pub billing: Option<super::prompt::Billing>,
    /// Overhead minus MongoDB wait: an estimate of the overhead with a MongoDB that answers at once
    /// (parallel branches may then become the longer path, so this is a lower bound).
    pub overhead_outside_mongo_ms: Option<Dist>,
    /// Per stage, own time (a stage nested in another is not counted in the outer one).
    pub stages: Vec<StageDist>,
    /// Events published and completed per second of the measured phase.
    pub timeline: Vec<Second>,
    pub resources: Option<Resources>,
    /// What the measured turns asked of PostgreSQL, per turn.
    pub postgres: Option<super::statements::PgWork>,
    /// What the measured turns asked of NATS, per turn (the workers' messages both ways).
    pub nats: Option<super::nats_work::NatsWork>,
    pub embedding: Option<EmbedFigures>,
    /// Worker log warnings and errors (with a few samples).
    pub worker_warnings: usize,
    pub worker_errors: usize,
    pub worker_log_samples: Vec<String>,
    pub worker_logs: Vec<String>,
}

impl Report {
    /// A report of `command` started now, with the machine and its load; no figures yet.
    pub fn empty(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            started_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            machine: super::procs::Machine::read(),
            load_average_before: super::procs::load_average(),
            load_average_after: [0.0; 3],
            settings: None,
            turns: None,
            end_to_end_ms: None,
            turn_wall_ms: None,
            llm_wait_ms: None,
            overhead_ms: None,
            mongo_wait_ms: None,
            mongo_commands_per_turn: 0.0,
            knowledge: Default::default(),
            prompt: None,
            billing: None,
            overhead_outside_mongo_ms: None,
            stages: Vec::new(),
            timeline: Vec::new(),
            resources: None,
            postgres: None,
            nats: None,
            embedding: None,
            worker_warnings: 0,
            worker_errors: 0,
            worker_log_samples: Vec::new(),
            worker_logs: Vec::new(),
        }
    }
}

/// The report as a terminal table.
pub fn table(r: &Report) -> String {
    let mut o = String::new();
    run_lines(&mut o, r);
    stage_lines(&mut o, r);
    cost_lines(&mut o, r);
    embedding_and_log_lines(&mut o, r);
    o
}

/// The machine, the run's settings and what became of its turns.
fn run_lines(o: &mut String, r: &Report) {
    let m = &r.machine;
    let _ = writeln!(
        o,
        "\n== companion bench ({}) ==\nmachine: {} cores, {}, {} MB RAM; load average before {:.2} {:.2} {:.2}, after {:.2} {:.2} {:.2}",
        r.started_at,
        m.cores,
        m.cpu_model,
        m.mem_total_mb,
        r.load_average_before[0],
        r.load_average_before[1],
        r.load_average_before[2],
        r.load_average_after[0],
        r.load_average_after[1],
        r.load_average_after[2],
    );
    if let Some(s) = &r.settings {
        let _ = writeln!(
            o,
            "run: {} worker(s) × concurrency {}, {} turns (+{} warm-up) at {} turns/s over {} conversations of {} users, {} history messages each\n     script {:?}, LLM latency {} ms, embedder {} thread(s) batch ≤{} window {} ms, {} knowledge chunks",
            s.workers,
            s.concurrency,
            s.turns,
            s.warmup,
            if s.rate > 0.0 {
                format!("{}", s.rate)
            } else {
                "max".into()
            },
            s.conversations,
            s.users,
            s.history,
            s.script,
            s.llm_latency_ms,
            s.embed_threads,
            s.embed_max_batch,
            s.embed_window_ms,
            s.knowledge_chunks,
        );
    }
    if let Some(t) = &r.turns {
        let _ = writeln!(
            o,
            "\nturns: {} published, {} completed ({} replies, {} events covered by a burst's reply), {} lost, {} duplicated, {} publish errors; {} replies stored, {} dead letters, {} redelivered",
            t.published,
            t.completed,
            t.replies,
            t.covered,
            t.lost,
            t.duplicated,
            t.publish_errors,
            t.replies_stored,
            t.dead_letters,
            t.redelivered
        );
        let _ = writeln!(
            o,
            "throughput: {:.1} turns/s sustained ({:.1} s); peak in flight {} (published, not completed), {} running in workers",
            t.turns_per_second, t.seconds, t.peak_in_flight, t.peak_running_in_workers
        );
    }
}

/// Each turn's times, end to end and by stage, and how knowledge was looked up.
fn stage_lines(o: &mut String, r: &Report) {
    let row = |o: &mut String, name: &str, n: Option<usize>, d: &Dist| {
        let _ = writeln!(
            o,
            "  {name:<22} {:>7} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            n.map(|n| n.to_string()).unwrap_or_default(),
            d.p50,
            d.p95,
            d.p99,
            d.max,
            d.mean
        );
    };
    if r.overhead_ms.is_some() {
        let _ = writeln!(
            o,
            "\nper turn (ms)              turns      p50      p95      p99      max     mean"
        );
        for (name, d) in [
            ("end to end", &r.end_to_end_ms),
            ("worker wall", &r.turn_wall_ms),
            ("LLM wait", &r.llm_wait_ms),
            ("OVERHEAD (wall − LLM)", &r.overhead_ms),
            ("  waiting on MongoDB", &r.mongo_wait_ms),
            ("  outside MongoDB (est)", &r.overhead_outside_mongo_ms),
        ] {
            if let Some(d) = d {
                row(o, name, Some(d.n), d);
            }
        }
        let _ = writeln!(
            o,
            "  ({:.1} MongoDB commands per turn; stages below are own time, context runs beside embed+retrieve)",
            r.mongo_commands_per_turn
        );
        for s in &r.stages {
            row(o, &format!("  {}", s.stage), Some(s.turns), &s.ms);
        }
        if !r.knowledge.is_empty() {
            let all: usize = r.knowledge.values().sum();
            let shares: Vec<String> = r
                .knowledge
                .iter()
                .map(|(k, n)| format!("{k} {n} ({:.0}%)", 100.0 * *n as f64 / all.max(1) as f64))
                .collect();
            let _ = writeln!(o, "  knowledge lookups: {}", shares.join(", "));
        }
    }
}

/// The prompts, what they are billed as, memory and CPU.
fn cost_lines(o: &mut String, r: &Report) {
    postgres_lines(o, r);
    if let Some(n) = &r.nats {
        let _ = writeln!(
            o,
            "NATS per turn: {:.1} messages sent by the workers, {:.1} received ({} worker connection(s))",
            n.sent_per_turn, n.received_per_turn, n.connections
        );
    }
    if let Some(p) = &r.prompt {
        let _ = writeln!(
            o,
            "
prompt (first call of a turn, {} sampled; tokens estimated): p50 {:.0} tokens, mean {:.0}; prefix shared with another user's request: mean {:.0} tokens, {:.0}% of the prompt",
            p.requests,
            p.tokens.p50,
            p.tokens.mean,
            p.shared_prefix_tokens.mean,
            p.shared_prefix_share * 100.0
        );
    }
    if let Some(b) = &r.billing {
        let _ = writeln!(
            o,
            "prompt billing (all calls, stub tokens, simulated provider cache): per turn {:.1} calls, {:.0} prompt tokens, {:.0} cached, billed-equivalent {:.0} (cached × {})",
            b.calls_per_turn,
            b.prompt_tokens_per_turn,
            b.cached_tokens_per_turn,
            b.billed_equivalent_per_turn,
            b.cached_price_ratio
        );
    }
    if let Some(res) = &r.resources {
        let mb = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join("/")
        };
        let _ = writeln!(
            o,
            "\nworker RSS (MB, per worker): idle {}, after warm-up {}, peak sampled {}, VmHWM {}",
            mb(&res.worker_rss_idle_mb),
            mb(&res.worker_rss_warm_mb),
            mb(&res.worker_rss_peak_mb),
            mb(&res.worker_vm_hwm_mb)
        );
        let c = &res.cores_used;
        let _ = writeln!(
            o,
            "CPU seconds per 1,000 turns: workers {:.2}, postgres {:.2}, mongo (SecantusDB) {:.2}, nats {:.2}, bench+stub {:.2}, other {:.2}",
            res.worker_cpu_s_per_1000,
            res.postgres_cpu_s_per_1000,
            res.mongo_cpu_s_per_1000,
            res.nats_cpu_s_per_1000,
            res.bench_cpu_s_per_1000,
            res.other_cpu_s_per_1000
        );
        let p = &res.postgres_cpu;
        let _ = writeln!(
            o,
            "PostgreSQL CPU seconds per 1,000 turns: backends of the run {:.2}, background processes {:.2}, exited in the phase (autovacuum workers, closed connections) {:.2}",
            p.backends, p.background, p.exited
        );
        let _ = writeln!(
            o,
            "cores used: workers {:.2}, postgres {:.2}, mongo {:.2}, nats {:.2}, bench+stub {:.2}, other {:.2}; machine {:.0}% busy",
            c.workers,
            c.postgres,
            c.mongo,
            c.nats,
            c.bench,
            c.other,
            res.machine_busy_share * 100.0
        );
    }
}

/// The embedding rounds and the workers' warnings and errors.
fn embedding_and_log_lines(o: &mut String, r: &Report) {
    if let Some(e) = &r.embedding {
        let _ = writeln!(
            o,
            "\nembedding ({}; {} thread(s), batch ≤{}, window {} ms), sentences/s:",
            e.model, e.threads, e.max_batch, e.window_ms
        );
        let _ = writeln!(
            o,
            "  {:<34} {:>5} {:>16} {:>13} {:>8} {:>10} {:>14}",
            "set",
            "texts",
            "tokens mean/max",
            "one at a time",
            "batched",
            "concurrent",
            "batched/CPU-s"
        );
        for s in [&e.chat, &e.full] {
            let _ = writeln!(
                o,
                "  {:<34} {:>5} {:>16} {:>13.0} {:>8.0} {:>10.0} {:>14.0}",
                s.name,
                s.texts,
                format!("{:.1}/{}", s.mean_tokens, s.max_tokens),
                s.one_at_a_time,
                s.batched,
                s.concurrent,
                s.batched_per_cpu_second
            );
        }
    }
    if r.worker_warnings + r.worker_errors > 0 {
        let _ = writeln!(
            o,
            "\nworker logs: {} warnings, {} errors, e.g.:",
            r.worker_warnings, r.worker_errors
        );
        for s in &r.worker_log_samples {
            let _ = writeln!(o, "  {s}");
        }
    }
}

/// PostgreSQL's work per turn and its top statements.
fn postgres_lines(o: &mut String, r: &Report) {
    let Some(w) = &r.postgres else { return };
    let trips = w
        .round_trips_per_turn
        .map_or("not counted (--count-round-trips)".to_owned(), |t| {
            format!("{t:.1}")
        });
    let _ = writeln!(
        o,
        "\nPostgreSQL per turn: {:.1} statements ({:.1} of them BEGIN/COMMIT), round trips {trips}, {:.1} commits, {:.1} rows written, {:.1} rows returned or touched, {:.0} WAL bytes, {:.2} ms executing",
        w.statements_per_turn,
        w.transaction_control_per_turn,
        w.commits_per_turn,
        w.rows_written_per_turn,
        w.rows_per_turn,
        w.wal_bytes_per_turn,
        w.exec_ms_per_turn,
    );
    for t in &w.top {
        let _ = writeln!(
            o,
            "  {:>5.1}% {:>5.2} calls {:>6.3} ms {:>5.1} rows  {}",
            t.share * 100.0,
            t.calls_per_turn,
            t.exec_ms_per_turn,
            t.rows_per_turn,
            t.query
        );
    }
}
