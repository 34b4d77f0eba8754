-- merge_disagreements: with a source database attached as `src`, what makes it another experiment than the
-- target: (what, detail). Images: both hold images and their tables differ. Anchors: a model both hold has other
-- anchors (detail names the model and a source run that reads them). Weights: a model both hold was probed from
-- a store built with other weights. A merge refuses a source with any.
WITH image_digest AS (
    SELECT 'target' AS side, bit_xor(hash(i)) AS digest, count(*) AS n FROM images i
    UNION ALL SELECT 'source', bit_xor(hash(i)), count(*) FROM src.images i
), weights AS (
    SELECT 'target' AS side, model, weights_id AS w FROM model_sources
    UNION SELECT 'target', model, params->>'weights_id' FROM runs WHERE params->>'weights_id' IS NOT NULL
    UNION SELECT 'source', model, weights_id FROM src.model_sources
    UNION SELECT 'source', model, params->>'weights_id' FROM src.runs WHERE params->>'weights_id' IS NOT NULL
), anchor_digest AS (
    SELECT 'target' AS side, a.model, bit_xor(hash(a)) AS digest FROM anchors a GROUP BY a.model
    UNION ALL SELECT 'source', a.model, bit_xor(hash(a)) FROM src.anchors a GROUP BY a.model
)
SELECT 'images' AS what, 'the source holds ' || s.n || ' images, the target ' || t.n || ', not the same' AS detail
FROM image_digest s JOIN image_digest t ON t.side = 'target'
WHERE s.side = 'source' AND s.n > 0 AND t.n > 0 AND (s.digest <> t.digest OR s.n <> t.n)
UNION ALL
SELECT 'anchors', 'model ' || s.model || coalesce(' (run ' || (SELECT min(r.run_id) FROM src.runs r
                                                               WHERE r.model = s.model) || ')', '')
FROM anchor_digest s JOIN anchor_digest t ON t.side = 'target' AND t.model = s.model
WHERE s.side = 'source' AND s.digest <> t.digest
UNION ALL
SELECT 'weights', 'model ' || s.model || ': ' || s.w || ' in the source, ' || t.w || ' in the target'
FROM weights s JOIN weights t ON t.side = 'target' AND t.model = s.model
WHERE s.side = 'source' AND s.w <> t.w;
