-- definition_pairs(runs, k := 2, min_conf := 0.5, scope := 'auto') -> (a, b, image_id, layer_a, layer_b, t_a,
-- band_a, band_b, kind_a, kind_b, t_b): every image that two definitions of decision_definitions both place, per pair
-- a < b, with each definition's kind (l*, joint, depth) and last anchor T.
CREATE OR REPLACE MACRO definition_pairs(runs, k := 2, min_conf := 0.5, scope := 'auto') AS TABLE
WITH d AS MATERIALIZED (SELECT * FROM decision_definitions(runs, k, min_conf, scope))
SELECT x.definition AS a, y.definition AS b, x.image_id, x.layer AS layer_a, y.layer AS layer_b, x.t AS t_a,
       x.band AS band_a, y.band AS band_b, x.kind AS kind_a, y.kind AS kind_b, y.t AS t_b
FROM d x JOIN d y ON x.image_id = y.image_id AND x.definition < y.definition;
