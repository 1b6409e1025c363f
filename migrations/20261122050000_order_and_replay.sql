-- Per-conversation order across worker processes: every message of `subject` in the inbound stream
-- with a sequence below `next_seq` is settled (answered, covered, limited, failed or dead-lettered).
-- A message waits until it is the first unsettled one of its subject. `stream` is the stream's name
-- and creation time, so a recreated stream (sequences restart at 1) starts with fresh floors.
CREATE TABLE IF NOT EXISTS order_floors (
    stream     TEXT        NOT NULL,
    subject    TEXT        NOT NULL,
    next_seq   BIGINT      NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (stream, subject)
);

-- New turn states:
--   covered  answered by the reply of an earlier message of the same burst (`covered_by`)
--   limited  over the user's flood limit: answered by the character's busy line, or (when that line was
--            already sent in the window) recorded without a reply of its own (`covered_by` names the turn
--            whose busy line answered it)
ALTER TABLE turns DROP CONSTRAINT IF EXISTS turns_state_check;
ALTER TABLE turns ADD CONSTRAINT turns_state_check
    CHECK (state IN ('running', 'done', 'failed', 'covered', 'limited'));
-- Later messages of the burst this turn answers, fixed on the first attempt:
-- [{messageId, seq, content, images, sentAt}].
ALTER TABLE turns ADD COLUMN IF NOT EXISTS covers JSONB;
ALTER TABLE turns ADD COLUMN IF NOT EXISTS covered_by TEXT;
-- Reply generation: 0 for the first reply; a replay of a failed turn (or a forced one) answers again
-- with the next generation, which dm_messages keys separately (`replyGeneration`).
ALTER TABLE turns ADD COLUMN IF NOT EXISTS generation INTEGER NOT NULL DEFAULT 0;
-- Inbound stream sequence of the event, for operators and replay.
ALTER TABLE turns ADD COLUMN IF NOT EXISTS stream_seq BIGINT;
CREATE INDEX IF NOT EXISTS turns_by_user_bot ON turns (user_id, bot_id, created_at DESC);
