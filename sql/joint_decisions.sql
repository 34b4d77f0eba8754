-- joint_decisions(min_conf := 0) -> (run_id, image_id, k, layer, stable_pred, correct, never_stable): the rows of
-- `decisions` (every run, k = 1..T) under the joint "stable and confident" criterion (docs/design.md §7):
-- l*(k, θ) = the first l whose predictions at l..l+k are equal and whose confidence at l is >= θ (compared at
-- the stored float32 precision); none -> T, never stable, settling on the prediction at T, as today.
-- min_conf = 0 is exactly `decisions` (read from it, not recomputed).
CREATE OR REPLACE MACRO joint_decisions(min_conf := 0) AS TABLE
WITH p AS (
    SELECT run_id, image_id, anchor, pred, conf,
           anchor - row_number() OVER (PARTITION BY run_id, image_id, pred ORDER BY anchor) AS island
    FROM predictions WHERE min_conf > 0),
ahead AS (  -- how many of the following anchors repeat this anchor's prediction
    SELECT run_id, image_id, anchor, pred, conf,
           max(anchor) OVER (PARTITION BY run_id, image_id, pred, island) - anchor AS ahead
    FROM p),
reach AS (  -- the confident anchors, with the farthest any confident anchor before them reaches
    SELECT run_id, image_id, anchor, pred, ahead,
           coalesce(max(ahead) OVER (PARTITION BY run_id, image_id ORDER BY anchor
                                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
    FROM ahead WHERE conf >= min_conf::REAL),
firsts AS (  -- each window k that a confident anchor is the first to reach (columns named apart from k: a macro
             -- calling this one with a parameter k would substitute it for any bare column k)
    SELECT run_id, image_id, unnest(range(before + 1, ahead + 1)) AS window_k, anchor AS layer, pred AS stable_pred
    FROM reach WHERE ahead > before),
finals AS (
    SELECT a.run_id, a.image_id, a.pred AS final_pred, r.n_anchors - 1 AS t
    FROM ahead a JOIN runs r USING (run_id) WHERE a.anchor = r.n_anchors - 1),
grid AS (SELECT *, unnest(range(1, t + 1)) AS window_k FROM finals)
SELECT d.run_id, d.image_id, d.k, d.layer, d.stable_pred, d.correct, d.never_stable FROM decisions d WHERE min_conf <= 0
UNION ALL
SELECT g.run_id, g.image_id, g.window_k::SMALLINT, coalesce(s.layer, g.t)::SMALLINT,
       coalesce(s.stable_pred, g.final_pred), coalesce(s.stable_pred, g.final_pred) = i.label, s.layer IS NULL
FROM grid g JOIN images i USING (image_id) LEFT JOIN firsts s USING (run_id, image_id, window_k);
