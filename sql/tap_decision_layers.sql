-- tap_decision_layers(grid_run, tap_name, k, scope := 'auto', min_conf := 0) -> (image_id, layer, t, stable_pred,
-- label, correct, never_stable, split): l*(k) over the block sequence of one tap (layer = block index), the
-- decision-layer formula otherwise; min_conf > 0 adds the joint criterion's confidence test at l.
CREATE OR REPLACE MACRO tap_decision_layers(grid_run, tap_name, k, scope := 'auto', min_conf := 0) AS TABLE
WITH r AS (SELECT model, cross_fit FROM runs WHERE run_id = grid_run),
seq AS (SELECT image_id, pos, pred, conf, island FROM prediction_islands(grid_run, tap_name := tap_name)),
depth AS (SELECT max(pos) AS t FROM seq),
ahead AS (SELECT *, max(pos) OVER (PARTITION BY image_id, pred, island) - pos AS ahead FROM seq),
firsts AS (SELECT image_id, min(pos) AS layer, arg_min(pred, pos) AS stable_pred FROM ahead
           WHERE ahead >= k AND conf >= min_conf::REAL GROUP BY image_id),
finals AS (SELECT image_id, pred FROM seq, depth WHERE pos = depth.t)
SELECT f.image_id, coalesce(s.layer, depth.t) AS layer, depth.t, coalesce(s.stable_pred, f.pred) AS stable_pred,
       i.label, coalesce(s.stable_pred, f.pred) = i.label AS correct, s.layer IS NULL AS never_stable, i.split
FROM finals f CROSS JOIN depth JOIN images i USING (image_id) LEFT JOIN firsts s USING (image_id)
WHERE in_scope(scope, i.split, (SELECT cross_fit FROM r))
ORDER BY f.image_id;
