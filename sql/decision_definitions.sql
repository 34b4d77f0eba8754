-- decision_definitions(runs, k := 2, min_conf := 0.5, scope := 'auto') -> (definition, kind, run_id, image_id,
-- layer, t, band): every image's decision layer under each established definition, for each run in the list
-- `runs`: kind 'l*' = l*(k) (docs/design.md §7), 'depth' = prediction depth against the model's own output
-- (prediction_depths; T + 1 when unsettled), 'joint' = l*(k) stable and confident at >= min_conf (only when
-- min_conf > 0). definition = kind (with its parameters) and run id; band = decision_band: early (layer < 0.3T),
-- mid, late (layer >= 0.7T); an unsettled depth (T + 1: even anchor T is not the model's answer) is 'unsettled', in
-- no band of the three.
CREATE OR REPLACE MACRO decision_definitions(runs, k := 2, min_conf := 0.5, scope := 'auto') AS TABLE
WITH layers AS (
    SELECT 'l*' AS kind, 'l*(' || k || ')' AS name, run_id, image_id, layer, t
    FROM decision_layers(k, scope) WHERE list_contains(runs, run_id)
    UNION ALL
    SELECT 'depth', 'depth', run_id, image_id, depth, t
    FROM prediction_depths(scope) WHERE list_contains(runs, run_id)
    UNION ALL
    SELECT 'joint', 'joint(' || k || ', ' || min_conf || ')', run_id, image_id, layer, t
    FROM decision_layers(k, scope, min_conf := min_conf, of_runs := runs) WHERE min_conf > 0)
SELECT name || ' ' || run_id AS definition, kind, run_id, image_id, layer, t,
       CASE WHEN kind = 'depth' AND layer > t THEN 'unsettled' ELSE decision_band(layer, t) END AS band
FROM layers;
