//! `companion bench`: what one worker costs per turn and how far it scales, measured end to end on the
//! real local stack (NATS JetStream, PostgreSQL, the MongoDB-wire server); only the model is the
//! project's stub, in this process, with a set latency and script.
//!
//! A run creates its own databases and subjects ([`env`]), seeds users, conversations with history,
//! tricklists and the knowledge base ([`data`]), starts `--workers` worker processes of this binary
//! ([`workers`]), publishes warm-up then measured events at `--rate` as TB-Backend does and counts every
//! completion ([`load`]), samples memory and CPU from `/proc` while they run ([`phase`], [`procs`]),
//! reads the workers' own `turn timings` log events for the overhead and its stages, prints a table,
//! writes JSON ([`report`]), stops the workers and removes what it created. `--embed` adds embedding
//! throughput ([`embed`]).

pub mod chart;
pub mod compare;
pub mod data;
pub mod dist;
pub mod embed;
pub mod env;
pub mod load;
pub mod nats_work;
pub mod pgwire;
pub mod phase;
pub mod procs;
pub mod prompt;
pub mod report;
pub mod script;
pub mod statements;
pub mod workers;

use std::{path::PathBuf, sync::Arc, time::Duration};

use clap::Args;

use crate::stub::StubLlm;
use companion::Config;
use companion_core::timing::Stage;
use companion_knowledge::rag::EmbedConfig;
use companion_store::{bus::event::InboundEvent, store::StoreError};
use dist::Dist;
use report::{Report, Resources, RunSettings, StageDist, TurnCounts};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("setting up the run: {0}")]
    Setup(String),
    #[error("worker: {0}")]
    Worker(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Bus(#[from] companion_store::bus::BusError),
    #[error("writing {0}: {1}")]
    Write(PathBuf, std::io::Error),
}

/// The local stack's NATS monitoring endpoint, when `NATS_MONITOR_URL` does not say.
const NATS_MONITOR: &str = "http://127.0.0.1:8222";

/// Options of `companion bench` (the worker settings, e.g. `--concurrency`, are the usual flags).
#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// Worker processes to start.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Turns in the measured phase.
    #[arg(long, default_value_t = 1000)]
    pub turns: usize,
    /// Measure for this many seconds instead (turns = rate × duration; needs a rate).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Turns published per second; 0 publishes as fast as the server acks.
    #[arg(long, default_value_t = 50.0)]
    pub rate: f64,
    /// Turns before the measured phase (connections, caches); not counted.
    #[arg(long, default_value_t = 100)]
    pub warmup: usize,
    /// DM conversations the turns go round (a user's next message comes after many others).
    #[arg(long, default_value_t = 200)]
    pub conversations: usize,
    /// Users (each talks to several companions); raised to what the conversations need.
    #[arg(long, default_value_t = 50)]
    pub users: usize,
    /// History messages already in each conversation (the model sees the last `--history-limit`).
    #[arg(long, default_value_t = 20)]
    pub history: usize,
    /// Tricklists per user.
    #[arg(long, default_value_t = 2)]
    pub tricklists: usize,
    /// The stub model's latency per chat call, milliseconds.
    #[arg(long, default_value_t = 0)]
    pub llm_latency_ms: u64,
    /// What the stub model does in every turn.
    #[arg(long, value_enum, default_value = "tool")]
    pub script: script::Script,
    /// Outbound chat requests per second per worker (the production guard; lifted for the bench).
    #[arg(long, default_value_t = 100_000)]
    pub llm_rps: u32,
    /// The workers' per-user flood limit (turns per minute; 0: off). Off by default: the bench's users
    /// send far faster than people do, and a busy line is not the turn being measured.
    /// Sets the workers' `COMPANION_USER_TURNS_PER_MINUTE`.
    #[arg(long, default_value_t = 0)]
    pub flood_limit: u32,
    /// Seconds to wait for the last completions after the last publish.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also measure embedding throughput in this process (before the load, on a quiet stack).
    #[arg(long)]
    pub embed: bool,
    /// Only measure embedding throughput.
    #[arg(long)]
    pub embed_only: bool,
    /// Seconds per embedding measurement.
    #[arg(long, default_value_t = 5.0)]
    pub embed_secs: f64,
    /// Fixture of texts for the embedding measurement.
    #[arg(long, default_value = "tests/fixtures/embeddings-public.jsonl")]
    pub embed_fixture: PathBuf,
    /// Demo seed loaded first (bots, trickipedia, spots).
    #[arg(long, default_value = "deploy/local/seed")]
    pub seed_dir: PathBuf,
    /// Knowledge articles ingested for retrieval.
    #[arg(long, default_value = "deploy/local/knowledge")]
    pub knowledge_dir: PathBuf,
    /// Keep the run's databases, streams and logs (for inspection).
    #[arg(long)]
    pub keep: bool,
    /// Count the workers' round trips to PostgreSQL through a proxy in this process (it adds a hop to
    /// each; compare builds with it on for both).
    #[arg(long)]
    pub count_round_trips: bool,
    /// The `companion` binary the workers run (default: the one beside this binary).
    #[arg(long, env = "COMPANION_BIN")]
    pub worker_bin: Option<PathBuf>,
    /// Compare with this other `companion` binary: the same load with both, in alternating rounds, and
    /// every figure for both with their ratio (A = this build or `--worker-bin`, B = this one).
    #[arg(long)]
    pub compare: Option<PathBuf>,
    /// Rounds per binary of `--compare` (`--turns` are split between them).
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
    /// With `--compare` and `--embed`: the embedding settings B is measured with, `MODEL:THREADS`
    /// (today's were the fp32 graph on two threads).
    #[arg(long, default_value = "model.onnx:2")]
    pub compare_embed: String,
    /// What a cached prompt token costs relative to an uncached one (the provider's cached-read
    /// price ratio), for the billed-equivalent figure.
    #[arg(long, default_value_t = 0.25)]
    pub cached_price_ratio: f64,
    /// Write the sampled first requests of turns (as the stub received them) to this JSON-lines file.
    #[arg(long)]
    pub save_prompts: Option<PathBuf>,
    /// `KEY=VALUE` set in the workers' environment after the run's configuration (repeatable).
    #[arg(long = "worker-env", value_parser = key_value)]
    pub worker_env: Vec<(String, String)>,
    /// `KEY=VALUE` set in B's workers only, with `--compare` (repeatable): e.g. an older build's
    /// defaults where this build's configuration would override them.
    #[arg(long = "compare-env", value_parser = key_value)]
    pub compare_env: Vec<(String, String)>,
    /// A shell command run before each round of `--compare` (its failure ends the run), e.g.
    /// `'deploy/local/stack.sh down mongo && deploy/local/stack.sh up'`: SecantusDB slows down within a
    /// process's life (its CPU per turn doubled from the eighth of twelve rounds in two runs of 30
    /// November, each after a restart), so without a restart the later rounds' side pays for it.
    #[arg(long)]
    pub before_round: Option<String>,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s}: KEY=VALUE"))
}

