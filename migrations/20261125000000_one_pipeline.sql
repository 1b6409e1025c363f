-- One conversation pipeline, and the journal as the only record of what happened.
--
-- A job that ends without a message on purpose (a group message nobody answers, a follow-up not sent)
-- says why in `reason`; `last_error` keeps errors only.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS reason TEXT;
UPDATE jobs SET reason = last_error, last_error = NULL WHERE state = 'dropped' AND reason IS NULL;

-- A group message's job belongs to no one companion (several may speak): no bot. Its model calls name
-- the companion that spoke.
ALTER TABLE jobs ALTER COLUMN bot_id DROP NOT NULL;
UPDATE jobs SET bot_id = NULL WHERE kind = 'group' AND bot_id = 'group';

-- A reminder's row keeps what the user asked (pending or cancelled); whether it was sent or dropped is
-- the state of its job, `reminder:<id>`.
UPDATE reminders SET state = 'pending' WHERE state IN ('sent', 'dropped');
ALTER TABLE reminders DROP CONSTRAINT IF EXISTS reminders_state_check;
ALTER TABLE reminders ADD CONSTRAINT reminders_state_check CHECK (state IN ('pending', 'cancelled'));

-- A flow changes through journal steps (`flow_change`), written in the transaction that records them:
-- no list of applied keys of its own.
ALTER TABLE flow_states DROP COLUMN IF EXISTS applied;
