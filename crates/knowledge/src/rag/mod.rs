//! Retrieval-augmented generation: local sentence embeddings ([`embed`]), a pgvector knowledge base
//! ([`kb`]) filled by `companion ingest` ([`ingest`], [`chunk`]), and the retrieval each turn makes
//! ([`Retriever`]).

mod chunk;
mod commands;
mod embed;
mod ingest;
mod kb;
mod query;
mod tokens;
mod unigram;

use std::sync::Arc;

use tracing::{Instrument, info_span, warn};

pub use commands::{RagCommandError, embed_stdin, ingest_path};
pub use embed::{EMBED_BATCH, EmbedConfig, EmbedError, Embedder, Embedding, Encoder, Role, Scores};
pub use ingest::{IngestError, IngestTotals, reembed};
pub use kb::{Hit, stale_chunks};
// Which tokenizer an encoder reads, and the tokenizers' errors, which an embedder's error carries.
pub use {
    tokens::{Kind as TokenizerKind, TokenizerError},
    unigram::UnigramError,
};

// What the tests and the dev tooling reach below the worker's API: the chunker, ingest by article, the
// knowledge base's own calls, the vector helpers, the query rules and the tokenizers the parity checks
// compare.
#[cfg(any(test, feature = "testing"))]
pub use {
    chunk::{ChunkConfig, chunk, count_tokens},
    embed::{DIM, EmbedCounts, MAX_TOKENS, cosine, normalize as normalize_vector},
    ingest::{Article, Ingested, chunk_article, ingest, ingest_article, read_articles},
    kb::{ArticleMeta, counts as kb_counts, replace_article, search as kb_search},
    query::{needs_no_knowledge, normalize as normalize_query},
    tokens::Tokens,
    unigram::{BOS, EOS, UNK, Unigram},
};

use crate::store::Pool;
use crate::{
    config::{EmbedSettings, RagConfig},
    store::StoreError,
    timing::{Stage, stage},
};

