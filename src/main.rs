//! `companion`: parse the command line, start telemetry, build what the command needs, run it.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use companion::{
    commands,
    config::{
        self, CharactersConfig, Config, ConsumerConfig, EmbedSettings, FlowConfig, FollowUpConfig,
        GroupConfig, LlmConfig, LogConfig, MemoryConfig, MongoConfig, NatsConfig, PgConfig,
        PromptConfig, RagConfig, SafetyConfig, SpendConfig, TurnConfig,
    },
};
use tokio_util::sync::CancellationToken;

/// TrickBook's AI companions: the worker and its operations commands.
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
    /// Consume bot-bound DMs and answer them (runs until SIGTERM/SIGINT).
    Worker(Box<Config>),
    /// Apply the PostgreSQL migrations.
    Migrate(PgConfig),
    /// Create or update the streams and the shared consumer to this configuration (run it when the
    /// consumer or stream settings change; workers only create what is missing).
    Provision {
        #[command(flatten)]
        nats: NatsConfig,
        #[command(flatten)]
        consumer: ConsumerConfig,
    },
    /// Reprocess stored events (a conversation, a time or sequence range, or the dead-letter stream).
    Replay(Box<ReplayCommand>),
    /// Print LLM usage (calls, tokens, cost) by day, companion and model, with a total; or the heaviest
    /// users (`--top N`).
    Usage {
        /// Days to cover, today (UTC) included (default 7; 1 with `--top`).
        #[arg(long)]
        days: Option<u32>,
        /// Only this user's calls (24-hex user id).
        #[arg(long, conflicts_with = "top")]
        user: Option<String>,
        /// The N users whose calls cost most (then by tokens), instead of the summary.
        #[arg(long)]
        top: Option<u32>,
        /// A cached prompt token's price over an uncached one's (the provider's cached-read ratio),
        /// for the billed-equivalent tokens per turn.
        #[arg(long, env = "LLM_CACHED_PRICE_RATIO", default_value_t = 0.25)]
        cached_price_ratio: f64,
        #[command(flatten)]
        pg: PgConfig,
        #[command(flatten)]
        characters: CharactersConfig,
    },
    /// The story of one message's job, from the journal: arrival, the crisis screen, the gate, the burst,
    /// each model and tool call, the outgoing hook, the delivery and how it ended.
    Explain {
        /// The message id (a DM, a group message, a burst's later message), or a follow-up's job id.
        message_id: String,
        /// One JSON object instead of the text.
        #[arg(long)]
        json: bool,
        /// Also the messages' text (never a deleted message's or an erased user's); the look is logged
        /// and recorded in the job's journal.
        #[arg(long)]
        show_text: bool,
        /// Who asks, for that record (default: $USER).
        #[arg(long, env = "USER", default_value = "unknown")]
        operator: String,
        #[command(flatten)]
        pg: PgConfig,
        #[command(flatten)]
        characters: CharactersConfig,
    },
    /// Chunk, embed and store articles (a folder of Markdown/text files or a JSON-lines file); with
    /// `--reembed`, embed again what is stored instead.
    Ingest {
        /// Folder (`<collection>/*.md` below it) or `.jsonl` file.
        #[arg(default_value = "deploy/local/knowledge")]
        path: PathBuf,
        /// Collection for every article read (else front matter, else the folder name).
        #[arg(long)]
        collection: Option<String>,
        /// Read no articles: embed again, with the configured model, every stored vector another model
        /// computed (knowledge chunks and remembered facts), batch by batch. Safe to stop and run again.
        #[arg(long, conflicts_with = "collection")]
        reembed: bool,
        /// Rows embedded and committed together by `--reembed`.
        #[arg(long, default_value_t = 64, requires = "reembed")]
        batch: usize,
        #[command(flatten)]
        pg: PgConfig,
        #[command(flatten)]
        embed: EmbedSettings,
        #[command(flatten)]
        rag: RagConfig,
    },
    /// Embed lines of text from stdin; one JSON line (`{"text", "embedding"}`) per input on stdout.
    Embed {
        /// Read each line as a passage (a knowledge chunk, a fact) rather than as a query (a message):
        /// e5 embeds the two differently.
        #[arg(long)]
        passage: bool,
        #[command(flatten)]
        embed: EmbedSettings,
    },
    /// What companions remember about a user (facts with their sources, summaries).
    Memory {
        /// The user (24-hex id).
        #[arg(long)]
        user: String,
        /// Only this companion (its name, as in `characters/`, or its bot id).
        #[arg(long)]
        bot: Option<String>,
        #[command(flatten)]
        pg: PgConfig,
        #[command(flatten)]
        characters: CharactersConfig,
        #[command(flatten)]
        memory: MemoryConfig,
    },
    /// Reports for the company (`report crisis --year 2026`).
    #[command(subcommand)]
    Report(ReportCommand),
}

