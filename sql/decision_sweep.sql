-- decision_sweep(kmax := 4, scope := 'auto', min_conf := 0, band := 'paper') -> per run and k = 1..kmax: n, mean,
-- median, std (population), f_early, f_mid, f_late, never_stable, stable_but_wrong (among l* < T),
-- late_is_never_stable. band 'paper': early l* < 0.3T, late l* >= 0.7T, never-stable images (at T) counted late;
-- 'window': the thirds of T - k, the anchors a stable l*(k) can take, never-stable images in no band (decision_band).
-- late_is_never_stable: at this k no stable l*(k) is late (T - k < 0.7T), so f_late is the never-stable share.
-- The k-sweep; min_conf > 0 sweeps the joint stable-and-confident criterion (joint_decisions).
CREATE OR REPLACE MACRO decision_sweep(kmax := 4, scope := 'auto', min_conf := 0, band := 'paper') AS TABLE
WITH d AS (
    SELECT d.*, r.n_anchors - 1 AS t, decision_band(d.layer, r.n_anchors - 1, k := band_window(band, d.k)) AS band_
    FROM joint_decisions(min_conf := min_conf) d JOIN runs r USING (run_id) JOIN images i USING (image_id)
    WHERE d.k <= kmax AND in_scope(scope, i.split, r.cross_fit))
SELECT d.run_id, r.model, r.view, r.probe, d.k, count(*) AS n,
       avg(d.layer) AS mean, median(d.layer) AS median, stddev_pop(d.layer) AS std,
       avg((band_ = 'early')::INT) AS f_early, avg((band_ = 'mid')::INT) AS f_mid, avg((band_ = 'late')::INT) AS f_late,
       avg(d.never_stable::INT) AS never_stable,
       avg((NOT d.correct)::INT) FILTER (WHERE d.layer < d.t) AS stable_but_wrong,
       band_window(band, d.k) = 0 AND decision_band(d.t - d.k, d.t) <> 'late' AS late_is_never_stable
FROM d JOIN runs r USING (run_id)
GROUP BY d.run_id, r.model, r.view, r.probe, d.k, d.t
ORDER BY d.run_id, d.k;
