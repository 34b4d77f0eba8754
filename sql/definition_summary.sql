-- definition_summary(runs, k := 2, min_conf := 0.5, scope := 'auto') -> (definition, kind, run_id, n, mean,
-- median, f_early, f_mid, f_late, f_unsettled, late_is_never_stable): per definition of decision_definitions, its
-- mean layer and band shares, in the order of `runs`, then l*, joint, depth. f_unsettled: prediction depth's images
-- that even anchor T does not settle, in no band (NULL for l* and joint, which have no such category).
-- late_is_never_stable: an l*(k) or joint definition at a k where no stable layer is late (a stable l*(k) is at
-- most T - k, below the late band), so f_late is the share that never stabilises.
CREATE OR REPLACE MACRO definition_summary(runs, k := 2, min_conf := 0.5, scope := 'auto') AS TABLE
SELECT definition, kind, run_id, count(*) AS n, avg(layer) AS mean, median(layer) AS median,
       avg((band = 'early')::INT) AS f_early, avg((band = 'mid')::INT) AS f_mid, avg((band = 'late')::INT) AS f_late,
       CASE WHEN kind = 'depth' THEN avg((band = 'unsettled')::INT) END AS f_unsettled,
       bool_and(kind <> 'depth' AND decision_band(t - k, t) <> 'late') AS late_is_never_stable
FROM decision_definitions(runs, k, min_conf, scope)
GROUP BY definition, kind, run_id
ORDER BY list_position(runs, run_id), CASE kind WHEN 'l*' THEN 0 WHEN 'joint' THEN 1 ELSE 2 END;
