-- definition_disagreements(runs, k := 2, min_conf := 0.5, per_pair := 4, scope := 'auto') -> (a, b, side,
-- image_id, path, label, layer_a, layer_b, t): per pair of definitions, a few images that are early by one and
-- late by the other (side 'a early, b late' or 'a late, b early'), picked by a fixed hash of the id.
CREATE OR REPLACE MACRO definition_disagreements(runs, k := 2, min_conf := 0.5, per_pair := 4, scope := 'auto')
AS TABLE
WITH p AS (
    SELECT *, CASE WHEN band_a = 'early' AND band_b = 'late' THEN 'a early, b late'
                   WHEN band_a = 'late' AND band_b = 'early' THEN 'a late, b early' END AS side
    FROM definition_pairs(runs, k, min_conf, scope)),
ranked AS (
    SELECT *, row_number() OVER (PARTITION BY a, b, side ORDER BY hash(image_id), image_id) AS pick
    FROM p WHERE side IS NOT NULL)
SELECT r.a, r.b, r.side, r.image_id, i.path, i.label, r.layer_a, r.layer_b, r.t_a AS t
FROM ranked r JOIN images i USING (image_id)
WHERE r.pick <= per_pair
ORDER BY r.a, r.b, r.side, r.image_id;