/// The command line for the report, with the values of flags that may hold secrets left out.
fn command_line(args: impl Iterator<Item = String>) -> String {
    const SECRET: [&str; 4] = [
        "--postgres-url",
        "--atlas-uri",
        "--nats-password",
        "--openrouter-api-key",
    ];
    let mut out = Vec::new();
    let mut hide_next = false;
    for arg in args {
        if std::mem::take(&mut hide_next) {
            out.push("***".to_owned());
        } else if let Some((flag, _)) = arg.split_once('=').filter(|(f, _)| SECRET.contains(f)) {
            out.push(format!("{flag}=***"));
        } else {
            hide_next = SECRET.contains(&arg.as_str());
            out.push(arg);
        }
    }
    out.join(" ")
}

/// `companion bench`: one run, or a comparison with `--compare`.
pub async fn main(base: Config, args: BenchArgs) -> Result<(), BenchError> {
    match args.compare.clone() {
        Some(other) => compare::alternate(base, args, other).await.map(|_| ()),
        None => one_run(base, args).await.map(|_| ()),
    }
}

/// Runs the benchmark and returns its report (already printed, and written when `--json` is given).
pub async fn one_run(base: Config, args: BenchArgs) -> Result<Report, BenchError> {
    let mut report = Report::empty(command_line(std::env::args()));
    eprintln!(
        "bench: {} cores, {}; load average {:?}",
        report.machine.cores, report.machine.cpu_model, report.load_average_before
    );
    if args.embed || args.embed_only {
        let cfg = EmbedConfig::from_settings(&base.embed);
        eprintln!(
            "bench: embedding throughput ({} s per measurement)…",
            args.embed_secs
        );
        report.embedding = Some(embed::measure(&cfg, &args.embed_fixture, args.embed_secs).await?);
    }
    if !args.embed_only {
        load_run(&base, &args, &mut report).await?;
    }
    report.load_average_after = procs::load_average();
    println!("{}", report::table(&report));
    if let Some(path) = &args.json {
        let json = serde_json::to_vec_pretty(&report).expect("report serialises");
        std::fs::write(path, json).map_err(|e| BenchError::Write(path.clone(), e))?;
        // A picture of the run beside its figures.
        let svg = path.with_extension("svg");
        std::fs::write(&svg, chart::svg(&report)).map_err(|e| BenchError::Write(svg.clone(), e))?;
        eprintln!("bench: wrote {} and {}", path.display(), svg.display());
    }
    Ok(report)
}

