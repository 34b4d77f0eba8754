-- overthinking_timelines(of_run, scope := 'auto') -> (image_id, label, head_right, anchor, pred, t): the images
-- `overthinking` counts (first_correct's that have the model's own answer on the run's view), one row per anchor
-- with its probe prediction: what the label-blind permutation null of analytics/readouts.py shuffles labels over.
CREATE OR REPLACE MACRO overthinking_timelines(of_run, scope := 'auto') AS TABLE
SELECT f.image_id, f.label, mo.pred = f.label AS head_right, p.anchor, p.pred, f.t
FROM first_correct(of_run, scope := scope) f
JOIN runs r ON r.run_id = of_run
JOIN model_outputs mo ON mo.image_id = f.image_id AND mo.model = r.model AND mo.view = r.view
JOIN predictions p ON p.run_id = of_run AND p.image_id = f.image_id
ORDER BY f.image_id, p.anchor;
