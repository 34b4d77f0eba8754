-- database_identity: what makes a database one experiment, as (what, key, value) rows: its image set and split
-- (meta), its images table (split column included), and per model the weights and anchors its rows come from.
-- Read with the search path set to one attached database; `featstore sql --db a --db b` refuses databases that
-- hold different values under one (what, key).
SELECT 'split' AS what, key, value FROM meta WHERE key IN ('dataset', 'split_seed', 'val_frac')
UNION ALL
SELECT 'images', 'table', count(*) || ' images, digest ' || bit_xor(hash(i)) FROM images i HAVING count(*) > 0
UNION ALL
SELECT 'weights', model, string_agg(DISTINCT weights, ', ' ORDER BY weights) FROM (
    SELECT model, weights_id AS weights FROM model_sources
    UNION SELECT model, params->>'weights_id' FROM runs WHERE params->>'weights_id' IS NOT NULL
) GROUP BY model
UNION ALL
SELECT 'anchors', model, string_agg(name || ':' || dim, ' ' ORDER BY anchor) FROM anchors GROUP BY model;
