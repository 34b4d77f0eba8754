-- calibration_bins(of_run, bins := 15, scope := 'auto', binning := 'width', min_n := 10) -> (run_id, anchor, name,
-- bin, lo, hi, n, share, accuracy, confidence, gap, sets_mce): the reliability diagram of each anchor's probe
-- (docs/design.md §7): calibration_images' bins, with each bin's image count n, its share of the anchor's images, its
-- accuracy, its mean confidence and |accuracy - confidence|; lo and hi are the bin's edges (binning 'width') or its
-- smallest and largest confidence ('mass'). sets_mce: the bin holds at least min_n images, so its gap may set MCE.
-- Empty bins have no row.
CREATE OR REPLACE MACRO calibration_bins(of_run, bins := 15, scope := 'auto', binning := 'width', min_n := 10) AS TABLE
WITH p AS (SELECT * FROM calibration_images(of_run, bins := bins, scope := scope, binning := binning)
           WHERE min_n >= 1 AND min_n = floor(min_n)
              OR error('min_n ' || min_n || ': must be a whole number >= 1 (e.g. min_n := 10)'))
SELECT p.run_id, p.anchor, any_value(a.name) AS name, p.bin,
       CASE WHEN binning = 'width' THEN (p.bin - 1) / bins ELSE min(p.conf) END AS lo,
       CASE WHEN binning = 'width' THEN p.bin / bins ELSE max(p.conf) END AS hi,
       count(*) AS n, count(*) / any_value(t.n) AS share, avg(p.hit) AS accuracy, avg(p.conf) AS confidence,
       abs(avg(p.hit) - avg(p.conf)) AS gap, count(*) >= min_n AS sets_mce
FROM p JOIN (SELECT anchor, count(*) AS n FROM p GROUP BY anchor) t USING (anchor)
JOIN runs r USING (run_id)
LEFT JOIN anchors a ON a.model = r.model AND a.anchor = p.anchor
GROUP BY p.run_id, p.anchor, p.bin
ORDER BY p.anchor, p.bin;
