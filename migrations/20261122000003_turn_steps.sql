-- Every model response of a turn, in order: a redelivered event replays these instead of asking the
-- model again, so the same tool calls (same ids) run again and their keyed writes are not repeated.
CREATE TABLE IF NOT EXISTS turn_steps (
    message_id  TEXT        NOT NULL,
    step        INTEGER     NOT NULL,
    response    JSONB       NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, step)
);
