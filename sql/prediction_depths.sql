-- prediction_depths(scope := 'auto') -> (run_id, image_id, depth, settled, t, head_pred, label, split, layer0,
-- reference_rows): prediction depth (Baldock, Maennel and Neyshabur, NeurIPS 2021) of every run against the model's
-- own final prediction (`model_outputs` of the run's view): the smallest anchor l such that the run's prediction
-- equals the model's at every anchor l..T; settled is false, and depth T + 1, when even anchor T disagrees (an
-- unsettled image: no depth, counted apart from late wherever depth prints). Their probes are k-NN (`knn`); any run
-- can be read this way. layer0 = the name of anchor 0: `input` (the image, Baldock's layer 0) where the build
-- stored it, else the first module anchor; reference_rows = what the probe learnt from (for knn: the rows that vote).
CREATE OR REPLACE MACRO prediction_depths(scope := 'auto') AS TABLE
WITH d AS (
    SELECT p.run_id, p.image_id, any_value(mo.pred) AS head_pred,
           coalesce(max(p.anchor) FILTER (WHERE p.pred <> mo.pred), -1) + 1 AS depth
    FROM predictions p JOIN runs r USING (run_id)
    JOIN model_outputs mo ON mo.model = r.model AND mo.view = r.view AND mo.image_id = p.image_id
    GROUP BY p.run_id, p.image_id)
SELECT d.run_id, d.image_id, d.depth::SMALLINT AS depth, d.depth <= r.n_anchors - 1 AS settled,
       r.n_anchors - 1 AS t, d.head_pred, i.label, i.split, a.name AS layer0,
       CASE WHEN coalesce(r.params->>'refs', '') <> '' THEN 'every row of view ' || r.train_view || ' of store '
                 || (r.params->>'refs')
            WHEN r.cross_fit > 0 THEN 'the other ' || (r.cross_fit - 1) || ' of ' || r.cross_fit
                 || ' cross-fit folds of view ' || r.train_view || ', less their val rows'
            WHEN r.params->>'train_on_val' = '1' THEN 'the train and val splits of view ' || r.train_view
            ELSE 'the train split of view ' || r.train_view END AS reference_rows
FROM d JOIN runs r USING (run_id) JOIN images i USING (image_id)
LEFT JOIN anchors a ON a.model = r.model AND a.anchor = 0
WHERE in_scope(scope, i.split, r.cross_fit);
