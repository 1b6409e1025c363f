//! The knowledge base in PostgreSQL (`kb_articles`, `kb_chunks` with pgvector): write an article's
//! chunks, look up its content hash, and search a set of collections by cosine similarity.

use pgvector::Vector;
use sqlx::{PgPool, Row};

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
#[derive(Clone, Debug, PartialEq)]
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

/// The stored content hash of an article, if it exists.
pub(crate) async fn content_hash(
    pool: &PgPool,
    collection: &str,
    key: &str,
) -> Result<Option<String>, StoreError> {
    let row =
        sqlx::query("SELECT content_hash FROM kb_articles WHERE collection = $1 AND key = $2")
            .bind(collection)
            .bind(key)
            .fetch_optional(pool)
            .await?;
    Ok(row.map(|r| r.get("content_hash")))
}

/// Writes an article and replaces all its chunks, in one transaction.
pub async fn replace_article(
    pool: &PgPool,
    article: &ArticleMeta,
    chunks: &[String],
    embeddings: Vec<Vec<f32>>,
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
        "INSERT INTO kb_chunks (article_id, collection, ord, content, embedding)
         SELECT $1, $2, o, c, e FROM UNNEST($3::int[], $4::text[], $5::vector[]) AS t(o, c, e)",
    )
    .bind(id)
    .bind(&article.collection)
    .bind(&ords)
    .bind(chunks)
    .bind(&vectors)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The `k` chunks of `collections` most similar to `query`, best first.
pub async fn search(
    pool: &PgPool,
    collections: &[String],
    query: &[f32],
    k: i64,
) -> Result<Vec<Hit>, StoreError> {
    if collections.is_empty() || k <= 0 {
        return Ok(Vec::new());
    }
    // Filtered HNSW scans keep going until k rows pass the collection filter (pgvector ≥ 0.8); set with
    // the BEGIN, in the same round trip.
    let mut tx = pool
        .begin_with("BEGIN; SET LOCAL hnsw.iterative_scan = relaxed_order")
        .await?;
    let rows = sqlx::query(
        "SELECT c.id, c.collection, a.title, a.source_url, c.content,
                (1 - (c.embedding <=> $1))::real AS score
         FROM (SELECT id, article_id, collection, content, embedding FROM kb_chunks
               WHERE collection = ANY($2) ORDER BY embedding <=> $1 LIMIT $3) c
         JOIN kb_articles a ON a.id = c.article_id",
    )
    .bind(Vector::from(query.to_vec()))
    .bind(collections)
    .bind(k)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
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

/// Articles and chunks stored (for the tests and the bench).
#[cfg(any(test, feature = "testing"))]
pub async fn counts(pool: &PgPool) -> Result<(i64, i64), StoreError> {
    let row = sqlx::query(
        "SELECT (SELECT count(*) FROM kb_articles) AS a, (SELECT count(*) FROM kb_chunks) AS c",
    )
    .fetch_one(pool)
    .await?;
    Ok((row.get("a"), row.get("c")))
}
