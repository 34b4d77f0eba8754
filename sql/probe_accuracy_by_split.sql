-- probe_accuracy_by_split: α(l) for every run, anchor and split (train | val | test).
CREATE OR REPLACE VIEW probe_accuracy_by_split AS
SELECT p.run_id, p.anchor, i.split, avg((p.pred = i.label)::INT) AS accuracy, count(*) AS n
FROM predictions p JOIN images i USING (image_id) WHERE i.split <> 'skipped'
GROUP BY p.run_id, p.anchor, i.split;
