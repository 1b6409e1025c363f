//! `companion ingest`: reads articles (a folder of Markdown/text files with optional front matter, or a
//! JSON-lines file), chunks them with the model's tokenizer, embeds the chunks in batches and stores them.
//!
//! An article is identified by (collection, key). Its content hash covers the text, title, source, date
//! and chunking settings: an unchanged article is skipped, a changed one has its chunks replaced.
//!
//! The collection of an article: the `--collection` flag, else its front matter / JSON `collection`, else
//! the first folder under the ingested root (`knowledge/<collection>/article.md`).

use std::{
    io::{IsTerminal, Write},
    path::{Path, PathBuf},
};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{
    chunk::{self, ChunkConfig},
    embed::{EmbedError, Embedder, Role},
    kb::{self, ArticleMeta},
};
use crate::store::Pool;
use crate::store::StoreError;

/// Titles longer than this (in tokens) are not prefixed to the chunk text that is embedded.
const MAX_TITLE_PREFIX_TOKENS: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} line {line}: {message}")]
    BadLine {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error(
        "{0}: no collection (give --collection, a `collection:` front-matter line, or put it in a <collection>/ folder)"
    )]
    NoCollection(String),
    #[error(transparent)]
    Embed(#[from] EmbedError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One article to ingest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Article {
    pub collection: String,
    /// Stable identity inside the collection.
    pub key: String,
    pub title: String,
    pub source_url: Option<String>,
    pub published: Option<String>,
    pub text: String,
}

/// What happened to one article.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ingested {
    Added,
    Replaced,
    Unchanged,
}

/// Totals of one ingest run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IngestTotals {
    pub added: usize,
    pub replaced: usize,
    pub unchanged: usize,
    /// Chunks written by this run.
    pub chunks: usize,
}

#[derive(Deserialize)]
struct JsonArticle {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    collection: Option<String>,
    title: String,
    #[serde(alias = "content", alias = "body")]
    text: String,
    #[serde(default, alias = "url", alias = "source")]
    source_url: Option<String>,
    #[serde(default)]
    date: Option<String>,
}

/// Reads the articles of a folder (recursively: `.md`, `.markdown`, `.txt`) or of a `.jsonl` file.
pub fn read_articles(path: &Path, collection: Option<&str>) -> Result<Vec<Article>, IngestError> {
    if path.is_dir() {
        let mut files = Vec::new();
        walk(path, &mut files)?;
        files.sort();
        files
            .iter()
            .map(|f| {
                let text = read(f)?;
                let rel = f.strip_prefix(path).unwrap_or(f);
                parse_markdown(rel, &text, collection)
            })
            .collect()
    } else {
        let text = read(path)?;
        let mut out = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = |message: String| IngestError::BadLine {
                path: path.to_path_buf(),
                line: n + 1,
                message,
            };
            let a: JsonArticle = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
            let collection = collection
                .map(str::to_owned)
                .or(a.collection)
                .ok_or_else(|| {
                    IngestError::NoCollection(format!("{} line {}", path.display(), n + 1))
                })?;
            let key =
                a.id.or_else(|| a.source_url.clone())
                    .unwrap_or_else(|| a.title.clone());
            out.push(Article {
                collection,
                key,
                title: a.title,
                source_url: a.source_url,
                published: a.date,
                text: a.text,
            });
        }
        Ok(out)
    }
}

fn read(path: &Path) -> Result<String, IngestError> {
    std::fs::read_to_string(path).map_err(|source| IngestError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), IngestError> {
    let io = |source| IngestError::Io {
        path: dir.to_path_buf(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let p = entry.map_err(io)?.path();
        if p.is_dir() {
            walk(&p, out)?;
        } else if p
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "md" | "markdown" | "txt"))
            && p.file_name().is_some_and(|n| n != "README.md")
        {
            out.push(p);
        }
    }
    Ok(())
}