/// The load part of a run, with its environment removed whatever happens.
async fn load_run(base: &Config, args: &BenchArgs, report: &mut Report) -> Result<(), BenchError> {
    let turns = match args.duration {
        Some(d) if args.rate > 0.0 => (d * args.rate).round() as usize,
        Some(_) => {
            return Err(BenchError::Setup(
                "--duration needs a --rate above 0".into(),
            ));
        }
        None => args.turns,
    };
    if turns == 0 || args.workers == 0 || args.conversations == 0 {
        return Err(BenchError::Setup(
            "--turns, --workers and --conversations must be above 0".into(),
        ));
    }
    eprintln!("bench: creating an isolated run (databases, streams)…");
    let worker = workers::worker_binary(args.worker_bin.as_deref()).ok();
    let env = env::RunEnv::create(base, worker.as_deref()).await?;
    let log_dir = std::env::temp_dir().join(format!("companion-bench-{}", env.tag));
    std::fs::create_dir_all(&log_dir)
        .map_err(|e| BenchError::Setup(format!("{}: {e}", log_dir.display())))?;
    let mut procs: Vec<workers::WorkerProc> = Vec::new();
    let result = measure(&env, args, turns, &log_dir, &mut procs, report).await;
    workers::stop(&mut procs, Duration::from_secs(30)).await;
    if args.keep {
        eprintln!(
            "bench: kept databases bench_{tag} (PostgreSQL, MongoDB), streams BENCH{tag}_*, logs in {}",
            log_dir.display(),
            tag = env.tag
        );
    } else {
        env.destroy().await;
        let _ = std::fs::remove_dir_all(&log_dir);
    }
    result
}

