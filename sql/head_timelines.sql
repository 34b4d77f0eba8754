-- head_timelines(of_run) -> (image_id, label, split, head_pred, preds, confs): one run's prediction timelines (as
-- `timelines`) with the model's own prediction on the run's view (`model_outputs`; NULL where none was stored):
-- what the learned exit gate learns from.
CREATE OR REPLACE MACRO head_timelines(of_run) AS TABLE
SELECT tl.image_id, tl.label, tl.split, mo.pred AS head_pred, tl.preds, tl.confs
FROM timelines tl JOIN runs r USING (run_id)
LEFT JOIN model_outputs mo ON mo.model = r.model AND mo.view = r.view AND mo.image_id = tl.image_id
WHERE tl.run_id = of_run
ORDER BY tl.image_id;
