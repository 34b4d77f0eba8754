-- run_agreement(run_a, run_b, k := 2, scope := 'auto') -> (anchor, n, same_pred, same_layer, same_band, mean_a,
-- mean_b, late_a, late_b, late_is_never_stable): how far two runs of one model and view (two probe families, two
-- probe seeds) agree, on the n images both predicted that the scope counts for both (by default the test split, or
-- every image of two cross-fit runs, as every other summary counts): per anchor, the share with identical
-- predictions; last, anchor NULL: the share with identical l*(k) (decision_layers) and in the same early/mid/late
-- band (decision_band), same_pred there being the share identical at every anchor, with each run's mean l*(k) and
-- late share on those same images, and late_is_never_stable (at this k no stable l*(k) is late, so each late share
-- is the never-stable share). Runs of different models or views are an error (their anchors or images differ).
CREATE OR REPLACE MACRO run_agreement(run_a, run_b, k := 2, scope := 'auto') AS TABLE
WITH pair AS (
    SELECT (SELECT count(*) FROM runs WHERE run_id = run_a) AS has_a, (SELECT count(*) FROM runs WHERE run_id = run_b)
           AS has_b, (SELECT count(DISTINCT model || '/' || view) FROM runs WHERE run_id IN (run_a, run_b)) AS kinds),
guard AS (
    SELECT CASE WHEN has_a = 0 THEN error('run_agreement: no run ''' || run_a || '''')
                WHEN has_b = 0 THEN error('run_agreement: no run ''' || run_b || '''')
                WHEN kinds > 1 THEN error('run_agreement: ''' || run_a || ''' and ''' || run_b
                                          || ''' are runs of different models or views; compare runs of one view')
                ELSE true END AS ok
    FROM pair),
same AS (
    SELECT a.image_id, a.anchor, a.pred = b.pred AS same_pred
    FROM predictions a
    JOIN predictions b ON b.run_id = run_b AND b.image_id = a.image_id AND b.anchor = a.anchor
    JOIN images i ON i.image_id = a.image_id
    WHERE a.run_id = run_a AND (SELECT ok FROM guard)
      AND in_scope(scope, i.split, (SELECT cross_fit FROM runs WHERE run_id = run_a))
      AND in_scope(scope, i.split, (SELECT cross_fit FROM runs WHERE run_id = run_b))),
layers AS (
    SELECT a.image_id, a.layer AS layer_a, b.layer AS layer_b, decision_band(a.layer, a.t) AS band_a,
           decision_band(b.layer, b.t) AS band_b, a.t
    FROM decision_layers(k, scope) a JOIN decision_layers(k, scope) b USING (image_id)
    WHERE a.run_id = run_a AND b.run_id = run_b),
images_ AS (
    SELECT s.image_id, bool_and(s.same_pred) AS same_pred, any_value(l.layer_a) AS layer_a,
           any_value(l.layer_b) AS layer_b, any_value(l.band_a) AS band_a, any_value(l.band_b) AS band_b,
           any_value(l.t) AS t
    FROM same s JOIN layers l USING (image_id) GROUP BY s.image_id)
SELECT * FROM (
    SELECT anchor, count(*) AS n, avg(same_pred::INT) AS same_pred, NULL::DOUBLE AS same_layer,
           NULL::DOUBLE AS same_band, NULL::DOUBLE AS mean_a, NULL::DOUBLE AS mean_b, NULL::DOUBLE AS late_a,
           NULL::DOUBLE AS late_b, NULL::BOOLEAN AS late_is_never_stable
    FROM same GROUP BY anchor
    UNION ALL
    SELECT NULL, count(*), avg(same_pred::INT), avg((layer_a = layer_b)::INT), avg((band_a = band_b)::INT),
           avg(layer_a), avg(layer_b), avg((band_a = 'late')::INT), avg((band_b = 'late')::INT),
           decision_band(any_value(t) - k, any_value(t)) <> 'late'
    FROM images_)
ORDER BY anchor NULLS LAST;