/// Seeds, starts the stub model and the workers, runs the warm-up and the measured phase, stops the
/// workers and fills in `report`.
async fn measure(
    env: &env::RunEnv,
    args: &BenchArgs,
    turns: usize,
    log_dir: &std::path::Path,
    procs: &mut Vec<workers::WorkerProc>,
    report: &mut Report,
) -> Result<(), BenchError> {
    let (data, warmup_events, events) = seed(env, args, turns).await?;
    let measured_ids: Vec<String> = events.iter().map(|e| e.message_id.clone()).collect();
    let sampler = prompt::Sampler::default();
    let stub = start_stub(args, &sampler).await?;
    let mut config = env.config.clone();
    config.llm.base_url = stub.base_url.clone();
    config.turn.user_turns_per_minute = args.flood_limit;
    let proxy = match args.count_round_trips {
        true => Some(round_trip_proxy(&config.pg.url).await?),
        false => None,
    };
    if let Some(p) = &proxy {
        config.pg.url = p.url(&config.pg.url);
    }
    report.settings = Some(run_settings(args, turns, &data, &config));
    let rss_idle = start_workers(&config, args, log_dir, procs, report).await?;

    let phases = phase::Phases {
        env,
        tracker: load::Tracker::default(),
        rate: args.rate,
        timeout: Duration::from_secs(args.timeout),
    };
    let collector = load::collect_completions(&env.bus, phases.tracker.clone()).await?;
    phases.warm_up(warmup_events).await;
    let rss_warm = phase::rss_mb(procs);
    let counter = statements_counter(env).await;
    if let Some(p) = &proxy {
        p.reset();
    }
    let nats_counter = nats_counter(env).await;
    let measured = phases.measured(events, procs, &sampler, &stub).await;
    if let Some(c) = &nats_counter {
        match c.finish(measured.progress.completed).await {
            Ok(work) => report.nats = Some(work),
            Err(e) => eprintln!("bench: NATS messages are not counted: {e}"),
        }
    }
    collector.abort();
    if let Some(c) = &counter {
        let trips = proxy.as_ref().map(|p| p.round_trips());
        match c.finish(measured.progress.completed, trips).await {
            Ok(work) => report.postgres = Some(work),
            Err(e) => eprintln!("bench: PostgreSQL's work is not counted: {e}"),
        }
    }

    eprintln!("bench: stopping the workers…");
    workers::stop(procs, Duration::from_secs(30)).await;

    let held = Held::read(env, &measured_ids).await?;
    let records = read_timings(procs, measured_ids, report);
    let recs: Vec<&workers::TimingRecord> = records.iter().collect();
    turn_figures(&recs, &stub, &sampler, env, args, report)?;
    report.end_to_end_ms = Some(Dist::of(&phases.tracker.latencies_ms()));
    report.timeline = phases.tracker.timeline(measured.started);
    report.turns = Some(turn_counts(&measured, &held, &recs));
    report.resources = Some(resources(measured, rss_idle, rss_warm));
    drop(stub);
    Ok(())
}

/// Starts counting PostgreSQL's work on the run's database (none, said why, when it cannot).
async fn statements_counter(env: &env::RunEnv) -> Option<statements::Counter> {
    match statements::Counter::start(env.admin_url(), &env.database()).await {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("bench: PostgreSQL's work is not counted: {e}");
            None
        }
    }
}

/// Starts counting the NATS messages of the run's workers (none, said why, when it cannot).
async fn nats_counter(env: &env::RunEnv) -> Option<nats_work::Counter> {
    let monitor = std::env::var("NATS_MONITOR_URL").unwrap_or_else(|_| NATS_MONITOR.into());
    match nats_work::Counter::start(&monitor, &env.config.nats.subject_prefix).await {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("bench: NATS messages are not counted: {e}");
            None
        }
    }
}

/// Starts the round-trip counting proxy in front of the server of `url`.
async fn round_trip_proxy(url: &str) -> Result<pgwire::PgWireCounter, BenchError> {
    let options: sqlx::postgres::PgConnectOptions = url
        .parse()
        .map_err(|e| BenchError::Setup(format!("the PostgreSQL URL: {e}")))?;
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    pgwire::PgWireCounter::start(upstream)
        .await
        .map_err(|e| BenchError::Setup(format!("the round-trip proxy: {e}")))
}

/// Seeds the run's data, with the knowledge base ingested by the run's worker binary (its own encoder:
/// two builds compared each retrieve what they embedded), and stores the warm-up and the measured
/// messages; returns the data and their events.
async fn seed(
    env: &env::RunEnv,
    args: &BenchArgs,
    turns: usize,
) -> Result<(data::Dataset, Vec<InboundEvent>, Vec<InboundEvent>), BenchError> {
    eprintln!(
        "bench: seeding {} conversations, {} history messages each…",
        args.conversations, args.history
    );
    let mut data = data::seed_all(
        env,
        &data::DataShape {
            users: args.users,
            conversations: args.conversations,
            history: args.history,
            tricklists_per_user: args.tricklists,
        },
        &args.seed_dir,
    )
    .await?;
    match workers::ingest(&env.config, &worker_settings(args), &args.knowledge_dir).await {
        Ok(()) => {
            let chunks: i64 = sqlx::query_scalar("SELECT count(*) FROM kb_chunks")
                .fetch_one(&env.pg.pool)
                .await
                .map_err(|e| BenchError::Setup(format!("counting the knowledge chunks: {e}")))?;
            data.knowledge_chunks = chunks as usize;
        }
        Err(e) => eprintln!("bench: no knowledge ({e}); turns run without it"),
    }
    let warmup_events = data::prepare_events(env, &data, args.warmup, 0).await?;
    let events = data::prepare_events(env, &data, turns, args.warmup).await?;
    Ok((data, warmup_events, events))
}

