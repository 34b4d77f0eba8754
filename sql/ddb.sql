-- ddb(tau := 0.3, variant := 'global') -> (run_id, model, view, variant, tau, deep, shallow, ddb): one τ and one
-- variant (global | deep | out) of `ddb_grid` (its log_ratio), for every circuit run.
CREATE OR REPLACE MACRO ddb(tau := 0.3, variant := 'global') AS TABLE
SELECT g.run_id, g.model, g.view, g.variant, g.tau, g.deep, g.shallow, g.log_ratio AS ddb
FROM ddb_grid([tau]) g WHERE g.variant = variant ORDER BY g.run_id;
