-- exit_shares(sim_run, ks, thresholds, combined_thresholds, scope) -> (policy, k, theta, exit_anchor, share):
-- the share of images leaving at each anchor (exit_anchor NULL = full depth) under each policy.
CREATE OR REPLACE MACRO exit_shares(sim_run, ks := [1, 2, 3, 4],
                                    thresholds := [0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99],
                                    combined_thresholds := [0.5, 0.7, 0.9], scope := 'auto') AS TABLE
SELECT policy, k, theta, exit_anchor, count(*) / sum(count(*)) OVER (PARTITION BY policy, k, theta) AS share
FROM exit_events(sim_run, ks := ks, thresholds := thresholds, combined_thresholds := combined_thresholds,
                 scope := scope)
GROUP BY policy, k, theta, exit_anchor
ORDER BY policy, k NULLS FIRST, theta NULLS FIRST, exit_anchor NULLS LAST;
