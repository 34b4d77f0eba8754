-- head_agreement(scope := 'auto') -> (run_id, model, view, probe, anchor, name, agreement, n): per run and anchor,
-- the share of images whose probe prediction is the model's own (`model_outputs` of the run's view): a lens's
-- "accuracy", and the quantity prediction depth is built from.
CREATE OR REPLACE MACRO head_agreement(scope := 'auto') AS TABLE
SELECT p.run_id, r.model, r.view, r.probe, p.anchor, a.name, avg((p.pred = mo.pred)::INT) AS agreement, count(*) AS n
FROM predictions p JOIN runs r USING (run_id) JOIN images i USING (image_id)
JOIN model_outputs mo ON mo.model = r.model AND mo.view = r.view AND mo.image_id = p.image_id
LEFT JOIN anchors a ON a.model = r.model AND a.anchor = p.anchor
WHERE in_scope(scope, i.split, r.cross_fit)
GROUP BY p.run_id, r.model, r.view, r.probe, p.anchor, a.name
ORDER BY p.run_id, p.anchor;