/// `companion replay`: what to replay, and what a turn needs.
#[derive(Args)]
struct ReplayCommand {
    #[command(flatten)]
    args: commands::ReplayArgs,
    // The pipeline's sections, as the worker has them; not the worker's own (its `--concurrency` is
    // not replay's).
    #[command(flatten)]
    nats: NatsConfig,
    #[command(flatten)]
    mongo: MongoConfig,
    #[command(flatten)]
    pg: PgConfig,
    #[command(flatten)]
    llm: LlmConfig,
    #[command(flatten)]
    characters: CharactersConfig,
    #[command(flatten)]
    turn: TurnConfig,
    #[command(flatten)]
    spend: SpendConfig,
    #[command(flatten)]
    group: GroupConfig,
    #[command(flatten)]
    flow: FlowConfig,
    #[command(flatten)]
    follow_ups: FollowUpConfig,
    #[command(flatten)]
    safety: SafetyConfig,
    #[command(flatten)]
    prompt: PromptConfig,
    #[command(flatten)]
    embed: EmbedSettings,
    #[command(flatten)]
    rag: RagConfig,
    #[command(flatten)]
    memory: MemoryConfig,
}

/// `companion report`: figures the company publishes.
#[derive(Subcommand)]
enum ReportCommand {
    /// Crisis flags and referrals of a year by month and category (no user ids), for the yearly count
    /// the law asks for.
    Crisis {
        /// The year (UTC), e.g. 2026; default this year.
        #[arg(long)]
        year: Option<i32>,
        /// One JSON object instead of the table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        pg: PgConfig,
    },
    /// The crisis lines with their evidence (kind, hours, cost, source, the date checked), those due
    /// for review first: the sheet the trust-and-safety lead works through (docs/safety.md).
    CrisisLines {
        /// One JSON object instead of the text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        safety: Box<SafetyConfig>,
    },
}

fn main() -> std::process::ExitCode {
    let _ = dotenvy::dotenv();
    let cli = Cli::parse();
    let threads = match &cli.command {
        Command::Worker(config) => Some(config.runtime_threads()),
        _ => None,
    };
    companion::run_main(threads, || run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // Flushes exported spans when main returns.
    let _telemetry = companion::init_telemetry(&cli.log);
    match cli.command {
        Command::Worker(mut config) => {
            config.log = cli.log;
            worker(*config).await?
        }
        Command::Migrate(pg) => migrate(&pg).await?,
        Command::Provision { nats, consumer } => provision(&nats, &consumer).await?,
        Command::Replay(r) => replay_command(*r).await?,
        Command::Memory {
            user,
            bot,
            pg,
            characters,
            memory,
        } => memory_report(&pg, &memory, &characters, &user, bot.as_deref()).await?,
        Command::Usage {
            days,
            user,
            top,
            cached_price_ratio,
            pg,
            characters,
        } => {
            let query = commands::UsageQuery {
                days,
                user: user.as_deref(),
                top,
                cached_price_ratio,
            };
            usage_report(query, &pg, &characters).await?
        }
        Command::Explain {
            message_id,
            json,
            show_text,
            operator,
            pg,
            characters,
        } => {
            let request = commands::ExplainRequest {
                id: &message_id,
                json,
                show_text,
                operator: &operator,
            };
            explain(&pg, &characters, request).await?
        }
        Command::Ingest {
            reembed: true,
            batch,
            pg,
            embed,
            ..
        } => reembed(&pg, &embed, batch).await?,
        Command::Ingest {
            path,
            collection,
            pg,
            embed,
            rag,
            ..
        } => ingest(&path, collection.as_deref(), &pg, &embed, &rag).await?,
        Command::Report(ReportCommand::Crisis { year, json, pg }) => {
            crisis_report(year, json, &pg).await?
        }
        Command::Report(ReportCommand::CrisisLines { json, safety }) => {
            crisis_lines(json, &safety)?
        }
        Command::Embed { passage, embed } => embed_lines(passage, &embed).await?,
    }
    Ok(())
}

/// `companion worker`: runs until SIGTERM or SIGINT.
async fn worker(config: Config) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    tokio::spawn(watch_signals(shutdown.clone()));
    companion::run_worker(config, shutdown)
        .await
        .context("worker")
}

/// `companion migrate`: the database's migrations.
async fn migrate(pg: &PgConfig) -> anyhow::Result<()> {
    commands::migrate(pg).await.context("migrate")?;
    println!("migrations applied");
    Ok(())
}

