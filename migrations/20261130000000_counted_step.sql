-- A counted step in one statement (issue 64, P7). Production's flood limit counts every DM turn this way,
-- and the write quotas, the referral, the under-13 line and the follow-up cap count theirs: it was BEGIN,
-- the tally's lock, the step's earlier record, the window's count, the records' insert and COMMIT, six
-- round trips. The function takes the same lock and then, each in a snapshot of its own (VOLATILE, as
-- `append_history`: a stable function would count as of the call's start and could admit one more than
-- the limit across workers), reads the earlier record, counts the window and inserts the records waiting
-- to ride with the next write plus the step's own. A full window inserts nothing: the waiting records
-- wait for the next write, as before.
CREATE OR REPLACE FUNCTION counted_step(
    p_lock text, p_job text, p_name text, p_key text, p_tally text, p_since timestamptz,
    p_limit bigint, p_pending jsonb, p_own jsonb
) RETURNS TABLE (earlier jsonb, counted bigint, oldest timestamptz, inserted jsonb)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_rows jsonb;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_lock, 0));
    SELECT s.output INTO earlier FROM job_steps s
    WHERE s.job = p_job AND s.name = p_name AND s.key = p_key;
    IF earlier IS NULL THEN
        SELECT count(*), min(s.created_at) INTO counted, oldest FROM job_steps s
        WHERE s.tally = p_tally AND s.created_at > p_since;
        IF counted >= p_limit THEN
            inserted := '[]'::jsonb;
            RETURN NEXT;
            RETURN;
        END IF;
        v_rows := p_pending || p_own;
    ELSE
        v_rows := p_pending;
    END IF;
    WITH ins AS (
        INSERT INTO job_steps (job, name, key, output, tally, created_at)
        SELECT p_job, r.name, r.key, coalesce(r.output, 'null'::jsonb), r.tally, coalesce(r.at, now())
        FROM jsonb_to_recordset(v_rows) AS r(name text, key text, output jsonb, tally text, at timestamptz)
        ON CONFLICT (job, name, key) DO NOTHING
        RETURNING job_steps.name AS n, job_steps.key AS k)
    SELECT coalesce(jsonb_agg(jsonb_build_array(ins.n, ins.k)), '[]'::jsonb) INTO inserted FROM ins;
    RETURN NEXT;
END
$fn$;
