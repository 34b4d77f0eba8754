-- ddb(tau := 0.3, variant := 'global') -> (run_id, model, view, variant, tau, deep, shallow, ddb): one τ and one
-- variant (global | deep | out) of `ddb_grid`, for every circuit run.
CREATE OR REPLACE MACRO ddb(tau := 0.3, variant := 'global') AS TABLE
SELECT g.* FROM ddb_grid([tau]) g WHERE g.variant = variant ORDER BY g.run_id;
