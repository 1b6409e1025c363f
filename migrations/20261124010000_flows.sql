-- Guided flows: where each user stands in the flow a companion leads them through (one per user and
-- companion). `applied` holds the tool calls that changed the row lately: a call applied again (a retried
-- turn) changes nothing.
CREATE TABLE IF NOT EXISTS flow_states (
    user_id      text        NOT NULL,
    bot_id       text        NOT NULL,
    flow         text        NOT NULL,
    step         text        NOT NULL,
    slots        jsonb       NOT NULL DEFAULT '{}',
    status       text        NOT NULL,
    waiting_for  text,
    applied      text[]      NOT NULL DEFAULT '{}',
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, bot_id)
);
