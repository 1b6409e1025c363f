//! `companion ingest --reembed`: moves a database over to the configured embedding model. Every stored
//! vector records the model that computed it (knowledge chunks, remembered facts); retrieval and recall
//! read only the configured model's, so after a change of model they find nothing until this has run.
//! It embeds the other rows again, batch by batch, each batch committed on its own: idempotent (a second
//! run finds nothing to do) and resumable after a kill -9 (a run picks up the rows still of the other
//! model), with a progress line per batch.

use tracing::{info, warn};

use crate::{
    config::{EmbedSettings, PgConfig},
    memory::MemoryError,
    metrics::{Metric, Metrics},
    rag::{EmbedConfig, EmbedError, Embedder, IngestError},
    store::{Pg, StoreError},
};
use companion_store::store::Pool;

/// Why the re-embedding stopped (what was done before stays done).
#[derive(Debug, thiserror::Error)]
pub enum ReembedError {
    #[error(transparent)]
    Embed(#[from] EmbedError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("knowledge chunks: {0}")]
    Knowledge(#[from] IngestError),
    #[error("remembered facts: {0}")]
    Memory(#[from] MemoryError),
}

/// What a run moved over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reembedded {
    pub model: &'static str,
    pub chunks: u64,
    pub facts: u64,
}

/// Embeds again, `batch` rows at a time, every knowledge chunk and remembered fact that another model
/// embedded (and every fact kept without a vector), printing a progress line per batch.
pub async fn reembed(
    pg: &PgConfig,
    embed: &EmbedSettings,
    batch: usize,
) -> Result<Reembedded, ReembedError> {
    let embedder = Embedder::load(&EmbedConfig::from_settings(embed))?;
    let pg = Pg::connect(pg).await?;
    let model = embedder.model();
    let line = |what: &'static str| {
        move |done: u64, total: u64| println!("[reembed] {what}: {done}/{total} ({model})")
    };
    let chunks = crate::rag::reembed(&pg.pool, &embedder, batch, line("knowledge chunks")).await?;
    let facts =
        crate::memory::reembed(&pg.pool, &embedder, batch, line("remembered facts")).await?;
    Ok(Reembedded {
        model,
        chunks,
        facts,
    })
}

/// Stored vectors computed by another model than the worker's, by table (`kb_chunks`, `memory_facts`),
/// as of the worker's start: retrieval and recall leave them out until `companion ingest --reembed`.
pub(crate) const OTHER_MODEL: Metric = Metric::new(
    "companion_vectors_of_another_model",
    "Stored vectors computed by another model than the worker's, by table, as of its start: left out of retrieval and recall until `companion ingest --reembed`",
);

/// At a worker's start: says (a warning and [`OTHER_MODEL`]) when stored vectors were computed by
/// another model than `model`, which retrieval and recall then leave out rather than compare. A count
/// that cannot be read is logged and left out.
pub(crate) async fn check(pool: &Pool, model: &str, metrics: &Metrics) {
    let counts = tokio::try_join!(
        async {
            crate::rag::stale_chunks(pool, model)
                .await
                .map_err(|e| e.to_string())
        },
        async {
            crate::memory::stale_facts(pool, model)
                .await
                .map_err(|e| e.to_string())
        },
    );
    let (chunks, facts) = match counts {
        Ok(c) => c,
        Err(e) => {
            warn!(error = %e, "cannot count the stored vectors of another model");
            return;
        }
    };
    metrics.set_level(&OTHER_MODEL, &[("table", "kb_chunks")], chunks);
    metrics.set_level(&OTHER_MODEL, &[("table", "memory_facts")], facts);
    match chunks + facts {
        0 => info!(model, "every stored vector is the embedding model's"),
        _ => warn!(
            model,
            knowledge_chunks = chunks,
            remembered_facts = facts,
            "stored vectors were computed by another embedding model: retrieval and recall leave them \
             out (nothing rather than wrong matches) until `companion ingest --reembed` has run"
        ),
    }
}
