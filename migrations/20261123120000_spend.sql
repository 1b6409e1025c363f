-- Spend budgets: every model answer counts under the tally `spend:<user>` of the job's user (see
-- src/spend.rs). Answers recorded before the budgets existed count too, so a worker deployed mid-day
-- knows what each user already spent in the window.
UPDATE job_steps s SET tally = 'spend:' || j.user_id
FROM jobs j
WHERE j.id = s.job AND s.name = 'llm' AND s.tally IS NULL
  AND s.created_at > now() - interval '2 days';
