-- Safety for a teenage audience (docs/safety.md).

-- A companion message that carried the AI disclosure: when the next one is due is read from here.
ALTER TABLE bot_conversations ADD COLUMN IF NOT EXISTS ai_disclosure boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS bot_conversations_disclosures
    ON bot_conversations (user_id, bot_id, created_at DESC) WHERE ai_disclosure AND NOT group_chat;
CREATE INDEX IF NOT EXISTS bot_conversations_group_disclosures
    ON bot_conversations (conversation_id, bot_id, created_at DESC) WHERE ai_disclosure AND group_chat;
-- What a moderator wrote while the conversation was taken over joins the history with its author.
ALTER TABLE bot_conversations DROP CONSTRAINT IF EXISTS bot_conversations_role_check;
ALTER TABLE bot_conversations ADD CONSTRAINT bot_conversations_role_check
    CHECK (role IN ('user', 'assistant', 'moderator'));

-- A message that came in while a moderator had paused the conversation.
ALTER TABLE jobs DROP CONSTRAINT IF EXISTS jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('running', 'done', 'failed', 'covered', 'limited', 'dropped', 'held'));

-- One row per flagged user message, for `companion report crisis --year`. No user, conversation or
-- message id: the yearly counts survive a user's erasure. Written by the job step that flagged it.
CREATE TABLE IF NOT EXISTS crisis_log (
    id        BIGSERIAL   PRIMARY KEY,
    at        TIMESTAMPTZ NOT NULL,
    category  TEXT        NOT NULL,
    lang      TEXT        NOT NULL,
    -- A referral went out for it (at most one per conversation per window).
    referred  BOOLEAN     NOT NULL,
    -- `dm` or `group`.
    kind      TEXT        NOT NULL
);
CREATE INDEX IF NOT EXISTS crisis_log_at ON crisis_log (at);

-- A moderator's takeover of a conversation: the latest `at` wins, so signals that arrive out of order
-- cannot resume a paused conversation.
CREATE TABLE IF NOT EXISTS takeovers (
    conversation_id TEXT        PRIMARY KEY,
    paused          BOOLEAN     NOT NULL,
    by_whom         TEXT        NOT NULL,
    reason          TEXT,
    -- On resume: answer the latest held message (false: leave it).
    catch_up        BOOLEAN     NOT NULL DEFAULT true,
    at              TIMESTAMPTZ NOT NULL,
    -- When the pause began (kept on resume: the messages held since then).
    paused_at       TIMESTAMPTZ,
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
