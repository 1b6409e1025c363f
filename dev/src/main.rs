//! `companion-dev`: seed the demo data, talk to a companion as TB-Backend would, run the scripted
//! offline model, and measure the worker (`bench`).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context;
use clap::{Parser, Subcommand};
use companion::Config;
use companion_core::config::{EmbedSettings, LogConfig, MongoConfig};
use companion_dev::{chat, seed, stub};
use companion_store::store;

/// TrickBook's AI companions: dev tooling (demo data, chat, offline model, bench).
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: LogConfig,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    DemoData(DemoData),
    #[command(flatten)]
    Talk(Talk),
    /// Serve the scripted offline model (OpenAI-compatible) for demos without an API key.
    StubLlm {
        #[arg(long, default_value = "127.0.0.1:8089")]
        addr: SocketAddr,
        /// The demo data whose tricks and cities the model names in its tool calls.
        #[arg(long, default_value = "deploy/local/seed")]
        seed_dir: PathBuf,
        /// The embedding model it reads messages with (without it: keyword rules only).
        #[command(flatten)]
        embed: EmbedSettings,
    },
    /// Accept OTLP/HTTP trace exports and drop them (the collector the tracing benchmark exports to);
    /// says how many requests and bytes it took when stopped.
    OtlpSink {
        #[arg(long, default_value = "127.0.0.1:4318")]
        addr: SocketAddr,
    },
    /// Measure the crisis screen against the labelled set: per language recall, false positives, time.
    /// With `--frozen`: the screen and the output check on the frozen sets (per language, category and
    /// kind, and the targets of issue 42).
    SafetyEval {
        #[arg(long, default_value = "tests/fixtures/safety/labelled.jsonl")]
        file: PathBuf,
        #[arg(long, value_enum, default_value = "tune")]
        split: companion_dev::safety_eval::Split,
        /// Measure on the frozen sets instead (`input.jsonl` and `output.jsonl` of `--frozen-dir`).
        #[arg(long)]
        frozen: bool,
        #[arg(long, default_value = "tests/fixtures/safety/frozen")]
        frozen_dir: PathBuf,
        /// With `--frozen`: the rules alone (no embedding model needed).
        #[arg(long)]
        rules_only: bool,
        /// With `--frozen`: also the moderation endpoint at this URL (e.g. `https://api.openai.com/v1`),
        /// alone and combined with the local layers. Sends every frozen input line to it; the key is
        /// read from `COMPANION_MODERATION_API_KEY` only.
        #[command(flatten)]
        moderation: companion_dev::frozen_eval::ModerationArgs,
        /// The embedding model the learned layer reads messages with.
        #[command(flatten)]
        embed: EmbedSettings,
    },
    /// Train the learned layer of the crisis screen and the output check on the tuning lines (written
    /// apart from the frozen sets) and write its model files.
    SafetyTrain {
        #[command(flatten)]
        args: companion_dev::safety_train::TrainArgs,
    },
    /// Compare an embedding graph with another on held-out text: cosines (one at a time and batched) and
    /// retrieval agreement on the demo knowledge (docs/bench/history.md).
    Parity {
        #[command(flatten)]
        args: companion_dev::parity::ParityArgs,
    },
    /// Choose every similarity threshold (knowledge, memory recall, forget, duplicate facts) for the
    /// configured encoder on labelled lines, and measure each on lines it was not chosen on.
    Thresholds {
        #[arg(long, default_value = "tests/fixtures/retrieval/questions.jsonl")]
        questions: std::path::PathBuf,
        #[arg(long, default_value = "tests/fixtures/memory/pairs.jsonl")]
        pairs: std::path::PathBuf,
        #[arg(long, default_value = "deploy/local/knowledge")]
        knowledge: std::path::PathBuf,
        #[command(flatten)]
        embed: companion_core::config::EmbedSettings,
    },
    /// Count the checkout's structure (the lower crates' `pub` declarations, branches on the message's
    /// kind, functions over 80 lines, the tests' worker starters, `App::build`, the largest files).
    Census {
        #[command(flatten)]
        args: companion_dev::census::CensusArgs,
    },
    /// Measure a turn's cost and throughput end to end on the real local stack (see docs/benchmark.md).
    Bench {
        #[command(flatten)]
        args: Box<companion_dev::bench::BenchArgs>,
        /// The workers' configuration.
        #[command(flatten)]
        config: Box<Config>,
    },
}

