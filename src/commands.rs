//! The operations commands of the `companion` binary: each takes the settings it needs, connects what
//! it needs and returns what the command prints, so `main` only parses the command line and reports.

/// `companion explain`: the story of one message's job, from the journal, as text or JSON.
pub use crate::explain::{ExplainError, Request as ExplainRequest, explain};
/// `companion memory`: what companions remember about a user, as text.
pub use crate::memory::report as memory;
/// `companion ingest` and `companion embed`: articles into the knowledge table; one vector per line of
/// stdin to stdout.
pub use crate::rag::{embed_stdin as embed, ingest_path as ingest};
/// `companion ingest --reembed`: every stored vector of another model computed again.
pub use crate::reembed::{ReembedError, Reembedded, reembed};
/// `companion usage`: what the model calls cost, from the journal, as text.
pub use crate::usage::{Query as UsageQuery, report as usage};

pub use crate::memory::MemoryError;
/// How `companion embed` reads its lines.
pub use crate::rag::Role as EmbedRole;
pub use crate::rag::{IngestTotals as IngestReport, RagCommandError};
pub use crate::replay::{ReplayArgs, ReplayError, Summary as ReplaySummary};
pub use crate::safety::LinesError;
use crate::{
    bus::{Bus, BusError},
    config::{Config, ConsumerConfig, NatsConfig, PgConfig},
    startup::{App, SetupError},
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
    config: &Config,
    args: &ReplayArgs,
) -> Result<ReplaySummary, ReplayCommandError> {
    let app = App::build(config).await?;
    Ok(crate::replay::replay_events(app.replayer().into(), args).await?)
}

/// `companion report crisis-lines`: the crisis lines configured (built in, or the file) with their
/// evidence, those due for review as of `today` first.
pub fn crisis_lines_report(
    safety: &crate::config::SafetyConfig,
    today: chrono::NaiveDate,
    json: bool,
) -> Result<String, LinesError> {
    let loaded = crate::safety::Safety::load(safety)?;
    Ok(crate::crisis_report::crisis_lines(
        &loaded.lines,
        today,
        safety.crisis_lines_review_days,
        json,
    ))
}

/// `companion report crisis`: the year's crisis log (text, or JSON), for the annual report.
pub async fn crisis_report(pg: &PgConfig, year: i32, json: bool) -> Result<String, StoreError> {
    let rows = Pg::connect(pg).await?.crisis_year(year).await?;
    Ok(crate::crisis_report::crisis(year, &rows, json))
}
