-- Long-term memory the user controls (docs/memory.md).

-- What a companion remembers about a user from their DM: one short statement each, with where it came
-- from. Never shared across users or companions; never from a group chat.
CREATE TABLE IF NOT EXISTS memory_facts (
    -- Derived from what wrote it (the extraction job and the fact's place in its answer, or the turn
    -- and the tool call of `remember`), so a retried or replayed write is the same row.
    id          TEXT        PRIMARY KEY,
    user_id     TEXT        NOT NULL,
    bot_id      TEXT        NOT NULL,
    -- name, level, stance, home_spot, sport, goal, injury, gear, like, fear, other.
    topic       TEXT        NOT NULL,
    fact        TEXT        NOT NULL CHECK (char_length(fact) BETWEEN 1 AND 300),
    -- The user messages (dm_messages ids) it was learned from: a fact whose every source is deleted goes.
    sources     TEXT[]      NOT NULL DEFAULT '{}',
    -- The companion that learned it, and how: `extracted` or `remembered` (the user asked).
    learned_by  TEXT        NOT NULL,
    how         TEXT        NOT NULL CHECK (how IN ('extracted', 'remembered')),
    learned_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- all-MiniLM-L6-v2 of `fact`; NULL when the embedding model is not installed.
    embedding   vector(384)
);
CREATE INDEX IF NOT EXISTS memory_facts_owner ON memory_facts (user_id, bot_id, learned_at DESC);
CREATE INDEX IF NOT EXISTS memory_facts_sources ON memory_facts USING gin (sources);

-- Per (user, companion): how far extraction has read the DM history, and the rolling summary of what
-- has left the history window.
CREATE TABLE IF NOT EXISTS memory_state (
    user_id            TEXT        NOT NULL,
    bot_id             TEXT        NOT NULL,
    -- bot_conversations.id of the last user message extraction has read.
    extracted_through  BIGINT      NOT NULL DEFAULT 0,
    -- bot_conversations.id of the last message the summary covers.
    summarized_through BIGINT      NOT NULL DEFAULT 0,
    summary            TEXT        NOT NULL DEFAULT '',
    -- The messages (dm_messages ids) the summary was written from: deleting one rebuilds it.
    summary_sources    TEXT[]      NOT NULL DEFAULT '{}',
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, bot_id)
);
CREATE INDEX IF NOT EXISTS memory_state_summary_sources ON memory_state USING gin (summary_sources);

-- Deletion that sticks: a deleted message or an erased user is checked at admission, at extraction and
-- in `replay`, so a redelivery or a replay cannot bring anything back. Ids only, never text.
CREATE TABLE IF NOT EXISTS tombstones (
    -- `message` (a dm_messages id) or `user` (an erased user's id).
    kind       TEXT        NOT NULL CHECK (kind IN ('message', 'user')),
    id         TEXT        NOT NULL,
    at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, id)
);
