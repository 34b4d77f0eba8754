-- prediction_depth_summary(runs, scope := 'auto') -> (run_id, layer0, input_layer0, reference_rows, t, n,
-- unsettled, f_unsettled): per run of the list `runs`, what its prediction depths are read against: anchor 0's
-- name (input_layer0: it is the input image, Baldock et al.'s layer 0), the rows its probes learnt from (knn: the
-- rows that vote), T, the images placed and those even anchor T does not settle (no depth; counted apart from late).
CREATE OR REPLACE MACRO prediction_depth_summary(runs, scope := 'auto') AS TABLE
SELECT run_id, any_value(layer0) AS layer0, any_value(layer0) = 'input' AS input_layer0,
       any_value(reference_rows) AS reference_rows, any_value(t) AS t, count(*) AS n,
       count(*) FILTER (WHERE NOT settled) AS unsettled, avg((NOT settled)::INT) AS f_unsettled
FROM prediction_depths(scope) WHERE list_contains(runs, run_id)
GROUP BY run_id ORDER BY list_position(runs, run_id);
