-- image_timeline(image, k := 2) -> (run_id, model, view, probe, image_id, path, split, label, label_name, anchor,
-- name, pred, pred_name, conf, correct, layer, never_stable, decided): one image's prediction and confidence at every
-- anchor of every run that predicted it, with its decision layer l*(k) (decided: this anchor is l*; never at a
-- never-stable image's T, where the sweep counts it without a decision).
CREATE OR REPLACE MACRO image_timeline(image, k := 2) AS TABLE
WITH names AS (SELECT label, any_value(class_name) AS class_name FROM images GROUP BY label)
SELECT p.run_id, r.model, r.view, r.probe, p.image_id, i.path, i.split, i.label, ln.class_name AS label_name,
       p.anchor, a.name, p.pred, pn.class_name AS pred_name, p.conf, p.pred = i.label AS correct, d.layer,
       d.never_stable, p.anchor = d.layer AND NOT d.never_stable AS decided
FROM predictions p JOIN runs r USING (run_id) JOIN images i USING (image_id)
JOIN anchors a ON a.model = r.model AND a.anchor = p.anchor
LEFT JOIN decisions d ON d.run_id = p.run_id AND d.image_id = p.image_id AND d.k = k
LEFT JOIN names ln ON ln.label = i.label LEFT JOIN names pn ON pn.label = p.pred
WHERE p.image_id = image
ORDER BY p.run_id, p.anchor;
