-- paper_table(k := 2, scope := 'auto', min_conf := 0) -> one row per clean run, shaped like the paper's Table 1:
-- last-anchor probe accuracy, mean l*, early / late / never-stable shares, stable-but-wrong read both ways (the paper's
-- denominator is ambiguous): among stable images (l* < T) and over all images, mean Δd̄ over its views;
-- late_is_never_stable: at this k no stable l*(k) is late (decision_sweep), so f_late is the never-stable share.
CREATE OR REPLACE MACRO paper_table(k := 2, scope := 'auto', min_conf := 0) AS TABLE
WITH s AS (SELECT * FROM decision_summary(k, scope, min_conf := min_conf) WHERE view = 'clean'),
last_acc AS (
    SELECT pa.run_id, pa.accuracy FROM probe_accuracy(scope) pa JOIN runs r USING (run_id)
    WHERE pa.anchor = r.n_anchors - 1),
shift AS (SELECT clean_run_id AS run_id, avg(delta) AS delta, count(*) AS views FROM corruption_shift(k, scope, min_conf := min_conf)
          GROUP BY clean_run_id)
SELECT s.model, s.probe, s.run_id, la.accuracy AS last_anchor_accuracy, s.mean AS mean_layer, s.f_early,
       s.f_late, s.never_stable, s.stable_but_wrong AS stable_but_wrong_among_stable,
       coalesce(s.stable_but_wrong, 0) * (1 - s.never_stable) AS stable_but_wrong_of_all, sh.delta AS corruption_delta,
       sh.views AS corruption_views, s.n, s.late_is_never_stable
FROM s LEFT JOIN last_acc la USING (run_id) LEFT JOIN shift sh USING (run_id)
ORDER BY s.model, s.probe;
