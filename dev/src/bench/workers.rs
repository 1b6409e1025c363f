//! The worker processes of a run: `companion worker` started from this very binary with the run's
//! configuration in its environment and JSON logs captured to a file per process, then stopped with
//! SIGTERM. Their `turn timings` log events are read back afterwards.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::BenchError;
use companion::Config;
use companion_core::timing::Stage;

/// The log filter workers run with: the production default (turn timings are `info`).
pub const WORKER_RUST_LOG: &str =
    "info,async_nats=warn,mongodb=warn,sqlx=warn,hyper=warn,reqwest=warn";

/// One running worker process.
pub struct WorkerProc {
    pub child: Child,
    pub pid: u32,
    /// Where its stdout and stderr (JSON lines) go.
    pub log: PathBuf,
    /// Its `/healthz`, `/readyz`, `/metrics` address.
    pub http_addr: String,
}

/// How worker processes are configured beyond the run's [`Config`].
pub struct WorkerSettings {
    /// Outbound chat requests per second per process (the paid API's guard, lifted for the bench).
    pub llm_requests_per_second: u32,
    pub rust_log: String,
    /// The worker binary (`--worker-bin`/`COMPANION_BIN`); none: the one beside this binary.
    pub binary: Option<std::path::PathBuf>,
    /// Environment set after the run's configuration (`--worker-env KEY=VALUE`).
    pub env: Vec<(String, String)>,
}

/// The `companion` binary the workers run: the one given, else the one built beside this binary
/// (`cargo build --release --workspace` builds both).
pub fn worker_binary(given: Option<&Path>) -> Result<std::path::PathBuf, BenchError> {
    if let Some(path) = given {
        return Ok(path.to_owned());
    }
    let me = std::env::current_exe()
        .map_err(|e| BenchError::Setup(format!("cannot find this binary: {e}")))?;
    let exe = me.with_file_name("companion");
    if exe.is_file() {
        Ok(exe)
    } else {
        Err(BenchError::Setup(format!(
            "{} is missing: build it with `cargo build --release --workspace` (or give --worker-bin)",
            exe.display()
        )))
    }
}

