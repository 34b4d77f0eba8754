-- definition_pair_stats(runs, k := 2, min_conf := 0.5, scope := 'auto') -> (a, b, n, spearman, same_band,
-- early_a_late_b, late_a_early_b, early_late_decided): per pair of definitions (decision_definitions), from one
-- read of definition_pairs: definition_agreement's figures and early_late_decided, the images early by one and late
-- by the other where both layers are decisions (definition_decided); unordered (definition_agreement and
-- definition_ranking order it).
CREATE OR REPLACE MACRO definition_pair_stats(runs, k := 2, min_conf := 0.5, scope := 'auto') AS TABLE
WITH p AS (SELECT * FROM definition_pairs(runs, k, min_conf, scope)),
ranked AS (
    SELECT *, average_rank(layer_a, (a, b)) AS ra, average_rank(layer_b, (a, b)) AS rb
    FROM p)
SELECT a, b, count(*) AS n, CASE WHEN stddev_pop(ra) > 0 AND stddev_pop(rb) > 0 THEN corr(ra, rb) END AS spearman,
       avg((band_a = band_b)::INT) AS same_band,
       count(*) FILTER (WHERE band_a = 'early' AND band_b = 'late') AS early_a_late_b,
       count(*) FILTER (WHERE band_a = 'late' AND band_b = 'early') AS late_a_early_b,
       count(*) FILTER (WHERE definition_decided(kind_a, layer_a, t_a, k) AND definition_decided(kind_b, layer_b, t_b, k)
                        AND band_a <> band_b AND 'mid' NOT IN (band_a, band_b)) AS early_late_decided
FROM ranked GROUP BY a, b;
