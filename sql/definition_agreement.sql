-- definition_agreement(runs, k := 2, min_conf := 0.5, scope := 'auto') -> (a, b, n, spearman, same_band,
-- early_a_late_b, late_a_early_b): per pair of definitions (decision_definitions), over the images both place:
-- Spearman's ρ of their layers (average ranks for ties; NULL when one is constant), the share of images in the
-- same band, and how many are early by one and late by the other.
CREATE OR REPLACE MACRO definition_agreement(runs, k := 2, min_conf := 0.5, scope := 'auto') AS TABLE
WITH p AS (SELECT * FROM definition_pairs(runs, k, min_conf, scope)),
ranked AS (
    SELECT *, average_rank(layer_a, (a, b)) AS ra, average_rank(layer_b, (a, b)) AS rb
    FROM p)
SELECT a, b, count(*) AS n, CASE WHEN stddev_pop(ra) > 0 AND stddev_pop(rb) > 0 THEN corr(ra, rb) END AS spearman,
       avg((band_a = band_b)::INT) AS same_band,
       count(*) FILTER (WHERE band_a = 'early' AND band_b = 'late') AS early_a_late_b,
       count(*) FILTER (WHERE band_a = 'late' AND band_b = 'early') AS late_a_early_b
FROM ranked GROUP BY a, b ORDER BY a, b;
