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
imgs AS (  -- each image's label and the model's own prediction (head), where a policy reaches full depth
    SELECT i.image_id, i.label, mo.pred AS head
    FROM exit_images(sim_run, scope := scope, gate_thresholds := gate_thresholds) i
    LEFT JOIN model_outputs mo ON mo.image_id = i.image_id AND mo.model = (SELECT model FROM r)
                              AND mo.view = (SELECT view FROM r)),
p AS (SELECT s.image_id, s.anchor, s.pred, s.conf, imgs.label, imgs.head,
             s.anchor - min(s.anchor) OVER (PARTITION BY s.image_id, s.pred, s.island) AS stable_for
      FROM prediction_islands(sim_run) s JOIN imgs USING (image_id)),
ks_ AS (SELECT DISTINCT unnest(ks) AS k),
defaults AS (SELECT  -- 0.5:0.99:0.01 (ExitPolicies); NULL thresholds mean these
    [0.5, 0.51, 0.52, 0.53, 0.54, 0.55, 0.56, 0.57, 0.58, 0.59, 0.6, 0.61, 0.62, 0.63, 0.64, 0.65, 0.66,
     0.67, 0.68, 0.69, 0.7, 0.71, 0.72, 0.73, 0.74, 0.75, 0.76, 0.77, 0.78, 0.79, 0.8, 0.81, 0.82, 0.83,
     0.84, 0.85, 0.86, 0.87, 0.88, 0.89, 0.9, 0.91, 0.92, 0.93, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99] AS fallback),
th AS (SELECT DISTINCT unnest(coalesce(thresholds, (SELECT fallback FROM defaults))) AS theta),
cth AS (SELECT DISTINCT unnest(combined_thresholds) AS theta),
gth AS (SELECT DISTINCT unnest(coalesce(gate_thresholds, (SELECT fallback FROM defaults))) AS theta),
gated AS (SELECT p.image_id, p.anchor, p.pred, g.score
          FROM p JOIN gate_scores g ON g.run_id = sim_run AND NOT g.learnt AND g.image_id = p.image_id
                                    AND g.anchor = p.anchor),
-- the threshold policies' gauges per image and anchor, under one integer key (a string costs the window and the
-- join below twice the time): combined (k, θ) reads the confidence of the anchors stable for k (key k >= 1),
-- confidence every anchor's (key 0), learned every gated anchor's score (key -1)
gauges AS (
    SELECT k AS gauge, image_id, anchor, pred, conf AS value FROM p, ks_ WHERE stable_for >= k
    UNION ALL
    SELECT 0, image_id, anchor, pred, conf FROM p
    UNION ALL
    SELECT -1, image_id, anchor, pred, score FROM gated),
-- the anchors that raise an image's highest gauge so far, each with the highest before it (below): the first anchor
-- whose gauge is >= θ is the one of these with below < θ <= value, so a threshold reads an image's few raising
-- anchors rather than all of them
steps AS (
    SELECT * FROM (SELECT *, max(value) OVER (PARTITION BY gauge, image_id ORDER BY anchor
                                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS below
                   FROM gauges)
    WHERE below IS NULL OR value > below),
gauged AS (  -- every threshold policy's (k, θ) for every image it decides on
    SELECT 'combined' AS policy, k, k AS gauge, theta, image_id, label, head FROM imgs, ks_, cth
    UNION ALL
    SELECT 'confidence', NULL, 0, theta, image_id, label, head FROM imgs, th
    UNION ALL
    SELECT 'learned', NULL, -1, theta, image_id, label, head
    FROM imgs SEMI JOIN gated USING (image_id), gth),
events AS (
    SELECT 'stability' AS policy, k, NULL::DOUBLE AS theta, image_id, label, head,
           min(anchor) FILTER (WHERE stable_for >= k) AS exit_anchor,
           arg_min(pred, anchor) FILTER (WHERE stable_for >= k) AS exit_pred
    FROM p, ks_ GROUP BY k, image_id, label, head
    UNION ALL
    SELECT g.policy, g.k, g.theta, g.image_id, g.label, g.head, s.anchor, s.pred
    FROM gauged g LEFT JOIN steps s
    ON s.gauge = g.gauge AND s.image_id = g.image_id AND s.value >= g.theta::REAL
       AND (s.below IS NULL OR s.below < g.theta::REAL)
    UNION ALL
    SELECT 'oracle', NULL, NULL, image_id, label, head, min(anchor) FILTER (WHERE pred = label),
           arg_min(pred, anchor) FILTER (WHERE pred = label)
    FROM p GROUP BY image_id, label, head
    UNION ALL
    SELECT 'full depth', NULL, NULL, image_id, label, head, NULL, NULL FROM imgs)
SELECT policy, k, theta, image_id, label, exit_anchor,
       CASE WHEN exit_anchor IS NULL THEN head ELSE exit_pred END AS pred
FROM events;
