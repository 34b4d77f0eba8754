-- calibration_bins(of_run, bins := 15, scope := 'auto') -> (run_id, anchor, name, bin, lo, hi, n, share, accuracy,
-- confidence, gap): the reliability diagram of each anchor's probe (docs/design.md §7): the images the scope counts,
-- in `bins` equal-width confidence bins (lo, hi] over [0, 1] (conf 0 in the first), with each bin's share of the
-- anchor's images, its accuracy, its mean confidence and |accuracy - confidence|. Empty bins have no row. A knn
-- run's confidence is v/k, v of its k neighbours voting for the winner: it is binned on the exact integer count
-- (bin = ceil(v B / k), compared in integers) and averaged as the exact fraction v/k, since v/k stored as float32
-- lands above a bin edge it lies on (k = 30, B = 15: every even v). bins < 1 (or not a whole number) is an error
-- here, in the macro, so every caller (featstore sql, any DuckDB client, Python) is refused alike: greatest(1, ...)
-- below would otherwise fold every image into one bin.
CREATE OR REPLACE MACRO calibration_bins(of_run, bins := 15, scope := 'auto') AS TABLE
WITH v AS (SELECT p.run_id, p.anchor, p.pred = i.label AS right_pred, p.conf::DOUBLE AS conf,
                  CASE WHEN r.probe = 'knn' THEN (r.params->>'k')::BIGINT END AS k
           FROM predictions p JOIN runs r USING (run_id) JOIN images i USING (image_id)
           WHERE p.run_id = of_run AND in_scope(scope, i.split, r.cross_fit)
             AND (bins >= 1 AND bins = floor(bins)
                  OR error('calibration_bins: bins ' || bins || ': must be a whole number >= 1 (e.g. bins := 15)'))),
p AS (SELECT run_id, anchor, right_pred::INT AS hit,
             CASE WHEN k IS NULL THEN greatest(1, least(bins, ceil(conf * bins)))
                  ELSE greatest(1, (round(conf * k)::BIGINT * bins::BIGINT + k - 1) // k) END::INTEGER AS bin,
             CASE WHEN k IS NULL THEN conf ELSE round(conf * k) / k END AS conf
      FROM v)
SELECT p.run_id, p.anchor, any_value(a.name) AS name, p.bin, (p.bin - 1) / bins AS lo, p.bin / bins AS hi,
       count(*) AS n, count(*) / any_value(t.n) AS share, avg(p.hit) AS accuracy, avg(p.conf) AS confidence,
       abs(avg(p.hit) - avg(p.conf)) AS gap
FROM p JOIN (SELECT anchor, count(*) AS n FROM p GROUP BY anchor) t USING (anchor)
JOIN runs r USING (run_id)
LEFT JOIN anchors a ON a.model = r.model AND a.anchor = p.anchor
GROUP BY p.run_id, p.anchor, p.bin
ORDER BY p.anchor, p.bin;
