//! The operations commands of the `companion` binary: each takes the settings it needs, connects what
//! it needs and returns what the command prints, so `main` only parses the command line and reports.

use std::path::Path;

pub use crate::memory::MemoryError;
pub use crate::rag::{commands::RagCommandError, ingest::Report as IngestReport};
pub use crate::replay::{ReplayArgs, ReplayError, Summary as ReplaySummary};
pub use crate::usage::Query as UsageQuery;
use crate::{
    app::{Components, SetupError, TurnSections},
    bus::{Bus, BusError},
    config::{ConsumerConfig, EmbedSettings, MemoryConfig, NatsConfig, PgConfig, RagConfig},
    store::{Pg, StoreError},
};

/// `companion migrate`: the service's schema, up to date.
pub async fn migrate(pg: &PgConfig) -> Result<(), StoreError> {
    Pg::connect(pg).await?.migrate().await
}

/// `companion provision`: the streams and consumers, one line per thing made or found.
pub async fn provision(
    nats: &NatsConfig,
    consumer: &ConsumerConfig,
) -> Result<Vec<String>, BusError> {
    Bus::connect(nats).await?.provision(consumer).await
}

/// Why `companion replay` could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayCommandError {
    #[error("connecting for the replay: {0}")]
    Setup(#[from] SetupError),
    #[error(transparent)]
    Replay(#[from] ReplayError),
}

/// `companion replay`: the worker's parts, then the selected events again.
pub async fn replay(
    sections: TurnSections<'_>,
    args: &ReplayArgs,
) -> Result<ReplaySummary, ReplayCommandError> {
    let components = Components::connect(sections).await?;
    Ok(crate::replay::replay_events(components.replayer().into(), args).await?)
}

/// `companion memory`: what companions remember about a user, as text.
pub async fn memory(
    pg: &PgConfig,
    config: &MemoryConfig,
    characters_dir: &Path,
    user: &str,
    bot: Option<&str>,
) -> Result<String, MemoryError> {
    crate::memory::show::report(pg, config, characters_dir, user, bot).await
}

/// `companion usage`: what the model calls cost, from the journal, as text.
pub async fn usage(
    pg: &PgConfig,
    characters_dir: &Path,
    query: UsageQuery<'_>,
) -> Result<String, StoreError> {
    crate::usage::report(pg, characters_dir, query).await
}

/// `companion ingest`: articles into the knowledge table.
pub async fn ingest(
    pg: &PgConfig,
    embed: &EmbedSettings,
    rag: &RagConfig,
    path: &Path,
    collection: Option<&str>,
) -> Result<IngestReport, RagCommandError> {
    crate::rag::commands::ingest_path(pg, embed, rag, path, collection).await
}

/// `companion embed`: one vector per line of stdin to stdout; the count of lines.
pub async fn embed(config: &EmbedSettings) -> Result<usize, RagCommandError> {
    crate::rag::commands::embed_stdin(config).await
}

/// `companion report crisis`: the year's crisis log (text, or JSON), for the annual report.
pub async fn crisis_report(pg: &PgConfig, year: i32, json: bool) -> Result<String, StoreError> {
    let rows = Pg::connect(pg).await?.crisis_year(year).await?;
    Ok(crate::report::crisis(year, &rows, json))
}
