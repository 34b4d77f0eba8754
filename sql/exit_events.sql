-- exit_events(sim_run, ks, thresholds, combined_thresholds, scope := 'auto', gate_thresholds) -> (policy, k,
-- theta, image_id, label, exit_anchor, pred): where each early-exit policy leaves the network for each image
-- (docs/design.md §7), from the stored predictions alone. exit_anchor NULL = full depth, where the prediction is
-- the model's own head. stability k: first l >= k with equal predictions at l-k..l (= l*(k)+k); confidence θ:
-- first l with conf >= θ (compared at the stored float32 precision); combined (k, θ): both at the same l; learned
-- θ: first l whose learned gate score (gate_scores, `featstore gate`) is >= θ, when the run has a gate; oracle:
-- first anchor whose prediction is correct. Every policy is counted on the same images, exit_images: the scope's
-- that the run predicted, and with the learned gate in the comparison only those the gate did not learn from
-- (exit_population says which).
CREATE OR REPLACE MACRO exit_events(sim_run, ks := [1, 2, 3, 4],
                                    thresholds := NULL,
                                    combined_thresholds := [0.5, 0.7, 0.9], scope := 'auto',
                                    gate_thresholds := NULL) AS TABLE
WITH r AS (SELECT run_id, model, view FROM runs WHERE run_id = sim_run),
imgs AS (SELECT image_id, label FROM exit_images(sim_run, scope := scope, gate_thresholds := gate_thresholds)),
p AS (SELECT s.image_id, s.anchor, s.pred, s.conf, imgs.label,
             s.anchor - min(s.anchor) OVER (PARTITION BY s.image_id, s.pred, s.island) AS stable_for
      FROM prediction_islands(sim_run) s JOIN imgs USING (image_id)),
ks_ AS (SELECT unnest(ks) AS k),
defaults AS (SELECT  -- 0.5:0.99:0.01 (ExitPolicies); NULL thresholds mean these
    [0.5, 0.51, 0.52, 0.53, 0.54, 0.55, 0.56, 0.57, 0.58, 0.59, 0.6, 0.61, 0.62, 0.63, 0.64, 0.65, 0.66,
     0.67, 0.68, 0.69, 0.7, 0.71, 0.72, 0.73, 0.74, 0.75, 0.76, 0.77, 0.78, 0.79, 0.8, 0.81, 0.82, 0.83,
     0.84, 0.85, 0.86, 0.87, 0.88, 0.89, 0.9, 0.91, 0.92, 0.93, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99] AS fallback),
th AS (SELECT unnest(coalesce(thresholds, (SELECT fallback FROM defaults))) AS theta),
cth AS (SELECT unnest(combined_thresholds) AS theta),
gth AS (SELECT unnest(coalesce(gate_thresholds, (SELECT fallback FROM defaults))) AS theta),
gate AS (SELECT image_id, anchor, score FROM gate_scores WHERE run_id = sim_run AND NOT learnt),
events AS (
    SELECT 'stability' AS policy, k, NULL::DOUBLE AS theta, image_id,
           min(anchor) FILTER (WHERE stable_for >= k) AS exit_anchor,
           arg_min(pred, anchor) FILTER (WHERE stable_for >= k) AS exit_pred
    FROM p, ks_ GROUP BY k, image_id
    UNION ALL
    SELECT 'confidence', NULL, theta, image_id, min(anchor) FILTER (WHERE conf >= theta::REAL),
           arg_min(pred, anchor) FILTER (WHERE conf >= theta::REAL)
    FROM p, th GROUP BY theta, image_id
    UNION ALL
    SELECT 'combined', k, theta, image_id, min(anchor) FILTER (WHERE stable_for >= k AND conf >= theta::REAL),
           arg_min(pred, anchor) FILTER (WHERE stable_for >= k AND conf >= theta::REAL)
    FROM p, ks_, cth GROUP BY k, theta, image_id
    UNION ALL
    SELECT 'learned', NULL, theta, image_id, min(anchor) FILTER (WHERE score >= theta::REAL),
           arg_min(pred, anchor) FILTER (WHERE score >= theta::REAL)
    FROM p JOIN gate USING (image_id, anchor), gth GROUP BY theta, image_id
    UNION ALL
    SELECT 'oracle', NULL, NULL, image_id, min(anchor) FILTER (WHERE pred = label),
           arg_min(pred, anchor) FILTER (WHERE pred = label)
    FROM p GROUP BY image_id
    UNION ALL
    SELECT 'full depth', NULL, NULL, image_id, NULL, NULL FROM imgs)
SELECT e.policy, e.k, e.theta, e.image_id, imgs.label, e.exit_anchor,
       CASE WHEN e.exit_anchor IS NULL THEN mo.pred ELSE e.exit_pred END AS pred
FROM events e JOIN imgs USING (image_id)
LEFT JOIN model_outputs mo ON mo.image_id = e.image_id AND mo.model = (SELECT model FROM r)
                          AND mo.view = (SELECT view FROM r);
