-- decision_sweep(kmax := 4, scope := 'auto', min_conf := 0) -> per run and k = 1..kmax: n, mean, median, std
-- (population), f_early (l* < 0.3T), f_mid, f_late (l* >= 0.7T), never_stable, stable_but_wrong (among l* < T).
-- The k-sweep; min_conf > 0 sweeps the joint stable-and-confident criterion (joint_decisions).
CREATE OR REPLACE MACRO decision_sweep(kmax := 4, scope := 'auto', min_conf := 0) AS TABLE
SELECT d.run_id, r.model, r.view, r.probe, d.k, count(*) AS n,
       avg(d.layer) AS mean, median(d.layer) AS median, stddev_pop(d.layer) AS std,
       avg((decision_band(d.layer, r.n_anchors - 1) = 'early')::INT) AS f_early,
       avg((decision_band(d.layer, r.n_anchors - 1) = 'mid')::INT) AS f_mid,
       avg((decision_band(d.layer, r.n_anchors - 1) = 'late')::INT) AS f_late,
       avg(d.never_stable::INT) AS never_stable,
       avg((NOT d.correct)::INT) FILTER (WHERE d.layer < r.n_anchors - 1) AS stable_but_wrong
FROM joint_decisions(min_conf := min_conf) d JOIN runs r USING (run_id) JOIN images i USING (image_id)
WHERE d.k <= kmax AND in_scope(scope, i.split, r.cross_fit)
GROUP BY d.run_id, r.model, r.view, r.probe, d.k
ORDER BY d.run_id, d.k;
