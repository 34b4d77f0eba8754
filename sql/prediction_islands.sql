-- prediction_islands(of_run, tap_name := NULL) -> (image_id, anchor, pos, pred, conf, island): every prediction
-- of a run, numbered by the stretch of equal consecutive predictions it lies in; pos is the anchor index, or with
-- tap_name the block index over that tap's anchors. (image_id, pred, island) identifies a stretch: pos minus
-- its rank among equal predictions is constant inside one. l*(k) is the first start (min pos) of a stretch of
-- length (count) >= k+1 (docs/design.md §7): the one definition that decisions, exits and tap timelines use.
CREATE OR REPLACE MACRO prediction_islands(of_run, tap_name := NULL) AS TABLE
WITH seq AS (
    SELECT p.image_id, p.anchor, p.anchor AS pos, p.pred, p.conf
    FROM predictions p WHERE p.run_id = of_run AND tap_name IS NULL
    UNION ALL
    SELECT p.image_id, p.anchor, a.block, p.pred, p.conf
    FROM predictions p JOIN anchors a ON a.anchor = p.anchor
    WHERE tap_name IS NOT NULL AND p.run_id = of_run AND a.tap = tap_name
      AND a.model = (SELECT model FROM runs WHERE run_id = of_run))
SELECT *, pos - row_number() OVER (PARTITION BY image_id, pred ORDER BY pos) AS island FROM seq;
