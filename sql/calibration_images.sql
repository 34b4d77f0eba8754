-- calibration_images(of_run, bins := 15, scope := 'auto', binning := 'width') -> (run_id, anchor, image_id, hit,
-- conf, bin): per anchor and image the scope counts, whether its probe is right (hit 0/1), its confidence and its
-- calibration bin (docs/design.md §7). binning 'width': `bins` equal-width bins (lo, hi] over [0, 1] (conf 0 in the
-- first); 'mass': `bins` equal-mass bins, the anchor's images ordered by (conf, image_id) and cut into runs of
-- equal count (the first n mod bins one image larger: DuckDB's ntile, numpy's array_split). A knn run's confidence
-- is v/k, v of its k neighbours voting for the winner: it is binned on the exact integer count (bin = ceil(v B / k),
-- compared in integers) and given as the exact fraction v/k, since v/k stored as float32 lands above a bin edge it
-- lies on (k = 30, B = 15: every even v). bins < 1 (or not a whole number) and any other binning are errors here,
-- in the macro, so every caller (featstore sql, any DuckDB client, Python) is refused alike: greatest(1, ...) below
-- would otherwise fold every image into one bin.
CREATE OR REPLACE MACRO calibration_images(of_run, bins := 15, scope := 'auto', binning := 'width') AS TABLE
WITH v AS (SELECT p.run_id, p.anchor, p.image_id, p.pred = i.label AS right_pred, p.conf::DOUBLE AS conf,
                  CASE WHEN r.probe = 'knn' THEN (r.params->>'k')::BIGINT END AS k
           FROM predictions p JOIN runs r USING (run_id) JOIN images i USING (image_id)
           WHERE p.run_id = of_run AND in_scope(scope, i.split, r.cross_fit)
             AND (bins >= 1 AND bins = floor(bins)
                  OR error('bins ' || bins || ': must be a whole number >= 1 (e.g. bins := 15)'))
             AND (binning IN ('width', 'mass')
                  OR error('binning ''' || binning || ''': use width (equal-width bins) or mass '
                           || '(equal-mass bins)'))),
e AS (SELECT run_id, anchor, image_id, right_pred::INT AS hit, k,
             CASE WHEN k IS NULL THEN conf ELSE round(conf * k) / k END AS conf,
             CASE WHEN k IS NULL THEN greatest(1, least(bins, ceil(conf * bins)))
                  ELSE greatest(1, (round(conf * k)::BIGINT * bins::BIGINT + k - 1) // k) END::INTEGER AS width_bin
      FROM v)
SELECT run_id, anchor, image_id, hit, conf,
       CASE WHEN binning = 'width' THEN width_bin
            ELSE ntile(bins::BIGINT) OVER (PARTITION BY anchor ORDER BY conf, image_id) END::INTEGER AS bin
FROM e
ORDER BY anchor, image_id;
