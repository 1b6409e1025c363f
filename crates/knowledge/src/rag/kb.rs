//! The knowledge base in PostgreSQL (`kb_articles`, `kb_chunks` with pgvector): write an article's
//! chunks, look up its content hash, and search a set of collections by cosine similarity. Every chunk
//! records the model that embedded it (`kb_chunks.model`), and a search reads only the chunks of its
//! query's model: vectors of two models are never compared.

use pgvector::Vector;
use sqlx::Row;

use crate::store::Pool;
use crate::store::StoreError;

/// An article as stored, without its chunks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArticleMeta {
    pub collection: String,
    pub key: String,
    pub title: String,
    pub source_url: Option<String>,
    pub published: Option<String>,
    pub content_hash: String,
}

/// One search hit.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
pub struct Hit {
    /// The chunk's `kb_chunks.id`.
    pub(crate) id: i64,
    pub collection: String,
    pub(crate) title: String,
    pub(crate) source_url: Option<String>,
    pub(crate) content: String,
    /// Cosine similarity to the query (1 = same direction).
    pub(crate) score: f32,
}

/// What is stored of an article: its content hash, and whether every chunk of it is `model`'s (an
/// article embedded by another model is written again even when its content is unchanged). None when
/// the article is not stored.
pub(crate) async fn stored(
    pool: &Pool,
    collection: &str,
    key: &str,
    model: &str,
) -> Result<Option<(String, bool)>, StoreError> {
    let row = sqlx::query(
        "SELECT a.content_hash,
                NOT EXISTS (SELECT 1 FROM kb_chunks c WHERE c.article_id = a.id AND c.model <> $3) AS current
         FROM kb_articles a WHERE a.collection = $1 AND a.key = $2",
    )
    .bind(collection)
    .bind(key)
    .bind(model)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| (r.get("content_hash"), r.get("current"))))
}

/// Writes an article and replaces all its chunks, in one transaction.
pub async fn replace_article(
    pool: &Pool,
    article: &ArticleMeta,
    chunks: &[String],
    embeddings: Vec<Vec<f32>>,
    model: &str,
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    let id: i64 = sqlx::query(
        "INSERT INTO kb_articles (collection, key, title, source_url, published, content_hash)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (collection, key) DO UPDATE SET
            title = EXCLUDED.title, source_url = EXCLUDED.source_url,
            published = EXCLUDED.published, content_hash = EXCLUDED.content_hash, updated_at = now()
         RETURNING id",
    )
    .bind(&article.collection)
    .bind(&article.key)
    .bind(&article.title)
    .bind(&article.source_url)
    .bind(&article.published)
    .bind(&article.content_hash)
    .fetch_one(&mut *tx)
    .await?
    .get("id");
    sqlx::query("DELETE FROM kb_chunks WHERE article_id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let ords: Vec<i32> = (0..chunks.len() as i32).collect();
    let vectors: Vec<Vector> = embeddings.into_iter().map(Vector::from).collect();
    sqlx::query(
        "INSERT INTO kb_chunks (article_id, collection, ord, content, embedding, model)
         SELECT $1, $2, o, c, e, $6 FROM UNNEST($3::int[], $4::text[], $5::vector[]) AS t(o, c, e)",
    )
    .bind(id)
    .bind(&article.collection)
    .bind(&ords)
    .bind(chunks)
    .bind(&vectors)
    .bind(model)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The `k` chunks of `collections` most similar to `query` (a vector of `model`), best first.
pub async fn search(
    pool: &Pool,
    collections: &[String],
    query: &[f32],
    k: i64,
    model: &str,
) -> Result<Vec<Hit>, StoreError> {
    if collections.is_empty() || k <= 0 {
        return Ok(Vec::new());
    }
    // Filtered HNSW scans keep going until k rows pass the collection filter (pgvector ≥ 0.8): every
    // connection of the store's pool starts with `hnsw.iterative_scan = relaxed_order` (`Pg::connect`),
    // so this is one statement, outside any transaction.
    let rows = sqlx::query(
        "SELECT c.id, c.collection, a.title, a.source_url, c.content,
                (1 - (c.embedding <=> $1))::real AS score
         FROM (SELECT id, article_id, collection, content, embedding FROM kb_chunks
               WHERE collection = ANY($2) AND model = $4 ORDER BY embedding <=> $1 LIMIT $3) c
         JOIN kb_articles a ON a.id = c.article_id",
    )
    .bind(Vector::from(query.to_vec()))
    .bind(collections)
    .bind(k)
    .bind(model)
    .fetch_all(pool)
    .await?;
    let mut hits: Vec<Hit> = rows
        .into_iter()
        .map(|r| Hit {
            id: r.get("id"),
            collection: r.get("collection"),
            title: r.get("title"),
            source_url: r.get("source_url"),
            content: r.get("content"),
            score: r.get("score"),
        })
        .collect();
    // relaxed_order may return rows slightly out of order.
    hits.sort_by(|a, b| b.score.total_cmp(&a.score));
    Ok(hits)
}

/// [`search`] as a ride of the history's statement (`store::Rides`), in one statement with it: the
/// same query over `$5` (the vector, as `real[]`) and the keys `kb_collections`, `kb_k` and `kb_model` of
/// `$4` ([`search_ride_args`]); its value the hits as a JSON array ([`ridden_hits`]).
pub(crate) const SEARCH_RIDE: &str = "(SELECT coalesce(jsonb_agg(jsonb_build_object(
        'id', c.id, 'collection', c.collection, 'title', a.title, 'source_url', a.source_url,
        'content', c.content, 'score', (1 - (c.embedding <=> $5::real[]::vector))::real)), '[]'::jsonb)
    FROM (SELECT id, article_id, collection, content, embedding FROM kb_chunks
          WHERE collection = ANY(ARRAY(SELECT jsonb_array_elements_text($4 -> 'kb_collections')))
            AND model = $4 ->> 'kb_model'
          ORDER BY embedding <=> $5::real[]::vector LIMIT ($4 ->> 'kb_k')::bigint) c
    JOIN kb_articles a ON a.id = c.article_id)";

