//! `companion bench --compare OTHER`: the same load on the same stack with two worker binaries, in
//! alternating short rounds (A B, B A, A B, …) so that the machine's noise falls on both, then each
//! figure for both and their ratio. With `--embed`, the embedding throughput of this build's settings
//! and of `--compare-embed` (by default today's: the fp32 graph on two threads) alternates the same way.

use std::{fmt::Write, path::PathBuf};

use serde::Serialize;

use super::{
    BenchArgs, BenchError,
    dist::Dist,
    embed, load_run, procs,
    report::{Report, Resources},
    workers,
};
use companion::Config;
use companion_knowledge::rag::{EmbedConfig, Encoder};

/// One figure of both binaries.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub figure: String,
    pub a: Option<f64>,
    pub b: Option<f64>,
    /// `a / b`.
    pub ratio: Option<f64>,
}

/// The result of a comparison.
#[derive(Clone, Debug, Serialize)]
pub struct CompareReport {
    pub command: String,
    pub a: String,
    pub b: String,
    /// The embedding settings of the embedding rounds (run in this process): A's and B's.
    pub embed_a: String,
    pub embed_b: String,
    pub load_average_before: [f64; 3],
    pub load_average_after: [f64; 3],
    pub rows: Vec<Row>,
    /// Every round's full report, in the order they ran: ("a" | "b", report).
    pub rounds: Vec<(String, Report)>,
    pub embedding_rounds: Vec<(String, embed::EmbedFigures)>,
}

/// `MODEL:THREADS` of `--compare-embed`.
fn embed_variant(base: &Config, spec: &str) -> Result<EmbedConfig, BenchError> {
    let (model, threads) = spec.split_once(':').unwrap_or((spec, "2"));
    let mut settings = base.embed.clone();
    settings.model_file = model.to_owned();
    // Another encoder's graph is measured as that encoder (its tokenizer, its prefixes).
    if let Some(owner) = [Encoder::MINILM, Encoder::E5_SMALL]
        .into_iter()
        .find(|e| [e.int8_file, e.fp32_file].contains(&model))
    {
        settings.encoder = owner.name.to_owned();
    }
    settings.threads = threads
        .parse()
        .map_err(|_| BenchError::Setup(format!("--compare-embed {spec}: MODEL:THREADS")))?;
    Ok(EmbedConfig::from_settings(&settings))
}

pub async fn alternate(
    base: Config,
    args: BenchArgs,
    other: PathBuf,
) -> Result<CompareReport, BenchError> {
    let this = workers::worker_binary(args.worker_bin.as_deref())?;
    let other = workers::worker_binary(Some(&other))?;
    let rounds = args.rounds.max(1);
    let per_round = args.turns.div_ceil(rounds).max(1);
    let mut out = CompareReport {
        command: super::command_line(std::env::args()),
        a: this.display().to_string(),
        b: other.display().to_string(),
        load_average_before: procs::load_average(),
        load_average_after: [0.0; 3],
        embed_a: String::new(),
        embed_b: String::new(),
        rows: Vec::new(),
        rounds: Vec::new(),
        embedding_rounds: Vec::new(),
    };
    eprintln!(
        "bench: comparing A = {} with B = {}: {rounds} rounds of {per_round} turns each, alternating; load average {:?}",
        out.a, out.b, out.load_average_before
    );
    if args.embed || args.embed_only {
        let a = EmbedConfig::from_settings(&base.embed);
        let b = embed_variant(&base, &args.compare_embed)?;
        out.embed_a = format!("{} on {} thread(s)", a.model_file, a.threads);
        out.embed_b = format!("{} on {} thread(s)", b.model_file, b.threads);
        for (round, side) in alternating(rounds) {
            let cfg = if side == "a" { &a } else { &b };
            eprintln!(
                "bench: embedding round {} of {rounds}, {side}: {} on {} thread(s)",
                round + 1,
                cfg.model_file,
                cfg.threads
            );
            let f = embed::measure(cfg, &args.embed_fixture, args.embed_secs).await?;
            out.embedding_rounds.push((side.to_owned(), f));
        }
    }
    if !args.embed_only {
        for (round, side) in alternating(rounds) {
            let mut a = args.clone();
            a.turns = per_round;
            a.duration = None;
            a.worker_bin = Some(if side == "a" {
                this.clone()
            } else {
                other.clone()
            });
            if side == "b" {
                a.worker_env.extend(args.compare_env.iter().cloned());
            }
            eprintln!("bench: round {} of {rounds}, {side}", round + 1);
            if let Some(cmd) = &args.before_round {
                before_round(cmd).await?;
            }
            let mut r = Report::empty(format!("round {} {side}", round + 1));
            load_run(&base, &a, &mut r).await?;
            r.load_average_after = procs::load_average();
            out.rounds.push((side.to_owned(), r));
        }
    }
    out.load_average_after = procs::load_average();
    out.rows = rows(&out);
    println!("{}", table(&out));
    if let Some(path) = &args.json {
        let json = serde_json::to_vec_pretty(&out).expect("report serialises");
        std::fs::write(path, json).map_err(|e| BenchError::Write(path.clone(), e))?;
        eprintln!("bench: wrote {}", path.display());
    }
    Ok(out)
}

