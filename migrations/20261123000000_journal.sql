-- One journal for every durable job: a job per row, each of its side effects a named step recorded once it
-- succeeded (first writer wins). It replaces the turn journal (`turns`), the model responses
-- (`turn_steps`), the tool-call audit and result journal (`tool_calls`), the usage rows (`llm_usage`) and
-- the write quota's ledger (`tool_writes`); their rows move over below.
CREATE TABLE IF NOT EXISTS jobs (
    -- A turn's id is its event's messageId; other kinds prefix theirs (`<kind>:…`).
    id              TEXT        PRIMARY KEY,
    kind            TEXT        NOT NULL,
    -- running → done | failed | limited; a burst's later messages start covered; a replay reopens a
    -- settled job (see journal::State).
    state           TEXT        NOT NULL DEFAULT 'running'
                    CHECK (state IN ('running', 'done', 'failed', 'covered', 'limited')),
    attempts        INTEGER     NOT NULL DEFAULT 1,
    user_id         TEXT        NOT NULL,
    bot_id          TEXT        NOT NULL,
    conversation_id TEXT        NOT NULL,
    -- Inbound stream sequence of the event, for operators and replay.
    stream_seq      BIGINT,
    -- Reply generation: 0 first; a replay that answers again takes the next.
    generation      INTEGER     NOT NULL DEFAULT 0,
    -- For a covered or limited job: the job whose reply answered it.
    covered_by      TEXT,
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS jobs_by_user_bot ON jobs (user_id, bot_id, created_at DESC);
CREATE INDEX IF NOT EXISTS jobs_by_conversation ON jobs (conversation_id, created_at);

CREATE TABLE IF NOT EXISTS job_steps (
    job        TEXT        NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    -- What the step is (`llm`, `tool`, `reply`, `publish`, …) and which one (`0`, a tool call, `g1`, …).
    name       TEXT        NOT NULL,
    key        TEXT        NOT NULL,
    output     JSONB       NOT NULL,
    -- A limit this step counts against across every worker (`writes:<user>`), else NULL.
    tally      TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (job, name, key)
);
CREATE INDEX IF NOT EXISTS job_steps_by_tally ON job_steps (tally, created_at) WHERE tally IS NOT NULL;
-- `companion usage` reads the model calls of a time range.
CREATE INDEX IF NOT EXISTS job_steps_llm_by_time ON job_steps (created_at) WHERE name = 'llm';

-- The old journal's rows, moved over.
INSERT INTO jobs (id, kind, state, attempts, user_id, bot_id, conversation_id, stream_seq, generation,
                  covered_by, last_error, created_at, updated_at)
SELECT message_id, 'turn', state, attempts, user_id, bot_id, conversation_id, stream_seq, generation,
       covered_by, last_error, created_at, updated_at
FROM turns
ON CONFLICT (id) DO NOTHING;

-- The fixed reply of each generation.
INSERT INTO job_steps (job, name, key, output, created_at)
SELECT message_id, 'reply', 'g' || generation,
       jsonb_build_object('id', reply_id, 'content', reply_content, 'richContent', rich_content,
                          'at', reply_at, 'toolLog', NULL),
       coalesce(reply_at, updated_at)
FROM turns WHERE reply_id IS NOT NULL
ON CONFLICT DO NOTHING;

-- The burst a turn answers, and the flood decision of a turn over the limit.
INSERT INTO job_steps (job, name, key, output)
SELECT message_id, 'burst', '', jsonb_build_object('covers', covers)
FROM turns WHERE covers IS NOT NULL AND state <> 'covered'
ON CONFLICT DO NOTHING;
INSERT INTO job_steps (job, name, key, output)
SELECT message_id, 'flood', '', jsonb_build_object('by', covered_by)
FROM turns WHERE covered_by IS NOT NULL AND state IN ('running', 'limited')
ON CONFLICT DO NOTHING;

-- Model responses, with the usage of the paid call that produced them.
INSERT INTO job_steps (job, name, key, output, created_at)
SELECT s.message_id, 'llm', s.step::text,
       jsonb_build_object('message', s.response, 'usage', (
           SELECT jsonb_build_object('model', u.model, 'promptTokens', u.prompt_tokens,
                                     'completionTokens', u.completion_tokens, 'costUsd', u.cost_usd,
                                     'costSource', u.cost_source)
           FROM llm_usage u WHERE u.message_id = s.message_id AND u.step = s.step
           ORDER BY u.id LIMIT 1)),
       s.created_at
FROM turn_steps s WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.id = s.message_id)
ON CONFLICT DO NOTHING;
-- Paid calls whose response lost a race (or was never journaled) keep their usage under a key of their own.
INSERT INTO job_steps (job, name, key, output, created_at)
SELECT u.message_id, 'llm', u.step || '#' || u.id,
       jsonb_build_object('message', NULL, 'usage', jsonb_build_object(
           'model', u.model, 'promptTokens', u.prompt_tokens, 'completionTokens', u.completion_tokens,
           'costUsd', u.cost_usd, 'costSource', u.cost_source)),
       u.created_at
FROM llm_usage u
WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.id = u.message_id)
  AND NOT (u.id = (SELECT min(v.id) FROM llm_usage v WHERE v.message_id = u.message_id AND v.step = u.step)
           AND EXISTS (SELECT 1 FROM turn_steps s WHERE s.message_id = u.message_id AND s.step = u.step))
ON CONFLICT DO NOTHING;

-- Tool calls: the result the model saw, keyed by call id and a hash of (tool, arguments).
INSERT INTO job_steps (job, name, key, output, created_at)
SELECT c.message_id, 'tool',
       c.tool_call_id || ':' || left(encode(sha256(convert_to(c.tool || E'\n' || c.arguments, 'UTF8')), 'hex'), 16),
       jsonb_build_object('tool', c.tool, 'args', c.arguments, 'ok', c.ok,
                          'content', CASE WHEN c.ok THEN c.result -> 'data' ELSE c.result END,
                          'card', CASE WHEN c.ok THEN c.result -> 'card' END,
                          'round', c.round, 'ms', c.duration_ms),
       c.created_at
FROM tool_calls c WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.id = c.message_id)
ON CONFLICT DO NOTHING;

-- The write quota: each counted write is a step of its tally.
INSERT INTO job_steps (job, name, key, output, tally, created_at)
SELECT w.message_id, 'quota', w.tool_call_id || ':legacy', jsonb_build_object('tool', w.tool),
       'writes:' || w.user_id, w.created_at
FROM tool_writes w WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.id = w.message_id)
ON CONFLICT DO NOTHING;

DROP TABLE IF EXISTS turn_steps;
DROP TABLE IF EXISTS tool_calls;
DROP TABLE IF EXISTS llm_usage;
DROP TABLE IF EXISTS tool_writes;
DROP TABLE IF EXISTS turns;
