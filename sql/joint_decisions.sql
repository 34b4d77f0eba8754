-- joint_decisions(min_conf := 0, of_runs := NULL) -> (run_id, image_id, k, layer, stable_pred, correct,
-- never_stable): the rows of `decisions` (every run, or the runs of the list of_runs, read only for them; k = 1..T)
-- under the joint "stable and confident" criterion (docs/design.md §7):
-- l*(k, θ) = the first l whose predictions at l..l+k are equal and whose confidence at l is >= θ (compared at
-- the stored float32 precision); none -> T, never stable, settling on the prediction at T, as today.
-- min_conf = 0 is exactly `decisions` (read from it, not recomputed). Inside a stretch of equal predictions only
-- its first confident anchor can be a decision layer (it reaches furthest): the stretches in anchor order, each
-- the first to reach the windows k beyond what the earlier ones reach, answer every k at once. (Columns are named apart from k: a macro calling this one with a parameter k
-- would substitute it for any bare column k.)
CREATE OR REPLACE MACRO joint_decisions(min_conf := 0, of_runs := NULL) AS TABLE
WITH p AS (SELECT * FROM prediction_islands(NULL)  -- every run's stretches (of_runs: theirs alone)
          WHERE min_conf > 0 AND (of_runs IS NULL OR list_contains(of_runs, run_id))),
stretches AS (
    SELECT run_id, image_id, pred, max(pos) AS stop,
           min(pos) FILTER (WHERE conf >= min_conf::REAL) AS first_sure
    FROM p GROUP BY run_id, image_id, pred, island),
finals AS (
    SELECT s.run_id, s.image_id, s.pred AS final_pred, r.n_anchors - 1 AS t
    FROM stretches s JOIN runs r USING (run_id) WHERE s.stop = r.n_anchors - 1),
grid AS (SELECT *, unnest(range(1, t + 1)) AS window_k FROM finals),
ranked AS (  -- the stretches in anchor order, each with the farthest any earlier stretch reaches
    SELECT run_id, image_id, pred, first_sure, stop - first_sure AS reach,
           coalesce(max(stop - first_sure) OVER (PARTITION BY run_id, image_id ORDER BY first_sure
                                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
    FROM stretches WHERE first_sure IS NOT NULL),
firsts AS (  -- the windows k for which a stretch's first confident anchor is the decision layer
    SELECT run_id, image_id, unnest(range(before + 1, reach + 1)) AS window_k, first_sure AS layer,
           pred AS stable_pred
    FROM ranked WHERE reach > before)
SELECT d.run_id, d.image_id, d.k, d.layer, d.stable_pred, d.correct, d.never_stable FROM decisions d
WHERE min_conf <= 0 AND (of_runs IS NULL OR list_contains(of_runs, d.run_id))
UNION ALL
SELECT g.run_id, g.image_id, g.window_k::SMALLINT, coalesce(s.layer, g.t)::SMALLINT,
       coalesce(s.stable_pred, g.final_pred), coalesce(s.stable_pred, g.final_pred) = i.label, s.layer IS NULL
FROM grid g JOIN images i USING (image_id) LEFT JOIN firsts s USING (run_id, image_id, window_k);
