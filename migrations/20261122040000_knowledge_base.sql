-- Knowledge base for retrieval (RAG): articles and their embedded chunks, grouped in collections.
-- A companion reads the collections its character file lists in `knowledge` (Kaori: snowboarding,
-- Tony: skating, ...); collections can be shared between companions.
--
-- Data from the earlier `kaori_articles` / `kaori_chunks` tables moves in with collection
-- 'snowboarding' by re-running `companion ingest` on the articles (embeddings are recomputed by the
-- same model), or by the SQL import documented in deploy/local/knowledge/README.md.
CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE IF NOT EXISTS kb_articles (
    id           BIGSERIAL   PRIMARY KEY,
    collection   TEXT        NOT NULL,
    -- Stable identity of the article inside its collection (front-matter id, file path or URL):
    -- re-ingesting the same key replaces the article instead of adding a copy.
    key          TEXT        NOT NULL,
    title        TEXT        NOT NULL,
    source_url   TEXT,
    published    TEXT,
    -- SHA-256 of everything the chunks depend on (text, title, chunking settings):
    -- unchanged content is skipped on re-ingest.
    content_hash TEXT        NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (collection, key)
);

CREATE TABLE IF NOT EXISTS kb_chunks (
    id         BIGSERIAL   PRIMARY KEY,
    article_id BIGINT      NOT NULL REFERENCES kb_articles (id) ON DELETE CASCADE,
    -- Copied from the article so retrieval filters without a join.
    collection TEXT        NOT NULL,
    ord        INTEGER     NOT NULL,
    -- The whole chunk text, as put in the prompt.
    content    TEXT        NOT NULL,
    -- all-MiniLM-L6-v2, mean pooled and L2 normalised.
    embedding  vector(384) NOT NULL,
    UNIQUE (article_id, ord)
);
CREATE INDEX IF NOT EXISTS kb_chunks_collection ON kb_chunks (collection);
CREATE INDEX IF NOT EXISTS kb_chunks_embedding ON kb_chunks USING hnsw (embedding vector_cosine_ops);
