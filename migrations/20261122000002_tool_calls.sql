-- Writes made by tools, counted per user over a rolling hour. One row per (event, tool call), so a retried
-- call is never counted twice; the count and insert run under a per-user advisory lock.
CREATE TABLE IF NOT EXISTS tool_writes (
    message_id   TEXT        NOT NULL,
    tool_call_id TEXT        NOT NULL,
    user_id      TEXT        NOT NULL,
    tool         TEXT        NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (message_id, tool_call_id)
);
CREATE INDEX IF NOT EXISTS tool_writes_by_user ON tool_writes (user_id, created_at DESC);

-- Audit of every tool call made during a turn: what was asked, what came back.
CREATE TABLE IF NOT EXISTS tool_calls (
    id           BIGSERIAL   PRIMARY KEY,
    message_id   TEXT        NOT NULL,
    tool_call_id TEXT        NOT NULL,
    round        INTEGER     NOT NULL,
    user_id      TEXT        NOT NULL,
    bot_id       TEXT        NOT NULL,
    tool         TEXT        NOT NULL,
    arguments    TEXT        NOT NULL,
    ok           BOOLEAN     NOT NULL,
    result       JSONB       NOT NULL,
    card_type    TEXT,
    duration_ms  INTEGER     NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (message_id, tool_call_id)
);
CREATE INDEX IF NOT EXISTS tool_calls_by_user ON tool_calls (user_id, created_at DESC);
