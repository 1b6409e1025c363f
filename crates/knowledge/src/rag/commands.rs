//! The operator commands of the knowledge base: `companion embed` and `companion ingest`.

use std::path::Path;

use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::{
    EmbedConfig, EmbedError, Embedder, Role,
    chunk::ChunkConfig,
    ingest::{self, IngestError, IngestTotals},
};
use crate::{
    config::{EmbedSettings, PgConfig, RagConfig},
    store::Pg,
};

/// Lines read from stdin before they are embedded together.
const EMBED_LINES_PER_BATCH: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum RagCommandError {
    #[error(transparent)]
    Embed(#[from] EmbedError),
    #[error(transparent)]
    Ingest(#[from] IngestError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

#[derive(Serialize)]
struct EmbeddedLine<'a> {
    text: &'a str,
    embedding: &'a [f32],
}

/// Reads lines of text from stdin and writes `{"text":…, "embedding":[…]}` per line to stdout, each read
/// as `role`. Lines already buffered are embedded together (up to 64); a lone line is answered at once.
pub async fn embed_stdin(config: &EmbedSettings, role: Role) -> Result<usize, RagCommandError> {
    let embedder = Embedder::load(&EmbedConfig::from_settings(config))?;
    let mut input = BufReader::new(tokio::io::stdin());
    let mut out = tokio::io::BufWriter::new(tokio::io::stdout());
    let mut total = 0;
    loop {
        let mut batch = Vec::with_capacity(EMBED_LINES_PER_BATCH);
        let mut eof = false;
        loop {
            let mut line = String::new();
            if input.read_line(&mut line).await? == 0 {
                eof = true;
                break;
            }
            batch.push(line.trim_end_matches(['\n', '\r']).to_owned());
            if batch.len() >= EMBED_LINES_PER_BATCH || !input.buffer().contains(&b'\n') {
                break;
            }
        }
        if !batch.is_empty() {
            let texts: Vec<&str> = batch.iter().map(String::as_str).collect();
            let vectors = embedder.embed(role, &texts).await?;
            for (text, embedding) in batch.iter().zip(&vectors) {
                let mut json =
                    serde_json::to_vec(&EmbeddedLine { text, embedding }).expect("serialisable");
                json.push(b'\n');
                out.write_all(&json).await?;
            }
            total += batch.len();
            out.flush().await?;
        }
        if eof {
            return Ok(total);
        }
    }
}

/// Ingests a folder or JSON-lines file into the knowledge base.
pub async fn ingest_path(
    pg: &PgConfig,
    embed: &EmbedSettings,
    rag: &RagConfig,
    path: &Path,
    collection: Option<&str>,
) -> Result<IngestTotals, RagCommandError> {
    let articles = ingest::read_articles(path, collection)?;
    let embedder = Embedder::load(&EmbedConfig::from_settings(embed))?;
    let pg = Pg::connect(pg).await?;
    let cfg = ChunkConfig {
        max_tokens: rag.chunk_tokens,
        overlap: rag.chunk_overlap,
    };
    Ok(ingest::ingest(&pg.pool, &embedder, &articles, cfg, true).await?)
}