/// How the run's workers (and its knowledge ingest) are started.
fn worker_settings(args: &BenchArgs) -> workers::WorkerSettings {
    workers::WorkerSettings {
        llm_requests_per_second: args.llm_rps,
        rust_log: workers::WORKER_RUST_LOG.into(),
        binary: args.worker_bin.clone(),
        env: args.worker_env.clone(),
    }
}

/// Starts the stub model: it offers every request to `sampler` and answers as `--script` says.
async fn start_stub(args: &BenchArgs, sampler: &prompt::Sampler) -> Result<StubLlm, BenchError> {
    let responder = {
        let (sampler, script) = (
            sampler.clone(),
            script::responder(args.script, Duration::from_millis(args.llm_latency_ms)),
        );
        Arc::new(move |body: &serde_json::Value| {
            sampler.offer(body);
            script(body)
        }) as crate::stub::Responder
    };
    let stub = StubLlm::start_on("127.0.0.1:0".parse().expect("loopback"), responder, false)
        .await
        .map_err(|e| BenchError::Setup(format!("stub model: {e}")))?;
    stub.simulate_prompt_cache();
    Ok(stub)
}

/// How the run is set up, for the report.
fn run_settings(
    args: &BenchArgs,
    turns: usize,
    data: &data::Dataset,
    config: &Config,
) -> RunSettings {
    RunSettings {
        workers: args.workers,
        turns,
        warmup: args.warmup,
        rate: args.rate,
        conversations: data.conversations.len(),
        users: data.users,
        history: args.history,
        script: args.script,
        llm_latency_ms: args.llm_latency_ms,
        concurrency: config.worker.concurrency,
        embed_threads: config.embed.threads,
        embed_max_batch: config.embed.max_batch,
        embed_window_ms: config.embed.window_ms,
        knowledge_chunks: data.knowledge_chunks,
    }
}

/// Starts the workers into `procs` and waits until they are ready and a second more; returns their
/// resident memory then, MB.
async fn start_workers(
    config: &Config,
    args: &BenchArgs,
    log_dir: &std::path::Path,
    procs: &mut Vec<workers::WorkerProc>,
    report: &mut Report,
) -> Result<Vec<f64>, BenchError> {
    let settings = worker_settings(args);
    eprintln!(
        "bench: starting {} worker(s), logs in {}…",
        args.workers,
        log_dir.display()
    );
    for i in 0..args.workers {
        procs.push(workers::spawn(config, &settings, log_dir, i)?);
    }
    report.worker_logs = procs.iter().map(|w| w.log.display().to_string()).collect();
    workers::wait_ready(procs, Duration::from_secs(120)).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(phase::rss_mb(procs))
}

/// What the servers hold after the measured phase.
struct Held {
    /// Replies to the measured messages stored in MongoDB.
    replies_stored: u64,
    /// Journal rows delivered more often than their turn needed.
    redelivered: i64,
    /// Messages in the outbound stream.
    out_stream_messages: u64,
    /// Messages in the dead-letter stream.
    dead_letters: u64,
}

