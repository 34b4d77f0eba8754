-- robust_sweep(kmax := 4, scope := 'auto', run_set := NULL, min_conf := 0) -> per model, view, k and probe of the set
-- (robust_bands): n, mean l*(k), f_early, f_mid, f_late, never_stable on the images every member counts; the set's
-- probes, band_holds and layer_holds (the share of those images whose band, layer, is the same under every probe),
-- and each fraction's range over the set (<fraction>_min, <fraction>_max). Intervals: analytics/robustness.py.
CREATE OR REPLACE MACRO robust_sweep(kmax := 4, scope := 'auto', run_set := NULL, min_conf := 0) AS TABLE
WITH per_run AS (
    SELECT model, view, k, run_id, any_value(probe_id) AS probe_id, any_value(probes) AS probes, count(*) AS n,
           avg(layer) AS mean, avg((band = 'early')::INT) AS f_early, avg((band = 'mid')::INT) AS f_mid,
           avg((band = 'late')::INT) AS f_late, avg(never_stable::INT) AS never_stable,
           avg(band_holds::INT) AS band_holds, avg(layer_holds::INT) AS layer_holds
    FROM robust_bands(kmax := kmax, scope := scope, run_set := run_set, min_conf := min_conf)
    GROUP BY model, view, k, run_id)
SELECT model, view, k, run_id, probe_id, n, mean, f_early, f_mid, f_late, never_stable, probes, band_holds,
       layer_holds,
       min(f_early) OVER w AS f_early_min, max(f_early) OVER w AS f_early_max,
       min(f_mid) OVER w AS f_mid_min, max(f_mid) OVER w AS f_mid_max,
       min(f_late) OVER w AS f_late_min, max(f_late) OVER w AS f_late_max,
       min(never_stable) OVER w AS never_stable_min, max(never_stable) OVER w AS never_stable_max
FROM per_run
WINDOW w AS (PARTITION BY model, view, k)
ORDER BY model, view, k, run_id;
