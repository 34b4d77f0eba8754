-- definition_decided_disagreements(runs, k := 2, min_conf := 0.5, per_pair := 4, scope := 'auto') -> (a, b, n, side,
-- image_id, path, label, layer_a, layer_b, t): per pair of definitions (decision_definitions), the n images early by
-- one and late by the other where both layers are decisions, not a fallback (definition_decided), and a few of
-- them (side 'a early, b late' or 'a late, b early'), picked by a fixed hash of the id: the disagreements the report
-- shows, pairs with the most first.
CREATE OR REPLACE MACRO definition_decided_disagreements(runs, k := 2, min_conf := 0.5, per_pair := 4,
                                                         scope := 'auto') AS TABLE
WITH d AS MATERIALIZED (
    SELECT *, definition_decided(kind, layer, t, k) AS decided
    FROM decision_definitions(runs, k, min_conf, scope)),
p AS (
    SELECT x.definition AS a, y.definition AS b, x.image_id, x.layer AS layer_a, y.layer AS layer_b, x.t,
           CASE WHEN x.band = 'early' AND y.band = 'late' THEN 'a early, b late'
                WHEN x.band = 'late' AND y.band = 'early' THEN 'a late, b early' END AS side
    FROM d x JOIN d y ON x.image_id = y.image_id AND x.definition < y.definition
    WHERE x.decided AND y.decided),
ranked AS (
    SELECT *, count(*) OVER (PARTITION BY a, b) AS n,
           row_number() OVER (PARTITION BY a, b, side ORDER BY hash(image_id), image_id) AS pick
    FROM p WHERE side IS NOT NULL)
SELECT r.a, r.b, r.n, r.side, r.image_id, i.path, i.label, r.layer_a, r.layer_b, r.t
FROM ranked r JOIN images i USING (image_id)
WHERE r.pick <= per_pair
ORDER BY r.n DESC, r.a, r.b, r.side, r.image_id;
