-- prediction_islands(of_run, tap_name := NULL) -> (run_id, image_id, anchor, pos, pred, conf, island): every
-- prediction of a run (of_run NULL: of every run of `runs`), numbered by the stretch of equal consecutive predictions
-- it lies in; pos is the anchor index, or with tap_name the block index over that tap's anchors. (run_id, image_id,
-- pred, island) identifies a stretch: pos minus its rank among equal predictions is constant inside one. l*(k) is the
-- first start (min pos) of a stretch of length (count) >= k+1 (docs/design.md §7): the one definition that
-- decisions, the joint criterion, exits and tap timelines use.
CREATE OR REPLACE MACRO prediction_islands(of_run, tap_name := NULL) AS TABLE
WITH numbers AS (  -- every run numbered, when every run's predictions are: the window below partitions on the number
    SELECT run_id, row_number() OVER (ORDER BY run_id) AS number FROM runs WHERE of_run IS NULL),
seq AS (
    SELECT p.run_id, p.image_id, p.anchor, p.anchor AS pos, p.pred, p.conf
    FROM predictions p WHERE (of_run IS NULL OR p.run_id = of_run) AND tap_name IS NULL
    UNION ALL
    SELECT p.run_id, p.image_id, p.anchor, a.block, p.pred, p.conf
    FROM predictions p JOIN runs r ON r.run_id = p.run_id JOIN anchors a ON a.anchor = p.anchor AND a.model = r.model
    WHERE tap_name IS NOT NULL AND (of_run IS NULL OR p.run_id = of_run) AND a.tap = tap_name)
-- (the run joins the window's partition only when every run is numbered, and as its number: a string key there costs
-- 2.3x the window, 0.042 -> 0.097 s at 50,000 images x 12 anchors for one run, and for the 8 runs of 48,000 images
-- run_id costs twice their number)
SELECT s.run_id, s.image_id, s.anchor, s.pos, s.pred, s.conf,
       s.pos - row_number() OVER (PARTITION BY n.number, image_id, pred ORDER BY pos) AS island
FROM seq s LEFT JOIN numbers n ON n.run_id = s.run_id
WHERE of_run IS NOT NULL OR n.number IS NOT NULL;
