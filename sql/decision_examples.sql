-- decision_examples(k, per_side := 4, scope := 'auto', min_conf := 0) -> (run_id, side, image_id, path, label,
-- layer, t, never_stable, preds, confs): per run, a few correctly decided images that settle early (l* < 0.3T) and late
-- (l* >= 0.7T, settled ones before never-stable ones), with their timelines; picked by a fixed hash of the id.
CREATE OR REPLACE MACRO decision_examples(k, per_side := 4, scope := 'auto', min_conf := 0) AS TABLE
WITH d AS (
    SELECT *, nullif(decision_band(layer, t), 'mid') AS side
    FROM decision_layers(k, scope, min_conf := min_conf) WHERE correct),
ranked AS (
    SELECT *, row_number() OVER (PARTITION BY run_id, side ORDER BY never_stable, hash(image_id), image_id) AS pick
    FROM d WHERE side IS NOT NULL)
SELECT r.run_id, r.side, r.image_id, i.path, r.label, r.layer, r.t, r.never_stable, tl.preds, tl.confs
FROM ranked r JOIN images i USING (image_id) JOIN timelines tl USING (run_id, image_id)
WHERE r.pick <= per_side
ORDER BY r.run_id, r.side, r.layer, r.image_id;