/// Parses `---` front matter (`key: value` lines: title, source_url/url/source, date, collection, id).
pub(crate) fn parse_markdown(
    rel: &Path,
    text: &str,
    collection: Option<&str>,
) -> Result<Article, IngestError> {
    let mut meta = std::collections::HashMap::new();
    let mut body = text;
    let trimmed = text.trim_start_matches('\u{feff}');
    if let Some(rest) = trimmed
        .strip_prefix("---\n")
        .or_else(|| trimmed.strip_prefix("---\r\n"))
        && let Some(end) = rest.find("\n---")
    {
        for line in rest[..end].lines() {
            if let Some((k, v)) = line.split_once(':') {
                let v = v.trim().trim_matches(|c| c == '"' || c == '\'');
                meta.insert(k.trim().to_ascii_lowercase(), v.to_owned());
            }
        }
        body = rest[end + 4..].trim_start_matches(['-', '\r', '\n']);
    }
    let mut body = body.trim().to_owned();
    let title = match meta.remove("title") {
        Some(t) => t,
        None => {
            // A leading `# Heading` is the title; else the file name.
            match body.strip_prefix("# ").map(|r| r.split_once('\n')) {
                Some(Some((h, rest))) => {
                    let h = h.trim().to_owned();
                    body = rest.trim().to_owned();
                    h
                }
                _ => rel
                    .file_stem()
                    .map(|s| s.to_string_lossy().replace(['-', '_'], " "))
                    .unwrap_or_default(),
            }
        }
    };
    let folder = rel
        .components()
        .next()
        .filter(|_| rel.components().count() > 1)
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    let collection = collection
        .map(str::to_owned)
        .or_else(|| meta.remove("collection"))
        .or(folder.clone())
        .ok_or_else(|| IngestError::NoCollection(rel.display().to_string()))?;
    let key = meta.remove("id").unwrap_or_else(|| {
        // The path under the collection folder, without extension.
        let mut p = rel.with_extension("");
        if let Some(f) = &folder
            && f == &collection
            && let Ok(stripped) = p.strip_prefix(f)
        {
            p = stripped.to_path_buf();
        }
        p.to_string_lossy().into_owned()
    });
    let source_url = meta
        .remove("source_url")
        .or_else(|| meta.remove("url"))
        .or_else(|| meta.remove("source"))
        .filter(|s| !s.is_empty());
    Ok(Article {
        collection,
        key,
        title,
        source_url,
        published: meta.remove("date").filter(|s| !s.is_empty()),
        text: body,
    })
}