/// The arguments [`SEARCH_RIDE`] reads from `$4`.
pub(crate) fn search_ride_args(
    collections: &[String],
    k: i64,
    model: &str,
) -> serde_json::Map<String, serde_json::Value> {
    let mut args = serde_json::Map::new();
    args.insert("kb_collections".into(), collections.into());
    args.insert("kb_k".into(), k.into());
    args.insert("kb_model".into(), model.into());
    args
}

/// The hits of [`SEARCH_RIDE`]'s value, best first (as [`search`] gives them).
pub(crate) fn ridden_hits(value: serde_json::Value) -> Result<Vec<Hit>, serde_json::Error> {
    let mut hits: Vec<Hit> = serde_json::from_value(value)?;
    hits.sort_by(|a, b| b.score.total_cmp(&a.score));
    Ok(hits)
}

/// Articles and chunks stored (for the tests and the bench).
#[cfg(any(test, feature = "testing"))]
pub async fn counts(pool: &Pool) -> Result<(i64, i64), StoreError> {
    let row = sqlx::query(
        "SELECT (SELECT count(*) FROM kb_articles) AS a, (SELECT count(*) FROM kb_chunks) AS c",
    )
    .fetch_one(pool)
    .await?;
    Ok((row.get("a"), row.get("c")))
}

/// Chunks embedded by a model other than `model`: retrieval leaves them out until they are embedded
/// again.
pub async fn stale_chunks(pool: &Pool, model: &str) -> Result<i64, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM kb_chunks WHERE model <> $1")
            .bind(model)
            .fetch_one(pool)
            .await?,
    )
}

/// A chunk to embed again: its id, its article's title and its text.
#[derive(Clone, Debug)]
pub(crate) struct StaleChunk {
    pub id: i64,
    pub title: String,
    pub content: String,
}

/// The next chunks after id `after` (in id order) embedded by another model than `model`, at most
/// `limit`; with the id to continue after (none: the table is done).
pub(crate) async fn next_stale(
    pool: &Pool,
    model: &str,
    after: i64,
    limit: i64,
) -> Result<(Vec<StaleChunk>, Option<i64>), StoreError> {
    let rows = sqlx::query(
        "SELECT c.id, a.title, c.content, c.model <> $1 AS stale
         FROM kb_chunks c JOIN kb_articles a ON a.id = c.article_id
         WHERE c.id > $2 ORDER BY c.id LIMIT $3",
    )
    .bind(model)
    .bind(after)
    .bind(limit.max(1))
    .fetch_all(pool)
    .await?;
    let next = rows.last().map(|r| r.get::<i64, _>("id"));
    let stale = rows
        .iter()
        .filter(|r| r.get::<bool, _>("stale"))
        .map(|r| StaleChunk {
            id: r.get("id"),
            title: r.get("title"),
            content: r.get("content"),
        })
        .collect();
    Ok((stale, next))
}

/// Stores the new vectors of chunks (`model`'s), in one statement: a chunk already moved over, or
/// replaced meanwhile by a new ingest, is left as it is.
pub(crate) async fn set_vectors(
    pool: &Pool,
    ids: &[i64],
    vectors: Vec<Vec<f32>>,
    model: &str,
) -> Result<u64, StoreError> {
    let vectors: Vec<Vector> = vectors.into_iter().map(Vector::from).collect();
    Ok(sqlx::query(
        "UPDATE kb_chunks c SET embedding = t.e, model = $3
         FROM UNNEST($1::bigint[], $2::vector[]) AS t(id, e)
         WHERE c.id = t.id AND c.model <> $3",
    )
    .bind(ids)
    .bind(&vectors)
    .bind(model)
    .execute(pool)
    .await?
    .rows_affected())
}
