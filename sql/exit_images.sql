-- exit_images(sim_run, scope := 'auto', gate_thresholds := NULL) -> (image_id, label, split): the one population
-- on which a simulation counts every early-exit policy (docs/design.md §7), so that its policies and its Pareto
-- front compare figures over the same images: those `scope` counts for the run that the run predicted, and, when
-- the learned gate is in the comparison (the run has gate_scores and gate_thresholds is not an empty list), only
-- those the gate scored and did not learn from.
CREATE OR REPLACE MACRO exit_images(sim_run, scope := 'auto', gate_thresholds := NULL) AS TABLE
WITH r AS (SELECT cross_fit FROM runs WHERE run_id = sim_run),
gated AS (SELECT EXISTS (SELECT 1 FROM gate_scores WHERE run_id = sim_run)
                 AND len(coalesce(gate_thresholds, [0.5])) > 0 AS with_gate),
unseen AS (SELECT DISTINCT image_id FROM gate_scores WHERE run_id = sim_run AND NOT learnt)
SELECT i.image_id, i.label, i.split
FROM images i, r, gated
WHERE in_scope(scope, i.split, r.cross_fit)
  AND i.image_id IN (SELECT image_id FROM predictions WHERE run_id = sim_run)
  AND (NOT gated.with_gate OR i.image_id IN (SELECT image_id FROM unseen));
