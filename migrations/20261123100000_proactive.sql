-- Proactive messages (a companion following up on a spot review, a reminder) are jobs too; one that is
-- not sent on purpose (over the daily cap, the user left or blocked the bot, stale news) ends `dropped`.
ALTER TABLE jobs DROP CONSTRAINT IF EXISTS jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('running', 'done', 'failed', 'covered', 'limited', 'dropped'));
