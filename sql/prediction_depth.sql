-- prediction_depth(of_run, scope := 'auto') -> (image_id, depth, settled, t, head_pred, label, split): one run's
-- prediction depths (see prediction_depths): depth = the smallest l with the run's prediction equal to the model's
-- own at every anchor l..T, else T + 1 with settled false.
CREATE OR REPLACE MACRO prediction_depth(of_run, scope := 'auto') AS TABLE
SELECT image_id, depth, settled, t, head_pred, label, split FROM prediction_depths(scope)
WHERE run_id = of_run ORDER BY image_id;