/// Runs `--before-round`'s command with `sh -c`; its output goes to this process's stderr.
async fn before_round(cmd: &str) -> Result<(), BenchError> {
    eprintln!("bench: before the round: {cmd}");
    let status = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdout(std::io::stderr())
        .status()
        .await
        .map_err(|e| BenchError::Setup(format!("--before-round {cmd}: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(BenchError::Setup(format!("--before-round {cmd}: {status}")))
    }
}

/// (round, side) in the order they run: A B, B A, A B, …
fn alternating(rounds: usize) -> impl Iterator<Item = (usize, &'static str)> {
    (0..rounds).flat_map(|round| {
        let order = if round % 2 == 0 {
            ["a", "b"]
        } else {
            ["b", "a"]
        };
        order.map(|side| (round, side))
    })
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The mean of a figure over the rounds that have it.
fn mean_of(rs: &[&Report], f: impl Fn(&Report) -> Option<f64>) -> Option<f64> {
    mean(&rs.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
}

/// A process group's CPU seconds per 1,000 turns over the rounds, weighted by the turns of each.
fn cpu_per_1000(rs: &[&Report], group: fn(&Resources) -> f64) -> Option<f64> {
    let (mut cpu, mut n) = (0.0, 0.0);
    for r in rs {
        if let (Some(res), Some(t)) = (&r.resources, &r.turns) {
            cpu += group(res) * t.completed as f64;
            n += t.completed as f64;
        }
    }
    (n > 0.0).then(|| cpu / n)
}

fn sum_of(rs: &[&Report], f: impl Fn(&Report) -> Option<f64>) -> Option<f64> {
    Some(rs.iter().filter_map(|r| f(r)).sum())
}

/// One memory figure of every worker of every round.
fn per_worker(rs: &[&Report], f: impl Fn(&Resources) -> &Vec<f64>) -> Vec<f64> {
    rs.iter()
        .filter_map(|r| r.resources.as_ref())
        .flat_map(|x| f(x).iter().copied())
        .collect()
}

/// The middle value (the mean of the two middle ones of an even count).
fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    match v.len() {
        0 => None,
        n if n % 2 == 0 => Some((v[mid - 1] + v[mid]) / 2.0),
        _ => Some(v[mid]),
    }
}

/// A figure of one stage's times (`pick` of its distribution, ms), averaged over the rounds that ran it.
fn stage_ms(rs: &[&Report], stage: &str, pick: fn(&Dist) -> f64) -> Option<f64> {
    mean_of(rs, |r| {
        r.stages
            .iter()
            .find(|s| s.stage == stage)
            .map(|s| pick(&s.ms))
    })
}

/// A figure of a side's rounds (none when no round has it).
type Fig = fn(&[&Report]) -> Option<f64>;

/// Every figure, A against B.
fn rows(c: &CompareReport) -> Vec<Row> {
    let side = |s: &str| -> Vec<&Report> {
        c.rounds
            .iter()
            .filter(|(x, _)| x == s)
            .map(|(_, r)| r)
            .collect()
    };
    let (ra, rb) = (side("a"), side("b"));
    let figures = [cost_figures(), turn_figures(), memory_and_prompt_figures()].concat();
    let mut out: Vec<Row> = figures
        .into_iter()
        .filter(|_| !c.rounds.is_empty())
        .map(|(name, f)| row(name, f(&ra), f(&rb)))
        .collect();
    out.extend(embedding_rows(c));
    out
}

/// The figures of what a turn costs: the worker's and PostgreSQL's CPU, PostgreSQL's work.
fn cost_figures() -> Vec<(&'static str, Fig)> {
    vec![
        ("worker CPU s per 1,000 turns", |rs| {
            cpu_per_1000(rs, |res| res.worker_cpu_s_per_1000)
        }),
        ("worker CPU s per 1,000 turns, median of rounds", |rs| {
            let per_round: Vec<f64> = rs
                .iter()
                .filter_map(|r| r.resources.as_ref().map(|x| x.worker_cpu_s_per_1000))
                .collect();
            median(&per_round)
        }),
        ("PostgreSQL CPU s per 1,000 turns", |rs| {
            cpu_per_1000(rs, |res| res.postgres_cpu_s_per_1000)
        }),
        ("  of which the run's backends", |rs| {
            cpu_per_1000(rs, |res| res.postgres_cpu.backends)
        }),
        ("  of which background processes", |rs| {
            cpu_per_1000(rs, |res| res.postgres_cpu.background)
        }),
        (
            "  of which processes that exited (autovacuum workers)",
            |rs| cpu_per_1000(rs, |res| res.postgres_cpu.exited),
        ),
        (
            "PostgreSQL statements per turn (BEGIN/COMMIT included)",
            |rs| mean_of(rs, |r| r.postgres.as_ref().map(|p| p.statements_per_turn)),
        ),
        (
            "PostgreSQL round trips per turn (--count-round-trips)",
            |rs| {
                mean_of(rs, |r| {
                    r.postgres.as_ref().and_then(|p| p.round_trips_per_turn)
                })
            },
        ),
        ("PostgreSQL commits per turn", |rs| {
            mean_of(rs, |r| r.postgres.as_ref().map(|p| p.commits_per_turn))
        }),
        ("PostgreSQL rows written per turn", |rs| {
            mean_of(rs, |r| r.postgres.as_ref().map(|p| p.rows_written_per_turn))
        }),
        ("PostgreSQL WAL bytes per turn", |rs| {
            mean_of(rs, |r| r.postgres.as_ref().map(|p| p.wal_bytes_per_turn))
        }),
        ("PostgreSQL execution ms per turn", |rs| {
            mean_of(rs, |r| r.postgres.as_ref().map(|p| p.exec_ms_per_turn))
        }),
    ]
}

/// The figures of the turns themselves: how many, how long, their stages and messages.
fn turn_figures() -> Vec<(&'static str, Fig)> {
    vec![
        ("turns completed", |rs| {
            sum_of(rs, |r| r.turns.as_ref().map(|t| t.completed as f64))
        }),
        ("turns lost or duplicated", |rs| {
            sum_of(rs, |r| {
                r.turns.as_ref().map(|t| (t.lost + t.duplicated) as f64)
            })
        }),
        ("end to end p50 ms", |rs| {
            mean_of(rs, |r| r.end_to_end_ms.as_ref().map(|d| d.p50))
        }),
        ("overhead (wall − LLM) p50 ms", |rs| {
            mean_of(rs, |r| r.overhead_ms.as_ref().map(|d| d.p50))
        }),
        ("embed stage p50 ms (turns that embedded)", |rs| {
            stage_ms(rs, "embed", |d| d.p50)
        }),
        ("embed stage p99 ms (turns that embedded)", |rs| {
            stage_ms(rs, "embed", |d| d.p99)
        }),
        ("limits stage mean ms (flood limit, spend checks)", |rs| {
            stage_ms(rs, "limits", |d| d.mean)
        }),
        (
            "tool argument validation mean µs (turns with a tool call)",
            |rs| stage_ms(rs, "validate", |d| d.mean * 1e3),
        ),
        ("MongoDB commands per turn", |rs| {
            mean_of(rs, |r| Some(r.mongo_commands_per_turn))
        }),
        ("NATS messages per turn, sent by the workers", |rs| {
            mean_of(rs, |r| r.nats.map(|n| n.sent_per_turn))
        }),
        ("NATS messages per turn, received by the workers", |rs| {
            mean_of(rs, |r| r.nats.map(|n| n.received_per_turn))
        }),
        ("share of turns that ran the embedding model", |rs| {
            let (mut embedded, mut all) = (0usize, 0usize);
            for r in rs {
                embedded += r.knowledge.get("embedded").copied().unwrap_or(0);
                all += r.knowledge.values().sum::<usize>();
            }
            (all > 0).then(|| embedded as f64 / all as f64)
        }),
    ]
}

/// The figures of the workers' memory and of the prompts they sent.
fn memory_and_prompt_figures() -> Vec<(&'static str, Fig)> {
    vec![
        ("worker RSS idle MB (median)", |rs| {
            median(&per_worker(rs, |x| &x.worker_rss_idle_mb))
        }),
        ("worker RSS after warm-up MB (median)", |rs| {
            median(&per_worker(rs, |x| &x.worker_rss_warm_mb))
        }),
        ("worker RSS peak MB (max)", |rs| {
            per_worker(rs, |x| &x.worker_rss_peak_mb)
                .into_iter()
                .reduce(f64::max)
        }),
        ("knowledge chunks in a first call's prompt, mean", |rs| {
            mean_of(rs, |r| r.prompt.as_ref().map(|p| p.knowledge_chunks))
        }),
        ("prompt tokens p50 (first call, estimated)", |rs| {
            mean_of(rs, |r| r.prompt.as_ref().map(|p| p.tokens.p50))
        }),
        ("prompt prefix shared across users, share", |rs| {
            mean_of(rs, |r| r.prompt.as_ref().map(|p| p.shared_prefix_share))
        }),
        ("prompt tokens per turn, all calls (stub count)", |rs| {
            mean_of(rs, |r| r.billing.as_ref().map(|b| b.prompt_tokens_per_turn))
        }),
        (
            "cached prompt tokens per turn (simulated provider cache)",
            |rs| mean_of(rs, |r| r.billing.as_ref().map(|b| b.cached_tokens_per_turn)),
        ),
        ("billed-equivalent prompt tokens per turn", |rs| {
            mean_of(rs, |r| {
                r.billing.as_ref().map(|b| b.billed_equivalent_per_turn)
            })
        }),
    ]
}

/// The embedding rounds' rows, when the run had any.
fn embedding_rows(c: &CompareReport) -> Vec<Row> {
    let mut out = Vec::new();
    let emb = |s: &str, f: fn(&embed::EmbedFigures) -> f64| {
        mean(
            &c.embedding_rounds
                .iter()
                .filter(|(x, _)| x == s)
                .map(|(_, e)| f(e))
                .collect::<Vec<_>>(),
        )
    };
    if !c.embedding_rounds.is_empty() {
        type EFig = fn(&embed::EmbedFigures) -> f64;
        let figures: [(&str, EFig); 4] = [
            ("embedding chat lines per CPU-second (batched)", |e| {
                e.chat.batched_per_cpu_second
            }),
            ("embedding chat lines per second, one at a time", |e| {
                e.chat.one_at_a_time
            }),
            ("embedding all lines per CPU-second (batched)", |e| {
                e.full.batched_per_cpu_second
            }),
            ("embedder RSS after load MB", |e| e.rss_after_load_mb),
        ];
        for (name, f) in figures {
            out.push(row(name, emb("a", f), emb("b", f)));
        }
    }
    out
}

fn row(figure: &str, a: Option<f64>, b: Option<f64>) -> Row {
    Row {
        figure: figure.to_owned(),
        a,
        b,
        ratio: match (a, b) {
            (Some(a), Some(b)) if b != 0.0 => Some(a / b),
            _ => None,
        },
    }
}

/// The comparison as a terminal table.
pub fn table(c: &CompareReport) -> String {
    let mut o = String::new();
    let l = |x: [f64; 3]| format!("{:.2} {:.2} {:.2}", x[0], x[1], x[2]);
    let _ = writeln!(
        o,
        "\n== companion bench --compare ==\nA: {}\nB: {}\nload average before {}, after {}; {} load rounds, {} embedding rounds, alternating\n",
        c.a,
        c.b,
        l(c.load_average_before),
        l(c.load_average_after),
        c.rounds.len(),
        c.embedding_rounds.len()
    );
    if !c.embedding_rounds.is_empty() {
        let _ = writeln!(
            o,
            "embedding rows (measured in this process): A = {}, B = {}\n",
            c.embed_a, c.embed_b
        );
    }
    // The figures' names are as wide as the longest.
    let w = c
        .rows
        .iter()
        .map(|r| r.figure.chars().count())
        .max()
        .unwrap_or(6);
    let _ = writeln!(o, "{:<w$} {:>12} {:>12} {:>8}", "figure", "A", "B", "A/B");
    let f = |v: Option<f64>| v.map(|x| format!("{x:.3}")).unwrap_or_else(|| "n/a".into());
    for r in &c.rows {
        let _ = writeln!(
            o,
            "{:<w$} {:>12} {:>12} {:>8}",
            r.figure,
            f(r.a),
            f(r.b),
            r.ratio
                .map(|x| format!("{x:.3}"))
                .unwrap_or_else(|| "n/a".into())
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::median;

    /// A failing `--before-round` command ends the run with its status; a passing one lets it go on.
    #[tokio::test]
    async fn a_failing_before_round_command_ends_the_run() {
        super::before_round("true").await.expect("passes");
        let e = super::before_round("exit 3").await.unwrap_err().to_string();
        assert!(e.contains("exit status: 3"), "{e}");
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[]), None);
    }
}
