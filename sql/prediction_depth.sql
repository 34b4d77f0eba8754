-- prediction_depth(of_run, scope := 'auto') -> (image_id, depth, settled, t, head_pred, label, split, layer0,
-- reference_rows): one run's prediction depths (see prediction_depths): depth = the smallest l with the run's
-- prediction equal to the model's own at every anchor l..T, else T + 1 with settled false (unsettled, not late).
CREATE OR REPLACE MACRO prediction_depth(of_run, scope := 'auto') AS TABLE
SELECT image_id, depth, settled, t, head_pred, label, split, layer0, reference_rows FROM prediction_depths(scope)
WHERE run_id = of_run ORDER BY image_id;