/// Starts worker `index` of a run.
pub fn spawn(
    config: &Config,
    settings: &WorkerSettings,
    log_dir: &Path,
    index: usize,
) -> Result<WorkerProc, BenchError> {
    let exe = worker_binary(settings.binary.as_deref())?;
    let log = log_dir.join(format!("worker-{index}.log"));
    let out = std::fs::File::create(&log)
        .map_err(|e| BenchError::Setup(format!("{}: {e}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(|e| BenchError::Setup(format!("{}: {e}", log.display())))?;
    let http_addr = free_local_addr()?;
    // Relative paths are made absolute so they mean the same to the worker processes.
    let mut config = config.clone();
    for path in [
        &mut config.characters.dir,
        &mut config.embed.model_dir,
        &mut config.embed.ort_dylib_path,
    ] {
        if let Ok(abs) = std::path::absolute(&*path) {
            *path = abs;
        }
    }
    config.llm.api_key = Default::default();
    config.llm.requests_per_second = settings.llm_requests_per_second;
    config.worker.http_addr = http_addr.clone();
    config.log.format = companion_core::config::LogFormat::Json;
    let mut cmd = Command::new(exe);
    cmd.arg("worker")
        .envs(crate::child_env::of(&config))
        .env("RUST_LOG", &settings.rust_log)
        .envs(settings.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    let child = cmd
        .spawn()
        .map_err(|e| BenchError::Setup(format!("starting a worker: {e}")))?;
    Ok(WorkerProc {
        pid: child.id(),
        child,
        log,
        http_addr,
    })
}

/// Ingests the knowledge in `dir` with the worker binary itself (`companion ingest`), so that each build
/// retrieves vectors its own encoder computed (with `settings.env`, e.g. another `COMPANION_ENCODER`).
pub async fn ingest(
    config: &Config,
    settings: &WorkerSettings,
    dir: &Path,
) -> Result<(), BenchError> {
    let exe = worker_binary(settings.binary.as_deref())?;
    let mut config = config.clone();
    for path in [
        &mut config.embed.model_dir,
        &mut config.embed.ort_dylib_path,
    ] {
        if let Ok(abs) = std::path::absolute(&*path) {
            *path = abs;
        }
    }
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
    let args = ["ingest".as_ref(), dir.as_os_str()];
    run_once(&exe, &args, &config, &settings.env).await
}

/// Runs the worker binary `exe` once with `args` (a command other than `worker`) and the run's
/// configuration as its environment, `env` on top; an error with its stderr when it fails.
pub async fn run_once(
    exe: &Path,
    args: &[&std::ffi::OsStr],
    config: &Config,
    env: &[(String, String)],
) -> Result<(), BenchError> {
    let what = args
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let out = tokio::process::Command::new(exe)
        .args(args)
        .envs(crate::child_env::of(config))
        .env("RUST_LOG", "warn")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| BenchError::Setup(format!("{} {what}: {e}", exe.display())))?;
    if !out.status.success() {
        return Err(BenchError::Setup(format!(
            "{} {what} failed ({}): {}",
            exe.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

/// A loopback address with a port free right now.
fn free_local_addr() -> Result<String, BenchError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| BenchError::Setup(format!("no free port: {e}")))?;
    let addr = l
        .local_addr()
        .map_err(|e| BenchError::Setup(e.to_string()))?;
    Ok(addr.to_string())
}

/// Waits until every worker logged "worker ready"; fails when one exits or `within` passes.
pub async fn wait_ready(workers: &mut [WorkerProc], within: Duration) -> Result<(), BenchError> {
    let deadline = Instant::now() + within;
    loop {
        let mut ready = 0;
        for w in workers.iter_mut() {
            if let Ok(Some(status)) = w.child.try_wait() {
                return Err(BenchError::Worker(format!(
                    "worker {} exited during start-up ({status}); last lines of {}:\n{}",
                    w.pid,
                    w.log.display(),
                    tail(&w.log, 15)
                )));
            }
            if std::fs::read_to_string(&w.log).is_ok_and(|s| s.contains("\"worker ready\"")) {
                ready += 1;
            }
        }
        if ready == workers.len() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BenchError::Worker(format!(
                "{ready} of {} workers ready after {within:?}",
                workers.len()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SIGTERM to every worker still running, then waits for them (SIGKILL after `grace`). Safe to call
/// again: a worker already reaped is not signalled (its pid may belong to another process by then).
pub async fn stop(workers: &mut [WorkerProc], grace: Duration) {
    for w in workers.iter_mut() {
        if matches!(w.child.try_wait(), Ok(None)) {
            sigterm(w.pid);
        }
    }
    let deadline = Instant::now() + grace;
    for w in workers.iter_mut() {
        loop {
            match w.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() > deadline => {
                    let _ = w.child.kill();
                    let _ = w.child.wait();
                    break;
                }
                Ok(None) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

fn sigterm(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// One `turn timings` event of a worker log.
#[derive(Clone, Debug)]
pub struct TimingRecord {
    pub event_id: String,
    /// `answered`, `limited` or `already_done` (e.g. covered by a burst's reply).
    pub outcome: String,
    /// When the event was logged (the end of the turn), Unix microseconds.
    pub end_us: i64,
    pub total_ms: f64,
    pub overhead_ms: f64,
    pub llm_calls: u32,
    /// Wall time waiting on MongoDB (connection checkouts and commands, their union).
    pub mongo_ms: f64,
    pub mongo_commands: u32,
    /// How the knowledge lookup got its query vector (`embedded`, `cached`, `skipped`, `none`); empty
    /// for a worker that does not say.
    pub knowledge: String,
    /// Milliseconds per stage, in [`Stage::ALL`] order.
    pub stages_ms: Vec<f64>,
}

/// What a worker log holds besides the timings.
#[derive(Clone, Debug, Default)]
pub struct LogSummary {
    pub timings: Vec<TimingRecord>,
    pub warnings: usize,
    pub errors: usize,
    /// Up to five distinct warning or error messages, for the report.
    pub samples: Vec<String>,
}

/// Reads a worker's JSON log.
pub fn read_log(path: &Path) -> LogSummary {
    let mut out = LogSummary::default();
    let Ok(file) = std::fs::File::open(path) else {
        return out;
    };
    for line in BufReader::new(file).lines().map_while(Result::ok) {
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let level = v["level"].as_str().unwrap_or("");
        let message = v["fields"]["message"].as_str().unwrap_or("");
        if level == "WARN" || level == "ERROR" {
            if level == "WARN" {
                out.warnings += 1;
            } else {
                out.errors += 1;
            }
            let text = format!("{level} {message} {}", v["fields"]["error"]);
            if out.samples.len() < 5 && !out.samples.contains(&text) {
                out.samples.push(text);
            }
        }
        if message != "turn timings" {
            continue;
        }
        let f = &v["fields"];
        let num = |k: &str| f[k].as_f64().unwrap_or(0.0);
        let end_us = v["timestamp"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.timestamp_micros())
            .unwrap_or(0);
        out.timings.push(TimingRecord {
            event_id: v["span"]["event_id"].as_str().unwrap_or("").to_owned(),
            outcome: f["outcome"].as_str().unwrap_or("").to_owned(),
            end_us,
            total_ms: num("total_ms"),
            overhead_ms: num("overhead_ms"),
            llm_calls: num("llm_calls") as u32,
            mongo_ms: num("mongo_ms"),
            mongo_commands: num("mongo_commands") as u32,
            knowledge: f["knowledge"].as_str().unwrap_or("").to_owned(),
            stages_ms: Stage::ALL
                .iter()
                .map(|s| num(&format!("{}_ms", s.name())))
                .collect(),
        });
    }
    out
}

/// The most turns that were running at once, from the turns' start and end times.
pub fn peak_concurrency(records: &[&TimingRecord]) -> usize {
    let mut edges: Vec<(i64, i32)> = Vec::with_capacity(records.len() * 2);
    for r in records {
        let start = r.end_us - (r.total_ms * 1e3) as i64;
        edges.push((start, 1));
        edges.push((r.end_us, -1));
    }
    // Ends before starts at the same instant.
    edges.sort();
    let (mut now, mut peak) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        peak = peak.max(now);
    }
    peak.max(0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_lines_are_read_from_a_json_log() {
        let dir = std::env::temp_dir().join(format!("bench-log-{:x}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("w.log");
        std::fs::write(
            &log,
            concat!(
                r#"{"timestamp":"2026-11-22T10:00:01.000000Z","level":"INFO","fields":{"message":"turn timings","outcome":"answered","total_ms":12.5,"overhead_ms":2.5,"llm_calls":1,"mongo_ms":1.25,"mongo_commands":7,"llm_ms":10.0,"writes_ms":1.5},"target":"companion_core::timing","span":{"event_id":"abc","name":"turn"}}"#,
                "\n",
                r#"{"timestamp":"2026-11-22T10:00:01.005000Z","level":"WARN","fields":{"message":"turn failed; will retry","error":"boom"},"target":"companion::testing::worker"}"#,
                "\nnot json\n",
                r#"{"timestamp":"2026-11-22T10:00:01.010000Z","level":"INFO","fields":{"message":"turn timings","total_ms":20.0,"overhead_ms":20.0,"llm_calls":0},"span":{"event_id":"def"}}"#,
                "\n"
            ),
        )
        .unwrap();
        let s = read_log(&log);
        assert_eq!(s.timings.len(), 2);
        assert_eq!(s.warnings, 1);
        assert_eq!(s.errors, 0);
        let t = &s.timings[0];
        assert_eq!(t.event_id, "abc");
        assert_eq!(t.total_ms, 12.5);
        assert_eq!(t.overhead_ms, 2.5);
        assert_eq!((t.mongo_ms, t.mongo_commands), (1.25, 7));
        let idx = |st: Stage| Stage::ALL.iter().position(|s| *s == st).unwrap();
        assert_eq!(t.stages_ms[idx(Stage::Llm)], 10.0);
        assert_eq!(t.stages_ms[idx(Stage::Writes)], 1.5);
        // abc ran 10:00:00.9875–01.000, def 00.990–01.010: they overlap.
        let refs: Vec<&TimingRecord> = s.timings.iter().collect();
        assert_eq!(peak_concurrency(&refs), 2);
        assert_eq!(peak_concurrency(&refs[..1]), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