impl Held {
    async fn read(env: &env::RunEnv, measured_ids: &[String]) -> Result<Self, BenchError> {
        let ids: Vec<bson::oid::ObjectId> = measured_ids
            .iter()
            .filter_map(|i| bson::oid::ObjectId::parse_str(i).ok())
            .collect();
        let replies_stored = env
            .mongo
            .collection(companion_store::store::DM_MESSAGES)
            .count_documents(bson::doc! { "inReplyTo": { "$in": ids } })
            .await
            .map_err(StoreError::from)?;
        // A covered message's journal row is written by the turn that covers it, so its own delivery is
        // its second "attempt".
        let redelivered: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobs WHERE attempts > CASE WHEN state = 'covered' THEN 2 ELSE 1 END",
        )
        .fetch_one(&env.pg.pool)
        .await
        .map_err(StoreError::from)?;
        let stream_messages = |name: String| {
            let js = env.bus.js.clone();
            async move {
                match js.get_stream(&name).await {
                    Ok(mut s) => s.info().await.map(|i| i.state.messages).unwrap_or(0),
                    Err(_) => 0,
                }
            }
        };
        Ok(Self {
            replies_stored,
            redelivered,
            out_stream_messages: stream_messages(env.bus.names.stream_out.clone()).await,
            dead_letters: stream_messages(env.bus.names.stream_dlq.clone()).await,
        })
    }
}

/// Reads the workers' logs: their warnings, errors and first samples into `report`; returns their own
/// timings of the measured turns.
fn read_timings(
    procs: &[workers::WorkerProc],
    measured_ids: Vec<String>,
    report: &mut Report,
) -> Vec<workers::TimingRecord> {
    let measured: std::collections::HashSet<String> = measured_ids.into_iter().collect();
    let mut records = Vec::new();
    for w in procs {
        let s = workers::read_log(&w.log);
        report.worker_warnings += s.warnings;
        report.worker_errors += s.errors;
        for x in s.samples {
            if report.worker_log_samples.len() < 8 {
                report.worker_log_samples.push(x);
            }
        }
        // Turns that ran (answered, or limited): a message covered by a burst's reply is acknowledged
        // by its own delivery too, but that is no turn of its own.
        records.extend(
            s.timings
                .into_iter()
                .filter(|t| measured.contains(&t.event_id) && t.outcome != "already_done"),
        );
    }
    records
}

/// The figures of a turn from the workers' timings, the stub model's totals and the sampled prompts
/// (saved when `--save-prompts` says so).
fn turn_figures(
    recs: &[&workers::TimingRecord],
    stub: &StubLlm,
    sampler: &prompt::Sampler,
    env: &env::RunEnv,
    args: &BenchArgs,
    report: &mut Report,
) -> Result<(), BenchError> {
    let col = |f: &dyn Fn(&workers::TimingRecord) -> f64| -> Vec<f64> {
        recs.iter().map(|r| f(r)).collect()
    };
    report.turn_wall_ms = Some(Dist::of(&col(&|r| r.total_ms)));
    report.overhead_ms = Some(Dist::of(&col(&|r| r.overhead_ms)));
    report.mongo_wait_ms = Some(Dist::of(&col(&|r| r.mongo_ms)));
    report.mongo_commands_per_turn = Dist::of(&col(&|r| f64::from(r.mongo_commands))).mean;
    for r in recs {
        if !r.knowledge.is_empty() {
            *report.knowledge.entry(r.knowledge.clone()).or_default() += 1;
        }
    }
    report.billing = prompt::Billing::of(stub.totals(), recs.len(), args.cached_price_ratio);
    let bodies = sampler.take();
    if let Some(path) = &args.save_prompts {
        prompt::save(&bodies, path).map_err(|e| BenchError::Write(path.clone(), e))?;
    }
    report.prompt = prompt::analyse(&bodies, &env.config.embed.model_dir.join("tokenizer.json"));
    report.overhead_outside_mongo_ms =
        Some(Dist::of(&col(&|r| (r.overhead_ms - r.mongo_ms).max(0.0))));
    let llm_idx = Stage::ALL
        .iter()
        .position(|s| *s == Stage::Llm)
        .expect("llm stage");
    report.llm_wait_ms = Some(Dist::of(&col(&|r| r.stages_ms[llm_idx])));
    report.stages = stage_dists(recs);
    Ok(())
}

