-- Conversation memory: what each user said to each bot and what it answered.
CREATE TABLE IF NOT EXISTS bot_conversations (
    id              BIGSERIAL PRIMARY KEY,
    user_id         TEXT        NOT NULL,
    bot_id          TEXT        NOT NULL,
    conversation_id TEXT        NOT NULL,
    role            TEXT        NOT NULL CHECK (role IN ('user', 'assistant')),
    content         TEXT        NOT NULL,
    -- dm_messages _id of this message: a redelivered event cannot append twice.
    message_id      TEXT        NOT NULL UNIQUE,
    -- Compact record of the tool calls made while producing an assistant message.
    tool_calls      JSONB,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS bot_conversations_window
    ON bot_conversations (user_id, bot_id, created_at DESC, id DESC);

-- Turn journal, one row per inbound event.
CREATE TABLE IF NOT EXISTS turns (
    message_id      TEXT        PRIMARY KEY,
    conversation_id TEXT        NOT NULL,
    user_id         TEXT        NOT NULL,
    bot_id          TEXT        NOT NULL,
    state           TEXT        NOT NULL DEFAULT 'running'
                    CHECK (state IN ('running', 'done', 'failed')),
    attempts        INTEGER     NOT NULL DEFAULT 1,
    -- Fixed on first write, so every retry writes the same reply document.
    reply_id        TEXT,
    reply_content   TEXT,
    rich_content    JSONB,
    reply_at        TIMESTAMPTZ,
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS turns_by_conversation ON turns (conversation_id, created_at);