/// The hash that decides whether an article must be re-chunked.
pub(crate) fn content_hash(a: &Article, cfg: ChunkConfig) -> String {
    let mut h = Sha256::new();
    for part in [
        "kb-v1",
        &a.title,
        a.source_url.as_deref().unwrap_or(""),
        a.published.as_deref().unwrap_or(""),
        &a.text,
        &format!("{}:{}", cfg.max_tokens, cfg.overlap),
    ] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The tokens a title takes before each chunk of its article (its own and the `: `); none when the
/// title is empty or too long to prefix.
fn title_prefix(embedder: &Embedder, title: &str) -> Result<Option<usize>, EmbedError> {
    let tokens = chunk::count_tokens(&embedder.tokenizer, title)? + 1;
    Ok((tokens <= MAX_TITLE_PREFIX_TOKENS && !title.is_empty()).then_some(tokens))
}

/// The text a chunk is embedded as: its article's title before it, when the title is prefixed.
fn embedded_as(title: &str, chunk: &str, prefixed: bool) -> String {
    match prefixed {
        true => format!("{title}: {chunk}"),
        false => chunk.to_owned(),
    }
}

/// Chunks an article and returns the chunk texts and the texts to embed (title prefixed).
pub fn chunk_article(
    embedder: &Embedder,
    a: &Article,
    cfg: ChunkConfig,
) -> Result<(Vec<String>, Vec<String>), EmbedError> {
    let prefix = title_prefix(embedder, &a.title)?;
    // What the encoder puts before a passage (e5's `passage: `) is read within the same bound.
    let role = chunk::count_tokens(
        &embedder.tokenizer,
        embedder.encoder().input(Role::Passage, "").trim_end(),
    )?;
    let reserved = prefix.unwrap_or(0) + role;
    let chunks = chunk::chunk(&embedder.tokenizer, &a.text, cfg, reserved)?;
    let inputs = chunks
        .iter()
        .map(|c| embedded_as(&a.title, c, prefix.is_some()))
        .collect();
    Ok((chunks, inputs))
}

/// Every stored chunk embedded by another model than `embedder`'s, embedded again as ingest embeds it
/// (the same chunk text, its title prefixed by the same rule) and stored with its new model, `batch`
/// chunks at a time. Each batch commits on its own, and a chunk already moved over is skipped, so a run
/// that is stopped (even by kill -9) is resumed by running it again, and a second run changes nothing.
/// `progress` hears (chunks done, chunks to do) after each batch. Returns the chunks moved over.
pub async fn reembed(
    pool: &Pool,
    embedder: &Embedder,
    batch: usize,
    mut progress: impl FnMut(u64, u64),
) -> Result<u64, IngestError> {
    let model = embedder.model();
    let total = kb::stale_chunks(pool, model).await?.max(0) as u64;
    let (mut done, mut after) = (0u64, 0i64);
    if total == 0 {
        return Ok(0);
    }
    loop {
        let (stale, next) = kb::next_stale(pool, model, after, batch.max(1) as i64).await?;
        if !stale.is_empty() {
            let mut inputs = Vec::with_capacity(stale.len());
            for c in &stale {
                let prefixed = title_prefix(embedder, &c.title)?.is_some();
                inputs.push(embedded_as(&c.title, &c.content, prefixed));
            }
            let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
            let vectors = embedder.embed(Role::Passage, &inputs).await?;
            let ids: Vec<i64> = stale.iter().map(|c| c.id).collect();
            done += kb::set_vectors(pool, &ids, vectors, model).await?;
            progress(done, total);
        }
        match next {
            Some(id) => after = id,
            None => return Ok(done),
        }
    }
}

/// Ingests one article: skipped when unchanged, else chunked, embedded and stored. Only the tests ingest
/// a single article; the command ingests in groups ([`ingest`]).
#[cfg(any(test, feature = "testing"))]
pub async fn ingest_article(
    pool: &Pool,
    embedder: &Embedder,
    a: &Article,
    cfg: ChunkConfig,
) -> Result<(Ingested, usize), IngestError> {
    let mut done = ingest_group(pool, embedder, &[a], cfg).await?;
    Ok(done.remove(0))
}

/// An article read against the store: unchanged, or chunked and waiting for its vectors.
enum Planned {
    Unchanged,
    Changed {
        hash: String,
        existed: bool,
        chunks: Vec<String>,
        inputs: Vec<String>,
    },
}

async fn plan(
    pool: &Pool,
    embedder: &Embedder,
    a: &Article,
    cfg: ChunkConfig,
) -> Result<Planned, IngestError> {
    let hash = content_hash(a, cfg);
    let existing = kb::stored(pool, &a.collection, &a.key, embedder.model()).await?;
    if existing
        .as_ref()
        .is_some_and(|(h, current)| *h == hash && *current)
    {
        return Ok(Planned::Unchanged);
    }
    let (chunks, inputs) = chunk_article(embedder, a, cfg)?;
    Ok(Planned::Changed {
        hash,
        existed: existing.is_some(),
        chunks,
        inputs,
    })
}

/// Ingests `group`: the changed articles' chunks are embedded in one call, then each article is stored.
/// One call for a fixed set of texts makes the vectors independent of timing: the int8 graph quantises
/// its activations over the whole run, so a text's vector moves slightly with the texts that share its
/// run, and articles embedded concurrently would meet in runs that differ from one ingest to the next.
async fn ingest_group(
    pool: &Pool,
    embedder: &Embedder,
    group: &[&Article],
    cfg: ChunkConfig,
) -> Result<Vec<(Ingested, usize)>, IngestError> {
    let planned =
        futures::future::try_join_all(group.iter().map(|a| plan(pool, embedder, a, cfg))).await?;
    let inputs: Vec<&str> = planned
        .iter()
        .flat_map(|p| match p {
            Planned::Changed { inputs, .. } => inputs.as_slice(),
            Planned::Unchanged => &[],
        })
        .map(String::as_str)
        .collect();
    let mut vectors = match inputs.is_empty() {
        true => Vec::new(),
        false => embedder.embed(Role::Passage, &inputs).await?,
    }
    .into_iter();
    let mut done = Vec::with_capacity(group.len());
    for (a, p) in group.iter().zip(planned) {
        let Planned::Changed {
            hash,
            existed,
            chunks,
            inputs,
        } = p
        else {
            done.push((Ingested::Unchanged, 0));
            continue;
        };
        let embeddings: Vec<Vec<f32>> = vectors.by_ref().take(inputs.len()).collect();
        let meta = ArticleMeta {
            collection: a.collection.clone(),
            key: a.key.clone(),
            title: a.title.clone(),
            source_url: a.source_url.clone(),
            published: a.published.clone(),
            content_hash: hash,
        };
        kb::replace_article(pool, &meta, &chunks, embeddings, embedder.model()).await?;
        let outcome = match existed {
            true => Ingested::Replaced,
            false => Ingested::Added,
        };
        done.push((outcome, chunks.len()));
    }
    Ok(done)
}

/// Articles whose chunks are embedded in one call ([`ingest_group`]).
const ARTICLES_PER_GROUP: usize = 8;

/// Ingests many articles, [`ARTICLES_PER_GROUP`] at a time, printing a progress line on a terminal and
/// plain lines otherwise. When two articles share a collection and key, the last one wins.
pub async fn ingest(
    pool: &Pool,
    embedder: &Embedder,
    articles: &[Article],
    cfg: ChunkConfig,
    progress: bool,
) -> Result<IngestTotals, IngestError> {
    let mut seen = std::collections::HashSet::new();
    let mut unique: Vec<&Article> = articles
        .iter()
        .rev()
        .filter(|a| seen.insert((a.collection.as_str(), a.key.as_str())))
        .collect();
    unique.reverse();
    let mut report = IngestTotals::default();
    let tty = progress && std::io::stderr().is_terminal();
    let total = unique.len();
    let mut done = 0;
    for group in unique.chunks(ARTICLES_PER_GROUP) {
        let outcomes = ingest_group(pool, embedder, group, cfg).await?;
        for (a, (outcome, n)) in group.iter().zip(outcomes) {
            done += 1;
            match outcome {
                Ingested::Added => report.added += 1,
                Ingested::Replaced => report.replaced += 1,
                Ingested::Unchanged => report.unchanged += 1,
            }
            report.chunks += n;
            if tty {
                eprint!("\r\x1b[2K[{done}/{total}] {}/{}", a.collection, a.key);
                let _ = std::io::stderr().flush();
            } else if progress {
                let what = match outcome {
                    Ingested::Added => "added",
                    Ingested::Replaced => "replaced",
                    Ingested::Unchanged => "unchanged",
                };
                println!("{what} {}/{} ({n} chunks)", a.collection, a.key);
            }
        }
    }
    if tty {
        eprintln!();
    }
    Ok(report)
}