/// The demo data in MongoDB.
#[derive(Subcommand)]
enum DemoData {
    /// Upsert the demo data (users, bots, trickipedia, spots, tricklists, conversations) into MongoDB.
    Seed {
        #[arg(long, default_value = "deploy/local/seed")]
        dir: PathBuf,
        #[command(flatten)]
        mongo: MongoConfig,
    },
    /// Print the 24-hex id of a user given by username (or id).
    UserId {
        user: String,
        #[command(flatten)]
        mongo: MongoConfig,
    },
    /// Create a new demo user like `--like` (its profile and tricklists) and print its username: each
    /// scripted demo run talks as its own user.
    DemoUser {
        #[arg(long, default_value = "jess")]
        like: String,
        #[command(flatten)]
        mongo: MongoConfig,
    },
    /// Make sure a user has the chat page's conversations (a DM with every companion, a group with
    /// `--group`), and print each id with its label, one per line.
    WebConversations {
        #[arg(long, default_value = "jess")]
        user: String,
        /// The group's companions (usernames, comma separated).
        #[arg(long, default_value = "kaori,tony")]
        group: String,
        #[command(flatten)]
        mongo: MongoConfig,
    },
}

/// Talking to a companion as TB-Backend and the admin tool would.
#[derive(Subcommand)]
enum Talk {
    /// Publish one DM exactly as TB-Backend would, and print its turn: every message it sent.
    Send {
        /// User id or username.
        #[arg(long, default_value = "jess")]
        user: String,
        /// Companion name or bot user id.
        #[arg(long, default_value = "kaori")]
        bot: String,
        /// Image URL to attach (repeatable).
        #[arg(long = "image")]
        images: Vec<String>,
        /// Seconds to wait for the reply; 0 publishes and exits.
        #[arg(long, default_value_t = 120)]
        wait: u64,
        text: String,
        #[command(flatten)]
        config: chat::ChatConfig,
    },
    /// Chat with a companion in the terminal (scripted when stdin is not a terminal).
    Chat {
        #[arg(long, default_value = "jess")]
        user: String,
        #[arg(long, default_value = "kaori")]
        bot: String,
        /// Chat in a group with these companions (comma separated, e.g. `kaori,tony`) instead of a DM.
        #[arg(long, conflicts_with = "bot")]
        group: Option<String>,
        /// Play lines from a file, or `builtin` for the demo script.
        #[arg(long)]
        script: Option<PathBuf>,
        /// Seconds to wait for each message's turn to be over.
        #[arg(long, default_value_t = 120)]
        wait: u64,
        /// When the chat ends, write the last message's id (what `companion explain` takes) to this
        /// file.
        #[arg(long)]
        last_id_file: Option<PathBuf>,
        #[command(flatten)]
        config: chat::ChatConfig,
    },
    /// Act as the admin tool: review the newest spot draft the companion made for the user, publish the
    /// review, and print the companion's follow-up.
    Review {
        #[arg(long, default_value = "jess")]
        user: String,
        #[arg(long, default_value = "kaori")]
        bot: String,
        /// Reject it instead of approving it.
        #[arg(long)]
        reject: bool,
        /// The moderator's note.
        #[arg(long)]
        note: Option<String>,
        /// Seconds to wait for the follow-up; 0 publishes and exits.
        #[arg(long, default_value_t = 120)]
        wait: u64,
        /// The guided flow the draft belongs to (`spot_wizard`): then no follow-up, or the flow not done
        /// after it, is an error (exit 1).
        #[arg(long)]
        expect_flow: Option<String>,
        #[command(flatten)]
        config: chat::ChatConfig,
    },
    /// Wait for the companion's proactive message of a kind (`reminder`, `spot_review`) written in the
    /// last `--since-secs` seconds, and print it.
    FollowUp {
        #[arg(long, default_value = "jess")]
        user: String,
        #[arg(long, default_value = "kaori")]
        bot: String,
        #[arg(long, default_value = "reminder")]
        kind: String,
        #[arg(long, default_value_t = 300)]
        since_secs: i64,
        #[arg(long, default_value_t = 120)]
        wait: u64,
        #[command(flatten)]
        config: chat::ChatConfig,
    },
}

fn main() -> std::process::ExitCode {
    companion::run_main(None, run)
}

