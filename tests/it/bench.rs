//! `companion-dev bench` end to end on the real stack, small: its setup, worker processes, load and
//! report still fit the worker (a run that reads a table the worker no longer has fails here), and the
//! picture is written beside the JSON.

use clap::Parser;
use companion::Config;
use companion_dev::bench::{self, BenchArgs};

use crate::env::*;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

/// `bench` with `args` and the repository's seed, knowledge and fixture.
fn bench_args(args: &[&str]) -> BenchArgs {
    let root = root();
    let path = |p: &str| root.join(p).display().to_string();
    let mut all: Vec<String> = std::iter::once("bench")
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect();
    for (flag, p) in [
        ("--seed-dir", "deploy/local/seed"),
        ("--knowledge-dir", "deploy/local/knowledge"),
        ("--embed-fixture", "tests/fixtures/embeddings-public.jsonl"),
    ] {
        all.extend([flag.to_owned(), path(p)]);
    }
    Cli::parse_from(all).bench
}

/// The workers' configuration: the environment's, with the installed model files.
fn bench_config() -> Config {
    let mut config = Config::from_env().expect("configuration from the environment");
    let models = embed_config();
    config.embed.model_dir = models.model_dir;
    config.embed.ort_dylib_path = models.ort_dylib_path;
    config.embed.model_file = models.model_file;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_run_answers_every_turn_once_and_writes_its_report_and_picture() {
    let dir = std::env::temp_dir().join(format!("bench-{:016x}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("run.json");
    let args = bench_args(&[
        "--turns",
        "20",
        "--warmup",
        "4",
        "--rate",
        "20",
        "--conversations",
        "8",
        "--users",
        "4",
        "--history",
        "2",
        "--script",
        "tool",
        "--timeout",
        "60",
        "--worker-bin",
        env!("CARGO_BIN_EXE_companion"),
        "--json",
        &json.display().to_string(),
    ]);
    let config = bench_config();

    let report = bench::one_run(config, args).await.expect("the bench runs");
    let turns = report.turns.as_ref().expect("turn counts");
    assert_eq!(turns.published, 20);
    assert_eq!(
        (turns.lost, turns.duplicated, turns.publish_errors),
        (0, 0, 0)
    );
    assert_eq!(turns.dead_letters, 0);
    assert_eq!(
        report.end_to_end_ms.as_ref().map(|d| d.n),
        Some(20),
        "every measured turn timed"
    );
    // A burst's reply answers several messages in one turn: stage timings may count fewer than 20.
    assert!(
        report
            .stages
            .iter()
            .any(|s| s.stage == "order" && s.ms.n > 0),
        "stage timings read from the workers' logs"
    );
    // The workers say how each turn got its query vector; the stub's requests give the prompt figures.
    assert!(
        report.knowledge.keys().any(|k| k == "embedded"),
        "{:?}",
        report.knowledge
    );
    let prompt = report.prompt.as_ref().expect("prompt figures");
    assert!(
        prompt.requests > 0 && prompt.tokens.p50 > 100.0,
        "{prompt:?}"
    );
    assert!(
        prompt.shared_prefix_share > 0.0 && prompt.shared_prefix_share < 1.0,
        "{prompt:?}"
    );
    // The one worker's NATS messages, from the server's own counters: each turn at least pulls, acks,
    // publishes its completion and receives its message.
    let nats = report
        .nats
        .expect("NATS messages counted (NATS_MONITOR_URL)");
    assert_eq!(nats.connections, 1, "{nats:?}");
    assert!(
        nats.sent_per_turn >= 2.0 && nats.received_per_turn >= 1.0,
        "{nats:?}"
    );
    // What the turns asked of PostgreSQL (issue 64). A bound on a tool turn's statements, so a change
    // that adds statements to every turn shows here (15.2 a turn in docs/benchmark.md; a run beside this
    // one may reset pg_stat_statements, which can only lower the count). Rows from the database's own
    // counters: jobs, job_steps, the history and the floor.
    let pg = report.postgres.as_ref().expect("PostgreSQL's work counted");
    assert!(pg.statements_per_turn <= 17.0, "{pg:?}");
    assert!(pg.rows_written_per_turn >= 10.0, "{pg:?}");
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON report")).unwrap();
    assert_eq!(written["turns"]["published"], 20);
    let svg = std::fs::read_to_string(json.with_extension("svg")).expect("the picture");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(
        svg.contains("stage order") && svg.contains("<polyline"),
        "stages and timeline drawn"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `--compare`: both binaries in alternating rounds, every figure for both and the ratio (here the same
/// binary twice, so each ratio is measured, not assumed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_runs_both_binaries_in_alternating_rounds_and_reports_ratios() {
    let dir = std::env::temp_dir().join(format!("bench-{:016x}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("compare.json");
    let bin = env!("CARGO_BIN_EXE_companion");
    let args = bench_args(&[
        "--compare",
        bin,
        "--worker-bin",
        bin,
        "--rounds",
        "2",
        "--turns",
        "12",
        "--warmup",
        "2",
        "--rate",
        "20",
        "--conversations",
        "6",
        "--users",
        "3",
        "--history",
        "2",
        "--timeout",
        "60",
        "--embed",
        "--embed-secs",
        "0.3",
        "--json",
        &json.display().to_string(),
    ]);
    let config = bench_config();
    let other = args.compare.clone().unwrap();
    let c = bench::compare::alternate(config, args, other)
        .await
        .expect("the comparison runs");
    let sides: Vec<&str> = c.rounds.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(sides, ["a", "b", "b", "a"], "alternating rounds");
    let sides: Vec<&str> = c.embedding_rounds.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(sides, ["a", "b", "b", "a"]);
    assert!(
        c.embedding_rounds
            .iter()
            .any(|(_, e)| e.model.ends_with("model.onnx"))
    );
    let row = |name: &str| {
        c.rows
            .iter()
            .find(|r| r.figure.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row: {:?}", c.rows))
    };
    let completed = row("turns completed");
    assert_eq!((completed.a, completed.b), (Some(12.0), Some(12.0)));
    assert_eq!(row("turns lost").a, Some(0.0));
    for name in [
        "worker CPU s per 1,000 turns",
        "PostgreSQL CPU s per 1,000 turns",
        "limits stage mean ms",
        "MongoDB commands per turn",
        "embedding chat lines per CPU-second",
    ] {
        let r = row(name);
        assert!(
            r.a.is_some_and(|a| a > 0.0) && r.b.is_some_and(|b| b > 0.0) && r.ratio.is_some(),
            "{r:?}"
        );
    }
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON report")).unwrap();
    assert!(written["rows"].as_array().is_some_and(|r| r.len() > 10));
    std::fs::remove_dir_all(&dir).ok();
}
