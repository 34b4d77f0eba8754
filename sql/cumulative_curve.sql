-- cumulative_curve(k, scope := 'auto', min_conf := 0) -> (run_id, layer, f): F_k(l), the share of images with
-- l*(k) <= l.
CREATE OR REPLACE MACRO cumulative_curve(k, scope := 'auto', min_conf := 0) AS TABLE
SELECT run_id, layer, sum(share) OVER (PARTITION BY run_id ORDER BY layer) AS f
FROM decision_mass(k, scope, min_conf := min_conf) ORDER BY run_id, layer;
