use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use companion::{Config, Services, store, telemetry, worker};
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
