-- tap_decision_layers(grid_run, tap_name, k, scope := 'auto') -> (image_id, layer, t, stable_pred, label, correct,
-- never_stable, split): l*(k) over the block sequence of one tap (layer = block index), the decision-layer formula otherwise.
CREATE OR REPLACE MACRO tap_decision_layers(grid_run, tap_name, k, scope := 'auto') AS TABLE
WITH r AS (SELECT model, cross_fit FROM runs WHERE run_id = grid_run),
seq AS (SELECT image_id, pos, pred, island FROM prediction_islands(grid_run, tap_name := tap_name)),
depth AS (SELECT max(pos) AS t FROM seq),
stretches AS (SELECT image_id, pred, min(pos) AS start, count(*) AS length FROM seq GROUP BY image_id, pred, island),
firsts AS (SELECT image_id, min(start) AS layer, arg_min(pred, start) AS stable_pred FROM stretches
           WHERE length >= k + 1 GROUP BY image_id),
finals AS (SELECT image_id, pred FROM seq, depth WHERE pos = depth.t)
SELECT f.image_id, coalesce(s.layer, depth.t) AS layer, depth.t, coalesce(s.stable_pred, f.pred) AS stable_pred,
       i.label, coalesce(s.stable_pred, f.pred) = i.label AS correct, s.layer IS NULL AS never_stable, i.split
FROM finals f CROSS JOIN depth JOIN images i USING (image_id) LEFT JOIN firsts s USING (image_id)
WHERE in_scope(scope, i.split, (SELECT cross_fit FROM r))
ORDER BY f.image_id;
