-- Fills `decisions` for one run ($run_id) from its predictions. l*(k) is the start of the first stretch of
-- equal consecutive predictions of length >= k+1 (docs/design.md §7), so one table of stretches answers every k.
INSERT INTO decisions
WITH stretches AS (
    SELECT image_id, pred, min(pos) AS start, count(*) AS length FROM prediction_islands($run_id)
    GROUP BY image_id, pred, island),
depth AS (SELECT n_anchors - 1 AS t FROM runs WHERE run_id = $run_id),
finals AS (SELECT image_id, pred AS final_pred FROM stretches, depth WHERE start + length - 1 = depth.t),
ks AS (SELECT range AS k FROM range(1, (SELECT t FROM depth) + 1)),
firsts AS (
    SELECT image_id, k, min(start) AS layer, arg_min(pred, start) AS stable_pred
    FROM stretches JOIN ks ON length >= k + 1 GROUP BY image_id, k)
SELECT $run_id, f.image_id, ks.k, coalesce(s.layer, depth.t), coalesce(s.stable_pred, f.final_pred),
       coalesce(s.stable_pred, f.final_pred) = i.label, s.layer IS NULL
FROM finals f CROSS JOIN ks CROSS JOIN depth JOIN images i USING (image_id)
LEFT JOIN firsts s ON s.image_id = f.image_id AND s.k = ks.k;
