-- prediction_islands(of_run, tap_name := NULL) -> (run_id, image_id, anchor, pos, pred, conf, island): every
-- prediction of a run (of_run NULL: of every run), numbered by the stretch of equal consecutive predictions it lies
-- in; pos is the anchor index, or with tap_name the block index over that tap's anchors. (run_id, image_id, pred,
-- island) identifies a stretch: pos minus its rank among equal predictions is constant inside one. l*(k) is the
-- first start (min pos) of a stretch of length (count) >= k+1 (docs/design.md §7): the one definition that
-- decisions, the joint criterion, exits and tap timelines use.
CREATE OR REPLACE MACRO prediction_islands(of_run, tap_name := NULL) AS TABLE
WITH seq AS (
    SELECT p.run_id, p.image_id, p.anchor, p.anchor AS pos, p.pred, p.conf
    FROM predictions p WHERE (of_run IS NULL OR p.run_id = of_run) AND tap_name IS NULL
    UNION ALL
    SELECT p.run_id, p.image_id, p.anchor, a.block, p.pred, p.conf
    FROM predictions p JOIN runs r ON r.run_id = p.run_id JOIN anchors a ON a.anchor = p.anchor AND a.model = r.model
    WHERE tap_name IS NOT NULL AND (of_run IS NULL OR p.run_id = of_run) AND a.tap = tap_name)
-- (run_id joins the window's partition only when every run is numbered: for one run, a string key there costs
-- 2.3x the window, 0.042 -> 0.097 s at 50,000 images x 12 anchors; the constant CASE costs 0.057 s)
SELECT *, pos - row_number() OVER (PARTITION BY CASE WHEN of_run IS NULL THEN run_id END, image_id, pred
                                   ORDER BY pos) AS island
FROM seq;
