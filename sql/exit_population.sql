-- exit_population(sim_run, scope := 'auto', gate_thresholds := NULL) -> (run_id, scope, cross_fit, gate_learnt_on,
-- n, splits, scoped, left_out): the population every policy of exit_simulation / exit_pareto / exit_shares is
-- counted on (exit_images), to print beside their tables: n images, per split ('test 485, val 180'), out of the
-- `scoped` images the scope counts for the run; left_out of those are not counted because the run has no
-- predictions of them or the learned gate learnt from them or did not score them (gate_learnt_on: the split it
-- learnt from, NULL when no gate is in the comparison).
CREATE OR REPLACE MACRO exit_population(sim_run, scope := 'auto', gate_thresholds := NULL) AS TABLE
WITH r AS (SELECT run_id, cross_fit FROM runs WHERE run_id = sim_run),
counted AS (SELECT split, count(*) AS n FROM exit_images(sim_run, scope := scope, gate_thresholds := gate_thresholds)
            GROUP BY split),
scoped AS (SELECT count(*) AS n FROM images i, r WHERE in_scope(scope, i.split, r.cross_fit)),
gate AS (SELECT (SELECT any_value(trained_on) FROM gates WHERE run_id = sim_run) AS trained_on
         WHERE EXISTS (SELECT 1 FROM gate_scores WHERE run_id = sim_run)
           AND len(coalesce(gate_thresholds, [0.5])) > 0)
SELECT r.run_id, scope AS scope, r.cross_fit, (SELECT trained_on FROM gate) AS gate_learnt_on,
       coalesce((SELECT sum(n) FROM counted), 0)::BIGINT AS n,
       coalesce((SELECT string_agg(split || ' ' || n, ', ' ORDER BY CASE split WHEN 'train' THEN 0 WHEN 'val' THEN 1
                                                                      WHEN 'test' THEN 2 ELSE 3 END) FROM counted),
                '') AS splits,
       (SELECT n FROM scoped) AS scoped,
       (SELECT n FROM scoped) - coalesce((SELECT sum(n) FROM counted), 0)::BIGINT AS left_out
FROM r;
