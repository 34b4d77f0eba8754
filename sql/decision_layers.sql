-- decision_layers(k, scope := 'auto', min_conf := 0, band := 'paper', of_runs := NULL) -> (run_id, model, view,
-- probe, image_id, k, layer, t, stable_pred, label, correct, never_stable, split, band): l*(k) per image; never-stable images sit at
-- layer T (docs/design.md §7). min_conf := θ > 0: the joint criterion (stable from l for k more anchors and
-- confidence at l >= θ, see joint_decisions); 0 is the stability criterion alone. band: early/mid/late of l* as
-- decision_band names it, 'paper' (thirds of T) or 'window' (thirds of T - k, 'never' for a never-stable image).
-- of_runs: only the runs of that list (NULL: every run), read only for them.
CREATE OR REPLACE MACRO decision_layers(k, scope := 'auto', min_conf := 0, band := 'paper', of_runs := NULL) AS TABLE
SELECT d.run_id, r.model, r.view, r.probe, d.image_id, d.k, d.layer, r.n_anchors - 1 AS t, d.stable_pred,
       i.label, d.correct, d.never_stable, i.split,
       decision_band(d.layer, r.n_anchors - 1, band_window(band, d.k)) AS band
FROM joint_decisions(min_conf := min_conf, of_runs := of_runs) d JOIN runs r USING (run_id) JOIN images i USING (image_id)
WHERE d.k = k AND in_scope(scope, i.split, r.cross_fit);
