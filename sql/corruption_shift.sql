-- corruption_shift(k := 2, scope := 'auto', min_conf := 0) -> (run_id, model, view, probe, clean_run_id, n,
-- mean_layer, clean_mean_layer, delta): Δd̄ = mean l*(k) on the view minus on clean, over the same images.
CREATE OR REPLACE MACRO corruption_shift(k := 2, scope := 'auto', min_conf := 0) AS TABLE
SELECT cp.run_id, cp.model, cp.view, cp.probe, cp.clean_run_id, count(*) AS n,
       avg(dv.layer) AS mean_layer, avg(dc.layer) AS clean_mean_layer, avg(dv.layer) - avg(dc.layer) AS delta
FROM clean_pairs cp
JOIN decision_layers(k, scope, min_conf := min_conf) dv ON dv.run_id = cp.run_id
JOIN decision_layers(k, scope, min_conf := min_conf) dc ON dc.run_id = cp.clean_run_id AND dc.image_id = dv.image_id
GROUP BY cp.run_id, cp.model, cp.view, cp.probe, cp.clean_run_id
ORDER BY cp.model, cp.view;
