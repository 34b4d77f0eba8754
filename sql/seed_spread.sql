-- seed_spread(k := 2, scope := 'auto', min_conf := 0) -> per run family (model, view, train_view, probe_id,
-- cross_fit: runs that differ only in their probe seed) and statistic (every decision_summary column at k, and the probe
-- accuracy at each anchor as accuracy@<anchor>): seeds, mean, std (sample), min and max across probe seeds.
CREATE OR REPLACE MACRO seed_spread(k := 2, scope := 'auto', min_conf := 0) AS TABLE
WITH fam AS (
    SELECT run_id, model, view, train_view, probe_id,
           cross_fit, seed
    FROM runs),
s AS MATERIALIZED (SELECT * FROM decision_summary(k, scope, min_conf := min_conf)),
stats AS (
    SELECT run_id, statistic, value::DOUBLE AS value
    FROM (UNPIVOT (SELECT run_id, mean, median::DOUBLE AS median, std, f_early, f_mid, f_late, never_stable,
                          stable_but_wrong FROM s)
          ON mean, median, std, f_early, f_mid, f_late, never_stable, stable_but_wrong
          INTO NAME statistic VALUE value)
    UNION ALL
    SELECT run_id, 'accuracy@' || lpad(anchor::VARCHAR, 2, '0'), accuracy FROM probe_accuracy(scope))
SELECT f.model, f.view, f.train_view, f.probe_id, f.cross_fit, st.statistic, count(st.value) AS seeds,
       list(f.seed ORDER BY f.seed) AS seed_list, avg(st.value) AS mean, stddev_samp(st.value) AS std,
       min(st.value) AS min, max(st.value) AS max
FROM stats st JOIN fam f USING (run_id)
GROUP BY ALL
ORDER BY f.model, f.view, f.train_view, f.probe_id, f.cross_fit, st.statistic;