/// Each stage but the model's, over the turns that went through it.
fn stage_dists(recs: &[&workers::TimingRecord]) -> Vec<StageDist> {
    Stage::ALL
        .iter()
        .enumerate()
        .filter(|(_, s)| **s != Stage::Llm)
        .map(|(i, s)| {
            let v: Vec<f64> = recs
                .iter()
                .map(|r| r.stages_ms[i])
                .filter(|x| *x > 0.0)
                .collect();
            StageDist {
                stage: s.name(),
                turns: v.len(),
                ms: Dist::of(&v),
            }
        })
        .filter(|s| s.turns > 0)
        .collect()
}

/// What became of the measured turns, by the bench's count, the servers' and the workers'.
fn turn_counts(m: &phase::Measured, held: &Held, recs: &[&workers::TimingRecord]) -> TurnCounts {
    let progress = &m.progress;
    TurnCounts {
        published: progress.published,
        completed: progress.completed,
        lost: progress.published.saturating_sub(progress.completed),
        replies: progress.replies,
        covered: progress.covered,
        duplicated: progress.duplicates,
        publish_errors: progress.publish_errors,
        replies_stored: held.replies_stored,
        out_stream_messages: held.out_stream_messages,
        dead_letters: held.dead_letters,
        redelivered: held.redelivered.max(0) as u64,
        seconds: m.seconds,
        turns_per_second: progress.completed as f64 / m.seconds,
        peak_in_flight: m.peak_in_flight,
        peak_running_in_workers: workers::peak_concurrency(recs),
    }
}

/// The workers' memory, and the CPU time of each group of processes per 1,000 turns and as cores.
fn resources(m: phase::Measured, rss_idle: Vec<f64>, rss_warm: Vec<f64>) -> Resources {
    let (before, after) = (&m.before, &m.after);
    let tck = procs::clock_ticks_per_second();
    let per_1000 = |ticks: u64| ticks as f64 / tck / m.progress.completed.max(1) as f64 * 1000.0;
    let cores = |ticks: u64| ticks as f64 / tck / m.seconds;
    let workers_t = after.workers.saturating_sub(before.workers);
    let [n_t, mo_t] = [0, 1].map(|i| after.servers[i].saturating_sub(before.servers[i]));
    // Without the same postmaster in both readings PostgreSQL has no figure (0, its CPU in "other").
    let pg = after.postgres.since(&before.postgres).unwrap_or_else(|| {
        eprintln!(
            "bench: PostgreSQL's postmaster not found in both readings; its CPU shows as other"
        );
        procs::PgCpu::default()
    });
    let p_t = pg.total();
    let bench_t = after.bench.saturating_sub(before.bench);
    let busy_t = after.machine.0.saturating_sub(before.machine.0);
    let other_t = busy_t.saturating_sub(workers_t + n_t + p_t + mo_t + bench_t);
    let total_t = after.machine.1.saturating_sub(before.machine.1).max(1);
    Resources {
        worker_rss_idle_mb: rss_idle,
        worker_rss_warm_mb: rss_warm,
        worker_rss_peak_mb: m.peak_rss_mb,
        worker_vm_hwm_mb: m.hwm_mb,
        worker_cpu_s_per_1000: per_1000(workers_t),
        nats_cpu_s_per_1000: per_1000(n_t),
        postgres_cpu_s_per_1000: per_1000(p_t),
        postgres_cpu: report::PgCpuSplit {
            backends: per_1000(pg.backends),
            background: per_1000(pg.background),
            exited: per_1000(pg.exited),
        },
        mongo_cpu_s_per_1000: per_1000(mo_t),
        bench_cpu_s_per_1000: per_1000(bench_t),
        other_cpu_s_per_1000: per_1000(other_t),
        machine_busy_share: busy_t as f64 / total_t as f64,
        cores_used: report::CoresUsed {
            workers: cores(workers_t),
            nats: cores(n_t),
            postgres: cores(p_t),
            mongo: cores(mo_t),
            bench: cores(bench_t),
            other: cores(other_t),
        },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_reported_command_line_leaves_secrets_out() {
        let args = [
            "companion",
            "bench",
            "--postgres-url",
            "postgres://u:pw@h/db",
            "--nats-password=pw",
            "--turns",
            "10",
        ]
        .map(String::from);
        assert_eq!(
            super::command_line(args.into_iter()),
            "companion bench --postgres-url *** --nats-password=*** --turns 10"
        );
    }
}
