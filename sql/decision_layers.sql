-- decision_layers(k, scope := 'auto') -> (run_id, model, view, probe, image_id, k, layer, t, stable_pred, label,
-- correct, never_stable, split): l*(k) per image; never-stable images sit at layer T (docs/design.md §7).
CREATE OR REPLACE MACRO decision_layers(k, scope := 'auto') AS TABLE
SELECT d.run_id, r.model, r.view, r.probe, d.image_id, d.k, d.layer, r.n_anchors - 1 AS t, d.stable_pred,
       i.label, d.correct, d.never_stable, i.split
FROM decisions d JOIN runs r USING (run_id) JOIN images i USING (image_id)
WHERE d.k = k AND in_scope(scope, i.split, r.cross_fit);
