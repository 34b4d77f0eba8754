-- decision_mass(k, scope := 'auto', min_conf := 0) -> (run_id, layer, n, share, never_stable): how many images
-- decide at each anchor 0..T (never-stable images are counted at T and also in never_stable).
CREATE OR REPLACE MACRO decision_mass(k, scope := 'auto', min_conf := 0) AS TABLE
WITH d AS (SELECT * FROM decision_layers(k, scope, min_conf := min_conf)),
grid AS (SELECT DISTINCT run_id, t FROM d),
layers AS (SELECT run_id, unnest(range(0, t + 1)) AS layer FROM grid),
counts AS (SELECT run_id, layer, count(*) AS n, sum(never_stable::INT)::BIGINT AS never_stable FROM d GROUP BY ALL),
totals AS (SELECT run_id, count(*) AS total FROM d GROUP BY ALL)
SELECT l.run_id, l.layer, coalesce(c.n, 0) AS n, coalesce(c.n, 0) / t.total AS share,
       coalesce(c.never_stable, 0) AS never_stable
FROM layers l JOIN totals t USING (run_id) LEFT JOIN counts c USING (run_id, layer)
ORDER BY l.run_id, l.layer;
