-- definition_ranking(runs, k := 2, min_conf := 0.5, scope := 'auto') -> (a, b, n, spearman, same_band,
-- early_a_late_b, late_a_early_b, early_late_decided): definition_agreement of every pair of definitions with
-- early_late_decided, the images early by one and late by the other where both layers are decisions
-- (definition_decided), the pairs that disagree most first (then the fewest in the same band).
CREATE OR REPLACE MACRO definition_ranking(runs, k := 2, min_conf := 0.5, scope := 'auto') AS TABLE
WITH d AS MATERIALIZED (
    SELECT definition, image_id, band, definition_decided(kind, layer, t, k) AS decided
    FROM decision_definitions(runs, k, min_conf, scope)),
decided AS (
    SELECT x.definition AS a, y.definition AS b, count(*) AS early_late_decided
    FROM d x JOIN d y ON x.image_id = y.image_id AND x.definition < y.definition
    WHERE x.decided AND y.decided AND x.band <> y.band AND 'mid' NOT IN (x.band, y.band)
    GROUP BY a, b)
SELECT g.*, coalesce(d.early_late_decided, 0) AS early_late_decided
FROM definition_agreement(runs, k, min_conf, scope) g LEFT JOIN decided d USING (a, b)
ORDER BY early_late_decided DESC, same_band, a, b;
