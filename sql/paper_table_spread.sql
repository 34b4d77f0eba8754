-- paper_table_spread(k := 2, scope := 'auto') -> (model, train_view, probe_id, cross_fit, statistic, seeds, seed_list,
-- mean, std, min, max, n): every paper_table statistic of the clean runs that differ only in their probe seed (the
-- run families of seed_spread), as its mean, sample std, min and max across the seeds; n is the number of images
-- each figure counts (the largest over the seeds; equal when no image was skipped).
CREATE OR REPLACE MACRO paper_table_spread(k := 2, scope := 'auto') AS TABLE
WITH t AS (
    SELECT run_id, n, last_anchor_accuracy::DOUBLE AS last_anchor_accuracy, mean_layer::DOUBLE AS mean_layer,
           f_early::DOUBLE AS f_early, f_late::DOUBLE AS f_late, never_stable::DOUBLE AS never_stable,
           stable_but_wrong_among_stable::DOUBLE AS stable_but_wrong_among_stable,
           stable_but_wrong_of_all::DOUBLE AS stable_but_wrong_of_all, corruption_delta::DOUBLE AS corruption_delta
    FROM paper_table(k, scope)),
stats AS (
    SELECT run_id, n, statistic, value
    FROM (UNPIVOT t ON last_anchor_accuracy, mean_layer, f_early, f_late, never_stable, stable_but_wrong_among_stable,
                       stable_but_wrong_of_all, corruption_delta INTO NAME statistic VALUE value))
SELECT r.model, r.train_view, r.probe_id, r.cross_fit,
       st.statistic, count(st.value) AS seeds, list(r.seed ORDER BY r.seed) AS seed_list, avg(st.value) AS mean,
       stddev_samp(st.value) AS std, min(st.value) AS min, max(st.value) AS max, max(st.n) AS n
FROM stats st JOIN runs r USING (run_id)
GROUP BY ALL
ORDER BY r.model, r.train_view, probe_id, r.cross_fit, st.statistic;
