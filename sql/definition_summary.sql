-- definition_summary(runs, k := 2, min_conf := 0.5, scope := 'auto') -> (definition, kind, run_id, n, mean,
-- median, f_early, f_mid, f_late, f_unsettled, late_is_never_stable): per definition of decision_definitions, its
-- mean layer and band shares, in the order of `runs`, then l*, joint, depth. f_unsettled: prediction depth's images
-- that even anchor T does not settle, in no band (NULL for l* and joint, which have no such category).
-- late_is_never_stable: an l*(k) or joint definition at a k where no stable layer is late (a stable l*(k) is at
-- most T - k, below the late band), so f_late is the share that never stabilises.
CREATE OR REPLACE MACRO definition_summary(runs, k := 2, min_conf := 0.5, scope := 'auto') AS TABLE
SELECT unnest(summary, recursive := true) FROM definition_comparison(runs, k, min_conf, 4, scope);
