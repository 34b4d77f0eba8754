-- probe_accuracy(scope := 'auto') -> (run_id, model, view, probe, anchor, name, depth_frac, accuracy, n):
-- α(l), the share of images whose probe prediction at anchor l is the label.
CREATE OR REPLACE MACRO probe_accuracy(scope := 'auto') AS TABLE
SELECT p.run_id, r.model, r.view, r.probe, p.anchor, a.name, a.depth_frac,
       avg((p.pred = i.label)::INT) AS accuracy, count(*) AS n
FROM predictions p JOIN runs r USING (run_id) JOIN images i USING (image_id)
LEFT JOIN anchors a ON a.model = r.model AND a.anchor = p.anchor
WHERE in_scope(scope, i.split, r.cross_fit)
GROUP BY p.run_id, r.model, r.view, r.probe, p.anchor, a.name, a.depth_frac
ORDER BY p.run_id, p.anchor;
