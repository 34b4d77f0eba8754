-- duplicate_runs() -> (kind, run_id, copies): run ids held more than once. One database holds each run once;
-- `featstore sql` over several databases refuses to mix two results under one id.
CREATE OR REPLACE MACRO duplicate_runs() AS TABLE
SELECT 'run' AS kind, run_id, count(*) AS copies FROM runs GROUP BY run_id HAVING count(*) > 1
UNION ALL
SELECT 'circuit run', run_id, count(*) FROM circuit_runs GROUP BY run_id HAVING count(*) > 1;
