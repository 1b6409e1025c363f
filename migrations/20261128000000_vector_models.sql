-- Each stored vector records the model that computed it (issue 61): knowledge chunks and remembered facts.
-- A query compares vectors of one model only; `companion ingest --reembed` moves the rows of another
-- model over. Rows written before this migration, and by a worker that predates it, are MiniLM's.
ALTER TABLE kb_chunks ADD COLUMN IF NOT EXISTS model TEXT NOT NULL DEFAULT 'all-MiniLM-L6-v2';
-- Meaningful only where `embedding` is set.
ALTER TABLE memory_facts ADD COLUMN IF NOT EXISTS model TEXT NOT NULL DEFAULT 'all-MiniLM-L6-v2';
