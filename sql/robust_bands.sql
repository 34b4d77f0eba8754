-- robust_bands(kmax := 4, scope := 'auto', run_set := NULL, min_conf := 0) -> (model, view, k, image_id, run_id,
-- probe_id, layer, t, band, never_stable, probes, band_holds, layer_holds): per image and k = 1..kmax, its l*(k) and
-- early/mid/late band (decision_band) under each probe of a set, and whether the band (the layer) is the same under
-- every one (docs/design.md §5, "Robustness"). The set, per model and view: the runs `run_set` names, or by default
-- every run of probe seed 0 on the one split (no cross-fit): the linear probe at its chosen C, its neighbour-C runs
-- (linear:C_step=...) and every other family landed. Images: those every member predicted and the scope counts for
-- all of them, so each member's fractions count the same images.
CREATE OR REPLACE MACRO robust_bands(kmax := 4, scope := 'auto', run_set := NULL, min_conf := 0) AS TABLE
WITH members AS (
    SELECT run_id, model, view, probe_id, cross_fit, n_anchors - 1 AS t,
           count(*) OVER (PARTITION BY model, view) AS probes
    FROM runs
    WHERE CASE WHEN run_set::VARCHAR[] IS NULL THEN seed = 0 AND cross_fit = 0
               ELSE list_contains(run_set::VARCHAR[], run_id) END),
layers AS (
    SELECT m.model, m.view, d.k, d.image_id, d.run_id, m.probe_id, d.layer, m.t, decision_band(d.layer, m.t) AS band,
           d.never_stable, m.probes, count(*) OVER (PARTITION BY m.model, m.view, d.k, d.image_id) AS seen
    FROM joint_decisions(min_conf := min_conf) d JOIN members m USING (run_id) JOIN images i USING (image_id)
    WHERE d.k <= kmax AND in_scope(scope, i.split, m.cross_fit))
SELECT model, view, k, image_id, run_id, probe_id, layer, t, band, never_stable, probes,
       min(band) OVER w = max(band) OVER w AS band_holds, min(layer) OVER w = max(layer) OVER w AS layer_holds
FROM layers
WHERE seen = probes
WINDOW w AS (PARTITION BY model, view, k, image_id)
ORDER BY model, view, k, image_id, run_id;
