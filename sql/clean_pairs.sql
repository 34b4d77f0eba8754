-- clean_pairs: each run on a corrupted view with the clean run that used the same probes (same model,
-- variant, training view, cross-fit and seed): the pairs a corruption shift compares.
CREATE OR REPLACE VIEW clean_pairs AS
SELECT v.run_id, v.model, v.view, v.probe, c.run_id AS clean_run_id
FROM runs v JOIN runs c
  ON c.model = v.model AND c.view = 'clean' AND c.probe = v.probe AND c.train_view = v.train_view
 AND c.cross_fit = v.cross_fit AND c.seed = v.seed
 AND c.probe_name = v.probe_name
WHERE v.view <> 'clean';
