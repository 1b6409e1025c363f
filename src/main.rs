use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context;
use clap::{Parser, Subcommand};
use companion::{Config, Services, commands, llm::stub, seed, store, telemetry, worker};
use tokio_util::sync::CancellationToken;

/// TrickBook's AI companions: the worker and its tools.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    config: Config,
}

#[derive(Subcommand)]
enum Command {
    /// Consume bot-bound DMs and answer them (runs until SIGTERM/SIGINT).
    Worker,
    /// Apply the PostgreSQL migrations.
    Migrate,
    /// Upsert the demo data (users, bots, trickipedia, spots, tricklists, conversations) into MongoDB.
    Seed {
        #[arg(long, default_value = "deploy/local/seed")]
        dir: PathBuf,
    },
    /// Publish one DM exactly as TB-Backend would, and print the reply.
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
    },
    /// Chat with a companion in the terminal (scripted when stdin is not a terminal).
    Chat {
        #[arg(long, default_value = "jess")]
        user: String,
        #[arg(long, default_value = "kaori")]
        bot: String,
        /// Play lines from a file, or `builtin` for the demo script.
        #[arg(long)]
        script: Option<PathBuf>,
        /// Seconds to wait for each reply.
        #[arg(long, default_value_t = 120)]
        wait: u64,
    },
    /// Embed lines of text from stdin; one JSON line (`{"text", "embedding"}`) per input on stdout.
    Embed,
    /// Chunk, embed and store articles (a folder of Markdown/text files or a JSON-lines file).
    Ingest {
        /// Folder (`<collection>/*.md` below it) or `.jsonl` file.
        #[arg(default_value = "deploy/local/knowledge")]
        path: PathBuf,
        /// Collection for every article read (else front matter, else the folder name).
        #[arg(long)]
        collection: Option<String>,
    },
    /// Reprocess stored events (a conversation, a time or sequence range, or the dead-letter stream).
    Replay(companion::replay::ReplayArgs),
    /// Print LLM usage (calls, tokens, cost) by day, companion and model, with a total.
    Usage {
        /// Days to cover, today (UTC) included.
        #[arg(long, default_value_t = 7)]
        days: u32,
    },
    /// Measure a turn's cost and throughput end to end on the real local stack (see README, Benchmark).
    Bench(Box<companion::bench::BenchArgs>),
    /// Serve the scripted offline model (OpenAI-compatible) for demos without an API key.
    StubLlm {
        #[arg(long, default_value = "127.0.0.1:8089")]
        addr: SocketAddr,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = dotenvy::dotenv();
    let cli = Cli::parse();
    // Flushes exported spans when main returns.
    let _telemetry = telemetry::init(&cli.config);
    let config = cli.config;
    match cli.command {
        Command::Worker => {
            let shutdown = CancellationToken::new();
            tokio::spawn(watch_signals(shutdown.clone()));
            let services = Services::connect(config)
                .await
                .context("starting the worker")?;
            worker::run(services, shutdown).await.context("worker")?;
        }
        Command::Migrate => {
            let pg = store::Pg::connect(&config)
                .await
                .context("connecting to PostgreSQL")?;
            pg.migrate().await.context("migrating")?;
            println!("migrations applied");
        }
        Command::Seed { dir } => {
            let mongo = store::Mongo::connect(&config)
                .await
                .context("connecting to MongoDB")?;
            for (collection, n) in seed::seed_dir(&mongo, &dir).await.context("seeding")? {
                println!("{collection}: {n} documents");
            }
        }
        Command::Send {
            user,
            bot,
            images,
            wait,
            text,
        } => {
            let session = commands::Session::open(&config, &user, &bot).await?;
            let wait = (wait > 0).then(|| Duration::from_secs(wait));
            match session.say(&text, &images, wait).await? {
                Some(reply) => commands::print_reply(&session.bot_name, &reply),
                None => println!("published to conversation {}", session.conversation),
            }
        }
        Command::Chat {
            user,
            bot,
            script,
            wait,
        } => {
            let session = commands::Session::open(&config, &user, &bot).await?;
            commands::chat(&session, script.as_deref(), Duration::from_secs(wait)).await?;
        }
        Command::Embed => {
            let n = companion::rag::commands::embed_stdin(&config)
                .await
                .context("embedding")?;
            tracing::debug!(lines = n, "embedded");
        }
        Command::Ingest { path, collection } => {
            let r = companion::rag::commands::ingest_path(&config, &path, collection.as_deref())
                .await
                .with_context(|| format!("ingesting {}", path.display()))?;
            println!(
                "ingested {}: {} added, {} replaced, {} unchanged, {} chunks written",
                path.display(),
                r.added,
                r.replaced,
                r.unchanged,
                r.chunks
            );
        }
        Command::Replay(args) => {
            let services = Services::connect(config)
                .await
                .context("connecting for the replay")?;
            let summary = companion::replay::run(services, &args)
                .await
                .context("replay")?;
            if summary.failed > 0 {
                anyhow::bail!("{} event(s) could not be replayed", summary.failed);
            }
        }
        Command::Usage { days } => {
            let report = companion::usage::report(&config, days)
                .await
                .context("reading llm_usage (run `companion migrate` first)")?;
            print!("{report}");
        }
        Command::Bench(args) => {
            companion::bench::run(config, *args)
                .await
                .context("benchmark")?;
        }
        Command::StubLlm { addr } => {
            let server = stub::StubLlm::start_on(addr, stub::demo(), false)
                .await
                .context("binding")?;
            tracing::info!(base_url = %server.base_url, "scripted offline model listening");
            tokio::select! {
                _ = server.wait() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
    }
    Ok(())
}

/// Cancels `token` on SIGTERM or SIGINT.
async fn watch_signals(token: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown requested");
    token.cancel();
}