#[derive(Debug, thiserror::Error)]
pub enum RetrieveError {
    #[error(transparent)]
    Embed(#[from] EmbedError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A retrieved knowledge chunk, as the prompt shows it.
#[derive(Clone, Debug)]
pub struct KnowledgeSnippet {
    /// The chunk's `kb_chunks.id`.
    pub id: i64,
    pub title: String,
    pub source_url: Option<String>,
    pub text: String,
    pub score: f32,
}

/// Loads the embedder for the worker; when the model or runtime is missing, warns once and returns
/// `None` so the worker answers without knowledge.
pub fn load_embedder(config: &EmbedSettings) -> Option<Arc<Embedder>> {
    let cfg = EmbedConfig::from_settings(config);
    match Embedder::load(&cfg) {
        Ok(e) => {
            tracing::info!(
                model = %cfg.model_path().display(),
                threads = cfg.threads,
                max_batch = cfg.max_batch,
                window_ms = cfg.window.as_millis() as u64,
                "embedder ready"
            );
            Some(e)
        }
        Err(e) => {
            warn!(
                error = %e,
                "the embedder could not be loaded: the crisis screen's learned layer reads the \
                 messages' n-grams only (a weaker screen: it refers on its own no more), and knowledge \
                 retrieval, memory recall and a group's fit are off"
            );
            None
        }
    }
}

/// The chunks of `collections` above `threshold` most similar to `text`, best first, at most `top_k`.
#[cfg(any(test, feature = "testing"))]
pub async fn retrieve(
    pool: &Pool,
    embedder: &Embedder,
    collections: &[String],
    text: &str,
    threshold: f32,
    top_k: i64,
) -> Result<Vec<KnowledgeSnippet>, RetrieveError> {
    if collections.is_empty() || text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let query = stage(Stage::Embed, embedder.embed_one(Role::Query, text)).await?;
    search(
        pool,
        collections,
        &query,
        threshold,
        top_k,
        embedder.model(),
    )
    .await
}

/// The chunks of `collections` above `threshold` nearest to the vector `query` (`model`'s), best first.
pub(crate) async fn search(
    pool: &Pool,
    collections: &[String],
    query: &[f32],
    threshold: f32,
    top_k: i64,
    model: &str,
) -> Result<Vec<KnowledgeSnippet>, RetrieveError> {
    let hits = stage(
        Stage::Retrieve,
        kb::search(pool, collections, query, top_k, model),
    )
    .await?;
    Ok(above(hits, threshold))
}

/// The snippets of the hits scored at or above `threshold`, in their order.
fn above(hits: Vec<kb::Hit>, threshold: f32) -> Vec<KnowledgeSnippet> {
    hits.into_iter()
        .filter(|h| h.score >= threshold)
        .map(|h| KnowledgeSnippet {
            id: h.id,
            title: h.title,
            source_url: h.source_url,
            text: h.content,
            score: h.score,
        })
        .collect()
}

/// The knowledge a turn gets: the embedder (when installed), the knowledge base and the bounds.
#[derive(Clone)]
pub struct Retriever {
    pool: Pool,
    /// `None` when the model is not installed: turns go without knowledge.
    pub(crate) embedder: Option<Arc<Embedder>>,
    threshold: f32,
    top_k: i64,
    /// Vectors of texts embedded lately.
    cache: Arc<query::VectorCache>,
    skip_contentless: bool,
}

impl Retriever {
    pub fn new(pool: Pool, embedder: Option<Arc<Embedder>>, config: &RagConfig) -> Self {
        // The configured one, else what the encoder's scale calls related.
        let threshold = config
            .threshold
            .unwrap_or(Encoder::of(embedder.as_deref()).scores.knowledge);
        Self {
            pool,
            embedder,
            threshold,
            top_k: config.top_k,
            cache: Arc::new(query::VectorCache::new(config.query_cache)),
            skip_contentless: config.skip_contentless,
        }
    }

    /// The cache key of `text`; none when it has nothing to look up (empty, or no content word).
    fn query_key(&self, text: &str) -> Option<String> {
        let key = query::normalize(text);
        let nothing = key.is_empty() || (self.skip_contentless && query::needs_no_knowledge(&key));
        (!nothing).then_some(key)
    }

    /// The query vector for `text`: from the cache, or from the model (then cached); `None` when the
    /// message has nothing to look up.
    async fn query_vector(
        &self,
        embedder: &Embedder,
        text: &str,
    ) -> Result<Option<(Arc<Vec<f32>>, query::Lookup)>, RetrieveError> {
        let Some(key) = self.query_key(text) else {
            return Ok(None);
        };
        if let Some(v) = self.cache.get(&key) {
            return Ok(Some((v, query::Lookup::Cached)));
        }
        let v = Arc::new(stage(Stage::Embed, embedder.embed_one(Role::Query, text)).await?);
        self.cache.put(key, v.clone());
        Ok(Some((v, query::Lookup::Embedded)))
    }

    /// The embedding of a user message at admission (for the crisis screen's learned layer), cached so
    /// the turn's retrieval of the same text runs no model, or of a reply (for the output check's vector
    /// head, behind its gate); none without the model, for a message with no
    /// content word (an acknowledgement, a laugh: the n-grams decide alone), or when embedding fails
    /// (logged).
    pub async fn vector(&self, text: &str) -> Option<Arc<Vec<f32>>> {
        let embedder = self.embedder.as_deref()?;
        match self.query_vector(embedder, text).await {
            Ok(v) => v.map(|(v, how)| {
                if how == query::Lookup::Embedded {
                    crate::timing::note_knowledge(how.name());
                }
                v
            }),
            Err(e) => {
                warn!(error = %e, "cannot embed a message for the safety checks (a user message for the crisis screen, a reply for the output check); the rules and the n-grams decide");
                None
            }
        }
    }

    /// Cosine similarity of `text` to each of `profiles` (e.g. the companions of a group, to pick the
    /// one a message fits best). Profile vectors are cached like query vectors. `None` when the model
    /// is not installed, the text has nothing to look up, or embedding fails (logged).
    pub async fn similarities(&self, text: &str, profiles: &[String]) -> Option<Vec<f32>> {
        let embedder = self.embedder.as_deref()?;
        let result = async {
            let Some((query, _)) = self.query_vector(embedder, text).await? else {
                return Ok(None);
            };
            let mut scores = Vec::with_capacity(profiles.len());
            for p in profiles {
                let key = format!("profile:{}", query::normalize(p));
                let v = match self.cache.get(&key) {
                    Some(v) => v,
                    None => {
                        // A symmetric comparison: both sides are read as queries.
                        let v = Arc::new(embedder.embed_one(Role::Query, p).await?);
                        self.cache.put(key, v.clone());
                        v
                    }
                };
                scores.push(embed::cosine(&query, &v));
            }
            Ok::<_, RetrieveError>(Some(scores))
        };
        match result.await {
            Ok(scores) => scores,
            Err(e) => {
                warn!(error = %e, "cannot embed for the fit of a group message; going without");
                None
            }
        }
    }

    /// The knowledge of `collections` for `text`; never fails the turn (an error is logged and gives
    /// no knowledge). The span `rag.retrieve` (a child of the turn's span) records the hits and scores.
    pub async fn for_turn(&self, collections: &[String], text: &str) -> Vec<KnowledgeSnippet> {
        if collections.is_empty() {
            return Vec::new();
        }
        self.lookup(collections, text).await.0
    }

    /// [`Retriever::for_turn`], and the message's vector (when it has content to look up and the model
    /// is installed), which long-term memory's recall uses instead of running the model again.
    pub async fn lookup(
        &self,
        collections: &[String],
        text: &str,
    ) -> (Vec<KnowledgeSnippet>, Option<Arc<Vec<f32>>>) {
        let Some(embedder) = self.embedder.as_deref() else {
            return (Vec::new(), None);
        };
        let span = info_span!(
            "rag.retrieve",
            otel.name = "retrieval",
            collections = %collections.join(","),
            threshold = self.threshold,
            hits = tracing::field::Empty,
            scores = tracing::field::Empty,
        );
        let result = async {
            let Some((vector, how)) = self.query_vector(embedder, text).await? else {
                crate::timing::note_knowledge(query::Lookup::Skipped.name());
                return Ok((Vec::new(), None));
            };
            match how {
                query::Lookup::Cached => crate::timing::note_knowledge_cached(how.name()),
                how => crate::timing::note_knowledge(how.name()),
            }
            if collections.is_empty() {
                return Ok((Vec::new(), Some(vector)));
            }
            let model = embedder.model();
            let hits = search(
                &self.pool,
                collections,
                &vector,
                self.threshold,
                self.top_k,
                model,
            )
            .await?;
            Ok::<_, RetrieveError>((hits, Some(vector)))
        }
        .instrument(span.clone())
        .await;
        match result {
            Ok((snippets, vector)) => {
                record_hits(&span, &snippets);
                (snippets, vector)
            }
            Err(e) => {
                span.in_scope(
                    || warn!(error = %e, "knowledge retrieval failed; answering without it"),
                );
                (Vec::new(), None)
            }
        }
    }
}

/// A knowledge search that rides with another statement (`store::Rides`: the history's) instead of
/// one of its own: [`Retriever::ride`] gives it when the message's vector is known already, and
/// [`Retriever::ridden`] reads its value.
#[derive(Clone, Debug)]
pub struct SearchRide {
    /// An SQL expression of type jsonb over `$4` and `$5` ([`kb::SEARCH_RIDE`]).
    pub sql: &'static str,
    /// Its keys of `$4`.
    pub args: serde_json::Map<String, serde_json::Value>,
    /// `$5`: the message's vector, which long-term memory's recall reads too.
    pub vector: Arc<Vec<f32>>,
}

impl Retriever {
    /// The knowledge search of `text` in `collections` as a ride, when its vector is in the cache (a
    /// user message's was embedded at admission, for the crisis screen's learned layer). None when there
    /// is nothing to search (no collections, no model, a message with no content word) or when the
    /// vector would need the model: then [`Retriever::lookup`] embeds and searches in a statement of its
    /// own, as before.
    pub fn ride(&self, collections: &[String], text: &str) -> Option<SearchRide> {
        let embedder = self.embedder.as_deref()?;
        if collections.is_empty() || self.top_k <= 0 {
            return None;
        }
        let vector = self.cache.get(&self.query_key(text)?)?;
        crate::timing::note_knowledge_cached(query::Lookup::Cached.name());
        Some(SearchRide {
            sql: kb::SEARCH_RIDE,
            args: kb::search_ride_args(collections, self.top_k, embedder.model()),
            vector,
        })
    }

    /// The knowledge [`Retriever::ride`]'s search found, from its value in the statement it rode with
    /// (none: that statement gave no value): the snippets above the threshold, best first, as
    /// [`Retriever::for_turn`] gives them. Like a search of its own, a value that does not read gives no
    /// knowledge (logged), never a failed turn. The span `rag.retrieve` records the hits and scores.
    pub fn ridden(
        &self,
        collections: &[String],
        value: Option<serde_json::Value>,
    ) -> Vec<KnowledgeSnippet> {
        let span = info_span!(
            "rag.retrieve",
            otel.name = "retrieval",
            collections = %collections.join(","),
            threshold = self.threshold,
            ridden = true,
            hits = tracing::field::Empty,
            scores = tracing::field::Empty,
        );
        let hits = match value.map(kb::ridden_hits) {
            Some(Ok(hits)) => hits,
            Some(Err(e)) => {
                span.in_scope(|| warn!(error = %e, "the knowledge search's value does not read; answering without it"));
                return Vec::new();
            }
            None => {
                span.in_scope(|| {
                    warn!("the knowledge search rode with no value; answering without it")
                });
                return Vec::new();
            }
        };
        let snippets = above(hits, self.threshold);
        record_hits(&span, &snippets);
        snippets
    }
}

/// The hits of a `rag.retrieve` span and their scores.
fn record_hits(span: &tracing::Span, snippets: &[KnowledgeSnippet]) {
    let scores: Vec<String> = snippets
        .iter()
        .map(|s| format!("{:.3} {}", s.score, s.title))
        .collect();
    span.record("hits", snippets.len());
    span.record("scores", scores.join("; "));
    span.in_scope(|| tracing::debug!(hits = snippets.len(), "knowledge retrieved"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_model_disables_retrieval_instead_of_failing() {
        let mut config: EmbedSettings = crate::config::from_env().unwrap();
        config.model_dir = "/nonexistent/models".into();
        config.ort_dylib_path = "/nonexistent/libonnxruntime.so.1.31.1".into();
        assert!(load_embedder(&config).is_none());
        let err = Embedder::load(&EmbedConfig::from_settings(&config))
            .err()
            .unwrap();
        assert!(matches!(err, EmbedError::Missing(_)), "{err}");
        assert!(err.to_string().contains("deploy/local/models.sh"));
    }

    /// MiniLM's graph with e5's tokenizer reads ids past its vocabulary: refused at load, saying what
    /// to set, rather than failing at the first text.
    #[test]
    fn another_encoder_s_graph_is_refused_at_load() {
        let mut config: EmbedSettings = crate::config::from_env().unwrap();
        config.encoder = Encoder::E5_SMALL.name.into();
        config.model_file = Encoder::MINILM.fp32_file.into();
        let err = Embedder::load(&EmbedConfig::from_settings(&config))
            .err()
            .unwrap();
        assert!(matches!(err, EmbedError::WrongGraph { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("COMPANION_ENCODER=all-MiniLM-L6-v2"),
            "{err}"
        );
        config.model_file = Encoder::E5_SMALL.fp32_file.into();
        assert_eq!(
            EmbedConfig::from_settings(&config).graph_of_another_encoder(),
            None
        );
    }
}