async fn run() -> anyhow::Result<()> {
    let _ = dotenvy::dotenv();
    let cli = Cli::parse();
    let _telemetry = companion::init_telemetry(&cli.log);
    match cli.command {
        Command::DemoData(command) => demo_data(command).await?,
        Command::Talk(command) => talk(command).await?,
        Command::StubLlm {
            addr,
            seed_dir,
            embed,
        } => stub_llm(addr, &seed_dir, &embed).await?,
        Command::OtlpSink { addr } => otlp_sink(addr).await?,
        Command::SafetyEval {
            frozen: true,
            frozen_dir,
            rules_only,
            embed,
            moderation,
            ..
        } => {
            companion_dev::frozen_eval::report(&frozen_dir, &embed, rules_only, &moderation).await?
        }
        Command::SafetyEval { file, split, .. } => {
            companion_dev::safety_eval::report(&file, split)?
        }
        Command::SafetyTrain { args } => companion_dev::safety_train::train(&args).await?,
        Command::Parity { args } => companion_dev::parity::measure(&args).await?,
        Command::Thresholds {
            questions,
            pairs,
            knowledge,
            embed,
        } => {
            let at = companion_dev::thresholds::Sources {
                questions: &questions,
                pairs: &pairs,
                knowledge: &knowledge,
            };
            print!("{}", companion_dev::thresholds::measure(&embed, &at).await?);
        }
        Command::Census { args } => companion_dev::census::run(&args)?,
        Command::Bench { args, mut config } => {
            config.log = cli.log;
            companion_dev::bench::main(*config, *args)
                .await
                .context("benchmark")?;
        }
    }
    Ok(())
}

/// The demo data subcommands: each connects to MongoDB, then seeds, looks up or creates.
async fn demo_data(command: DemoData) -> anyhow::Result<()> {
    let (DemoData::Seed { mongo, .. }
    | DemoData::UserId { mongo, .. }
    | DemoData::DemoUser { mongo, .. }
    | DemoData::WebConversations { mongo, .. }) = &command;
    let mongo = store::Mongo::connect(mongo)
        .await
        .context("connecting to MongoDB")?;
    match command {
        DemoData::Seed { dir, .. } => {
            for (collection, n) in seed::seed_dir(&mongo, &dir).await.context("seeding")? {
                println!("{collection}: {n} documents");
            }
        }
        DemoData::UserId { user, .. } => {
            let id = companion_dev::chat::resolve_user(&mongo, &user)
                .await
                .context("finding the user")?;
            println!("{}", id.to_hex());
        }
        DemoData::DemoUser { like, .. } => {
            let username = seed::demo_user(&mongo, &like)
                .await
                .context("creating a demo user")?;
            println!("{username}");
        }
        DemoData::WebConversations { user, group, .. } => {
            let user = companion_dev::chat::resolve_user(&mongo, &user).await?;
            let group: Vec<String> = group
                .split(',')
                .map(|g| g.trim().to_owned())
                .filter(|g| !g.is_empty())
                .collect();
            for (label, id) in
                companion_dev::backend::ensure_web_conversations(&mongo, user, &group).await?
            {
                println!("{} {label}", id.to_hex());
            }
        }
    }
    Ok(())
}

/// The subcommands that talk to a companion: a DM, a chat, a moderator's review, a follow-up.
async fn talk(command: Talk) -> anyhow::Result<()> {
    match command {
        Talk::Send {
            user,
            bot,
            images,
            wait,
            text,
            config,
        } => send(&config, &user, &bot, &images, wait, &text).await,
        Talk::Review {
            user,
            bot,
            reject,
            note,
            wait,
            expect_flow,
            config,
        } => {
            let expect_flow = expect_flow.as_deref();
            review(
                &config,
                &user,
                &bot,
                reject,
                note.as_deref(),
                wait,
                expect_flow,
            )
            .await
        }
        Talk::FollowUp {
            user,
            bot,
            kind,
            since_secs,
            wait,
            config,
        } => follow_up(&config, &user, &bot, &kind, since_secs, wait).await,
        Talk::Chat {
            user,
            bot,
            group,
            script,
            wait,
            last_id_file,
            config,
        } => {
            let wait = Duration::from_secs(wait);
            let last = match group {
                Some(group) => {
                    let session = chat::GroupSession::open(&config, &user, &group).await?;
                    chat::group_chat(&session, script.as_deref(), wait).await?
                }
                None => {
                    let session = chat::Session::open(&config, &user, &bot).await?;
                    chat::chat(&session, script.as_deref(), wait).await?
                }
            };
            if let (Some(file), Some(id)) = (last_id_file, last) {
                std::fs::write(&file, format!("{id}\n"))
                    .with_context(|| format!("writing {}", file.display()))?;
            }
            Ok(())
        }
    }
}

/// `send`: one DM published as TB-Backend would, and its turn printed (or only its id, not waiting).
async fn send(
    config: &chat::ChatConfig,
    user: &str,
    bot: &str,
    images: &[String],
    wait: u64,
    text: &str,
) -> anyhow::Result<()> {
    let session = chat::Session::open(config, user, bot).await?;
    let wait = (wait > 0).then(|| Duration::from_secs(wait));
    let turn = session
        .say_showing(text, images, wait, |c| session.print(c))
        .await?;
    if wait.is_none() {
        println!(
            "published message {} to conversation {}",
            turn.message, session.conversation
        );
    } else if let Some(note) = session.note(&turn).await {
        println!("  ({note})");
    }
    Ok(())
}

