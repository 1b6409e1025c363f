-- A history write from one JSON argument (issue 64). The reply's record statement writes the reply's
-- history (P10), and its parameters are fixed: the rows come in its jsonb ride. Turned back into the
-- twelve arrays of `append_history(text[], …)` they cost twelve subqueries, each a function scan and a
-- sort, in every turn's plan: more executor nodes to start and run than the insert itself. This overload
-- reads them as records in one function scan, in the order given.
--
-- `p`: `{"locks": [..], "said": [..], "rows": [{user_id, bot_id, conversation_id, role, content,
-- message_id, tool_calls, created_at, group_chat, ai_disclosure}, ..]}` (`store::pg::history_arg`).
-- Same contract as the array version: the advisory locks a deletion of these rows also takes, in the order
-- given, and only then the insert, which leaves out what a tombstone names. VOLATILE (the default) for the
-- same reason: each query takes a fresh snapshot, so the insert reads the tombstones committed while it
-- waited on a lock. The array version stays for workers of the build before during a rolling deploy.
CREATE OR REPLACE FUNCTION append_history(p jsonb) RETURNS void LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    said text[] := ARRAY(SELECT jsonb_array_elements_text(p -> 'said'));
BEGIN
    FOR i IN 0 .. jsonb_array_length(p -> 'locks') - 1 LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(p -> 'locks' ->> i, 0));
    END LOOP;
    INSERT INTO bot_conversations
        (user_id, bot_id, conversation_id, role, content, message_id, tool_calls, created_at,
         group_chat, ai_disclosure)
    SELECT r.user_id, r.bot_id, r.conversation_id, r.role, r.content, r.message_id, r.tool_calls,
           r.created_at, r.group_chat, r.ai_disclosure
    FROM ROWS FROM (jsonb_to_recordset(p -> 'rows')
                    AS (user_id text, bot_id text, conversation_id text, role text, content text,
                        message_id text, tool_calls jsonb, created_at timestamptz,
                        group_chat boolean, ai_disclosure boolean)) WITH ORDINALITY
         AS r(user_id, bot_id, conversation_id, role, content, message_id, tool_calls, created_at,
              group_chat, ai_disclosure, n)
    WHERE NOT EXISTS (SELECT 1 FROM tombstones t WHERE t.kind = 'user' AND t.id = r.user_id)
      AND NOT EXISTS (SELECT 1 FROM tombstones t WHERE t.kind = 'message'
                      AND t.id = ANY(CASE WHEN r.role = 'user' THEN ARRAY[r.message_id]
                                          ELSE said END))
    -- The rows' ids in the order given (a history's order): an anti-join may reorder what it reads.
    ORDER BY r.n
    ON CONFLICT (message_id) DO NOTHING;
END
$fn$;