/// `companion provision`: the streams and consumers, one line per thing made or found.
async fn provision(nats: &NatsConfig, consumer: &ConsumerConfig) -> anyhow::Result<()> {
    let lines = commands::provision(nats, consumer)
        .await
        .context("provision")?;
    for line in lines {
        println!("{line}");
    }
    Ok(())
}

/// `companion report crisis-lines`: the crisis lines with their evidence, those due for review first.
fn crisis_lines(json: bool, safety: &SafetyConfig) -> anyhow::Result<()> {
    let today = chrono::Utc::now().date_naive();
    print!(
        "{}",
        commands::crisis_lines_report(safety, today, json).context("crisis lines")?
    );
    Ok(())
}

/// `companion memory`: what the companions remember of a user.
async fn memory_report(
    pg: &PgConfig,
    memory: &MemoryConfig,
    characters: &CharactersConfig,
    user: &str,
    bot: Option<&str>,
) -> anyhow::Result<()> {
    let report = commands::memory(pg, memory, &characters.dir, user, bot)
        .await
        .context("reading what companions remember")?;
    print!("{report}");
    Ok(())
}

/// `companion explain`: a message's job, told from the journal.
async fn explain(
    pg: &PgConfig,
    characters: &CharactersConfig,
    request: commands::ExplainRequest<'_>,
) -> anyhow::Result<()> {
    let story = commands::explain(pg, &characters.dir, request)
        .await
        .context("explaining the message's job from the journal")?;
    print!("{story}");
    Ok(())
}

/// `companion ingest --reembed`: the stored vectors again, with the configured encoder.
async fn reembed(pg: &PgConfig, embed: &EmbedSettings, batch: usize) -> anyhow::Result<()> {
    let r = commands::reembed(pg, embed, batch)
        .await
        .context("embedding the stored vectors again")?;
    println!(
        "re-embedded with {}: {} knowledge chunks, {} remembered facts",
        r.model, r.chunks, r.facts
    );
    Ok(())
}

/// `companion embed`: each line of stdin as a vector.
async fn embed_lines(passage: bool, embed: &EmbedSettings) -> anyhow::Result<()> {
    let role = match passage {
        true => commands::EmbedRole::Passage,
        false => commands::EmbedRole::Query,
    };
    let n = commands::embed(embed, role).await.context("embedding")?;
    tracing::debug!(lines = n, "embedded");
    Ok(())
}

/// `companion replay`: the worker's parts, then the events again.
async fn replay_command(r: ReplayCommand) -> anyhow::Result<()> {
    let config = Config {
        nats: r.nats,
        mongo: r.mongo,
        pg: r.pg,
        llm: r.llm,
        characters: r.characters,
        turn: r.turn,
        spend: r.spend,
        group: r.group,
        flow: r.flow,
        follow_ups: r.follow_ups,
        safety: r.safety,
        prompt: r.prompt,
        embed: r.embed,
        rag: r.rag,
        memory: r.memory,
        // Unused by replay (no consumer, no worker loop), read from the environment as a worker would.
        consumer: config::from_env().context("consumer settings")?,
        worker: config::from_env().context("worker settings")?,
        log: Default::default(),
    };
    let summary = commands::replay(&config, &r.args).await.context("replay")?;
    if summary.failed > 0 {
        anyhow::bail!("{} event(s) could not be replayed", summary.failed);
    }
    Ok(())
}

/// `companion usage`: what the model calls cost, from the journal.
async fn usage_report(
    query: commands::UsageQuery<'_>,
    pg: &PgConfig,
    characters: &CharactersConfig,
) -> anyhow::Result<()> {
    let report = commands::usage(pg, &characters.dir, query)
        .await
        .context("reading the journal's model calls (run `companion migrate` first)")?;
    print!("{report}");
    Ok(())
}

/// `companion ingest`: articles into the knowledge table.
async fn ingest(
    path: &std::path::Path,
    collection: Option<&str>,
    pg: &PgConfig,
    embed: &EmbedSettings,
    rag: &RagConfig,
) -> anyhow::Result<()> {
    let r = commands::ingest(pg, embed, rag, path, collection)
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
    Ok(())
}

/// `companion report crisis`: the year's crisis log, for the annual report.
async fn crisis_report(year: Option<i32>, json: bool, pg: &PgConfig) -> anyhow::Result<()> {
    let year = year.unwrap_or_else(|| chrono::Datelike::year(&chrono::Utc::now()));
    let report = commands::crisis_report(pg, year, json)
        .await
        .context("reading the crisis log (run `companion migrate` first)")?;
    print!("{report}");
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