/// `follow-up`: waits for the companion's proactive message of a kind and prints it.
async fn follow_up(
    config: &chat::ChatConfig,
    user: &str,
    bot: &str,
    kind: &str,
    since_secs: i64,
    wait: u64,
) -> anyhow::Result<()> {
    let session = chat::Session::open(config, user, bot).await?;
    let since = chrono::Utc::now() - chrono::Duration::seconds(since_secs);
    let d = session
        .follow_up_since(kind, since, Duration::from_secs(wait))
        .await?;
    let content = d.get_str("content").unwrap_or_default();
    // The follow-up's job: `<kind>:<id>`, what `companion explain` takes.
    let job = d.get_document("trigger").ok().and_then(|t| {
        Some(format!(
            "{}:{}",
            t.get_str("kind").ok()?,
            t.get_str("id").ok()?
        ))
    });
    match job.filter(|_| session.ids) {
        Some(job) => println!(
            "{}> {content}  [explain {job}]",
            session.bot_name.to_lowercase()
        ),
        None => println!("{}> {content}", session.bot_name.to_lowercase()),
    }
    Ok(())
}

/// `review`: a moderator approves (or rejects) the newest spot draft the companion made for the user.
async fn review(
    config: &chat::ChatConfig,
    user: &str,
    bot: &str,
    reject: bool,
    note: Option<&str>,
    wait: u64,
    expect_flow: Option<&str>,
) -> anyhow::Result<()> {
    let session = chat::Session::open(config, user, bot).await?;
    let wait = (wait > 0).then(|| Duration::from_secs(wait));
    let status = if reject { "rejected" } else { "approved" };
    println!(
        "(a moderator {status} the newest spot draft {} made for {user})",
        session.bot_name
    );
    let follow_up = session.review_latest_draft(!reject, note, wait).await?;
    match &follow_up {
        Some(follow_up) => session.print(follow_up),
        None => println!("review published"),
    }
    let Some(flow) = expect_flow else {
        return Ok(());
    };
    if follow_up.is_none() {
        anyhow::bail!(
            "no follow-up from {} within the wait: see worker.log",
            session.bot_name
        );
    }
    match session.flow_state(flow).await? {
        Some((step, status)) if status == "done" => {
            println!("(the guided flow {flow} is done, at its step {step})");
            Ok(())
        }
        Some((step, status)) => {
            anyhow::bail!("the guided flow {flow} is {status} at its step {step}, not done")
        }
        None => anyhow::bail!("the guided flow {flow} never started"),
    }
}

/// `otlp-sink`: answers every trace export with an empty success, keeping nothing.
async fn otlp_sink(addr: SocketAddr) -> anyhow::Result<()> {
    use std::sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    };
    let taken = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let counts = taken.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let counts = counts.clone();
            async move {
                counts.0.fetch_add(1, Ordering::Relaxed);
                counts.1.fetch_add(body.len() as u64, Ordering::Relaxed);
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .context("binding")?;
    tracing::info!(%addr, "dropping OTLP/HTTP trace exports");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        })
        .await?;
    let (requests, bytes) = (
        taken.0.load(Ordering::Relaxed),
        taken.1.load(Ordering::Relaxed),
    );
    tracing::info!(requests, bytes, "trace exports taken and dropped");
    Ok(())
}

/// `stub-llm`: the scripted offline model, reading messages with the embedding model when it loads.
async fn stub_llm(
    addr: SocketAddr,
    seed_dir: &std::path::Path,
    embed: &EmbedSettings,
) -> anyhow::Result<()> {
    let model = match companion_knowledge::rag::load_embedder(embed) {
        Some(embedder) => match stub::DemoModel::load(embedder, seed_dir).await {
            Ok(m) => Some(std::sync::Arc::new(m)),
            Err(e) => {
                tracing::warn!(error = %e, "demo data not read; keyword rules only");
                None
            }
        },
        None => None,
    };
    let responder = match model {
        Some(m) => {
            tracing::info!("the scripted model reads messages with the embedding model");
            m.responder()
        }
        None => stub::asynchronous(stub::demo()),
    };
    let server = stub::StubLlm::start_async(addr, responder, false)
        .await
        .context("binding")?;
    server.say_scripted();
    tracing::info!(base_url = %server.base_url, "scripted offline model listening");
    tokio::select! {
        _ = server.wait() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
