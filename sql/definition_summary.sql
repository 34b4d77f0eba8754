-- definition_summary(runs, k := 2, min_conf := 0.5, scope := 'auto') -> (definition, kind, run_id, n, mean,
-- median, f_early, f_mid, f_late, f_unsettled): per definition of decision_definitions, its mean layer and band
-- shares (f_unsettled: prediction depth's images that even anchor T does not settle, in no band; NULL for l* and
-- joint, which have no such category), in the order of `runs`, then l*, joint, depth.
CREATE OR REPLACE MACRO definition_summary(runs, k := 2, min_conf := 0.5, scope := 'auto') AS TABLE
SELECT definition, kind, run_id, count(*) AS n, avg(layer) AS mean, median(layer) AS median,
       avg((band = 'early')::INT) AS f_early, avg((band = 'mid')::INT) AS f_mid, avg((band = 'late')::INT) AS f_late,
       CASE WHEN kind = 'depth' THEN avg((band = 'unsettled')::INT) END AS f_unsettled
FROM decision_definitions(runs, k, min_conf, scope)
GROUP BY definition, kind, run_id
ORDER BY list_position(runs, run_id), CASE kind WHEN 'l*' THEN 0 WHEN 'joint' THEN 1 ELSE 2 END;
