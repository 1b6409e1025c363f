-- One row per paid chat call (a successful response from the model; a response replayed from the turn
-- journal is not paid again and gets no row). Two racing attempts of one turn can both pay for the same
-- step, so (message_id, step) is not unique.
CREATE TABLE IF NOT EXISTS llm_usage (
    id                BIGSERIAL   PRIMARY KEY,
    message_id        TEXT        NOT NULL,
    step              INTEGER     NOT NULL,
    user_id           TEXT        NOT NULL,
    bot_id            TEXT        NOT NULL,
    -- The model that answered (the server's `model`, else the one asked).
    model             TEXT        NOT NULL,
    prompt_tokens     BIGINT      NOT NULL,
    completion_tokens BIGINT      NOT NULL,
    -- USD; NULL when the server reported no cost and the price table has no entry for the model.
    cost_usd          DOUBLE PRECISION,
    cost_source       TEXT        NOT NULL CHECK (cost_source IN ('reported', 'estimated', 'unpriced')),
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS llm_usage_by_time ON llm_usage (created_at);
CREATE INDEX IF NOT EXISTS llm_usage_by_turn ON llm_usage (message_id);
CREATE INDEX IF NOT EXISTS llm_usage_by_user ON llm_usage (user_id, created_at DESC);
