-- What a turn's journal costs the shared database (issue 64).
--
-- No code deletes a `jobs` row, and every writer opens its job before recording a step of it (a
-- `journal::Job` exists only from `Journal::open`), so the foreign key from `job_steps` to `jobs` checked
-- nothing the code does not already guarantee, at the price of a trigger, an internal query and a row
-- lock on the job per recorded step: 12 to 14 a turn. Retention (partitioning the journal by day and
-- detaching old partitions, docs/benchmark.md) is also simpler without it.
ALTER TABLE job_steps DROP CONSTRAINT IF EXISTS job_steps_job_fkey;

-- A job's settlement updates no indexed column; with room left on its page the update is HOT and writes
-- no index entry. Applies to pages written from now on.
ALTER TABLE jobs SET (fillfactor = 80);

-- A history write in one statement (it was BEGIN, the locks, the insert, COMMIT: four round trips). The
-- function takes the advisory locks a deletion of what it writes also takes, in the order given, and only
-- then inserts, leaving out what a tombstone names. It must stay VOLATILE (the default): a volatile
-- function's every query takes a fresh snapshot, so the insert reads the tombstones committed while it
-- waited on a lock; a STABLE one would read them as of the call's start and could write a row a deletion
-- had just removed. A test fails if it is not volatile.
CREATE OR REPLACE FUNCTION append_history(
    p_locks text[], p_user_id text[], p_bot_id text[], p_conversation_id text[], p_role text[],
    p_content text[], p_message_id text[], p_tool_calls jsonb[], p_created_at timestamptz[],
    p_group_chat boolean[], p_ai_disclosure boolean[], p_said text[]
) RETURNS void LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(o.k, 0))
    FROM (SELECT l.k FROM unnest(p_locks) WITH ORDINALITY AS l(k, i) ORDER BY l.i) o;
    INSERT INTO bot_conversations
        (user_id, bot_id, conversation_id, role, content, message_id, tool_calls, created_at,
         group_chat, ai_disclosure)
    SELECT * FROM UNNEST(p_user_id, p_bot_id, p_conversation_id, p_role, p_content, p_message_id,
                         p_tool_calls, p_created_at, p_group_chat, p_ai_disclosure)
             AS r(user_id, bot_id, conversation_id, role, content, message_id, tool_calls,
                  created_at, group_chat, ai_disclosure)
    WHERE NOT EXISTS (SELECT 1 FROM tombstones t WHERE t.kind = 'user' AND t.id = r.user_id)
      AND NOT EXISTS (SELECT 1 FROM tombstones t WHERE t.kind = 'message'
                      AND t.id = ANY(CASE WHEN r.role = 'user' THEN ARRAY[r.message_id]
                                          ELSE p_said END))
    ON CONFLICT (message_id) DO NOTHING;
END
$fn$;
