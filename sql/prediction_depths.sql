-- prediction_depths(scope := 'auto') -> (run_id, image_id, depth, settled, t, head_pred, label, split): prediction
-- depth (Baldock, Maennel and Neyshabur, NeurIPS 2021) of every run against the model's own final prediction
-- (`model_outputs` of the run's view): the smallest anchor l such that the run's prediction equals the model's at
-- every anchor l..T; settled is false, and depth T + 1, when even anchor T disagrees. Their probes are k-NN
-- (`knn`); any run can be read this way. Layer 0 is the first stored anchor, not the input (docs/design.md §5).
CREATE OR REPLACE MACRO prediction_depths(scope := 'auto') AS TABLE
WITH d AS (
    SELECT p.run_id, p.image_id, any_value(mo.pred) AS head_pred,
           coalesce(max(p.anchor) FILTER (WHERE p.pred <> mo.pred), -1) + 1 AS depth
    FROM predictions p JOIN runs r USING (run_id)
    JOIN model_outputs mo ON mo.model = r.model AND mo.view = r.view AND mo.image_id = p.image_id
    GROUP BY p.run_id, p.image_id)
SELECT d.run_id, d.image_id, d.depth::SMALLINT AS depth, d.depth <= r.n_anchors - 1 AS settled,
       r.n_anchors - 1 AS t, d.head_pred, i.label, i.split
FROM d JOIN runs r USING (run_id) JOIN images i USING (image_id)
WHERE in_scope(scope, i.split, r.cross_fit);
