-- robust_bands(kmax := 4, scope := 'auto', run_set := NULL, min_conf := 0, seeds := false) -> (model, view, k,
-- image_id, run_id, probe_id, family, votes, refits, layer, t, band, never_stable, probes, families, band_holds,
-- layer_holds, family_holds): per image and k = 1..kmax, its l*(k) and early/mid/late band (decision_band, the
-- paper's) under each run of a probe set, grouped in families (docs/design.md §5, "Robustness"). The set, per model
-- and view: the runs `run_set` names, or by default every run without cross-fit of probe seed 0 (every seed when
-- `seeds`). A family (robust_family): the runs that differ only in C, C_step and probe seed; its vote is its lead's,
-- the run with neither C nor C_step in its id at the lowest seed (else its first id); `refits`: the runs that differ
-- from this one only in the seed (each its own refit; the bootstrap may draw among them). band_holds, layer_holds:
-- the band (layer) is the same under every family's lead (NULL with fewer than two families); family_holds: the
-- same under every member of this run's family (NULL for a family of one run). Images: those every member
-- predicted and the scope counts for all of them, so every figure counts the same images.
CREATE OR REPLACE MACRO robust_bands(kmax := 4, scope := 'auto', run_set := NULL, min_conf := 0, seeds := false) AS TABLE
WITH chosen AS (
    SELECT run_id, model, view, probe_id, cross_fit, seed, n_anchors - 1 AS t,
           robust_family(probe_id) AS family_id,
           model || '/' || view || '/' || robust_family(probe_id)
               || CASE WHEN train_view <> view THEN '/train=' || train_view ELSE '' END
               || CASE WHEN cross_fit > 0 THEN '/cf' || cross_fit ELSE '' END
               || CASE WHEN streamed THEN '/streamed' ELSE '' END AS family,
           count(*) OVER (PARTITION BY model, view) AS probes
    FROM runs
    WHERE CASE WHEN run_set::VARCHAR[] IS NULL THEN (seed = 0 OR seeds) AND cross_fit = 0
               ELSE list_contains(run_set::VARCHAR[], run_id) END),
members AS (
    SELECT *, row_number() OVER (PARTITION BY model, view, family
                                 ORDER BY probe_id <> family_id, seed, run_id) = 1 AS votes,
           count(*) OVER (PARTITION BY model, view, family) AS relatives,
           count(DISTINCT family) OVER (PARTITION BY model, view) AS families,
           list(run_id ORDER BY seed, run_id) OVER (
               PARTITION BY model, view, family, probe_id, cross_fit
               ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS refits
    FROM chosen),
layers AS (
    SELECT m.model, m.view, d.k, d.image_id, d.run_id, m.probe_id, m.family, m.votes, m.refits, d.layer, m.t,
           decision_band(d.layer, m.t) AS band, d.never_stable, m.probes, m.families, m.relatives,
           count(*) OVER (PARTITION BY m.model, m.view, d.k, d.image_id) AS seen
    FROM joint_decisions(min_conf := min_conf) d JOIN members m USING (run_id) JOIN images i USING (image_id)
    WHERE d.k <= kmax AND in_scope(scope, i.split, m.cross_fit))
SELECT model, view, k, image_id, run_id, probe_id, family, votes, refits, layer, t, band, never_stable, probes,
       families,
       CASE WHEN families > 1 THEN min(band) FILTER (WHERE votes) OVER w = max(band) FILTER (WHERE votes) OVER w
       END AS band_holds,
       CASE WHEN families > 1 THEN min(layer) FILTER (WHERE votes) OVER w = max(layer) FILTER (WHERE votes) OVER w
       END AS layer_holds,
       CASE WHEN relatives > 1 THEN min(band) OVER f = max(band) OVER f END AS family_holds
FROM layers
WHERE seen = probes
WINDOW w AS (PARTITION BY model, view, k, image_id), f AS (PARTITION BY model, view, k, image_id, family)
ORDER BY model, view, k, image_id, run_id;
