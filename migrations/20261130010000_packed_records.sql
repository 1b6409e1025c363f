-- Packed step records (issue 64, P11). A turn's delivery receipts (`store_reply`, `history`, `touch`,
-- `publish`, `memory_trigger`), `after_flag` and `flood` are lazy records of a few bytes each that no
-- statement selects by name: they are read only among all of a job's records (its next attempt, `companion
-- explain`; a replay's reopen forgets `flood`). Written one row each they were seven of a `tool` turn's
-- fourteen `job_steps` rows, each a heap tuple, a primary-key entry and their WAL. The journal now writes the lazy ones of a statement as one row of step
-- `packed` (keyed `<attempt>.<n>`) whose output is the array of their `{name, key, output}`; see
-- `companion_journal::names::step::PACKABLE`.
--
-- `job_records` is the journal as its readers see it: every record one row, packed or not (records written
-- before this migration are plain rows and read as they were). A packed row an erasure scrubbed (its output
-- no longer an array) reads as no record. Two attempts of a job running at once may each pack the same
-- record; it then reads twice, with each attempt's output.
CREATE OR REPLACE VIEW job_records AS
SELECT job, name, key, output, tally, created_at
FROM job_steps
WHERE name <> 'packed'
UNION ALL
SELECT s.job, r.name, r.key, coalesce(r.output, 'null'::jsonb), NULL::text, s.created_at
FROM job_steps s
CROSS JOIN LATERAL jsonb_to_recordset(
    CASE WHEN jsonb_typeof(s.output) = 'array' THEN s.output ELSE '[]'::jsonb END
) AS r(name text, key text, output jsonb)
WHERE s.name = 'packed';
