-- timelines: per run and image, the predictions and confidences in anchor order, with the label.
CREATE OR REPLACE VIEW timelines AS
SELECT p.run_id, p.image_id, i.label, i.split, list(p.pred ORDER BY p.anchor) AS preds,
       list(p.conf ORDER BY p.anchor) AS confs
FROM predictions p JOIN images i USING (image_id)
GROUP BY p.run_id, p.image_id, i.label, i.split;
